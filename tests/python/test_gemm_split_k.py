"""k split (kernels/gemm_simt.cu, float32 "highest": independent CTAs writing partial planes that a
second kernel adds in order; kernels/gemm_wgmma.cuh, bf16/fp16 and TF32 on Hopper: the partial last wave
cut along k; kernels/gemm_plan.cpp): products with few output tiles over a long k, as a training
step's mid-size and weight-gradient products run them.
Checked against float64 with poisoned outputs, in every layout, over k that no split divides, with
alpha/beta, and for the same bits on every run and from a CUDA-graph replay."""
import re

import pytest
import torch

from conftest import REDUCTION_TOL, assert_repeatable_and_graph_safe, make, ops, rel_error, requires_cuda
from test_ops import cuda_kernel_names, fast_kernel_tol, matmul_precision, wgmma_runs_here

# (m, n, k): the planner's split on a 132-SM H100 (plan_simt's cost) in brackets. k = 1 and 17 run
# unsplit (too short): the same checks hold there.
SHAPES = [(128, 4096, 4096),    # 32 tiles of 128 x 128: 8 planes
          (200, 1000, 4097),    # 16 tiles, k not a multiple of any slice: 8
          (120, 1001, 3000),    # odd n (the planes' rows not 8-byte aligned): 16
          (513, 2050, 1031),    # 85 tiles over a short k, odd m: 3
          (100, 130, 65537),    # 6 tiles of 64 x 64, a long k: 16
          (128, 4096, 1), (77, 300, 17)]
LAYOUTS = [("k", "n"), ("k", "k"), ("m", "n"), ("m", "k")]  # a's contiguous axis, b's


def operands(m, n, k, a_major, b_major):
    a = make((m, k), torch.float32, "cuda") if a_major == "k" else make((k, m), torch.float32, "cuda").t()
    b = make((k, n), torch.float32, "cuda") if b_major == "n" else make((n, k), torch.float32, "cuda").t()
    return a, b


@requires_cuda
@pytest.mark.parametrize("m,n,k", SHAPES, ids=str)
@pytest.mark.parametrize("a_major,b_major", LAYOUTS, ids=str)
def test_split_k_products(m, n, k, a_major, b_major):
    a, b = operands(m, n, k, a_major, b_major)
    ref, scale = a.double() @ b.double(), a.double().abs() @ b.double().abs()
    tol = REDUCTION_TOL[torch.float32]
    with matmul_precision("highest"):
        out = ops.mm(a, b)
        c = torch.full((m, n), float("nan"), device="cuda")
        ops.gemm(c, a, b, -1.5, 0.0)  # beta 0 never reads the NaN c
        c0 = make((m, n), torch.float32, "cuda")
        cb = c0.clone()
        ops.gemm(cb, a, b, 0.5, -2.0)
    assert rel_error(out, ref, scale) <= tol
    assert rel_error(c, -1.5 * ref, 1.5 * scale) <= tol
    assert rel_error(cb, 0.5 * ref - 2.0 * c0.double(), 0.5 * scale + 2.0 * c0.double().abs()) <= tol


@requires_cuda
@pytest.mark.parametrize("m,n,k,split", [(128, 4096, 4096, True), (1024, 1024, 1024, True),
                                         (2048, 2048, 2048, False), (128, 4096, 200, False)], ids=str)
def test_split_k_kernel_choice(m, n, k, split):
    """The split instance and the planes' sum run where the planner splits (fewer tiles than the SMs
    hold over a k of at least two 128-k slices; on a 132-SM H100) and only there."""
    a, b = operands(m, n, k, "k", "n")
    with matmul_precision("highest"):
        ops.mm(a, b)
        names = cuda_kernel_names(lambda: ops.mm(a, b))
    simt = [x for x in names if "sgemm_simt" in x]
    assert simt, "the SIMT kernel ran"
    if torch.cuda.get_device_properties(0).multi_processor_count != 132:
        pytest.skip("the split counts are the planner's for 132 SMs")
    assert any(re.search(r"sgemm_simt<.*, true>", x) for x in simt) == split, names
    assert any("sum_planes" in x for x in names) == split, names


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
# kernels/gemm_plan.cpp); it does not split over a cluster (kWgMaxSplit: that instance measured slower
# than the best unsplit tile on every shape). The products are checked whichever plan runs; on a
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


