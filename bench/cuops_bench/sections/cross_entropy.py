"""linear_cross_entropy against the torch code it replaces (SPEC.md §3): an LM head's loss, forward +
backward (the gradients of x and the weight), at (T, K, V) of Llama-sized heads, bf16, x ~ N(0, 1) and
W ~ N(0, 1/K) so the logits have unit spread. Sides: cuops, the torch code eager (F.linear, then
F.cross_entropy on float32 logits), the same under torch.compile(mode="default"), and, for the report,
F.linear_cross_entropy where the pinned torch has one. Each side's time (median of rounds, sides
alternating, L2 flushed before every call) and the memory its forward + backward adds: the peak of
torch's allocator over what was allocated before, less the gradients it returns."""
from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from ..context import Run
from ..harness import guarded, log

COMPILED = 'torch.compile(f, mode="default")'


def eager(x, w, t):
    return F.cross_entropy(F.linear(x, w).float(), t)


def cuops_lce(x, w, t):
    return torch.ops.cuops.linear_cross_entropy(x, w, t)


def torch_lce(x, w, t):
    return F.linear_cross_entropy(x, w, t)  # the pinned torch may have none: the side is left out


def fwd_bwd(f):
    def run(x, w, t):
        loss = f(x, w, t)
        return torch.autograd.grad(loss, (x, w))
    return run


def added_bytes(bench, fn) -> int | None:
    """What one call adds at its peak beyond the memory allocated before it, less what it returns."""
    if not bench.cuda:
        return None
    bench.sync()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    bench.sync()
    returned = sum(o.numel() * o.element_size() for o in out)
    peak = torch.cuda.max_memory_allocated() - before - returned
    del out
    return peak


def run(ctx: Run) -> None:
    cfg = ctx.cfg.cross_entropy
    bench = ctx.bench
    dtype = torch.bfloat16 if bench.cuda else torch.float32
    fns = {"cuops": cuops_lce, "eager": eager}
    if cfg.compiled:
        fns["compiled"] = torch.compile(eager, mode="default")
    if hasattr(F, "linear_cross_entropy"):
        fns["torch_lce"] = torch_lce
    sides = {key: fwd_bwd(f) for key, f in fns.items()}
    for tokens, k, vocab in cfg.shapes:
        started = time.perf_counter()
        row = {"family": "cross_entropy", "op": "linear_cross_entropy", "kind": "fwd+bwd",
               "dtype": str(dtype).removeprefix("torch."), "precision": None, "tokens": tokens, "K": k, "V": vocab,
               "size": f"{tokens}x{k}->{vocab}", "flops": 6 * tokens * k * vocab,
               "logits_f32_bytes": tokens * vocab * 4}
        guarded(ctx.rows, row, lambda r: one_shape(bench, cfg, sides, r, tokens, k, vocab, dtype))
        log(f"cross_entropy {tokens} x {k} -> {vocab}: {time.perf_counter() - started:.1f}s")
        bench.free_memory(collect=True)


def one_shape(bench, cfg, sides: dict, row: dict, tokens: int, k: int, vocab: int, dtype) -> None:
    dev = bench.device
    x = torch.randn(tokens, k, device=dev, dtype=dtype).requires_grad_()
    w = (torch.randn(vocab, k, device=dev, dtype=dtype) / k ** 0.5).requires_grad_()
    t = torch.randint(0, vocab, (tokens,), device=dev)
    calls = {key: (lambda f=f: f(x, w, t)) for key, f in sides.items()}
    memory = {key: added_bytes(bench, fn) for key, fn in calls.items()}
    runs = {key: [] for key in calls}
    order = list(calls)
    for i in range(cfg.rounds):
        for key in (order if i % 2 == 0 else order[::-1]):
            runs[key].append(bench.measure(calls[key]))
    ms = {key: statistics.median(m.ms for m in ts) for key, ts in runs.items()}
    names = {"eager": "F.linear, then F.cross_entropy on float32 logits", "compiled": COMPILED + " of the same",
             "torch_lce": "F.linear_cross_entropy"}
    row["baselines"] = {key: {"call": names[key], "ms": ms[key], "runs_ms": [m.ms for m in runs[key]],
                              "ratio": ms[key] / ms["cuops"], "added_bytes": memory[key]}
                        for key in calls if key != "cuops"}
    row.update(status="ok", cuops_ms=ms["cuops"], cuops_runs_ms=[m.ms for m in runs["cuops"]],
               cuops_added_bytes=memory["cuops"], ratio=ms["eager"] / ms["cuops"],
               timer=f"{runs['cuops'][0].method}, median of {cfg.rounds} rounds, sides alternating",
               cuops_TFLOPs=row["flops"] / ms["cuops"] / 1e9)
