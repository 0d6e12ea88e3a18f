"""Packaging (SPEC §2): the CMake package (find_package(cuops) from an external project), the wheel
(pip install .; import cuops; its torch-version ImportError), the JIT path (cpp_extension.load), and
the built binary's machine code per arch. Each builds or imports in its own process: one process holds
one cuops library (conftest loaded build/libcuops.so here)."""
import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import HAS_CUDA, LIBRARY

# Under pytest-xdist the tests that build into WORK go to one worker together.
SHARES_WORK = pytest.mark.xdist_group("packaging")
# The wheel is a full build of the same sources by the same CMakeLists (~2.5 minutes of a GPU
# machine's test run, beside the other tests); CI builds it and runs its ops on the CPU, and the GPU
# machine runs the CMake build's kernels and the CMake package's demo on the GPU.
WHEEL_IN_CI = pytest.mark.skipif(HAS_CUDA, reason="the wheel (pip install .): CI builds it and runs its ops; "
                                                  "its CUDA kernels are the CMake build's, tested here")

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = LIBRARY.parent
WORK = BUILD / "packaging"  # kept between runs, so rebuilds are incremental
WORK.mkdir(parents=True, exist_ok=True)


def run(cmd, timeout=1800, **kw):
    """Runs cmd; on failure the assertion shows its output's tail."""
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} -> {proc.returncode}\n{(proc.stdout + proc.stderr)[-4000:]}"
    return proc.stdout + proc.stderr


def configured_archs():
    text = (BUILD / "CMakeCache.txt").read_text()
    return re.search(r"^CUOPS_CUDA_ARCHITECTURES:STRING=(.*)$", text, re.M).group(1)


def generator():
    return ["-G", "Ninja"] if shutil.which("ninja") else []


def test_binary_holds_machine_code_for_every_configured_arch(tmp_path):
    out = run(["bash", ROOT / "tools" / "check_binary.sh", LIBRARY])
    for arch in configured_archs().split(";"):
        assert re.search(rf"ok +sm_{arch}: [1-9]\d* cuops kernels", out), out
    # The same check on a cache that claims an arch the library was not built for must fail.
    (tmp_path / "CMakeCache.txt").write_text(f"CUOPS_CUDA_ARCHITECTURES:STRING={configured_archs()};75\n")
    shutil.copy(LIBRARY, tmp_path / "libcuops.so")
    proc = subprocess.run(["bash", str(ROOT / "tools" / "check_binary.sh"), str(tmp_path / "libcuops.so")],
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "FAIL sm_75: no machine code" in proc.stdout, proc.stdout


@SHARES_WORK
def test_cmake_package_serves_an_external_consumer():
    """cmake --install, then cpp_demo configured on its own: find_package(Torch), find_package(cuops)."""
    prefix, demo = WORK / "prefix", WORK / "external_demo"
    run(["cmake", "--install", BUILD, "--prefix", prefix])
    for f in ("lib/cmake/cuops/cuopsConfig.cmake", "lib/cmake/cuops/cuopsConfigVersion.cmake",
              "include/cuops/cuops.h", "lib/libcuops.so"):
        assert (prefix / f).exists(), f
    run(["cmake", "-S", ROOT / "cpp_demo", "-B", demo, *generator(), "-DCMAKE_BUILD_TYPE=Release",
         f"-DCMAKE_PREFIX_PATH={prefix};{torch.utils.cmake_prefix_path}"])
    run(["cmake", "--build", demo])
    cache = (demo / "CMakeCache.txt").read_text()
    assert f"cuops_DIR:PATH={prefix}/lib/cmake/cuops" in cache, "the demo did not use the installed package"
    out = run([demo / "cuops_demo"])
    assert "all ops match ATen" in out, out  # ops registered: no "unknown op" from a dropped library


@pytest.fixture(scope="module")
def wheel_site():
    """pip install . (no build isolation: against this torch) into a private target folder."""
    site = WORK / "site"
    shutil.rmtree(site, ignore_errors=True)
    run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-cache-dir", "-q",
         "--target", site, f"--config-settings=cmake.define.CUOPS_CUDA_ARCHITECTURES={configured_archs()}",
         "--config-settings=build-dir=" + str(WORK / "wheel_build"), ROOT], cwd=WORK.parent)
    return site


def python_in(site, code):
    env = dict(os.environ, PYTHONPATH=str(site))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          cwd=str(WORK), timeout=600)


@WHEEL_IN_CI
@SHARES_WORK
def test_pip_install_then_import_runs_ops(wheel_site):
    proc = python_in(wheel_site, f"""
        import torch, cuops
        assert cuops.__version__ == "0.1.0", cuops.__version__
        assert cuops.__file__.startswith({str(wheel_site)!r}), cuops.__file__
        info = cuops.build_info()
        assert info["torch_version"].split("+")[0] == torch.__version__.split("+")[0], info
        assert info["cuops_version"] == "0.1.0" and info["cuda_archs"], info
        for device in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
            a, b = torch.randn(4097, device=device), torch.randn(4097, device=device)
            torch.testing.assert_close(cuops.vector_add(a, b), a + b)
            torch.testing.assert_close(torch.ops.cuops.two_norm(a, b), torch.linalg.vector_norm(a - b))
            m, n = torch.randn(65, 33, device=device), torch.randn(33, 17, device=device)
            torch.testing.assert_close(cuops.mm(m, n), m @ n, rtol=1e-5, atol=1e-5)
        print("ok", info)
    """)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout + proc.stderr


@WHEEL_IN_CI
@SHARES_WORK
def test_import_with_another_torch_names_both_versions(wheel_site):
    # The check runs before the library loads, so a running torch that reports another version is
    # enough to exercise it (installing a second torch release here would take gigabytes).
    proc = python_in(wheel_site, """
        import torch
        torch.__version__ = "2.10.0+cu128"
        import cuops
    """)
    assert proc.returncode != 0
    assert "ImportError: cuops 0.1.0 was built against torch 2.11.0" in proc.stderr, proc.stderr
    assert "but torch 2.10.0+cu128 is installed" in proc.stderr, proc.stderr
    assert "undefined symbol" not in proc.stderr


def test_torch_pin_has_one_release():
    """pyproject.toml names the torch release twice (TOML cannot share a value between the build
    requirements and the dependencies); tools/env.sh reads the dependency. All must agree."""
    text = (ROOT / "pyproject.toml").read_text()
    pins = re.findall(r'"torch==([^"]+)"', text)
    assert len(pins) == 2 and len(set(pins)) == 1, pins
    env = subprocess.run(["bash", "-c", f"source {ROOT}/tools/env.sh >/dev/null; echo $TORCH_PIN"],
                         capture_output=True, text=True, env=dict(os.environ, CUOPS_PYTHON=sys.executable))
    assert env.stdout.strip() == pins[0], env.stdout + env.stderr
    assert torch.__version__.split("+")[0] == pins[0]


@pytest.mark.skipif(HAS_CUDA, reason="JIT build: CI builds it and runs its ops on the CPU; its CUDA kernels are "
                                     "the CMake build's sources, tested here (saves a third full build)")
def test_jit_cpp_extension_load_registers_the_same_ops():
    env = dict(os.environ)
    if HAS_CUDA:
        major, minor = torch.cuda.get_device_capability()
        env.setdefault("TORCH_CUDA_ARCH_LIST", f"{major}.{minor}")
    env.setdefault("MAX_JOBS", str(os.cpu_count() or 2))
    out = run([sys.executable, "-X", "faulthandler", ROOT / "tests" / "scripts" / "jit_load.py", WORK / "jit"], env=env)
    assert "ops ok on cpu" in out, out
