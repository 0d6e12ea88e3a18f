"""two_norm(a, b) = ||a - b|| against torch eager and torch.compile."""
from __future__ import annotations

import time

import torch

from ..context import Run
from ..harness import DTYPES, Baseline, guarded, log, make_pool, rotating
from .memory_bound import memory_row, pow2_label

COMPILED_CALL = "torch.compile(lambda a, b: torch.linalg.vector_norm(a - b), dynamic=False)"


def eager(a, b):
    return torch.linalg.vector_norm(a - b)


def allow_recompiles() -> None:
    """One recompile per size and dtype is expected (both dtypes' functions share one code object);
    past dynamo's default limit of 8 the compiled baseline would silently run eager."""
    try:
        from torch import _dynamo
        for knob in ("recompile_limit", "cache_size_limit"):
            if hasattr(_dynamo.config, knob):
                setattr(_dynamo.config, knob, 64)
    except Exception:  # noqa: BLE001 - without the knob the compiled figures may be eager's; the run goes on
        pass


def run(ctx: Run) -> None:
    allow_recompiles()
    for dname in ("float32", "bfloat16"):
        # One compiled function per dtype; dynamic=False specialises (recompiles) once per size.
        compiled = torch.compile(lambda a, b: torch.linalg.vector_norm(a - b), dynamic=False)
        for n in ctx.cfg.sizes:
            started = time.perf_counter()
            one_size(ctx, dname, n, compiled)
            log(f"norm {dname} {pow2_label(n)}: {time.perf_counter() - started:.1f}s")


def one_size(ctx: Run, dname: str, n: int, compiled) -> None:
    bench, dtype, es = ctx.bench, DTYPES[dname], DTYPES[dname].itemsize
    row = {"family": "norm", "op": "two_norm", "dtype": dname, "precision": None,
           "size": pow2_label(n), "n": n, "bytes": 2 * n * es}
    skip = bench.check_memory(5 * n * es)  # a, b, eager's a - b, copy buffers
    if skip is not None:
        ctx.rows.append(dict(row, status="skipped", skip_reason=skip))
        return

    def work(r):
        pool = make_pool(lambda: (torch.randn(n, device=bench.device, dtype=dtype),
                                  torch.randn(n, device=bench.device, dtype=dtype)), 2 * n * es, bench.pool_bytes)
        memory_row(bench, r, rotating(pool, torch.ops.cuops.two_norm), [
            Baseline("eager", "vector_norm eager", "torch.linalg.vector_norm(a - b)", rotating(pool, eager)),
            Baseline("compiled", "vector_norm compile", COMPILED_CALL, rotating(pool, compiled)),
        ], ctx.ceiling.at(n * es))

    guarded(ctx.rows, row, work)
    bench.free_memory(collect=n * es >= 2**28)
