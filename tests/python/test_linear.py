"""cuops.linear (docs/ops.md#linear): act(x @ weight.T + bias) against a float64 reference, its gradients,
errors, autocast, opcheck and torch.compile; on the CPU (the reference) and on CUDA."""
import pytest
import torch
import torch.nn.functional as F

import cuops
from conftest import (DEVICES, DTYPES, HALF_TOL, REDUCTION_TOL, cuda_kernels, make, ops, poison_allocator,
                      rel_error, requires_cuda, requires_hopper)

ACTIVATIONS = ["none", "relu", "gelu", "gelu_tanh", "silu"]


def reference(x, w, b, activation):
    """The float64 result and the scale of its rounding error: |x| @ |w|^T + |b| (each activation
    moves an error by at most ~1.13 times, gelu's steepest slope)."""
    x64, w64 = x.double(), w.double()
    z = x64 @ w64.t()
    scale = x64.abs() @ w64.abs().t()
    if b is not None:
        z, scale = z + b.double(), scale + b.double().abs()
    act = {"none": lambda t: t, "relu": torch.relu, "gelu": F.gelu, "silu": F.silu,
           "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[activation]
    return act(z), scale


def tolerance(dtype, device):
    """The product's bound (tests/tolerances.txt, the half types' rounding), twice over where CUDA
    rounds the pre-activation to x's dtype before the activation rounds again."""
    base = HALF_TOL.get(dtype, REDUCTION_TOL[dtype])
    return 2.5 * base if device == "cuda" else 1.5 * base


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
def test_linear_matches_float64(device, dtype, activation, with_bias):
    # Leading dims, odd K and N, and x as every other row of a wider tensor (not contiguous).
    x = make((2, 6, 37), dtype, device, "sliced")[:, ::2]
    w = make((29, 37), dtype, device)
    b = make((29,), dtype, device) if with_bias else None
    y = cuops.linear(x, w, b, activation)
    assert y.shape == (2, 3, 29) and y.dtype == dtype and y.device.type == device
    want, scale = reference(x, w, b, activation)
    assert rel_error(y, want.to(y.device), scale.to(y.device)) <= tolerance(dtype, device)


# Products the fused kernel takes (rows > 16; K and N whole 16 bytes), with partial tiles in every
# direction, from one tile to several waves of pairs: (rows, N, K).
FUSED_SHAPES = [(17, 64, 64), (300, 328, 264), (1000, 1160, 136), (2048, 3072, 512)]


@requires_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("shape", FUSED_SHAPES, ids=str)
def test_linear_fused_kernel(dtype, activation, with_bias, shape):
    """One kernel (the GEMM with the bias and activation in its epilogue) into NaN-poisoned outputs, against
    float64; with the pre-activation kept (_linear_fwd) the same output and z; the same bits again."""
    rows, n, k = shape
    x, w = make((rows, k), dtype, "cuda"), make((n, k), dtype, "cuda")
    b = make((n,), dtype, "cuda") if with_bias else None
    poison_allocator()
    out = []
    names = cuda_kernels(lambda: out.append(cuops.linear(x, w, b, activation)))
    assert len(names) == 1 and "gemm_wgmma_fused" in names[0], names
    want, scale = reference(x, w, b, activation)
    assert rel_error(out[0], want, scale) <= tolerance(dtype, "cuda")
    poison_allocator()
    y, z = ops._linear_fwd(x, w, b, activation)
    assert torch.equal(y, out[0])
    want_z, scale_z = reference(x, w, b, "none")
    assert rel_error(z, want_z, scale_z) <= HALF_TOL[dtype]
    assert torch.equal(cuops.linear(x, w, b, activation), out[0])


# Decode sizes (rows <= 16) the small-M kernel's streaming form fuses: one token to 16, outputs not a
# whole group of 64 and k not a whole stage, k split over a cluster (few outputs), x's rows padded (a
# slice of wider rows): (rows, N, K, layout).
SMALL_M_SHAPES = [(1, 3072, 768, "contiguous"), (5, 1000, 264, "contiguous"), (8, 200, 4096, "padded"),
                  (16, 1160, 136, "contiguous")]


@requires_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("shape", SMALL_M_SHAPES, ids=str)
def test_linear_fused_small_m(dtype, activation, shape):
    """At decode sizes one launch of the small-M kernel with the bias and activation in its stores, into
    NaN-poisoned outputs, against float64, with and without a bias; with z kept (_linear_fwd, a z one
    element off 16-byte alignment included) the same output and z; the same bits again."""
    rows, n, k, layout = shape
    x, w = make((rows, k), dtype, "cuda", layout), make((n, k), dtype, "cuda")
    for b in (make((n,), dtype, "cuda"), make((n + 1,), dtype, "cuda")[1:], None):
        poison_allocator()
        out = []
        names = cuda_kernels(lambda: out.append(cuops.linear(x, w, b, activation)))
        assert len(names) == 1 and "gemm_skinny_tma" in names[0], names
        want, scale = reference(x, w, b, activation)
        assert rel_error(out[0], want, scale) <= tolerance(dtype, "cuda")
        poison_allocator()
        names = cuda_kernels(lambda: out.append(ops._linear_fwd(x, w, b, activation)))
        assert len(names) == 1 and "gemm_skinny_tma" in names[0], names
        y, z = out[1]
        assert torch.equal(y, out[0])
        want_z, scale_z = reference(x, w, b, "none")
        assert rel_error(z, want_z, scale_z) <= HALF_TOL[dtype]
        assert torch.equal(cuops.linear(x, w, b, activation), out[0])


@requires_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_linear_fused_kernel_unaligned_bias(dtype):
    """A bias one element off 4-byte alignment (a slice) takes the fused kernel's 2-byte loads."""
    rows, n, k = 300, 328, 264
    x, w = make((rows, k), dtype, "cuda"), make((n, k), dtype, "cuda")
    b = make((n + 1,), dtype, "cuda")[1:]
    out = []
    names = cuda_kernels(lambda: out.append(cuops.linear(x, w, b, "gelu_tanh")))
    assert len(names) == 1 and "gemm_wgmma_fused" in names[0], names
    want, scale = reference(x, w, b, "gelu_tanh")
    assert rel_error(out[0], want, scale) <= tolerance(dtype, "cuda")
    assert torch.equal(cuops.linear(x, w, b.clone(), "gelu_tanh"), out[0])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(0, 8, 5), (4, 0, 5), (4, 8, 0)], ids=["rows0", "k0", "n0"])
