#!/usr/bin/env bash
# Runs the CUDA tests under compute-sanitizer's memcheck, racecheck, initcheck and synccheck and fails
# on any report. Only cuops' kernels are checked (--kernel-name kns=cuops): torch's own kernels are
# not ours to fix, and instrumenting them makes the run many times slower.
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
out=${OUT:-$CUOPS_BUILD_DIR}
export PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONUNBUFFERED=1
# The suites: Python op, error and reliability tests on CUDA (not the huge-tensor or compile tests,
# which exercise the same kernels at sizes or in graphs the sanitizer makes slow), and the C++ tests.
PYTESTS=${SANITIZE_PYTESTS:-tests/python/test_ops.py tests/python/test_reliability.py}
PYSEL=${SANITIZE_K:-"cuda and not huge and not compile"}
status=0
for tool in ${TOOLS:-memcheck racecheck initcheck synccheck}; do
  extra=()
  case $tool in
    memcheck) extra=(--leak-check no --padding 32) ;;
    initcheck) extra=(--track-unused-memory no) ;;
  esac
  log=$out/sanitize_$tool.log
  start=$(date +%s)
  # shellcheck disable=SC2086
  "$cs" --tool "$tool" "${extra[@]}" --kernel-name kns=cuops --error-exitcode 86 --print-limit 50 \
    --target-processes all "$PY" -m pytest $PYTESTS -q -p no:cacheprovider -k "$PYSEL" >"$log" 2>&1
  py_rc=$?
  "$cs" --tool "$tool" "${extra[@]}" --kernel-name kns=cuops --error-exitcode 86 --print-limit 50 \
    "$CUOPS_BUILD_DIR/tests/cpp/cuops_cpp_tests" --gtest_filter='Devices/Ops.*/cuda' >>"$log" 2>&1
  cpp_rc=$?
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | sort | uniq -c | tr -s ' ' | tr '\n' ';')
  tests=$(grep -E "^[0-9]+ (passed|failed)|PASSED|FAILED" "$log" | tr '\n' ' ')
  echo "$tool: pytest rc=$py_rc gtest rc=$cpp_rc ($(($(date +%s) - start)) s) | $summary | $tests"
  [ $py_rc -eq 0 ] && [ $cpp_rc -eq 0 ] || status=1
done
exit $status
