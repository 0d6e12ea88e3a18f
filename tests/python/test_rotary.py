"""cuops.rotary (docs/ops.md#rotary): Hugging Face's apply_rotary_pos_emb against a float64 reference and
HF's own code, in every dtype and autocast's mix, q and k in the layout HF's attention makes them, its
gradients (q, k, cos, sin), errors, opcheck and torch.compile; on the CPU and on CUDA."""
import pytest
import torch

import cuops
from conftest import (DEVICES, DTYPES, HALF_TOL, cuda_kernels, make, ops, poison_allocator, rel_error,
                      requires_cuda)

TOL = {torch.float32: 1e-6, torch.float64: 1e-13, **HALF_TOL}


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def hf_apply_rotary_pos_emb(q, k, cos, sin):
    """transformers' apply_rotary_pos_emb (unsqueeze_dim=1)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def hf_cos_sin(batch, t, d, dtype, device, base=10000.0):
    """LlamaRotaryEmbedding's cos and sin: [batch, T, D], the two halves alike."""
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64, device=device) / d))
    pos = torch.arange(t, dtype=torch.float64, device=device)[None].expand(batch, t)
    freqs = pos[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def reference(x, cos, sin):
    x64, c, s = x.double(), cos.double().unsqueeze(1), sin.double().unsqueeze(1)
    return x64 * c + rotate_half(x64) * s


def heads_layout(b, h, t, d, dtype, device):
    """q as HF's attention makes it: [B, T, H * D] projected, viewed [B, T, H, D], transposed."""
    return make((b, t, h * d), dtype, device).view(b, t, h, d).transpose(1, 2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cos_batch", [1, 2], ids=["cos1", "cosB"])
def test_rotary_matches_float64(device, dtype, cos_batch):
    b, hq, hk, t, d = 2, 4, 2, 7, 64
    q, k = heads_layout(b, hq, t, d, dtype, device), heads_layout(b, hk, t, d, dtype, device)
    cos, sin = hf_cos_sin(cos_batch, t, d, dtype, device)
    oq, ok = cuops.rotary(q, k, cos, sin)
    assert oq.dtype == ok.dtype == dtype and oq.shape == q.shape and ok.shape == k.shape
    assert rel_error(oq, reference(q, cos, sin)) <= TOL[dtype]
    assert rel_error(ok, reference(k, cos, sin)) <= TOL[dtype]
    again = cuops.rotary(q, k, cos, sin)
    assert torch.equal(again[0], oq) and torch.equal(again[1], ok)


def qk_in_layout(layout, b, hq, hk, t, d, dtype, device):
    """q and k in the layouts a model hands over: HF's transposed projection, contiguous [B, H, T, D],
    q and k as slices of one fused qkv projection (not dense), rows offset by one element (not 16-byte
    aligned), and a head dimension with a non-unit stride."""
    if layout == "hf":
        return heads_layout(b, hq, t, d, dtype, device), heads_layout(b, hk, t, d, dtype, device)
    if layout == "contiguous":
        return make((b, hq, t, d), dtype, device), make((b, hk, t, d), dtype, device)
    if layout == "fused_qkv":
        qkv = make((b, t, hq + 2 * hk, d), dtype, device)
        return qkv[:, :, :hq].transpose(1, 2), qkv[:, :, hq:hq + hk].transpose(1, 2)
    if layout == "offset":
        return (make((b, hq, t, d), dtype, device, layout="offset"),
                make((b, hk, t, d), dtype, device, layout="offset"))
    if layout == "strided_d":
        return (make((b, hq, t, d), dtype, device, layout="sliced"),
                make((b, hk, t, d), dtype, device, layout="sliced"))
    raise ValueError(layout)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["hf", "contiguous", "fused_qkv", "offset", "strided_d"])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 2), (2, 3, 1, 5, 6), (3, 8, 2, 17, 128), (1, 2, 2, 3, 256),
                                   (2, 0, 2, 4, 64), (2, 2, 1, 0, 64)], ids=str)
def test_rotary_layouts_and_sizes(device, dtype, layout, shape):
    """Every layout and size, including D / 2 not a whole vector (6: one element at a time), no q heads and
    no positions; the outputs keep q's and k's layout where it is dense (empty_like's), and every element is written
    (outputs handed NaN-filled memory). Forward and backward (the backward's gradients are q and k's)."""
    b, hq, hk, t, d = shape
    q, k = qk_in_layout(layout, b, hq, hk, t, d, dtype, device)
    cos, sin = hf_cos_sin(b, t, d, dtype, device)
    bwd = lambda *a: ops._rotary_bwd(*a, dtype)  # noqa: E731
    for op, sign in ((ops.rotary, 1), (bwd, -1)):
        if device == "cuda":
            poison_allocator()
        oq, ok = op(q, k, cos, sin)
        for x, o in ((q, oq), (k, ok)):
            assert o.shape == x.shape and o.dtype == dtype
            assert o.stride() == torch.empty_like(x).stride()  # x's own where x is dense
            want = reference(x, cos, sign * sin)  # the backward rotates back (cos / sin halves alike)
            assert rel_error(o, want) <= TOL[dtype]