def test_linear_empty_sizes(device, shape):
    rows, k, n = shape
    x, w, b = make((rows, k), torch.float32, device), make((n, k), torch.float32, device), \
        make((n,), torch.float32, device)
    y = cuops.linear(x, w, b, "silu")
    assert y.shape == (rows, n)
    assert torch.allclose(y, F.silu(x @ w.t() + b), atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_linear_gradcheck_float64(device, activation):
    x = make((3, 2, 7), torch.float64, device).requires_grad_()
    w = make((5, 7), torch.float64, device).requires_grad_()
    b = make((5,), torch.float64, device).requires_grad_()
    assert torch.autograd.gradcheck(lambda *t: cuops.linear(*t, activation), (x, w, b))
    assert torch.autograd.gradcheck(lambda x, w: cuops.linear(x, w, None, activation), (x, w))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("activation", ["gelu_tanh", "silu", "none"])
def test_linear_gradients_match_float64(device, dtype, activation):
    x = make((64, 48), dtype, device).requires_grad_()
    w = make((40, 48), dtype, device).requires_grad_()
    b = make((40,), dtype, device).requires_grad_()
    g = make((64, 40), dtype, device)
    cuops.linear(x, w, b, activation).backward(g)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    want, _ = reference(x64, w64, b64, activation)
    want.backward(g.double())
    tol = 4 * HALF_TOL.get(dtype, REDUCTION_TOL[dtype])
    for got, ref in ((x.grad, x64.grad), (w.grad, w64.grad), (b.grad, b64.grad)):
        assert got.dtype == dtype
        assert rel_error(got, ref.to(got.device)) <= tol


@pytest.mark.parametrize("device", DEVICES)
def test_linear_bad_inputs_name_the_argument(device):
    x, w, b = make((4, 3), torch.float32, device), make((5, 3), torch.float32, device), \
        make((5,), torch.float32, device)
    with pytest.raises(RuntimeError, match=r"cuops::linear: expected activation to be one of none, relu, gelu, "
                                           r"gelu_tanh, silu, got 'tanh'"):
        cuops.linear(x, w, b, "tanh")
    with pytest.raises(RuntimeError, match=r"cuops::linear: expected weight \[N, K\] to share K with x's last "
                                           r"dimension, got x \[4, 3\] and weight \[5, 2\]"):
        cuops.linear(x, make((5, 2), torch.float32, device))
    with pytest.raises(RuntimeError, match=r"cuops::linear: expected bias of shape \[5\] \(weight's rows\), got \[4\]"):
        cuops.linear(x, w, make((4,), torch.float32, device))
    with pytest.raises(RuntimeError, match=r"cuops::linear: expected weight to have the dtype of x \(bfloat16\), "
                                           r"got float32"):
        cuops.linear(x.bfloat16(), w)
    with pytest.raises(RuntimeError, match=r"cuops::linear: expected x to be at least 1-D"):
        cuops.linear(torch.tensor(1.0, device=device), w)


@pytest.mark.parametrize("device", DEVICES)
def test_linear_meta_shapes(device):
    x, w, b = (torch.empty(s, device="meta") for s in ((2, 3, 8), (5, 8), (5,)))
    assert cuops.linear(x, w, b, "gelu").shape == (2, 3, 5)
    y, pre = ops._linear_fwd(x, w, b, "gelu")
    assert y.shape == pre.shape == (2, 3, 5)
    dz, db = ops._linear_act_bwd(torch.empty(6, 5, device="meta"), torch.empty(6, 5, device="meta"), "silu")
    assert dz.shape == (6, 5) and db.shape == (5,)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", ["none", "gelu"])
def test_linear_opcheck(device, activation):
    x, w, b = make((6, 8), torch.float32, device), make((5, 8), torch.float32, device), \
        make((5,), torch.float32, device)
    torch.library.opcheck(ops.linear, (x.requires_grad_(), w.requires_grad_(), b.requires_grad_(), activation))
    torch.library.opcheck(ops.linear, (x.detach(), w.detach(), None, activation))
    torch.library.opcheck(ops._linear_fwd, (x.detach(), w.detach(), b.detach(), activation))
    torch.library.opcheck(ops._linear_act_bwd, (make((6, 5), torch.float32, device), make((6, 5), torch.float32, device),
                                                activation))


@pytest.mark.parametrize("device", DEVICES)
def test_linear_compiles_without_graph_breaks(device):
    """fullgraph through the ops' fake kernels and autograd (aot_eager: Dynamo and AOTAutograd, no
    codegen); on CUDA also Inductor."""
    x = make((2, 8, 16), torch.float32, device).requires_grad_()
    w = make((12, 16), torch.float32, device).requires_grad_()
    b = make((12,), torch.float32, device).requires_grad_()

    def f(x, w, b):
        return cuops.linear(x, w, b, "gelu_tanh").sum()

    backends = ["aot_eager"] + (["inductor"] if device == "cuda" else [])
    for backend in backends:
        torch._dynamo.reset()
        out = torch.compile(f, fullgraph=True, backend=backend)(x, w, b)
        out.backward()
        grads = [t.grad.clone() for t in (x, w, b)]
        for t in (x, w, b):
            t.grad = None
        f(x, w, b).backward()
        for got, t in zip(grads, (x, w, b)):
            torch.testing.assert_close(got, t.grad, rtol=1e-5, atol=1e-5)
        for t in (x, w, b):
            t.grad = None


@requires_cuda
def test_linear_autocast_casts_like_f_linear():
    x = make((8, 16), torch.float32, "cuda")
    w = make((12, 16), torch.float32, "cuda").requires_grad_()  # a float32 master weight
    b = make((12,), torch.float32, "cuda").requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = cuops.linear(x, w, b, "silu")
        want = F.silu(F.linear(x, w, b))
    assert y.dtype == want.dtype == torch.bfloat16
    assert rel_error(y, want) <= 2 * HALF_TOL[torch.bfloat16]
    y.float().sum().backward()
    assert w.grad.dtype == torch.float32 and b.grad.dtype == torch.float32


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_linear_bitwise_repeatable(dtype):
    x, w, b = make((256, 512), dtype, "cuda"), make((384, 512), dtype, "cuda"), make((384,), dtype, "cuda")
    first = cuops.linear(x, w, b, "gelu")
    for _ in range(3):
        assert torch.equal(cuops.linear(x, w, b, "gelu"), first)
    g = make((256, 384), dtype, "cuda")
    grads = []
    for _ in range(2):
        xs, ws, bs = (t.clone().requires_grad_() for t in (x, w, b))
        cuops.linear(xs, ws, bs, "gelu").backward(g)
        grads.append([t.grad for t in (xs, ws, bs)])
    assert all(torch.equal(a, c) for a, c in zip(*grads))


@requires_cuda
def test_linear_in_a_cuda_graph():
    x, w, b = make((64, 32), torch.bfloat16, "cuda"), make((48, 32), torch.bfloat16, "cuda"), \
        make((48,), torch.bfloat16, "cuda")
    want = cuops.linear(x, w, b, "relu")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        cuops.linear(x, w, b, "relu")
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = cuops.linear(x, w, b, "relu")
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("n", [37, 328])
def test_activation_backward_and_bias_gradient(device, dtype, activation, n):
    """_linear_act_bwd: dz = dy * act'(pre) and dbias = dz summed over rows, against float64; rows over
    several of the CUDA kernel's 256-row chunks, dy every other row of a wider tensor; an odd N (one element
    a load) and N whose rows take 16-byte loads, which must give the same bits as the element-wise path
    (the same inputs one element off 16-byte alignment)."""
    rows = 1000
    dy = make((2 * rows, n), dtype, device)[::2]
    pre = make((rows, n), dtype, device)
    dz, db = ops._linear_act_bwd(dy, pre, activation)
    assert dz.shape == (rows, n) and db.shape == (n,) and dz.dtype == db.dtype == dtype
    z64 = pre.double().requires_grad_()
    want, _ = reference(z64, torch.eye(n, dtype=torch.float64, device=device), None, activation)
    (dz64,) = torch.autograd.grad(want, z64, dy.double())
    tol = 2 * HALF_TOL.get(dtype, REDUCTION_TOL[dtype])
    assert rel_error(dz, dz64) <= tol
    assert rel_error(db, dz64.sum(0), dz64.abs().sum(0)) <= tol
    if device == "cuda":
        again = ops._linear_act_bwd(dy, pre, activation)
        assert torch.equal(again[0], dz) and torch.equal(again[1], db)
        shifted = torch.empty(rows * n + 1, dtype=dtype, device=device)[1:].view(rows, n)
        shifted.copy_(pre)
        narrow = ops._linear_act_bwd(dy, shifted, activation)
        assert torch.equal(narrow[0], dz) and torch.equal(narrow[1], db)


@pytest.mark.parametrize("device", DEVICES)
def test_activation_backward_empty(device):
    dz, db = ops._linear_act_bwd(make((0, 5), torch.float32, device), make((0, 5), torch.float32, device), "gelu")
    assert dz.shape == (0, 5) and torch.equal(db, torch.zeros(5, device=device))
    dz, db = ops._linear_act_bwd(make((4, 0), torch.float32, device), make((4, 0), torch.float32, device), "gelu")
    assert dz.shape == (4, 0) and db.shape == (0,)


@pytest.mark.parametrize("device", DEVICES)
def test_linear_keeps_the_pre_activation_only_for_a_gradient(device):
    x, w, b = make((6, 8), torch.float32, device), make((5, 8), torch.float32, device), \
        make((5,), torch.float32, device)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        cuops.linear(x, w, b, "gelu")
        with torch.no_grad():
            cuops.linear(x, w.requires_grad_(), b, "gelu")
        assert saved == []
        cuops.linear(x, w, b, "none")
        assert sorted(saved) == sorted([(6, 8), (5, 8)])  # x and weight: no activation, no pre-activation
        saved.clear()
        cuops.linear(x, w, b, "gelu")
    assert sorted(saved) == sorted([(6, 8), (5, 8), (6, 5)])
