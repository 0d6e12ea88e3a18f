"""Shared fixtures: loads libcuops into torch.ops.cuops, devices, dtypes, tolerances, input makers."""
import pathlib
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The package is the one place that finds the library ($CUOPS_LIBRARY, $CUOPS_BUILD_DIR, build/).
sys.path.insert(0, str(ROOT / "python"))
import cuops  # noqa: E402

LIBRARY = pathlib.Path(cuops.library_path)
ops = torch.ops.cuops

HAS_CUDA = torch.cuda.is_available()
# Lines test modules add for pytest's terminal summary (e.g. how many bad-input cases ran).
REPORT = []


def pytest_configure(config):
    config.addinivalue_line("markers", "huge: tensors over 2^31 elements (GPU, several GiB)")
    config.addinivalue_line("markers", "quick: the ~1-minute tier (bash tools/test.sh --quick): every GEMM kernel "
                                       "path in every layout, both two_norm passes, the elementwise kernels")


def pytest_terminal_summary(terminalreporter):
    for line in REPORT:
        terminalreporter.write_line(line)
NO_GPU_REASON = "no CUDA GPU on this machine (CUDA tests run on the GPU machine via tools/gpu_check.sh)"
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason=NO_GPU_REASON)

DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]

# Per-dtype tolerances against a float64 reference: one rounding of the result for elementwise ops.
ELEMENTWISE_TOL = {
    torch.float32: dict(rtol=1.3e-6, atol=1e-30),
    torch.float64: dict(rtol=1e-13, atol=1e-300),
    torch.float16: dict(rtol=1e-3, atol=1e-7),
    torch.bfloat16: dict(rtol=8e-3, atol=1e-30),
}
# Relative Frobenius-norm error of reductions and products: tests/tolerances.txt, the table the C++
# suite reads too.
_DTYPE_NAMES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}
REDUCTION_TOL = {_DTYPE_NAMES[name]: float(bound) for name, bound in
                 (line.split() for line in (ROOT / "tests" / "tolerances.txt").read_text().splitlines()
                  if line.strip() and not line.startswith("#"))}


def rel_error(got, ref, scale=None):
    """||got - ref|| / ||scale|| (scale defaults to ref): Frobenius norms in float64."""
    got, ref = got.double().cpu(), ref.double().cpu()
    assert not torch.isnan(got).any(), "output holds NaN (an element was not written, or NaN leaked)"
    denom = (ref if scale is None else scale.double().cpu()).norm().item()
    return (got - ref).norm().item() / (denom if denom > 0 else 1.0)


LAYOUTS = ["contiguous", "transposed", "sliced", "expanded", "offset"]


def make(shape, dtype, device, layout="contiguous", generator=None, scale=1.0):
    """A random tensor (standard normal times `scale`) of logical `shape` whose memory layout is `layout`."""
    shape = tuple(shape)

    def randn(s):
        return (torch.randn(s, dtype=torch.float64, generator=generator) * scale).to(dtype=dtype, device=device)

    if layout == "contiguous":
        return randn(shape)
    if layout == "transposed":
        dims = list(range(len(shape)))[::-1]
        return randn(shape[::-1]).permute(dims)
    if layout == "sliced":
        if not shape:
            return randn(shape)
        return randn(shape[:-1] + (2 * shape[-1],))[..., ::2]
    if layout == "expanded":
        if not shape:
            return randn(shape)
        return randn((1,) + shape[1:]).expand(shape)
    if layout == "offset":  # storage offset of one element: pointers not 16-byte aligned
        n = 1
        for s in shape:
            n *= s
        return randn((n + 1,))[1:].view(shape)
    raise ValueError(layout)


def assert_repeatable_and_graph_safe(a, b):
    """mm(a, b) gives the same bits on every run, and gemm into a NaN-poisoned c gives them again from a
    CUDA-graph replay, twice (a product that splits k: its partials meet in a fixed order; the split
    tail's workspace flags are zeroed inside the graph, so a second replay cannot see the first's)."""
    first = ops.mm(a, b)
    for _ in range(3):
        assert torch.equal(ops.mm(a, b), first)
    out = torch.full_like(first, float("nan"))
    ops.gemm(out, a, b, 1.0, 0.0)  # warm-up outside the capture
    g = torch.cuda.CUDAGraph()
    out.fill_(float("nan"))
    with torch.cuda.graph(g):
        ops.gemm(out, a, b, 1.0, 0.0)
    for _ in range(2):
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, first)
