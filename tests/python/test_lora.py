"""cuops.lora_linear and cuops.lora_swiglu (docs/ops.md#lora_linear, #lora_swiglu): a Linear (and swiglu's
two projections) with a LoRA adapter in the same GEMM, against a float64 reference -- forward, every
gradient, lora_x apart (PEFT's dropout), a frozen base costing no product, 0-size and odd shapes,
non-contiguous inputs, errors, opcheck, gradcheck, torch.compile, autocast, bitwise repeats; CPU and CUDA."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import cuops
from conftest import DEVICES, DTYPES, HALF_TOL, REDUCTION_TOL, make, ops, rel_error, requires_cuda

ACTS = {"none": lambda z: z, "relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
        "silu": F.silu}


def linear_reference(x, w, a, b, bias=None, act="none", lx=None):
    """float64: the output and the scale of its rounding error (|x| |W| + |u| |B| + |bias|, u rounded once)."""
    x64, w64, a64, b64 = (t.double() for t in (x, w, a, b))
    lx64 = x64 if lx is None else lx.double()
    u = lx64 @ a64.t()
    z = x64 @ w64.t() + u @ b64.t() + (0 if bias is None else bias.double())
    scale = x64.abs() @ w64.abs().t() + (lx64.abs() @ a64.abs().t()) @ b64.abs().t() + (
        0 if bias is None else bias.double().abs())
    return ACTS[act](z), scale + ACTS[act](z).abs()


def swiglu_reference(x, wg, wu, a, bg, bu, lx=None, act="silu"):
    x64 = x.double()
    u = (x64 if lx is None else lx.double()) @ a.double().t()
    g = x64 @ wg.double().t() + u @ bg.double().t()
    up = x64 @ wu.double().t() + u @ bu.double().t()
    ag = ACTS[act](g)
    y = ag * up
    absu = (x64.abs() if lx is None else lx.double().abs()) @ a.double().abs().t()
    scale = (1.13 * up.abs() * (x64.abs() @ wg.double().abs().t() + absu @ bg.double().abs().t())
             + ag.abs() * (x64.abs() @ wu.double().abs().t() + absu @ bu.double().abs().t()) + y.abs())
    return y, scale


def tolerance(dtype, device):
    base = HALF_TOL.get(dtype, REDUCTION_TOL[dtype])
    return 3 * base if device == "cuda" else 2 * base  # u rounded to x's dtype, then the product


def adapter(n, k, r, dtype, device, layout="contiguous"):
    return make((n, k), dtype, device, layout), make((r, k), dtype, device), make((n, r), dtype, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_lora_linear_matches_float64(device, dtype):
    """Leading dims, odd K, N and R, x every other row of a wider tensor; each activation, with and
    without a bias and a separate lora_x."""
    x = make((2, 6, 37), dtype, device, "sliced")[:, ::2]
    w, a, b = adapter(29, 37, 5, dtype, device)
    bias, lx = make((29,), dtype, device), make((2, 3, 37), dtype, device)
    for act in ACTS:
        for kw in ({}, {"bias": bias}, {"lora_x": lx}):
            y = cuops.lora_linear(x, w, a, b, activation=act, **kw)
            assert y.shape == (2, 3, 29) and y.dtype == dtype and y.device.type == device
            want, scale = linear_reference(x, w, a, b, kw.get("bias"), act, kw.get("lora_x"))
            assert rel_error(y, want, scale) <= tolerance(dtype, device), (act, list(kw))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_lora_swiglu_matches_float64(device, dtype):
    x = make((2, 6, 37), dtype, device, "sliced")[:, ::2]
    wg, a, bg = adapter(29, 37, 6, dtype, device)
    wu, bu = make((29, 37), dtype, device, "transposed"), make((29, 6), dtype, device)
    lx = make((2, 3, 37), dtype, device)
    for kw in ({}, {"lora_x": lx}, {"activation": "gelu_tanh"}, {"lora_x": lx, "activation": "gelu_tanh"}):
        y = cuops.lora_swiglu(x, wg, wu, a, bg, bu, **kw)
        assert y.shape == (2, 3, 29) and y.dtype == dtype
        want, scale = swiglu_reference(x, wg, wu, a, bg, bu, kw.get("lora_x"), kw.get("activation", "silu"))
        assert rel_error(y, want, scale) <= 1.5 * tolerance(dtype, device), list(kw)


def leaves_of(*ts):
    return [t.detach().clone().requires_grad_() for t in ts]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_lora_gradients_match_float64(device, dtype):
    """Every tensor's gradient, lora_x apart or not, against the float64 reference's autograd."""
    x = make((2, 24, 48), dtype, device)
    w, a, b = adapter(40, 48, 8, dtype, device)
    wu, bu = make((40, 48), dtype, device), make((40, 8), dtype, device)
    bias, lx, dy = make((40,), dtype, device), make((2, 24, 48), dtype, device), make((2, 24, 40), dtype, device)
    tol = 4 * HALF_TOL.get(dtype, REDUCTION_TOL[dtype])
    cases = [
        (lambda x, w, a, b, bias: cuops.lora_linear(x, w, a, b, bias, "gelu_tanh"),
         lambda x, w, a, b, bias: linear_reference(x, w, a, b, bias, "gelu_tanh")[0], (x, w, a, b, bias)),
        (lambda x, w, a, b, lx: cuops.lora_linear(x, w, a, b, lora_x=lx),
         lambda x, w, a, b, lx: linear_reference(x, w, a, b, lx=lx)[0], (x, w, a, b, lx)),
        (lambda x, w, wu, a, b, bu: cuops.lora_swiglu(x, w, wu, a, b, bu),
         lambda x, w, wu, a, b, bu: swiglu_reference(x, w, wu, a, b, bu)[0], (x, w, wu, a, b, bu)),
        (lambda x, w, wu, a, b, bu, lx: cuops.lora_swiglu(x, w, wu, a, b, bu, lx),
         lambda x, w, wu, a, b, bu, lx: swiglu_reference(x, w, wu, a, b, bu, lx)[0], (x, w, wu, a, b, bu, lx)),
        (lambda x, w, wu, a, b, bu, lx: cuops.lora_swiglu(x, w, wu, a, b, bu, lx, "gelu_tanh"),
         lambda x, w, wu, a, b, bu, lx: swiglu_reference(x, w, wu, a, b, bu, lx, "gelu_tanh")[0],
         (x, w, wu, a, b, bu, lx)),
    ]
    for i, (fn, ref, args) in enumerate(cases):
        leaves, leaves64 = leaves_of(*args), [t.detach().double().requires_grad_() for t in args]
        fn(*leaves).backward(dy)
        ref(*leaves64).backward(dy.double())
        for j, (got, want) in enumerate(zip(leaves, leaves64)):
            assert got.grad.dtype == dtype and got.grad.shape == want.grad.shape
            assert rel_error(got.grad, want.grad.to(got.device)) <= tol, (i, j)


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("device", DEVICES)
def test_two_adapters_with_their_own_dropped_inputs(device):
    """Adapters whose inputs differ (PEFT draws each adapter's dropout apart): lora_x holds them side by
    side [..., 2K] and lora_a is block-diagonal over them; every gradient as the float64 reference's."""
    dtype = torch.float64
    x, dy = make((3, 5, 12), dtype, device), make((3, 5, 10), dtype, device)
    wg, ag, bg = adapter(10, 12, 3, dtype, device)
    wu, au, bu = adapter(10, 12, 2, dtype, device)
    xg, xu = make((3, 5, 12), dtype, device), make((3, 5, 12), dtype, device)  # the two dropped inputs
    z3, z2 = torch.zeros(10, 3, dtype=dtype, device=device), torch.zeros(10, 2, dtype=dtype, device=device)
    leaves = leaves_of(x, xg, xu, ag, au, bg, bu)

    def fused(x, xg, xu, ag, au, bg, bu):
        return cuops.lora_swiglu(x, wg, wu, torch.block_diag(ag, au), torch.cat([bg, z2], 1),
                                 torch.cat([z3, bu], 1), torch.cat([xg, xu], -1))

    def unfused(x, xg, xu, ag, au, bg, bu):
        return F.silu(x @ wg.t() + (xg @ ag.t()) @ bg.t()) * (x @ wu.t() + (xu @ au.t()) @ bu.t())

    fused(*leaves).backward(dy)
    want = leaves_of(x, xg, xu, ag, au, bg, bu)
    unfused(*want).backward(dy)
    for i, (got, ref) in enumerate(zip(leaves, want)):
        torch.testing.assert_close(got.grad, ref.grad, rtol=1e-10, atol=1e-10, msg=str(i))
    torch.testing.assert_close(fused(*leaves), unfused(*want), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("device", DEVICES)
def test_a_frozen_base_costs_no_product(device):
    """PEFT's base weight needs no gradient: the backward runs no product for it -- four products with
    the adapter's (v, dx, the adapter's term of dx, dA, dB: five) where a trainable weight adds its
    sixth -- and gives it no gradient; x not needing one drops dx's two."""
    x = make((16, 24), torch.float32, device)
    w, a, b = adapter(20, 24, 4, torch.float32, device)

    def products(x_grad, w_grad):
        leaves = [x.clone().requires_grad_(x_grad), w.clone().requires_grad_(w_grad)] + leaves_of(a, b)
        y = cuops.lora_linear(*leaves)
        with OpCounter() as seen:
            y.sum().backward()
        assert (leaves[1].grad is not None) == w_grad
        return sum(n.startswith(("mm", "gemm")) for n in seen.names)

    assert products(True, False) == 5 and products(True, True) == 6 and products(False, False) == 3


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(0, 8, 5, 3), (4, 8, 5, 0), (4, 0, 5, 3), (4, 8, 0, 3)],
                         ids=["rows0", "r0", "k0", "n0"])
