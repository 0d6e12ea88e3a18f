"""Reliability (SPEC §1): property tests against a float64 reference, concurrency on many streams,
bitwise determinism, tensors over 2^31 elements, and several GPUs (cuda:1, DDP)."""
import contextlib
import math
import os
import pathlib
import subprocess
import sys
import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import (DEVICES, DTYPES, ELEMENTWISE_TOL, HALF_TOL, HAS_CUDA, LAYOUTS, LIBRARY, NO_GPU_REASON,
                      REDUCTION_TOL, make, ops, rel_error, requires_cuda)

HERE = pathlib.Path(__file__).resolve().parent
PROPERTY = settings(max_examples=int(os.environ.get("CUOPS_HYPOTHESIS_EXAMPLES", 60)), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# ---- property tests ---------------------------------------------------------------------------

shapes = st.lists(st.integers(0, 37), min_size=0, max_size=3).map(tuple)
layouts = st.sampled_from(LAYOUTS)
dtypes = st.sampled_from(DTYPES)
seeds = st.integers(0, 2**63 - 1)
magnitudes = st.sampled_from([1e-3, 1.0, 1e3])


def draw_input(shape, dtype, device, layout, seed, magnitude):
    return make(shape, dtype, device, layout, generator=torch.Generator().manual_seed(seed), scale=magnitude)


def acc_dtype(dtype):
    """The type an op computes in: float for the half types (torch's opmath), else the dtype."""
    return torch.float64 if dtype == torch.float64 else torch.float32


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(shape=shapes, dtype=dtypes, la=layouts, lb=layouts, seed=seeds, mag=magnitudes,
       alpha=st.floats(-4, 4, allow_nan=False))
def test_property_elementwise_ops_match_float64(device, shape, dtype, la, lb, seed, mag, alpha):
    a = draw_input(shape, dtype, device, la, seed, mag)
    b = draw_input(shape, dtype, device, lb, seed + 1, mag)
    tol = ELEMENTWISE_TOL[dtype]
    a64, b64 = a.double().cpu(), b.double().cpu()
    # Each result is one rounding of the exact value, so compare to the float64 result rounded once.
    for got, exact in ((ops.vector_add(a, b), a64 + b64),
                       # alpha in the op's compute type (float for the half types, as torch.mul's
                       # opmath): rounded to the dtype a tiny alpha would be a subnormal half.
                       (ops.scale(a, alpha), a64 * torch.tensor(alpha, dtype=acc_dtype(dtype)).double()),
                       (ops.square(a), a64 * a64)):
        assert got.shape == shape and got.is_contiguous() and got.dtype == dtype
        torch.testing.assert_close(got.double().cpu(), exact.to(dtype).double(), rtol=tol["rtol"], atol=tol["atol"])
    c = torch.full(shape, float("nan"), dtype=dtype, device=device)
    ops.add2(c, a, b)
    torch.testing.assert_close(c.double().cpu(), (a64 + b64).to(dtype).double(), rtol=tol["rtol"], atol=tol["atol"])


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(shape=shapes, dtype=dtypes, la=layouts, lb=layouts, seed=seeds, mag=magnitudes)
def test_property_two_norm_matches_float64(device, shape, dtype, la, lb, seed, mag):
    a = draw_input(shape, dtype, device, la, seed, mag)
    b = draw_input(shape, dtype, device, lb, seed + 1, mag)
    got = ops.two_norm(a, b)
    assert got.shape == () and got.dtype == dtype
    ref = torch.linalg.vector_norm(a.double().cpu() - b.double().cpu())
    if torch.isinf(ref.to(dtype)):  # the true norm overflows the dtype (float16 at 1e3): inf, as torch
        assert torch.isinf(got).item(), got
    else:
        assert rel_error(got, ref) <= REDUCTION_TOL[dtype]


@pytest.mark.parametrize("device", DEVICES)
@PROPERTY
@given(m=st.integers(0, 70), k=st.integers(0, 70), n=st.integers(0, 70), dtype=dtypes,
       la=st.sampled_from(["contiguous", "transposed", "sliced", "offset"]),
       lb=st.sampled_from(["contiguous", "transposed", "sliced", "offset"]), seed=seeds,
       alpha=st.sampled_from([1.0, -0.5, 2.0]), beta=st.sampled_from([0.0, 1.0, -2.0]))
def test_property_gemm_matches_float64(device, m, k, n, dtype, la, lb, seed, alpha, beta):
    a = draw_input((m, k), dtype, device, la, seed, 1.0)
    b = draw_input((k, n), dtype, device, lb, seed + 1, 1.0)
    c0 = draw_input((m, n), dtype, device, "contiguous", seed + 2, 1.0)
    a64, b64, c64 = a.double().cpu(), b.double().cpu(), c0.double().cpu()
    scale = abs(alpha) * (a64.abs() @ b64.abs()) + abs(beta) * c64.abs()
    ref = alpha * (a64 @ b64) + beta * c64
    c = c0.clone()
    if beta == 0.0:
        c.fill_(float("nan"))  # beta = 0 ignores c, NaN included
    ops.gemm(c, a, b, alpha, beta)
    assert rel_error(c, ref, scale) <= REDUCTION_TOL[dtype]
    out = ops.mm(a, b)
    assert out.shape == (m, n) and out.is_contiguous()
    assert rel_error(out, a64 @ b64, a64.abs() @ b64.abs()) <= REDUCTION_TOL[dtype]


# ---- concurrency and determinism --------------------------------------------------------------

THREADS, CALLS = 8, 1000


def every_op(t):
    """One call of every op on the inputs t; returns the outputs (add2 and gemm write t's buffers)."""
    ops.add2(t["c"], t["a"], t["b"])
    ops.gemm(t["cm"], t["am"], t["bm"], 1.0, 0.0)
    return [t["c"], t["cm"], ops.vector_add(t["a"], t["b"]), ops.scale(t["a"], 1.5), ops.square(t["b"]),
            ops.two_norm(t["a"], t["b"]), ops.mm(t["am"], t["bm"])]


def thread_inputs(device, seed):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(device)  # noqa: E731
    return {"a": r(1000 + seed), "b": r(1000 + seed), "c": torch.empty(1000 + seed, device=device),
            "am": r(33, 17), "bm": r(17, 9 + seed), "cm": torch.empty(33, 9 + seed, device=device)}


@pytest.mark.parametrize("device", DEVICES)
def test_eight_threads_on_their_own_streams_get_correct_results(device):
    calls = CALLS if device != "cpu" else CALLS // 4  # the CPU path is ATen: a lighter smoke of the same
    inputs = [thread_inputs(device, i) for i in range(THREADS)]
    expected = [[o.clone() for o in every_op(t)] for t in inputs]
    mismatches = [None] * THREADS
    errors = []
    barrier = threading.Barrier(THREADS)

    def work(i):
        try:
            stream = torch.cuda.Stream() if device != "cpu" else None
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                if stream is not None:
                    stream.wait_stream(torch.cuda.default_stream())
                bad = torch.zeros((), dtype=torch.int64, device=device)
                barrier.wait()
                for _ in range(calls):
                    for got, exp in zip(every_op(inputs[i]), expected[i]):
                        bad += (got != exp).sum()  # bitwise: same inputs give the same bits
                if stream is not None:
                    stream.synchronize()
                mismatches[i] = int(bad)
        except Exception as e:  # noqa: BLE001 - reported below with the thread's index
            errors.append((i, repr(e)))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert mismatches == [0] * THREADS, mismatches


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_back_to_back_products_see_each_others_writes(dtype):
    """The Hopper GEMM and the small-M stream launch as programmatic dependents of the kernel before
    them (their prologue overlaps its end; each lets the next start early): each must still read what
    that kernel wrote and write only after it has read. A chain of products fed one by the next (tiled,
    then a decode-sized one on the last output's rows), and a gemm writing the buffer the product
    right before it read, eager and from a CUDA-graph replay, against float64 products of the inputs
    each step actually had. (Elsewhere the same checks hold for the portable kernels.)"""
    n = 2048
    g = torch.Generator().manual_seed(7)
    ws = [(torch.randn(n, n, generator=g, dtype=torch.float64) / math.sqrt(n)).to(dtype).cuda() for _ in range(4)]
    x0 = torch.randn(n, n, generator=g, dtype=torch.float64).to(dtype).cuda()

    def chain(x, buf):
        outs = [x]
        for w in ws:
            outs.append(ops.mm(outs[-1], w))       # reads the output of the kernel just before
        outs.append(ops.mm(outs[-1][:8], ws[0]))  # 8 tokens: the small-M kernel, right after a tiled one
        before = buf.clone()
        first = ops.mm(buf, ws[1])                # reads buf ...
        ops.gemm(buf, outs[2], ws[2], 1.0, 0.0)    # ... which the next kernel overwrites
        return outs, before, first, buf

    def check(outs, before, first, buf):
        for i, w in enumerate(ws):
            ref = outs[i].double() @ w.double()
            assert rel_error(outs[i + 1], ref, outs[i].double().abs() @ w.double().abs()) <= HALF_TOL[dtype], i
        a8 = outs[len(ws)][:8].double()
        assert rel_error(outs[-1], a8 @ ws[0].double(), a8.abs() @ ws[0].double().abs()) <= HALF_TOL[dtype]
        ref = before.double() @ ws[1].double()
        assert rel_error(first, ref, before.double().abs() @ ws[1].double().abs()) <= HALF_TOL[dtype]
        ref = outs[2].double() @ ws[2].double()
        assert rel_error(buf, ref, outs[2].double().abs() @ ws[2].double().abs()) <= HALF_TOL[dtype]

    eager = chain(x0, torch.randn(n, n, generator=g, dtype=torch.float64).to(dtype).cuda())
    check(*eager)
    buf = torch.randn(n, n, generator=g, dtype=torch.float64).to(dtype).cuda()
    x = x0.clone()
    start = buf.clone()
    chain(x, buf.clone())  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = chain(x, buf)
    for _ in range(2):
        buf.copy_(start)
        graph.replay()
        torch.cuda.synchronize()
        check(*captured)
        assert all(torch.equal(a, b) for a, b in zip(captured[0], eager[0]))  # the same bits as eager


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_two_norm_bitwise_identical_over_100_runs(device, dtype):
    n = (1 << 24) + 12345 if device != "cpu" else 100_003  # GPU: the bulk-copy pass on Hopper
    a, b = torch.randn(n, device=device, dtype=dtype), torch.randn(n, device=device, dtype=dtype)
    first = ops.two_norm(a, b)
    side = torch.cuda.Stream() if device != "cpu" else None
    runs = []
    for i in range(100):
        if side is not None and i % 2:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                runs.append(ops.two_norm(a, b))
            torch.cuda.current_stream().wait_stream(side)
        else:
            runs.append(ops.two_norm(a, b))
    bits = torch.stack(runs).view(torch.int16 if dtype == torch.bfloat16 else torch.int32)
    ref_bits = first.view(torch.int16 if dtype == torch.bfloat16 else torch.int32)
    assert bool((bits == ref_bits).all()), torch.stack(runs).unique()


# ---- huge: over 2^31 elements (GPU) ---------------------------------------------------------------

HUGE_N = (1 << 31) + (1 << 20) + 7  # over 2^31, odd, not a multiple of any vector width


def needs_gpu_memory(gib):
    if not HAS_CUDA:
        return pytest.mark.skip(reason=NO_GPU_REASON)
    free = torch.cuda.mem_get_info()[0] / 2**30
    return pytest.mark.skipif(free < gib, reason=f"needs {gib} GiB of free GPU memory, {free:.0f} GiB free")


def chunks(n, size=1 << 28):
    for lo in range(0, n, size):
        yield slice(lo, min(n, lo + size))


@pytest.mark.huge
@needs_gpu_memory(20)
def test_huge_vector_add_and_add2_bf16():
    n = HUGE_N
    a = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    b = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    a[-1], b[-1] = 3.0, 4.0  # the last element, past 2^31, carries a known sum
    out = ops.vector_add(a, b)
    assert out.shape == (n,)
    for s in chunks(n):  # bf16 + bf16 computed in float32 and rounded once: torch.add's bits exactly
        assert torch.equal(out[s], torch.add(a[s], b[s])), s
    assert out[-1].item() == 7.0
    del out
    c = torch.full((n,), float("nan"), dtype=torch.bfloat16, device="cuda")
    ops.add2(c, a, b)
    for s in chunks(n):
        assert torch.equal(c[s], torch.add(a[s], b[s])), s
    ops.add2(a, a, b)  # in place over the whole range
    for s in chunks(n):
        assert torch.equal(a[s], c[s]), s


@pytest.mark.huge
@needs_gpu_memory(12)
def test_huge_two_norm_bf16():
    n = HUGE_N
    a = torch.zeros(n, dtype=torch.bfloat16, device="cuda")
    b = torch.zeros(n, dtype=torch.bfloat16, device="cuda")
    # Only elements past 2^31 differ: a wrong index width would miss them (or read out of bounds).
    a[(1 << 31) + 5], b[n - 1] = 3.0, -4.0
    assert ops.two_norm(a, b).item() == 5.0
    a.normal_()
    b.normal_()
    ref = math.sqrt(sum(((a[s].double() - b[s].double()) ** 2).sum().item() for s in chunks(n)))
    got = ops.two_norm(a, b).item()
    assert abs(got - ref) <= 2 ** -7 * ref, (got, ref)


# ---- several GPUs ---------------------------------------------------------------------------------

TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2,
                              reason=f"needs 2 CUDA GPUs, found {torch.cuda.device_count()} "
                                     "(runs on the device tool's nvidia-h200-x2)")


