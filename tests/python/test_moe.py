"""Mixture of experts (docs/ops.md#grouped_mm, #moe_topk_softmax, #moe_experts): the grouped GEMM, the router's
softmax + top-k and the experts op against float64 references and Hugging Face's experts module; gradients,
gradcheck, errors, bitwise repeats, opcheck and torch.compile; on the CPU and on CUDA."""
import os
import re

import pytest
import torch
import torch.nn.functional as F

import cuops
from conftest import (DEVICES, DTYPES, HALF_TOL, REDUCTION_TOL, cuda_kernels, make, ops, poison_allocator, rel_error,
                      requires_cuda, requires_hopper)

# Rows per group: balanced, skewed with empty groups, one group taking every row, a lone row, all empty;
# none a multiple of a tile. The extra rows after the last group must come out as zeros.
COUNTS = {"balanced": [37, 37, 37, 37], "skewed": [0, 150, 1, 0, 20, 0], "one_takes_all": [0, 0, 203, 0],
          "single_row": [1], "all_empty": [0, 0, 0]}


def ends(counts, device, dtype=torch.int32):
    return torch.tensor(counts, dtype=torch.int64).cumsum(0).to(dtype=dtype, device=device)


def grouped_reference(a, b, counts, ragged_k):
    """(the float64 product, |a| @ |b| the scale of its rounding error) group by group."""
    a64, b64 = a.double().cpu(), b.double().cpu()
    if ragged_k:
        out, scale = torch.zeros(len(counts), a.shape[0], b.shape[1], dtype=torch.float64), None
        scale = torch.zeros_like(out)
    else:
        out, scale = torch.zeros(a.shape[0], b.shape[2], dtype=torch.float64), None
        scale = torch.zeros_like(out)
    start = 0
    for e, c in enumerate(counts):
        if ragged_k:
            out[e] = a64[:, start:start + c] @ b64[start:start + c]
            scale[e] = a64[:, start:start + c].abs() @ b64[start:start + c].abs()
        else:
            out[start:start + c] = a64[start:start + c] @ b64[e]
            scale[start:start + c] = a64[start:start + c].abs() @ b64[e].abs()
        start += c
    return out, scale


