"""cuops.linear_cross_entropy (docs/ops.md#linear_cross_entropy): F.cross_entropy of F.linear's logits
without holding them, against a float64 reference: every reduction, a softcap, ignore_index, all tokens ignored,
out-of-range targets, gradients, gradcheck, several vocabulary chunks, errors, Meta, opcheck,
torch.compile; autocast, CUDA graphs and the memory bound on CUDA."""
import pytest
import torch
import torch.nn.functional as F

import cuops
from conftest import (DEVICES, DEVICES_CPU_IN_CI, DTYPES, HALF_TOL, REDUCTION_TOL, make, ops, rel_error,
                      requires_caching_allocator, requires_cuda)

REDUCTIONS = ["mean", "sum", "none"]


def tolerance(dtype, device):
    """The input dtype's bound: CUDA rounds each chunk's logits to x's dtype (as F.linear does) and the
    gradient tiles before their products; the CPU computes in the accumulation type."""
    base = HALF_TOL.get(dtype, REDUCTION_TOL[dtype])
    return 3 * base if device == "cuda" else 1.5 * base


def reference(x, w, target, b=None, ignore_index=-100, reduction="mean", softcap=None):
    """The float64 loss and gradients of x, w (and b) for the same inputs (softcap: the logits as Gemma 2
    caps them, z / c, tanh, times c)."""
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_() if b is not None else None
    logits = F.linear(x64, w64, b64)
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    loss = F.cross_entropy(logits.flatten(0, -2), target.flatten(), ignore_index=ignore_index,
                           reduction=reduction)
    loss = loss.view(target.shape) if reduction == "none" else loss
    grads = torch.autograd.grad(loss.sum(), [x64, w64] + ([b64] if b is not None else []))
    return loss, grads


def targets(shape, vocab, device, ignore_index=-100, ignored=3):
    t = torch.randint(0, vocab, shape, device=device)
    t.view(-1)[:ignored] = ignore_index
    return t


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
def test_loss_and_gradients_match_float64(device, dtype, reduction, with_bias):
    # Leading dims, odd K and V, x every other row of a wider tensor, some tokens ignored.
    x = make((2, 6, 37), dtype, device, "sliced")[:, ::2].requires_grad_()
    w = make((29, 37), dtype, device, scale=37 ** -0.5).requires_grad_()
    b = make((29,), dtype, device).requires_grad_() if with_bias else None
    t = targets((2, 3), 29, device)
    loss = cuops.linear_cross_entropy(x, w, t, b, reduction=reduction)
    acc = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    assert loss.dtype == acc and loss.shape == (t.shape if reduction == "none" else ())
    want, grads = reference(x, w, t, b, reduction=reduction)
    tol = tolerance(dtype, device)
    assert rel_error(loss, want) <= tol
    got = torch.autograd.grad(loss.sum(), [x, w] + ([b] if with_bias else []))
    for g, r in zip(got, grads):
        assert g.dtype == dtype and g.shape == r.shape
        assert rel_error(g, r) <= 2 * tol


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_softcap_matches_float64(device, dtype, reduction):
    """softcap c: the logits read as c tanh(z / c) (Gemma 2 / 3's final_logit_softcapping), with a bias,
    ignored tokens, logits scaled up so the cap bends them (|z| up to ~3c); the loss and every gradient
    against float64, and the uncapped loss differs."""
    x = make((2, 6, 37), dtype, device, "sliced")[:, ::2].requires_grad_()
    w = make((29, 37), dtype, device, scale=3 * 37 ** -0.5).requires_grad_()
    b = make((29,), dtype, device).requires_grad_()
    t = targets((2, 3), 29, device)
    cap = 1.5
    loss = cuops.linear_cross_entropy(x, w, t, b, reduction=reduction, softcap=cap)
    want, grads = reference(x, w, t, b, reduction=reduction, softcap=cap)
    tol = tolerance(dtype, device)
    assert rel_error(loss, want) <= tol
    for g, r in zip(torch.autograd.grad(loss.sum(), [x, w, b]), grads):
        assert g.dtype == dtype and rel_error(g, r) <= 2 * tol
    assert rel_error(reference(x, w, t, b, reduction=reduction)[0], want) > 10 * tol
    x64, w64, b64 = (v.detach().double().requires_grad_() for v in (make((3, 7), torch.float64, device),
                                                                     make((5, 7), torch.float64, device), b[:5]))
    t64 = torch.tensor([0, -100, 4], device=device)
    assert torch.autograd.gradcheck(
        lambda *a: cuops.linear_cross_entropy(*a[:2], t64, a[2], reduction=reduction, softcap=0.8), (x64, w64, b64))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_gradcheck_float64(device, reduction):
    x = make((3, 2, 7), torch.float64, device).requires_grad_()
    w = make((5, 7), torch.float64, device).requires_grad_()
    b = make((5,), torch.float64, device).requires_grad_()
    t = torch.tensor([[0, 4], [-100, 2], [3, 3]], device=device)
    assert torch.autograd.gradcheck(lambda *a: cuops.linear_cross_entropy(a[0], a[1], t, a[2], reduction=reduction),
                                    (x, w, b))
    t2 = t.clamp(min=0)  # ignore_index 2 instead: -100 would be out of range
    assert torch.autograd.gradcheck(lambda x, w: cuops.linear_cross_entropy(x, w, t2, None, 2, reduction), (x, w))


