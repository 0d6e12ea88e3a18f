"""cuops.swiglu (docs/ops.md#swiglu): act(x @ w_gate.T) * (x @ w_up.T), act silu or gelu_tanh, against a
float64 reference, its gradients, errors, autocast, opcheck and torch.compile; on the CPU (the reference)
and on CUDA."""
import pytest
import torch
import torch.nn.functional as F

import cuops
from conftest import (DEVICES, DTYPES, HALF_TOL, REDUCTION_TOL, cuda_kernels, make, ops, poison_allocator,
                      rel_error, requires_cuda, requires_hopper)


ACTS = ["silu", "gelu_tanh"]


def gate(g, act):
    """torch's act: F.silu, or F.gelu's tanh form (HF's gelu_pytorch_tanh)."""
    return F.silu(g) if act == "silu" else F.gelu(g, approximate="tanh")


def reference(x, w_gate, w_up, act="silu"):
    """The float64 result and the scale of its rounding error: an error in g (at most its product's bound
    times |x| @ |w_gate|^T) reaches y times act'(g) u, at most ~1.13 |u| (silu's 1.10, gelu_tanh's 1.13);
    one in u times act(g); a rounding of act(g) or of y, |y| times the unit."""
    x64, wg64, wu64 = x.double(), w_gate.double(), w_up.double()
    g, u = x64 @ wg64.t(), x64 @ wu64.t()
    a = gate(g, act)
    y = a * u
    scale = 1.13 * u.abs() * (x64.abs() @ wg64.abs().t()) + a.abs() * (x64.abs() @ wu64.abs().t()) + y.abs()
    return y, scale


def tolerance(dtype, device):
    """The products' bound (tests/tolerances.txt, the half types' rounding) against that scale, with
    room for the extra roundings where CUDA rounds g and u to x's dtype, then silu(g), then the product."""
    base = HALF_TOL.get(dtype, REDUCTION_TOL[dtype])
    return 2.5 * base if device == "cuda" else 1.5 * base


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("act", ACTS)
def test_swiglu_matches_float64(device, dtype, act):
    # Leading dims, odd K and I, and x as every other row of a wider tensor (not contiguous).
    x = make((2, 6, 37), dtype, device, "sliced")[:, ::2]
    w_gate, w_up = make((29, 37), dtype, device), make((29, 37), dtype, device)
    y = cuops.swiglu(x, w_gate, w_up, act)
    assert y.shape == (2, 3, 29) and y.dtype == dtype and y.device.type == device and y.is_contiguous()
    want, scale = reference(x, w_gate, w_up, act)
    assert rel_error(y, want.to(y.device), scale.to(y.device)) <= tolerance(dtype, device)


# Products the dual GEMM takes (rows > 16; K and I whole 16 bytes), with partial tiles of outputs
# (a tile holds 64 or 128 of each weight's), from one tile to several waves: (rows, I, K).
FUSED_SHAPES = [(17, 64, 64), (300, 200, 264), (1000, 1160, 136), (2048, 2816, 512)]


@requires_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", FUSED_SHAPES, ids=str)
@pytest.mark.parametrize("act", ACTS)
def test_swiglu_dual_gemm(dtype, shape, act):
    """One kernel (both products over one pass of x, act(g) * u in the epilogue) into NaN-poisoned outputs,
    against float64; with g and u kept (_swiglu_fwd) the same output, g and u; the same bits again."""
    rows, inter, k = shape
    x, w_gate, w_up = make((rows, k), dtype, "cuda"), make((inter, k), dtype, "cuda"), make((inter, k), dtype, "cuda")
    poison_allocator()
    out = []
    names = cuda_kernels(lambda: out.append(cuops.swiglu(x, w_gate, w_up, act)))
    assert len(names) == 1 and "gemm_wgmma_fused" in names[0], names
    want, scale = reference(x, w_gate, w_up, act)
    assert rel_error(out[0], want, scale) <= tolerance(dtype, "cuda")
    poison_allocator()
    y, g, u = ops._swiglu_fwd(x, w_gate, w_up, act)
    assert torch.equal(y, out[0])
    x64 = x.double()
    for got, w in ((g, w_gate), (u, w_up)):
        assert rel_error(got, x64 @ w.double().t(), x64.abs() @ w.double().abs().t()) <= HALF_TOL[dtype]
    assert torch.equal(cuops.swiglu(x, w_gate, w_up, act), out[0])