def test_lora_empty_sizes(device, shape):
    rows, k, n, r = shape
    x = make((rows, k), torch.float32, device).requires_grad_()
    w, a, b = (t.requires_grad_() for t in adapter(n, k, r, torch.float32, device))
    y = cuops.lora_linear(x, w, a, b, activation="silu")
    want, _ = linear_reference(x, w, a, b, act="silu")
    assert y.shape == (rows, n) and torch.allclose(y.double(), want, atol=1e-5)
    y.sum().backward()
    assert x.grad.shape == x.shape and a.grad.shape == a.shape and b.grad.shape == b.shape
    z = cuops.lora_swiglu(x, w, w, a, b, b)
    assert z.shape == (rows, n)


@pytest.mark.parametrize("device", DEVICES)
def test_lora_bad_inputs_name_the_argument(device):
    f32 = torch.float32
    x = make((4, 6), f32, device)
    w, a, b = adapter(5, 6, 2, f32, device)
    cases = [
        ((x, w, a[:, :5], b), r"cuops::lora_linear: expected lora_a \[R, K\] to share K with x's last dimension, "
                              r"got x \[4, 6\] and lora_a \[2, 5\]"),
        ((x, w, a, b[:, :1]), r"cuops::lora_linear: expected lora_b \[N, R\] \(weight's rows by lora_a's rows\) of "
                              r"shape \[5, 2\], got \[5, 1\]"),
        ((x, w, a.double(), b), r"cuops::lora_linear: expected lora_a to have the dtype of x \(float32\), got float64"),
        ((x, w[:, :4], a, b), r"cuops::lora_linear: expected weight \[N, K\] to share K"),
    ]
    for args, msg in cases:
        with pytest.raises(RuntimeError, match=msg):
            cuops.lora_linear(*args)
    with pytest.raises(RuntimeError, match=r"cuops::lora_linear: expected lora_x \[..., K'\] to have x's leading "
                                           r"dimensions, got x \[4, 6\] and lora_x \[3, 6\]"):
        cuops.lora_linear(x, w, a, b, lora_x=x[:3])
    with pytest.raises(RuntimeError, match=r"cuops::lora_linear: expected lora_a \[R, K'\] to share K' with "
                                           r"lora_x's last dimension, got lora_x \[4, 12\] and lora_a \[2, 6\]"):
        cuops.lora_linear(x, w, a, b, lora_x=torch.cat([x, x], 1))
    with pytest.raises(RuntimeError, match=r"cuops::lora_linear: expected bias \[N\] of 5 elements, got \[4\]"):
        cuops.lora_linear(x, w, a, b, make((4,), f32, device))
    with pytest.raises(RuntimeError, match=r"cuops::lora_linear: expected activation to be one of"):
        cuops.lora_linear(x, w, a, b, activation="tanh")
    with pytest.raises(RuntimeError, match=r"cuops::lora_swiglu: expected w_up to have the shape of w_gate "
                                           r"\[5, 6\], got \[4, 6\]"):
        cuops.lora_swiglu(x, w, w[:4], a, b, b[:4])
    with pytest.raises(RuntimeError, match=r"cuops::lora_swiglu: expected lora_b_up \[N, R\] \(w_up's rows by "
                                           r"lora_a's rows\) of shape \[5, 2\], got \[5, 3\]"):
        cuops.lora_swiglu(x, w, w, a, b, make((5, 3), f32, device))
    if device == "cuda":
        with pytest.raises(RuntimeError, match=r"cuops::lora_linear: expected lora_b on the device of x"):
            cuops.lora_linear(x, w, a, b.cpu())


