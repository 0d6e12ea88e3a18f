"""cuops.rms_norm and cuops.add_rms_norm (docs/ops.md#rms_norm): against a float64 reference and Hugging
Face's own code, in every dtype and the mixes Hugging Face makes under autocast, their gradients, errors,
opcheck and torch.compile; on the CPU (the reference) and on CUDA."""
import pytest
import torch

import cuops
from conftest import DEVICES, DTYPES, HALF_TOL, make, ops, poison_allocator, rel_error, requires_cuda

# One rounding of the result against float64 (the reference rounds add_rms_norm's sum as the op does).
TOL = {torch.float32: 1e-6, torch.float64: 1e-13, **HALF_TOL}

# (leading shape, D): rows of every width the kernels take (a 128-wide head's q/k norm, model widths,
# several rows a block, one group of 512 threads, the single-element path of D not a whole 16 bytes),
# one row, 0 rows.
SHAPES = [((4, 7), 128), ((3,), 2048), ((2, 3), 4096), ((5,), 1000 + 3), ((1,), 16384), ((0, 3), 64), ((), 96)]


def hf_rms_norm(x, weight, eps):
    """transformers' LlamaRMSNorm.forward."""
    input_dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(input_dtype)


def reference(s, weight, eps):
    """The norm of s in float64."""
    s64 = s.double()
    return s64 * torch.rsqrt(s64.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_rms_norm_matches_float64(device, dtype, shape):
    lead, d = shape
    x, w = make(lead + (d,), dtype, device), make((d,), dtype, device)
    if device == "cuda":
        poison_allocator()
    y = cuops.rms_norm(x, w, 1e-5)
    assert y.dtype == dtype and y.shape == x.shape and y.is_contiguous()
    if x.numel():
        assert rel_error(y, reference(x, w, 1e-5)) <= TOL[dtype]
    assert torch.equal(cuops.rms_norm(x, w, 1e-5), y)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_add_rms_norm_matches_float64(device, dtype, shape):
    """The sum rounded to x's dtype (as torch's residual + x), and the norm of that sum."""
    lead, d = shape
    x, r, w = make(lead + (d,), dtype, device), make(lead + (d,), dtype, device), make((d,), dtype, device)
    if device == "cuda":
        poison_allocator()
    y, s = cuops.add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(s, x + r)
    if x.numel():
        assert rel_error(y, reference(x + r, w, 1e-6)) <= TOL[dtype]
    again = cuops.add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(again[0], y) and torch.equal(again[1], s)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16], ids=str)
def test_mixed_dtypes_follow_hugging_face(device, half):
    """Hugging Face under autocast: a float32 residual stream beside half sublayer outputs, float32 weights.
    The dtypes returned are HF's; the values within a half type's rounding of HF's (which rounds the
    normalised x to x's dtype before the weight, where cuops rounds once)."""
    d = 2048
    x32, xh = make((6, d), torch.float32, device), make((6, d), half, device)
    w32, wh = make((d,), torch.float32, device), make((d,), half, device)
    for x, w in ((xh, w32), (x32, wh), (x32, w32), (xh, wh)):
        y = cuops.rms_norm(x, w)
        want = hf_rms_norm(x, w, 1e-6)
        assert y.dtype == want.dtype
        assert rel_error(y, reference(x, w, 1e-6)) <= TOL[y.dtype]
    for x, r, w in ((xh, x32, w32), (x32, xh, w32), (xh, x32, wh), (xh, xh, w32)):
        y, s = cuops.add_rms_norm(x, r, w)
        want_s = r + x
        assert s.dtype == want_s.dtype and torch.equal(s, want_s)
        assert y.dtype == hf_rms_norm(want_s, w, 1e-6).dtype
        assert rel_error(y, reference(want_s, w, 1e-6)) <= TOL[y.dtype]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("d", [2048, 1000 + 8, 96], ids=str)
