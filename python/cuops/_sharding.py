"""DTensor sharding rules for the cuops operators (tensor parallelism; issue 25).

Each rule lists, for one mesh dimension, the placements an op accepts and what its output then is;
DTensor expands them over every dimension of the mesh and redistributes inputs to the cheapest one.
Registered by `import cuops` (register() below, idempotent), so `parallelize_module` with
ColwiseParallel / RowwiseParallel runs cuops Linears as it runs aten's.

two_norm of sharded inputs never gathers them: each process takes the norm of its shards and the
result is a pending 2-norm reduction (DTensor's _NormPartial(2), the placement torch's own
linalg_vector_norm rule uses: squares, an all-reduce sum, a root, when the value is needed). That
placement is private to torch; where it is missing, two_norm accepts replicated inputs only.

add2 and gemm write into their first argument c, so c's placement is fixed: DTensor may redistribute a
and b (copies, which the op only reads) but never c, whose redistributed copy would take the write and
be dropped. register_sharding cannot say that: it treats an op as in place only when its name ends in
"_" (OpSchema.is_inplace_op), so for add2/gemm (mutation declared by the schema's `Tensor(a!)`) it
picks the cheapest strategy over all three arguments and may move c; add2 of a Replicate c with
Shard(0) a and b, registered that way, left c unchanged and raised nothing. torch's own in-place ops
(add_, mul_, ...) get the check through a private argument (expand_to_full_mesh_op_strategy's
inplace_op). So these two ops take torch's public `torch.library.register_torch_dispatch(op, DTensor,
fn)` instead: fn (_inplace() below) reads, on each mesh dimension, the rule entries whose c placement
is c's own, takes the one that moves fewest of a and b (ties: the first listed), redistributes a and b
to it (a move into a Partial, which DTensor.redistribute keeps internal, by hand: _local_as), and runs
the op on the local tensors; c's local tensor is written as it is. A c placement no
entry has raises RuntimeError ("cuops::<op>: ...") before anything runs. Global shapes and dtypes are
checked first, by the op's Meta kernel on the global shapes (local shapes of wrongly shaped tensors
can agree), and an input sharing c's memory may not move. The choice between entries is a count,
not DTensor's communication-cost model (private).
"""
from __future__ import annotations

import torch

_registered = False