@pytest.mark.parametrize("device", DEVICES)
def test_lora_opcheck_and_gradcheck(device):
    x64 = make((2, 3, 8), torch.float64, device)
    w, a, b = adapter(5, 8, 3, torch.float64, device)
    wu, bu, bias, lx = make((5, 8), torch.float64, device), make((5, 3), torch.float64, device), \
        make((5,), torch.float64, device), make((2, 3, 8), torch.float64, device)
    for args in ((x64, w, a, b, bias, "gelu", None), (x64, w, a, b, None, "none", lx)):
        torch.library.opcheck(ops.lora_linear, tuple(t.requires_grad_() if torch.is_tensor(t) else t for t in args))
        torch.library.opcheck(ops._lora_linear_fwd, tuple(t.detach() if torch.is_tensor(t) else t for t in args))
    torch.library.opcheck(ops.lora_swiglu, tuple(t.requires_grad_() for t in (x64, w, wu, a, b, bu, lx)))
    torch.library.opcheck(ops._lora_swiglu_fwd, tuple(t.detach() for t in (x64, w, wu, a, b, bu)) + (None,))
    torch.library.opcheck(ops.lora_swiglu, tuple(t.detach().requires_grad_() for t in (x64, w, wu, a, b, bu, lx))
                          + ("gelu_tanh",))
    args = leaves_of(x64, w, a, b, bias, lx)
    assert torch.autograd.gradcheck(lambda x, w, a, b, bias, lx: cuops.lora_linear(x, w, a, b, bias, "silu", lx), args)
    args = leaves_of(x64, w, wu, a, b, bu)
    assert torch.autograd.gradcheck(lambda *t: cuops.lora_swiglu(*t), args)
    assert torch.autograd.gradcheck(lambda *t: cuops.lora_swiglu(*t, activation="gelu_tanh"), args)


