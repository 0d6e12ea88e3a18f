"""float64 GEMM on the FP64 tensor cores (kernels/gemm_f64.cu; kernels/gemm_plan.cpp's float64 rows):
against a product computed on the CPU, to 1e-12 of |a| @ |b| for k <= 4096 (a bound a lost or doubled
16-deep slice of k would break by orders of magnitude), with poisoned outputs, in every operand layout
and both output orders, on shapes that cut every tile edge and pick each tile and split, with
alpha/beta; the same bits on every run and from a CUDA-graph replay; and the kernel the planner names
is the one that runs."""
import re

import pytest
import torch

from conftest import assert_repeatable_and_graph_safe, make, ops, rel_error, requires_cuda
from test_ops import cuda_kernel_names

F64_TOL = 1e-12

# (m, k, n) and what the planner picks on a 132-SM H100 (kernels/gemm_plan.cpp's cost model).
SHAPES = [(1000, 1000, 1000),   # 128 x 64 tiles cut at 1000, a ragged last slice of k (62.5 slices)
          (1024, 8192, 1024),   # 128 x 128, k split in two (partial planes)
          (2000, 64, 1000),     # many 128 x 64 tiles over a short k, the last row of tiles 80 rows
          (2000, 48, 1000),     # 128 x 64 over three 16-deep slices: no stage crosses, the ring's last only
          (2048, 600, 1024),    # 128 x 128 over a ragged k (18.75 32-deep stages): crossing, then the checked last
          (200, 4096, 1000),    # 128 x 64 tiles cut at 200 rows, k split 4 ways
          (500, 4096, 1000),    # 64 x 64 tiles cut at 500 rows
          (300, 8192, 500),     # 64 x 64 tiles cut both ways, k split 3 ways (slices of 2736, the last 2720)
          (7, 4096, 1000),      # 7 rows: 16 x 128 tiles, k split 16 ways
          (100, 4096, 130),     # 4 x 3 32 x 64 tiles over a long k: split 8
          (128, 768, 768),      # 32 x 32 tiles, 96 CTAs over k = 768 (gpt-2's attn.c_proj at 128 tokens)
          (100, 250, 770),      # 32 x 32 cut at 100 rows and 770 columns, k of 250 (7.8 32-deep stages)
          (60, 4000, 130),      # 32 x 32 cut both ways, k split 8
          (300, 17, 257),       # k of 17: one slice and a 1-deep edge
          (4097, 1, 7),         # k of 1
          (1, 1000, 4096),      # one row
          (130, 333, 1)]        # one column
LAYOUTS = ["contiguous", "transposed"]


def dmma_here():
    return torch.cuda.get_device_capability()[0] >= 8  # GemmDevice::dmma (the default build has sm_80, sm_90)


def cpu_reference(a, b):
    a64, b64 = a.cpu().double(), b.cpu().double()
    return a64 @ b64, a64.abs() @ b64.abs()


@requires_cuda
@pytest.mark.parametrize("mkn", SHAPES, ids=str)
@pytest.mark.parametrize("layout_a", LAYOUTS)
@pytest.mark.parametrize("layout_b", LAYOUTS)
@pytest.mark.parametrize("layout_c", LAYOUTS)
def test_float64_products(mkn, layout_a, layout_b, layout_c):
    m, k, n = mkn
    a, b = make((m, k), torch.float64, "cuda", layout_a), make((k, n), torch.float64, "cuda", layout_b)
    ref, scale = cpu_reference(a, b)
    out = ops.mm(a, b)
    assert out.dtype == torch.float64 and out.is_contiguous()
    c0 = make((m, n), torch.float64, "cuda", layout_c)
    c = torch.full_like(c0, float("nan"))  # c0's layout; beta = 0 never reads the NaN
    ops.gemm(c, a, b, -1.5, 0.0)
    cb = c0.clone()
    ops.gemm(cb, a, b, 0.5, -2.0)
    c0 = c0.cpu()
    assert rel_error(out, ref, scale) <= F64_TOL
    assert rel_error(c, -1.5 * ref, 1.5 * scale) <= F64_TOL
    assert rel_error(cb, 0.5 * ref - 2.0 * c0, 0.5 * scale + 2.0 * c0.abs()) <= F64_TOL


@requires_cuda
@pytest.mark.parametrize("k", [4097, 65537], ids=str)
def test_float64_long_k(k):
    """k past 4096, not a multiple of a slice or of any split: the bound grows with k (a rounding per
    16-deep slice and one per split), still far below a lost or doubled slice (1 / 256 of the sum or more)."""
    a, b = make((96, k), torch.float64, "cuda"), make((k, 200), torch.float64, "cuda", "transposed")
    ref, scale = cpu_reference(a, b)
    assert rel_error(ops.mm(a, b), ref, scale) <= F64_TOL * k / 4096


@requires_cuda
def test_float64_odd_strides_copy_or_run_general():
    """Operands whose rows are not whole 16 bytes apart (odd leading strides: slices of wider tensors)
    are copied into padded rows where the product pays for it, else run the general kernel: both exact."""
    for m, k, n in [(300, 333, 290), (300, 333, 90)]:
        a = torch.randn(m, k + 1, dtype=torch.float64, device="cuda")[:, :k]  # ld k + 1, odd
        b = torch.randn(k, n + 1, dtype=torch.float64, device="cuda")[:, :n]
        ref, scale = cpu_reference(a, b)
        assert rel_error(ops.mm(a, b), ref, scale) <= F64_TOL


@pytest.mark.quick
@requires_cuda
@pytest.mark.parametrize("m,k,n,split", [(4096, 512, 4096, False), (1024, 8192, 1024, True),
                                         (17, 14336, 4096, True), (512, 100, 512, False)], ids=str)
def test_float64_kernel_choice(m, k, n, split):
    """The DMMA kernel runs float64 (the split instance and the planes' sum where the planner splits k,
    on a 132-SM H100), not the general one. (At most 16 rows with a's k contiguous: the small-M
    kernel's stream on sm_90, tests/python/test_gemm_small_m.py.)"""
    if not dmma_here():
        pytest.skip("no FP64 tensor cores before sm_80: the general kernel serves float64")
    a, b = make((m, k), torch.float64, "cuda"), make((k, n), torch.float64, "cuda")
    ops.mm(a, b)  # loaded before profiling (the profiler may name a kernel loaded inside it INVALID)
    names = cuda_kernel_names(lambda: ops.mm(a, b))
    dmma = [x for x in names if "dgemm_mma" in x]
    assert dmma and not any("gemm_tiled" in x for x in names), names
    if torch.cuda.get_device_properties(0).multi_processor_count != 132:
        pytest.skip("the split choices are the planner's for 132 SMs")
    assert any(re.search(r"dgemm_mma<.*, true>", x) for x in dmma) == split, dmma
    assert any("sum_planes<double>" in x for x in names) == split, names


@pytest.mark.quick
@requires_cuda
@pytest.mark.parametrize("mkn", [(1024, 8192, 1024), (100, 4096, 130), (2048, 256, 2048)], ids=str)
def test_float64_is_bitwise_repeatable_and_graph_safe(mkn):
    """Split or not, the same bits on every run and from a CUDA-graph replay (the split's planes from
    the graph's pool, summed in a fixed order; no atomics)."""
    m, k, n = mkn
    a, b = make((m, k), torch.float64, "cuda", "transposed"), make((k, n), torch.float64, "cuda")
    assert_repeatable_and_graph_safe(a, b)
