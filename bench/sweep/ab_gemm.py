"""Two builds of libcuops side by side on the same GEMMs: does a change slow a kernel down? One process per
library (a process holds one cuops library), the two alternating over rounds so that clock drift under
the power cap falls on both; each case's time is the median over rounds of do_bench medians.

    python3 bench/sweep/ab_gemm.py OLD/libcuops.so NEW/libcuops.so [--portable]

--portable sets CUOPS_DISABLE_WGMMA=1 in both: the mma.sync kernels GPUs without sm_90a run (on Hopper
they otherwise run only for operands TMA cannot describe, so the benchmark does not time them)."""
import argparse
import json
import os
import statistics
import subprocess
import sys

CASES = [(dtype, size, la, lb) for dtype in ("bfloat16", "float16", "tf32") for size in (2048, 4096)
         for la in ("row", "t") for lb in ("row", "t")]


def worker(library):
    import torch
    from triton.testing import do_bench
    torch.ops.load_library(library)
    torch.set_float32_matmul_precision("high")
    out = {}
    for dtype, size, la, lb in CASES:
        dt = torch.float32 if dtype == "tf32" else getattr(torch, dtype)
        a = torch.randn(size, size, device="cuda", dtype=dt)
        b = torch.randn(size, size, device="cuda", dtype=dt)
        a, b = (a.t() if la == "t" else a), (b.t() if lb == "t" else b)
        out[f"{dtype} {size}^3 a {la} b {lb}"] = do_bench(lambda: torch.ops.cuops.mm(a, b), warmup=25, rep=100,
                                                          return_mode="median")
    print(json.dumps(out))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--portable", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)
    env = dict(os.environ, **({"CUOPS_DISABLE_WGMMA": "1"} if args.portable else {}))
    times = {"old": [], "new": []}
    for r in range(args.rounds):
        for side in (("old", "new") if r % 2 == 0 else ("new", "old")):
            lib = getattr(args, side)
            proc = subprocess.run([sys.executable, __file__, "x", "y", "--worker", lib], env=env, capture_output=True,
                                  text=True, check=True)
            times[side].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(f"{'case':<30} {'old ms':>9} {'new ms':>9} {'old/new':>8}")
    for case in times["old"][0]:
        old = statistics.median(t[case] for t in times["old"])
        new = statistics.median(t[case] for t in times["new"])
        print(f"{case:<30} {old:9.4f} {new:9.4f} {old / new:8.3f}")


if __name__ == "__main__":
    sys.exit(main())
