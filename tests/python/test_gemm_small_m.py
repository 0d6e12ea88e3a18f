"""The small-M GEMM (kernels/gemm_skinny.cu): decode-shaped products, M <= 16 tokens against a weight
read once, as nn.Linear runs them (forward x @ W.t(), input gradient g @ W), in every float dtype.
Each case checks the result against float64 with poisoned outputs, on both sides of the planner's
boundary (M = 16 takes the small-M kernel, M = 17 the tiled ones), with k and the outputs cut by every
chunk and split, and the split reduction's determinism and CUDA-graph replay."""
import os

import pytest
import torch

from conftest import REDUCTION_TOL, make, ops, rel_error, requires_cuda
from test_ops import cuda_kernel_names, fast_kernel_tol, matmul_precision

MAX_TOKENS = 16  # kernels/gemm_plan.h kSkinnyMaxTokens
# The streaming form (TMA ring) runs every dtype (bf16/fp16, TF32 and float64 on the tensor cores,
# float32 "highest" by FP32 FMAs) on compute capability 9.0 unless switched off. float64 has no per-lane
# form: without the stream it runs the tiled float64 kernel (tests/python/test_gemm_f64.py).
STREAM_DISABLED = os.environ.get("CUOPS_DISABLE_SKINNY_TMA") is not None


def streams():
    return not STREAM_DISABLED and torch.cuda.get_device_capability() == (9, 0)


TOKENS = [1, 2, 3, 15, 16, 17, 63]
# (outputs, k) chosen so the planner takes each of its splits on a 132-SM H100 (kernels/gemm_plan.cpp):
# a cluster of 8 (few outputs, long k), four warps of one block, two warps, and a dot product's 3
# outputs over a k of 20000; none of them a multiple of a chunk (32 / 16 / 128 / 4 k).
# The streaming form (bf16/fp16 on sm_90): clusters of 2, none, none, 8 for the forward; (20000, 3)'s
# input gradient at M <= 3 has 3 outputs of an o-contiguous weight over a k of 20000 (a cluster of 8;
# at larger M c's short side is its 3 columns, whose operand is not k-contiguous: the tiled kernels).
OUTPUTS_K = [(1000, 4097), (4100, 1000), (24000, 333), (3, 20000), (20000, 3)]
CASES = [(torch.bfloat16, "highest"), (torch.float16, "highest"), (torch.float32, "highest"),
         (torch.float32, "high"), (torch.float64, "highest")]


def padded(rows, cols, dtype):
    """[rows, cols] whose rows are a whole number of 16 bytes apart (a slice of a wider tensor), so the
    small-M kernel reads it in place whatever cols is: k then ends inside a chunk."""
    ld = (cols + 7) // 8 * 8 + 8
    return make((rows, ld), dtype, "cuda")[:, :cols]


def linear_operands(kind, m, n_out, k_in, dtype):
    """(a, b) of the product as nn.Linear(k_in -> n_out) runs it on m tokens: forward x @ W.t() (b
    k-major), input gradient g @ W (b row-major)."""
    if kind == "forward":
        return padded(m, k_in, dtype), padded(n_out, k_in, dtype).t()
    return padded(m, n_out, dtype), padded(n_out, k_in, dtype)


def takes_small_m(a, b):
    """Whether the planner gives a @ b (c row-major) to the small-M kernel (kernels/gemm_plan.cpp
    plan_skinny): c's rows are the tokens (at most 16, not more than the columns, a's k contiguous), or
    its columns are (at most 16, b's k contiguous); float64 only where it streams."""
    m, n = a.shape[0], b.shape[1]
    if a.dtype == torch.float64 and not streams():
        return False
    return (m <= MAX_TOKENS and m <= n and a.stride(1) == 1) or (n <= MAX_TOKENS and b.stride(0) == 1)


def product_tol(a, b, dtype, precision):
    """float64 (either kernel): 1e-12 of |a| @ |b| up to k = 4096, growing with k past it (a lost or
    doubled 16-deep slice is >= 1 / 1250 of the sum at k = 20000). float32 in the small-M kernel is
    true FP32 ("highest" always; TF32 allowed too in the per-lane forms, whose stream, not their
    multiplies, sets the pace), so held to float32's bound; the streaming form multiplies TF32 on the
    tensor cores where TF32 is allowed."""
    if dtype == torch.float64:
        return REDUCTION_TOL[torch.float64] * max(1.0, a.shape[1] / 4096)
    true_fp32 = precision == "highest" or not streams()
    small = takes_small_m(a, b) and dtype == torch.float32 and true_fp32
    return REDUCTION_TOL[torch.float32] if small else fast_kernel_tol(dtype, precision)


def check_products(a, b, dtype, precision):
    # The float64 reference on the CPU (on the GPU, float64 inputs would be the product under test).
    a64, b64 = (a.cpu(), b.cpu()) if dtype == torch.float64 else (a.double(), b.double())
    ref, scale = (a64 @ b64).to(a.device), (a64.abs() @ b64.abs()).to(a.device)
    tol = product_tol(a, b, dtype, precision)
    with matmul_precision(precision):
        out = ops.mm(a, b)
        c = torch.full((a.shape[0], b.shape[1]), float("nan"), dtype=dtype, device="cuda")
        ops.gemm(c, a, b, -1.5, 0.0)  # beta 0 never reads the NaN c
        c0 = make((a.shape[0], b.shape[1]), dtype, "cuda")
        cb = c0.clone()
        ops.gemm(cb, a, b, 0.5, -2.0)
    assert out.dtype == dtype and out.shape == ref.shape
    assert rel_error(out, ref, scale) <= tol
    assert rel_error(c, -1.5 * ref, 1.5 * scale) <= tol
    assert rel_error(cb, 0.5 * ref - 2.0 * c0.double(), 0.5 * scale + 2.0 * c0.double().abs()) <= tol


