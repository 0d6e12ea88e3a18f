"""The small-M GEMM (kernels/gemm/gemm_skinny.cu): decode-shaped products, M <= 16 tokens against a weight
read once, as nn.Linear runs them (forward x @ W.t(), input gradient g @ W), in every float dtype.
Each case checks the result against float64 with poisoned outputs, on both sides of the planner's
boundary (M = 16 takes the small-M kernel, M = 17 the tiled ones: tests/cpp/test_gemm_plan.cpp,
SmallMBoundaryAsNnLinearRunsIt), with k and the outputs cut by every chunk and split, and the split
reduction's determinism and CUDA-graph replay."""
import pytest
import torch

from conftest import (REDUCTION_TOL, assert_repeatable_and_graph_safe, check_products, fast_kernel_tol, gemm_path,
                      make, matmul_precision, requires_cuda, switch_on)

MAX_TOKENS = 16  # kernels/gemm/gemm_plan.h kSkinnyMaxTokens
# The streaming form (TMA ring) runs every dtype (bf16/fp16, TF32 and float64 on the tensor cores,
# float32 "highest" by FP32 FMAs) on compute capability 9.0 unless switched off. float64 has no per-lane
# form: without the stream it runs the tiled float64 kernel (tests/python/test_gemm_f64.py).
def streams():
    return not switch_on("CUOPS_DISABLE_SKINNY_TMA") and torch.cuda.get_device_capability() == (9, 0)


TOKENS = [1, 2, 3, 15, 16, 17, 63]
# (outputs, k) chosen so the planner takes each of its splits on a 132-SM H100 (kernels/gemm/gemm_plan.cpp):
# a cluster of 8 (few outputs, long k), four warps of one block, two warps, and a dot product's 3
# outputs over a k of 20000; none of them a multiple of a chunk (32 / 16 / 128 / 4 k).
# The streaming form (bf16/fp16 on sm_90): clusters of 2, none, none, 8 for the forward; (20000, 3)'s
# input gradient at M <= 3 has 3 outputs of an o-contiguous weight over a k of 20000 (a cluster of 8;
# at larger M c's short side is its 3 columns, whose operand is not k-contiguous: the tiled kernels).
OUTPUTS_K = [(1000, 4097), (4100, 1000), (24000, 333), (3, 20000), (20000, 3)]
CASES = [(torch.bfloat16, "highest"), (torch.float16, "highest"), (torch.float32, "highest"),
         (torch.float32, "high"), (torch.float64, "highest")]
# Each case on the fast path, and the per-lane forms' dtypes (fp16 for the 16-bit forms, float32 at both
# precisions) again on the portable path: the forms GPUs without the stream run (conftest.gemm_path).
CASES_PATHS = [(*c, "fast") for c in CASES] + [(*c, "portable") for c in CASES[1:4]]


def linear_operands(kind, m, n_out, k_in, dtype):
    """(a, b) of the product as nn.Linear(k_in -> n_out) runs it on m tokens: forward x @ W.t() (b
    k-major), input gradient g @ W (b row-major). Each a slice of a wider tensor whose rows are a whole
    number of 16 bytes apart, so the small-M kernel reads it in place whatever k is: k then ends inside a
    chunk."""
    def padded(rows, cols):
        return make((rows, cols), dtype, "cuda", "padded")

    if kind == "forward":
        return padded(m, k_in), padded(n_out, k_in).t()
    return padded(m, n_out), padded(n_out, k_in)


def takes_small_m(a, b):
    """Whether the planner gives a @ b (c row-major) to the small-M kernel (kernels/gemm/gemm_plan.cpp
    plan_skinny): c's rows are the tokens (at most 16, not more than the columns, a's k contiguous), or
    its columns are (at most 16, b's k contiguous); float64 only where it streams."""
    m, n = a.shape[0], b.shape[1]
    if a.dtype == torch.float64 and not streams():
        return False
    return (m <= MAX_TOKENS and m <= n and a.stride(1) == 1) or (n <= MAX_TOKENS and b.stride(0) == 1)


def product_tol(a, b, precision):
    """float64 (either kernel): its bound growing with k past 4096 (conftest.fast_kernel_tol). float32 in
    the small-M kernel is true FP32 ("highest" always; TF32 allowed too in the per-lane forms, whose
    stream, not their multiplies, sets the pace), so held to float32's bound; the streaming form
    multiplies TF32 on the tensor cores where TF32 is allowed."""
    true_fp32 = precision == "highest" or not streams()
    if takes_small_m(a, b) and a.dtype == torch.float32 and true_fp32:
        return REDUCTION_TOL[torch.float32]
    return fast_kernel_tol(a.dtype, precision, k=a.shape[1])


def check_small_m_products(a, b, precision, layout_c="contiguous"):
    """conftest.check_products of a @ b at the precision, to the bound of the kernel the planner gives it."""
    with matmul_precision(precision):
        check_products(a, b, product_tol(a, b, precision), layout_c)


@requires_cuda
@pytest.mark.parametrize("dtype,precision,path", CASES_PATHS, ids=str)
@pytest.mark.parametrize("m", TOKENS)
@pytest.mark.parametrize("n_out,k_in", OUTPUTS_K, ids=str)
@pytest.mark.parametrize("kind", ["forward", "input_grad"])
def test_small_m_products(dtype, precision, path, m, n_out, k_in, kind):
    a, b = linear_operands(kind, m, n_out, k_in, dtype)
    with gemm_path(path):
        check_small_m_products(a, b, precision)


@requires_cuda
@pytest.mark.parametrize("dtype,precision,path", CASES_PATHS, ids=str)
@pytest.mark.parametrize("w_layout", ["k-contiguous", "outputs-contiguous"])
@pytest.mark.parametrize("m", [1, 5, 16])
def test_small_m_tokens_as_columns_of_c(dtype, precision, path, w_layout, m):
    """W @ x.t() (c [outputs, m]: the tokens are c's columns) and a column-major c of x @ W.t():
    the same kernel with the output's strides exchanged."""
    x = make((m, 1030), dtype, "cuda")
    w = make((2050, 1030), dtype, "cuda") if w_layout == "k-contiguous" else make((1030, 2050), dtype, "cuda").t()
    with gemm_path(path):
        check_small_m_products(w, x.t(), precision)
        check_small_m_products(x, w.t(), precision, layout_c="transposed")  # gemm's c [m, 2050] column-major


@pytest.mark.quick
@requires_cuda
@pytest.mark.parametrize("dtype,precision", CASES, ids=str)
@pytest.mark.parametrize("n_out,k_in", [(1000, 4097), (4096, 14336), (20000, 64)], ids=str)
@pytest.mark.parametrize("kind", ["forward", "input_grad"])
def test_small_m_split_reduction_is_bitwise_repeatable(dtype, precision, n_out, k_in, kind):
    """k split over warps and over a cluster's CTAs sums in a fixed order: the same bits every run, and
    the same from a CUDA-graph replay (no workspace, no counters to reset), which computes with new
    inputs copied into the captured buffers."""
    a, b = linear_operands(kind, 8, n_out, k_in, dtype)
    with matmul_precision(precision):
        assert_repeatable_and_graph_safe(a, b, runs=5, replays=3)