def test_dtype_gives_the_default_result_cast(device, half, d):
    """dtype (the half type the next GEMM reads under autocast): the values are the default result's cast to
    it, bit for bit, for the mixes autocast makes (float32 residual stream and weights beside a half
    sublayer output, float32 rows alone, a half x with a float32 weight); the gradients equal the default
    op's with the gradient arriving in that dtype (as autocast's cast would hand it back), bit for bit too."""
    lead = (3, 5)
    x32, xh, r32 = make(lead + (d,), torch.float32, device), make(lead + (d,), half, device), make(
        lead + (d,), torch.float32, device)
    w32 = make((d,), torch.float32, device)
    for x, w in ((x32, w32), (xh, w32)):
        y = cuops.rms_norm(x, w, 1e-5, dtype=half)
        assert y.dtype == half and torch.equal(y, cuops.rms_norm(x, w, 1e-5).to(half))
    y, s = cuops.add_rms_norm(xh, r32, w32, 1e-5, dtype=half)
    want_y, want_s = cuops.add_rms_norm(xh, r32, w32, 1e-5)
    assert y.dtype == half and torch.equal(y, want_y.to(half)) and torch.equal(s, want_s)
    dy = make(lead + (d,), half, device)
    grads = []
    for dtype in (half, None):
        xg, rg, wg = (t.detach().clone().requires_grad_() for t in (xh, r32, w32))
        y, s = cuops.add_rms_norm(xg, rg, wg, 1e-5, dtype=dtype)
        torch.autograd.backward([y, s], [dy if dtype else dy.float(), torch.ones_like(s)])
        grads.append((xg.grad, rg.grad, wg.grad))
    for got, want in zip(*grads):
        assert got.dtype == want.dtype and torch.equal(got, want)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_rows(device):
    """D = 0: empty results of the right shapes and dtypes, 1 / rms NaN per row (the mean of no squares)
    on every device, and empty gradients."""
    x = make((3, 0), torch.float32, device).requires_grad_()
    r = make((3, 0), torch.float32, device)
    w = make((0,), torch.float32, device).requires_grad_()
    y, s, rstd = ops._rms_norm_fwd(x, r, w, 1e-6, None)
    assert y.shape == s.shape == (3, 0) and rstd.shape == (3,) and torch.isnan(rstd).all()
    y = cuops.rms_norm(x, w)
    assert y.shape == (3, 0) and y.dtype == torch.float32
    y.sum().backward()
    assert x.grad.shape == (3, 0) and w.grad.shape == (0,)
    y, s = cuops.add_rms_norm(x, r, w, dtype=torch.bfloat16)
    assert y.shape == s.shape == (3, 0) and y.dtype == torch.bfloat16