@pytest.mark.parametrize("device", DEVICES)
def test_ignore_index_and_every_token_ignored(device):
    x = make((4, 5), torch.float32, device).requires_grad_()
    w = make((6, 5), torch.float32, device).requires_grad_()
    t = torch.tensor([1, 7, 7, 2], device=device)
    for reduction in REDUCTIONS:
        got = cuops.linear_cross_entropy(x, w, t, None, 7, reduction)
        want, _ = reference(x, w, t, None, 7, reduction)
        assert rel_error(got, want) <= tolerance(torch.float32, device)
    every = torch.full((4,), -100, device=device)
    assert torch.isnan(cuops.linear_cross_entropy(x, w, every))  # 0 / 0, as F.cross_entropy
    assert cuops.linear_cross_entropy(x, w, every, reduction="sum").item() == 0
    loss = cuops.linear_cross_entropy(x, w, every, reduction="none")
    assert torch.equal(loss, torch.zeros(4, device=device))
    dx, dw = torch.autograd.grad(loss.sum(), [x, w])
    assert torch.equal(dx, torch.zeros_like(x)) and torch.equal(dw, torch.zeros_like(w))


def test_out_of_range_target_is_an_error_on_the_cpu():
    x, w = make((4, 5), torch.float32, "cpu"), make((6, 5), torch.float32, "cpu")
    for bad in (6, -1):
        t = torch.tensor([0, 1, bad, 2])
        with pytest.raises(RuntimeError, match=rf"^cuops::linear_cross_entropy: target {bad} of token 2 out of "
                                               r"range \[0, 6\) \(ignore_index -100\)"):
            cuops.linear_cross_entropy(x, w, t)


@requires_cuda
def test_out_of_range_target_is_nan_on_cuda():
    x = make((4, 5), torch.float32, "cuda").requires_grad_()
    w = make((6, 5), torch.float32, "cuda").requires_grad_()
    t = torch.tensor([0, 1, 6, 2], device="cuda")
    loss = cuops.linear_cross_entropy(x, w, t, reduction="none")
    assert torch.isnan(loss[2]) and not torch.isnan(loss[[0, 1, 3]]).any()
    assert torch.isnan(cuops.linear_cross_entropy(x, w, t))
    dx, _ = torch.autograd.grad(loss.nansum(), [x, w])
    assert torch.isnan(dx[2]).all() and not torch.isnan(dx[[0, 1, 3]]).any()


