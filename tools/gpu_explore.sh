#!/usr/bin/env bash
# Design-time device call (not part of CI): the library-kernel GEMM sweep, the GPU tests of the ops
# being changed, and the norm benchmark rows. Usage: bash tools/gpu_explore.sh  (on the GPU machine)
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH CUOPS_CUDA_ARCHITECTURES=90 PYTHONUNBUFFERED=1
out=${OUT:-build/explore}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
( nvcc -O3 -std=c++17 -arch=sm_90 -Iinclude -Ikernels bench/sweep/gemm_lib_sweep.cu -lcublas -o /tmp/gls \
    >"$out/gls_build.log" 2>&1; echo "sweep build rc=$?" ) &
bash tools/build.sh >"$out/build.log" 2>&1 || { echo "build failed"; tail -30 "$out/build.log"; }
wait
echo "== gemm library sweep"; timeout 150 /tmp/gls 2>&1 | tee "$out/gemm_lib_sweep.txt"
source tools/env.sh
echo "== tests"
timeout 200 "$PY" -m pytest -q -p no:cacheprovider -n 8 -x tests/python/test_ops.py -k "cuda and (gemm or mm or norm)" 2>&1 | tail -8
echo done
