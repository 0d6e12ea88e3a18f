"""Shared fixtures: loads libcuops into torch.ops.cuops, devices, dtypes, tolerances, input makers, and the
GEMM checks the test files share (products against float64, repeatability and CUDA-graph replay)."""
import contextlib
import os
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

if os.environ.get("CUOPS_SANITIZER") and HAS_CUDA:
    class _CaptureUnderTheSanitizer(torch.cuda.graph):
        """tools/sanitize.sh runs with torch's caching allocator off (every tensor its own allocation,
        which the tools check): a capture's first allocation then fails and poisons the process. So a
        test skips at its capture, after its eager checks ran under the tool (the selection's "not
        graph" misses tests that capture without saying so in their name)."""

        def __init__(self, *args, **kwargs):
            pytest.skip(f"captures a CUDA graph, which cannot allocate with torch's caching allocator off "
                        f"(tools/sanitize.sh, {os.environ['CUOPS_SANITIZER']}); the eager checks before it ran")

    torch.cuda.graph = _CaptureUnderTheSanitizer
# Lines test modules add for pytest's terminal summary (e.g. how many bad-input cases ran).
REPORT = []


def pytest_configure(config):
    config.addinivalue_line("markers", "huge: tensors over 2^31 elements (GPU, several GiB)")
    config.addinivalue_line("markers", "quick: the ~1-minute tier (bash tools/test.sh --quick): every GEMM kernel "
                                       "path in every layout, both two_norm passes, the elementwise kernels")


def pytest_terminal_summary(terminalreporter):
    for line in REPORT:
        terminalreporter.write_line(line)


# Tests that took 20 s or more each on the H200 under tools/test.sh (its --durations), started first:
# xdist hands tests out in collection order, and one of these drawn last would run alone on a worker
# while the others idle (longest first keeps the run near its total work / workers).
LONG_FIRST = ("test_packaging.py::test_cmake_package", "test_dtensor.py::", "test_patch.py::test_patched_model_trains",
              "test_gemm_sequences.py::", "test_patch.py::test_a_pickled", "test_patch.py::test_decoder_layer_compiles",
              "test_patch_peft.py::test_a_patched_lora_decoder_layer_compiles", "test_python_api.py::test_import_in_a_fresh",
              "test_pt2.py::test_opcheck_every_op", "test_patch.py::test_compiled_training_forward")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):  # a serial run (CI) keeps the files' order
        items.sort(key=lambda item: not any(k in item.nodeid for k in LONG_FIRST))  # stable


def pytest_runtest_logreport(report):
    """$CUOPS_TEST_TIMES: each test phase's seconds appended as it ends (every xdist worker), so a run
    cut by a time limit still says where its time went."""
    path = os.environ.get("CUOPS_TEST_TIMES")
    if path:
        with open(path, "a") as f:
            f.write(f"{report.duration:8.2f} {report.when:8} {report.nodeid}\n")

NO_GPU_REASON = "no CUDA GPU on this machine (CUDA tests run on the GPU machine via tools/gpu_check.sh)"
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason=NO_GPU_REASON)

DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]
# The same, for tests whose CPU place proves nothing a GPU machine adds and holds up its run
# (torch.compile's C++ codegen, 50 training steps on the CPU: 30-184 s each there under the other
# workers, the longest tests of the README command; the patched LoRA and MoE models against HF's,
# 10-20 s each): CI runs it; a GPU machine runs the CUDA place.
DEVICES_CPU_IN_CI = [pytest.param("cpu", marks=pytest.mark.skipif(
    HAS_CUDA, reason="the CPU place of a compile, long training or model comparison test: CI runs it; a GPU "
                     "machine runs the CUDA place")),
    pytest.param("cuda", marks=requires_cuda)]
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
# GEMM products on the fast kernels, relative to |a| @ |b|. TF32: Hopper's wgmma reads float32 bits and keeps
# their top 10 mantissa bits (truncation, up to 2^-10 relative per input; the portable kernel rounds, 2^-11), so
# one product a * b is off by up to ~2^-9 of |a| |b|, plus float32 accumulation. Tiny k (k = 1: a single
# product) leaves no averaging.
TF32_TOL = 2.0 ** -9 + 1e-5
# bfloat16/float16: float32 accumulation and one rounding of each result: the error is at most the dtype's
# unit roundoff (2^-8 bfloat16, 2^-11 float16) of |result| <= |a| @ |b|, plus float32 accumulation.
HALF_TOL = {torch.bfloat16: 2.0 ** -8 + 1e-5, torch.float16: 2.0 ** -11 + 1e-5}


