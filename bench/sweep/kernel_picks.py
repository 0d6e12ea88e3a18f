"""Which kernels torch.mm (cuBLAS) and cuops.mm launch for the shape suite's products: names (cuBLAS
names its tile, stages and split-k), grids, blocks and GPU times from torch.profiler, side by side.
What the planner should learn from, not a benchmark: times are warm (no L2 flush), a few calls each.

    python3 bench/sweep/kernel_picks.py --dtypes float64,bfloat16 --classes mid --models gpt-2 [--max-ratio 0.9]

--max-ratio keeps only the products where cuops's total is slower than cuBLAS's by more than that ratio."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cuops_bench.library import load_library  # noqa: E402
from cuops_bench.profiling import gpu_events  # noqa: E402
from cuops_bench.shapes import products  # noqa: E402

import torch  # noqa: E402

DTYPES = {"float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16, "tf32": torch.float32,
          "float32": torch.float32}


def calls_kernels(fn, calls: int) -> list[list[dict]]:
    """The kernels (and memsets) of each of `calls` calls of fn, in launch order."""
    def run():
        for _ in range(calls):
            fn()
    events = gpu_events(run)
    per = max(1, len(events) // calls)
    out = []
    for i in range(calls):
        out.append([{"name": e["name"], "us": e["dur"], "grid": e.get("args", {}).get("grid"),
                     "block": e.get("args", {}).get("block"), "regs": e.get("args", {}).get("registers per thread"),
                     "smem": e.get("args", {}).get("shared memory")} for e in events[i * per:(i + 1) * per]])
    return out


def summary(calls: list[list[dict]]) -> tuple[float, list[str]]:
    total = statistics.median(sum(k["us"] for k in c) for c in calls)
    lines = []
    for j, k in enumerate(calls[0]):
        us = statistics.median(c[j]["us"] for c in calls if len(c) > j)
        name = k["name"]
        if len(name) > 110:
            name = name[:110] + "..."
        lines.append(f"    {us:8.2f}us grid {k['grid']} block {k['block']} regs {k['regs']} smem {k['smem']}  {name}")
    return total, lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="float64")
    ap.add_argument("--classes", default="mid,training")
    ap.add_argument("--models", default=None)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--max-ratio", type=float, default=None)
    args = ap.parse_args()
    load_library()
    models = args.models.split(",") if args.models else None
    classes = set(args.classes.split(","))
    for dname in args.dtypes.split(","):
        torch.backends.cuda.matmul.allow_tf32 = dname == "tf32"
        torch.set_float32_matmul_precision("high" if dname == "tf32" else "highest")
        for p in products(models):
            if p.cls not in classes:
                continue
            a, b = p.operands(DTYPES[dname], "cuda")
            for _ in range(3):
                torch.mm(a, b)
                torch.ops.cuops.mm(a, b)
            t_total, t_lines = summary(calls_kernels(lambda: torch.mm(a, b), args.calls))
            c_total, c_lines = summary(calls_kernels(lambda: torch.ops.cuops.mm(a, b), args.calls))
            ratio = t_total / c_total
            if args.max_ratio is not None and ratio > args.max_ratio:
                continue
            print(f"{dname} {p.cls} {p.label()} a {p.a_major}-major b {p.b_major}-major: torch {t_total:.2f}us "
                  f"cuops {c_total:.2f}us ratio {ratio:.3f}")
            print("  torch.mm:")
            print("\n".join(t_lines))
            print("  cuops.mm:")
            print("\n".join(c_lines))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
