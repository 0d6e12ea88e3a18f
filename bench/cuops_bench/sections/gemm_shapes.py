"""The shape suite (SPEC §3, "the shapes real models run"; issue 23): torch.ops.cuops.mm against
torch.mm on the products nn.Linear runs in public transformer configurations (shapes.py), per dtype
variant, with a per-(class, variant) geometric mean and worst row.

Decode rows (M <= 16) are memory-bound: they are timed in steady state (harness.SteadyLoop: one CUDA
graph cycling over more than 4x L2 of operand copies), and also report do_bench's flushed figure, the
weight bytes read per second against the copy rate, and, for the forward product, F.linear under
torch.compile(mode="max-autotune-no-cudagraphs") (the cpu smoke run compiles in the default mode). The
other rows use the square GEMMs' alternating rounds (Bench.alternating_rounds).
"""
from __future__ import annotations

import contextlib
import math
import statistics
import time
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F

from ..context import SHAPE_VARIANTS, Run
from .gemm_squares import record_rounds
from ..harness import (DTYPES, MAX_POOL_SETS, Baseline, Bench, BudgetSpent, SteadyLoop, error_text, guarded, log,
                       rotating, steady_pool_count, steady_timer_name)
from ..shapes import Product, products
from .gemm_squares import set_fp32_matmul

FAMILY = "gemm_shape"
BANDWIDTH_MAX_M = 64        # rows this skinny also report the weight's bandwidth against copy
TARGET_WEIGHT_BYTES = 64e6  # SPEC §3: decode weights of >= 64 MB read at >= 0.95 of copy
# The flushed figure of a decode row is the second opinion, not the counted one: 30 ms of calls (>= 200
# calls of a few to 100 us, each after a 256 MB flush) rather than do_bench's 100, which would double a
# decode row's time.
FLUSHED_REP_MS = 30
# The compiled baseline runs for the half types only: SPEC §3 bounds decode rows by F.linear under
# max-autotune for bf16 and fp16, and each shape costs a max-autotune compile.
COMPILED_DTYPES = ("bfloat16", "float16")


def linear(x, w):
    return F.linear(x, w)


class CompiledLinear(NamedTuple):
    fn: Callable   # linear under torch.compile, one compile per shape and dtype
    call: str      # what it is, for the JSON


@contextlib.contextmanager
def many_recompiles(limit: int = 4096):
    """The compiled baseline is one function recompiled (dynamic=False) for every shape and dtype; past
    dynamo's limit (8 by default) it would silently run eager. Restored afterwards."""
    try:
        from torch._dynamo import config
    except Exception:  # noqa: BLE001 - no dynamo: the compiled column records the failure per row
        yield
        return
    saved = {}
    for knob in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(config, knob):
            saved[knob] = getattr(config, knob)
            setattr(config, knob, max(limit, saved[knob]))
    try:
        yield
    finally:
        for knob, value in saved.items():
            setattr(config, knob, value)


def compiled_tokens(mode: str) -> tuple:
    return {"none": (), "decode1": (1, 16), "decode": tuple(range(1, 17))}[mode]


def variant_name(dname: str, precision: str | None) -> str:
    return {"high": "tf32", "highest": "float32"}.get(precision, dname)


def selected(ctx: Run) -> list[Product]:
    suite = ctx.cfg.shapes
    return [p for p in products(suite.models, suite.tokens, scale=suite.scale) if p.cls in suite.classes]


def run(ctx: Run) -> None:
    suite = ctx.cfg.shapes
    chosen = selected(ctx)
    compiled = CompiledLinear(torch.compile(linear, mode=suite.compile_mode, dynamic=False),
                              f'torch.compile(F.linear, mode="{suite.compile_mode}", dynamic=False)(x, W)')
    saved = (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32)
    log(f"gemm_shapes: {len(chosen)} products x {len(suite.variants)} variants ({','.join(suite.variants)}), "
        f"classes {','.join(suite.classes)}, compiled baseline: {suite.compile}")
    try:
        with many_recompiles():
            for variant in suite.variants:
                dname, precision = SHAPE_VARIANTS[variant]
                set_fp32_matmul(precision or "highest")
                # Class by class, decode first: a run cut short by --budget-s keeps the memory-bound rows.
                for cls in suite.classes:
                    for p in (p for p in chosen if p.cls == cls):
                        started = time.perf_counter()
                        one_product(ctx, p, dname, precision, compiled)
                        log(f"gemm_shapes {variant} {ctx.rows[-1]['label']}: {time.perf_counter() - started:.1f}s")
    finally:
        torch.set_float32_matmul_precision(saved[0])
        torch.backends.cuda.matmul.allow_tf32 = saved[1]
        ctx.results["shape_classes"] = class_summary([r for r in ctx.rows if r["family"] == FAMILY])


