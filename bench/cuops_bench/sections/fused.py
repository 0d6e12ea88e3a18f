"""The fused ops against the unfused torch code they replace (SPEC.md §3, "Fused ops"): linear with bias
and gelu_tanh, and swiglu, forward and forward + backward, each against the torch code eager, the same
code under torch.compile(mode="default"), torch._addmm_activation (linear's forward: cuBLASLt's GELU
epilogue), and, for the report, the bare products alone (torch.mm: the GEMM time the epilogue rides on,
the "frac mm" column); decode rows also the weights' bytes read per second in steady state against the copy
rate at the same bytes ("frac copy", weight_rates). Sides alternate over rounds; L2 is flushed before every call (do_bench)."""
from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from ..context import Run
from ..harness import DTYPES, SteadyLoop, guarded, log, steady_pool_count
from .norm import allow_recompiles

COMPILED = 'torch.compile(f, mode="default"), the token dim dynamic (one graph per model shape)'


def linear_eager(x, w, b):
    return F.gelu(F.linear(x, w, b), approximate="tanh")


def swiglu_eager(x, wg, wu):
    return F.silu(F.linear(x, wg)) * F.linear(x, wu)


def addmm_act(x, w, b):
    return torch._addmm_activation(b, x, w.t(), use_gelu=True)


def bare_linear(x, w, b):
    return torch.mm(x, w.t())


def bare_swiglu(x, wg, wu):
    return torch.mm(x, wg.t()), torch.mm(x, wu.t())


def cuops_linear(x, w, b):
    return torch.ops.cuops.linear(x, w, b, "gelu_tanh")


def cuops_swiglu(x, wg, wu):
    return torch.ops.cuops.swiglu(x, wg, wu)


def with_backward(f, dy):
    """f's forward and the gradients of every input (autograd.grad: nothing accumulates across calls)."""
    def run(*args):
        y = f(*args)
        return torch.autograd.grad(y, args, dy)
    return run


def run(ctx: Run) -> None:
    allow_recompiles()
    cfg = ctx.cfg.fused
    dname = "bfloat16" if ctx.bench.cuda else "float32"
    compiled = {op: torch.compile(fn, mode="default") if cfg.compiled else None for op, fn in
                (("linear", linear_eager), ("swiglu", swiglu_eager))}
    saved = torch.get_float32_matmul_precision()
    try:
        for op in ("linear", "swiglu"):
            for model, k, n in cfg.models:
                for t in cfg.tokens + cfg.decode:
                    one_shape(ctx, op, compiled[op], model, t, k, n, dname, None)
            for model, t, spot, precision in cfg.spots:
                k, n = next((k, n) for m, k, n in cfg.models if m == model)
                torch.set_float32_matmul_precision(precision or "highest")
                one_shape(ctx, op, compiled[op], model, t, k, n, spot, precision)
                torch.set_float32_matmul_precision(saved)
    finally:
        torch.set_float32_matmul_precision(saved)


def one_shape(ctx: Run, op: str, compiled, model: str, t: int, k: int, n: int, dname: str, precision) -> None:
    bench, dtype = ctx.bench, DTYPES[dname]
    started = time.perf_counter()
    dev = bench.device
    weights = 2 if op == "swiglu" else 1
    x = torch.randn(t, k, device=dev, dtype=dtype)
    ws = [torch.randn(n, k, device=dev, dtype=dtype) / k ** 0.5 for _ in range(weights)]
    args = (x, *ws) if op == "swiglu" else (x, ws[0], torch.randn(n, device=dev, dtype=dtype))
    torch._dynamo.mark_dynamic(x, 0)
    cuops_fn = cuops_swiglu if op == "swiglu" else cuops_linear
    eager_fn = swiglu_eager if op == "swiglu" else linear_eager
    bare_fn = bare_swiglu if op == "swiglu" else bare_linear
    decode = t in ctx.cfg.fused.decode
    passes = ("fwd",) if decode else ("fwd", "fwd+bwd")
    for kind in passes:
        row = {"family": "fused", "op": op if op == "swiglu" else "linear_gelu_tanh", "kind": kind, "dtype": dname,
               "precision": precision, "model": model, "tokens": t, "size": f"{t}x{k}->{n}", "M": t, "K": k,
               "N": n, "flops": 2 * t * k * n * weights * (3 if kind == "fwd+bwd" else 1),
               "weight_bytes": weights * n * k * dtype.itemsize}
        sides = {"cuops": cuops_fn, "eager": eager_fn}
        if compiled is not None:
            sides["compiled"] = compiled
        if kind == "fwd":
            sides["mm"] = bare_fn
            if op == "linear":
                sides["addmm_act"] = addmm_act
        else:
            dy = torch.randn(t, n, device=dev, dtype=dtype)
            grad_args = tuple(a.detach().requires_grad_() for a in args)
            torch._dynamo.mark_dynamic(grad_args[0], 0)
            sides = {key: with_backward(fn, dy) for key, fn in sides.items()}
        call_args = args if kind == "fwd" else grad_args
        def measure(r, sides=sides, call_args=call_args):
            time_sides(bench, r, sides, call_args, ctx.cfg.fused.rounds)
            if decode:
                weight_rates(ctx, r, {"cuops": cuops_fn, "eager": eager_fn, "mm": bare_fn}, args)
        guarded(ctx.rows, row, measure)
    log(f"fused {op} {dname} {model} {t} tokens: {time.perf_counter() - started:.1f}s")
    bench.free_memory()