def wg_operands(m, n, k, a_major, b_major, dtype):
    a = make((m, k), dtype, "cuda") if a_major == "k" else make((k, m), dtype, "cuda").t()
    b = make((k, n), dtype, "cuda") if b_major == "n" else make((n, k), dtype, "cuda").t()
    return a, b


@requires_cuda
@pytest.mark.parametrize("dtype,precision", WG_CASES, ids=str)
@pytest.mark.parametrize("m,n,k", WG_SHAPES, ids=str)
@pytest.mark.parametrize("a_major,b_major", LAYOUTS, ids=str)
def test_wgmma_split_k_products(dtype, precision, m, n, k, a_major, b_major):
    a, b = wg_operands(m, n, k, a_major, b_major, dtype)
    ref, scale = a.double() @ b.double(), a.double().abs() @ b.double().abs()
    tol = fast_kernel_tol(dtype, precision)
    with matmul_precision(precision):
        out = ops.mm(a, b)
        c = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
        ops.gemm(c, a, b, -1.5, 0.0)
        c0 = make((m, n), dtype, "cuda")
        cb = c0.clone()
        ops.gemm(cb, a, b, 0.5, -2.0)
    assert rel_error(out, ref, scale) <= tol
    assert rel_error(c, -1.5 * ref, 1.5 * scale) <= tol
    assert rel_error(cb, 0.5 * ref - 2.0 * c0.double(), 0.5 * scale + 2.0 * c0.double().abs()) <= 2 * tol


@requires_cuda
@pytest.mark.parametrize("m,n,k,split", [(3072, 1024, 8192, False), (128, 4096, 4096, False),
                                         (4096, 4096, 4096, False), (1024, 1024, 1024, False)], ids=str)
def test_wgmma_split_k_kernel_choice(m, n, k, split):
    """The split wgmma instance runs only where the planner splits: nowhere, until it pays (kWgMaxSplit)."""
    if not wgmma_runs_here():
        pytest.skip("no sm_90a wgmma kernel on this GPU (or CUOPS_DISABLE_WGMMA): the portable kernels do not split")
    a, b = wg_operands(m, n, k, "k", "n", torch.bfloat16)
    ops.mm(a, b)
    names = [x for x in cuda_kernel_names(lambda: ops.mm(a, b)) if "gemm_wgmma" in x]
    assert names, "the wgmma kernel ran"
    assert any(re.search(r"gemm_wgmma<.*, 1, true>", x) for x in names) == split, names


@requires_cuda
@pytest.mark.parametrize("m,n,k,tail", [(3072, 1024, 8192, False), (768, 3072, 16384, True), (128, 4096, 4096, False),
                                        (4096, 4096, 4096, False), (1024, 1024, 1024, False)], ids=str)
def test_wgmma_split_tail_choice(m, n, k, tail):
    """The split tail runs where the last wave leaves SMs idle over a long k, and only there: its launch
    zeroes the workspace's flags first (a memset beside the wgmma kernel), which nothing else does."""
    if not wgmma_runs_here() or torch.cuda.get_device_properties(0).multi_processor_count != 132:
        pytest.skip("the plans named here are a 132-SM H100's (sm_90a wgmma kernel)")
    a, b = wg_operands(m, n, k, "m" if k > 4096 else "k", "n", torch.bfloat16)
    ops.mm(a, b)
    names = cuda_kernel_names(lambda: ops.mm(a, b))
    assert any("gemm_wgmma" in x for x in names), names
    assert any("memset" in x.lower() for x in names) == tail, names