@TWO_GPUS
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_op_on_cuda1_while_current_device_is_cuda0(dtype):
    torch.cuda.set_device(0)
    g = torch.Generator().manual_seed(11)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    a64, b64, am, bm = r(4097), r(4097), r(65, 33), r(33, 31)
    dev = torch.device("cuda:1")
    a, b = a64.to(dev, dtype), b64.to(dev, dtype)
    A, B = am.to(dev, dtype), bm.to(dev, dtype)
    tol = ELEMENTWISE_TOL[dtype]
    a64, b64, am, bm = a.double().cpu(), b.double().cpu(), A.double().cpu(), B.double().cpu()
    outs = {"vector_add": (ops.vector_add(a, b), a64 + b64), "scale": (ops.scale(a, 2.5), a64 * 2.5),
            "square": (ops.square(a), a64 * a64)}
    c = torch.full_like(a, float("nan"))
    ops.add2(c, a, b)
    outs["add2"] = (c, a64 + b64)
    for name, (got, exact) in outs.items():
        assert got.device == dev, name
        torch.testing.assert_close(got.double().cpu(), exact.to(dtype).double(), **tol, msg=name)
    norm = ops.two_norm(a, b)
    assert norm.device == dev
    assert rel_error(norm, torch.linalg.vector_norm(a64 - b64)) <= REDUCTION_TOL[dtype]
    mm = ops.mm(A, B)
    cm = torch.full((65, 31), float("nan"), device=dev, dtype=dtype)
    ops.gemm(cm, A, B, 1.0, 0.0)
    for got in (mm, cm):
        assert got.device == dev
        assert rel_error(got, am @ bm, am.abs() @ bm.abs()) <= REDUCTION_TOL[dtype]
    # The ops ran on cuda:1's current stream and left the current device alone.
    assert torch.cuda.current_device() == 0
    torch.cuda.synchronize(dev)


@TWO_GPUS
def test_ddp_two_processes_match_single_process(tmp_path):
    script = HERE.parent / "scripts" / "ddp_step.py"
    env = dict(os.environ, CUOPS_LIBRARY=str(LIBRARY), NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
               NVSHMEM_DISABLE_NVLS="1")
    single = tmp_path / "single.pt"
    ddp = tmp_path / "ddp.pt"
    subprocess.run([sys.executable, str(script), "--out", str(single)], env=env, check=True, timeout=300)
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                    str(script), "--out", str(ddp)], env=env, check=True, timeout=300)
    one, two = torch.load(single), torch.load(ddp)
    assert one["final"].keys() == two["final"].keys()
    for k, v in one["final"].items():
        assert not torch.equal(v, one["initial"][k]), f"{k} did not change: the step trained nothing"
        torch.testing.assert_close(two["final"][k], v, rtol=1e-5, atol=1e-6, msg=k)
