#!/usr/bin/env python3
"""cuops benchmarks: every op against its baselines, in one process, on one GPU (SPEC.md §3, §4).

    python3 bench/run.py --out bench/results          # the full run, under 6 minutes on an H100
    python3 bench/run.py --quick --only gemm          # smoke test of one section
    python3 bench/run.py --device cpu                 # harness smoke test without a GPU (timings meaningless)
    python3 bench/run.py --only gemm_shapes --shapes-classes decode --shapes-dtypes bfloat16   # issue 23's rows
    python3 bench/run.py --only llama                 # the Llama-style model, prefill and greedy decode

The library comes from $CUOPS_LIBRARY, else $CUOPS_BUILD_DIR/libcuops.so, else <repo>/build/libcuops.so.
A run restricted with --quick, --only, --gemm-squares, --gemm-dtypes, --shapes-* or --device cpu writes to
bench/results/tmp/ (git-ignored) unless --out is given, so it never overwrites the committed full
results. Without --only, the run measures the default sections (sections.DEFAULT); the shape suite
(gemm_shapes) and the model (llama) run when named, or with --only all.

The protocol and the results file's schema: bench/PROTOCOL.md. The harness: bench/cuops_bench/.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import traceback
from pathlib import Path

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:  # `python3 bench/run.py` puts it first; runpy, -P or an import do not
    sys.path.insert(0, str(BENCH))

import torch  # noqa: E402

from cuops_bench import report  # noqa: E402
from cuops_bench.context import GEMM_VARIANTS, SHAPE_CLASSES, SHAPE_COMPILE, SHAPE_VARIANTS, Run, config_for  # noqa: E402
from cuops_bench.harness import Bench, CopyCeiling, error_text, log  # noqa: E402
from cuops_bench.library import load_library  # noqa: E402
from cuops_bench.sections import DEFAULT, SECTIONS  # noqa: E402
from cuops_bench.shapes import MODELS  # noqa: E402


def comma_list(text: str | None, allowed, flag: str, parser) -> tuple | None:
    if text is None:
        return None
    items = tuple(x.strip() for x in text.split(",") if x.strip())
    unknown = [x for x in items if x not in allowed]
    if unknown or not items:
        parser.error(f"{flag}: unknown {unknown or 'empty list'}; choose from {','.join(allowed)}")
    return items


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default bench/results; bench/results/tmp for --quick/--only/--device cpu)")
    parser.add_argument("--name", default=None,
                        help="results file <out>/<name>.json and plots <out>/<name>_*.png (default: default for the "
                             "full run, cpu_smoke with --device cpu, run otherwise)")
    parser.add_argument("--merge", action="store_true",
                        help="merge into an existing <out>/<name>.json: this run's rows replace those of the same "
                             "key, the others stay (a results file regenerated over several device calls)")
    parser.add_argument("--render", type=Path, default=None, metavar="JSON",
                        help="print the table of a results file and exit (no GPU needed)")
    parser.add_argument("--quick", action="store_true", help="fewer sizes, for smoke tests")
    parser.add_argument("--only", default=",".join(DEFAULT),
                        help=f"comma list of sections: {','.join(SECTIONS)}, or all (default: {','.join(DEFAULT)})")
    parser.add_argument("--budget-s", type=float, default=300.0,
                        help="start no measurement after this many seconds (later rows are recorded as skipped), "
                             "so the run ends inside its 6-minute slot")
    parser.add_argument("--gemm-squares", default=None,
                        help="comma list of square GEMM sizes instead of the configured ones (no odd shapes), "
                             "for a quick look at a few rows; the results go to bench/results/tmp")
    parser.add_argument("--gemm-dtypes", default=None,
                        help=f"comma list of {','.join(GEMM_VARIANTS)}: the square GEMM rows' dtypes (tf32: float32 "
                             "with TF32 on; float32: 'highest'; default: all)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: exercise the harness without a GPU (tiny sizes, wall clock; timings meaningless)")
    shapes = parser.add_argument_group("shape suite (--only gemm_shapes)")
    shapes.add_argument("--shapes-models", default=None,
                        help=f"comma list of {','.join(MODELS)} (default: all; --device cpu: gpt-2, scaled down)")
    shapes.add_argument("--shapes-classes", default=None,
                        help=f"comma list of {','.join(SHAPE_CLASSES)} (default: all)")
    shapes.add_argument("--shapes-dtypes", default=None,
                        help=f"comma list of {','.join(SHAPE_VARIANTS)} (tf32: float32 with TF32 on; float32: "
                             "'highest'; default: all; --device cpu: bfloat16,tf32)")
    shapes.add_argument("--shapes-compile", choices=SHAPE_COMPILE, default=None,
                        help="decode rows' F.linear under torch.compile(max-autotune-no-cudagraphs), bf16 and fp16 "
                             "forward rows only: none; decode1 (M = 1 and 16, the default); decode (every M <= 16). "
                             "Each shape is one max-autotune compile")
    parser.add_argument("--hf-model-type", default=None,
                        help="hf_llama's model: another family cuops.patch takes (phi3, qwen3, ...) at its shape")
    lora = parser.add_argument_group("PEFT LoRA training step (--only hf_lora)")
    lora.add_argument("--lora-models", default=None,
                      help="comma list of the model shapes' names (default: all of HfLoraBench.shapes)")
    lora.add_argument("--lora-dropouts", default=None, help="comma list of adapter dropouts (default: 0,0.05)")
    moe = parser.add_argument_group("mixture of experts (--only moe)")
    moe.add_argument("--moe-models", default=None,
                     help="comma list of MoeBench.models to train and decode (default: all; none: the grouped GEMM only)")
    moe.add_argument("--moe-variants", default=None, help="comma list of the training step's variants (default: all)")
    moe.add_argument("--moe-no-grouped", action="store_true", help="skip the grouped GEMM rows")
    moe.add_argument("--moe-no-decode", action="store_true", help="skip the decode rows (models' and experts')")
    args = parser.parse_args(argv)
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    if args.only == ["all"]:
        args.only = list(SECTIONS)
    unknown = set(args.only) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown section(s) {sorted(unknown)}; choose from {','.join(SECTIONS)} or all")
    args.shapes = {key: value for key, value in (
        ("models", comma_list(args.shapes_models, tuple(MODELS), "--shapes-models", parser)),
        ("classes", comma_list(args.shapes_classes, SHAPE_CLASSES, "--shapes-classes", parser)),
        ("variants", comma_list(args.shapes_dtypes, tuple(SHAPE_VARIANTS), "--shapes-dtypes", parser)),
        ("compile", args.shapes_compile)) if value is not None}
    args.gemm_dtypes = comma_list(args.gemm_dtypes, GEMM_VARIANTS, "--gemm-dtypes", parser)
    partial = (args.quick or set(args.only) != set(DEFAULT) or args.device == "cpu" or args.gemm_squares is not None
               or bool(args.shapes) or args.gemm_dtypes is not None)
    args.out = args.out or (BENCH / "results" / ("tmp" if partial else ""))
    args.name = args.name or ("cpu_smoke" if args.device == "cpu" else "run" if partial else "default")
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
    if args.render is not None:
        report.print_summary(json.loads(args.render.read_text()), args.render)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench/run.py: no CUDA device (use --device cpu to smoke-test the harness)", file=sys.stderr)
        return 2
    cfg = config_for(args.device, args.quick, args.gemm_squares, args.shapes, args.gemm_dtypes)
    if args.hf_model_type:
        cfg.hf_llama = dataclasses.replace(cfg.hf_llama, model_type=args.hf_model_type)
    if args.lora_models or args.lora_dropouts:  # one call's share of the section; --merge joins them
        names = args.lora_models.split(",") if args.lora_models else [s[0] for s in cfg.hf_lora.shapes]
        dropouts = tuple(float(d) for d in args.lora_dropouts.split(",")) if args.lora_dropouts else cfg.hf_lora.dropouts
        cfg.hf_lora = dataclasses.replace(cfg.hf_lora, shapes=tuple(s for s in cfg.hf_lora.shapes if s[0] in names),
                                          dropouts=dropouts)
    if args.moe_models is not None or args.moe_variants or args.moe_no_grouped or args.moe_no_decode:
        models = () if args.moe_models == "none" else tuple(args.moe_models.split(",")) if args.moe_models else cfg.moe.models
        variants = tuple(args.moe_variants.split(",")) if args.moe_variants else cfg.moe.variants
        cfg.moe = dataclasses.replace(cfg.moe, models=models, variants=variants,
                                      grouped_shapes=() if args.moe_no_grouped else cfg.moe.grouped_shapes,
                                      decode_batches=() if args.moe_no_decode else cfg.moe.decode_batches,
                                      decode_shapes=() if args.moe_no_decode else cfg.moe.decode_shapes)
    bench = Bench.for_device(args.device)
    library = load_library()
    torch.manual_seed(0)
    results = report.new_results(bench, library, {"quick": args.quick, "only": args.only, "device": args.device,
                                                   "budget_s": args.budget_s, "shapes": args.shapes})
    json_path = args.out / f"{args.name}.json"
    earlier = json.loads(json_path.read_text()) if args.merge and json_path.exists() else None
    if earlier is not None and earlier.get("gpu") != results["gpu"]:
        print(f"bench/run.py --merge: {json_path} holds {earlier.get('gpu')} results, this GPU is {results['gpu']}",
              file=sys.stderr)
        return 2

    def merged():
        return report.merge(earlier, results) if earlier is not None else results

    t_start = time.perf_counter()
    bench.deadline = t_start + args.budget_s
    ctx = Run(bench, cfg, results, CopyCeiling(bench, results["rows"]))
    ctx.save = lambda: report.save(merged(), json_path)
    reference_copy = ctx.ceiling.reference()
    results["copy_bandwidth_GBps"] = reference_copy.get("GBps")
    log(f"copy ceiling: {report.fmt_num(reference_copy.get('GBps'))} GB/s ({reference_copy['size']})")

    for name in SECTIONS:
        if name in args.only:
            run_section(name, ctx)
            report.save(merged(), json_path)  # after every section: a run cut short keeps what it measured
    results["elapsed_s"]["total"] = round(time.perf_counter() - t_start, 1)
    final = merged()
    final["plots"] = report.plot(final, args.out, f"{args.name}_")
    report.save(final, json_path)
    report.print_summary(final, json_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