# Decode sizes (rows <= 16): the small-M kernel's streaming form with 32 outputs of each weight a CTA,
# partial groups of them, k split over a cluster (few outputs), x's rows padded: (rows, I, K, layout).
SMALL_M_SHAPES = [(1, 5632, 2048, "contiguous"), (3, 1000, 264, "padded"), (8, 200, 4096, "contiguous"),
                  (16, 1160, 136, "contiguous")]


@requires_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", SMALL_M_SHAPES, ids=str)
@pytest.mark.parametrize("act", ACTS)
def test_swiglu_small_m_one_launch(dtype, shape, act):
    """At decode sizes one launch (both weights streamed, act(g) * u in the stores) into NaN-poisoned
    outputs, against float64; with g and u kept the same output, g and u, one launch too; the same bits
    again."""
    rows, inter, k, layout = shape
    x = make((rows, k), dtype, "cuda", layout)
    w_gate, w_up = make((inter, k), dtype, "cuda"), make((inter, k), dtype, "cuda")
    poison_allocator()
    out = []
    names = cuda_kernels(lambda: out.append(cuops.swiglu(x, w_gate, w_up, act)))
    assert len(names) == 1 and "gemm_skinny_tma" in names[0], names
    want, scale = reference(x, w_gate, w_up, act)
    assert rel_error(out[0], want, scale) <= tolerance(dtype, "cuda")
    poison_allocator()
    names = cuda_kernels(lambda: out.append(ops._swiglu_fwd(x, w_gate, w_up, act)))
    assert len(names) == 1 and "gemm_skinny_tma" in names[0], names
    y, g, u = out[1]
    assert torch.equal(y, out[0])
    x64 = x.double()
    for got, w in ((g, w_gate), (u, w_up)):
        assert rel_error(got, x64 @ w.double().t(), x64.abs() @ w.double().abs().t()) <= HALF_TOL[dtype]
    assert torch.equal(cuops.swiglu(x, w_gate, w_up, act), out[0])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("act", ACTS)
def test_swiglu_gate_backward(device, dtype, act):
    """_swiglu_bwd: (dy * u * act'(g), dy * act(g)) against float64 autograd of torch's act, over rows
    read with a leading stride (sliced) and rows not a whole 16 bytes (the per-element path); the same
    bits again."""
    for rows, inter, layout in ((70, 136, "contiguous"), (33, 29, "contiguous"), (40, 64, "sliced")):
        dy, g, u = (make((rows, inter), dtype, device, layout) for _ in range(3))
        dg, du = ops._swiglu_bwd(dy, g, u, act)
        assert dg.is_contiguous() and du.is_contiguous() and dg.dtype == dtype
        d64, u64 = dy.double(), u.double()
        g64 = g.double().requires_grad_()
        a = gate(g64, act)
        (a * u64).backward(d64)
        want_dg, want_du = g64.grad, d64 * a.detach()
        tol = 4 * HALF_TOL.get(dtype, REDUCTION_TOL[dtype])
        assert rel_error(dg, want_dg) <= tol and rel_error(du, want_du) <= tol
        again = ops._swiglu_bwd(dy, g, u, act)
        assert torch.equal(again[0], dg) and torch.equal(again[1], du)
    empty = ops._swiglu_bwd(*(make((0, 5), torch.float32, device) for _ in range(3)))
    assert all(t.shape == (0, 5) for t in empty)
    with pytest.raises(RuntimeError, match=r"cuops::_swiglu_bwd: expected .*u"):
        ops._swiglu_bwd(make((4, 5), torch.float32, device), make((4, 5), torch.float32, device),
                        make((4, 6), torch.float32, device))