@pytest.mark.parametrize("device", DEVICES)
def test_lora_compiles_without_graph_breaks(device):
    x = make((2, 8, 16), torch.float32, device).requires_grad_()
    w, a, b = adapter(12, 16, 4, torch.float32, device)
    wu, bu = make((12, 16), torch.float32, device), make((12, 4), torch.float32, device)
    leaves = [x] + leaves_of(a, b, bu)

    def f(x, a, b, bu):
        return (cuops.lora_swiglu(x, w, wu, a, b, bu) + cuops.lora_linear(x, w, a, b, None, "silu")).sum()

    for backend in ["aot_eager"] + (["inductor"] if device == "cuda" else []):
        torch._dynamo.reset()
        torch.compile(f, fullgraph=True, backend=backend)(*leaves).backward()
        grads = [t.grad.clone() for t in leaves]
        for t in leaves:
            t.grad = None
        f(*leaves).backward()
        for got, t in zip(grads, leaves):
            torch.testing.assert_close(got, t.grad, rtol=1e-5, atol=1e-5)
            t.grad = None
    torch._dynamo.reset()


@requires_cuda
def test_lora_autocast_casts_like_f_linear():
    """float32 master weights and adapters under bf16 autocast: bf16 out, as PEFT's F.linear calls give
    within their own rounding; float32 gradients for the adapter."""
    x = make((64, 32), torch.float32, "cuda")
    w, a, b = adapter(48, 32, 8, torch.float32, "cuda")
    a.requires_grad_(), b.requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = cuops.lora_linear(x, w, a, b)
        want = F.linear(x, w) + F.linear(F.linear(x, a), b)
    assert y.dtype == want.dtype == torch.bfloat16
    assert rel_error(y, want) <= 6 * HALF_TOL[torch.bfloat16]
    y.float().sum().backward()
    assert a.grad.dtype == torch.float32 and b.grad.dtype == torch.float32


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_lora_bitwise_repeatable(dtype):
    x = make((256, 512), dtype, "cuda")
    w, a, b = adapter(384, 512, 16, dtype, "cuda")
    wu, bu = make((384, 512), dtype, "cuda"), make((384, 16), dtype, "cuda")
    dy = make((256, 384), dtype, "cuda")
    runs = []
    for _ in range(2):
        leaves = leaves_of(x, a, b, bu)
        y = cuops.lora_swiglu(leaves[0], w, wu, leaves[1], leaves[2], leaves[3])
        z = cuops.lora_linear(leaves[0], w, leaves[1], leaves[2], None, "gelu")
        (y + z).backward(dy)
        runs.append([y, z] + [t.grad for t in leaves])
    assert all(torch.equal(p, q) for p, q in zip(*runs))


