"""The JIT path: torch.utils.cpp_extension.load builds cuops' own sources (no CMake) into a library
that registers the same ops; then every op runs on the CPU (and CUDA when present) against torch.

    python tests/python/jit_load.py BUILD_DIR

Run in its own process by tests/python/test_packaging.py (a process can hold one cuops library: a
second TORCH_LIBRARY(cuops) would be refused). TORCH_CUDA_ARCH_LIST picks the archs (default 9.0).
"""
import json
import os
import pathlib
import sys

import torch
from torch.utils.cpp_extension import load

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCES = sorted(str(p) for d in ("schema", "ops", "kernels") for p in (ROOT / d).iterdir()
                 if p.suffix in (".cpp", ".cu"))


def main(build_dir):
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    os.makedirs(build_dir, exist_ok=True)
    path = load(name="cuops", sources=SOURCES, extra_include_paths=[str(ROOT), str(ROOT / "include")],
                extra_cflags=["-O2"], extra_cuda_cflags=["-O3", "-std=c++17"], build_directory=build_dir,
                is_python_module=False, with_cuda=True, verbose=False)
    ops = torch.ops.cuops
    info = json.loads(ops.build_info())
    assert info["torch_version"].split("+")[0] == torch.__version__.split("+")[0], info
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        a, b = torch.randn(1000, device=device), torch.randn(1000, device=device)
        c = torch.empty_like(a)
        ops.add2(c, a, b)
        torch.testing.assert_close(c, a + b)
        torch.testing.assert_close(ops.vector_add(a, b), a + b)
        torch.testing.assert_close(ops.scale(a, 3.0), 3.0 * a)
        torch.testing.assert_close(ops.square(a), a * a)
        torch.testing.assert_close(ops.two_norm(a, b), torch.linalg.vector_norm(a - b))
        m, n = torch.randn(33, 17, device=device), torch.randn(17, 9, device=device)
        torch.testing.assert_close(ops.mm(m, n), m @ n, rtol=1e-5, atol=1e-5)
    print(f"JIT-built {path}: {len(SOURCES)} sources, ops ok on {', '.join(devices)}; build_info {info}")


if __name__ == "__main__":
    main(sys.argv[1])
