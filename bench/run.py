#!/usr/bin/env python3
"""cuops benchmarks: every op against its baselines, in one process, on one GPU (SPEC.md §3, §4).

    python3 bench/run.py --out bench/results          # the full run, under 6 minutes on an H100
    python3 bench/run.py --quick --only gemm          # smoke test of one section
    python3 bench/run.py --device cpu                 # harness smoke test without a GPU (timings meaningless)

The library comes from $CUOPS_LIBRARY, else <repo>/build/libcuops.so. A run restricted with --quick,
--only or --device cpu writes to bench/results/tmp/ (git-ignored) unless --out is given, so it never
overwrites the committed full results.

Protocol
--------
* Timer: triton.testing.do_bench(fn, warmup=25, rep>=100, return_mode="median"): CUDA events around each
  call, with the L2 cache flushed before every call. The rep budget is raised so that at least 20 calls
  are timed. Without Triton: CUDA events around batches of >= 3 back-to-back calls (>= 1 ms a batch),
  median of 25 batches.
* GEMM rows time baseline and cuops in rounds of alternating order (B C, C B, ...), each side the
  median of its timings: 2 rounds (B C C B), or 12 for rows of at least 4096^3 multiply-adds
  (STEADY_MNK). There the H100 runs at its 700 W cap; one timing of a kernel moved by up to 6 %
  against the next; the ratio of 12-round medians of one row moved by 0.3-1 % over three full runs (NOTES.md).
  From 8192^3 (LONG_MNK) each timing runs >= 400 ms of calls (LONG_REP_MS) instead of 100: a 100 ms
  window sits in one phase of the cap's clock swings (bf16 8192^3: 6 % spread of cuBLAS's timings,
  5.3 % of one round's ratio), 400 ms spans several (1.2 %, 3.0 %; NOTES.md, "harness: 400 ms").
* Memory-bound rows (copy, elementwise, norm) also record that batched figure with Triton present
  ("steady_ms", "steady_fraction"; baselines "steady_ms", "steady_ratio"; copy rows "steady_GBps"):
  the two timers disagree by up to ~2.5 % on the same kernel (do_bench's flush leaves ~50 MB of dirty
  L2 lines whose write-back lands in the timed call; back-to-back calls run under sustained load), and
  the targets sit within that spread, so both are kept. bench/check.py counts the do_bench figure.
* Inputs: torch.randn, never zeros. When one input set is smaller than POOL_BYTES (200 MB, 4x the
  H100's 50 MB L2), the function rotates through enough sets to exceed it, so no call finds its
  inputs in L2 even without do_bench's flush.
* Ceiling: dst.copy_(src) device-to-device bandwidth (bytes read + written), measured at the byte
  count of each row's largest operand, so small sizes are compared with a copy that pays the same
  launch and tail costs. "The" ceiling is the copy of 2^28 float32 elements (1 GiB).

Results file: <out>/h100.json (<out>/cpu_smoke.json with --device cpu)
----------------------------------------------------------------------
{
  "schema": 1,
  "gpu": str, "torch": str, "git_commit": str, "git_dirty": bool | null, "date": ISO-8601 str,
  "device": {...}, "build_info": {...} | str, "timer": str, "args": {...},
  "copy_bandwidth_GBps": float | null,          # dst.copy_(src) of 2^28 float32 elements
  "rows": [row, ...],
  "overhead": {"python": {...}, "cpp": {...}},
  "elapsed_s": {section: seconds}
}

Every row:
  family     "copy" | "elementwise" | "norm" | "gemm"
  op         "copy" | "add2" | "vector_add" | "scale" | "square" | "two_norm" | "gemm" | "mm"
  dtype      "float32" | "bfloat16" | "float16"       (null for copy rows)
  precision  "highest" | "high" for float32 GEMM rows (TF32 off / on), else null
  size       a label for people: "2^28", "4096^3", "4097x4097x4097" (M x K x N), "1 GiB"
  status     "ok" | "error" | "skipped"; with "error" or "skip_reason" saying why
  cuops_ms, cuops_reps, timer        median time of the cuops call, how many timed calls, which timer
  baselines  {key: {"label", "call", "ms", "ratio", ...}}; ratio = baseline ms / cuops ms, so > 1 means
             cuops is faster. A baseline that failed has "error" instead of "ms".
             keys: elementwise "torch"; norm "eager" and "compiled"; gemm "cublas"
  ratio      the ratio against the first baseline ("torch", "eager", "cublas")
  ceiling    "copy" | "cublas";  fraction: cuops against that ceiling (see below)
Memory-bound rows (copy, elementwise, norm) add:
  n          elements per operand (copy: elements of float32 in one buffer)
  bytes      bytes one call moves, read + written (add2/vector_add 3·n·elsize, scale/square and
             two_norm 2·n·elsize, copy 2·buffer)
  achieved_GBps        bytes / cuops_ms (copy rows: "GBps", "ms", "buffer_bytes")
  copy_bytes, copy_GBps  the copy measured at the byte count of the largest operand (n·elsize)
  fraction             achieved_GBps / copy_GBps; baselines also carry "GBps" and "fraction"
  steady_ms, steady_fraction   (with Triton) the same call timed in back-to-back batches, against
             the copy timed the same way (copy rows: "steady_ms", "steady_GBps"); baselines carry
             "steady_ms" and "steady_ratio"
GEMM rows add:
  M, K, N, shape [M, K, N], flops (2·M·N·K), cuops_TFLOPs, baselines.cublas.TFLOPs,
  fraction = cuops_TFLOPs / cuBLAS TFLOP/s (the same number as ratio),
  single_ms (one warm cuops call: at 4096^3 over 500 ms, the 8192^3 cuops rows of that dtype and
  precision are skipped, cuBLAS still measured)

overhead.python and overhead.cpp: {"status": "ok", "cuops_us", "aten_us", "cuops_over_aten", ...} with
host microseconds per call of add2 versus aten add.out at 16 float32 elements (lower is better; the
target is cuops_over_aten <= 1.10), or {"status": "missing" | "error", "reason" | "error"}.

bench/check.py reads this file; keep the two in step.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]

WARMUP_MS = 25
REP_MS = 100
# GEMM rows with M*N*K at least this run STEADY_ROUNDS rounds (the protocol note above says why).
STEADY_MNK = 4096**3
STEADY_ROUNDS = 12
# ... and from this size each timing spans at least LONG_REP_MS (the note again).
LONG_MNK = 8192**3
LONG_REP_MS = 400
MIN_REPS = 20
CAP_MS = 2000.0          # most time spent timing one slow function (the naive GEMM at 4096+)
MIN_SLOW_REPS = 3
BATCH_MS = 1.0           # fallback timer: batches this long make event resolution (~0.5 us) irrelevant
POOL_BYTES = 200e6       # > 2x the 50 MB L2: rotate input sets until their total exceeds this
MAX_POOL_SETS = 4096
GEMM_SKIP_8192_MS = 500.0  # a 4096^3 cuops call slower than this means 8192^3 would take seconds a call
SCALE_ALPHA = 1.5

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SHORT = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}

# Module state set by main(): the device, the Triton timer (None: fall back to events) and the
# perf_counter() time after which no more measurements start (--budget-s).
DEVICE = "cuda"
DO_BENCH = None
DEADLINE = math.inf


class BudgetSpent(Exception):
    """Raised instead of starting a measurement once the run's time budget is spent."""