@pytest.mark.parametrize("device", DEVICES)
def test_rows_read_in_place_and_sliced(device):
    """x's rows a leading stride apart (a slice of wider rows) and a transposed x (copied first)."""
    base = make((5, 2 * 1024), torch.bfloat16, device)
    x = base[:, :1024]
    w = make((1024,), torch.bfloat16, device)
    assert rel_error(cuops.rms_norm(x, w), reference(x, w, 1e-6)) <= TOL[torch.bfloat16]
    xt = make((64, 5), torch.float32, device).t()
    wt = make((64,), torch.float32, device)
    assert rel_error(cuops.rms_norm(xt, wt), reference(xt, wt, 1e-6)) <= TOL[torch.float32]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gradients_match_float64(device, dtype):
    """Gradients of x, residual and weight through both outputs of add_rms_norm (the norm's and the sum's
    meet in one pass), and of rms_norm, against float64 autograd of the reference."""
    for lead, d in (((3, 5), 256), ((7,), 1000 + 3), ((2,), 8192)):
        x, r, w = (make(s, dtype, device).requires_grad_() for s in (lead + (d,), lead + (d,), (d,)))
        dy, ds = make(lead + (d,), dtype, device), make(lead + (d,), dtype, device)
        y, s = cuops.add_rms_norm(x, r, w)
        torch.autograd.backward([y, s], [dy, ds])
        x64, r64, w64 = (t.detach().double().requires_grad_() for t in (x, r, w))
        s64 = x64 + r64
        torch.autograd.backward([reference(s64, w64, 1e-6), s64], [dy.double(), ds.double()])
        tol = 20 * TOL[dtype] if dtype in HALF_TOL else 10 * TOL[dtype]
        for got, want in ((x.grad, x64.grad), (r.grad, r64.grad), (w.grad, w64.grad)):
            assert got.dtype == dtype
            assert rel_error(got, want) <= tol, (lead, d)
        xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()
        cuops.rms_norm(xg, wg).backward(dy)
        x64, w64 = (t.detach().double().requires_grad_() for t in (x, w))
        reference(x64, w64, 1e-6).backward(dy.double())
        assert rel_error(xg.grad, x64.grad) <= tol and rel_error(wg.grad, w64.grad) <= tol


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gradients_over_many_blocks(dtype):
    """Rows past the backward's fixed grid (264 blocks of 512 threads: 4 rows a block at a time at D =
    2048, 64 at D = 128, one at 8192), so each block takes several turns of rows and adds them into its
    partial row of the weight's gradient; beside float32, autocast's input norm (float32 rows, a bf16
    y and dy)."""
    out_dtypes = [None] + ([torch.bfloat16] if dtype == torch.float32 else [])
    for rows, d in ((264 * 4 * 2 + 5, 2048), (264 * 64 + 70, 128), (300, 8192)):
        for out in out_dtypes:
            x, w = make((rows, d), dtype, "cuda").requires_grad_(), make((d,), dtype, "cuda").requires_grad_()
            dy = make((rows, d), out or dtype, "cuda")
            cuops.rms_norm(x, w, dtype=out).backward(dy)
            x64, w64 = (t.detach().double().requires_grad_() for t in (x, w))
            reference(x64, w64, 1e-6).backward(dy.double())
            tol = 20 * TOL[dtype] if dtype in HALF_TOL else 10 * TOL[dtype]
            assert rel_error(x.grad, x64.grad) <= tol, (rows, d, out)
            assert rel_error(w.grad, w64.grad) <= tol, (rows, d, out)


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_float64(device):
    x, r, w = (make(s, torch.float64, device).requires_grad_() for s in ((3, 8), (3, 8), (8,)))
    assert torch.autograd.gradcheck(lambda x, w: cuops.rms_norm(x, w, 1e-5), (x, w))
    assert torch.autograd.gradcheck(lambda x, r, w: cuops.add_rms_norm(x, r, w, 1e-5), (x, r, w))


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_dtype_gradients_take_their_inputs_dtypes(device):
    d = 512
    x = make((4, d), torch.bfloat16, device).requires_grad_()
    r = make((4, d), torch.float32, device).requires_grad_()
    w = make((d,), torch.float32, device).requires_grad_()
    y, s = cuops.add_rms_norm(x, r, w)
    (y.sum() + s.sum()).backward()
    assert (x.grad.dtype, r.grad.dtype, w.grad.dtype) == (torch.bfloat16, torch.float32, torch.float32)
    x64, r64, w64 = (t.detach().double().requires_grad_() for t in (x, r, w))
    s64 = x64 + r64
    (reference(s64, w64, 1e-6).sum() + s64.sum()).backward()
    assert rel_error(r.grad, r64.grad) <= 1e-5 and rel_error(w.grad, w64.grad) <= 1e-4
    assert rel_error(x.grad, x64.grad) <= HALF_TOL[torch.bfloat16]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16], ids=str)
