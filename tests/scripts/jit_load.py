"""The JIT path: torch.utils.cpp_extension.load builds cuops' own sources (no CMake) into a library
that registers the same ops; then every op runs on the CPU (and CUDA when present) against torch.

    python tests/scripts/jit_load.py BUILD_DIR

Run in its own process by tests/python/test_packaging.py (a process can hold one cuops library: a
second TORCH_LIBRARY(cuops) would be refused). TORCH_CUDA_ARCH_LIST picks the archs (default 9.0).
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import torch
from torch.utils.cpp_extension import load

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCES = sorted(str(p) for d in ("schema", "ops", "kernels") for p in (ROOT / d).iterdir()
                 if p.suffix in (".cpp", ".cu"))


def shared_libstdcxx_ldflags():
    """Link flags that keep libstdc++ shared (see cmake/SharedLibstdcxx.cmake): a compiler with no
    libstdc++.so development link (the GPU machine's image) links the static archive into the library,
    whose private copy's locale is never initialised once torch.ops.load_library has opened it
    RTLD_LOCAL, and the first number formatted into a message crashes (segfault, no output)."""
    cxx = os.environ.get("CXX", "c++")
    try:
        found = subprocess.run([cxx, "-print-file-name=libstdc++.so"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return []
    if os.path.isabs(found):
        return []
    return ["-Wl,--push-state,--no-as-needed", "-l:libstdc++.so.6", "-Wl,--pop-state"]


def needed_libraries(path):
    if shutil.which("readelf") is None:
        return None
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    return [line.split("[")[1].split("]")[0] for line in out.splitlines() if "(NEEDED)" in line]


def main(build_dir):
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    os.makedirs(build_dir, exist_ok=True)
    path = load(name="cuops", sources=SOURCES, extra_include_paths=[str(ROOT), str(ROOT / "include")],
                extra_cflags=["-O2"], extra_cuda_cflags=["-O3", "-std=c++17"],
                extra_ldflags=shared_libstdcxx_ldflags(), build_directory=build_dir,
                is_python_module=False, with_cuda=True, verbose=False)
    path = path or os.path.join(build_dir, "cuops.so")
    needed = needed_libraries(path)
    assert needed is None or "libstdc++.so.6" in needed, f"{path} links libstdc++ statically (NEEDED: {needed})"
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
