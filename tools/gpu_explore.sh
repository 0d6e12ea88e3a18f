#!/usr/bin/env bash
# Design-time device call (not part of CI): the library build, the Hopper GEMM sweep in TF32 mode
# (bench/sweep/wgmma_lib_sweep.cu: layout checks, then speed against cuBLAS), the GPU tests of the GEMM
# ops, and the full benchmark. Usage: bash tools/gpu_explore.sh  (on the GPU machine)
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH CUOPS_CUDA_ARCHITECTURES=90 PYTHONUNBUFFERED=1
out=${OUT:-build/explore}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
( nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -DCUOPS_WGMMA_BUILD=1 -Iinclude -Ikernels \
    bench/sweep/wgmma_lib_sweep.cu -lcublas -o /tmp/wl >"$out/wl_build.log" 2>&1; echo "sweep build rc=$?" ) &
bash tools/build.sh >"$out/build.log" 2>&1 || { echo "build failed"; tail -30 "$out/build.log"; }
wait
echo "== wgmma sweep (${SWEEP_MODE:-tf32})"; timeout 200 /tmp/wl "${SWEEP_MODE:-tf32}" 2>&1 | tee "$out/wl.txt" | grep -v "^check.*err [0-9.e-]*$" | tail -60
source tools/env.sh
echo "== tests"
timeout 240 "$PY" -m pytest -q -p no:cacheprovider -n 12 tests/python/test_ops.py -k "gemm or mm" 2>&1 | tail -8
if [[ -n ${BENCH:-} ]]; then
  echo "== bench"
  CUOPS_GIT_COMMIT=${CUOPS_GIT_COMMIT:-unknown} timeout 200 "$PY" bench/run.py --out "$out/res" >"$out/bench.txt" 2>&1
  "$PY" bench/check.py "$out/res/h100.json" --gemm --overhead 2>&1 | tail -40
fi
echo done
