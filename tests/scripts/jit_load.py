"""The JIT path as README.md documents it: runs the README's recipe (the Python block after its
`<!-- jit-recipe -->` marker) as written, from a folder where `cuops/` is this checkout, so the
documented recipe is the one that is tested; then checks the library it built (libstdc++ shared) and
every op on the CPU (and CUDA when present) against torch.

    python tests/scripts/jit_load.py BUILD_DIR

Run in its own process by tests/python/test_packaging.py (a process can hold one cuops library: a
second TORCH_LIBRARY(cuops) would be refused). TORCH_CUDA_ARCH_LIST picks the archs (default 9.0).
"""
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]


def readme_recipe():
    """The README's JIT recipe: the fenced Python block after the marker."""
    text = (ROOT / "README.md").read_text()
    found = re.search(r"<!-- jit-recipe -->\s*```python\n(.*?)```", text, re.S)
    assert found, "README.md has no <!-- jit-recipe --> block"
    return found.group(1)


def needed_libraries(path):
    if shutil.which("readelf") is None:
        return None
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    return [line.split("[")[1].split("]")[0] for line in out.splitlines() if "(NEEDED)" in line]


def main(build_dir):
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    build_dir = pathlib.Path(build_dir).resolve()
    build_dir.mkdir(parents=True, exist_ok=True)
    link = build_dir / "cuops"
    if not link.is_symlink():
        shutil.rmtree(link, ignore_errors=True)
        link.symlink_to(ROOT, target_is_directory=True)
    # The recipe reads the checkout as ./cuops and builds in TORCH_EXTENSIONS_DIR/<name>.
    os.environ["TORCH_EXTENSIONS_DIR"] = str(build_dir / "ext")
    os.chdir(build_dir)
    exec(compile(readme_recipe(), "README.md jit-recipe", "exec"), {"__name__": "jit_recipe"})
    path = build_dir / "ext" / "cuops" / "cuops.so"
    assert path.exists(), f"the recipe built no {path}"
    sources = [p for d in ("schema", "ops", "kernels") for p in (ROOT / d).rglob("*") if p.suffix in (".cpp", ".cu")]
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
    print(f"JIT-built {path} by the README recipe: {len(sources)} sources, ops ok on {', '.join(devices)}; build_info {info}")


if __name__ == "__main__":
    main(sys.argv[1])
