"""float64 GEMM on the FP64 tensor cores (kernels/gemm/gemm_f64.cu; kernels/gemm/gemm_plan.cpp's float64 rows):
against torch's float64 product (cuBLAS DGEMM), to 1e-12 of |a| @ |b| for k <= 4096 (a bound a lost or doubled
16-deep slice of k would break by orders of magnitude), with poisoned outputs, in every operand layout
and both output orders, on shapes that cut every tile edge and pick each tile and split, with
alpha/beta; and the same bits on every run and from a CUDA-graph replay. The planner's choices of
kernel, tile and split are tested on the CPU: tests/cpp/test_gemm_plan.cpp."""
import pytest
import torch

from conftest import (REDUCTION_TOL, assert_repeatable_and_graph_safe, check_products, fast_kernel_tol, make, ops,
                      product_reference, rel_error, requires_cuda)

F64_TOL = REDUCTION_TOL[torch.float64]  # 1e-12 (tests/tolerances.txt), held to k = 8192 here
QUICK = pytest.mark.quick  # the quick tier: a tile unsplit and a split k, in every layout

# (m, k, n) and the tile and split the planner gave each on a 132-SM H100 when it was added
# (kernels/gemm/gemm_plan.cpp's cost model; its rules are tested on the CPU, tests/cpp/test_gemm_plan.cpp):
# the products are checked whichever plan runs.
SHAPES = [pytest.param((1000, 1000, 1000), marks=QUICK),  # 128 x 64 cut at 1000, a ragged last k slice (62.5)
          (1024, 8192, 1024),   # 128 x 128, k split in two (partial planes)
          (2000, 64, 1000),     # many 128 x 64 tiles over a short k, the last row of tiles 80 rows
          (2000, 48, 1000),     # 128 x 64 over three 16-deep slices: no stage crosses, the ring's last only
          (2048, 600, 1024),    # 128 x 128 over a ragged k (18.75 32-deep stages): crossing, then the checked last
          (200, 4096, 1000),    # 128 x 64 tiles cut at 200 rows, k split 4 ways
          (500, 4096, 1000),    # 64 x 64 tiles cut at 500 rows
          (300, 8192, 500),     # 64 x 64 tiles cut both ways, k split 3 ways (slices of 2736, the last 2720)
          (7, 4096, 1000),      # 7 rows: 16 x 128 tiles, k split 16 ways
          pytest.param((100, 4096, 130), marks=QUICK),  # 32 x 32 (c column-major: 32 x 64) over a long k: split
          (128, 768, 768),      # 32 x 32 tiles, 96 CTAs over k = 768 (gpt-2's attn.c_proj at 128 tokens)
          (100, 250, 770),      # 32 x 32 cut at 100 rows and 770 columns, k of 250 (7.8 32-deep stages)
          (60, 4000, 130),      # 32 x 32 cut both ways, k split 8
          (300, 17, 257),       # k of 17: one slice and a 1-deep edge
          (4097, 1, 7),         # k of 1
          (1, 1000, 4096),      # one row
          (130, 333, 1)]        # one column
LAYOUTS = ["contiguous", "transposed"]


@requires_cuda
@pytest.mark.parametrize("mkn", SHAPES, ids=str)
@pytest.mark.parametrize("layout_a", LAYOUTS)
@pytest.mark.parametrize("layout_b", LAYOUTS)
@pytest.mark.parametrize("layout_c", LAYOUTS)
def test_float64_products(mkn, layout_a, layout_b, layout_c):
    m, k, n = mkn
    a, b = make((m, k), torch.float64, "cuda", layout_a), make((k, n), torch.float64, "cuda", layout_b)
    check_products(a, b, F64_TOL, layout_c)


@requires_cuda
@pytest.mark.parametrize("k", [4097, 65537], ids=str)
def test_float64_long_k(k):
    """k past 4096, not a multiple of a slice or of any split: the bound grows with k (a rounding per
    16-deep slice and one per split), still far below a lost or doubled slice (1 / 256 of the sum or more)."""
    a, b = make((96, k), torch.float64, "cuda"), make((k, 200), torch.float64, "cuda", "transposed")
    ref, scale = product_reference(a, b)
    assert rel_error(ops.mm(a, b), ref, scale) <= fast_kernel_tol(torch.float64, k=k)


@requires_cuda
def test_float64_odd_strides_copy_or_run_general():
    """Operands whose rows are not whole 16 bytes apart (odd leading strides: slices of wider tensors)
    are copied into padded rows where the product pays for it, else run the general kernel: both exact."""
    for m, k, n in [(300, 333, 290), (300, 333, 90)]:
        a = torch.randn(m, k + 1, dtype=torch.float64, device="cuda")[:, :k]  # ld k + 1, odd
        b = torch.randn(k, n + 1, dtype=torch.float64, device="cuda")[:, :n]
        ref, scale = product_reference(a, b)
        assert rel_error(ops.mm(a, b), ref, scale) <= F64_TOL


@pytest.mark.quick
@requires_cuda
@pytest.mark.parametrize("mkn", [(1024, 8192, 1024), (100, 4096, 130), (2048, 256, 2048)], ids=str)
def test_float64_is_bitwise_repeatable_and_graph_safe(mkn):
    """Split or not, the same bits on every run and from a CUDA-graph replay (the split's planes from
    the graph's pool, summed in a fixed order; no atomics), and the replay computes with new inputs."""
    m, k, n = mkn
    a, b = make((m, k), torch.float64, "cuda", "transposed"), make((k, n), torch.float64, "cuda")
    assert_repeatable_and_graph_safe(a, b)
