# Sourced by the other tools/ scripts. Sets PY to a Python whose torch is the pinned version:
# $CUOPS_PYTHON if given, else python3 when it already has that torch (the GPU machine, which has no
# network), else a .venv in the repo with torch and the test tools installed from PyPI.
CUOPS_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The torch release libcuops is built against: pyproject.toml's pin (its one home).
TORCH_PIN=$(sed -n 's/^dependencies = \["torch==\([^"]*\)"\]$/\1/p' "$CUOPS_ROOT/pyproject.toml")
[ -n "$TORCH_PIN" ] || { echo "tools/env.sh: no torch pin in $CUOPS_ROOT/pyproject.toml"; exit 1; }
# Test and packaging tools: scikit-build-core (pip install . of the wheel), cuobjdump (from NVIDIA's
# wheel: the CUDA toolkit image CI runs on has nvcc but no cuobjdump) to check the built binary, and
# nvdisasm (cuobjdump -sass needs it: the sm_90a GEMM's HGMMA check), and clang-format (tools/format.sh:
# the C++ style, one release, since releases format differently), and transformers (cuops.patch's optional
# dependency: tests/python/test_patch.py; the release the GPU machine has), and what a patched model is
# tested under (tests/python/test_patch_peft.py): peft, accelerate (HF Trainer), trl and datasets (TRL's
# SFTTrainer).
PY_PINS="pytest==9.2.0 hypothesis==6.170.15 numpy==2.4.6 expecttest==0.3.0 scikit-build-core==1.1.2 nvidia-cuda-cuobjdump==13.5.37 nvidia-cuda-nvdisasm==13.5.37 clang-format==21.1.8 transformers==5.17.0 peft==0.21.2 accelerate==1.15.0 trl==1.16.0 datasets==5.2.0"

has_pinned_torch() {
  "$1" -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '$TORCH_PIN')" >/dev/null 2>&1
}

if [ -n "${CUOPS_PYTHON:-}" ]; then
  PY=$CUOPS_PYTHON
elif has_pinned_torch python3; then
  PY=python3
else
  PY=$CUOPS_ROOT/.venv/bin/python
  if ! has_pinned_torch "$PY"; then
    echo "== setting up $CUOPS_ROOT/.venv with torch==$TORCH_PIN from PyPI (one time)"
    [ -x "$PY" ] || python3 -m venv "$CUOPS_ROOT/.venv" || exit 1
    "$PY" -m pip install -q --upgrade pip || exit 1
    "$PY" -m pip install -q "torch==$TORCH_PIN" $PY_PINS || exit 1
  fi
fi
# Test tools: present on the GPU machine's python3; installed into the venv above otherwise.
"$PY" -c "import pytest, hypothesis, numpy, scikit_build_core, transformers" 2>/dev/null || "$PY" -m pip install -q $PY_PINS || exit 1
export PY CUOPS_ROOT
export CUOPS_BUILD_DIR=${CUOPS_BUILD_DIR:-$CUOPS_ROOT/build}
