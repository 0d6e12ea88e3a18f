"""Host time per call of add2 against aten's add.out at 16 elements, from Python and from C++."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import time

import torch

from ..context import Run
from ..harness import Bench, error_text
from ..library import build_dir

CALLS = 10000
BATCHES = 5


def run(ctx: Run) -> None:
    result = {}
    try:
        result["python"] = python_overhead(ctx.bench)
    except Exception as e:  # noqa: BLE001
        result["python"] = {"status": "error", "error": error_text(e)}
    result["cpp"] = cpp_overhead()
    ctx.results["overhead"] = result


def python_overhead(bench: Bench) -> dict:
    """Host microseconds per call at 16 elements: the dispatcher and launch path, not the kernel."""
    a, b = torch.randn(16, device=bench.device), torch.randn(16, device=bench.device)
    c = torch.empty(16, device=bench.device)
    add2, add_out = torch.ops.cuops.add2, torch.ops.aten.add.out  # resolved once, like a hot loop would

    # A plain loop per op rather than one loop over a lambda: the lambda's own call would be in both figures.
    def cuops_loop(calls):
        for _ in range(calls):
            add2(c, a, b)

    def aten_loop(calls):
        for _ in range(calls):
            add_out(a, b, out=c)

    def us_per_call(loop, calls):
        bench.sync()
        t0 = time.perf_counter()
        loop(calls)
        bench.sync()
        return (time.perf_counter() - t0) * 1e6 / calls

    us_per_call(cuops_loop, 1000)
    us_per_call(aten_loop, 1000)
    cu, at = [], []
    for _ in range(BATCHES):  # interleaved, so clock or load drift hits both alike
        cu.append(us_per_call(cuops_loop, CALLS))
        at.append(us_per_call(aten_loop, CALLS))
    cuops_us, aten_us = statistics.median(cu), statistics.median(at)
    return {"status": "ok", "cuops_us": cuops_us, "aten_us": aten_us, "cuops_over_aten": cuops_us / aten_us,
            "calls": CALLS, "batches": BATCHES, "cuops_batches_us": cu, "aten_batches_us": at,
            "baseline": "torch.ops.aten.add.out(a, b, out=c)"}


def cpp_overhead() -> dict:
    """bench/overhead.cpp's figures, when the build made it."""
    exe = build_dir() / "bench" / "cuops_overhead"
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
