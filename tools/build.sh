#!/usr/bin/env bash
# Configures and builds libcuops, the C++ demo and the C++ tests into $CUOPS_BUILD_DIR (default build/).
# CUDA archs: CMake's default list (see CMakeLists.txt), or CUOPS_CUDA_ARCHITECTURES="90" to override.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$CUOPS_ROOT"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
args=(-DCMAKE_PREFIX_PATH="$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')" -DPython3_EXECUTABLE="$PY")
[ -n "${CUOPS_CUDA_ARCHITECTURES:-}" ] && args+=(-DCUOPS_CUDA_ARCHITECTURES="$CUOPS_CUDA_ARCHITECTURES")
if [ ! -f "$CUOPS_BUILD_DIR/CMakeCache.txt" ]; then
  mkdir -p "$CUOPS_BUILD_DIR"
  cmake -S . -B "$CUOPS_BUILD_DIR" "${generator[@]}" "${args[@]}" >"$CUOPS_BUILD_DIR/configure.log" 2>&1 ||
    { cat "$CUOPS_BUILD_DIR/configure.log"; exit 1; }
fi
cmake --build "$CUOPS_BUILD_DIR" --parallel "${CUOPS_JOBS:-$(nproc)}"
