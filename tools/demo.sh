#!/usr/bin/env bash
# Builds cuops and runs both demos: the C++ program (libtorch + libcuops) and the Python script.
set -euo pipefail
source "$(dirname "$0")/env.sh"
bash "$CUOPS_ROOT/tools/build.sh"
"$PY" "$CUOPS_ROOT/tests/scripts/make_artifacts.py" "$CUOPS_BUILD_DIR/artifacts"
echo "== C++ demo"
"$CUOPS_BUILD_DIR/cpp_demo/cuops_demo" "$CUOPS_BUILD_DIR/artifacts"
echo "== Python demo"
"$PY" "$CUOPS_ROOT/python_demo/demo.py"