@pytest.mark.parametrize("device", DEVICES)
def test_several_vocabulary_chunks(device):
    """Enough tokens that a chunk holds 64 columns (256 MiB over 2^18 rows of 16-byte elements): the
    vocabulary of 150 in three chunks, the last partial; the running max and sum carry across them."""
    rows, vocab = 1 << 18, 150
    x = make((rows, 3), torch.float32, device).requires_grad_()
    w = make((vocab, 3), torch.float32, device, scale=3.0).requires_grad_()
    t = targets((rows,), vocab, device, ignored=1000)
    for reduction in ("mean", "sum"):
        loss = cuops.linear_cross_entropy(x, w, t, reduction=reduction)
        want, grads = reference(x, w, t, reduction=reduction)
        assert rel_error(loss, want) <= tolerance(torch.float32, device)
        # dweight sums 2^18 tokens in float32: its rounding grows as the sum's length's root past the
        # table's 4096.
        for g, r in zip(torch.autograd.grad(loss, [x, w]), grads):
            assert rel_error(g, r) <= 2 * tolerance(torch.float32, device) * (rows / 4096) ** 0.5


@pytest.mark.parametrize("device", DEVICES)
def test_empty_sizes(device):
    w = make((6, 5), torch.float32, device)
    x0, t0 = make((0, 5), torch.float32, device).requires_grad_(), torch.empty(0, dtype=torch.long, device=device)
    assert torch.isnan(cuops.linear_cross_entropy(x0, w, t0))
    assert cuops.linear_cross_entropy(x0, w, t0, reduction="none").shape == (0,)
    loss = cuops.linear_cross_entropy(x0, w.requires_grad_(), t0, reduction="sum")
    dx, dw = torch.autograd.grad(loss, [x0, w])
    assert dx.shape == (0, 5) and torch.equal(dw, torch.zeros_like(w))
    # K = 0: every logit is the bias.
    xk, wk, b = make((3, 0), torch.float32, device), make((6, 0), torch.float32, device), make((6,), torch.float32, device)
    t = torch.tensor([0, 5, 2], device=device)
    want = F.cross_entropy(b.expand(3, 6), t)
    assert rel_error(cuops.linear_cross_entropy(xk, wk, t, b), want) <= 1e-6
    # V = 0: only ignored targets are valid; a sum over them is 0 with zero gradients.
    xv, wv = make((3, 5), torch.float32, device).requires_grad_(), make((0, 5), torch.float32, device)
    ignored = torch.full((3,), -100, device=device)
    loss = cuops.linear_cross_entropy(xv, wv.requires_grad_(), ignored, reduction="sum")
    dx, dw = torch.autograd.grad(loss, [xv, wv])
    assert loss.item() == 0 and torch.equal(dx, torch.zeros_like(xv)) and dw.shape == (0, 5)
    assert torch.equal(cuops.linear_cross_entropy(xv, wv, ignored, reduction="none"), torch.zeros(3, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs_name_the_op_and_argument(device):
    x, w = make((4, 5), torch.float32, device), make((6, 5), torch.float32, device)
    t = torch.tensor([0, 1, 2, 3], device=device)
    cases = [
        ((x, w, t.int()), r"expected target to be int64, got int32"),
        ((x, w, t[:3]), r"expected target shaped like x's leading dimensions, got x \[4, 5\] and target \[3\]"),
        ((x, make((6, 4), torch.float32, device), t), r"expected weight \[V, K\] to share K with x's last"),
        ((x, w, t, make((5,), torch.float32, device)), r"expected bias of shape \[6\]"),
        ((x, w.double(), t), r"expected weight to have the dtype of x \(float32\), got float64"),
    ]
    for args, message in cases:
        with pytest.raises(RuntimeError, match=r"^cuops::linear_cross_entropy: " + message):
            cuops.linear_cross_entropy(*args)
    with pytest.raises(RuntimeError, match=r"^cuops::linear_cross_entropy: expected reduction to be one of none, "
                                           r"mean, sum, got 'avg'"):
        cuops.linear_cross_entropy(x, w, t, reduction="avg")
    for cap in (0.0, -2.0, float("inf"), float("nan")):
        with pytest.raises(RuntimeError, match=r"^cuops::linear_cross_entropy: expected softcap > 0 and finite "
                                               r"\(or None\), got"):
            cuops.linear_cross_entropy(x, w, t, softcap=cap)


@pytest.mark.parametrize("device", DEVICES)
def test_same_bits_on_every_run(device):
    x = make((64, 48), torch.bfloat16, device).requires_grad_()
    w = make((300, 48), torch.bfloat16, device).requires_grad_()
    t = targets((64,), 300, device)
    runs = []
    for _ in range(3):
        loss = cuops.linear_cross_entropy(x, w, t)
        runs.append((loss,) + torch.autograd.grad(loss, [x, w]))
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other))


