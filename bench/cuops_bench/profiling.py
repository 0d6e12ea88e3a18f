"""GPU activity of a piece of host code, from torch.profiler: the one home of the trace parsing the
sweep probes share (bench/sweep/kernel_picks.py, step_profile.py)."""
from __future__ import annotations

import json
import tempfile

import torch


def gpu_events(run) -> list[dict]:
    """The kernels, memsets and copies run() launches (chrome-trace events: name, dur in us, args with
    grid, block, registers, shared memory), in launch order; the GPU is idle before and after."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = json.load(open(f.name))
    events = [e for e in trace["traceEvents"] if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")]
    return sorted(events, key=lambda e: e["ts"])