def product_tol(dtype):
    return HALF_TOL.get(dtype, REDUCTION_TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("routing", list(COUNTS))
def test_grouped_mm_rows_matches_float64(device, dtype, routing):
    """[S, K] x [E, K, N] with b a transposed view (Hugging Face's weight.transpose(-2, -1)); 3 rows past the
    last group, which must be zeros; offs as int32 and int64; NaN-poisoned outputs on CUDA."""
    counts = COUNTS[routing]
    rows, k, n = sum(counts) + 3, 37, 29
    a = make((rows, k), dtype, device)
    b = make((len(counts), n, k), dtype, device).transpose(1, 2)
    want, scale = grouped_reference(a, b, counts, ragged_k=False)
    for offs_dtype in (torch.int32, torch.int64):
        if device == "cuda":
            poison_allocator()
        out = cuops.grouped_mm(a, b, ends(counts, device, offs_dtype))
        assert out.shape == (rows, n) and out.dtype == dtype and out.device.type == device
        assert rel_error(out, want.to(out.device), scale.to(out.device)) <= product_tol(dtype)
        assert torch.equal(out[sum(counts):], torch.zeros_like(out[sum(counts):]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("routing", list(COUNTS))
def test_grouped_mm_along_k_matches_float64(device, dtype, routing):
    """[M, S] x [S, N] -> [E, M, N] (a per-expert weight gradient), a as a transposed view; empty groups give
    zeros; columns past the last group belong to none."""
    counts = COUNTS[routing]
    s, m, n = sum(counts) + 3, 21, 70
    a = make((m, s), dtype, device, "transposed")
    b = make((s, n), dtype, device)
    if device == "cuda":
        poison_allocator()
    out = cuops.grouped_mm(a, b, ends(counts, device))
    want, scale = grouped_reference(a, b, counts, ragged_k=True)
    assert out.shape == (len(counts), m, n) and out.dtype == dtype
    assert rel_error(out, want.to(out.device), scale.to(out.device)) <= product_tol(dtype)
    for e, c in enumerate(counts):
        if c == 0:
            assert torch.equal(out[e], torch.zeros_like(out[e]))


@pytest.mark.parametrize("device", DEVICES)
def test_grouped_mm_gradcheck_float64(device):
    counts = [3, 0, 5, 2]
    offs = ends(counts, device)
    a = make((12, 6), torch.float64, device).requires_grad_()
    b = make((4, 6, 5), torch.float64, device).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: cuops.grouped_mm(a, b, offs), (a, b))
    a2 = make((4, 12), torch.float64, device).requires_grad_()
    b2 = make((12, 7), torch.float64, device).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: cuops.grouped_mm(a, b, offs), (a2, b2))


@pytest.mark.parametrize("device", DEVICES)
def test_grouped_mm_errors_name_op_argument_and_values(device):
    f32 = dict(dtype=torch.float32, device=device)
    offs = ends([2, 2], device)
    a, b = torch.ones(4, 3, **f32), torch.ones(2, 3, 5, **f32)
    cases = [
        ((torch.ones(1, 4, 3, **f32), b, offs), "expected a to be 2-D"),
        ((a, torch.ones(5, **f32), offs), "expected b to be 3-D"),
        ((a, torch.ones(2, 4, 5, **f32), offs), "to share K"),
        ((a, torch.ones(3, 3, 5, **f32), offs), "one matrix per group"),
        ((a, b, offs.float()), "expected offs to have dtype int32 or int64, got float32"),
        ((a, b.double(), offs), "expected b to have the dtype of a (float32), got float64"),
        ((a, b, offs.view(1, 2)), "expected offs to be 1-D"),
        ((a.t(), torch.ones(5, 5, **f32), offs), "to share S"),
    ]
    if device == "cpu":
        cases += [((a, b, torch.tensor([3, 2], dtype=torch.int32)), "non-decreasing group ends within [0, 4], "
                   "got offs[1] = 2 after 3"),
                  ((a, b, torch.tensor([2, 5], dtype=torch.int32)), "got offs[1] = 5")]
    for args, message in cases:
        with pytest.raises(RuntimeError, match="cuops::grouped_mm: .*" + re.escape(message)):
            cuops.grouped_mm(*args)


@requires_cuda
def test_grouped_mm_a_million_rows():
    """T k = 2^20 rows (the issue's largest) over 64 groups of random sizes, one of them empty, both forms,
    against float64 products group by group on the GPU."""
    g = torch.Generator().manual_seed(5)
    counts = torch.multinomial(torch.ones(64), 2 ** 20, replacement=True, generator=g).bincount(minlength=64)
    counts[7] = 0
    counts[0] += 2 ** 20 - int(counts.sum())
    offs = counts.cumsum(0).int().cuda()
    ends = [0] + counts.cumsum(0).tolist()
    a, b = make((2 ** 20, 24), torch.bfloat16, "cuda"), make((64, 24, 40), torch.bfloat16, "cuda")
    out = cuops.grouped_mm(a, b, offs)
    want = torch.cat([a[s:e].double() @ b[i].double() for i, (s, e) in enumerate(zip(ends, ends[1:]))])
    scale = torch.cat([a[s:e].double().abs() @ b[i].double().abs() for i, (s, e) in enumerate(zip(ends, ends[1:]))])
    assert rel_error(out, want, scale) <= HALF_TOL[torch.bfloat16]
    bk = make((2 ** 20, 40), torch.bfloat16, "cuda")
    out_k = cuops.grouped_mm(a.t(), bk, offs)
    for i in (0, 7, 63):
        s, e = ends[i], ends[i + 1]
        ref = a[s:e].double().t() @ bk[s:e].double()
        assert rel_error(out_k[i], ref, a[s:e].double().abs().t() @ bk[s:e].double().abs()) <= HALF_TOL[torch.bfloat16]


@requires_cuda
def test_grouped_mm_cuda_takes_bad_ends_as_clamped_running_maximum():
    """Ends the GPU cannot check without a sync are read as min(S, running max): decreasing or too large
    ends give the product of those groups, never an out-of-bounds read."""
    a, b = make((10, 8), torch.float32, "cuda"), make((3, 8, 4), torch.float32, "cuda")
    out = cuops.grouped_mm(a, b, torch.tensor([6, 2, 99], dtype=torch.int32, device="cuda"))
    want = cuops.grouped_mm(a.cpu(), b.cpu(), torch.tensor([6, 6, 10], dtype=torch.int32))
    torch.testing.assert_close(out.cpu(), want, rtol=1e-5, atol=1e-5)
    # bf16 at TMA-readable sizes: the Hopper kernel's reading of the ends (grouped_prep), both forms.
    a, b = make((300, 16), torch.bfloat16, "cuda"), make((3, 16, 16), torch.bfloat16, "cuda")
    bad, good = [200, 50, 9999], [200, 200, 300]
    out = cuops.grouped_mm(a, b, torch.tensor(bad, dtype=torch.int32, device="cuda"))
    want = cuops.grouped_mm(a.float().cpu(), b.float().cpu(), torch.tensor(good, dtype=torch.int32))
    torch.testing.assert_close(out.float().cpu(), want, rtol=1e-2, atol=1e-2)
    x, g = make((300, 128), torch.bfloat16, "cuda"), make((300, 16), torch.bfloat16, "cuda")
    out = cuops.grouped_mm(x.t(), g, torch.tensor([-4, 250, 100], dtype=torch.int32, device="cuda"))
    want = cuops.grouped_mm(x.t().float().cpu(), g.float().cpu(), torch.tensor([0, 250, 250], dtype=torch.int32))
    torch.testing.assert_close(out.float().cpu(), want, rtol=1e-2, atol=1e-2)


# Groups of rows for torch's packed form on the Hopper grouped kernel: tiles that start inside a group and
# run past its end, a group of one row, empty groups, one group of several tiles.
PACKED_COUNTS = {"ragged": [0, 300, 1, 0, 129, 7, 0, 255], "one_takes_all": [0, 0, 700, 0], "tiny": [1, 2, 0, 3]}


def launched(fn):
    """The CUDA kernels fn() launches (cuda_kernels); under compute-sanitizer, which holds the profiler's
    CUPTI, fn() runs and None comes back (the results are still checked)."""
    if os.environ.get("CUOPS_SANITIZER"):
        fn()
        return None
    return cuda_kernels(fn)


def assert_groups_match(out, want, scale, counts, dtype, ragged_k):
    """Group by group (a one-row group's error would vanish in the whole's norm); empty groups (ragged_k)
    exact zeros."""
    start = 0
    for e, c in enumerate(counts):
        got, ref, sc = (out[e], want[e], scale[e]) if ragged_k else (
            out[start:start + c], want[start:start + c], scale[start:start + c])
        if c > 0:
            assert rel_error(got, ref.to(got.device), sc.to(got.device)) <= HALF_TOL[dtype], (e, c)
        elif ragged_k:
            assert torch.equal(got, torch.zeros_like(got)), e
        start += c


@requires_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("routing", list(PACKED_COUNTS))
@pytest.mark.parametrize("n", [200, 264], ids=str)
@pytest.mark.parametrize("b_layout", ["k_major", "n_major"])
def test_grouped_mm_hopper_packed_rows(dtype, routing, n, b_layout):
    """torch's packed groups (starting anywhere) on the Hopper grouped kernel: each group against float64,
    5 rows past the last group zeros, a NaN-poisoned output; 128- and 256-column tiles with a partial last
    one; b as Hugging Face's weight.transpose(-2, -1) and as a contiguous [E, K, N]; the same bits again."""
    counts = PACKED_COUNTS[routing]
    rows, k = sum(counts) + 5, 136
    a = make((rows, k), dtype, "cuda")
    b = (make((len(counts), n, k), dtype, "cuda").transpose(1, 2) if b_layout == "k_major"
         else make((len(counts), k, n), dtype, "cuda"))
    offs = ends(counts, "cuda")
    poison_allocator()
    got = []
    names = launched(lambda: got.append(cuops.grouped_mm(a, b, offs)))
    assert names is None or any("gemm_wgmma_grouped" in x for x in names), names
    want, scale = grouped_reference(a, b, counts, ragged_k=False)
    assert_groups_match(got[0], want, scale, counts, dtype, ragged_k=False)
    assert torch.equal(got[0][sum(counts):], torch.zeros_like(got[0][sum(counts):]))
    assert torch.equal(cuops.grouped_mm(a, b, offs), got[0])


@requires_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("routing", list(PACKED_COUNTS))
@pytest.mark.parametrize("n", [200, 264], ids=str)
def test_grouped_mm_hopper_packed_along_k(dtype, routing, n):
    """The weight-gradient form on the Hopper grouped kernel: groups of k rows that start and end inside
    64-row k-tiles, whose last k-tile holds the next group's rows (zeroed before the products: inf in both
    operands' rows past the last group must not reach it); m 256; each group against float64, empty groups
    zeros, a NaN-poisoned output; the same bits again."""
    counts = PACKED_COUNTS[routing]
    s, m = sum(counts) + 5, 256
    x, g = make((s, m), dtype, "cuda"), make((s, n), dtype, "cuda")
    x[sum(counts):], g[sum(counts):] = float("inf"), float("-inf")
    offs = ends(counts, "cuda")
    poison_allocator()
    got = []
    names = launched(lambda: got.append(cuops.grouped_mm(x.t(), g, offs)))
    assert names is None or any("gemm_wgmma_grouped" in x for x in names), names
    want, scale = grouped_reference(x.t(), g, counts, ragged_k=True)
    assert_groups_match(got[0], want, scale, counts, dtype, ragged_k=True)
    assert torch.equal(cuops.grouped_mm(x.t(), g, offs), got[0])


@requires_hopper
def test_grouped_mm_hopper_gradients_match_float64():
    """Autograd through the packed Hopper products: da (rows against b[e]^T) and db (along k, per group)
    of a [S, K] times HF's weight.transpose(-2, -1), each group against float64."""
    counts, k, n = PACKED_COUNTS["ragged"], 256, 192
    dtype = torch.bfloat16
    a = make((sum(counts), k), dtype, "cuda").requires_grad_()
    w = make((len(counts), n, k), dtype, "cuda").requires_grad_()
    dout = make((sum(counts), n), dtype, "cuda")
    cuops.grouped_mm(a, w.transpose(1, 2), ends(counts, "cuda")).backward(dout)
    da_want, da_scale = grouped_reference(dout, w.detach(), counts, ragged_k=False)
    assert_groups_match(a.grad, da_want, da_scale, counts, dtype, ragged_k=False)
    dw_want, dw_scale = grouped_reference(dout.t(), a.detach(), counts, ragged_k=True)
    assert_groups_match(w.grad, dw_want, dw_scale, counts, dtype, ragged_k=True)


# ---- the router


def hf_router(logits, k, renorm, cast):
    """Hugging Face's Qwen3-MoE/OLMoE router after its F.linear (Mixtral: renorm, no cast)."""
    p = F.softmax(logits, dtype=torch.float, dim=-1)
    v, i = torch.topk(p, k, dim=-1)
    if renorm:
        v = v / v.sum(dim=-1, keepdim=True)
    return (v.to(logits.dtype) if cast else v), i


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("renorm", [False, True])
def test_moe_topk_softmax_matches_hugging_face(device, dtype, renorm):
    """Distinct logits (multiples of 1/8, exact in bf16): torch.topk leaves the order of ties unspecified."""
    g = torch.Generator().manual_seed(3)
    logits = (torch.stack([torch.randperm(64, generator=g) for _ in range(37)]) / 8 - 4).to(device, dtype)
    for cast in (False, True):
        w, idx = cuops.moe_topk_softmax(logits, 8, renorm, logits.dtype if cast else None)
        want_w, want_idx = hf_router(logits, 8, renorm, cast)
        assert idx.dtype == torch.int64 and w.dtype == want_w.dtype and w.shape == (37, 8)
        assert torch.equal(idx, want_idx)
        torch.testing.assert_close(w, want_w, rtol=1e-6 if w.dtype == torch.float32 else 0, atol=1e-7)


@pytest.mark.parametrize("device", DEVICES)
def test_moe_topk_softmax_ties_take_the_lower_index(device):
    logits = torch.tensor([[0.0, 1.0, 1.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0, 2.0]], device=device)
    w, idx = cuops.moe_topk_softmax(logits, 2)
    assert idx.tolist() == [[1, 2], [0, 1]]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("renorm", [False, True])
def test_moe_topk_softmax_gradcheck_float64(device, renorm):
    logits = make((5, 9), torch.float64, device).requires_grad_()
    assert torch.autograd.gradcheck(lambda z: cuops.moe_topk_softmax(z, 3, renorm)[0], (logits,))


@pytest.mark.parametrize("device", DEVICES)
def test_moe_topk_softmax_errors(device):
    z = torch.zeros(3, 4, device=device)
    for k in (0, 5):
        with pytest.raises(RuntimeError, match=rf"cuops::moe_topk_softmax: expected k in \[1, 4\].*got {k}"):
            cuops.moe_topk_softmax(z, k)
    with pytest.raises(RuntimeError, match="cuops::moe_topk_softmax: expected logits to have dtype"):
        cuops.moe_topk_softmax(z.long(), 1)


# ---- the experts


def experts_reference(x, idx, w, gate_up, down, activation="silu"):
    """out[t] = sum_j w[t, j] down[e] (act(g) u), [g | u] = gate_up[e] x[t], in float64; and the scale of its
    rounding error: the same sums over absolute values."""
    x64, w64, gu64, d64 = x.double().cpu(), w.double().cpu(), gate_up.double().cpu(), down.double().cpu()
    idx = idx.cpu().long()
    act = F.silu if activation == "silu" else (lambda g: F.gelu(g, approximate="tanh"))
    out, scale = torch.zeros_like(x64), torch.zeros_like(x64)
    inter = down.shape[2]
    for t in range(x.shape[0]):
        for j in range(idx.shape[1]):
            e = int(idx[t, j])
            if not 0 <= e < gate_up.shape[0]:
                continue
            gu = gu64[e] @ x64[t]
            h = act(gu[:inter]) * gu[inter:]
            out[t] += w64[t, j] * (d64[e] @ h)
            hs = 1.2 * (gu64[e].abs() @ x64[t].abs())
            scale[t] += w64[t, j].abs() * (d64[e].abs() @ (hs[:inter] * hs[inter:] + h.abs()))
    return out, scale


def routing(tokens, k, experts, kind, device, dtype=torch.int64):
    """[tokens, k] expert indices, distinct in a row: random, skewed (most pairs to experts 0 and 1), or every
    token to the same k experts."""
    g = torch.Generator().manual_seed(tokens * 131 + k)
    if kind == "random":
        idx = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)])
    elif kind == "skewed":
        idx = torch.stack([torch.cat([torch.tensor([0, 1]), 2 + torch.randperm(experts - 2, generator=g)])[:k]
                           if torch.rand(1, generator=g) < 0.8 else torch.randperm(experts, generator=g)[:k]
                           for _ in range(tokens)])
    else:
        idx = torch.arange(k).expand(tokens, k)
    return idx.to(device=device, dtype=dtype)


