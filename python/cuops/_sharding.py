"""DTensor sharding rules for the cuops operators (tensor parallelism; issue 25, first part).

Each rule lists, for one mesh dimension, the placements an op accepts and what its output then is;
DTensor expands them over every dimension of the mesh and redistributes inputs to the cheapest one.
Registered by `import cuops` (register() below, idempotent), so `parallelize_module` with
ColwiseParallel / RowwiseParallel runs cuops Linears as it runs aten's.

two_norm of sharded inputs never gathers them: each process takes the norm of its shards and the
result is a pending 2-norm reduction (DTensor's _NormPartial(2), the placement torch's own
linalg_vector_norm rule uses: squares, an all-reduce sum, a root, when the value is needed). That
placement is private to torch; where it is missing, two_norm accepts replicated inputs only.

Not yet covered (they keep DTensor's "no sharding strategy" error): add2 and gemm (in-place outputs:
the output's own placement must be one the rule accepts, never a redistributed copy).
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

    _registered = True
    return True
