"""Correctness of every op against a float64 reference: devices x dtypes x shapes x layouts."""

import os

import pytest
import torch

from conftest import (DEVICES, DTYPES, ELEMENTWISE_TOL, HALF_TOL, LAYOUTS, PATHS, REDUCTION_TOL, TF32_TOL,
                      check_products, cuda_kernels, fast_kernel_tol, gemm_path, make, matmul_precision, ops, rel_error,
                      requires_cuda, switch_on)

SHAPES = [(0,), (1,), (1000,), (4097,), (3, 0, 5), (33, 65), (7, 11, 13)]


def assert_elementwise(got, ref, dtype):
    assert got.dtype == dtype
    assert got.shape == ref.shape
    torch.testing.assert_close(got.double().cpu(), ref.cpu(), **ELEMENTWISE_TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_elementwise_ops(device, dtype, shape, layout):
    a = make(shape, dtype, device, layout)
    b = make(shape, dtype, device, "contiguous" if layout == "expanded" else layout)
    ad, bd = a.double(), b.double()

    c = torch.full(shape, float("nan"), dtype=dtype, device=device)
    assert ops.add2(c, a, b) is None
    assert_elementwise(c, ad + bd, dtype)

    for out, ref in [(ops.vector_add(a, b), ad + bd), (ops.scale(a, -1.75), ad * -1.75),
                     (ops.scale(a), ad * 2.0), (ops.square(a), ad * ad)]:
        assert out.is_contiguous()
        assert_elementwise(out, ref, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["transposed", "sliced", "offset"])
def test_add2_writes_strided_output(device, dtype, layout):
    a, b = make((37, 19), dtype, device), make((37, 19), dtype, device)
    c = make((37, 19), dtype, device, layout).fill_(float("nan"))
    ops.add2(c, a, b)
    assert_elementwise(c, a.double() + b.double(), dtype)


@pytest.mark.quick
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("which", ["a", "b"])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_add2_in_place(device, dtype, which, layout):
    a, b = make((129, 31), dtype, device, layout), make((129, 31), dtype, device, layout)
    ref = a.double() + b.double()
    ops.add2(a if which == "a" else b, a, b)
    assert_elementwise(a if which == "a" else b, ref, dtype)


NORM_CASES = [(s, l) for s in SHAPES for l in ["contiguous", "transposed", "expanded", "offset"]]
NORM_CASES.append(((4096, 4096), "contiguous"))  # one large case: many blocks, many partials
# Large enough for the bulk-copy pass on Hopper, with a misaligned head and a partial last chunk.
BULK_NORM_N = (1 << 24) + 4097
NORM_CASES.append(((BULK_NORM_N,), "offset"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,layout", NORM_CASES, ids=str)
def test_two_norm(device, dtype, shape, layout):
    a = make(shape, dtype, device, layout)
    b = make(shape, dtype, device, "offset" if layout == "offset" else "contiguous")
    out = ops.two_norm(a, b)
    assert out.shape == () and out.dtype == dtype and out.device == a.device
    ref = torch.linalg.vector_norm(a.double() - b.double())
    if a.numel() == 0:
        assert out.item() == 0.0
    else:
        assert rel_error(out, ref) <= REDUCTION_TOL[dtype]


@pytest.mark.parametrize("device", DEVICES)
def test_two_norm_4096_float32_within_1e_6(device):
    a = torch.randn(4096, 4096, device=device)
    b = torch.randn(4096, 4096, device=device)
    ref = torch.linalg.vector_norm((a - b).double())
    assert abs(ops.two_norm(a, b).double().item() - ref.item()) / ref.item() < 1e-6


@pytest.mark.quick
@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_two_norm_pass_choice(dtype):
    """Large inputs take the bulk-copy pass where the GPU has it (sm_90+), the 16-byte-load pass
    elsewhere, and for float64 (the fixed-point finish assumes float32 squares); small inputs the load
    pass everywhere. Both give the float64 answer."""
    has_bulk = (torch.cuda.get_device_capability()[0] >= 9 and not switch_on("CUOPS_DISABLE_BULK_NORM")
                and dtype != torch.float64)
    for n, layout, bulk in [(BULK_NORM_N, "offset", has_bulk), (BULK_NORM_N, "contiguous", has_bulk),
                            (100_003, "contiguous", False)]:
        a, b = make((n,), dtype, "cuda", layout), make((n,), dtype, "cuda", layout)
        names = cuda_kernels(lambda: ops.two_norm(a, b))
        expected = "sum_sq_diff_bulk" if bulk else "sum_sq_diff_partials"
        assert any(expected in k for k in names), (n, layout, expected, names)
        ref = torch.linalg.vector_norm(a.double() - b.double())
        assert rel_error(ops.two_norm(a, b), ref) <= REDUCTION_TOL[dtype]


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_two_norm_extreme_values(dtype):
    """The bulk pass sums chunk sums in fixed point (2^-160 .. 2^224) and counts inf and NaN chunks
    apart: a NaN anywhere gives NaN, an inf gives inf, and tiny and huge inputs keep their precision
    (bfloat16's huge case would overflow a float running sum; float16's norm must stay < 65504)."""
    n = BULK_NORM_N
    has_bulk = torch.cuda.get_device_capability()[0] >= 9 and not switch_on("CUOPS_DISABLE_BULK_NORM")
    scales = {torch.float32: (1e-18, 1e17), torch.float16: (1e-3, 8.0), torch.bfloat16: (1e-18, 1e17)}[dtype]
    for scale in scales if has_bulk else scales[:1]:
        a, b = make((n,), dtype, "cuda", "offset", scale=scale), make((n,), dtype, "cuda", "offset", scale=scale)
        ref = torch.linalg.vector_norm(a.double() - b.double())
        assert torch.isfinite(ref) and ref > 0
        got = ops.two_norm(a, b)
        assert torch.isfinite(got), (scale, got)
        assert rel_error(got, ref) <= REDUCTION_TOL[dtype], (scale, got, ref)
    a, b = make((n,), dtype, "cuda", "offset"), make((n,), dtype, "cuda", "offset")
    pos = int(torch.randint(0, n, ()))
    a[pos] = float("inf")
    assert ops.two_norm(a, b).item() == float("inf")
    b[int(torch.randint(0, n, ()))] = float("nan")
    assert torch.isnan(ops.two_norm(a, b)).item()


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_two_norm_bulk_pass_replays_in_cuda_graph(dtype):
    """The bulk pass zeroes its two counters with a memset node and finishes in whichever block ends
    last: a captured graph replayed many times (inputs refilled in between) gives eager's bits."""
    a, b = make((BULK_NORM_N,), dtype, "cuda", "offset"), make((BULK_NORM_N,), dtype, "cuda", "offset")
    expected = ops.two_norm(a, b)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ops.two_norm(a, b)  # warm-up off the capture (one-time attribute queries)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = ops.two_norm(a, b)
    for i in range(20):
        captured.fill_(float("nan"))
        graph.replay()
        assert torch.equal(captured, expected), i
    b.copy_(make((BULK_NORM_N,), dtype, "cuda"))  # new values in the captured input: a new norm
    graph.replay()
    assert torch.equal(captured, ops.two_norm(a, b))
    assert rel_error(captured, torch.linalg.vector_norm(a.double() - b.double())) <= REDUCTION_TOL[dtype]


GEMM_SHAPES = [(1, 1, 1), (7, 1, 5), (1, 1000, 1), (1, 7, 1000), (1000, 7, 1), (64, 32, 16), (65, 33, 129),
               (0, 3, 4), (3, 0, 4), (4, 3, 0), (257, 300, 130)]
GEMM_LAYOUTS = ["contiguous", "transposed", "sliced", "offset"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mkn", GEMM_SHAPES, ids=str)
@pytest.mark.parametrize("layout_a", GEMM_LAYOUTS)
@pytest.mark.parametrize("layout_b", ["contiguous", "transposed"])
def test_mm_and_gemm(device, dtype, mkn, layout_a, layout_b):
    m, k, n = mkn
    a, b = make((m, k), dtype, device, layout_a), make((k, n), dtype, device, layout_b)
    ref = a.double() @ b.double()
    # Rounding error of a dot product scales with sum |a_ik||b_kj|, not with |result|, which
    # cancellation can make arbitrarily small; normalise by that.
    scale = a.double().abs() @ b.double().abs()
    tol = REDUCTION_TOL[dtype]

    out = ops.mm(a, b)
    assert out.shape == (m, n) and out.dtype == dtype and out.is_contiguous()
    assert rel_error(out, ref, scale) <= tol

    c = torch.full((m, n), float("nan"), dtype=dtype, device=device)
    ops.gemm(c, a, b)  # beta = 0: NaN in c must not leak
    assert rel_error(c, ref, scale) <= tol

    for alpha, beta in [(0.5, -2.0), (-1.0, 1.0)]:
        c0 = make((m, n), dtype, device)
        c = c0.clone()
        ops.gemm(c, a, b, alpha, beta)
        assert rel_error(c, alpha * ref + beta * c0.double(), abs(alpha) * scale + abs(beta) * c0.double().abs()) <= 2 * tol


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("layout_a", ["contiguous", "transposed"])
@pytest.mark.parametrize("layout_b", ["contiguous", "transposed"])
def test_mm_gradients_take_their_operands_layout(device, dtype, layout_a, layout_b):
    # nn.Linear's x @ W.t(): W's gradient must come back in W's own strides (torch.mm's backward does
    # the same), or AccumulateGrad copies it into them on every step.
    m, k, n = 37, 24, 19
    a = make((m, k), dtype, device, layout_a).requires_grad_()
    b = make((k, n), dtype, device, layout_b).requires_grad_()
    g = make((m, n), dtype, device)
    ga, gb = torch.autograd.grad(ops.mm(a, b), (a, b), g)
    ta, tb = torch.autograd.grad(torch.mm(a, b), (a, b), g)
    assert ga.stride() == ta.stride() == a.stride() and gb.stride() == tb.stride() == b.stride()
    tol = REDUCTION_TOL[dtype]
    assert rel_error(ga, g.double() @ b.detach().double().t(), g.double().abs() @ b.detach().double().abs().t()) <= tol
    assert rel_error(gb, a.detach().double().t() @ g.double(), a.detach().double().abs().t() @ g.double().abs()) <= tol


# float32 on the fast kernels (gemm_simt.cu, gemm_tf32.cu): shapes that pick every tile
# configuration and cut every tile edge (m, n, k off the tile grid, k = 1, one row or column),
# operands row-major or transposed (the four no-copy layouts), c row- or column-major. Operand rows
# that are not 16-byte multiples (k = 4097 row-major, n = 4097 row-major) are copied into padded rows
# where the other side has >= 256 rows or columns, else run the general kernel.
FAST_SHAPES = [(1000, 1000, 1000), (7, 4097, 1000), (1000, 4097, 4), (4097, 7, 1), (1, 1000, 4097),
               (2048, 260, 2052), (4100, 64, 2304), (300, 1, 257), (4096, 1000, 7)]


def wgmma_runs_here():
    return torch.cuda.get_device_capability() == (9, 0) and not switch_on("CUOPS_DISABLE_WGMMA")


def fast_layout(t, inner):
    """Whether the fast kernels read t [rows, cols] along dimension `inner` in place (ops/gemm.cpp's
    fast_layout, kernels/gemm/gemm.cu's launch_fast): unit stride there or one element, the other stride a
    whole number of 16 bytes or one element, a 16-byte aligned base."""
    outer = 1 - inner
    unit = 16 // t.element_size()
    return ((t.stride(inner) == 1 or t.size(inner) <= 1) and (t.size(outer) <= 1 or t.stride(outer) % unit == 0)
            and t.data_ptr() % 16 == 0)


def operands_fast(a, b, wgmma_tf32):
    """Whether the product of a and b runs on a fast kernel: the operands are readable in place (a k- or
    m-major, b k- or n-major), or ops/gemm.cpp copies what is not (an unreadable operand; under Hopper's
    TF32 with c row-major (wgmma_tf32), also the smaller of a transposed a and a row-major b) when the
    other side has 256 rows or columns to pay for it."""
    a_k, a_m, b_k, b_n = fast_layout(a, 1), fast_layout(a, 0), fast_layout(b, 0), fast_layout(b, 1)
    copy_a, copy_b = not (a_k or a_m), not (b_k or b_n)
    if wgmma_tf32 and not a_k and a_m and not b_k and b_n:
        copy_a, copy_b = a.shape[0] <= b.shape[1], a.shape[0] > b.shape[1]
    if (copy_a and b.shape[1] < 256) or (copy_b and a.shape[0] < 256):
        return (a_k or a_m) and (b_k or b_n)
    return True


@requires_cuda
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("precision", ["highest", "high"])
@pytest.mark.parametrize("mkn", FAST_SHAPES, ids=str)
@pytest.mark.parametrize("layout_a", ["contiguous", "transposed"])
@pytest.mark.parametrize("layout_b", ["contiguous", "transposed"])
@pytest.mark.parametrize("layout_c", ["contiguous", "transposed"])
def test_gemm_float32_layouts_precisions(path, precision, mkn, layout_a, layout_b, layout_c):
    with gemm_path(path):
        check_float32_layouts_precisions(precision, mkn, layout_a, layout_b, layout_c)


def check_float32_layouts_precisions(precision, mkn, layout_a, layout_b, layout_c):
    m, k, n = mkn
    a, b = make((m, k), torch.float32, "cuda", layout_a), make((k, n), torch.float32, "cuda", layout_b)
    ref = a.double() @ b.double()
    scale = a.double().abs() @ b.double().abs()
    c0 = make((m, n), torch.float32, "cuda", layout_c)
    with matmul_precision(precision):
        out = ops.mm(a, b)
        c = torch.full_like(c0, float("nan"))  # keeps c0's layout: NaN must not leak with beta = 0
        ops.gemm(c, a, b, -1.5, 0.0)
        cb = c0.clone()
        ops.gemm(cb, a, b, 0.5, -2.0)
        # torch's TF32 product cannot run under racecheck or initcheck (tools/sanitize.sh says why):
        # TF32's bound alone there.
        untrusted = os.environ.get("CUOPS_SANITIZER") in ("racecheck", "initcheck")
        torch_err = 0.0 if untrusted else rel_error(torch.mm(a, b), ref, scale)
    errs = [rel_error(out, ref, scale), rel_error(c, -1.5 * ref, 1.5 * scale),
            rel_error(cb, 0.5 * ref - 2.0 * c0.double(), 0.5 * scale + 2.0 * c0.double().abs())]
    if precision == "highest":
        assert max(errs) <= REDUCTION_TOL[torch.float32], errs
        return
    # TF32 like torch's: inputs cut to 10 mantissa bits (relative error <= 2^-10 per input), so
    # the error is well above FP32's, within TF32's bound and near torch.mm's own ...
    assert max(errs) <= max(3 * torch_err, TF32_TOL), (errs, torch_err)
    # ... where the tiled fast kernels take the problem (mm's output is contiguous, gemm's has c's
    # layout); the general kernel they fall back to is true FP32. The small-M kernel, which may take a
    # product whose c has a side of at most 16, is TF32 in its streaming form (sm_90) and FP32 in its
    # per-lane forms (test_gemm_small_m.py holds each to its bound): TF32's bound here.
    small_m = min(m, n) <= 16
    for what, err, c_row_major in (("mm", errs[0], True), ("gemm", errs[1], c.stride(1) == 1 or n == 1)):
        if small_m:
            assert err <= TF32_TOL, (what, err)
        elif operands_fast(a, b, wgmma_runs_here() and c_row_major):
            assert err > 1e-6, f"{what}: TF32 allowed, fast kernel expected, but the result has FP32 accuracy"
        else:
            assert err <= REDUCTION_TOL[torch.float32], (what, err)


# bfloat16/float16 on the tensor-core kernel (gemm_half.cu) where the rule allows (leading strides a
# multiple of 8 elements), the general kernel elsewhere; a big shape for the 128 x 128 tile. Error
# bound: conftest.HALF_TOL.
HALF_SHAPES = FAST_SHAPES + [(4096, 1024, 2048)]


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("mkn", HALF_SHAPES, ids=str)
@pytest.mark.parametrize("layout_a", ["contiguous", "transposed"])
@pytest.mark.parametrize("layout_b", ["contiguous", "transposed"])
@pytest.mark.parametrize("layout_c", ["contiguous", "transposed"])
@pytest.mark.parametrize("path", PATHS)
def test_gemm_half_layouts(dtype, mkn, layout_a, layout_b, layout_c, path):
    m, k, n = mkn
    a, b = make((m, k), dtype, "cuda", layout_a), make((k, n), dtype, "cuda", layout_b)
    with gemm_path(path):
        check_products(a, b, HALF_TOL[dtype], layout_c)


@pytest.mark.quick
@requires_cuda
@pytest.mark.parametrize("dtype,precision", [(torch.bfloat16, "highest"), (torch.float16, "highest"),
                                             (torch.float32, "high"), (torch.float32, "highest")], ids=str)
@pytest.mark.parametrize("layout_a", ["contiguous", "transposed"])
@pytest.mark.parametrize("layout_b", ["contiguous", "transposed"])
@pytest.mark.parametrize("path", PATHS)
def test_gemm_fast_paths_every_layout(dtype, precision, layout_a, layout_b, path):
    """The quick tier's product on each fast path (wgmma on Hopper, TF32 too, after the copy the planner
    asks of a transposed a times a row-major b; the mma.sync kernels elsewhere; SIMT for "highest"), in
    each operand layout, is within that kernel's bound of float64. Which kernel each takes is the planner's
    (tests/cpp/test_gemm_plan.cpp, FastPathsInEveryOperandLayout)."""
    a, b = make((512, 256), dtype, "cuda", layout_a), make((256, 384), dtype, "cuda", layout_b)
    with matmul_precision(precision), gemm_path(path):
        out = ops.mm(a, b)
    tol = fast_kernel_tol(dtype, precision)
    assert rel_error(out, a.double() @ b.double(), a.double().abs() @ b.double().abs()) <= tol


@requires_cuda
@pytest.mark.parametrize("rows", ["16-byte rows", "odd rows"])
@pytest.mark.parametrize("layout_a", ["contiguous", "transposed"])
@pytest.mark.parametrize("layout_b", ["contiguous", "transposed"])
def test_gemm_tf32_sliced_rows_every_layout(layout_a, layout_b, rows):
    """TF32 products of slices of wider tensors, in every operand layout: rows a whole number of 16 bytes
    apart (read in place; on Hopper a transposed a times a row-major b copies the smaller one by cuops'
    transpose kernel, into rows padded to 16 bytes: k = 333), or not (copied into padded rows). Either
    way the product is TF32-accurate, not FP32-accurate (the general kernel's). Which operands are copied
    and which kernel runs: tests/cpp/test_gemm_plan.cpp, Tf32CopiesOnlyWhatWgmmaCannotRead."""
    m, k, n = 300, 333, 290
    pad = 0 if rows == "16-byte rows" else 1
    if layout_a == "transposed":
        a = torch.randn(k, m + 24 + pad, device="cuda")[:, :m].t()  # [m, k], unit row stride, ld 324 (325)
    else:
        a = torch.randn(m, k + 7 + pad, device="cuda")[:, :k]  # ld 340 (341)
    if layout_b == "contiguous":
        b = torch.randn(k, n + 42 + pad, device="cuda")[:, :n]  # [k, n], row-major, ld 332 (333)
    else:
        b = torch.randn(n, k + 7 + pad, device="cuda")[:, :k].t()  # [k, n], unit row stride, ld 340 (341)
    with matmul_precision("high"):
        out = ops.mm(a, b)
    err = rel_error(out, a.double() @ b.double(), a.double().abs() @ b.double().abs())
    assert 1e-6 < err <= TF32_TOL, err


@pytest.mark.quick
@requires_cuda
@pytest.mark.parametrize("dtype,precision", [(torch.float32, "highest"), (torch.float32, "high"),
                                             (torch.bfloat16, "highest"), (torch.float16, "highest")], ids=str)
def test_gemm_cuda_odd_leading_strides(dtype, precision):
    """Odd leading strides are correct: contiguous operands and output whose rows are not 16-byte multiples
    (the 4097^3 shape, scaled down: every leading stride odd), the operands copied into padded rows, c
    (any leading stride) written in place, pair by pair where aligned and element by element where not,
    and read the same way for beta (compute-sanitizer's memcheck runs this: a misaligned pair access is
    reported there). That the copies then run a fast kernel, not the general one:
    tests/cpp/test_gemm_plan.cpp, OddLeadingStridesAreCopiedForAFastKernel."""
    a, b = make((257, 333), dtype, "cuda"), make((333, 259), dtype, "cuda")
    with matmul_precision(precision):
        check_products(a, b, fast_kernel_tol(dtype, precision))


def tight_rows(rows, cols, dtype, ld=16):
    """[rows, cols] with rows ld elements apart (a 16-byte multiple: the fast kernels take it) in a
    buffer that ends at the last element, so a chunk read past a cut edge leaves the allocation."""
    buf = torch.randn((rows - 1) * ld + cols, dtype=torch.float64).to(dtype=dtype, device="cuda")
    return buf.as_strided((rows, cols), (ld, 1))


@pytest.mark.quick
@requires_cuda
@pytest.mark.parametrize("dtype,precision", [(torch.float32, "highest"), (torch.float32, "high"),
                                             (torch.bfloat16, "highest"), (torch.float16, "highest")], ids=str)
@pytest.mark.parametrize("mkn", [(1, 1, 1), (5, 3, 7), (17, 9, 13)], ids=str)
@pytest.mark.parametrize("layout_a", ["rows", "columns"])
@pytest.mark.parametrize("layout_b", ["rows", "columns"])
def test_gemm_cuda_cut_chunks_stay_in_bounds(dtype, precision, mkn, layout_a, layout_b):
    """Every fast kernel on shapes whose edges cut 16-byte chunks, operands ending their allocations
    (compute-sanitizer's memcheck runs this: a read past an edge is reported there)."""
    m, k, n = mkn
    a = tight_rows(m, k, dtype) if layout_a == "rows" else tight_rows(k, m, dtype).t()
    b = tight_rows(k, n, dtype) if layout_b == "rows" else tight_rows(n, k, dtype).t()
    ref = a.double() @ b.double()
    # At least the smallest normal: an output in the subnormal range (a 1 x 1 x 1 product of two small
    # draws) rounds to an absolute half-ulp, up to eps / 2 of it (fp16: 4.9e-4 <= tol).
    scale = (a.double().abs() @ b.double().abs()).clamp_min(torch.finfo(dtype).smallest_normal)
    tol = fast_kernel_tol(dtype, precision)
    with matmul_precision(precision):
        out = ops.mm(a, b)
        c = tight_rows(m, n, dtype)
        c0 = c.clone()
        ops.gemm(c, a, b, 0.5, -2.0)
    assert rel_error(out, ref, scale) <= tol
    assert rel_error(c, 0.5 * ref - 2.0 * c0.double(), 0.5 * scale + 2.0 * c0.double().abs()) <= tol


@requires_cuda
@pytest.mark.parametrize("dtype,precision", [(torch.float32, "highest"), (torch.float32, "high"),
                                             (torch.bfloat16, "highest"), (torch.float16, "highest")], ids=str)
@pytest.mark.parametrize("mkn", [(300, 260, 520), (2048, 40, 2052)], ids=str)
@pytest.mark.parametrize("broadcast", ["a", "b", "both"])
def test_gemm_cuda_broadcast_operands(dtype, precision, mkn, broadcast):
    """Expanded operands: a column of a broadcast along k (strides (1, 0)) and a row of b broadcast
    along k (strides (0, 1)) have leading stride 0, which the fast kernels' layout rule accepts; every
    slice of k must still be read (the float32 SIMT loop counts its slices by A's pointer)."""
    m, k, n = mkn
    a = make((m, 1), dtype, "cuda").expand(m, k) if broadcast != "b" else make((m, k), dtype, "cuda")
    b = make((1, n), dtype, "cuda").expand(k, n) if broadcast != "a" else make((k, n), dtype, "cuda")
    ref = a.double() @ b.double()
    scale = a.double().abs() @ b.double().abs()
    tol = fast_kernel_tol(dtype, precision)
    with matmul_precision(precision):
        out = ops.mm(a, b)
        c = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
        ops.gemm(c, a, b, -1.5, 0.0)
    assert rel_error(out, ref, scale) <= tol
    assert rel_error(c, -1.5 * ref, 1.5 * scale) <= tol


@requires_cuda
def test_gemm_float32_highest_k4096_within_1e_5():
    a, b = torch.randn(512, 4096, device="cuda"), torch.randn(4096, 512, device="cuda")
    for x, y in [(a, b), (a.t().contiguous().t(), b), (a, b.t().contiguous().t())]:
        ref = x.double() @ y.double()
        got = ops.mm(x, y)
        assert ((got.double() - ref).abs().max() / ref.abs().max()).item() < 1e-5


@pytest.mark.parametrize("device", DEVICES)
def test_gemm_writes_strided_output(device):
    a, b = torch.randn(33, 17, device=device), torch.randn(17, 9, device=device)
    c = torch.full((9, 33), float("nan"), device=device).t()
    ops.gemm(c, a, b, 2.0, 0.0)
    assert rel_error(c, 2.0 * (a.double() @ b.double())) <= 1e-5


@pytest.mark.parametrize("device", DEVICES)
def test_gemm_640_float32_within_1e_5(device):
    a, b = torch.randn(640, 640, device=device), torch.randn(640, 640, device=device)
    c = torch.empty(640, 640, device=device)
    ops.gemm(c, a, b)
    ref = a.double() @ b.double()
    assert ((c.double() - ref).abs().max() / ref.abs().max()).item() < 1e-5


def test_build_info_is_json():
    """build_info names what the library was built from, the CUDA archs its build was configured with
    among them (plus 90a, the wgmma kernel's, where 90 is one)."""
    import json
    import re
    from conftest import LIBRARY
    info = json.loads(ops.build_info())
    assert info["torch_version"].split("+")[0] == torch.__version__.split("+")[0]
    cache = (LIBRARY.parent / "CMakeCache.txt").read_text()
    configured = re.search(r"^CUOPS_CUDA_ARCHITECTURES:STRING=(.*)$", cache, re.M).group(1).split(";")
    assert set(configured) <= set(info["cuda_archs"]), (configured, info["cuda_archs"])
    assert set(info) >= {"cuops_version", "cuda_version", "cxx_compiler", "build_type"}


def test_library_uses_the_shared_libstdcxx():
    """A private static libstdc++ inside libcuops crashes the first message that formats a number
    (torch.ops.load_library opens it RTLD_LOCAL); seen once on a GPU image, kept from coming back. (That
    such messages format is the bad-input matrix's: test_bad_inputs.py's rank cases print shapes.)"""
    import shutil
    import subprocess
    from conftest import LIBRARY
    if shutil.which("readelf") is None:
        pytest.skip("readelf (binutils) not installed")
    dynamic = subprocess.run(["readelf", "-d", str(LIBRARY)], capture_output=True, text=True, check=True).stdout
    assert "libstdc++.so.6" in dynamic