@pytest.mark.parametrize("device", DEVICES)
def test_swiglu_of_a_1d_x_and_of_transposed_weights(device):
    x = make((37,), torch.float32, device)
    w_gate, w_up = make((37, 29), torch.float32, device).t(), make((37, 29), torch.float32, device).t()
    y = cuops.swiglu(x, w_gate, w_up)
    assert y.shape == (29,)
    want, scale = reference(x, w_gate, w_up)
    assert rel_error(y, want.to(y.device), scale.to(y.device)) <= tolerance(torch.float32, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(0, 8, 5), (4, 0, 5), (4, 8, 0)], ids=["rows0", "k0", "i0"])
def test_swiglu_empty_sizes(device, shape):
    rows, k, i = shape
    x, w_gate, w_up = (make(s, torch.float32, device) for s in ((rows, k), (i, k), (i, k)))
    y = cuops.swiglu(x, w_gate, w_up)
    assert y.shape == (rows, i)
    assert torch.allclose(y, F.silu(x @ w_gate.t()) * (x @ w_up.t()), atol=1e-6)
    xs, gs, us = (t.clone().requires_grad_() for t in (x, w_gate, w_up))
    cuops.swiglu(xs, gs, us).sum().backward()
    assert xs.grad.shape == x.shape and gs.grad.shape == us.grad.shape == (i, k)
    assert all(t.grad.abs().sum() == 0 for t in (xs, gs, us))  # every product is over nothing, or empty


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("x_shape", [(3, 2, 7), (7,)], ids=["3d", "1d"])
@pytest.mark.parametrize("act", ACTS)
def test_swiglu_gradcheck_float64(device, x_shape, act):
    x = make(x_shape, torch.float64, device).requires_grad_()
    w_gate = make((5, 7), torch.float64, device).requires_grad_()
    w_up = make((5, 7), torch.float64, device).requires_grad_()
    assert torch.autograd.gradcheck(lambda *t: cuops.swiglu(*t, act), (x, w_gate, w_up))
    assert torch.autograd.gradcheck(lambda w: cuops.swiglu(x.detach(), w, w_up.detach(), act), (w_gate,))
    assert torch.autograd.gradcheck(lambda x: cuops.swiglu(x, w_gate.detach(), w_up.detach(), act), (x,))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("act", ACTS)
def test_swiglu_gradients_match_float64(device, dtype, act):
    x = make((2, 32, 48), dtype, device).requires_grad_()
    w_gate = make((40, 48), dtype, device).requires_grad_()
    w_up = make((40, 48), dtype, device).requires_grad_()
    dy = make((2, 32, 40), dtype, device)
    cuops.swiglu(x, w_gate, w_up, act).backward(dy)
    x64, g64, u64 = (t.detach().double().requires_grad_() for t in (x, w_gate, w_up))
    want, _ = reference(x64, g64, u64, act)
    want.backward(dy.double())
    tol = 4 * HALF_TOL.get(dtype, REDUCTION_TOL[dtype])
    for got, ref in ((x.grad, x64.grad), (w_gate.grad, g64.grad), (w_up.grad, u64.grad)):
        assert got.dtype == dtype and got.shape == ref.shape
        assert rel_error(got, ref.to(got.device)) <= tol


@pytest.mark.parametrize("device", DEVICES)
def test_swiglu_keeps_g_and_u_only_when_a_gradient_is_required(device):
    x, w_gate, w_up = make((6, 8), torch.float32, device), make((5, 8), torch.float32, device), \
        make((5, 8), torch.float32, device)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        cuops.swiglu(x, w_gate, w_up)
        with torch.no_grad():
            cuops.swiglu(x, w_gate.requires_grad_(), w_up)
        assert saved == []
        cuops.swiglu(x, w_gate, w_up)
    assert sorted(saved) == sorted([(6, 8), (5, 8), (5, 8), (6, 5), (6, 5)])


