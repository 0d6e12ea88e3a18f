"""Where a GPT training step's GPU time goes, nn.Linear against CuopsLinear (the gpt_train section's
model and step): each side's kernels under torch.profiler over a few steps after warm-up, summed per
kernel name and per class (GEMM, copies and casts, the rest), side by side, largest difference first.
Where to look, not a benchmark (the gpt_train section times the step).

    python3 bench/sweep/step_profile.py [--steps 3] [--compile] [--top 25]
"""
from __future__ import annotations

import argparse
import collections
import copy
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cuops_bench.context import GptTrainBench  # noqa: E402
from cuops_bench.library import load_library  # noqa: E402
from cuops_bench.profiling import gpu_events  # noqa: E402
from cuops_bench.llama_model import cuops_twin  # noqa: E402
from cuops_bench.sections.gpt_train import Gpt, make_step  # noqa: E402

import torch  # noqa: E402

# A kernel's class by its name: GEMMs (cuBLAS's nvjet / xmma / cutlass, cuops's), copies and casts
# (torch's elementwise copy kernels, transposes), everything else.
CLASSES = [("gemm", re.compile(r"nvjet|xmma|cutlass|gemm|cublas", re.I)),
           ("copy/cast", re.compile(r"copy|transpose|bfloat16_copy|direct_copy|to_copy", re.I))]


def kernel_class(name: str) -> str:
    for label, pattern in CLASSES:
        if pattern.search(name):
            return label
    return "other"


def short(name: str) -> str:
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"\(anonymous namespace\)::", "", name)
    return name if len(name) <= 120 else name[:117] + "..."


def profile_steps(step, batches, steps: int) -> dict[str, list[float]]:
    """Per kernel name: [total us a step, launches a step]."""
    def run():
        for i in range(steps):
            step(batches[i % len(batches)])
    out: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for e in gpu_events(run):
        entry = out[short(e["name"])]
        entry[0] += e["dur"] / steps
        entry[1] += 1 / steps
    return out


def step_ms(step, batches, steps: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(steps):
        step(batches[i % len(batches)])
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    load_library()
    cfg = GptTrainBench()
    torch.manual_seed(cfg.seed)
    base = Gpt(cfg).cuda()
    models = {"torch": base, "cuops": cuops_twin(copy.deepcopy(base))}
    batches = [torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq + 1), device="cuda") for _ in range(2)]
    prof, wall = {}, {}
    for key, model in models.items():
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.1)
        step = make_step(torch.compile(model) if args.compile else model, opt, "cuda", cfg.autocast)
        for i in range(5):
            step(batches[i % 2])
        wall[key] = step_ms(step, batches, 10)
        prof[key] = profile_steps(step, batches, args.steps)
    print(f"GPT step ({'compiled' if args.compile else 'eager'}), per step: wall (CUDA events over 10 steps) "
          f"torch {wall['torch']:.2f} ms, cuops {wall['cuops']:.2f} ms")
    print(f"{'class':10} {'torch us':>10} {'cuops us':>10} {'diff':>9}")
    for label in [c for c, _ in CLASSES] + ["other", "all"]:
        t = sum(v[0] for k, v in prof["torch"].items() if label == "all" or kernel_class(k) == label)
        c = sum(v[0] for k, v in prof["cuops"].items() if label == "all" or kernel_class(k) == label)
        print(f"{label:10} {t:10.1f} {c:10.1f} {c - t:+9.1f}")
    names = set(prof["torch"]) | set(prof["cuops"])
    rows = sorted(names, key=lambda k: -abs(prof["cuops"].get(k, [0, 0])[0] - prof["torch"].get(k, [0, 0])[0]))
    print(f"\nkernels by |cuops - torch| (us a step, launches a step), top {args.top}:")
    print(f"{'torch us':>9} {'n':>5} {'cuops us':>9} {'n':>5} {'diff':>8}  class      kernel")
    for k in rows[:args.top]:
        t, c = prof["torch"].get(k, [0.0, 0.0]), prof["cuops"].get(k, [0.0, 0.0])
        print(f"{t[0]:9.1f} {t[1]:5.0f} {c[0]:9.1f} {c[1]:5.0f} {c[0] - t[0]:+8.1f}  {kernel_class(k):10} {k}")


if __name__ == "__main__":
    main()