def test_lora_meta_shapes_and_checks():
    """The Meta forward (the same composite on meta tensors): shapes and dtypes, and the checks'
    messages before any data exists (torch.compile's fake tensors go through it)."""
    m = lambda *shape, dtype=torch.bfloat16: torch.empty(*shape, device="meta", dtype=dtype)  # noqa: E731
    x, w, a, b = m(2, 9, 16), m(12, 16), m(4, 16), m(12, 4)
    y = ops.lora_linear(x, w, a, b, None, "gelu")
    assert y.shape == (2, 9, 12) and y.dtype == torch.bfloat16 and y.device.type == "meta"
    out, pre, u = ops._lora_linear_fwd(x, w, m(4, 32), b, m(12), "silu", m(2, 9, 32))
    assert (out.shape, pre.shape, u.shape) == ((2, 9, 12), (2, 9, 12), (2, 9, 4))
    assert ops._lora_linear_fwd(x, w, a, b, None, "none", None)[1].shape == (0,)
    outs = ops._lora_swiglu_fwd(x, w, w, a, b, b, None)
    assert [t.shape for t in outs] == [(2, 9, 12)] * 3 + [(2, 9, 4)]
    with pytest.raises(RuntimeError, match=r"cuops::lora_swiglu: expected lora_b_gate \[N, R\]"):
        ops.lora_swiglu(x, w, w, a, m(12, 3), b)
    with pytest.raises(RuntimeError, match=r"cuops::lora_linear: expected lora_b to have the dtype of x"):
        ops.lora_linear(x, w, a, m(12, 4, dtype=torch.float32))