@pytest.mark.parametrize("device", DEVICES)
def test_swiglu_bad_inputs_name_the_argument(device):
    x, w_gate, w_up = make((4, 3), torch.float32, device), make((5, 3), torch.float32, device), \
        make((5, 3), torch.float32, device)
    with pytest.raises(RuntimeError, match=r"cuops::swiglu: expected w_gate \[I, K\] to share K with x's last "
                                           r"dimension, got x \[4, 3\] and w_gate \[5, 2\]"):
        cuops.swiglu(x, make((5, 2), torch.float32, device), make((5, 2), torch.float32, device))
    with pytest.raises(RuntimeError, match=r"cuops::swiglu: expected w_up to have the shape of w_gate \[5, 3\], "
                                           r"got \[4, 3\]"):
        cuops.swiglu(x, w_gate, make((4, 3), torch.float32, device))
    with pytest.raises(RuntimeError, match=r"cuops::swiglu: expected w_up to be 2-D, got 1-D"):
        cuops.swiglu(x, w_gate, make((3,), torch.float32, device))
    with pytest.raises(RuntimeError, match=r"cuops::swiglu: expected w_gate to have the dtype of x \(bfloat16\), "
                                           r"got float32"):
        cuops.swiglu(x.bfloat16(), w_gate, w_up)
    with pytest.raises(RuntimeError, match=r"cuops::swiglu: expected w_up to have the dtype of x \(float32\), "
                                           r"got bfloat16"):
        cuops.swiglu(x, w_gate, w_up.bfloat16())
    with pytest.raises(RuntimeError, match=r"cuops::swiglu: expected x to be at least 1-D"):
        cuops.swiglu(torch.tensor(1.0, device=device), w_gate, w_up)
    with pytest.raises(RuntimeError, match=r"cuops::_swiglu_fwd: expected w_up to have the shape of w_gate"):
        ops._swiglu_fwd(x, w_gate, make((4, 3), torch.float32, device))
    for op, args in (("swiglu", (x, w_gate, w_up)), ("_swiglu_fwd", (x, w_gate, w_up)),
                     ("_swiglu_bwd", (make((4, 5), torch.float32, device),) * 3)):
        for act in ("gelu", "relu", "none", "SILU"):
            with pytest.raises(RuntimeError, match=rf"cuops::{op}: expected activation to be one of silu, "
                                                   rf"gelu_tanh, got '{act}'"):
                getattr(ops, op)(*args, act)
    if device == "cuda":
        with pytest.raises(RuntimeError, match=r"cuops::swiglu: expected w_up on the device of x"):
            cuops.swiglu(x, w_gate, w_up.cpu())


@pytest.mark.parametrize("device", DEVICES)
def test_swiglu_meta_shapes(device):
    x, w_gate, w_up = (torch.empty(s, device="meta") for s in ((2, 3, 8), (5, 8), (5, 8)))
    assert cuops.swiglu(x, w_gate, w_up).shape == (2, 3, 5)
    y, g, u = ops._swiglu_fwd(x, w_gate, w_up)
    assert y.shape == g.shape == u.shape == (2, 3, 5)
    with pytest.raises(RuntimeError, match=r"cuops::swiglu: expected w_up to have the shape of w_gate"):
        cuops.swiglu(x, w_gate, torch.empty(4, 8, device="meta"))