@requires_cuda
@pytest.mark.parametrize("dtype,precision", CASES, ids=str)
@pytest.mark.parametrize("m", TOKENS)
@pytest.mark.parametrize("n_out,k_in", OUTPUTS_K, ids=str)
@pytest.mark.parametrize("kind", ["forward", "input_grad"])
def test_small_m_products(dtype, precision, m, n_out, k_in, kind):
    a, b = linear_operands(kind, m, n_out, k_in, dtype)
    check_products(a, b, dtype, precision)


@requires_cuda
@pytest.mark.parametrize("dtype,precision", CASES, ids=str)
@pytest.mark.parametrize("w_layout", ["k-contiguous", "outputs-contiguous"])
@pytest.mark.parametrize("m", [1, 5, 16])
def test_small_m_tokens_as_columns_of_c(dtype, precision, w_layout, m):
    """W @ x.t() (c [outputs, m]: the tokens are c's columns) and a column-major c of x @ W.t():
    the same kernel with the output's strides exchanged."""
    x = make((m, 1030), dtype, "cuda")
    w = make((2050, 1030), dtype, "cuda") if w_layout == "k-contiguous" else make((1030, 2050), dtype, "cuda").t()
    check_products(w, x.t(), dtype, precision)
    ref = (x.cpu().double() @ w.cpu().double().t()).cuda()
    c = torch.full((2050, m), float("nan"), dtype=dtype, device="cuda").t()  # [m, 2050] column-major
    with matmul_precision(precision):
        ops.gemm(c, x, w.t(), 1.0, 0.0)
    scale = x.double().abs() @ w.double().abs().t()
    assert rel_error(c, ref, scale) <= product_tol(x, w.t(), dtype, precision)


@requires_cuda
@pytest.mark.parametrize("dtype,precision", CASES, ids=str)
@pytest.mark.parametrize("kind", ["forward", "input_grad"])
def test_small_m_kernel_choice_at_the_boundary(dtype, precision, kind):
    """M <= 16 runs the small-M kernel, M = 17 does not (the planner's boundary, both sides); float64
    only where it streams, the tiled float64 kernel elsewhere."""
    f64 = dtype == torch.float64
    for m in (MAX_TOKENS, MAX_TOKENS + 1):
        a, b = linear_operands(kind, m, 4096, 1024, dtype)
        with matmul_precision(precision):
            ops.mm(a, b)  # first: the profiler may name a kernel loaded during the profiled call INVALID
            names = cuda_kernel_names(lambda: ops.mm(a, b))
        small = m <= MAX_TOKENS and (streams() or not f64)
        assert any("gemm_skinny" in n for n in names) == small, (m, names)
        if f64:
            assert any("dgemm_mma" in n for n in names) == (not small), (m, names)
        if m <= MAX_TOKENS:
            assert any("gemm_skinny_tma" in n for n in names) == streams(), names


@requires_cuda
@pytest.mark.skipif(STREAM_DISABLED, reason="already the per-lane run")
def test_small_m_per_lane_forms_without_the_stream():
    """The per-lane forms that serve GPUs without sm_90 (and operands TMA cannot describe) stay correct
    and chosen: this file's fp16 and float32 tests again with the streaming form switched off."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the per-lane forms already ran: this GPU has no streaming form")
    import subprocess
    import sys
    env = dict(os.environ, CUOPS_DISABLE_SKINNY_TMA="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                           "float16 or float32"],
                          capture_output=True, text=True, env=env, timeout=900)
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-2000:]
    assert proc.returncode == 0 and " passed" in summary and "skipped" not in summary, summary


@pytest.mark.quick
@requires_cuda
@pytest.mark.parametrize("dtype,precision", CASES, ids=str)
@pytest.mark.parametrize("n_out,k_in", [(1000, 4097), (4096, 14336), (20000, 64)], ids=str)
@pytest.mark.parametrize("kind", ["forward", "input_grad"])
def test_small_m_split_reduction_is_bitwise_repeatable(dtype, precision, n_out, k_in, kind):
    """k split over warps and over a cluster's CTAs sums in a fixed order: the same bits every run,
    and the same from a CUDA-graph replay (no workspace, no counters to reset)."""
    a, b = linear_operands(kind, 8, n_out, k_in, dtype)
    with matmul_precision(precision):
        first = ops.mm(a, b)
        for _ in range(5):
            assert torch.equal(ops.mm(a, b), first)
        out = torch.empty_like(first)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            ops.gemm(out, a, b, 1.0, 0.0)  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            ops.gemm(out, a, b, 1.0, 0.0)
        for _ in range(3):
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, first)
        # New inputs copied into the captured buffers: the replay computes with them.
        a.copy_(make(tuple(a.shape), dtype, "cuda"))
        graph.replay()
        assert torch.equal(out, ops.mm(a, b))