def experts_tol(dtype):
    # A product rounded (g and u together, then h, then down's product, then the sum), each within the
    # dtype's product bound relative to the absolute-value sums the reference's scale carries.
    return 3 * product_tol(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["random", "skewed", "same"])
def test_moe_experts_matches_float64(device, dtype, kind):
    tokens, k, experts, hidden, inter = 29, 3, 6, 40, 24
    x = make((tokens, hidden), dtype, device)
    gate_up = make((experts, 2 * inter, hidden), dtype, device, scale=0.3)
    down = make((experts, hidden, inter), dtype, device, scale=0.3)
    idx = routing(tokens, k, experts, kind, device)
    w = torch.rand(tokens, k, device=device)
    if device == "cuda":
        poison_allocator()
    out = cuops.moe_experts(x, idx, w, gate_up, down)
    assert out.shape == x.shape and out.dtype == dtype and out.device.type == device
    want, scale = experts_reference(x, idx, w, gate_up, down)
    assert rel_error(out, want.to(out.device), scale.to(out.device)) <= experts_tol(dtype)
    assert torch.equal(cuops.moe_experts(x, idx.int(), w, gate_up, down), out)


@pytest.mark.parametrize("device", DEVICES)
def test_moe_experts_edges(device):
    """gelu_tanh; bf16 weights of the routing; an index outside [0, E) adds nothing; k = 1; no tokens."""
    x = make((9, 16), torch.float32, device)
    gate_up, down = make((4, 20, 16), torch.float32, device), make((4, 16, 10), torch.float32, device)
    idx = routing(9, 2, 4, "random", device)
    w = torch.rand(9, 2, device=device)
    for activation in ("silu", "gelu_tanh"):
        want, scale = experts_reference(x, idx, w, gate_up, down, activation)
        got = cuops.moe_experts(x, idx, w.bfloat16(), gate_up, down, activation)
        want_bf, _ = experts_reference(x, idx, w.bfloat16(), gate_up, down, activation)
        assert rel_error(got, want_bf.to(got.device), scale.to(got.device)) <= experts_tol(torch.float32)
    outside = idx.clone()
    outside[::2, 1] = 4
    outside[1, 0] = -1
    want, scale = experts_reference(x, outside, w, gate_up, down)
    assert rel_error(cuops.moe_experts(x, outside, w, gate_up, down), want.to(device), scale.to(device)) <= 1e-5
    want, scale = experts_reference(x, idx[:, :1], w[:, :1], gate_up, down)
    assert rel_error(cuops.moe_experts(x, idx[:, :1], w[:, :1], gate_up, down), want.to(device),
                     scale.to(device)) <= 1e-5
    empty = cuops.moe_experts(x[:0], idx[:0], w[:0], gate_up, down)
    assert empty.shape == (0, 16)