def log(msg: str) -> None:
    """Progress goes to stderr so stdout stays the table."""
    print(msg, file=sys.stderr, flush=True)


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def free_memory(collect: bool = False) -> None:
    """Hands cached blocks back between sizes so the next, larger size has the memory. Tensors die by
    reference counting; a full gc pass (0.2 s once inductor is loaded) runs only after big sizes."""
    if collect:
        gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def pow2_label(n: int) -> str:
    return f"2^{n.bit_length() - 1}" if n > 0 and n & (n - 1) == 0 else str(n)


def error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]


# ----------------------------------------------------------------------------------------------
# Timing


@dataclass
class Timing:
    ms: float          # median milliseconds per call
    reps: int          # timed calls behind the median (approximate for do_bench, which picks its own)
    method: str
    single_ms: float   # one call timed right after a warm-up call; the GEMM skip rule reads it


def _elapsed_ms(fn, calls: int) -> float:
    """Milliseconds per call over `calls` back-to-back calls."""
    if DEVICE == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / calls
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) * 1e3 / calls


def measure(fn, cap_ms: float = CAP_MS, flush: bool = True, min_rep_ms: float = REP_MS) -> Timing:
    """flush=True: do_bench (L2 flushed before each call, at least min_rep_ms of calls) when Triton is
    there; False: event batches."""
    if time.perf_counter() > DEADLINE:
        raise BudgetSpent("the run's time budget (--budget-s) was spent before this measurement")
    fn()  # first call outside the timing: lazy module loading, cuBLAS handles, torch.compile
    sync()
    single = _elapsed_ms(fn, 1)
    if single * MIN_REPS > cap_ms:
        # Too slow for 20 repetitions in the budget (naive GEMM): fewer, individually timed calls.
        reps = max(MIN_SLOW_REPS, int(cap_ms / single))
        times = [_elapsed_ms(fn, 1) for _ in range(reps)]
        return Timing(statistics.median(times), reps, "events, capped", single)
    if DO_BENCH is not None and flush:
        # do_bench repeats rep / estimate times, its estimate being (call + L2 flush); a budget of
        # 25 calls keeps that >= 20 even when the flush is a quarter of the call.
        rep_ms = max(min_rep_ms, 1.25 * MIN_REPS * single)
        ms = DO_BENCH(fn, warmup=WARMUP_MS, rep=rep_ms, return_mode="median")
        return Timing(float(ms), max(MIN_REPS, int(rep_ms / (single + 0.1))), "triton.do_bench", single)
    # At least 3 calls a batch: back to back, so the steady rate is measured even for multi-ms calls.
    calls = max(3, math.ceil(BATCH_MS / max(single, 1e-4)))
    _elapsed_ms(fn, 2 * calls)  # warm-up
    times = [_elapsed_ms(fn, calls) for _ in range(MIN_REPS + 5)]
    method = "cuda events" if DEVICE == "cuda" else "wall clock (cpu)"
    return Timing(statistics.median(times), len(times), f"{method}, batches of {calls}", single)


def make_pool(make_set, set_bytes: float, pool_bytes: float) -> list:
    """Enough input sets that their total exceeds pool_bytes (one set if it alone does)."""
    count = 1 if set_bytes >= pool_bytes else min(MAX_POOL_SETS, math.ceil(pool_bytes / set_bytes))
    return [make_set() for _ in range(count)]