@requires_cuda
@pytest.mark.parametrize("trig", [None, torch.float32], ids=["same", "f32_trig"])
def test_cuda_rotary_is_one_launch(trig):
    """q and k, HF's layout, bf16 (with float32 cos / sin: autocast's mix): one kernel each way, the
    same bits on every call."""
    q, k = heads_layout(2, 8, 33, 128, torch.bfloat16, "cuda"), heads_layout(2, 2, 33, 128, torch.bfloat16, "cuda")
    cos, sin = hf_cos_sin(2, 33, 128, trig or torch.bfloat16, "cuda")
    names = cuda_kernels(lambda: ops.rotary(q, k, cos, sin))
    assert len(names) == 1 and "rotary" in names[0], names
    first = ops.rotary(q, k, cos, sin)
    for _ in range(3):
        again = ops.rotary(q, k, cos, sin)
        assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])
    if trig is None:
        names = cuda_kernels(lambda: ops._rotary_bwd(q, k, cos, sin, torch.bfloat16))
        assert len(names) == 1 and "rotary" in names[0], names
    else:  # autocast's backward: float32 gradients in, q's bf16 out, one launch
        g = first[0].detach(), first[1].detach()
        names = cuda_kernels(lambda: ops._rotary_bwd(*g, cos, sin, torch.bfloat16))
        assert len(names) == 1 and "rotary" in names[0], names
        dq, dk = ops._rotary_bwd(*g, cos, sin, torch.bfloat16)
        assert dq.dtype == dk.dtype == torch.bfloat16
        assert rel_error(dq, reference(g[0], cos, -sin)) <= TOL[torch.bfloat16]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("d", [6, 128], ids=str)
def test_autocast_mix_follows_hugging_face(device, half, d):
    """Under autocast HF's q and k are half (projections) and cos / sin float32: the result is float32
    (d = 6: one element at a time)."""
    q, k = heads_layout(1, 4, 9, d, half, device), heads_layout(1, 1, 9, d, half, device)
    cos, sin = hf_cos_sin(1, 9, d, torch.float32, device)
    oq, ok = cuops.rotary(q, k, cos, sin)
    wq, wk = hf_apply_rotary_pos_emb(q, k, cos, sin)
    assert oq.dtype == wq.dtype == torch.float32 and ok.dtype == wk.dtype
    assert rel_error(oq, wq) <= 1e-6 and rel_error(ok, wk) <= 1e-6


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("d", [6, 128], ids=str)
def test_dtype_gives_the_default_result_cast(device, half, d):
    """dtype: the values are the default result's cast to it, bit for bit: the half type attention reads
    under autocast (half q and k with float32 cos / sin; float32 q and k, Qwen3's q/k norms under autocast;
    one dtype; d = 6 one element at a time), and the kernel's other cases (the other half type, a wider
    dtype); q and k in HF's layout, as slices of one fused q/k/v projection, and offset rows. The
    gradients, arriving in dtype, equal the default op's given the same gradients in its own dtype, bit
    for bit, in q's dtype."""
    cos, sin = hf_cos_sin(2, 7, d, torch.float32, device)
    other = torch.float16 if half == torch.bfloat16 else torch.bfloat16
    for x_dtype, layout in ((half, "hf"), (half, "fused_qkv"), (half, "offset"), (torch.float32, "hf")):
        q, k = qk_in_layout(layout, 2, 4, 2, 7, d, x_dtype, device)
        for c, s in ((cos, sin), (cos.to(x_dtype), sin.to(x_dtype))):
            wq, wk = cuops.rotary(q, k, c, s)
            for dtype in (half, other, torch.float32, torch.float64):
                oq, ok = cuops.rotary(q, k, c, s, dtype=dtype)
                assert oq.dtype == ok.dtype == dtype and oq.stride() == wq.stride()
                assert torch.equal(oq, wq.to(dtype)) and torch.equal(ok, wk.to(dtype)), (x_dtype, c.dtype, dtype)
        grads = []
        gq, gk = make(q.shape, half, device), make(k.shape, half, device)
        for dtype in (half, None):
            qg, kg = q.detach().clone().requires_grad_(), k.detach().clone().requires_grad_()
            oq, ok = cuops.rotary(qg, kg, cos, sin, dtype=dtype)
            torch.autograd.backward([oq, ok], [gq.to(oq.dtype), gk.to(ok.dtype)])
            grads.append((qg.grad, kg.grad))
        for got, want in zip(*grads):
            assert got.dtype == want.dtype == x_dtype and torch.equal(got, want)


