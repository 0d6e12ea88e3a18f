"""torch.mm against cuops.mm on squares, the side that goes first alternating over rounds (clock drift
under the power cap falls on both): each round one do_bench (L2 flush) a side; the ratio of the two
sides' medians and the range of the per-round ratios. For rows that swing between bench runs.

    python3 bench/sweep/ab_torch.py [--dtype float64] [--sizes 1024,4096,8192] [--rounds 10]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cuops_bench.library import load_library  # noqa: E402

import torch  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float64")
    parser.add_argument("--sizes", default="1024,4096,8192")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    load_library()
    from triton.testing import do_bench
    dtype = getattr(torch, args.dtype)
    for size in map(int, args.sizes.split(",")):
        a = torch.randn(size, size, device="cuda", dtype=dtype)
        b = torch.randn(size, size, device="cuda", dtype=dtype)
        sides = {"torch": lambda: torch.mm(a, b), "cuops": lambda: torch.ops.cuops.mm(a, b)}
        times = {key: [] for key in sides}
        for r in range(args.rounds):
            for key in (("torch", "cuops") if r % 2 == 0 else ("cuops", "torch")):
                times[key].append(do_bench(sides[key], warmup=50, rep=150))
        mt, mc = statistics.median(times["torch"]), statistics.median(times["cuops"])
        ratios = sorted(t / c for t, c in zip(times["torch"], times["cuops"]))
        print(f"{args.dtype} {size}^3: torch {mt * 1e3:.1f} us cuops {mc * 1e3:.1f} us ratio of medians {mt / mc:.3f} "
              f"per-round {ratios[0]:.3f}-{ratios[-1]:.3f} ({2 * size ** 3 / mc / 1e9:.1f} TFLOP/s)")


if __name__ == "__main__":
    main()