def fast_kernel_tol(dtype, precision="highest", k=0):
    """Error bound of a fast kernel's product over k, relative to |a| @ |b|: the half types' rounding, TF32's
    (float32 at "high" matmul precision), float32's, or float64's: its table bound up to k = 4096, growing
    with k past it (a rounding per 16-deep slice and one per split), still far below a lost or doubled
    16-deep slice (16 / k of the sum)."""
    if dtype == torch.float64:
        return REDUCTION_TOL[torch.float64] * max(1.0, k / 4096)
    return HALF_TOL.get(dtype, TF32_TOL if precision == "high" else REDUCTION_TOL[torch.float32])


@contextlib.contextmanager
def matmul_precision(precision):
    """torch.set_float32_matmul_precision for the block only (the ops read it at each call)."""
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


def rel_error(got, ref, scale=None):
    """||got - ref|| / ||scale|| (scale defaults to ref): Frobenius norms in float64, on ref's device."""
    got, ref = got.to(ref.device, torch.float64), ref.double()
    assert not torch.isnan(got).any(), "output holds NaN (an element was not written, or NaN leaked)"
    denom = (ref if scale is None else scale.to(ref.device, torch.float64)).norm().item()
    return (got - ref).norm().item() / (denom if denom > 0 else 1.0)


LAYOUTS = ["contiguous", "transposed", "sliced", "expanded", "offset"]


