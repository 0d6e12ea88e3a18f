#!/usr/bin/env bash
# Formats the C++/CUDA sources with .clang-format, or checks them (--check: lists the files that
# differ and exits 1). The clang-format is the one tools/env.sh pins (its PyPI wheel in the Python
# environment): other releases format differently.
#   bash tools/format.sh           # rewrite the files in place
#   bash tools/format.sh --check   # what tools/test.sh runs
set -uo pipefail
source "$(dirname "$0")/env.sh"
cd "$CUOPS_ROOT"
want=$(sed -n 's/.*clang-format==\([0-9.]*\).*/\1/p' tools/env.sh)
fmt=$(dirname "$PY")/clang-format
[ -x "$fmt" ] || fmt=$(command -v clang-format || true)
if [ -z "$fmt" ] || ! "$fmt" --version | grep -q "version $want"; then
  echo "tools/format.sh: no clang-format $want here (pinned in tools/env.sh: $PY -m pip install clang-format==$want)"
  exit 2
fi
dirs=(kernels ops include schema tests/cpp)
if [ "$(git rev-parse --show-toplevel 2>/dev/null)" = "$CUOPS_ROOT" ]; then
  mapfile -t files < <(git ls-files --cached --others --exclude-standard "${dirs[@]/%//*}" | grep -E '\.(h|cuh|cu|cpp)$')
else  # a tree git does not hold (git archive, an sdist): every source file there
  mapfile -t files < <(find "${dirs[@]}" -type f | grep -E '\.(h|cuh|cu|cpp)$' | sort)
fi
[ ${#files[@]} -gt 0 ] || { echo "tools/format.sh: no C++ sources found under ${dirs[*]}"; exit 1; }
if [ "${1:-}" != "--check" ]; then
  "$fmt" -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  "$fmt" "$f" | cmp -s - "$f" || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "tools/format.sh --check: ${#bad[@]} of ${#files[@]} files differ from .clang-format: ${bad[*]}"
  echo "  (bash tools/format.sh rewrites them)"
  exit 1
fi
echo "tools/format.sh --check: ${#files[@]} files formatted"