def register() -> bool:
    """Registers the rules with DTensor once; False where this torch has no DTensor."""
    global _registered
    if _registered:
        return True
    try:
        from torch.distributed.tensor import Partial, Replicate, Shard
        from torch.distributed.tensor.experimental import register_sharding
    except ImportError:
        return False
    ops = torch.ops.cuops

    @register_sharding(ops.mm.default)
    def mm_rule(a, b):
        # c = a @ b: rows of a give rows of c, columns of b columns of c; a's columns with b's rows
        # (k split) give partial sums of c (reduced when something needs c whole).
        return [
            ([Replicate()], [Replicate(), Replicate()]),
            ([Shard(0)], [Shard(0), Replicate()]),
            ([Shard(1)], [Replicate(), Shard(1)]),
            ([Partial()], [Shard(1), Shard(0)]),
        ]

    def elementwise(x, linear, extra=()):
        # A pointwise op keeps any sharding of its (equal-shape) inputs; a linear one also keeps
        # partial sums (sum of f(x_i) = f(sum of x_i)).
        n = len(x) if isinstance(x, tuple) else 1
        rules = [([Replicate()], [Replicate()] * n + list(extra))]
        ndim = (x[0] if isinstance(x, tuple) else x).ndim
        rules += [([Shard(d)], [Shard(d)] * n + list(extra)) for d in range(ndim)]
        if linear:
            rules.append(([Partial()], [Partial()] * n + list(extra)))
        return rules

    @register_sharding(ops.vector_add.default)
    def vector_add_rule(a, b):
        return elementwise((a, b), linear=True)

    @register_sharding(ops.scale.default)
    def scale_rule(x, alpha=2.0):
        return elementwise(x, linear=True, extra=(None,))

    @register_sharding(ops.square.default)
    def square_rule(x):
        return elementwise(x, linear=False)

    def linear_entries(x, outputs, weights, bias, partial_ok, gate=False):
        # The fused linear ops, as ColwiseParallel shards nn.Linear: x's rows (any leading dim), or
        # the weights' rows (output columns: each shard applies the epilogue to its own columns),
        # everything else replicated. x's K with the weights' K gives partial sums, which an
        # activation or a bias must not see: that entry exists only without them (elsewhere DTensor
        # redistributes K first). Inputs: x, the weights, then for linear the bias (`bias`: whether
        # one is given) and the activation string; for swiglu (`gate`) its activation string.
        def entry(out, px, pw, pb):
            tail = ([] if bias is None else [pb if bias else None, None]) + ([None] if gate else [])
            return [out] * outputs, [px] + [pw] * weights + tail

        last = x.ndim - 1
        rules = [entry(Replicate(), Replicate(), Replicate(), Replicate())]
        rules += [entry(Shard(d), Shard(d), Replicate(), Replicate()) for d in range(last)]
        rules.append(entry(Shard(last), Replicate(), Shard(0), Shard(0)))
        if partial_ok:
            rules.append(entry(Partial(), Shard(last), Shard(1), None))
        return rules

    @register_sharding(ops.linear.default)
    def linear_rule(x, weight, bias=None, activation="none"):
        return linear_entries(x, 1, 1, bias is not None, activation == "none" and bias is None)

    @register_sharding(ops._linear_fwd.default)
    def linear_fwd_rule(x, weight, bias, activation):
        return linear_entries(x, 2, 1, bias is not None, False)  # (y, pre): an activation follows

    @register_sharding(ops._linear_act_bwd.default)
    def linear_act_bwd_rule(dy, pre, activation):
        # dz keeps dy's sharding; the bias gradient (column sums) is sharded with the columns, and
        # partial over sharded rows.
        return [([Replicate(), Replicate()], [Replicate(), Replicate(), None]),
                ([Shard(0), Partial()], [Shard(0), Shard(0), None]),
                ([Shard(1), Shard(0)], [Shard(1), Shard(1), None])]

    @register_sharding(ops.swiglu.default)
    def swiglu_rule(x, w_gate, w_up, activation="silu"):
        return linear_entries(x, 1, 2, None, False, gate=True)  # act(g) * u: never on partial sums

    @register_sharding(ops._swiglu_fwd.default)
    def swiglu_fwd_rule(x, w_gate, w_up, activation="silu"):
        return linear_entries(x, 3, 2, None, False, gate=True)  # (out, g, u)

    def lora_entries(x, outputs, weights, bias, lora_x, no_pre=False, gate=False):
        # The LoRA ops (lora_linear, lora_swiglu) as linear's: x's rows (lora_x with them), or the
        # weights' rows with their B's (output columns; the [rows, R] product u replicated, as A
        # is), everything else replicated. Never K: the adapter's product and an activation must not
        # see partial sums. Inputs: x, the weights, A, the B's, [bias, activation], lora_x, [activation
        # (lora_swiglu's, `gate`)].
        def entry(out, u, px, pw, pa):
            tail = ([pw if bias else None, None] if bias is not None else []) + [px if lora_x else None]
            tail += [None] if gate else []
            outs = [out] + [Replicate() if no_pre else out] * (outputs - 1) + ([u] if outputs > 1 else [])
            return outs, [px] + [pw] * weights + [pa] + [pw] * weights + tail  # no_pre: an empty [0] pre

        last = x.ndim - 1
        rules = [entry(Replicate(), Replicate(), Replicate(), Replicate(), Replicate())]
        rules += [entry(Shard(d), Shard(d), Shard(d), Replicate(), Replicate()) for d in range(last)]
        rules.append(entry(Shard(last), Replicate(), Replicate(), Shard(0), Replicate()))
        return rules

    @register_sharding(ops.lora_linear.default)
    def lora_linear_rule(x, weight, lora_a, lora_b, bias=None, activation="none", lora_x=None):
        return lora_entries(x, 1, 1, bias is not None, lora_x is not None)

    @register_sharding(ops._lora_linear_fwd.default)
    def lora_linear_fwd_rule(x, weight, lora_a, lora_b, bias, activation, lora_x):
        return lora_entries(x, 2, 1, bias is not None, lora_x is not None, activation == "none")  # (y, pre, u)

    @register_sharding(ops.lora_swiglu.default)
    def lora_swiglu_rule(x, w_gate, w_up, lora_a, lora_b_gate, lora_b_up, lora_x=None, activation="silu"):
        return lora_entries(x, 1, 2, None, lora_x is not None, gate=True)

    @register_sharding(ops._lora_swiglu_fwd.default)
    def lora_swiglu_fwd_rule(x, w_gate, w_up, lora_a, lora_b_gate, lora_b_up, lora_x, activation="silu"):
        return lora_entries(x, 3, 2, None, lora_x is not None, gate=True)  # (out, g, u, lora_u)

    @register_sharding(ops._swiglu_bwd.default)
    def swiglu_bwd_rule(dy, g, u, activation="silu"):
        # Elementwise over [rows, I]: any one sharding of all three, kept by both gradients.
        return [([p, p], [p, p, p, None]) for p in (Replicate(), Shard(0), Shard(1))]

    # linear_cross_entropy: replicated, or the tokens sharded (x's rows with target's; the weight and
    # bias whole): a loss per token keeps the tokens' sharding, a sum is a partial sum. A mean divides
    # by the count of tokens not ignored over all shards, which a local mean does not know: it takes
    # the replicated entry (DTensor gathers the tokens). Rows: x 2-D, so x's rows, target and the
    # per-token log-sum-exp [T] are sharded alike.
    def lce_entries(x, weight, bias, reduction, outputs):
        # A weight sharded along the vocabulary would need the softmax's statistics combined across
        # processes (vocabulary-parallel cross-entropy), which these ops do not do; gathering it
        # would hold the whole head on every process: refused, as SPEC §1b says.
        if any(isinstance(p, Shard) and p.dim == 0 for p in getattr(weight, "placements", ())):
            raise RuntimeError("cuops::linear_cross_entropy: expected weight replicated or sharded along K, "
                               "got a vocabulary-sharded weight (Shard(0)): gather it, or shard the tokens")
        tail = [Replicate() if bias is not None else None]
        rules = [([Replicate()] * len(outputs), [Replicate(), Replicate(), Replicate()] + tail)]
        if reduction != "mean" and x.ndim == 2:
            token = [Shard(0) if o == "token" else Partial() if reduction == "sum" else Shard(0)
                     for o in outputs]
            rules.append((token, [Shard(0), Replicate(), Shard(0)] + tail))
        return [(out, ins + [None, None, None]) for out, ins in rules]  # ignore_index, reduction, softcap

    @register_sharding(ops.linear_cross_entropy.default)
    def lce_rule(x, weight, target, bias=None, ignore_index=-100, reduction="mean", softcap=None):
        return lce_entries(x, weight, bias, reduction, ["loss"])

    @register_sharding(ops._linear_cross_entropy_fwd.default)
    def lce_fwd_rule(x, weight, target, bias, ignore_index, reduction, softcap=None):
        return lce_entries(x, weight, bias, reduction, ["loss", "token"])  # (loss, lse [T])

    @register_sharding(ops._linear_cross_entropy_fwd_grad.default)
    def lce_fwd_grad_rule(x, weight, target, bias, ignore_index, reduction, output_mask, softcap=None):
        # (loss, dx, dweight, dbias) of a sum over sharded tokens: dx keeps them, the rest are partial
        # sums over them; a mean takes the replicated entry (see lce_entries).
        tail = [Replicate() if bias is not None else None]
        rules = [([Replicate()] * 4, [Replicate()] * 3 + tail + [None] * 4)]
        if reduction == "sum" and x.ndim == 2:
            rules.append(([Partial(), Shard(0), Partial(), Partial()],
                          [Shard(0), Replicate(), Shard(0)] + tail + [None] * 4))
        return rules

    @register_sharding(ops._linear_cross_entropy_bwd.default)
    def lce_bwd_rule(grad, x, weight, target, bias, lse, ignore_index, reduction, softcap=None):
        # The tokens sharded: dx keeps them, dweight and dbias are partial sums over them; the loss's
        # gradient is per token ("none": sharded alike) or one value (replicated).
        tail = [Replicate() if bias is not None else None]
        rules = [([Replicate()] * 3, [Replicate()] * 4 + tail + [Replicate(), None, None, None])]
        if reduction != "mean" and x.ndim == 2:
            g = Shard(0) if reduction == "none" else Replicate()
            rules.append(([Shard(0), Partial(), Partial()],
                          [g, Shard(0), Replicate(), Shard(0)] + tail + [Shard(0), None, None, None]))
        return rules

    try:
        from torch.distributed.tensor._ops._math_ops import _NormPartial
    except ImportError:
        _NormPartial = None

    @register_sharding(ops.two_norm.default)
    def two_norm_rule(a, b):
        # ||a - b|| over shards: the shards' norms combine as the root of their sum of squares.
        rules = [([Replicate()], [Replicate(), Replicate()])]
        if _NormPartial is not None:
            rules += [([_NormPartial(2)], [Shard(d), Shard(d)]) for d in range(a.ndim)]
        return rules

    # The norms (rms_norm, add_rms_norm) normalise over the last dimension, which stays whole (SPEC
    # §1b: they replicate the hidden dimension): any leading dimension sharded, the outputs alike,
    # the weight replicated. Their internal ops carry 1 / rms per flattened row ([rows]), which
    # follows x only where x's first dimension is the sharded one.
    def leading(x):
        return [Replicate()] + [Shard(d) for d in range(x.ndim - 1)]

    @register_sharding(ops.rms_norm.default)
    def rms_norm_rule(x, weight, eps=1e-6, dtype=None):
        return [([p], [p, Replicate(), None, None]) for p in leading(x)]

    @register_sharding(ops.add_rms_norm.default)
    def add_rms_norm_rule(x, residual, weight, eps=1e-6, dtype=None):
        return [([p, p], [p, p, Replicate(), None, None]) for p in leading(x)]

    @register_sharding(ops._rms_norm_fwd.default)
    def rms_norm_fwd_rule(x, residual, weight, eps, dtype=None):
        # (y, the sum or an empty [0] without a residual, rstd)
        def entry(p, pr):
            s = p if residual is not None else Replicate()
            return [p, s, pr], [p, p if residual is not None else None, Replicate(), None, None]
        rules = [entry(Replicate(), Replicate())]
        if x.ndim > 1:
            rules.append(entry(Shard(0), Shard(0)))
        return rules

    @register_sharding(ops._rms_norm_bwd.default)
    def rms_norm_bwd_rule(dy, s, weight, rstd, dsum, output_mask, x_dtype=None):
        # The weight's gradient sums over the rows: partial where the rows are sharded; x's
        # gradient in x_dtype (an empty [0] without it) follows the rows.
        def entry(p, pw):
            dx = p if x_dtype is not None else Replicate()
            return [p, pw, dx], [p, p, Replicate(), p, p if dsum is not None else None, None, None]
        rules = [entry(Replicate(), Replicate())]
        if s.ndim > 1:
            rules.append(entry(Shard(0), Partial()))
        return rules

    # rotary follows q and k (SPEC §1b): batch, heads or positions sharded alike in both outputs; cos
    # and sin replicated, or sharded with the batch (a cos of batch B) or the positions; D whole.
    def rotary_entries(q, cos, tail):
        per_batch = cos.shape[0] != 1
        rules = [([Replicate()] * 2, [Replicate()] * 4 + tail)]
        rules.append(([Shard(0)] * 2, [Shard(0), Shard(0)] + [Shard(0) if per_batch else Replicate()] * 2 + tail))
        rules.append(([Shard(1)] * 2, [Shard(1), Shard(1), Replicate(), Replicate()] + tail))
        rules.append(([Shard(2)] * 2, [Shard(2), Shard(2), Shard(1), Shard(1)] + tail))
        return rules

    @register_sharding(ops.rotary.default)
    def rotary_rule(q, k, cos, sin, dtype=None):
        return rotary_entries(q, cos, [None])

    @register_sharding(ops._rotary_bwd.default)
    def rotary_bwd_rule(grad_q, grad_k, cos, sin, dtype):
        return rotary_entries(grad_q, cos, [None])

    # grouped_mm: the groups' ends are global row (or k) positions, so the grouped dimension stays
    # whole; the other product dimensions shard as mm's do. Rows form (a [S, K], b [E, K, N]): b's N
    # gives out's columns, K on both a partial sum. K form (a [M, S], b [S, N]): a's M and b's N give
    # out's [E, M, N] dimensions 1 and 2.
    @register_sharding(ops.grouped_mm.default)
    def grouped_mm_rule(a, b, offs):
        rules = [([Replicate()], [Replicate(), Replicate(), Replicate()])]
        if b.ndim == 3:
            rules += [([Shard(1)], [Replicate(), Shard(2), Replicate()]),
                      ([Partial()], [Shard(1), Shard(1), Replicate()])]
        else:
            rules += [([Shard(1)], [Shard(0), Replicate(), Replicate()]),
                      ([Shard(2)], [Replicate(), Shard(1), Replicate()])]
        return rules

    @register_sharding(ops.moe_topk_softmax.default)
    def moe_topk_softmax_rule(logits, k, renorm=False, weight_dtype=None):
        # Per token: any leading dimension sharded, both outputs alike; the experts whole.
        return [([p, p], [p, None, None, None]) for p in leading(logits)]

    # moe_experts: replicated, or the tokens sharded (x, topk_idx and topk_w by rows; the expert
    # weights whole: expert parallelism is another design). Each process then routes its own tokens:
    # the internal ops' layout (gu, rows, offs) is that process's, carried as "sharded by rows"
    # between the forward and the backward, which read it only there; the weight gradients are
    # partial sums over the processes' tokens.
    @register_sharding(ops.moe_experts.default)
    def moe_experts_rule(x, topk_idx, topk_w, gate_up, down, activation="silu"):
        return [([Replicate()], [Replicate()] * 5 + [None]),
                ([Shard(0)], [Shard(0)] * 3 + [Replicate()] * 2 + [None])]

    @register_sharding(ops._moe_experts_fwd.default)
    def moe_experts_fwd_rule(x, topk_idx, topk_w, gate_up, down, activation):
        return [([Replicate()] * 4, [Replicate()] * 5 + [None]),
                ([Shard(0)] * 4, [Shard(0)] * 3 + [Replicate()] * 2 + [None])]

    @register_sharding(ops._moe_experts_bwd.default)
    def moe_experts_bwd_rule(dout, x, topk_w, gate_up, down, gu, rows, offs, activation, output_mask):
        return [([Replicate()] * 4, [Replicate()] * 8 + [None, None]),
                ([Shard(0), Shard(0), Partial(), Partial()],
                 [Shard(0)] * 3 + [Replicate()] * 2 + [Shard(0)] * 3 + [None, None])]

    # ---- In-place ops: rules as (c, a, b) placements per mesh dimension; c's is never changed.

    @_inplace(ops.add2.default, "add2")
    def add2_rule(c, a, b):
        # c <- a + b elementwise: c keeps any sharding when a and b have it too; partial sums (and
        # averages) add up as the sums of the inputs do, so a Partial c takes partial a and b. A
        # Partial of a non-linear reduction (max, min) has none.
        rules = [(Replicate(),) * 3]
        rules += [(Shard(d),) * 3 for d in range(c.ndim)]
        rules += [(Partial(op),) * 3 for op in ("sum", "avg")]
        return rules

    @_inplace(ops.gemm.default, "gemm")
    def gemm_rule(c, a, b, alpha=1.0, beta=0.0):
        # c <- alpha * a @ b + beta * c, c's placement given: rows of c take rows of a and all of b,
        # columns of c all of a and columns of b, a replicated c everything replicated. A Partial
        # (sum) c is the sum of its pieces c_i, and each process writes alpha * (its part of a @ b)
        # + beta * c_i, so beta * c is counted once in the sum: the part of a @ b is a k-split
        # product (a's columns with b's rows) or, a @ b being linear in each operand, a Partial
        # operand times a replicated one. A Partial (avg) c takes only the latter: a k split of an
        # average would divide a @ b by the number of processes. (A Replicate c with k-split a and b
        # is not an entry: beta * c would be counted once per process; such a and b are gathered.)
        return [
            (Replicate(), Replicate(), Replicate()),
            (Shard(0), Shard(0), Replicate()),
            (Shard(1), Replicate(), Shard(1)),
            (Partial(), Shard(1), Shard(0)),
            (Partial(), Partial(), Replicate()),
            (Partial(), Replicate(), Partial()),
            (Partial("avg"), Partial("avg"), Replicate()),
            (Partial("avg"), Replicate(), Partial("avg")),
        ]

    _registered = True
    return True


