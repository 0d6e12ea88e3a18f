"""cuops: hand-written CUDA kernels registered as PyTorch operators (torch.ops.cuops.*).

    import torch, cuops
    y = cuops.mm(a, b)            # the same as torch.ops.cuops.mm(a, b)
    cuops.build_info()            # dict: cuops, torch and CUDA versions, archs, compiler, build type

Importing loads libcuops.so into torch.ops.cuops. libcuops is C++ built against one torch release; a
different torch would fail with an "undefined symbol" error from the dynamic loader, so the versions
are compared first and a mismatch raises ImportError naming both.
"""
import json
import os

import torch

from ._build_config import CUDA_ARCHITECTURES, TORCH_VERSION, __version__

__all__ = ["__version__", "build_info", "library_path", "ops", "TORCH_VERSION", "CUDA_ARCHITECTURES"]


def _base(version: str) -> str:
    return version.split("+")[0]


def _check_torch() -> None:
    running = torch.__version__
    if _base(running) != _base(TORCH_VERSION):
        raise ImportError(
            f"cuops {__version__} was built against torch {TORCH_VERSION}, but torch {running} is installed; "
            f"libcuops.so cannot load into another torch release (its C++ ABI differs). Install "
            f"torch=={TORCH_VERSION}, or rebuild cuops against torch {running} (pip install . in the cuops source "
            f"tree)."
        )
    if torch.version.cuda is None:
        raise ImportError(
            f"cuops {__version__} needs a CUDA build of torch {TORCH_VERSION} (it links libc10_cuda), but the "
            f"installed torch {running} is CPU-only. Install the CUDA build of torch=={TORCH_VERSION}."
        )


_check_torch()
library_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", "libcuops.so")
torch.ops.load_library(library_path)
ops = torch.ops.cuops


def build_info() -> dict:
    """What this libcuops was built from and for (paste it into bug reports)."""
    return json.loads(torch.ops.cuops.build_info())


def __getattr__(name):
    """cuops.<op> is torch.ops.cuops.<op> (add2, vector_add, scale, square, two_norm, gemm, mm)."""
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        return getattr(torch.ops.cuops, name)
    except (AttributeError, RuntimeError) as e:
        raise AttributeError(f"module 'cuops' has no attribute {name!r}") from e