@pytest.mark.parametrize("device", DEVICES)
def test_swiglu_opcheck(device):
    x = make((2, 3, 8), torch.float32, device)
    w_gate, w_up = make((5, 8), torch.float32, device), make((5, 8), torch.float32, device)
    torch.library.opcheck(ops.swiglu, (x.requires_grad_(), w_gate.requires_grad_(), w_up.requires_grad_()))
    torch.library.opcheck(ops.swiglu, (x.detach(), w_gate.detach(), w_up.detach()))
    torch.library.opcheck(ops._swiglu_fwd, (x.detach(), w_gate.detach(), w_up.detach()))
    torch.library.opcheck(ops.swiglu, (x.requires_grad_(), w_gate, w_up, "gelu_tanh"))
    torch.library.opcheck(ops._swiglu_bwd, (make((6, 5), torch.float32, device),) * 3 + ("gelu_tanh",))


@pytest.mark.parametrize("device", DEVICES)
def test_swiglu_compiles_without_graph_breaks(device):
    """fullgraph through the ops' fake kernels and autograd (aot_eager: Dynamo and AOTAutograd, no
    codegen); on CUDA also Inductor."""
    x = make((2, 8, 16), torch.float32, device).requires_grad_()
    w_gate = make((12, 16), torch.float32, device).requires_grad_()
    w_up = make((12, 16), torch.float32, device).requires_grad_()
    leaves = (x, w_gate, w_up)

    def f(x, w_gate, w_up):
        return cuops.swiglu(x, w_gate, w_up).sum() + cuops.swiglu(x, w_gate, w_up, "gelu_tanh").sum()

    backends = ["aot_eager"] + (["inductor"] if device == "cuda" else [])
    for backend in backends:
        torch._dynamo.reset()
        out = torch.compile(f, fullgraph=True, backend=backend)(*leaves)
        out.backward()
        grads = [t.grad.clone() for t in leaves]
        for t in leaves:
            t.grad = None
        f(*leaves).backward()
        for got, t in zip(grads, leaves):
            torch.testing.assert_close(got, t.grad, rtol=1e-5, atol=1e-5)
        for t in leaves:
            t.grad = None


@requires_cuda
@pytest.mark.parametrize("act", ACTS)
def test_swiglu_autocast_casts_like_f_linear(act):
    x = make((8, 16), torch.float32, "cuda")
    w_gate = make((12, 16), torch.float32, "cuda").requires_grad_()  # float32 master weights
    w_up = make((12, 16), torch.float32, "cuda").requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = cuops.swiglu(x, w_gate, w_up, act)
        want = gate(F.linear(x, w_gate), act) * F.linear(x, w_up)
    assert y.dtype == want.dtype == torch.bfloat16
    assert rel_error(y, want) <= 4 * HALF_TOL[torch.bfloat16]
    y.float().sum().backward()
    assert w_gate.grad.dtype == torch.float32 and w_up.grad.dtype == torch.float32


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_swiglu_bitwise_repeatable(dtype):
    x, w_gate, w_up = make((256, 512), dtype, "cuda"), make((384, 512), dtype, "cuda"), \
        make((384, 512), dtype, "cuda")
    first = cuops.swiglu(x, w_gate, w_up)
    for _ in range(3):
        assert torch.equal(cuops.swiglu(x, w_gate, w_up), first)
    dy = make((256, 384), dtype, "cuda")
    grads = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_() for t in (x, w_gate, w_up)]
        cuops.swiglu(*leaves).backward(dy)
        cuops.swiglu(*leaves, "gelu_tanh").backward(dy)
        grads.append([t.grad for t in leaves])
    assert all(torch.equal(a, c) for a, c in zip(*grads))


@requires_cuda
def test_swiglu_in_a_cuda_graph():
    x, w_gate, w_up = make((64, 32), torch.bfloat16, "cuda"), make((48, 32), torch.bfloat16, "cuda"), \
        make((48, 32), torch.bfloat16, "cuda")
    want = cuops.swiglu(x, w_gate, w_up)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        cuops.swiglu(x, w_gate, w_up)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = cuops.swiglu(x, w_gate, w_up)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)
