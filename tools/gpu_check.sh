#!/usr/bin/env bash
# The GPU machine's check: build, every test (CUDA included), both demos, compute-sanitizer, and the
# benchmarks. Logs land in $OUT (the device tool brings them back) or in build/gpu_check/.
# All stages take longer than one device call allows (10 min), so pick them with STAGES, e.g.
#   STAGES="test demo" bash tools/gpu_check.sh       # extra args go to pytest (test.sh spreads it itself)
#   CUOPS_GIT_COMMIT=$(git rev-parse --short HEAD) STAGES="sanitize bench" bash tools/gpu_check.sh
# (the device's copy of .git can lag the tree it was sent with: name the commit for the results file)
# The ASan/UBSan stage of tools/test.sh is CPU-only and runs in CI; test.sh skips it on a GPU machine.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build/gpu_check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
stages=" ${STAGES:-test demo sanitize bench} "
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/gpu.txt"
rc=0
if [[ $stages == *" test "* ]]; then
  bash tools/test.sh "$@" >"$out/test.log" 2>&1 || rc=1
  echo "== test (rc so far $rc)"
  grep -E "tests passed|tests failed|bad-input matrix" "$out/test.log"
  grep -E "^[0-9]+ (passed|failed)|^=+ .*(passed|failed)" "$out/test.log" | tail -2
  grep -E "^FAILED|Error" "$out/test.log" | head -30
fi
bash tools/build.sh >/dev/null 2>&1 || { echo "build failed"; exit 1; }
if [[ $stages == *" demo "* ]]; then
  bash tools/demo.sh >"$out/demo.log" 2>&1 || rc=1
  echo "== demo (rc so far $rc)"
  tail -25 "$out/demo.log"
fi
if [[ $stages == *" sanitize "* ]]; then
  echo "== compute-sanitizer"
  SANITIZE_LOG_DIR=/tmp/cuops_sanitize bash tools/sanitize.sh || rc=1
  cat /tmp/cuops_sanitize/sanitize_*.log >"$out/sanitize.log" 2>/dev/null
fi
if [[ $stages == *" bench "* ]]; then
  source tools/env.sh
  "$PY" bench/run.py --out bench/results --name default >bench/results/default.txt 2>"$out/bench.log" || rc=1
  cp bench/results/default.json bench/results/default.txt bench/results/default_*.png "$out/" 2>/dev/null
  echo "== bench"
  "$PY" bench/check.py bench/results/default.json
  grep -E "2\^(28|30) |(1024|4096|8192)\^3|overhead" bench/results/default.txt
fi
echo "gpu_check rc=$rc"
exit $rc