def test_narrow_x_gradient_from_the_same_pass(device, half):
    """add_rms_norm of a half x beside a float32 residual (autocast's sublayer output and stream): x's
    gradient comes from the backward's own pass in x's dtype, bit for bit the float32 gradient cast, for
    every output mask, dy in x's dtype or float32, and rows past the backward's grid; through autograd with
    and without the residual's gradient. On CUDA that is two kernels (the pass and the weight's column
    sums), no cast."""
    for rows, d in ((6, 2048), (264 * 4 + 9, 1024), (5, 1000 + 4)):
        x, r, w = make((rows, d), half, device), make((rows, d), torch.float32, device), make((d,), torch.float32,
                                                                                              device)
        _, s, rstd = ops._rms_norm_fwd(x, r, w, 1e-6, None)
        dsum = make((rows, d), torch.float32, device)
        for dy_dtype in (half, torch.float32):
            dy = make((rows, d), dy_dtype, device)
            ds, dw, none = ops._rms_norm_bwd(dy, s, w, rstd, dsum, [True, True])
            assert none.numel() == 0
            for mask in ([True, True], [False, True], [True, False], [False, False]):
                if device == "cuda":
                    poison_allocator()
                got_ds, got_dw, dx = ops._rms_norm_bwd(dy, s, w, rstd, dsum, mask, x_dtype=half)
                assert dx.dtype == half and dx.shape == s.shape
                assert torch.equal(dx, ds.to(half)), (rows, d, dy_dtype, mask)
                assert torch.equal(got_ds, ds) if mask[0] else got_ds.numel() == 0
                assert torch.equal(got_dw, dw) if mask[1] else got_dw.numel() == 0
    x = make((40, 2048), half, device).requires_grad_()
    w = make((2048,), torch.float32, device).requires_grad_()
    dy = make((40, 2048), half, device)
    for res_grad in (True, False):
        r = make((40, 2048), torch.float32, device).requires_grad_(res_grad)
        x.grad = w.grad = None
        y, s = cuops.add_rms_norm(x, r, w, dtype=half)  # the norm handing the next GEMM x's type
        y.backward(dy)
        xs, rs, ws = (t.detach() for t in (x, r, w))
        _, s_ref, rstd = ops._rms_norm_fwd(xs, rs, ws, 1e-6, half)
        ds, dw, _ = ops._rms_norm_bwd(dy, s_ref, ws, rstd, None, [True, True])
        assert x.grad.dtype == half and torch.equal(x.grad, ds.to(half))
        assert torch.equal(w.grad, dw)
        if res_grad:
            assert torch.equal(r.grad, ds)
        if device == "cuda":
            from conftest import cuda_kernels
            names = cuda_kernels(lambda: torch.autograd.grad(cuops.add_rms_norm(x, r, w, dtype=half)[0], [x, w], dy))
            bwd = [n for n in names if "rms_norm_fwd" not in n]
            assert len(bwd) == 2 and all("rms_norm" in n for n in bwd), names


@pytest.mark.parametrize("device", DEVICES)
def test_errors_name_the_argument(device):
    x, w = make((4, 8), torch.float32, device), make((8,), torch.float32, device)
    with pytest.raises(RuntimeError, match=r"cuops::rms_norm: expected weight \[D\] to match x's last"):
        cuops.rms_norm(x, make((7,), torch.float32, device))
    with pytest.raises(RuntimeError, match=r"cuops::rms_norm: expected weight to be 1-D"):
        cuops.rms_norm(x, make((2, 4), torch.float32, device))
    with pytest.raises(RuntimeError, match=r"cuops::add_rms_norm: expected residual .*shape"):
        cuops.add_rms_norm(x, make((4, 7), torch.float32, device), w)
    with pytest.raises(RuntimeError, match=r"cuops::rms_norm: expected eps >= 0, got -1"):
        cuops.rms_norm(x, w, -1.0)
    with pytest.raises(RuntimeError, match=r"cuops::rms_norm: expected x to be at least 1-D"):
        cuops.rms_norm(torch.ones((), device=device), w)
    with pytest.raises(RuntimeError, match=r"cuops::rms_norm: expected weight to have dtype"):
        cuops.rms_norm(x, w.int())
    with pytest.raises(RuntimeError, match=r"cuops::add_rms_norm: expected dtype float32, .* got int"):
        cuops.add_rms_norm(x, x, w, dtype=torch.int32)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    x, r, w = make((6, 16), torch.float32, device), make((6, 16), torch.float32, device), make((16,), torch.float32,
                                                                                               device)
    torch.library.opcheck(ops.rms_norm, (x.clone().requires_grad_(), w.clone().requires_grad_(), 1e-6))
    torch.library.opcheck(ops.add_rms_norm, (x.clone().requires_grad_(), r.clone().requires_grad_(),
                                             w.clone().requires_grad_(), 1e-6))
    torch.library.opcheck(ops._rms_norm_fwd, (x, r, w, 1e-6, None))
    torch.library.opcheck(ops._rms_norm_fwd, (x, None, w, 1e-6, None))
    torch.library.opcheck(ops._rms_norm_fwd, (x, r, w, 1e-6, torch.bfloat16))
    torch.library.opcheck(ops.rms_norm, (x.clone().requires_grad_(), w.clone().requires_grad_(), 1e-6),
                          {"dtype": torch.float16})
    _, s, rstd = ops._rms_norm_fwd(x, r, w, 1e-6, None)
    torch.library.opcheck(ops._rms_norm_bwd, (make((6, 16), torch.float32, device), s, w, rstd, None, [True, True]))
    torch.library.opcheck(ops._rms_norm_bwd, (make((6, 16), torch.float32, device), s, w, rstd, r, [True, False]))
    for mask in ([True, True], [False, False]):
        torch.library.opcheck(ops._rms_norm_bwd, (make((6, 16), torch.bfloat16, device), s, w, rstd, r, mask),
                              {"x_dtype": torch.bfloat16})