def new_row(p: Product, dname: str, precision: str | None) -> dict:
    L = p.linear
    size = f"{p.m}x{p.k}x{p.n}"  # M x K x N, as the square GEMM rows
    row = {"family": FAMILY, "op": "mm", "dtype": dname, "precision": precision, "size": size,
           "label": f"{L.model} {L.name} {p.kind} M={p.tokens} ({size})", "model": L.model, "linear": L.name,
           "kind": p.kind, "class": p.cls, "tokens": p.tokens, "M": p.m, "K": p.k, "N": p.n, "shape": [p.m, p.k, p.n],
           "a_major": p.a_major, "b_major": p.b_major, "flops": 2 * p.m * p.n * p.k}
    if p.kind != "weight_grad" and p.m <= BANDWIDTH_MAX_M:
        row["weight_bytes"] = p.weight_elements * DTYPES[dname].itemsize
    return row


def one_product(ctx: Run, p: Product, dname: str, precision: str | None, compiled: CompiledLinear) -> None:
    bench, dtype = ctx.bench, DTYPES[dname]
    row = new_row(p, dname, precision)
    es = dtype.itemsize
    set_bytes = (p.m * p.k + p.k * p.n) * es
    out_bytes = p.m * p.n * es
    steady = p.cls == "decode"
    if steady:
        count = steady_pool_count(set_bytes, bench.pool_bytes)
    else:
        count = 1 if set_bytes >= bench.pool_bytes else min(MAX_POOL_SETS, math.ceil(bench.pool_bytes / set_bytes))
    # The pool, a few outputs, and operands() drawing one set in float32 before the cast.
    need = count * set_bytes + 4 * out_bytes + set_bytes * 4 / es
    reason = bench.check_memory(need)
    if reason is not None:
        ctx.rows.append(dict(row, status="skipped", skip_reason=reason))
        return
    with_compiled = (steady and p.kind == "forward" and dname in COMPILED_DTYPES
                     and p.tokens in compiled_tokens(ctx.cfg.shapes.compile))

    def work(r):
        bench.check_budget()  # before the copies, the pool and a compile, which all take time
        # The copy rates first: their buffers are freed before the operands take the memory.
        copy = {}
        if "weight_bytes" in r:
            copy = ctx.ceiling.graph_at(r["weight_bytes"]) if steady else ctx.ceiling.at(r["weight_bytes"])
        pool = [p.operands(dtype, bench.device) for _ in range(count)]
        r.update(pool_sets=count, pool_bytes=count * set_bytes)
        try:
            if steady:
                time_steady(bench, r, pool, compiled if with_compiled else None, copy, ctx.cfg.shapes.rounds)
            else:
                time_rounds(bench, r, pool, copy)
        finally:
            del pool[:]

    guarded(ctx.rows, row, work)
    bench.free_memory(collect=count * set_bytes >= 2**28)


def torch_baseline(pool) -> Baseline:
    return Baseline("torch", "torch.mm", "torch.mm(a, b)", rotating(pool, torch.mm))


def weight_rate(weight_bytes: int, ms, copy_gbps, prefix: str = "") -> dict:
    """Weight bytes read per second and that as a fraction of the copy rate (bytes read + written per
    second): 1.0 means the weight streams in as fast as a copy moves bytes, about what a read-only
    stream gets (two_norm reads at 1.02-1.05x of copy)."""
    if not ms:
        return {}
    gbps = weight_bytes / ms / 1e6
    return {prefix + "weight_GBps": gbps, prefix + "fraction": gbps / copy_gbps if copy_gbps else None}


def time_rounds(bench: Bench, row: dict, pool: list, copy: dict) -> None:
    """Compute-bound rows: the square GEMMs' protocol (alternating rounds, do_bench with flush)."""
    base = torch_baseline(pool)
    rounds = bench.alternating_rounds(base.fn, rotating(pool, torch.ops.cuops.mm), row["M"] * row["N"] * row["K"])
    record_rounds(row, base, rounds, key="torch")
    row["ceiling"] = "torch.mm"
    if "weight_bytes" in row:  # a skinny row outside the decode class (--shapes tokens up to 64)
        row.update(weight_rate(row["weight_bytes"], ms, copy.get("GBps")), ceiling="copy",
                   copy_bytes=copy.get("buffer_bytes"), copy_GBps=copy.get("GBps"))
        entry.update(weight_rate(row["weight_bytes"], base_ms, copy.get("GBps")))


