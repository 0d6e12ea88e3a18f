#!/usr/bin/env bash
# Builds everything and runs every test: the binary check, the GoogleTest suite through ctest, pytest
# (packaging included: the CMake package, pip install ., the JIT build), then the C++ suite again under
# ASan/UBSan.
# GPU tests run when a CUDA GPU is visible and are skipped with the reason shown otherwise.
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash "$CUOPS_ROOT/tools/build.sh" || exit 1
cd "$CUOPS_ROOT"
status=0
echo "== machine code for every configured CUDA arch (cuobjdump)"
bash tools/check_binary.sh || status=1
echo "== Python -> C++ artifacts (TorchScript, AOTInductor)"
"$PY" tests/python/make_artifacts.py "$CUOPS_BUILD_DIR/artifacts" || status=1
echo "== ctest"
ctest --test-dir "$CUOPS_BUILD_DIR" --output-on-failure || status=1
echo "== pytest"
"$PY" -m pytest tests/python -q -rs -p no:cacheprovider "$@" || status=1
echo "== C++ tests under AddressSanitizer + UndefinedBehaviorSanitizer (CPU)"
if [ -n "${CUOPS_SKIP_SANITIZED:-}" ]; then
  echo "SKIPPED: CUOPS_SKIP_SANITIZED is set (the GPU check skips this CPU-only stage; CI runs it)"
else
  bash tools/test_sanitized.sh || status=1
fi
exit $status
