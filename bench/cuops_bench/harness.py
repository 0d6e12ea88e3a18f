"""How every section measures: timers, input rotation, the copy ceiling, alternating GEMM rounds.

bench/PROTOCOL.md says why each number below is what it is.
"""
from __future__ import annotations

import gc
import itertools
import math
import os
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

WARMUP_MS = 25
REP_MS = 100
MIN_REPS = 20
CAP_MS = 2000.0          # most time spent timing one slow function (the naive GEMM at 4096+)
MIN_SLOW_REPS = 3
BATCH_MS = 1.0           # fallback timer: batches this long make event resolution (~0.5 us) irrelevant
POOL_BYTES = 200e6       # 4x the H100's 50 MB L2: rotate input sets until their total exceeds this
CPU_POOL_BYTES = 1e6     # the cpu smoke test has no L2 to defeat, only time to save
MAX_POOL_SETS = 4096
# GEMM rows of at least STEADY_MNK multiply-adds run STEADY_ROUNDS rounds; from LONG_MNK each timing
# spans at least LONG_REP_MS (PROTOCOL.md, "GEMM rounds").
STEADY_MNK = 4096**3
STEADY_ROUNDS = 12
LONG_MNK = 8192**3
LONG_REP_MS = 400
# Steady state (PROTOCOL.md, "Steady state"): memory-bound GEMM rows and the model's decode step are
# timed as CUDA graph replays, each side in GRAPH_ROUNDS rounds alternating with its baselines.
GRAPH_ROUNDS = 5
GRAPH_WARMUP_CALLS = 3    # calls on a side stream before capture, as torch.cuda.graph asks
GRAPH_WARMUP_REPLAYS = 3
GRAPH_ROUND_MS = 10.0     # one round's replays span at least this long (and at least MIN_REPS replays): a replay is
                          # one pass over >= 200 MB, >= 60 us on an H100
GRAPH_MAX_REPLAYS = 1000
MIN_GRAPH_SETS = 2        # a weight alone larger than the pool still alternates with a second copy

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


class BudgetSpent(Exception):
    """Raised instead of starting a measurement once the run's time budget is spent."""


class Baseline(NamedTuple):
    key: str       # the row's baselines key: "torch", "eager", "compiled", "cublas"
    label: str     # short, for the table
    call: str      # the Python expression timed, for the JSON
    fn: Callable   # the timed function (rotating over the inputs)


@dataclass
class Timing:
    ms: float          # median milliseconds per call
    reps: int          # timed calls behind the median (approximate for do_bench, which picks its own)
    method: str
    single_ms: float   # one call timed right after a warm-up call; the GEMM skip rule reads it


def log(msg: str) -> None:
    """Progress goes to stderr so stdout stays the table."""
    print(msg, file=sys.stderr, flush=True)


def error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]