def time_steady(bench: Bench, row: dict, pool: list, compiled: CompiledLinear | None, copy: dict, rounds: int) -> None:
    """Decode rows: cuops, torch.mm and (when chosen) the compiled F.linear, each one CUDA graph over the
    pool, timed in alternating rounds; then each side's flushed figure (do_bench, L2 flushed)."""
    sides = {"cuops": torch.ops.cuops.mm, "torch": torch.mm}
    bases = {"torch": torch_baseline(pool)}
    if compiled is not None:
        # b is W.t(): F.linear takes W itself, the [N, K] row-major tensor a model holds.
        sides["compiled"] = lambda a, b: compiled.fn(a, b.t())
        bases["compiled"] = Baseline("compiled", "F.linear compiled", compiled.call, rotating(pool, sides["compiled"]))
    loops, errors = {}, {}
    try:
        for key, fn in sides.items():
            try:
                loops[key] = SteadyLoop(bench, fn, pool)
            except Exception as e:  # noqa: BLE001 - a baseline that fails leaves the row standing
                if key == "cuops":
                    raise
                errors[key] = error_text(e)
                bench.sync()
        timings = bench.steady_rounds(loops, rounds)
    finally:
        for loop in loops.values():
            loop.close()
    ms = {key: statistics.median(t.ms for t in ts) for key, ts in timings.items()}
    flushed = {}
    for key in timings:
        try:
            flushed[key] = bench.measure(rotating(pool, sides[key]), min_rep_ms=FLUSHED_REP_MS).ms
        except BudgetSpent as e:  # the steady figures, the ones that count, are in
            errors.setdefault(key, f"flushed: {e}")
        except Exception as e:  # noqa: BLE001
            if key == "cuops":
                raise
            errors.setdefault(key, f"flushed: {error_text(e)}")
    cuops_ms, cuops_flushed = ms["cuops"], flushed.get("cuops")
    row.update(status="ok", cuops_ms=cuops_ms, cuops_runs_ms=[t.ms for t in timings["cuops"]],
               cuops_reps=sum(t.reps for t in timings["cuops"]), timer=steady_timer_name(timings["cuops"]),
               single_ms=timings["cuops"][0].single_ms, cuops_TFLOPs=row["flops"] / cuops_ms / 1e9,
               flushed_ms=cuops_flushed, flushed_timer=bench.timer_name)
    if "cuops" in errors:
        row["flushed_error"] = errors["cuops"]
    row["baselines"] = {}
    for key, base in bases.items():
        entry = {"label": base.label, "call": base.call}
        if key in ms:
            entry.update(ms=ms[key], runs_ms=[t.ms for t in timings[key]], ratio=ms[key] / cuops_ms,
                         TFLOPs=row["flops"] / ms[key] / 1e9, flushed_ms=flushed.get(key))
            if flushed.get(key) and cuops_flushed:
                entry["flushed_ratio"] = flushed[key] / cuops_flushed
        if key in errors:
            entry["error"] = errors[key]
        row["baselines"][key] = entry
    row["ratio"] = row["baselines"]["torch"].get("ratio")
    if "weight_bytes" not in row:
        row.update(ceiling="torch.mm", fraction=row["ratio"])
        return
    # Steady figures against the copy timed the same way (graph replays), flushed against do_bench's copy.
    weight, graph_copy, flushed_copy = row["weight_bytes"], copy.get("graph_GBps"), copy.get("GBps")
    row.update(**weight_rate(weight, cuops_ms, graph_copy),
               **weight_rate(weight, cuops_flushed, flushed_copy, "flushed_"), ceiling="copy",
               copy_bytes=copy.get("buffer_bytes"), copy_GBps=flushed_copy, copy_graph_GBps=graph_copy)
    for entry in row["baselines"].values():
        entry.update(**weight_rate(weight, entry.get("ms"), graph_copy),
                     **weight_rate(weight, entry.get("flushed_ms"), flushed_copy, "flushed_"))


def geomean(values: list) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def worst_of(pairs: list) -> dict:
    """pairs of (row, ratio): the row with the smallest ratio, as {"label", "ratio"}."""
    row, value = min(pairs, key=lambda rv: rv[1])
    return {"label": row["label"], "ratio": value}


def class_summary(rows: list) -> list[dict]:
    """SPEC §3 judges a class by the geometric mean of its ratios and bounds its worst row: one entry
    per (class, variant) in the order the rows ran, with those figures and, at decode, the compiled
    baseline's and the >= 64 MB weights' bandwidth."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["class"], variant_name(r["dtype"], r["precision"])), []).append(r)
    out = []
    for (cls, variant), group in groups.items():
        ok = [r for r in group if r.get("status") == "ok" and r.get("ratio")]
        entry = {"class": cls, "variant": variant, "dtype": group[0]["dtype"], "precision": group[0]["precision"],
                 "rows": len(group), "ok": len(ok)}
        if ok:
            entry["geomean_ratio"] = geomean([r["ratio"] for r in ok])
            entry["worst"] = worst_of([(r, r["ratio"]) for r in ok])
        flushed = [r["baselines"]["torch"]["flushed_ratio"] for r in ok if r["baselines"]["torch"].get("flushed_ratio")]
        if flushed:
            entry["flushed_geomean_ratio"] = geomean(flushed)
        compiled = [(r, r["baselines"]["compiled"]["ratio"]) for r in ok
                    if r["baselines"].get("compiled", {}).get("ratio")]
        if compiled:
            entry["compiled"] = {"rows": len(compiled), "geomean_ratio": geomean([v for _, v in compiled]),
                                 "worst": worst_of(compiled)}
        big = [r for r in ok if r.get("weight_bytes", 0) >= TARGET_WEIGHT_BYTES and r.get("fraction") is not None]
        if big:
            low = min(big, key=lambda r: r["fraction"])
            torch_fracs = [r["baselines"]["torch"]["fraction"] for r in big if r["baselines"]["torch"].get("fraction")]
            entry["weight_fraction_64MB"] = {"rows": len(big), "min": low["fraction"], "worst_label": low["label"],
                                             "torch_min": min(torch_fracs) if torch_fracs else None}
        out.append(entry)
    return out