@requires_cuda
def test_cuda_dtype_is_one_launch_each_way():
    """Autocast's mix with dtype = q's half type: one kernel forward, one backward (gradients in bf16)."""
    q, k = heads_layout(2, 8, 33, 128, torch.bfloat16, "cuda"), heads_layout(2, 2, 33, 128, torch.bfloat16, "cuda")
    cos, sin = hf_cos_sin(2, 33, 128, torch.float32, "cuda")
    names = cuda_kernels(lambda: ops.rotary(q, k, cos, sin, torch.bfloat16))
    assert len(names) == 1 and "rotary" in names[0], names
    names = cuda_kernels(lambda: ops._rotary_bwd(q, k, cos, sin, torch.bfloat16))
    assert len(names) == 1 and "rotary" in names[0], names


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gradients_match_float64(device, dtype):
    b, hq, hk, t, d = 2, 3, 1, 5, 32
    q = heads_layout(b, hq, t, d, dtype, device).requires_grad_()
    k = heads_layout(b, hk, t, d, dtype, device).requires_grad_()
    cos, sin = (c.requires_grad_() for c in hf_cos_sin(1, t, d, dtype, device))
    gq, gk = make((b, hq, t, d), dtype, device), make((b, hk, t, d), dtype, device)
    torch.autograd.backward(cuops.rotary(q, k, cos, sin), [gq, gk])
    q64, k64, c64, s64 = (x.detach().double().requires_grad_() for x in (q, k, cos, sin))
    torch.autograd.backward(hf_apply_rotary_pos_emb(q64, k64, c64, s64), [gq.double(), gk.double()])
    tol = 4 * TOL[dtype]
    for got, want in ((q.grad, q64.grad), (k.grad, k64.grad), (cos.grad, c64.grad), (sin.grad, s64.grad)):
        assert got.dtype == dtype
        assert rel_error(got, want) <= tol


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_float64(device):
    q, k = make((1, 2, 3, 8), torch.float64, device), make((1, 1, 3, 8), torch.float64, device)
    cos, sin = make((1, 3, 8), torch.float64, device), make((1, 3, 8), torch.float64, device)
    args = tuple(t.requires_grad_() for t in (q, k, cos, sin))
    assert torch.autograd.gradcheck(cuops.rotary, args)


@pytest.mark.parametrize("device", DEVICES)
def test_errors_name_the_argument(device):
    q, k = make((1, 2, 3, 8), torch.float32, device), make((1, 1, 3, 8), torch.float32, device)
    cos, sin = make((1, 3, 8), torch.float32, device), make((1, 3, 8), torch.float32, device)
    with pytest.raises(RuntimeError, match=r"cuops::rotary: expected an even head dimension D, got 7"):
        cuops.rotary(q[..., :7], k[..., :7], cos[..., :7], sin[..., :7])
    with pytest.raises(RuntimeError, match=r"cuops::rotary: expected cos and sin \[B or 1, T, D\]"):
        cuops.rotary(q, k, cos[:, :2], sin[:, :2])
    with pytest.raises(RuntimeError, match=r"cuops::rotary: expected q \[B, Hq, T, D\] and k"):
        cuops.rotary(q, k[:, :, :2], cos, sin)
    with pytest.raises(RuntimeError, match=r"cuops::rotary: expected q to be 4-D"):
        cuops.rotary(q[0], k, cos, sin)
    with pytest.raises(RuntimeError, match=r"cuops::rotary: expected k to have the dtype of q"):
        cuops.rotary(q, k.double(), cos, sin)
    with pytest.raises(RuntimeError, match=r"cuops::rotary: expected sin to have the dtype of cos"):
        cuops.rotary(q, k, cos, sin.double())
    with pytest.raises(RuntimeError, match=r"cuops::rotary: expected dtype float32, .* \(or None\), got int"):
        cuops.rotary(q, k, cos, sin, dtype=torch.int32)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    q, k = make((2, 2, 3, 8), torch.float32, device), make((2, 1, 3, 8), torch.float32, device)
    cos, sin = make((2, 3, 8), torch.float32, device), make((2, 3, 8), torch.float32, device)
    torch.library.opcheck(ops.rotary, tuple(t.clone().requires_grad_() for t in (q, k, cos, sin)))
    torch.library.opcheck(ops.rotary, (q, k, cos[:1], sin[:1]))
    torch.library.opcheck(ops.rotary, tuple(t.clone().requires_grad_() for t in (q.bfloat16(), k.bfloat16(), cos, sin))
                          + (torch.bfloat16,))
    torch.library.opcheck(ops._rotary_bwd, (q, k, cos, sin, torch.float32))
    torch.library.opcheck(ops._rotary_bwd, (q, k, cos, sin, torch.float64))


@pytest.mark.parametrize("device", DEVICES)
def test_compiles_without_graph_breaks(device):
    q = heads_layout(1, 2, 4, 16, torch.float32, device).detach().requires_grad_()
    k = heads_layout(1, 1, 4, 16, torch.float32, device).detach().requires_grad_()
    cos, sin = hf_cos_sin(1, 4, 16, torch.float32, device)

    def f(q, k):
        a, b = cuops.rotary(q, k, cos, sin)
        return (a * a).sum() + b.sum()

    backends = ["aot_eager"] + (["inductor"] if device == "cuda" else [])
    for backend in backends:
        torch._dynamo.reset()
        torch.compile(f, fullgraph=True, backend=backend)(q, k).backward()
        grads = [q.grad.clone(), k.grad.clone()]
        q.grad = k.grad = None
        f(q, k).backward()
        torch.testing.assert_close(grads[0], q.grad, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(grads[1], k.grad, rtol=1e-5, atol=1e-5)
        q.grad = k.grad = None
