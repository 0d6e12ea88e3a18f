"""cuops.mm on the shape suite's products with and without an environment setting, each side against
torch.mm in its own process (the library reads such settings once, e.g. CUOPS_DISABLE_WGMMA=1: the
plans a GPU without wgmma gets). The two processes alternate over rounds, so clock drift under the
power cap falls on both; a product's figure is the median over rounds of do_bench (L2 flushed).

    python3 bench/sweep/ab_env.py --env CUOPS_DISABLE_WGMMA=1 --dtype tf32 --classes training --max-tokens 1024
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def worker(args) -> None:
    from cuops_bench.context import SHAPE_VARIANTS
    from cuops_bench.library import load_library
    from cuops_bench.shapes import select
    import torch
    from triton.testing import do_bench
    load_library()
    dname, precision = SHAPE_VARIANTS[args.dtype]
    torch.set_float32_matmul_precision(precision or "highest")
    dtype = getattr(torch, dname)
    gen = torch.Generator(device="cuda").manual_seed(0)
    out = []
    for i, p in enumerate(select(args.classes.split(","), args.models.split(",") if args.models else None,
                                 args.max_tokens)):
        a, b = p.operands(dtype, "cuda", gen)
        sides = {"torch": lambda: torch.mm(a, b), "cuops": lambda: torch.ops.cuops.mm(a, b)}
        order = ("torch", "cuops") if i % 2 == 0 else ("cuops", "torch")
        t = {key: do_bench(sides[key], warmup=10, rep=60) for key in order}
        out.append({"label": p.label(), "torch": t["torch"], "cuops": t["cuops"]})
        del a, b
    print("RESULT " + json.dumps(out), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", required=True, help="NAME=VALUE set in the second process")
    ap.add_argument("--dtype", default="tf32", help="a shape-suite variant: bfloat16, float16, tf32, float32 ('highest'), float64")
    ap.add_argument("--classes", default="training")
    ap.add_argument("--models", default=None)
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    name, value = args.env.split("=", 1)
    runs = {"base": [], "env": []}
    for r in range(args.rounds):
        for side in (("base", "env") if r % 2 == 0 else ("env", "base")):
            env = dict(os.environ)
            env.pop(name, None)
            if side == "env":
                env[name] = value
            res = subprocess.run([sys.executable, __file__, "--worker"] + sys.argv[1:], env=env, check=True,
                                 capture_output=True, text=True)
            line = next(x for x in res.stdout.splitlines() if x.startswith("RESULT "))
            runs[side].append(json.loads(line[len("RESULT "):]))
    print(f"{args.dtype}: ratio = torch.mm / cuops.mm (medians of {args.rounds} rounds); env: {args.env}")
    print(f"{'product':70s} {'torch':>9s} {'base':>9s} {'env':>9s} {'r.base':>7s} {'r.env':>7s} {'env/base':>8s}")
    gains = []
    for i, row in enumerate(runs["base"][0]):
        med = {side: {k: statistics.median(run[i][k] for run in runs[side]) for k in ("torch", "cuops")} for side in runs}
        tt = statistics.median([med["base"]["torch"], med["env"]["torch"]])
        rb, re_ = med["base"]["torch"] / med["base"]["cuops"], med["env"]["torch"] / med["env"]["cuops"]
        gains.append(re_ / rb)
        print(f"{row['label']:70s} {tt * 1e3:8.1f}u {med['base']['cuops'] * 1e3:8.1f}u {med['env']['cuops'] * 1e3:8.1f}u "
              f"{rb:7.3f} {re_:7.3f} {re_ / rb:8.3f}")
    print(f"geomean env/base {statistics.geometric_mean(gains):.3f} over {len(gains)} products")


if __name__ == "__main__":
    main()
