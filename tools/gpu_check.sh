#!/usr/bin/env bash
# One call on the GPU machine: build, run every test (CUDA included) and both demos, then the
# benchmarks. Logs land in $OUT (the device tool brings them back) or in build/gpu_check/.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build/gpu_check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
g++ -print-file-name=libstdc++.so; echo "LDFLAGS=${LDFLAGS:-}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/gpu.txt"
bash tools/test.sh "$@" >"$out/test.log" 2>&1; test_rc=$?
bash tools/demo.sh >"$out/demo.log" 2>&1; demo_rc=$?
if [ -f bench/run.py ] && [ -z "${SKIP_BENCH:-}" ]; then
  python3 bench/run.py --out bench/results >"$out/bench.log" 2>&1; bench_rc=$?
  cp bench/results/h100.json bench/results/*.png "$out/" 2>/dev/null
else
  bench_rc=skipped
fi
echo "== summaries"
grep -E "tests passed|tests failed|Total Test" "$out/test.log"
grep -E "^[0-9]+ (passed|failed)|passed|failed" "$out/test.log" | tail -2
grep -E "FAILED|Error" "$out/test.log" | head -30
echo "== demo (rc=$demo_rc)"; tail -25 "$out/demo.log"
echo "== bench (rc=$bench_rc)"; [ -f "$out/bench.log" ] && tail -60 "$out/bench.log"
echo "test rc=$test_rc demo rc=$demo_rc bench rc=$bench_rc"