@requires_cuda
def test_several_token_chunks_on_cuda():
    """CUDA walks the tokens in chunks whose logits fit 480 MiB and 1/8 of the float32 logits: at
    V = 65539 (rows padded to 65544 for 16-byte vectors) 1024 bf16 rows, so 4100 tokens take five
    chunks, the last of 4 rows; dweight adds each chunk's share to the ones before. Forward with
    gradients (mean, sum) and the backward that makes the logits again (none), with a bias and
    ignored tokens, against float64."""
    tokens, k, vocab = 4100, 40, 65539
    x = make((tokens, k), torch.bfloat16, "cuda").requires_grad_()
    w = make((vocab, k), torch.bfloat16, "cuda", scale=k ** -0.5).requires_grad_()
    b = make((vocab,), torch.bfloat16, "cuda").requires_grad_()
    t = targets((tokens,), vocab, "cuda", ignored=300)
    tol = tolerance(torch.bfloat16, "cuda")
    for reduction in REDUCTIONS:
        loss = cuops.linear_cross_entropy(x, w, t, b, reduction=reduction)
        want, grads = reference(x, w, t, b, reduction=reduction)
        assert rel_error(loss, want) <= tol, reduction
        for g, r in zip(torch.autograd.grad(loss.sum(), [x, w, b]), grads):
            assert rel_error(g, r) <= 2 * tol, reduction
        del want, grads
        torch.cuda.empty_cache()
    # A softcap in the pass (both reads of a row, vectors and the scalar tail), small enough to bend.
    for reduction in ("mean", "none"):
        loss = cuops.linear_cross_entropy(x, w, t, b, reduction=reduction, softcap=0.5)
        want, grads = reference(x, w, t, b, reduction=reduction, softcap=0.5)
        assert rel_error(loss, want) <= tol, reduction
        for g, r in zip(torch.autograd.grad(loss.sum(), [x, w, b]), grads):
            assert rel_error(g, r) <= 2 * tol, reduction
        del want, grads
        torch.cuda.empty_cache()