def weight_rates(ctx: Run, row: dict, sides: dict, args: tuple) -> None:
    """A decode row's weights read per second (SPEC §3), as a decode step reads them: each side one CUDA
    graph over a pool of input sets larger than L2, calls back to back (SteadyLoop), against the copy
    timed the same way at the same bytes ("frac copy"); and the flushed figure (the row's do_bench time,
    whose zeroing flush leaves dirty L2 lines to write back inside the call) against do_bench's copy."""
    bench, weight = ctx.bench, row["weight_bytes"]
    copy = ctx.ceiling.graph_at(weight)
    count = steady_pool_count(weight, bench.pool_bytes)
    pool = [args] + [tuple(a.clone() for a in args) for _ in range(count - 1)]
    steady = {}
    for key, fn in sides.items():
        loop = SteadyLoop(bench, fn, pool)
        try:
            steady[key] = statistics.median(loop.time().ms for _ in range(3))
        finally:
            loop.close()
    del pool
    bench.free_memory()
    gbps = weight / steady["cuops"] / 1e6
    row.update(steady_ms=steady["cuops"], weight_GBps=gbps, copy_graph_GBps=copy.get("graph_GBps"),
               flushed_weight_GBps=weight / row["cuops_ms"] / 1e6, copy_GBps=copy.get("GBps"))
    if copy.get("graph_GBps"):
        row["copy_fraction"] = gbps / copy["graph_GBps"]
    if copy.get("GBps"):
        row["flushed_copy_fraction"] = row["flushed_weight_GBps"] / copy["GBps"]
    for key in ("eager", "mm"):
        row["baselines"][key].update(steady_ms=steady[key], steady_ratio=steady[key] / steady["cuops"])


def time_sides(bench, row: dict, sides: dict, args: tuple, rounds: int) -> None:
    """Every side timed in `rounds` rounds of alternating order; medians; ratios = side / cuops."""
    fns = {key: (lambda f=fn: f(*args)) for key, fn in sides.items()}
    runs = {key: [] for key in fns}
    order = list(fns)
    for i in range(rounds):
        for key in (order if i % 2 == 0 else order[::-1]):
            runs[key].append(bench.measure(fns[key]))
    ms = {key: statistics.median(t.ms for t in ts) for key, ts in runs.items()}
    calls = {"eager": "the torch code as written", "compiled": COMPILED, "mm": "torch.mm of the product(s) alone",
             "addmm_act": "torch._addmm_activation(b, x, w.t(), use_gelu=True)"}
    row["baselines"] = {key: {"call": calls[key], "ms": ms[key], "runs_ms": [t.ms for t in runs[key]],
                              "ratio": ms[key] / ms["cuops"]} for key in fns if key != "cuops"}
    row.update(status="ok", cuops_ms=ms["cuops"], cuops_runs_ms=[t.ms for t in runs["cuops"]],
               timer=f"{runs['cuops'][0].method}, median of {rounds} rounds, sides alternating",
               ratio=ms["eager"] / ms["cuops"], cuops_TFLOPs=row["flops"] / ms["cuops"] / 1e9)
    if "mm" in ms:
        row["fraction"] = ms["mm"] / ms["cuops"]  # of the bare GEMM's rate: what the epilogue costs
