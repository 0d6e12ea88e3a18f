"""The library under test and its build folder. The cuops package finds them (python/cuops/_library.py
holds the one rule: $CUOPS_LIBRARY, else $CUOPS_BUILD_DIR/libcuops.so, else <repo>/build/libcuops.so)."""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def load_library() -> Path:
    """Loads libcuops into torch.ops.cuops (once per process) and returns its path."""
    if str(REPO / "python") not in sys.path:
        sys.path.insert(0, str(REPO / "python"))
    import cuops

    return Path(cuops.library_path)


def build_dir() -> Path:
    """The folder the library was built in (it holds bench/cuops_overhead too)."""
    return load_library().parent
