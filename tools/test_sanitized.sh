#!/usr/bin/env bash
# Builds libcuops and the C++ tests with AddressSanitizer + UndefinedBehaviorSanitizer into
# $CUOPS_BUILD_DIR-asan and runs the C++ suite on the CPU under them (any report fails the run).
# libtorch itself is not instrumented: its own memory is not checked, ours (libcuops, the tests) is.
set -uo pipefail
source "$(dirname "$0")/env.sh"
cd "$CUOPS_ROOT"
dir=${CUOPS_BUILD_DIR}-asan
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [ ! -f "$dir/CMakeCache.txt" ]; then
  mkdir -p "$dir"
  # One CUDA arch: this build only runs host code; the main build compiles every arch.
  cmake -S . -B "$dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCUOPS_SANITIZE=address,undefined \
    -DCUOPS_CUDA_ARCHITECTURES="${CUOPS_SANITIZE_ARCH:-90}" -DCUOPS_BUILD_DEMO=OFF -DCUOPS_BUILD_BENCH=OFF \
    -DCUOPS_TEST_ARTIFACT_DIR="$CUOPS_BUILD_DIR/artifacts" \
    -DCMAKE_PREFIX_PATH="$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')" \
    >"$dir/configure.log" 2>&1 || { cat "$dir/configure.log"; exit 1; }
fi
cmake --build "$dir" --parallel "${CUOPS_JOBS:-$(nproc)}" || exit 1
# A sanitized run of an uninstrumented build would pass vacuously: check the instrumentation is there.
for f in "$dir/libcuops.so" "$dir/tests/cpp/cuops_cpp_tests"; do
  symbols=$(nm -D "$f")  # captured first: `nm | grep -q` fails under pipefail when grep exits early
  grep -q __asan_report <<<"$symbols" || { echo "test_sanitized.sh: $f has no ASan instrumentation"; exit 1; }
  grep -q __ubsan_handle <<<"$symbols" || { echo "test_sanitized.sh: $f has no UBSan instrumentation"; exit 1; }
done
echo "ASan and UBSan instrumentation present in libcuops.so and cuops_cpp_tests"
# detect_leaks=0: libtorch's process-lifetime singletons (never freed by design) would be reported;
# use-after-free, overflows and UB in our code still fail the run.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1:halt_on_error=1:protect_shadow_gap=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
CUDA_VISIBLE_DEVICES="" ctest --test-dir "$dir" --output-on-failure
