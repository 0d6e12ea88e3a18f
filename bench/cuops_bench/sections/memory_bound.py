"""Rows of the memory-bound sections (elementwise, norm): bandwidth against the copy ceiling."""
from __future__ import annotations

from ..harness import Baseline, Bench, error_text


def pow2_label(n: int) -> str:
    return f"2^{n.bit_length() - 1}" if n > 0 and n & (n - 1) == 0 else str(n)


def memory_row(bench: Bench, row: dict, cuops_fn, baselines: list[Baseline], copy: dict) -> None:
    """Times cuops_fn and each baseline; fills row in place. copy: the ceiling row at the byte count
    of the row's largest operand."""
    t = bench.measure(cuops_fn)
    copy_gbps = copy.get("GBps")
    row.update(status="ok", cuops_ms=t.ms, cuops_reps=t.reps, timer=t.method,
               achieved_GBps=row["bytes"] / t.ms / 1e6, ceiling="copy",
               copy_bytes=copy.get("buffer_bytes"), copy_GBps=copy_gbps)
    row["fraction"] = row["achieved_GBps"] / copy_gbps if copy_gbps else None
    ts = bench.measure(cuops_fn, flush=False) if bench.records_steady else None
    if ts is not None:
        row["steady_ms"] = ts.ms
        if copy.get("steady_GBps"):
            row["steady_fraction"] = row["bytes"] / ts.ms / 1e6 / copy["steady_GBps"]
    row["baselines"] = {b.key: baseline_entry(bench, row["bytes"], b, t.ms, ts, copy_gbps) for b in baselines}
    row["ratio"] = row["baselines"][baselines[0].key].get("ratio")


def baseline_entry(bench: Bench, moved: int, base: Baseline, cuops_ms: float, steady, copy_gbps) -> dict:
    """A failed baseline records its error and leaves the row standing."""
    entry = {"label": base.label, "call": base.call}
    try:
        bt = bench.measure(base.fn)
        gbps = moved / bt.ms / 1e6
        entry.update(ms=bt.ms, reps=bt.reps, ratio=bt.ms / cuops_ms, GBps=gbps,
                     fraction=gbps / copy_gbps if copy_gbps else None)
        if steady is not None:
            bs = bench.measure(base.fn, flush=False)
            entry.update(steady_ms=bs.ms, steady_ratio=bs.ms / steady.ms)
    except Exception as e:  # noqa: BLE001
        entry["error"] = error_text(e)
    return entry
