"""The shape suite's products (bench/cuops_bench/shapes.py) as SWEEP_SHAPES lists for the C++ sweeps
(f64_sweep, gemm_lib_sweep), one layout at a time, since the sweeps take one layout per run:

    SWEEP_LAYOUT=kk SWEEP_SHAPES=$(python3 bench/sweep/suite_shapes.py kk --classes mid,training) f64_sweep

kk: forward rows (a k-major, b k-major), kn: input gradients (b n-major), mn: weight gradients (a
m-major). --max-tokens drops products over that many tokens (the long weight gradients of the large
token counts take seconds a configuration)."""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cuops_bench.shapes import select  # noqa: E402

LAYOUT = {"forward": "kk", "input_grad": "kn", "weight_grad": "mn"}

ap = argparse.ArgumentParser()
ap.add_argument("layout", choices=sorted(set(LAYOUT.values())))
ap.add_argument("--classes", default="mid,training")
ap.add_argument("--models", default=None)
ap.add_argument("--max-tokens", type=int, default=None)
args = ap.parse_args()
chosen = [p for p in select(args.classes.split(","), args.models.split(",") if args.models else None, args.max_tokens)
          if LAYOUT[p.kind] == args.layout]
print(";".join(f"{p.m},{p.n},{p.k}" for p in chosen))