def _same(p, q) -> bool:
    # _NormPartial (a Partial subclass, reduce_op "sum") is not a sum partial: compare types too.
    return type(p) is type(q) and p == q


def _local_as(t, placements):
    """The local tensor t has as a DTensor of `placements` (t is only read: a copy where it moves).
    DTensor.redistribute refuses to move into a Partial ("for internal use only"); on those mesh
    dimensions t goes to Replicate and its local value becomes a piece of the reduction: the whole on
    coordinate 0 and zeros elsewhere for a sum (exact, where torch's own split divides by n), the whole
    everywhere for an average."""
    from torch.distributed.tensor import Partial, Replicate

    into = [i for i, (p, q) in enumerate(zip(t.placements, placements))
            if isinstance(q, Partial) and not _same(p, q)]
    staged = [Replicate() if i in into else q for i, q in enumerate(placements)]
    if tuple(staged) != tuple(t.placements):
        t = t.redistribute(t.device_mesh, staged)
    local = t.to_local()
    coord = t.device_mesh.get_coordinate()
    if any(placements[i].reduce_op == "sum" and coord[i] != 0 for i in into):
        local = torch.zeros_like(local)
    return local


def _inplace(op, name):
    """Registers rule (c, a, b, *scalars) -> [(c, a, b placements), ...] as op's DTensor handler."""
    from torch.distributed.tensor import DTensor

    def decorate(rule):
        def handler(cls, func, types, args, kwargs):
            c, a, b = args[:3]
            scalars = args[3:]
            kinds = [type(t).__name__ for t in (c, a, b)]
            if not all(isinstance(t, DTensor) for t in (c, a, b)):
                raise RuntimeError(
                    f"cuops::{name}: c, a and b must all be DTensors when one is (got c: {kinds[0]}, "
                    f"a: {kinds[1]}, b: {kinds[2]}); make the others with distribute_tensor or "
                    "DTensor.from_local")
            mesh = c.device_mesh
            for arg, t in (("a", a), ("b", b)):
                if t.device_mesh != mesh:
                    raise RuntimeError(f"cuops::{name}: {arg} is on {t.device_mesh}, c on {mesh}; "
                                       "expected one DeviceMesh")
            # Global shapes and dtypes, by the Meta kernel (its messages are the op's own).
            func(*(torch.empty(t.shape, dtype=t.dtype, device="meta") for t in (c, a, b)), *scalars,
                 **kwargs)
            rules = rule(c, a, b, *scalars, **kwargs)
            want_a, want_b = [], []
            for dim, pc in enumerate(c.placements):
                options = [r for r in rules if _same(r[0], pc)]
                if not options:
                    accepted = ", ".join(dict.fromkeys(repr(r[0]) for r in rules))
                    raise RuntimeError(
                        f"cuops::{name}: c is written in place, so its placement stays; c is {pc!r} on "
                        f"mesh dimension {dim}, which {name} cannot write (accepted: {accepted}). "
                        f"Redistribute c first (c.redistribute returns a new DTensor) or use the "
                        f"functional op ({'mm' if name == 'gemm' else 'vector_add'})")
                best = min(options, key=lambda r: (not _same(r[1], a.placements[dim]))
                           + (not _same(r[2], b.placements[dim])))
                want_a.append(best[1])
                want_b.append(best[2])
            # An input that moves is read from a copy: one sharing c's memory would be read as it was
            # before the write, where the kernel itself would read it in place (add2) or refuse it.
            out = c.to_local()
            for arg, t, want in (("a", a, want_a), ("b", b, want_b)):
                if tuple(want) != tuple(t.placements) and out.numel() and t.to_local().numel() and (
                        t.to_local().untyped_storage().data_ptr() == out.untyped_storage().data_ptr()):
                    raise RuntimeError(
                        f"cuops::{name}: {arg} shares memory with the output c and would have to move "
                        f"from {tuple(t.placements)} to {tuple(want)} (a copy, read while c is written); "
                        f"pass a separate {arg}")
            func(out, _local_as(a, want_a), _local_as(b, want_b), *scalars, **kwargs)
            return None

        torch.library.register_torch_dispatch(op, DTensor, handler)
        return rule

    return decorate