def make(shape, dtype, device, layout="contiguous", generator=None, scale=1.0):
    """A random tensor (standard normal times `scale`) of logical `shape` whose memory layout is `layout`."""
    shape = tuple(shape)

    def randn(s):
        # Drawn where they are used (the CPU's float64 generator was most of a GPU product test's time),
        # unless the caller brings its own generator.
        where = "cpu" if generator is not None else device
        x = torch.randn(s, dtype=torch.float64, generator=generator, device=where)
        return (x * scale).to(dtype=dtype, device=device)

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
    if layout == "padded":  # a slice of a wider tensor: rows a whole number of 16 bytes apart, 16 bytes spare
        if not shape:
            return randn(shape)
        unit = 16 // torch.empty((), dtype=dtype).element_size()
        return randn(shape[:-1] + ((shape[-1] + unit - 1) // unit * unit + unit,))[..., :shape[-1]]
    raise ValueError(layout)


def product_reference(a, b):
    """(a @ b, |a| @ |b|) in float64: a product's reference, and the scale of its rounding error, which grows
    with sum_k |a_ik| |b_kj|, not with |a @ b| (cancellation can make that arbitrarily small). On the
    operands' device: torch's float64 product there (cuBLAS's DGEMM on a GPU) is another implementation
    than the one under test, and on the CPU two 1024 x 8192 x 1024 references took ~20 s a test beside
    11 other test processes."""
    a64, b64 = a.double(), b.double()
    return a64 @ b64, a64.abs() @ b64.abs()


def check_products(a, b, tol, layout_c="contiguous", beta_tol=None):
    """mm(a, b) (a contiguous result of a's dtype), gemm(c, a, b, -1.5, 0) into a NaN-poisoned c (beta 0 never
    reads it) and gemm(c, a, b, 0.5, -2) onto a random c, c in layout_c (make's layouts), each within tol of
    the float64 product relative to |alpha| |a| @ |b| + |beta| |c| (the last within beta_tol where given).
    The ops run under the caller's float32 matmul precision."""
    m, n = a.shape[0], b.shape[1]
    ref, scale = product_reference(a, b)
    out = ops.mm(a, b)
    assert out.dtype == a.dtype and out.shape == (m, n) and out.is_contiguous()
    c0 = make((m, n), a.dtype, a.device, layout_c)
    c = torch.full_like(c0, float("nan"))  # c0's layout
    ops.gemm(c, a, b, -1.5, 0.0)
    cb = c0.clone()
    ops.gemm(cb, a, b, 0.5, -2.0)
    c0 = c0.double().to(ref.device)
    assert rel_error(out, ref, scale) <= tol
    assert rel_error(c, -1.5 * ref, 1.5 * scale) <= tol
    assert rel_error(cb, 0.5 * ref - 2.0 * c0, 0.5 * scale + 2.0 * c0.abs()) <= (tol if beta_tol is None else beta_tol)


def assert_repeatable_and_graph_safe(a, b, runs=3, replays=2):
    """mm(a, b) gives the same bits on every run, and gemm into a NaN-poisoned c gives them again from each
    CUDA-graph replay (a product that splits k: its partials meet in a fixed order; the split tail's
    workspace flags are zeroed inside the graph, so a replay cannot see the one before); and with new values
    copied into a (the captured buffer: a is overwritten), a replay computes with them, eager's bits."""
    first = ops.mm(a, b)
    for _ in range(runs):
        assert torch.equal(ops.mm(a, b), first)
    out = torch.full_like(first, float("nan"))
    side = torch.cuda.Stream()  # the warm-up outside the capture, on a side stream as torch's graphs want
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ops.gemm(out, a, b, 1.0, 0.0)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    out.fill_(float("nan"))
    with torch.cuda.graph(g):
        ops.gemm(out, a, b, 1.0, 0.0)
    for _ in range(replays):
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, first)
    a.copy_(make(tuple(a.shape), a.dtype, a.device))
    out.fill_(float("nan"))
    g.replay()
    assert torch.equal(out, ops.mm(a, b))


# The GEMM paths a test can take in process (kernels/switches.h): "fast", as the planner picks here;
# "portable", with the switches that send Hopper's products to the kernels other GPUs run (the
# mma.sync kernels, the small-M kernel's per-lane forms, float64's tiles).
PATHS = ["fast", "portable"]
PORTABLE_SWITCHES = ("CUOPS_DISABLE_WGMMA", "CUOPS_DISABLE_SKINNY_TMA")


@contextlib.contextmanager
def gemm_path(path):
    """The block on `path` (PATHS); "portable" is skipped where it is the fast path already."""
    if path == "fast":
        yield
        return
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the portable path is this GPU's fast path (compute capability 9.0 only has others)")
    with contextlib.ExitStack() as stack:
        for name in PORTABLE_SWITCHES:
            stack.enter_context(cuops.switch(name))
        yield


requires_hopper = pytest.mark.skipif(
    not HAS_CUDA or torch.cuda.get_device_capability() != (9, 0),
    reason=NO_GPU_REASON if not HAS_CUDA else "the fused GEMM epilogues are sm_90a's (compute capability 9.0)")

# torch keeps no peak statistics with its caching allocator off (PYTORCH_NO_CUDA_MEMORY_CACHING, which
# tools/sanitize.sh sets so the tools see every tensor as its own allocation): a memory bound's lower
# side then fails on figures that were never measured.
requires_caching_allocator = pytest.mark.skipif(
    os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", "0") not in ("", "0"),
    reason="measures memory through torch's caching allocator, which PYTORCH_NO_CUDA_MEMORY_CACHING turns off")


def cuda_kernels(fn):
    """The names of the CUDA kernels fn() launches, in order (the profiler's record). Under
    compute-sanitizer (tools/sanitize.sh sets CUOPS_SANITIZER) the test skips: the tool holds CUPTI,
    and the profiler then fails ("multiple subscribers") instead of recording."""
    if os.environ.get("CUOPS_SANITIZER"):
        pytest.skip(f"names launched kernels through the profiler, which cannot run under compute-sanitizer "
                    f"({os.environ['CUOPS_SANITIZER']} holds CUPTI); the kernels' results are checked by the other tests")
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
            and "memset" not in e.name.lower() and "memcpy" not in e.name.lower()]


def poison_allocator(nbytes=1 << 26):
    """Fills a block of the caching allocator with NaN and frees it, so the next outputs it hands out
    start as NaN: an element a kernel leaves unwritten shows (rel_error refuses NaN)."""
    torch.full((nbytes // 4,), float("nan"), device="cuda")
    torch.cuda.synchronize()


def switch_on(name):
    """Whether the switch is on in this process (set in process or from the environment)."""
    return cuops.set_switch(name)

