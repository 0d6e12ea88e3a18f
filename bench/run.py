#!/usr/bin/env python3
"""cuops benchmarks: every op against its baselines, in one process, on one GPU (SPEC.md §3, §4).

    python3 bench/run.py --out bench/results          # the full run, under 6 minutes on an H100
    python3 bench/run.py --quick --only gemm          # smoke test of one section
    python3 bench/run.py --device cpu                 # harness smoke test without a GPU (timings meaningless)

The library comes from $CUOPS_LIBRARY, else $CUOPS_BUILD_DIR/libcuops.so, else <repo>/build/libcuops.so.
A run restricted with --quick, --only, --gemm-squares or --device cpu writes to bench/results/tmp/
(git-ignored) unless --out is given, so it never overwrites the committed full results.

The protocol and the results file's schema: bench/PROTOCOL.md. The harness: bench/cuops_bench/.
"""
from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:  # `python3 bench/run.py` puts it first; runpy, -P or an import do not
    sys.path.insert(0, str(BENCH))

import torch  # noqa: E402

from cuops_bench import report  # noqa: E402
from cuops_bench.context import Run, config_for  # noqa: E402
from cuops_bench.harness import Bench, CopyCeiling, error_text, log  # noqa: E402
from cuops_bench.library import load_library  # noqa: E402
from cuops_bench.sections import SECTIONS  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
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
    args = parser.parse_args(argv)
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(args.only) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown section(s) {sorted(unknown)}; choose from {','.join(SECTIONS)}")
    partial = args.quick or set(args.only) != set(SECTIONS) or args.device == "cpu" or args.gemm_squares is not None
    args.out = args.out or (BENCH / "results" / ("tmp" if partial else ""))
    return args


def run_section(name: str, ctx: Run) -> None:
    """A section that fails as a whole is recorded; the others still run."""
    t0 = time.perf_counter()
    try:
        SECTIONS[name](ctx)
    except Exception as e:  # noqa: BLE001
        ctx.results.setdefault("section_errors", {})[name] = error_text(e)
        log(f"section {name} failed: {error_text(e)}")
        traceback.print_exc()
    ctx.results["elapsed_s"][name] = round(time.perf_counter() - t0, 1)


def main() -> int:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench/run.py: no CUDA device (use --device cpu to smoke-test the harness)", file=sys.stderr)
        return 2
    cfg = config_for(args.device, args.quick, args.gemm_squares)
    bench = Bench.for_device(args.device)
    library = load_library()
    torch.manual_seed(0)
    results = report.new_results(bench, library, {"quick": args.quick, "only": args.only, "device": args.device,
                                                   "budget_s": args.budget_s})
    json_path = args.out / ("h100.json" if bench.cuda else "cpu_smoke.json")

    t_start = time.perf_counter()
    bench.deadline = t_start + args.budget_s
    ctx = Run(bench, cfg, results, CopyCeiling(bench, results["rows"]))
    reference_copy = ctx.ceiling.reference()
    results["copy_bandwidth_GBps"] = reference_copy.get("GBps")
    log(f"copy ceiling: {report.fmt_num(reference_copy.get('GBps'))} GB/s ({reference_copy['size']})")
    for name in SECTIONS:
        if name in args.only:
            run_section(name, ctx)
            report.save(results, json_path)  # after every section, so a run cut short keeps what it measured
    results["elapsed_s"]["total"] = round(time.perf_counter() - t_start, 1)
    results["plots"] = report.plot(results, args.out)
    report.save(results, json_path)
    report.print_summary(results, reference_copy, json_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
