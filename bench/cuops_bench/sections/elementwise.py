"""add2, vector_add, scale, square against torch, at every size and dtype."""
from __future__ import annotations

import time

import torch

from ..context import Run
from ..harness import DTYPES, Baseline, guarded, log, rotating
from .memory_bound import memory_row, pow2_label

SCALE_ALPHA = 1.5


def op_table() -> dict:
    """op: (tensors one call moves, baseline label, baseline call, cuops fn, baseline fn); every fn
    takes a, b, c from the pool."""
    ops = torch.ops.cuops
    return {
        "add2": (3, "torch.add(out=)", "torch.add(a, b, out=c)",
                 lambda a, b, c: ops.add2(c, a, b), lambda a, b, c: torch.add(a, b, out=c)),
        "vector_add": (3, "torch.add", "torch.add(a, b)",
                       lambda a, b, c: ops.vector_add(a, b), lambda a, b, c: torch.add(a, b)),
        "scale": (2, "torch.mul", f"torch.mul(x, {SCALE_ALPHA})",
                  lambda a, b, c: ops.scale(a, SCALE_ALPHA), lambda a, b, c: torch.mul(a, SCALE_ALPHA)),
        "square": (2, "torch.mul(x,x)", "torch.mul(x, x)",
                   lambda a, b, c: ops.square(a), lambda a, b, c: torch.mul(a, a)),
    }


def run(ctx: Run) -> None:
    table = op_table()
    for n in ctx.cfg.sizes:
        for dname in ("float32", "bfloat16", "float16"):
            started = time.perf_counter()
            one_size(ctx, table, n, dname)
            log(f"elementwise {dname} {pow2_label(n)}: {time.perf_counter() - started:.1f}s")


def one_size(ctx: Run, table: dict, n: int, dname: str) -> None:
    bench, dtype, es = ctx.bench, DTYPES[dname], DTYPES[dname].itemsize
    # Memory for a, b, c plus vector_add's output and the two copy buffers; the pool is sized on the
    # smallest working set (2 tensors), so every op's rotation exceeds L2.
    pool, skipped = bench.input_pool(lambda: tuple(torch.randn(n, device=bench.device, dtype=dtype) for _ in range(3)),
                                     2 * n * es, 6 * n * es)
    copy = ctx.ceiling.at(n * es) if pool is not None else {}
    for op, spec in table.items():
        row = {"family": "elementwise", "dtype": dname, "precision": None, "size": pow2_label(n), "n": n,
               "op": op, "bytes": spec[0] * n * es}
        if pool is None:
            ctx.rows.append(dict(row, **skipped))
        else:
            guarded(ctx.rows, row, lambda r: time_op(bench, r, pool, spec, copy))
    del pool
    bench.free_memory(collect=n * es >= 2**28)


def time_op(bench, row: dict, pool: list, spec: tuple, copy: dict) -> None:
    _tensors, label, call, cuops_call, base_call = spec
    baseline = Baseline("torch", label, call, rotating(pool, base_call))
    memory_row(bench, row, rotating(pool, cuops_call), [baseline], copy)