@pytest.mark.parametrize("device", DEVICES)
def test_compiles_without_graph_breaks(device):
    x = make((2, 8, 64), torch.float32, device).requires_grad_()
    r = make((2, 8, 64), torch.float32, device).requires_grad_()
    w = make((64,), torch.float32, device).requires_grad_()

    def f(x, r, w):
        y, s = cuops.add_rms_norm(x, r, w)
        return (cuops.rms_norm(y, w) * s).sum()

    backends = ["aot_eager"] + (["inductor"] if device == "cuda" else [])
    for backend in backends:
        torch._dynamo.reset()
        torch.compile(f, fullgraph=True, backend=backend)(x, r, w).backward()
        grads = [t.grad.clone() for t in (x, r, w)]
        for t in (x, r, w):
            t.grad = None
        f(x, r, w).backward()
        for got, t in zip(grads, (x, r, w)):
            torch.testing.assert_close(got, t.grad, rtol=1e-5, atol=1e-5)
            t.grad = None


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_cuda_bitwise_repeatable_and_one_pass(dtype):
    """The same bits on every run, the weight's gradient included (its column sums in a fixed order), from
    one forward kernel and the backward's two (the pass and the column sums)."""
    from conftest import cuda_kernels
    x = make((3000, 2048), dtype, "cuda").requires_grad_()
    r = make((3000, 2048), dtype, "cuda")
    w = make((2048,), dtype, "cuda").requires_grad_()
    dy = make((3000, 2048), dtype, "cuda")
    outs = []
    for _ in range(2):
        x.grad = w.grad = None
        y, s = cuops.add_rms_norm(x, r, w)
        y.backward(dy)
        outs.append((y, s, x.grad, w.grad))
    for a, b in zip(*outs):
        assert torch.equal(a, b)
    with torch.no_grad():
        names = cuda_kernels(lambda: cuops.add_rms_norm(x, r, w))
    assert len(names) == 1 and "rms_norm_fwd" in names[0], names


@requires_cuda
def test_rows_longer_than_the_kernels_take_the_reference():
    """Beyond 512 threads x 4 vectors of 8 bf16 forward (20000), beyond 512 x 2 backward only (12000)."""
    for d in (20000, 12000):
        x = make((2, d), torch.bfloat16, "cuda").requires_grad_()
        w = make((d,), torch.bfloat16, "cuda").requires_grad_()
        dy = make((2, d), torch.bfloat16, "cuda")
        y = cuops.rms_norm(x, w)
        assert rel_error(y, reference(x, w, 1e-6)) <= TOL[torch.bfloat16]
        y.backward(dy)
        x64, w64 = (t.detach().double().requires_grad_() for t in (x, w))
        reference(x64, w64, 1e-6).backward(dy.double())
        assert rel_error(x.grad, x64.grad) <= 20 * TOL[torch.bfloat16]
        assert rel_error(w.grad, w64.grad) <= 20 * TOL[torch.bfloat16]