@requires_cuda
@requires_caching_allocator
@pytest.mark.parametrize("vocab", [32000, 128256])
def test_the_chunk_takes_at_most_an_eighth_of_the_float32_logits(vocab):
    """What a training call adds over its inputs and results: at most 1/8 of the float32 logits
    [T, V] at every V (the chunk), or the 480 MiB cap where that is less (V = 128256), plus the
    products' workspace. At V = 32000 the chunk used to take 500 MB under the cap alone."""
    tokens, k = 8192, 64
    x = make((tokens, k), torch.bfloat16, "cuda").requires_grad_()
    w = make((vocab, k), torch.bfloat16, "cuda", scale=k ** -0.5).requires_grad_()
    t = targets((tokens,), vocab, "cuda")
    results = (x.numel() + w.numel()) * 2 + 64  # dx and dweight, made in the forward; the loss
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    loss = cuops.linear_cross_entropy(x, w, t)
    torch.cuda.synchronize()
    added = torch.cuda.max_memory_allocated() - before - results
    bound = min(tokens * vocab * 4 // 8, 480 << 20) + (20 << 20)  # + a split tail's workspace, [T] vectors
    assert added <= bound, (vocab, added, bound)
    assert added >= min(tokens * vocab * 4 // 8, 480 << 20) // 2, (vocab, added)  # the chunk was measured
    del loss


@pytest.mark.parametrize("device", DEVICES)
def test_backward_twice_through_a_kept_graph(device):
    """The gradients made in the forward are scaled in place only where the graph is not kept: a
    retained graph gives the same gradients to every backward, for any gradient of the loss."""
    x = make((9, 12), torch.float32, device).requires_grad_()
    w = make((20, 12), torch.float32, device).requires_grad_()
    t = targets((9,), 20, device, ignored=2)
    loss = cuops.linear_cross_entropy(x, w, t)
    first = torch.autograd.grad(loss, [x, w], retain_graph=True)
    twice = torch.autograd.grad(loss, [x, w], grad_outputs=torch.tensor(2.0, device=device), retain_graph=True)
    last = torch.autograd.grad(loss, [x, w])
    _, grads = reference(x, w, t)
    for f, s2, l, r in zip(first, twice, last, grads):
        assert torch.equal(f, l) and torch.equal(2 * f, s2)
        assert rel_error(f, r) <= tolerance(torch.float32, device)
    # Scaled in place (the graph not kept) by a gradient other than 1.
    half = torch.autograd.grad(cuops.linear_cross_entropy(x, w, t) * 0.5, [x, w])
    for f, h in zip(first, half):
        assert torch.equal(0.5 * f, h)


@pytest.mark.parametrize("device", DEVICES)
def test_a_frozen_input_gets_no_gradient_made(device):
    """The forward makes only the gradients asked for: a frozen head (weight without grad) gives dx and
    the bias's gradient alone, a frozen x the weight's; each matches float64."""
    x = make((33, 24), torch.bfloat16, device)
    w = make((70, 24), torch.bfloat16, device, scale=24 ** -0.5)
    b = make((70,), torch.bfloat16, device)
    t = targets((33,), 70, device)
    _, grads = reference(x, w, t, b, reduction="sum")
    tol = 2 * tolerance(torch.bfloat16, device)
    inputs = (x, w, b)
    for wanted in ((0, 2), (1,), (0,)):
        for i, v in enumerate(inputs):
            v.requires_grad_(i in wanted)
        loss = cuops.linear_cross_entropy(x, w, t, b, reduction="sum")
        got = torch.autograd.grad(loss, [inputs[i] for i in wanted])
        for g, i in zip(got, wanted):
            assert rel_error(g, grads[i]) <= tol, wanted


def test_meta_shapes_and_dtypes():
    x, w = torch.empty(2, 3, 5, device="meta", dtype=torch.bfloat16), torch.empty(7, 5, device="meta",
                                                                                 dtype=torch.bfloat16)
    t = torch.empty(2, 3, dtype=torch.long, device="meta")
    loss = cuops.linear_cross_entropy(x, w, t)
    assert loss.shape == () and loss.dtype == torch.float32 and loss.device.type == "meta"
    assert cuops.linear_cross_entropy(x, w, t, reduction="none").shape == (2, 3)
    loss, lse = ops._linear_cross_entropy_fwd(x, w, t, None, -100, "sum")
    assert lse.shape == (6,) and lse.dtype == torch.float32
    dx, dw, db = ops._linear_cross_entropy_bwd(loss, x, w, t, None, lse, -100, "sum")
    assert dx.shape == x.shape and dw.shape == w.shape and db.shape == (7,) and dx.dtype == torch.bfloat16
    loss, dx, dw, db = ops._linear_cross_entropy_fwd_grad(x, w, t, None, -100, "mean", [True, True, True])
    assert loss.shape == () and loss.dtype == torch.float32 and dx.shape == x.shape and dw.shape == w.shape
    assert db.shape == (7,) and dw.dtype == torch.bfloat16
    _, dx, dw, db = ops._linear_cross_entropy_fwd_grad(x, w, t, None, -100, "sum", [True, False, False])
    assert dx.shape == x.shape and dw.shape == db.shape == (0,)
    with pytest.raises(RuntimeError, match="_linear_cross_entropy_fwd_grad: expected reduction mean or sum"):
        ops._linear_cross_entropy_fwd_grad(x, w, t, None, -100, "none", [True, True, True])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_opcheck(device, dtype):
    x, w, b = make((6, 5), dtype, device), make((7, 5), dtype, device), make((7,), dtype, device)
    t = torch.tensor([0, 6, -100, 3, 3, 1], device=device)
    for reduction in REDUCTIONS:
        torch.library.opcheck(ops.linear_cross_entropy, (x.requires_grad_(), w, t, b, -100, reduction))
    loss, lse = ops._linear_cross_entropy_fwd(x.detach(), w, t, b, -100, "mean")
    torch.library.opcheck(ops._linear_cross_entropy_fwd, (x.detach(), w, t, b, -100, "mean"))
    torch.library.opcheck(ops._linear_cross_entropy_bwd, (loss, x.detach(), w, t, b, lse, -100, "mean"))
    for reduction, mask in (("mean", [True, True, True]), ("sum", [False, True, False])):
        torch.library.opcheck(ops._linear_cross_entropy_fwd_grad, (x.detach(), w, t, b, -100, reduction, mask))
    torch.library.opcheck(ops.linear_cross_entropy, (x.requires_grad_(), w, t, b, -100, "sum", 2.0))
    torch.library.opcheck(ops._linear_cross_entropy_bwd, (loss, x.detach(), w, t, b, lse, -100, "mean", 2.0))


@pytest.mark.parametrize("device", DEVICES_CPU_IN_CI)
def test_compile_fullgraph(device):
    torch._dynamo.reset()
    x = make((2, 8, 16), torch.float32, device).requires_grad_()
    w = make((40, 16), torch.float32, device).requires_grad_()
    t = targets((2, 8), 40, device)

    def f(x, w, t):
        return cuops.linear_cross_entropy(x * 2, w, t)

    explanation = torch._dynamo.explain(f)(x, w, t)
    assert explanation.graph_break_count == 0
    compiled = torch.compile(f, fullgraph=True)
    got, want = compiled(x, w, t), f(x, w, t)
    torch.testing.assert_close(got, want)
    for a, b in zip(torch.autograd.grad(got, [x, w]), torch.autograd.grad(want, [x, w])):
        torch.testing.assert_close(a, b)
    torch._dynamo.reset()


@requires_cuda
def test_autocast_float32_master_weight():
    x = make((16, 32), torch.float32, "cuda").requires_grad_()
    w = make((50, 32), torch.float32, "cuda").requires_grad_()
    t = targets((16,), 50, "cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = cuops.linear_cross_entropy(x, w, t)
    assert loss.dtype == torch.float32
    want, grads = reference(x.bfloat16(), w.bfloat16(), t)
    assert rel_error(loss, want) <= tolerance(torch.bfloat16, "cuda")
    dx, dw = torch.autograd.grad(loss, [x, w])
    assert dx.dtype == dw.dtype == torch.float32
    assert rel_error(dw, grads[1]) <= 2 * tolerance(torch.bfloat16, "cuda")


@requires_cuda
def test_cuda_graph_capture():
    x, w = make((64, 32), torch.bfloat16, "cuda"), make((100, 32), torch.bfloat16, "cuda")
    t = targets((64,), 100, "cuda")
    want = cuops.linear_cross_entropy(x, w, t)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        cuops.linear_cross_entropy(x, w, t)  # warm-up on a side stream, as CUDA graphs ask
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = cuops.linear_cross_entropy(x, w, t)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)


@requires_cuda
@requires_caching_allocator
def test_memory_beyond_inputs_and_gradients_is_bounded():
    """SPEC §1b: at T = 8192, V = 128256 (K = 256 to keep the test short) forward + backward allocate at
    most 1/8 of the float32 logits' bytes (526 MB) beyond the inputs and the gradients they return."""
    tokens, k, vocab = 8192, 256, 128256
    x = make((tokens, k), torch.bfloat16, "cuda").requires_grad_()
    w = make((vocab, k), torch.bfloat16, "cuda", scale=k ** -0.5).requires_grad_()
    t = targets((tokens,), vocab, "cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    loss = cuops.linear_cross_entropy(x, w, t)
    dx, dw = torch.autograd.grad(loss, [x, w])
    torch.cuda.synchronize()
    returned = dx.numel() * dx.element_size() + dw.numel() * dw.element_size()
    added = torch.cuda.max_memory_allocated() - before - returned
    assert added <= tokens * vocab * 4 // 8, f"{added / 2**20:.0f} MiB beyond the inputs and gradients"