def rotating(pool: list, call):
    """fn() for the timer: each call takes the next input set."""
    if len(pool) == 1:
        only = pool[0]
        return lambda: call(*only)
    sets = itertools.cycle(pool)
    return lambda: call(*next(sets))


def check_memory(need_bytes: float) -> str | None:
    """A skip reason when the device cannot hold need_bytes (with 10% slack), else None."""
    if DEVICE != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info()
    if need_bytes > 0.9 * free:
        return f"needs {need_bytes / 1e9:.1f} GB, {free / 1e9:.1f} GB free"
    return None


# ----------------------------------------------------------------------------------------------
# Ceiling: device-to-device copy


class CopyCeiling:
    """dst.copy_(src) bandwidth per buffer size, measured once per size and recorded as a row."""

    def __init__(self, rows: list, pool_bytes: float):
        self.rows, self.pool_bytes, self.cache = rows, pool_bytes, {}

    def at(self, buffer_bytes: int) -> dict:
        if buffer_bytes in self.cache:
            return self.cache[buffer_bytes]
        n = buffer_bytes // 4
        row = {"family": "copy", "op": "copy", "dtype": None, "precision": None,
               "size": bytes_label(buffer_bytes), "n": n, "buffer_bytes": buffer_bytes,
               "bytes": 2 * buffer_bytes, "ceiling": None}
        try:
            if buffer_bytes % 4:
                raise ValueError("copy buffers are whole float32s")
            pool = make_pool(lambda: (torch.randn(n, device=DEVICE), torch.randn(n, device=DEVICE)),
                             2 * buffer_bytes, self.pool_bytes)
            fn = rotating(pool, lambda src, dst: dst.copy_(src))
            t = measure(fn)
            row.update(status="ok", ms=t.ms, reps=t.reps, timer=t.method, GBps=2 * buffer_bytes / t.ms / 1e6)
            if DO_BENCH is not None:
                ts = measure(fn, flush=False)
                row.update(steady_ms=ts.ms, steady_GBps=2 * buffer_bytes / ts.ms / 1e6)
            del pool, fn
        except BudgetSpent as e:
            row.update(status="skipped", skip_reason=str(e))
        except Exception as e:  # noqa: BLE001 - one failed row must not end the run
            row.update(status="error", error=error_text(e))
        free_memory()
        self.cache[buffer_bytes] = row
        self.rows.append(row)
        return row