def bytes_label(b: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= size:
            return f"{b / size:g} {unit}"
    return f"{b} B"


def make_pool(make_set, set_bytes: float, pool_bytes: float) -> list:
    """Enough input sets that their total exceeds pool_bytes (one set if it alone does)."""
    count = 1 if set_bytes >= pool_bytes else min(MAX_POOL_SETS, math.ceil(pool_bytes / set_bytes))
    return [make_set() for _ in range(count)]


def steady_pool_count(set_bytes: float, pool_bytes: float) -> int:
    """Input sets for one steady-state loop: their total exceeds pool_bytes, and there are at least two,
    so consecutive calls never read the same operands (a 235 MB weight still fits in no L2 twice)."""
    return min(MAX_POOL_SETS, max(MIN_GRAPH_SETS, math.ceil(pool_bytes / set_bytes)))


def rotating(pool: list, call):
    """fn() for the timer: each call takes the next input set."""
    if len(pool) == 1:
        only = pool[0]
        return lambda: call(*only)
    sets = itertools.cycle(pool)
    return lambda: call(*next(sets))


def graphed(bench, make):
    """make() -> fn, then fn captured once in a CUDA graph and the graph's replay returned (fn itself
    without a GPU): the same kernels without the host's work. For a call whose host side outlasts its
    kernels and the L2 flush before them (autograd's engine: 75-105 us a backward, more than
    rms_norm's 8192 x 2048 bf16 backward of ~48 us), where do_bench would time the host. make runs on
    the capture's stream: a backward runs on its forward's stream, so a forward make runs is captured
    with it."""
    if not bench.cuda:
        fn = make()
        fn()
        return fn
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn = make()
        for _ in range(1 + GRAPH_WARMUP_CALLS):  # torch.compile, lazy loading: outside the capture
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        fn()

    def replay(fn=fn):  # fn holds the tensors the graph reads: they live as long as the replay
        graph.replay()
    return replay


def guarded(rows: list, row: dict, work) -> None:
    """Runs work(row), turning an exception into a skipped or error row, and appends the row: one
    failed row must not end the run."""
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


@dataclass
class Rounds:
    """One GEMM row's timings, baseline and cuops in rounds of alternating order."""
    baseline: list[Timing]
    cuops: list[Timing]
    rep_ms: int

    @property
    def baseline_ms(self) -> float:
        return statistics.median(t.ms for t in self.baseline)

    @property
    def cuops_ms(self) -> float:
        return statistics.median(t.ms for t in self.cuops)

    @property
    def timer(self) -> str:
        method = self.cuops[0].method
        window = f" (>= {self.rep_ms} ms a timing)" if method == "triton.do_bench" else ""
        return f"{method}{window}, median of {len(self.cuops)} rounds, baseline and cuops alternating"


@dataclass
class Bench:
    """The run's measuring state: the device, Triton's do_bench (None: CUDA events, or the wall clock
    on cpu), the perf_counter() time after which no measurement starts (--budget-s), and the bytes of
    inputs a rotation must exceed."""
    device: str = "cuda"
    do_bench: Callable | None = None
    deadline: float = math.inf
    pool_bytes: float = POOL_BYTES

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    @classmethod
    def for_device(cls, device: str) -> Bench:
        if device != "cuda":
            return cls(device, pool_bytes=CPU_POOL_BYTES)
        try:
            from triton.testing import do_bench
        except Exception as e:  # noqa: BLE001
            log(f"triton unavailable ({error_text(e)}): timing with CUDA events")
            do_bench = None
        return cls(device, do_bench)

    @property
    def records_steady(self) -> bool:
        """Memory-bound rows carry the batched (steady) figure beside do_bench's flushed one."""
        return self.do_bench is not None

    @property
    def timer_name(self) -> str:
        return "triton.testing.do_bench (median)" if self.do_bench else f"events/wall clock, median of >= {MIN_REPS}"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def free_memory(self, collect: bool = False) -> None:
        """Hands cached blocks back between sizes so the next, larger size has the memory. Tensors die
        by reference counting; a full gc pass (0.2 s once inductor is loaded) runs only after big sizes."""
        if collect:
            gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()

    def check_memory(self, need_bytes: float) -> str | None:
        """A skip reason when the device cannot hold need_bytes (with 10% slack), else None."""
        if not self.cuda:
            return None
        free, _total = torch.cuda.mem_get_info()
        if need_bytes > 0.9 * free:
            return f"needs {need_bytes / 1e9:.1f} GB, {free / 1e9:.1f} GB free"
        return None

    def input_pool(self, make_set, set_bytes: float, need_bytes: float) -> tuple[list | None, dict]:
        """(pool, {}), or (None, the status fields of rows that cannot run for want of memory)."""
        reason = self.check_memory(need_bytes)
        if reason is not None:
            return None, {"status": "skipped", "skip_reason": reason}
        try:
            return make_pool(make_set, set_bytes, self.pool_bytes), {}
        except Exception as e:  # noqa: BLE001
            return None, {"status": "error", "error": f"allocating inputs failed: {error_text(e)}"}

    def elapsed_ms(self, fn, calls: int) -> float:
        """Milliseconds per call over `calls` back-to-back calls."""
        if self.cuda:
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

    def check_budget(self) -> None:
        if time.perf_counter() > self.deadline:
            raise BudgetSpent("the run's time budget (--budget-s) was spent before this measurement")

    def measure(self, fn, cap_ms: float = CAP_MS, flush: bool = True, min_rep_ms: float = REP_MS) -> Timing:
        """flush=True: do_bench (L2 flushed before each call, at least min_rep_ms of calls) when Triton
        is there; False: back-to-back batches."""
        self.check_budget()
        fn()  # first call outside the timing: lazy module loading, cuBLAS handles, torch.compile
        self.sync()
        single = self.elapsed_ms(fn, 1)
        if single * MIN_REPS > cap_ms:
            return self._few_calls(fn, cap_ms, single)
        if self.do_bench is not None and flush:
            return self._flushed(fn, min_rep_ms, single)
        return self._batched(fn, single)

    def _few_calls(self, fn, cap_ms: float, single: float) -> Timing:
        """Too slow for MIN_REPS calls within cap_ms (the naive GEMM): fewer, one by one."""
        reps = max(MIN_SLOW_REPS, int(cap_ms / single))
        times = [self.elapsed_ms(fn, 1) for _ in range(reps)]
        return Timing(statistics.median(times), reps, "events, capped", single)

    def _flushed(self, fn, min_rep_ms: float, single: float) -> Timing:
        # do_bench repeats rep / estimate times, its estimate being (call + L2 flush); a budget of
        # 25 calls keeps that >= 20 even when the flush is a quarter of the call.
        rep_ms = max(min_rep_ms, 1.25 * MIN_REPS * single)
        ms = self.do_bench(fn, warmup=WARMUP_MS, rep=rep_ms, return_mode="median")
        return Timing(float(ms), max(MIN_REPS, int(rep_ms / (single + 0.1))), "triton.do_bench", single)

    def _batched(self, fn, single: float) -> Timing:
        # At least 3 calls a batch: back to back, so the steady rate is measured even for multi-ms calls.
        calls = max(3, math.ceil(BATCH_MS / max(single, 1e-4)))
        self.elapsed_ms(fn, 2 * calls)  # warm-up
        times = [self.elapsed_ms(fn, calls) for _ in range(MIN_REPS + 5)]
        method = "cuda events" if self.cuda else "wall clock (cpu)"
        return Timing(statistics.median(times), len(times), f"{method}, batches of {calls}", single)

    def alternating_rounds(self, baseline_fn, cuops_fn, multiply_adds: int) -> Rounds:
        """Rounds of (baseline, cuops), the order flipped every round (B C, C B, ...), so drift in the
        clock under the power cap falls on both sides alike."""
        rep_ms = LONG_REP_MS if multiply_adds >= LONG_MNK else REP_MS
        rounds = Rounds([], [], rep_ms)
        sides = [(rounds.baseline, baseline_fn), (rounds.cuops, cuops_fn)]
        for i in range(STEADY_ROUNDS if multiply_adds >= STEADY_MNK else 2):
            for times, fn in (sides if i % 2 == 0 else sides[::-1]):
                times.append(self.measure(fn, min_rep_ms=rep_ms))
        return rounds

    def steady_rounds(self, loops: dict, rounds: int = GRAPH_ROUNDS) -> dict[str, list[Timing]]:
        """{key: one Timing per round} for SteadyLoops timed in rounds of alternating order (A B C,
        C B A, ...), so clock drift under the power cap falls on every side alike."""
        self.check_budget()
        order = list(loops)
        timings = {key: [] for key in order}
        for i in range(rounds):
            for key in (order if i % 2 == 0 else order[::-1]):
                timings[key].append(loops[key].time())
        return timings


class SteadyLoop:
    """fn(*set) once per input set, in order, captured as one CUDA graph: a replay is one pass over a
    pool larger than L2, calls back to back as a model's layers run them, with no launch gaps from
    Python and no flush between calls. do_bench's zeroing flush leaves dirty L2 lines whose write-back
    lands in the timed call, which distorts calls of a few microseconds (SPEC §4).

    Without a GPU there is nothing to capture: time() is the rotating batched timer, so the cpu smoke
    run goes through the same code."""

    def __init__(self, bench: Bench, fn, pool: list):
        self.bench, self.calls, self.graph = bench, len(pool), None
        self.fallback = rotating(pool, fn)
        # One call on the current stream first: torch.compile and its autotuning, cuBLAS handles and
        # lazy module loading happen here rather than on the side stream or inside the capture (and a
        # function that cannot run fails here, on cpu too, before any timing).
        fn(*pool[0])
        if not bench.cuda:
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for args in pool[:GRAPH_WARMUP_CALLS]:
                fn(*args)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for args in pool:
                fn(*args)  # outputs die at once: the graph's pool reuses them, as a model's activations
        self.graph = graph

    def time(self) -> Timing:
        """Median per-call time of one round of replays."""
        if self.graph is None:
            return self.bench.measure(self.fallback, flush=False)
        self.bench.check_budget()
        warm = self.bench.elapsed_ms(self.graph.replay, GRAPH_WARMUP_REPLAYS)
        reps = min(GRAPH_MAX_REPLAYS, max(MIN_REPS, math.ceil(GRAPH_ROUND_MS / max(warm, 1e-3))))
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for start, end in events:
            start.record()
            self.graph.replay()
            end.record()
        events[-1][1].synchronize()
        per_call = [start.elapsed_time(end) / self.calls for start, end in events]
        return Timing(statistics.median(per_call), reps * self.calls,
                      f"cuda graph of {self.calls} calls, median of {reps} replays", warm / self.calls)

    def close(self) -> None:
        if self.graph is not None:
            self.graph.reset()
            self.graph = None


def steady_timer_name(timings: list[Timing]) -> str:
    return f"{timings[0].method} a round, median of {len(timings)} rounds, sides alternating"


class CopyCeiling:
    """dst.copy_(src) bandwidth per buffer size, measured once per size and recorded as a row."""

    def __init__(self, bench: Bench, rows: list):
        self.bench, self.rows, self.cache = bench, rows, {}

    def reference(self) -> dict:
        """"The" ceiling: 2^28 float32 elements (1 GiB) on a GPU, 2^20 in the cpu smoke test."""
        return self.at(4 * (2**28 if self.bench.cuda else 2**20))

    def at(self, buffer_bytes: int) -> dict:
        if buffer_bytes not in self.cache:
            row = {"family": "copy", "op": "copy", "dtype": None, "precision": None,
                   "size": bytes_label(buffer_bytes), "n": buffer_bytes // 4, "buffer_bytes": buffer_bytes,
                   "bytes": 2 * buffer_bytes, "ceiling": None}
            guarded(self.rows, row, self._measure)
            self.bench.free_memory()
            self.cache[buffer_bytes] = row
        return self.cache[buffer_bytes]

    def _measure(self, row: dict) -> None:
        if row["buffer_bytes"] % 4:
            raise ValueError("copy buffers are whole float32s")
        n, device, moved = row["n"], self.bench.device, row["bytes"]
        pool = make_pool(lambda: (torch.randn(n, device=device), torch.randn(n, device=device)),
                         moved, self.bench.pool_bytes)
        fn = rotating(pool, lambda src, dst: dst.copy_(src))
        t = self.bench.measure(fn)
        row.update(status="ok", ms=t.ms, reps=t.reps, timer=t.method, GBps=moved / t.ms / 1e6)
        if self.bench.records_steady:
            ts = self.bench.measure(fn, flush=False)
            row.update(steady_ms=ts.ms, steady_GBps=moved / ts.ms / 1e6)

    def graph_at(self, buffer_bytes: int) -> dict:
        """The copy row at buffer_bytes with `graph_ms` / `graph_GBps`: the copy timed as SteadyLoop
        times the rows compared with it (same pool rule, same graph replays), so a fraction of copy
        does not mix two timers. Measured once per size; on cpu the batched figure."""
        row = self.at(buffer_bytes)
        if row.get("status") == "ok" and "graph_GBps" not in row:
            try:
                self._measure_graph(row)
            except BudgetSpent:
                raise
            except Exception as e:  # noqa: BLE001 - the flushed figure still stands
                row["graph_error"] = error_text(e)
            self.bench.free_memory()
        return row

    def _measure_graph(self, row: dict) -> None:
        n, device, moved = row["n"], self.bench.device, row["bytes"]
        count = steady_pool_count(moved, self.bench.pool_bytes)
        pool = [(torch.randn(n, device=device), torch.randn(n, device=device)) for _ in range(count)]
        loop = SteadyLoop(self.bench, lambda src, dst: dst.copy_(src), pool)
        try:
            times = [loop.time() for _ in range(3)]
        finally:
            loop.close()
        ms = statistics.median(t.ms for t in times)
        row.update(graph_ms=ms, graph_GBps=moved / ms / 1e6,
                   graph_timer=f"{times[0].method} a round, median of {len(times)} rounds")
