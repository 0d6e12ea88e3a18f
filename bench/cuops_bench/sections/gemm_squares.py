"""cuops gemm and mm against cuBLAS (torch.mm) at square sizes and a few odd shapes, per dtype and
float32 precision."""
from __future__ import annotations

import time

import torch

from ..context import SHAPE_VARIANTS, Run
from ..harness import DTYPES, Baseline, Bench, Rounds, guarded, log, rotating

GEMM_SKIP_8192_MS = 500.0  # a 4096^3 cuops call slower than this means 8192^3 would take seconds a call


def set_fp32_matmul(precision: str) -> None:
    """'highest': true FP32 (cuBLAS SGEMM); 'high': TF32 tensor cores. cuops follows the same setting."""
    torch.set_float32_matmul_precision(precision)
    torch.backends.cuda.matmul.allow_tf32 = precision != "highest"


def gemm_label(M: int, K: int, N: int) -> str:
    return f"{M}^3" if M == K == N else f"{M}x{K}x{N}"


def op_calls() -> dict:
    """op: (cuops fn, baseline label, baseline call, baseline fn); every fn takes a, b, c from the pool."""
    ops = torch.ops.cuops
    return {
        "gemm": (lambda a, b, c: ops.gemm(c, a, b, 1.0, 0.0),
                 "cuBLAS mm(out=)", "torch.mm(a, b, out=c)", lambda a, b, c: torch.mm(a, b, out=c)),
        "mm": (lambda a, b, c: ops.mm(a, b), "cuBLAS mm", "torch.mm(a, b)", lambda a, b, c: torch.mm(a, b)),
    }


def run(ctx: Run) -> None:
    shapes = [(s, s, s) for s in ctx.cfg.gemm_squares] + list(ctx.cfg.gemm_odd)
    calls = op_calls()
    saved = (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32)
    try:
        for variant in ctx.cfg.gemm_variants:
            dname, precision = SHAPE_VARIANTS[variant]
            set_fp32_matmul(precision or "highest")
            one_variant(ctx, calls, dname, precision, shapes)
    finally:
        torch.set_float32_matmul_precision(saved[0])
        torch.backends.cuda.matmul.allow_tf32 = saved[1]


def one_variant(ctx: Run, calls: dict, dname: str, precision: str | None, shapes: list) -> None:
    slow_4096_ms = None  # the slowest warm cuops call at 4096^3 of this variant
    for M, K, N in shapes:
        started = time.perf_counter()
        slow_reason = None
        if M == K == N == 8192 and slow_4096_ms is not None and slow_4096_ms > GEMM_SKIP_8192_MS:
            slow_reason = f"one cuops call at 4096^3 took {slow_4096_ms:.0f} ms > {GEMM_SKIP_8192_MS:.0f} ms"
        rows = one_shape(ctx, calls, dname, precision, (M, K, N), slow_reason)
        if M == K == N == 4096:
            for row in rows:
                if row.get("single_ms") is not None:
                    slow_4096_ms = max(slow_4096_ms or 0.0, row["single_ms"])
        log(f"gemm {dname}/{precision or '-'} {gemm_label(M, K, N)}: {time.perf_counter() - started:.1f}s")


def one_shape(ctx: Run, calls: dict, dname: str, precision: str | None, shape: tuple, slow_reason) -> list:
    """The shape's gemm and mm rows, appended to the results and returned."""
    (M, K, N), bench, dtype = shape, ctx.bench, DTYPES[dname]
    set_bytes = (M * K + K * N + M * N) * dtype.itemsize
    # c is an output (beta = 0): its contents are never read.
    pool, skipped = bench.input_pool(lambda: (torch.randn(M, K, device=bench.device, dtype=dtype),
                                              torch.randn(K, N, device=bench.device, dtype=dtype),
                                              torch.empty(M, N, device=bench.device, dtype=dtype)),
                                     set_bytes, 2 * set_bytes)
    rows = []
    for op in ("gemm", "mm"):
        row = {"family": "gemm", "op": op, "dtype": dname, "precision": precision, "size": gemm_label(M, K, N),
               "M": M, "K": K, "N": N, "shape": [M, K, N], "flops": 2 * M * N * K, "ceiling": "cublas"}
        if pool is None:
            rows.append(dict(row, **skipped))
        else:
            guarded(rows, row, lambda r: time_row(bench, r, pool, calls[op], slow_reason))
    ctx.rows.extend(rows)
    del pool
    bench.free_memory(collect=set_bytes >= 2**28)
    return rows


def time_row(bench: Bench, row: dict, pool: list, calls: tuple, slow_reason: str | None) -> None:
    cuops_call, label, call, base_call = calls
    base = Baseline("cublas", label, call, rotating(pool, base_call))
    if slow_reason is not None:
        bt = bench.measure(base.fn)
        row["baselines"] = {"cublas": {"label": base.label, "call": base.call, "ms": bt.ms, "reps": bt.reps,
                                       "TFLOPs": row["flops"] / bt.ms / 1e9}}
        row.update(status="skipped", skip_reason=slow_reason)
        return
    rounds = bench.alternating_rounds(base.fn, rotating(pool, cuops_call), row["M"] * row["N"] * row["K"])
    record_rounds(row, base, rounds)


def record_rounds(row: dict, base: Baseline, rounds: Rounds, key: str = "cublas") -> None:
    """Fills a GEMM row (with "flops") from its alternating rounds against one baseline, stored under
    row["baselines"][key] (the square rows call cuBLAS "cublas", the shape suite torch.mm "torch")."""
    base_ms, ms = rounds.baseline_ms, rounds.cuops_ms
    cublas = {"label": base.label, "call": base.call, "ms": base_ms, "runs_ms": [b.ms for b in rounds.baseline],
              "reps": sum(b.reps for b in rounds.baseline), "TFLOPs": row["flops"] / base_ms / 1e9,
              "ratio": base_ms / ms}
    row["baselines"] = {key: cublas}
    row.update(status="ok", cuops_ms=ms, cuops_runs_ms=[t.ms for t in rounds.cuops],
               cuops_reps=sum(t.reps for t in rounds.cuops), timer=rounds.timer,
               single_ms=rounds.cuops[0].single_ms, cuops_TFLOPs=row["flops"] / ms / 1e9,
               ratio=cublas["ratio"], fraction=cublas["ratio"])