def bytes_label(b: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= size:
            return f"{b / size:g} {unit}"
    return f"{b} B"


# ----------------------------------------------------------------------------------------------
# Memory-bound rows (elementwise, norm)


def memory_row(row: dict, cuops_fn, baselines: list, copy: dict) -> None:
    """Times cuops_fn and each (key, label, call, fn) baseline; fills row in place."""
    t = measure(cuops_fn)
    row.update(status="ok", cuops_ms=t.ms, cuops_reps=t.reps, timer=t.method,
               achieved_GBps=row["bytes"] / t.ms / 1e6, ceiling="copy",
               copy_bytes=copy.get("buffer_bytes"), copy_GBps=copy.get("GBps"))
    copy_gbps = copy.get("GBps")
    row["fraction"] = row["achieved_GBps"] / copy_gbps if copy_gbps else None
    ts = measure(cuops_fn, flush=False) if DO_BENCH is not None else None
    if ts is not None:
        row["steady_ms"] = ts.ms
        if copy.get("steady_GBps"):
            row["steady_fraction"] = row["bytes"] / ts.ms / 1e6 / copy["steady_GBps"]
    row["baselines"] = {}
    for key, label, call, fn in baselines:
        entry = {"label": label, "call": call}
        try:
            bt = measure(fn)
            gbps = row["bytes"] / bt.ms / 1e6
            entry.update(ms=bt.ms, reps=bt.reps, ratio=bt.ms / t.ms, GBps=gbps,
                         fraction=gbps / copy_gbps if copy_gbps else None)
            if ts is not None:
                bs = measure(fn, flush=False)
                entry.update(steady_ms=bs.ms, steady_ratio=bs.ms / ts.ms)
        except Exception as e:  # noqa: BLE001
            entry["error"] = error_text(e)
        row["baselines"][key] = entry
    row["ratio"] = row["baselines"][baselines[0][0]].get("ratio")


def guarded(rows: list, row: dict, work) -> None:
    """Runs work(row), turning an exception into an error row, and appends the row."""
    try:
        work(row)
    except BudgetSpent as e:
        row.update(status="skipped", skip_reason=str(e))
    except Exception as e:  # noqa: BLE001
        row.update(status="error", error=error_text(e))
        log(f"  ERROR {row['op']} {row.get('dtype')} {row['size']}: {row['error']}")
        if os.environ.get("CUOPS_BENCH_TRACEBACK"):
            traceback.print_exc()
    rows.append(row)


def elementwise_section(cfg, rows: list, ceiling: CopyCeiling) -> None:
    ops = torch.ops.cuops
    # op: (tensors in one call, baseline label, baseline call, cuops fn, baseline fn); a, b, c from the pool.
    table = {
        "add2": (3, "torch.add(out=)", "torch.add(a, b, out=c)",
                 lambda a, b, c: ops.add2(c, a, b), lambda a, b, c: torch.add(a, b, out=c)),
        "vector_add": (3, "torch.add", "torch.add(a, b)",
                       lambda a, b, c: ops.vector_add(a, b), lambda a, b, c: torch.add(a, b)),
        "scale": (2, "torch.mul", f"torch.mul(x, {SCALE_ALPHA})",
                  lambda a, b, c: ops.scale(a, SCALE_ALPHA), lambda a, b, c: torch.mul(a, SCALE_ALPHA)),
        "square": (2, "torch.mul(x,x)", "torch.mul(x, x)",
                   lambda a, b, c: ops.square(a), lambda a, b, c: torch.mul(a, a)),
    }
    for n in cfg.sizes:
        for dname in ("float32", "bfloat16", "float16"):
            dtype, es = DTYPES[dname], DTYPES[dname].itemsize
            started = time.perf_counter()
            base = {"family": "elementwise", "dtype": dname, "precision": None, "size": pow2_label(n), "n": n}
            # a, b, c plus vector_add's output and the two copy buffers.
            pool, skipped = None, {}
            reason = check_memory(6 * n * es)
            if reason is not None:
                skipped = {"status": "skipped", "skip_reason": reason}
            else:
                try:
                    # Sized on the smallest working set (2 tensors), so every op's rotation exceeds L2.
                    pool = make_pool(lambda: tuple(torch.randn(n, device=DEVICE, dtype=dtype) for _ in range(3)),
                                     2 * n * es, cfg.pool_bytes)
                except Exception as e:  # noqa: BLE001
                    skipped = {"status": "error", "error": f"allocating inputs failed: {error_text(e)}"}
            copy = ceiling.at(n * es) if pool is not None else {}
            for op, (tensors, label, call, cuops_call, base_call) in table.items():
                row = dict(base, op=op, bytes=tensors * n * es)
                if pool is None:
                    rows.append(dict(row, **skipped))
                    continue
                guarded(rows, row, lambda r: memory_row(
                    r, rotating(pool, cuops_call), [("torch", label, call, rotating(pool, base_call))], copy))
            del pool
            free_memory(collect=n * es >= 2**28)
            log(f"elementwise {dname} {pow2_label(n)}: {time.perf_counter() - started:.1f}s")


def norm_section(cfg, rows: list, ceiling: CopyCeiling) -> None:
    two_norm = torch.ops.cuops.two_norm

    def eager(a, b):
        return torch.linalg.vector_norm(a - b)

    for dname in ("float32", "bfloat16"):
        dtype, es = DTYPES[dname], DTYPES[dname].itemsize
        # One compiled function per dtype; dynamic=False specialises (recompiles) once per size.
        compiled = torch.compile(lambda a, b: torch.linalg.vector_norm(a - b), dynamic=False)
        for n in cfg.sizes:
            started = time.perf_counter()
            row = {"family": "norm", "op": "two_norm", "dtype": dname, "precision": None,
                   "size": pow2_label(n), "n": n, "bytes": 2 * n * es}
            skip = check_memory(5 * n * es)  # a, b, eager's a - b, copy buffers
            if skip is not None:
                rows.append(dict(row, status="skipped", skip_reason=skip))
                continue

            def work(r):
                pool = make_pool(lambda: (torch.randn(n, device=DEVICE, dtype=dtype),
                                          torch.randn(n, device=DEVICE, dtype=dtype)), 2 * n * es, cfg.pool_bytes)
                memory_row(r, rotating(pool, two_norm), [
                    ("eager", "vector_norm eager", "torch.linalg.vector_norm(a - b)", rotating(pool, eager)),
                    ("compiled", "vector_norm compile",
                     "torch.compile(lambda a, b: torch.linalg.vector_norm(a - b), dynamic=False)",
                     rotating(pool, compiled)),
                ], ceiling.at(n * es))

            guarded(rows, row, work)
            free_memory(collect=n * es >= 2**28)
            log(f"norm {dname} {pow2_label(n)}: {time.perf_counter() - started:.1f}s")


# ----------------------------------------------------------------------------------------------
# GEMM rows

GEMM_VARIANTS = [("float32", "highest"), ("float32", "high"), ("bfloat16", None), ("float16", None)]


def set_fp32_matmul(precision: str) -> None:
    """'highest': true FP32 (cuBLAS SGEMM); 'high': TF32 tensor cores. cuops follows the same setting."""
    torch.set_float32_matmul_precision(precision)
    torch.backends.cuda.matmul.allow_tf32 = precision != "highest"


def gemm_label(M: int, K: int, N: int) -> str:
    return f"{M}^3" if M == K == N else f"{M}x{K}x{N}"


def gemm_section(cfg, rows: list) -> None:
    ops = torch.ops.cuops
    shapes = [(s, s, s) for s in cfg.gemm_squares] + list(cfg.gemm_odd)
    saved = (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32)
    try:
        for dname, precision in GEMM_VARIANTS:
            dtype, es = DTYPES[dname], DTYPES[dname].itemsize
            set_fp32_matmul(precision or "highest")
            slow_4096_ms = None  # one cuops call at 4096^3 for this variant
            for M, K, N in shapes:
                started = time.perf_counter()
                set_bytes = (M * K + K * N + M * N) * es
                pool, skipped = None, {}
                reason = check_memory(2 * set_bytes)
                if reason is not None:
                    skipped = {"status": "skipped", "skip_reason": reason}
                else:
                    try:
                        # c is an output (beta = 0): its contents are never read.
                        pool = make_pool(lambda: (torch.randn(M, K, device=DEVICE, dtype=dtype),
                                                  torch.randn(K, N, device=DEVICE, dtype=dtype),
                                                  torch.empty(M, N, device=DEVICE, dtype=dtype)),
                                         set_bytes, cfg.pool_bytes)
                    except Exception as e:  # noqa: BLE001
                        skipped = {"status": "error", "error": f"allocating inputs failed: {error_text(e)}"}
                for op in ("gemm", "mm"):
                    row = {"family": "gemm", "op": op, "dtype": dname, "precision": precision,
                           "size": gemm_label(M, K, N), "M": M, "K": K, "N": N, "shape": [M, K, N],
                           "flops": 2 * M * N * K, "ceiling": "cublas"}
                    if pool is None:
                        rows.append(dict(row, **skipped))
                        continue
                    if op == "gemm":
                        cuops_fn = rotating(pool, lambda a, b, c: ops.gemm(c, a, b, 1.0, 0.0))
                        base = ("cublas", "cuBLAS mm(out=)", "torch.mm(a, b, out=c)",
                                rotating(pool, lambda a, b, c: torch.mm(a, b, out=c)))
                    else:
                        cuops_fn = rotating(pool, lambda a, b, c: ops.mm(a, b))
                        base = ("cublas", "cuBLAS mm", "torch.mm(a, b)", rotating(pool, lambda a, b, c: torch.mm(a, b)))
                    too_slow = (M == K == N == 8192 and slow_4096_ms is not None and slow_4096_ms > GEMM_SKIP_8192_MS)

                    def work(r, cuops_fn=cuops_fn, base=base, too_slow=too_slow):
                        if too_slow:
                            bt = measure(base[3])
                            r["baselines"] = {"cublas": {"label": base[1], "call": base[2], "ms": bt.ms,
                                                         "reps": bt.reps, "TFLOPs": r["flops"] / bt.ms / 1e9}}
                            r.update(status="skipped", skip_reason=(
                                f"one cuops call at 4096^3 took {slow_4096_ms:.0f} ms > {GEMM_SKIP_8192_MS:.0f} ms"))
                            return
                        # Rounds of (baseline, cuops), the order flipped every round (B C C B ...), so
                        # drift in the clock under the power cap falls on both sides alike.
                        rounds = STEADY_ROUNDS if M * N * K >= STEADY_MNK else 2
                        rep_ms = LONG_REP_MS if M * N * K >= LONG_MNK else REP_MS
                        bs, ts = [], []
                        sides = [(bs, base[3]), (ts, cuops_fn)]
                        for i in range(rounds):
                            for times, fn in (sides if i % 2 == 0 else sides[::-1]):
                                times.append(measure(fn, min_rep_ms=rep_ms))
                        window = f" (>= {rep_ms} ms a timing)" if ts[0].method == "triton.do_bench" else ""
                        base_ms = statistics.median(b.ms for b in bs)
                        ms = statistics.median(t.ms for t in ts)
                        cublas = {"label": base[1], "call": base[2], "ms": base_ms, "runs_ms": [b.ms for b in bs],
                                  "reps": sum(b.reps for b in bs), "TFLOPs": r["flops"] / base_ms / 1e9,
                                  "ratio": base_ms / ms}
                        r["baselines"] = {"cublas": cublas}
                        r.update(status="ok", cuops_ms=ms, cuops_runs_ms=[t.ms for t in ts],
                                 cuops_reps=sum(t.reps for t in ts),
                                 timer=(ts[0].method + window
                                        + f", median of {rounds} rounds, baseline and cuops alternating"),
                                 single_ms=ts[0].single_ms, cuops_TFLOPs=r["flops"] / ms / 1e9,
                                 ratio=cublas["ratio"], fraction=cublas["ratio"])

                    guarded(rows, row, work)
                    if M == K == N == 4096 and row.get("single_ms") is not None:
                        slow_4096_ms = max(slow_4096_ms or 0.0, row["single_ms"])
                del pool
                free_memory(collect=set_bytes >= 2**28)
                log(f"gemm {dname}/{precision or '-'} {gemm_label(M, K, N)}: {time.perf_counter() - started:.1f}s")
    finally:
        torch.set_float32_matmul_precision(saved[0])
        torch.backends.cuda.matmul.allow_tf32 = saved[1]


# ----------------------------------------------------------------------------------------------
# Call overhead


OVERHEAD_CALLS = 10000
OVERHEAD_BATCHES = 5


def overhead_section() -> dict:
    result = {}
    try:
        result["python"] = python_overhead()
    except Exception as e:  # noqa: BLE001
        result["python"] = {"status": "error", "error": error_text(e)}
    result["cpp"] = cpp_overhead()
    return result


def python_overhead() -> dict:
    """Host microseconds per call at 16 elements: the dispatcher and launch path, not the kernel."""
    a, b = torch.randn(16, device=DEVICE), torch.randn(16, device=DEVICE)
    c = torch.empty(16, device=DEVICE)
    add2, add_out = torch.ops.cuops.add2, torch.ops.aten.add.out  # resolved once, like a hot loop would

    # Two plain loops rather than one loop over a lambda: the lambda's own call would be in both figures.
    def run_cuops(calls):
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            add2(c, a, b)
        sync()
        return (time.perf_counter() - t0) * 1e6 / calls

    def run_aten(calls):
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            add_out(a, b, out=c)
        sync()
        return (time.perf_counter() - t0) * 1e6 / calls

    run_cuops(1000)
    run_aten(1000)
    cu, at = [], []
    for _ in range(OVERHEAD_BATCHES):  # interleaved, so clock or load drift hits both alike
        cu.append(run_cuops(OVERHEAD_CALLS))
        at.append(run_aten(OVERHEAD_CALLS))
    cuops_us, aten_us = statistics.median(cu), statistics.median(at)
    return {"status": "ok", "cuops_us": cuops_us, "aten_us": aten_us, "cuops_over_aten": cuops_us / aten_us,
            "calls": OVERHEAD_CALLS, "batches": OVERHEAD_BATCHES, "cuops_batches_us": cu, "aten_batches_us": at,
            "baseline": "torch.ops.aten.add.out(a, b, out=c)"}


def cpp_overhead() -> dict:
    build = Path(os.environ.get("CUOPS_BUILD_DIR", REPO / "build"))
    exe = build / "bench" / "cuops_overhead"
    if not exe.is_file() or not os.access(exe, os.X_OK):
        return {"status": "missing", "reason": f"{exe} not built"}
    try:
        proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
        lines = [ln for ln in proc.stdout.splitlines() if ln.strip().startswith("{")]
        if proc.returncode != 0 or not lines:
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
            return {"status": "error", "error": f"exit {proc.returncode}: {' | '.join(tail)}"[:500]}
        data = json.loads(lines[-1])
        cuops_us, aten_us = float(data["cuops_us"]), float(data["aten_us"])
        return {"status": "ok", "cuops_us": cuops_us, "aten_us": aten_us, "cuops_over_aten": cuops_us / aten_us,
                "binary": str(exe), "baseline": "at::add_out(c, a, b)"}
    except Exception as e:  # noqa: BLE001
        return {"status": "error", "error": error_text(e)}


# ----------------------------------------------------------------------------------------------
# Output: table, JSON, plots


def fmt_time(ms) -> str:
    if ms is None:
        return "-"
    if ms < 1:
        return f"{ms * 1e3:.1f}us"
    if ms < 1000:
        return f"{ms:.3g}ms"
    return f"{ms / 1e3:.3g}s"


def fmt_num(x, suffix="") -> str:
    return "-" if x is None else f"{x:.3f}{suffix}"


def table_lines(results: dict) -> list[str]:
    """The stdout table: one line per (row, baseline). mm repeats gemm's kernel, so the table shows it
    only at the sizes with targets; every row is in the JSON."""
    head = (f"{'op':<12} {'dtype':<5} {'size':<15} {'cuops':>9}  {'baseline':<20} {'base time':>9} {'ratio':>7} "
            f"{'frac':>6} {'steady':>7}")
    lines = [head, "-" * len(head)]

    def line(op, dtype, size, ms, label, base_ms, ratio, frac, steady=None):
        cuops = ms if isinstance(ms, str) else fmt_time(ms)
        lines.append(f"{op:<12} {dtype:<5} {size:<15} {cuops:>9}  {label:<20} {fmt_time(base_ms):>9} "
                     f"{fmt_num(ratio, 'x'):>7} {fmt_num(frac):>6} {fmt_num(steady):>7}".rstrip())

    for r in results["rows"]:
        if r["family"] == "copy":
            continue
        if r["op"] == "mm" and not (r["M"] == r["K"] == r["N"] and r["M"] in (1024, 4096, 8192)):
            continue
        dtype = "tf32" if r.get("precision") == "high" else SHORT.get(r["dtype"], r["dtype"])
        if r.get("status") == "error":
            lines.append(f"{r['op']:<12} {dtype:<5} {r['size']:<15} ERROR {r.get('error', '')}"[:130])
            continue
        bases = r.get("baselines") or {}
        if not bases:
            lines.append(f"{r['op']:<12} {dtype:<5} {r['size']:<15} SKIPPED {r.get('skip_reason', '')}"[:130])
            continue
        for i, b in enumerate(bases.values()):
            if "error" in b:
                lines.append(f"{r['op']:<12} {dtype:<5} {r['size']:<15} {fmt_time(r.get('cuops_ms')):>9}  "
                             f"{b['label']:<20} ERROR {b['error']}"[:130])
                continue
            cuops_ms = r.get("cuops_ms") if r.get("status") == "ok" else r.get("status", "?")
            line(r["op"], dtype, r["size"], cuops_ms, b["label"], b.get("ms"), b.get("ratio"),
                 r.get("fraction") if i == 0 else None, r.get("steady_fraction") if i == 0 else None)
    for lang, o in (results.get("overhead") or {}).items():
        name = "overhead/" + ("py" if lang == "python" else "c++")
        if o.get("status") != "ok":
            lines.append(f"{name:<12} {'f32':<5} {'16':<15} {o.get('status', '').upper()} "
                         f"{o.get('reason') or o.get('error') or ''}"[:130])
            continue
        base = "aten.add.out" if lang == "python" else "at::add_out"
        lines.append(f"{name:<12} {'f32':<5} {'16':<15} {o['cuops_us']:>7.2f}us  {base:<20} {o['aten_us']:>7.2f}us "
                     f"{fmt_num(o['aten_us'] / o['cuops_us'], 'x'):>7} {'-':>6}")
    return lines


def plot(results: dict, out: Path) -> dict:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001 - plots are a convenience; the JSON holds every figure
        return {"error": f"matplotlib unavailable: {error_text(e)}"}
    written, errors = [], []
    rows = results["rows"]
    title = f"{results['gpu']} · torch {results['torch']} · {str(results['git_commit'])[:10]}"

    try:
        fig, ax = plt.subplots(figsize=(11, 6.5))
        copies = sorted((r for r in rows if r["family"] == "copy" and r.get("GBps")), key=lambda r: r["buffer_bytes"])
        if copies:
            ax.plot([r["buffer_bytes"] for r in copies], [r["GBps"] for r in copies], "k-", lw=2.5, marker="o",
                    label="D2D copy (read+write)")
        colors = {"add2": "C0", "vector_add": "C1", "scale": "C2", "square": "C3", "two_norm": "C4"}
        styles = {"float32": "-", "bfloat16": "--", "float16": ":"}
        for op in colors:
            for dname in styles:
                pts = sorted((r["n"] * DTYPES[dname].itemsize, r["achieved_GBps"]) for r in rows
                             if r["op"] == op and r["dtype"] == dname and r.get("status") == "ok"
                             and r.get("achieved_GBps"))
                if pts:
                    ax.plot(*zip(*pts), color=colors[op], ls=styles[dname], marker=".", label=f"{op} {SHORT[dname]}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes per operand (copy: per buffer)")
        ax.set_ylabel("achieved GB/s (bytes read + written / time)")
        ax.set_title(f"cuops memory-bound ops vs copy\n{title}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=2, loc="upper left")
        fig.tight_layout()
        fig.savefig(out / "bandwidth.png", dpi=120)
        plt.close(fig)
        written.append("bandwidth.png")
    except Exception as e:  # noqa: BLE001
        errors.append(f"bandwidth.png: {error_text(e)}")

    try:
        fig, axes = plt.subplots(2, 2, figsize=(11, 8))
        for ax, (dname, precision) in zip(axes.flat, GEMM_VARIANTS):
            sel = [r for r in rows if r["family"] == "gemm" and r["dtype"] == dname
                   and r["precision"] == precision and r["M"] == r["K"] == r["N"]]
            for op, color in (("gemm", "C0"), ("mm", "C2")):
                pts = sorted((r["M"], r["cuops_TFLOPs"]) for r in sel
                             if r["op"] == op and r.get("status") == "ok" and r.get("cuops_TFLOPs"))
                if pts:
                    ax.plot(*zip(*pts), color=color, marker="o", label=f"cuops {op}")
            pts = sorted((r["M"], r["baselines"]["cublas"]["TFLOPs"]) for r in sel
                         if r["op"] == "mm" and (r.get("baselines") or {}).get("cublas", {}).get("TFLOPs"))
            if pts:
                ax.plot(*zip(*pts), "k--", marker="s", label="cuBLAS (torch.mm)")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("M = N = K")
            ax.set_ylabel("TFLOP/s")
            ax.set_title({"high": "float32, TF32 on ('high')", "highest": "float32, TF32 off ('highest')"}.get(
                precision, dname), fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle(f"cuops GEMM vs cuBLAS\n{title}", fontsize=10)
        fig.tight_layout()
        fig.savefig(out / "gemm_tflops.png", dpi=120)
        plt.close(fig)
        written.append("gemm_tflops.png")
    except Exception as e:  # noqa: BLE001
        errors.append(f"gemm_tflops.png: {error_text(e)}")
    return {"written": written, "errors": errors}


def git_info() -> tuple[str, bool | None]:
    """(commit, dirty). CUOPS_GIT_COMMIT wins: the GPU machine's copy of the tree carries a .git that
    can lag the working tree it was sent with (seen: the session's first commit, marked dirty)."""
    if os.environ.get("CUOPS_GIT_COMMIT"):
        return os.environ["CUOPS_GIT_COMMIT"], None
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                timeout=20, check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                                capture_output=True, text=True, timeout=20, check=True).stdout
        return commit, bool(status.strip())
    except Exception:  # noqa: BLE001 - the GPU machine's copy of the tree may have no .git
        return os.environ.get("CUOPS_GIT_COMMIT", "unknown"), None


def device_info() -> dict:
    if DEVICE != "cuda":
        return {"type": "cpu"}
    p = torch.cuda.get_device_properties(0)
    return {"type": "cuda", "name": p.name, "capability": f"{p.major}.{p.minor}",
            "multiprocessors": p.multi_processor_count, "memory_bytes": p.total_memory,
            "l2_bytes": getattr(p, "L2_cache_size", None), "cuda": torch.version.cuda}


# ----------------------------------------------------------------------------------------------


@dataclass
class Config:
    sizes: list
    gemm_squares: list
    gemm_odd: list
    pool_bytes: float


FULL = Config(sizes=[2**16, 2**20, 2**24, 2**28, 2**30],
              gemm_squares=[256, 512, 1024, 2048, 4096, 8192],
              gemm_odd=[(4097, 4097, 4097), (1, 4096, 4096), (4096, 4096, 1), (8192, 1, 8192), (1000, 1000, 1000)],
              pool_bytes=POOL_BYTES)
QUICK = Config(sizes=[2**16, 2**24], gemm_squares=[256, 1024], gemm_odd=[(1000, 1000, 1000), (1, 4096, 4096)],
               pool_bytes=POOL_BYTES)
CPU = Config(sizes=[2**10, 2**14], gemm_squares=[32, 64], gemm_odd=[(33, 17, 9), (1, 64, 64), (64, 64, 1), (64, 1, 64)],
             pool_bytes=1e6)
SECTIONS = ("elementwise", "norm", "gemm", "overhead")


def main() -> int:
    global DEVICE, DO_BENCH, DEADLINE
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default bench/results; bench/results/tmp for --quick/--only/--device cpu)")
    parser.add_argument("--quick", action="store_true", help="fewer sizes, for smoke tests")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma list of sections: {','.join(SECTIONS)}")
    parser.add_argument("--budget-s", type=float, default=300.0,
                        help="start no measurement after this many seconds (later rows are recorded as skipped), "
                             "so the run ends inside its 6-minute slot")
    parser.add_argument("--gemm-squares", default=None,
                        help="comma list of square GEMM sizes instead of the configured ones (no odd shapes), "
                             "for a quick look at a few rows; the results go to bench/results/tmp")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: exercise the harness without a GPU (tiny sizes, wall clock; timings meaningless)")
    args = parser.parse_args()
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(only) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown section(s) {sorted(unknown)}; choose from {','.join(SECTIONS)}")
    partial = args.quick or set(only) != set(SECTIONS) or args.device == "cpu" or args.gemm_squares is not None
    out = args.out or (REPO / "bench" / "results" / ("tmp" if partial else ""))
    out.mkdir(parents=True, exist_ok=True)

    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("bench/run.py: no CUDA device (use --device cpu to smoke-test the harness)", file=sys.stderr)
        return 2
    cfg = CPU if DEVICE == "cpu" else QUICK if args.quick else FULL
    if args.gemm_squares is not None:
        cfg = dataclasses.replace(cfg, gemm_squares=[int(x) for x in args.gemm_squares.split(",") if x.strip()],
                                  gemm_odd=[])
    if DEVICE == "cuda":
        try:
            from triton.testing import do_bench
            DO_BENCH = do_bench
        except Exception as e:  # noqa: BLE001
            log(f"triton unavailable ({error_text(e)}): timing with CUDA events")

    lib = os.environ.get("CUOPS_LIBRARY", str(REPO / "build" / "libcuops.so"))
    torch.ops.load_library(lib)
    try:
        from torch import _dynamo
        for knob in ("recompile_limit", "cache_size_limit"):  # one recompile per size and dtype is expected
            if hasattr(_dynamo.config, knob):
                setattr(_dynamo.config, knob, 64)
    except Exception:  # noqa: BLE001
        pass
    torch.manual_seed(0)

    commit, dirty = git_info()
    try:
        build_info = json.loads(torch.ops.cuops.build_info())
    except Exception as e:  # noqa: BLE001
        build_info = error_text(e)
    results = {
        "schema": 1,
        "gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (harness smoke test)",
        "torch": torch.__version__, "git_commit": commit, "git_dirty": dirty,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device_info(), "library": lib, "build_info": build_info,
        "timer": "triton.testing.do_bench (median)" if DO_BENCH else f"events/wall clock, median of >= {MIN_REPS}",
        "args": {"quick": args.quick, "only": only, "device": DEVICE, "budget_s": args.budget_s},
        "copy_bandwidth_GBps": None, "rows": [], "overhead": {}, "elapsed_s": {},
    }
    json_path = out / ("h100.json" if DEVICE == "cuda" else "cpu_smoke.json")

    def save():
        # Written after every section, so a run cut short still leaves what it measured.
        json_path.write_text(json.dumps(results, indent=1) + "\n")

    t_start = time.perf_counter()
    DEADLINE = t_start + args.budget_s
    rows = results["rows"]
    ceiling = CopyCeiling(rows, cfg.pool_bytes)
    main_copy = ceiling.at(2**28 * 4 if DEVICE == "cuda" else 2**20 * 4)
    results["copy_bandwidth_GBps"] = main_copy.get("GBps")
    log(f"copy ceiling: {fmt_num(main_copy.get('GBps'))} GB/s ({main_copy['size']})")
    sections = {"elementwise": lambda: elementwise_section(cfg, rows, ceiling),
                "norm": lambda: norm_section(cfg, rows, ceiling),
                "gemm": lambda: gemm_section(cfg, rows),
                "overhead": lambda: results.__setitem__("overhead", overhead_section())}
    for name in SECTIONS:
        if name not in only:
            continue
        t0 = time.perf_counter()
        try:
            sections[name]()
        except Exception as e:  # noqa: BLE001 - a section-level failure still leaves the others
            results.setdefault("section_errors", {})[name] = error_text(e)
            log(f"section {name} failed: {error_text(e)}")
            traceback.print_exc()
        results["elapsed_s"][name] = round(time.perf_counter() - t0, 1)
        save()
    results["elapsed_s"]["total"] = round(time.perf_counter() - t_start, 1)
    results["plots"] = plot(results, out)
    save()

    print(f"cuops benchmarks on {results['gpu']} | torch {results['torch']} | commit {commit}"
          f"{' (dirty)' if dirty else ''} | timer {results['timer']}")
    print(f"ceiling: D2D copy {fmt_num(results['copy_bandwidth_GBps'])} GB/s at {main_copy['size']}; "
          "ratio = baseline time / cuops time (> 1: cuops faster); frac = cuops vs ceiling "
          "(copy GB/s at the operand's size, or cuBLAS)")
    for ln in table_lines(results):
        print(ln)
    print(f"wrote {json_path}" + "".join(f", {out / p}" for p in results["plots"].get("written", []))
          + f" in {results['elapsed_s']['total']:.0f}s")
    for err in results["plots"].get("errors", []) + ([results["plots"]["error"]] if "error" in results["plots"] else []):
        print(f"plot: {err}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
