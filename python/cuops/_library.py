"""Finds libcuops.so and loads it into torch.ops.cuops, once per process.

Two layouts:
- the wheel: CMake generates _build_config.py beside this file and installs the library as lib/libcuops.so.
  The torch version is compared BEFORE loading: a library built against another torch release would fail
  in the dynamic loader with an "undefined symbol" error that names neither version.
- a source checkout (<repo>/python on sys.path): no _build_config.py; the build tree's library is loaded
  (find_build_library) and the versions come from its build_info().
"""
import importlib.util
import json
import os
import pathlib
from collections.abc import Mapping

import torch

REPO = pathlib.Path(__file__).resolve().parents[2]


def find_build_library(environ: Mapping[str, str] | None = None) -> pathlib.Path:
    """The library a source checkout loads: $CUOPS_LIBRARY if set, else $CUOPS_BUILD_DIR/libcuops.so if
    set, else <repo>/build/libcuops.so. An empty variable counts as unset, as in tools/env.sh's
    ${CUOPS_BUILD_DIR:-...}. Relative paths are taken from the current directory."""
    env = os.environ if environ is None else environ
    if env.get("CUOPS_LIBRARY"):
        path = pathlib.Path(env["CUOPS_LIBRARY"])
    elif env.get("CUOPS_BUILD_DIR"):
        path = pathlib.Path(env["CUOPS_BUILD_DIR"]) / "libcuops.so"
    else:
        path = REPO / "build" / "libcuops.so"
    # absolute(), not resolve(): keep the name the user gave (libcuops.so, not libcuops.so.0.1.0).
    return path.absolute()


def _base(version: str) -> str:
    return version.split("+")[0]


def _check_torch(version: str, torch_version: str) -> None:
    running = torch.__version__
    if _base(running) != _base(torch_version):
        raise ImportError(
            f"cuops {version} was built against torch {torch_version}, but torch {running} is installed; "
            f"libcuops.so cannot load into another torch release (its C++ ABI differs). Install "
            f"torch=={torch_version}, or rebuild cuops against torch {running} (pip install . in the cuops source "
            f"tree)."
        )
    if torch.version.cuda is None:
        raise ImportError(
            f"cuops {version} needs a CUDA build of torch {torch_version} (it links libc10_cuda), but the "
            f"installed torch {running} is CPU-only. Install the CUDA build of torch=={torch_version}."
        )


def _load_wheel() -> tuple[str, str, str, str]:
    from . import _build_config as cfg

    _check_torch(cfg.__version__, cfg.TORCH_VERSION)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", "libcuops.so")
    torch.ops.load_library(path)
    return path, cfg.__version__, cfg.TORCH_VERSION, cfg.CUDA_ARCHITECTURES


def _load_build_tree() -> tuple[str, str, str, str]:
    path = find_build_library()
    if not path.is_file():
        chosen = [f"{k}={os.environ[k]}" for k in ("CUOPS_LIBRARY", "CUOPS_BUILD_DIR") if os.environ.get(k)]
        raise ImportError(
            f"cuops: no library at {path} ({', '.join(chosen) or 'the default build directory'}; the rule is "
            f"$CUOPS_LIBRARY, else $CUOPS_BUILD_DIR/libcuops.so, else <repo>/build/libcuops.so). Build it with "
            f"`bash tools/build.sh` in {REPO} (it builds into $CUOPS_BUILD_DIR, default build/), or point "
            f"CUOPS_LIBRARY or CUOPS_BUILD_DIR at a build that has it."
        )
    try:
        torch.ops.load_library(str(path))
    except OSError as e:
        # Without _build_config there is no version to compare first; a stale build against another
        # torch shows up here as an undefined symbol.
        raise ImportError(
            f"cuops: could not load {path}: {e}. If it was built against another torch than the running "
            f"{torch.__version__}, rebuild it with `bash tools/build.sh`."
        ) from e
    info = json.loads(torch.ops.cuops.build_info())
    return str(path), info["cuops_version"], info["torch_version"], ";".join(info["cuda_archs"])


def load() -> tuple[str, str, str, str]:
    """Loads the library; returns (library_path, cuops version, torch version built against, CUDA archs)."""
    in_wheel = importlib.util.find_spec(f"{__package__}._build_config") is not None
    return _load_wheel() if in_wheel else _load_build_tree()
