"""k split (kernels/gemm/gemm_simt.cu, float32 "highest": independent CTAs writing partial planes that a
second kernel adds in order; kernels/gemm/gemm_wgmma.cuh, bf16/fp16 and TF32 on Hopper: the partial last wave
cut along k; kernels/gemm/gemm_plan.cpp): products with few output tiles over a long k, as a training
step's mid-size and weight-gradient products run them.
Checked against float64 with poisoned outputs, in every layout, over k that no split divides, with
alpha/beta, and for the same bits on every run and from a CUDA-graph replay. Where the planner splits
(and where not): tests/cpp/test_gemm_plan.cpp, on the CPU."""
import pytest
import torch

from conftest import (REDUCTION_TOL, assert_repeatable_and_graph_safe, check_products, fast_kernel_tol, make,
                      matmul_precision, ops, requires_cuda)

# (m, n, k) and the split plan_simt gave each on a 132-SM H100 when it was added (operands it reads in
# place; the products are checked whichever plan runs). k = 1 and 17 run unsplit (too short): the same
# checks hold there.
SHAPES = [(128, 4096, 4096),    # 32 tiles of 128 x 128: 8 planes
          (200, 1000, 4097),    # 16 tiles, k not a multiple of any slice: 8
          (120, 1001, 3000),    # odd n (the planes' rows not 8-byte aligned): 16
          (513, 2050, 1031),    # 85 tiles over a short k, odd m: 3
          (100, 130, 65537),    # 6 tiles of 64 x 64, a long k: 16
          (128, 4096, 1), (77, 300, 17)]
LAYOUTS = [("k", "n"), ("k", "k"), ("m", "n"), ("m", "k")]  # a's contiguous axis, b's


def operands(m, n, k, a_major, b_major, dtype=torch.float32):
    """a [m, k] with k ("k") or m ("m") its contiguous axis, b [k, n] with n ("n") or k ("k")."""
    a = make((m, k), dtype, "cuda", "contiguous" if a_major == "k" else "transposed")
    b = make((k, n), dtype, "cuda", "contiguous" if b_major == "n" else "transposed")
    return a, b


@requires_cuda
@pytest.mark.parametrize("m,n,k", SHAPES, ids=str)
@pytest.mark.parametrize("a_major,b_major", LAYOUTS, ids=str)
def test_split_k_products(m, n, k, a_major, b_major):
    a, b = operands(m, n, k, a_major, b_major)
    with matmul_precision("highest"):
        check_products(a, b, REDUCTION_TOL[torch.float32])


@pytest.mark.quick
@requires_cuda
@pytest.mark.parametrize("a_major,b_major", [("k", "n"), ("m", "k")], ids=str)
def test_split_k_is_bitwise_repeatable_and_graph_safe(a_major, b_major):
    """The partial planes meet in a fixed order: the same bits every run and from a CUDA-graph replay
    (the workspace from the graph's pool)."""
    a, b = operands(128, 4096, 4096, a_major, b_major)
    with matmul_precision("highest"):
        assert_repeatable_and_graph_safe(a, b)


# Few tiles, or a partial last wave, over a long k on the wgmma kernel (Hopper): bf16, fp16 and TF32.
# The planner cuts the last wave's tiles along k over the SMs it leaves idle (the split tail,
# kernels/gemm/gemm_plan.cpp); it does not split over a cluster (that instance measured slower than the best
# unsplit tile on every shape, and is gone). The products are checked whichever plan runs; on a
# 132-SM H100 the plans are (16-bit types; TF32, which has no 192-row tile, splits the first three's
# last wave along k):
WG_SHAPES = [(3072, 1024, 8192),  # a GPT-style c_attn weight gradient: one wave of 128 tiles of 192 x 128
             (3000, 1000, 8200),  # the same on 192 x 128 with m, n and k no multiple of the tile's
             (768, 3072, 4097),   # one wave of 96 tiles of 192 x 128, k not a multiple of a k-tile
             (768, 3072, 16384),  # 144 tiles of 128 x 128 (1.09 waves): the last 12 in 11 runs
             (128, 4096, 4096),   # 64 tiles of 128 x 64: one wave, k unsplit
             (200, 1000, 4097),   # 16 tiles, k not a multiple of a k-tile or of a run
             (100, 130, 65537),   # 2 tiles, a long k: 16 runs each
             (77, 300, 17)]       # too short to split: the same checks
