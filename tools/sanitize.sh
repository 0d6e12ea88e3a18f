#!/usr/bin/env bash
# Runs the CUDA tests under compute-sanitizer's memcheck, racecheck, initcheck and synccheck and fails
# on any report. memcheck, racecheck and synccheck check cuops' kernels only (--kernel-name kns=cuops):
# torch's own kernels are not ours to fix, and instrumenting them makes the run many times slower.
# initcheck cannot be filtered that way (see below).
# The caching allocator is turned off so every tensor is its own cudaMalloc: memcheck then sees an
# access one element past a tensor, and initcheck sees reads of memory nothing wrote.
#   bash tools/sanitize.sh            # all four tools
#   TOOLS="memcheck" bash tools/sanitize.sh
set -uo pipefail
source "$(dirname "$0")/env.sh"
cd "$CUOPS_ROOT"
[ -f "$CUOPS_BUILD_DIR/libcuops.so" ] || bash tools/build.sh || exit 1
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
"$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" ||
  { echo "sanitize.sh: no CUDA GPU here; nothing to check"; exit 1; }
out=${SANITIZE_LOG_DIR:-${OUT:-$CUOPS_BUILD_DIR}}
mkdir -p "$out"
export PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONUNBUFFERED=1
# The suites: Python op, error and reliability tests on CUDA (not the huge-tensor, 8-thread or
# 100-run tests, which repeat the same kernels at sizes or counts the tools make slow), and the C++
# op tests. racecheck, many times slower, takes test_ops.py's tests of the kernels that use shared
# memory (two_norm's block reductions, gemm's tiles) in float32 and bfloat16 (dtype0, dtype3), every
# shape and layout: the shared-memory code is the same template for the other two dtypes. Plus the
# float32 edge-cut GEMM tests, both precisions: the SIMT kernel and, on Hopper, TF32's wgmma kernel in
# both of its forms (A from shared memory; A from registers, read from the TMA-written tile).
PYTESTS=${SANITIZE_PYTESTS:-tests/python/test_ops.py tests/python/test_bad_inputs.py tests/python/test_reliability.py}
# CUDA-graph tests are left out: the tools run with torch's caching allocator off
# (PYTORCH_NO_CUDA_MEMORY_CACHING), and a capture that allocates then fails and poisons the process.
PYSEL=${SANITIZE_K:-"cuda and not huge and not threads and not bitwise and not graph"}
RACE_PYTESTS=${SANITIZE_RACE_PYTESTS:-tests/python/test_ops.py}
RACE_SEL=${SANITIZE_RACE_K:-"cuda and (norm or gemm or mm) and (dtype0 or dtype3 or (cut_chunks and float32)) and not graph"}
canary=$out/sanitizer_canary
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
"$nvcc" -O1 -arch=native -o "$canary" tests/sanitizer_canary.cu || { echo "sanitize.sh: canary build failed"; exit 1; }
status=0
for tool in ${TOOLS:-memcheck racecheck initcheck synccheck}; do
  extra=(--kernel-name kns=cuops)
  [ "$tool" = memcheck ] && extra+=(--leak-check no --padding 32)
  sel=$PYSEL tests=$PYTESTS
  [ "$tool" = racecheck ] && sel=$RACE_SEL tests=$RACE_PYTESTS
  if [ "$tool" = initcheck ]; then
    # initcheck only counts memory as written by kernels it instruments: under the cuops filter every
    # input torch's own kernels filled (randn, fill_) looked uninitialised, and initcheck reported our
    # add kernel reading it (H200). So no filter here (torch's kernels are instrumented
    # too, and so slower), on a narrower selection: float32 and bfloat16 cases of test_ops.py.
    extra=(--check-api-memory-access no)
    sel=${SANITIZE_INIT_K:-"cuda and (dtype0 or dtype3) and not bitwise and not graph"} tests=${SANITIZE_INIT_PYTESTS:-tests/python/test_ops.py}
    # initcheck does not see the bulk tensor copy engine's stores (H100): every bf16 output
    # of the Hopper wgmma GEMM, which leaves by TMA store, read back as "uninitialised" in torch's
    # copy kernel, though the same tests pass with c pre-filled with NaN (every element written). So
    # initcheck runs the portable GEMM kernels; the wgmma kernel stays under the other three tools.
    export CUOPS_DISABLE_WGMMA=1
  else
    unset CUOPS_DISABLE_WGMMA
  fi
  # racecheck does not model the mbarrier transaction that orders two_norm's bulk copies (UBLKCP)
  # into shared memory before the consumer warps' reads: on the bulk pass it reported every read as
  # racing with the copy (H100). So racecheck checks two_norm's load pass (the same block
  # reduction); the bulk pass stays under memcheck, synccheck and initcheck.
  # The same holds for the small-M GEMM's streaming form (a TMA ring under mbarriers): racecheck runs
  # its per-lane forms.
  if [ "$tool" = racecheck ]; then
    export CUOPS_DISABLE_BULK_NORM=1 CUOPS_DISABLE_SKINNY_TMA=1
  else
    unset CUOPS_DISABLE_BULK_NORM CUOPS_DISABLE_SKINNY_TMA
  fi
  log=$out/sanitize_$tool.log
  start=$(date +%s)
  cs_run() { "$cs" --tool "$tool" "${extra[@]}" --error-exitcode 86 --print-limit 50 "$@"; }
  # The canary's bug must be reported (exit 86), or a clean run below proves nothing.
  cs_run "$canary" "$tool" >"$log" 2>&1
  canary_rc=$?
  # shellcheck disable=SC2086
  cs_run --target-processes all "$PY" -m pytest $tests -q -p no:cacheprovider -k "$sel" >>"$log" 2>&1
  py_rc=$?
  cs_run "$CUOPS_BUILD_DIR/tests/cpp/cuops_cpp_tests" --gtest_filter='Devices/Ops.*/cuda:-*EightThreads*:*100Runs*' \
    >>"$log" 2>&1
  cpp_rc=$?
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | sed 's/=* *//' | tr '\n' ';')
  results=$(grep -E "^[0-9]+ (passed|failed)|PASSED|FAILED" "$log" | tr '\n' ' ')
  echo "$tool: canary rc=$canary_rc (86 = caught) | pytest rc=$py_rc | gtest rc=$cpp_rc | $(($(date +%s) - start)) s | $summary | $results"
  [ $canary_rc -eq 86 ] && [ $py_rc -eq 0 ] && [ $cpp_rc -eq 0 ] || status=1
done
exit $status
