#!/usr/bin/env bash
# Builds everything and runs every test: the binary check, the GoogleTest suites through ctest, pytest
# (packaging included: the CMake package, pip install ., the JIT build), then the C++ suite again under
# ASan/UBSan.
#   bash tools/test.sh            # everything
#   bash tools/test.sh --quick    # ~1 minute when iterating on a kernel: build, the planner's tests,
#                                 # and the tests marked quick (every GEMM kernel path in every layout,
#                                 # both two_norm passes, the elementwise ops)
# Extra arguments go to pytest.
# GPU tests run when a CUDA GPU is visible and are skipped with the reason shown otherwise. On a GPU
# machine the stages that prove nothing there are left out, each saying so: the ASan/UBSan build
# (host code on the CPU: CI runs it), the wheel and JIT builds (tests/python/test_packaging.py: CI
# builds them and runs their ops), the compile tests' and the DTensor tests' CPU places; the build is
# for that GPU's arch unless CUOPS_CUDA_ARCHITECTURES says otherwise, and pytest spreads over
# CUOPS_TEST_WORKERS processes (default 12) when pytest-xdist is there.
set -uo pipefail
source "$(dirname "$0")/env.sh"
quick=0
if [ "${1:-}" = "--quick" ]; then
  quick=1
  shift
fi
gpu_arch=$("$PY" -c "import torch; print(''.join(map(str, torch.cuda.get_device_capability())) if torch.cuda.is_available() else '')" 2>/dev/null)
pytest_args=()
pytest_env=()
if [ -n "$gpu_arch" ]; then
  if [ -z "${CUOPS_CUDA_ARCHITECTURES:-}" ] && [ ! -f "$CUOPS_BUILD_DIR/CMakeCache.txt" ]; then
    export CUOPS_CUDA_ARCHITECTURES=$gpu_arch
    echo "== GPU of compute capability $gpu_arch: building for arch $gpu_arch only (CUOPS_CUDA_ARCHITECTURES overrides; CI builds the default list)"
  fi
  if "$PY" -c "import xdist" 2>/dev/null; then
    # One test at a time to each worker; test_packaging.py's tests share build folders, so they go
    # to one worker together (its xdist_group).
    pytest_args=(-n "${CUOPS_TEST_WORKERS:-12}" --dist loadgroup)
    # The workers' CPU places share the cores: torch's intra-op pools at a core each would run
    # workers x cores threads (16 x 12 on the H200 machine); ceil(cores / workers) each. Given to
    # pytest alone: nproc obeys OMP_NUM_THREADS, and exported it made the build and ctest run 2 jobs
    # on 16 cores (the sm_90 build took 389 s instead of 74).
    pytest_env=(OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( ($(nproc) + ${CUOPS_TEST_WORKERS:-12} - 1) / ${CUOPS_TEST_WORKERS:-12} ))}")
  fi
fi
SECONDS=0
status=0
# The C++/CUDA style (.clang-format): a CPU-only proof, which CI makes; the GPU machine has no
# network to install the pinned clang-format.
if [ -z "$gpu_arch" ]; then
  bash "$CUOPS_ROOT/tools/format.sh" --check || status=1
else
  echo "== format check SKIPPED: a GPU machine (CI checks the C++ style)"
fi
bash "$CUOPS_ROOT/tools/build.sh" || exit 1
echo "== build: ${SECONDS} s"
cd "$CUOPS_ROOT"
if [ $quick -eq 1 ]; then
  "$CUOPS_BUILD_DIR/tests/cpp/cuops_plan_tests" --gtest_brief=1 || status=1
  env "${pytest_env[@]}" "$PY" -m pytest tests/python -q -rs -p no:cacheprovider -m quick "${pytest_args[@]}" "$@" || status=1
  echo "== quick tier: ${SECONDS} s"
  exit $status
fi
# The Python-made artifacts the C++ tests load (TorchScript, AOTInductor: ~1.5 minutes of compiling)
# are written while pytest runs; ctest runs after both. The binary's machine code per arch is checked
# by tests/python/test_packaging.py (tools/check_binary.sh).
echo "== pytest, and the Python -> C++ artifacts (TorchScript, AOTInductor) beside it (${SECONDS} s so far)"
"$PY" tests/scripts/make_artifacts.py "$CUOPS_BUILD_DIR/artifacts" >"$CUOPS_BUILD_DIR/artifacts.log" 2>&1 &
artifacts=$!
env "${pytest_env[@]}" "$PY" -m pytest tests/python -q -rs -p no:cacheprovider "${pytest_args[@]}" "$@" || status=1
wait $artifacts || { cat "$CUOPS_BUILD_DIR/artifacts.log"; status=1; }
echo "== ctest (${SECONDS} s so far)"
ctest --test-dir "$CUOPS_BUILD_DIR" --output-on-failure -j "${CUOPS_JOBS:-$(nproc)}" || status=1
echo "== C++ tests under AddressSanitizer + UndefinedBehaviorSanitizer (CPU; ${SECONDS} s so far)"
if [ -n "${CUOPS_SKIP_SANITIZED:-}" ]; then
  echo "SKIPPED: CUOPS_SKIP_SANITIZED is set"
elif [ -n "$gpu_arch" ] && [ -z "${CUOPS_RUN_SANITIZED:-}" ]; then
  echo "SKIPPED: a GPU machine (host code under ASan runs on the CPU, as CI runs it; CUOPS_RUN_SANITIZED=1 runs it here)"
else
  bash tools/test_sanitized.sh || status=1
fi
echo "== tools/test.sh: ${SECONDS} s, status $status"
exit $status