def experts_autograd_reference(x, idx, w, gate_up, down, activation="silu"):
    """The same sum as experts_reference through torch's autograd (float64), for the gradients; a pair outside
    [0, E) adds nothing."""
    inter, experts = down.shape[2], down.shape[0]
    act = F.silu if activation == "silu" else (lambda g: F.gelu(g, approximate="tanh"))
    out = torch.zeros_like(x)
    for j in range(idx.shape[1]):
        e = idx[:, j]
        valid = ((e >= 0) & (e < experts)).to(x.dtype).unsqueeze(-1)
        e = e.clamp(0, experts - 1)
        gu = torch.einsum("th,tih->ti", x, gate_up[e])
        h = act(gu[:, :inter]) * gu[:, inter:]
        out = out + valid * w[:, j:j + 1] * torch.einsum("ti,thi->th", h, down[e])
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["random", "same"])
def test_moe_experts_gradients_match_float64(device, kind):
    """Every gradient (x, the routing weights, both expert weights) of a float32 op against float64 autograd;
    an expert nobody routes to gets a zero gradient."""
    tokens, k, experts, hidden, inter = 23, 2, 5, 24, 16
    x = make((tokens, hidden), torch.float32, device)
    gate_up = make((experts, 2 * inter, hidden), torch.float32, device, scale=0.3)
    down = make((experts, hidden, inter), torch.float32, device, scale=0.3)
    idx = routing(tokens, k, experts, kind, device)
    w = torch.rand(tokens, k, device=device)
    dout = make((tokens, hidden), torch.float32, device)
    leaves = [t.clone().requires_grad_() for t in (x, w, gate_up, down)]
    cuops.moe_experts(leaves[0], idx, leaves[1], leaves[2], leaves[3]).backward(dout)
    ref = [t.detach().double().cpu().requires_grad_() for t in (x, w, gate_up, down)]
    experts_autograd_reference(ref[0], idx.cpu(), ref[1], ref[2], ref[3]).backward(dout.double().cpu())
    for name, got, want in zip(("x", "w", "gate_up", "down"), leaves, ref):
        assert got.grad.dtype == got.dtype, name
        assert rel_error(got.grad, want.grad.to(device)) <= 1e-5, name
    if kind == "same":
        assert torch.equal(leaves[2].grad[k:], torch.zeros_like(leaves[2].grad[k:]))
        assert torch.equal(leaves[3].grad[k:], torch.zeros_like(leaves[3].grad[k:]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("wanted", ["x", "w", "gate_up", "down", "all"])
def test_moe_experts_some_gradients_odd_widths(device, activation, wanted):
    """Each input's gradient alone and all together (the backward skips what is not wanted), widths that are
    no multiple of a vector (H 13, I 7), a pair outside [0, E), both activations: against float64 autograd,
    called twice (the same bits)."""
    tokens, k, experts, hidden, inter = 19, 3, 4, 13, 7
    x = make((tokens, hidden), torch.float32, device)
    gate_up = make((experts, 2 * inter, hidden), torch.float32, device, scale=0.3)
    down = make((experts, hidden, inter), torch.float32, device, scale=0.3)
    idx = routing(tokens, k, experts, "skewed", device)
    idx[2, 1] = -1
    w = torch.rand(tokens, k, device=device)
    dout = make((tokens, hidden), torch.float32, device)
    names = ("x", "w", "gate_up", "down")
    ref = [t.detach().double().cpu().requires_grad_(wanted in (n, "all")) for n, t in zip(names, (x, w, gate_up, down))]
    experts_autograd_reference(ref[0], idx.cpu(), ref[1], ref[2], ref[3], activation).backward(dout.double().cpu())
    runs = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_(wanted in (n, "all")) for n, t in zip(names, (x, w, gate_up, down))]
        cuops.moe_experts(leaves[0], idx, leaves[1], leaves[2], leaves[3], activation).backward(dout)
        runs.append([t.grad for t in leaves])
        for name, got, want in zip(names, leaves, ref):
            assert (got.grad is None) == (want.grad is None), name
            if got.grad is not None:
                assert rel_error(got.grad, want.grad.to(device)) <= 1e-5, name
    assert all(a is None and b is None or torch.equal(a, b) for a, b in zip(*runs))


@pytest.mark.parametrize("device", DEVICES)
def test_moe_experts_row_layout(device):
    """_moe_experts_fwd's layout: each expert's rows from a multiple of 128, in pair order, at most the
    host bound (T k + min(E, T k) 127, rounded up to 128, plus the last row in no expert); the spare rows
    and the last row of the gate/up products zeros; a pair outside [0, E) on the last row."""
    tokens, k, experts = 70, 3, 5
    x = make((tokens, 16), torch.float32, device)
    gate_up, down = make((experts, 12, 16), torch.float32, device), make((experts, 16, 6), torch.float32, device)
    idx = routing(tokens, k, experts, "skewed", device)
    idx[3, 1] = experts  # another rank's expert
    w = torch.rand(tokens, k, device=device)
    out, gu, rows, offs = ops._moe_experts_fwd(x, idx, w, gate_up, down, "silu")
    pairs = tokens * k
    bound = (pairs + min(experts, pairs) * 127 + 127) // 128 * 128 + 1
    assert gu.shape == (bound, 12) and rows.dtype == torch.int64 and offs.dtype == torch.int32
    assert torch.equal(out, cuops.moe_experts(x, idx, w, gate_up, down))
    rows, offs, flat = rows.cpu(), offs.cpu().long(), idx.flatten().cpu()
    assert rows[3 * k + 1] == bound - 1 and int(offs[-1]) <= bound - 1
    start = 0
    for e in range(experts):
        mine = rows[flat == e]
        assert start % 128 == 0 and torch.equal(mine, torch.arange(start, start + len(mine)))
        assert int(offs[e]) == start + (len(mine) + 127) // 128 * 128
        assert not gu[start + len(mine):int(offs[e])].any()
        start = int(offs[e])
    assert not gu[start:].any()


@requires_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("kind", ["random", "skewed", "same"])
def test_moe_experts_hopper_grouped_kernel(dtype, kind):
    """Shapes the Hopper grouped kernel takes in every product (H and 2I multiples of 128): the forward's
    gate/up (silu in its epilogue, g and u kept) and down, the backward's two row products and both weight
    gradients along k, into NaN-poisoned outputs; output and every gradient against float32 math on the same
    half inputs; the grouped kernel launched; the same bits again."""
    tokens, k, experts, hidden, inter = 300, 4, 8, 256, 192
    x = make((tokens, hidden), dtype, "cuda")
    gate_up = make((experts, 2 * inter, hidden), dtype, "cuda", scale=0.1)
    down = make((experts, hidden, inter), dtype, "cuda", scale=0.1)
    idx = routing(tokens, k, experts, kind, "cuda")
    w = torch.rand(tokens, k, device="cuda")
    dout = make((tokens, hidden), dtype, "cuda")

    def run(cast):
        leaves = [t.detach().to(cast if t is not w else w.dtype).requires_grad_() for t in (x, w, gate_up, down)]
        out = cuops.moe_experts(leaves[0], idx, leaves[1], leaves[2], leaves[3])
        out.backward(dout.to(cast))
        return [out] + [t.grad for t in leaves]

    poison_allocator()
    got = []
    names = cuda_kernels(lambda: got.extend(run(dtype)))
    assert sum("gemm_wgmma_grouped" in n for n in names) >= 6, names
    want = run(torch.float32)
    for name, g, ref in zip(("out", "x", "w", "gate_up", "down"), got, want):
        assert rel_error(g, ref) <= (4 if dtype == torch.bfloat16 else 1) * 1e-2, name
    assert all(torch.equal(a, b) for a, b in zip(run(dtype), got))


@requires_hopper
@pytest.mark.parametrize("tokens", [1, 5, 8, 16], ids=str)
@pytest.mark.parametrize("kind", ["random", "skewed", "same"])
@pytest.mark.parametrize("idx_dtype", [torch.int64, torch.int32], ids=str)
def test_moe_experts_decode_reads_the_routed_experts(tokens, kind, idx_dtype):
    """Decode-sized calls (<= 16 tokens, no gradient) on the grouped small-M kernels: against float32 math on
    the same bf16 inputs (the general path), with a token listing one expert twice (an expert's pairs past
    one slot's rows) and an index outside [0, E) (adds nothing); routing weights in float32 and (with int32
    indices) in bf16, as a bf16 router gives them; four launches and no more (routing, the two streaming
    products, the combine: no fill, no cast pass); the same bits again."""
    k, experts, hidden, inter = 8, 64, 256, 192
    x = make((tokens, hidden), torch.bfloat16, "cuda")
    gate_up = make((experts, 2 * inter, hidden), torch.bfloat16, "cuda", scale=0.1)
    down = make((experts, hidden, inter), torch.bfloat16, "cuda", scale=0.1)
    idx = routing(tokens, k, experts, kind, "cuda", idx_dtype).clone()
    idx[0, 1] = idx[0, 0]
    idx[-1, 2] = experts
    w = torch.rand(tokens, k, device="cuda", dtype=torch.float32 if idx_dtype == torch.int64 else torch.bfloat16)
    got = []
    names = launched(lambda: got.append(cuops.moe_experts(x, idx, w, gate_up, down)))
    assert names is None or (len(names) == 4 and "decode_route" in names[0] and "moe_combine" in names[3]
                             and sum("gemm_skinny_tma_grouped" in n for n in names) == 2), names
    want = cuops.moe_experts(x.float(), idx, w.float(), gate_up.float(), down.float())
    assert rel_error(got[0], want) <= 1e-2
    assert torch.equal(cuops.moe_experts(x, idx, w, gate_up, down), got[0])


@requires_hopper
def test_moe_experts_decode_replays_in_a_cuda_graph():
    """The decode path captured once: replays with new tokens and new routing give eager's bits (nothing
    sized or read on the host)."""
    tokens, k, experts, hidden, inter = 4, 8, 64, 256, 192
    gate_up = make((experts, 2 * inter, hidden), torch.bfloat16, "cuda", scale=0.1)
    down = make((experts, hidden, inter), torch.bfloat16, "cuda", scale=0.1)
    x = make((tokens, hidden), torch.bfloat16, "cuda")
    idx, w = routing(tokens, k, experts, "random", "cuda"), torch.rand(tokens, k, device="cuda")
    cuops.moe_experts(x, idx, w, gate_up, down)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = cuops.moe_experts(x, idx, w, gate_up, down)
    x.copy_(make((tokens, hidden), torch.bfloat16, "cuda"))
    idx.copy_(routing(tokens, k, experts, "skewed", "cuda"))
    graph.replay()
    assert torch.equal(out, cuops.moe_experts(x, idx, w, gate_up, down))


@pytest.mark.parametrize("device", DEVICES)
def test_moe_experts_gradcheck_float64(device):
    x = make((7, 6), torch.float64, device).requires_grad_()
    gate_up = make((3, 8, 6), torch.float64, device).requires_grad_()
    down = make((3, 6, 4), torch.float64, device).requires_grad_()
    idx = routing(7, 2, 3, "random", device)
    w = torch.rand(7, 2, dtype=torch.float64, device=device).requires_grad_()
    for activation in ("silu", "gelu_tanh"):
        assert torch.autograd.gradcheck(
            lambda x, w, gu, d: cuops.moe_experts(x, idx, w, gu, d, activation), (x, w, gate_up, down))


@pytest.mark.parametrize("device", DEVICES)
def test_moe_experts_repeats_bitwise(device):
    """The same routing, the same bits, output and every gradient, over repeated calls."""
    x = make((64, 32), torch.bfloat16, device)
    gate_up = make((8, 48, 32), torch.bfloat16, device, scale=0.3)
    down = make((8, 32, 24), torch.bfloat16, device, scale=0.3)
    idx, w = routing(64, 4, 8, "skewed", device), torch.rand(64, 4, device=device)
    dout = make((64, 32), torch.bfloat16, device)

    def run():
        leaves = [t.clone().requires_grad_() for t in (x, w, gate_up, down)]
        out = cuops.moe_experts(leaves[0], idx, leaves[1], leaves[2], leaves[3])
        out.backward(dout)
        return [out] + [t.grad for t in leaves]

    first = run()
    for _ in range(3):
        assert all(torch.equal(a, b) for a, b in zip(run(), first))


@pytest.mark.parametrize("device", DEVICES)
def test_moe_experts_matches_hugging_face_qwen3_moe(device):
    """Against transformers' own Qwen3MoeExperts (its eager loop) in float32: output and every gradient."""
    pytest.importorskip("transformers")
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts
    config = Qwen3MoeConfig(hidden_size=32, moe_intermediate_size=24, num_experts=8, num_experts_per_tok=3)
    config._experts_implementation = "eager"
    module = Qwen3MoeExperts(config).to(device)
    with torch.no_grad():
        module.gate_up_proj.normal_(0, 0.2)
        module.down_proj.normal_(0, 0.2)
    x = make((41, 32), torch.float32, device).requires_grad_()
    idx, w = routing(41, 3, 8, "skewed", device), torch.rand(41, 3, device=device).requires_grad_()
    dout = make((41, 32), torch.float32, device)
    want = module(x, idx, w)
    want_grads = torch.autograd.grad(want, (x, w, module.gate_up_proj, module.down_proj), dout)
    got = cuops.moe_experts(x, idx, w, module.gate_up_proj, module.down_proj)
    grads = torch.autograd.grad(got, (x, w, module.gate_up_proj, module.down_proj), dout)
    assert rel_error(got, want.detach()) <= 1e-5
    for name, g, h in zip(("x", "w", "gate_up", "down"), grads, want_grads):
        assert rel_error(g, h) <= 1e-5, name


@pytest.mark.parametrize("device", DEVICES)
def test_moe_experts_errors_name_op_argument_and_values(device):
    f32 = dict(dtype=torch.float32, device=device)
    x, idx, w = torch.ones(4, 8, **f32), torch.zeros(4, 2, dtype=torch.long, device=device), torch.ones(4, 2, **f32)
    gu, d = torch.ones(3, 10, 8, **f32), torch.ones(3, 8, 5, **f32)
    cases = [
        ((x.view(2, 2, 8), idx, w, gu, d), "expected x to be 2-D"),
        ((x, idx.float(), w, gu, d), "expected topk_idx to have dtype int32 or int64, got float32"),
        ((x, idx, w[:, :1], gu, d), "expected topk_w to have the shape of topk_idx [4, 2], got [4, 1]"),
        ((x, idx[:3], w[:3], gu, d), "a row per token"),
        ((x, idx, w, torch.ones(3, 10, 7, **f32), d), "expected gate_up"),
        ((x, idx, w, gu, torch.ones(3, 8, 4, **f32)), "expected down"),
        ((x, idx, w, gu, d.double()), "expected down to have the dtype of x"),
        ((x, idx, w, gu, d, "relu"), "expected activation to be one of silu, gelu_tanh, got 'relu'"),
    ]
    for args, message in cases:
        with pytest.raises(RuntimeError, match="cuops::moe_experts: .*" + re.escape(message)):
            cuops.moe_experts(*args)


@pytest.mark.parametrize("device", DEVICES)
def test_moe_opcheck(device):
    offs = ends([3, 0, 4], device)
    a, b = make((9, 6), torch.float32, device), make((3, 6, 5), torch.float32, device)
    torch.library.opcheck(ops.grouped_mm, (a.requires_grad_(), b.requires_grad_(), offs))
    torch.library.opcheck(ops.grouped_mm, (make((4, 9), torch.float32, device), make((9, 5), torch.float32, device),
                                           offs))
    torch.library.opcheck(ops.moe_topk_softmax, (make((5, 6), torch.float32, device).requires_grad_(), 2, True))
    x, gu, d = (make((7, 8), torch.float32, device), make((3, 10, 8), torch.float32, device),
                make((3, 8, 5), torch.float32, device))
    idx, w = routing(7, 2, 3, "random", device), torch.rand(7, 2, device=device)
    leaves = tuple(t.requires_grad_() for t in (x, w, gu, d))
    torch.library.opcheck(ops.moe_experts, (leaves[0], idx, leaves[1], leaves[2], leaves[3]))
    torch.library.opcheck(ops._moe_experts_fwd, (x.detach(), idx, w.detach(), gu.detach(), d.detach(), "silu"))


@pytest.mark.parametrize("device", DEVICES)
def test_moe_layer_compiles_without_graph_breaks(device):
    """A router and experts as a model's MoE block would call them, fullgraph through the ops' fake kernels and
    autograd (aot_eager); the same output and gradients as eager."""
    x = make((2, 9, 16), torch.float32, device).requires_grad_()
    router = make((6, 16), torch.float32, device).requires_grad_()
    gu, d = make((6, 20, 16), torch.float32, device).requires_grad_(), make((6, 16, 10), torch.float32,
                                                                           device).requires_grad_()

    def block(x, router, gu, d):
        flat = x.view(-1, 16)
        w, idx = cuops.moe_topk_softmax(F.linear(flat, router), 2, True)
        return cuops.moe_experts(flat, idx, w, gu, d).view_as(x)

    leaves = (x, router, gu, d)
    want = block(*leaves)
    want_grads = torch.autograd.grad(want.square().sum(), leaves)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    got = compiled(*leaves)
    grads = torch.autograd.grad(got.square().sum(), leaves)
    assert torch.equal(got, want)
    for g, h in zip(grads, want_grads):
        assert torch.equal(g, h)