WG_CASES = [(torch.bfloat16, "highest"), (torch.float16, "highest"), (torch.float32, "high")]


@requires_cuda
@pytest.mark.parametrize("dtype,precision", WG_CASES, ids=str)
@pytest.mark.parametrize("m,n,k", WG_SHAPES, ids=str)
@pytest.mark.parametrize("a_major,b_major", LAYOUTS, ids=str)
def test_wgmma_split_k_products(dtype, precision, m, n, k, a_major, b_major):
    a, b = operands(m, n, k, a_major, b_major, dtype)
    tol = fast_kernel_tol(dtype, precision)
    with matmul_precision(precision):
        check_products(a, b, tol, beta_tol=2 * tol)


@pytest.mark.quick
@requires_cuda
@pytest.mark.parametrize("dtype,precision", WG_CASES, ids=str)
@pytest.mark.parametrize("m,n,k,a_major", [(3072, 1024, 8192, "m"), (3000, 1000, 8200, "k"), (768, 3072, 4097, "k"),
                                            (768, 3072, 16384, "m")], ids=str)
def test_wgmma_split_k_is_bitwise_repeatable_and_graph_safe(dtype, precision, m, n, k, a_major):
    """The split tail's partial tiles meet in run order: the same bits every run and from a CUDA-graph
    replay (the workspace from the graph's pool, its flags zeroed in the graph), with new inputs too."""
    a, b = operands(m, n, k, a_major, "n", dtype)
    with matmul_precision(precision):
        assert_repeatable_and_graph_safe(a, b)


@requires_cuda
def test_split_k_under_compile_reduce_overhead():
    """A model whose Linears split k (few rows, a long k: 128 tokens through 4096 -> 4096 -> 4096 in
    float32 "highest", the SIMT kernel's split on a 132-SM H100: tests/cpp/test_gemm_plan.cpp,
    Float32HighestRunsTheSimtKernel), compiled with mode="reduce-overhead" (its CUDA graphs replay the
    split), matches eager bit for bit."""
    torch._dynamo.reset()
    w1, w2 = make((4096, 4096), torch.float32, "cuda", scale=0.02), make((4096, 4096), torch.float32, "cuda", scale=0.02)

    def mlp(x):
        return ops.mm(torch.relu(ops.mm(x, w1.t())), w2.t())

    with matmul_precision("highest"):
        compiled = torch.compile(mlp, mode="reduce-overhead", fullgraph=True)
        for _ in range(4):  # the later calls replay the graph
            x = make((128, 4096), torch.float32, "cuda")
            torch.testing.assert_close(compiled(x), mlp(x), rtol=0, atol=0)


@requires_cuda
def test_split_tail_under_compile_reduce_overhead():
    """A bf16 weight-gradient step whose product splits its last wave along k on Hopper (gpt-2's c_fc:
    768 x 3072 over 16384 tokens, 144 tiles, the last 12 in 11 runs: tests/cpp/test_gemm_plan.cpp,
    APartialLastWaveOverALongKIsSplitAlongK), compiled with
    mode="reduce-overhead": its CUDA graphs take the workspace from their pool and replay the flags'
    reset, and match eager bit for bit."""
    torch._dynamo.reset()

    def weight_grad(x, g):
        return torch.relu(ops.mm(x.t(), g)).sum(0)

    compiled = torch.compile(weight_grad, mode="reduce-overhead", fullgraph=True)
    for _ in range(4):  # the later calls replay the graph
        x, g = make((16384, 768), torch.bfloat16, "cuda"), make((16384, 3072), torch.bfloat16, "cuda")
        torch.testing.assert_close(compiled(x, g), weight_grad(x, g), rtol=0, atol=0)