@requires_cuda
@pytest.mark.parametrize("m,n,k,tall", [(3072, 1024, 8192, True), (3000, 1000, 8200, True), (4096, 4096, 4096, False),
                                        (8192, 8192, 8192, False), (1024, 6144, 4096, False)], ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_wgmma_tall_tile_choice(m, n, k, tall, dtype):
    """192 x 128 tiles (three consumer warpgroups) run where they make one full wave of a long k that
    128-row tiles leave partial (the c_attn weight gradient: 128 tiles against 192 of 128 x 128), and
    not where the wide pairs or 128 x 128 finish first."""
    if not wgmma_runs_here() or torch.cuda.get_device_properties(0).multi_processor_count != 132:
        pytest.skip("the plans named here are a 132-SM H100's (sm_90a wgmma kernel)")
    a, b = wg_operands(m, n, k, "m" if k > 4096 else "k", "n", dtype)
    ops.mm(a, b)
    names = [x for x in cuda_kernel_names(lambda: ops.mm(a, b)) if "gemm_wgmma" in x]
    assert names, "the wgmma kernel ran"
    assert any(re.search(r"gemm_wgmma<[^,]+, 192, 128,", x) for x in names) == tall, names


@pytest.mark.quick
@requires_cuda
@pytest.mark.parametrize("dtype,precision", WG_CASES, ids=str)
@pytest.mark.parametrize("m,n,k,a_major", [(3072, 1024, 8192, "m"), (3000, 1000, 8200, "k"), (768, 3072, 4097, "k"),
                                            (768, 3072, 16384, "m")], ids=str)
def test_wgmma_split_k_is_bitwise_repeatable_and_graph_safe(dtype, precision, m, n, k, a_major):
    a, b = wg_operands(m, n, k, a_major, "n", dtype)
    with matmul_precision(precision):
        assert_repeatable_and_graph_safe(a, b)


@requires_cuda
def test_split_k_under_compile_reduce_overhead():
    """A model whose Linears split k (few rows, a long k: 128 tokens through 4096 -> 4096 -> 4096 in
    float32 "highest", the SIMT kernel's split), compiled with mode="reduce-overhead" (its CUDA graphs
    replay the split), matches eager bit for bit."""
    torch._dynamo.reset()
    w1, w2 = make((4096, 4096), torch.float32, "cuda", scale=0.02), make((4096, 4096), torch.float32, "cuda", scale=0.02)

    def mlp(x):
        return ops.mm(torch.relu(ops.mm(x, w1.t())), w2.t())

    with matmul_precision("highest"):
        names = cuda_kernel_names(lambda: mlp(make((128, 4096), torch.float32, "cuda")))
        assert any(re.search(r"sgemm_simt<.*, true>", x) for x in names), names
        compiled = torch.compile(mlp, mode="reduce-overhead", fullgraph=True)
        for _ in range(4):  # the later calls replay the graph
            x = make((128, 4096), torch.float32, "cuda")
            torch.testing.assert_close(compiled(x), mlp(x), rtol=0, atol=0)


@requires_cuda
def test_split_tail_under_compile_reduce_overhead():
    """A bf16 weight-gradient step whose product splits its last wave along k on Hopper (gpt-2's c_fc:
    768 x 3072 over 16384 tokens, 144 tiles, the last 12 in 11 runs), compiled with
    mode="reduce-overhead": its CUDA graphs take the workspace from their pool and replay the flags'
    reset, and match eager bit for bit."""
    torch._dynamo.reset()

    def weight_grad(x, g):
        return torch.relu(ops.mm(x.t(), g)).sum(0)

    compiled = torch.compile(weight_grad, mode="reduce-overhead", fullgraph=True)
    for _ in range(4):  # the later calls replay the graph
        x, g = make((16384, 768), torch.bfloat16, "cuda"), make((16384, 3072), torch.bfloat16, "cuda")
        torch.testing.assert_close(compiled(x, g), weight_grad(x, g), rtol=0, atol=0)
