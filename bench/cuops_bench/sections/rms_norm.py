"""rms_norm, add_rms_norm and rotary against Hugging Face's code (SPEC.md §3, "rms_norm, add_rms_norm,
rotary"): LlamaRMSNorm's forward and the decoder layer's `residual + x` before it, and
apply_rotary_pos_emb on q and k in the projections' transposed layout (the gradients of q and k only:
cos and sin come from a no-grad module), eager and under torch.compile(mode="default"), and the copy
rate. Rows of model widths (tokens x hidden) and of a
q/k norm (tokens x heads x 128), in bf16 and in autocast's mix ("auto": a bf16 sublayer output x
beside a float32 residual stream and float32 weight; rms_norm normalises the stream). The forward,
and the backward alone (torch.autograd.grad on a kept graph, so nothing accumulates, replayed from a
CUDA graph: autograd's host work outlasts the smaller backwards). Bytes: the
inputs read once and the outputs written once (backward: dy, the sum's gradient, the saved sum, the
gradients; a gradient in a second dtype written again); the weight and the per-row statistics left
out. Sides alternate over rounds; L2 is flushed before every call (do_bench)."""
from __future__ import annotations

import statistics
import time

import torch

from ..context import Run
from ..harness import graphed, guarded, log
from .norm import allow_recompiles

COMPILED = 'torch.compile(f, mode="default")'
EPS = 1e-6


def hf_norm(s, w):
    """transformers' LlamaRMSNorm.forward."""
    h = s.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
    return w * h.to(s.dtype)


def hf_add_norm(x, r, w):
    s = r + x
    return hf_norm(s, w), s


def cuops_norm(s, w):
    return torch.ops.cuops.rms_norm(s, w, EPS)


def cuops_add_norm(x, r, w):
    return torch.ops.cuops.add_rms_norm(x, r, w, EPS)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def hf_rotary(q, k, cos, sin):
    """transformers' apply_rotary_pos_emb (unsqueeze_dim=1)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def cuops_rotary(q, k, cos, sin):
    return torch.ops.cuops.rotary(q, k, cos, sin)


def run(ctx: Run) -> None:
    allow_recompiles()
    cfg = ctx.cfg.rms_norm
    compiled = {op: torch.compile(fn, mode="default") if cfg.compiled else None
                for op, fn in (("rms_norm", hf_norm), ("add_rms_norm", hf_add_norm))}
    # The backward alone is timed by calling one kept graph's backward again and again, which a compiled
    # backward with donated buffers refuses (it frees inputs it was handed).
    with torch._functorch.config.patch(donated_buffer=False):
        for rows, d in cfg.shapes:
            for mix in cfg.mixes:
                started = time.perf_counter()
                for op in ("rms_norm", "add_rms_norm"):
                    one_shape(ctx, op, mix, rows, d, compiled[op])
                log(f"rms_norm {mix} {rows}x{d}: {time.perf_counter() - started:.1f}s")
                ctx.bench.free_memory()
        compiled_rotary = torch.compile(hf_rotary, mode="default") if cfg.compiled else None
        for mix in cfg.mixes:
            rotary_rows(ctx, mix, compiled_rotary)
            ctx.bench.free_memory()


def rotary_rows(ctx: Run, mix: str, compiled) -> None:
    """rotary forward and backward on q [B, Hq, T, D] and k [B, Hk, T, D] as the projections' transposed
    views, cos / sin [B, T, D] in the residual stream's dtype of the mix (float32 under autocast, whose
    outputs are then float32). Bytes: q and k read and their results written (backward: the outputs'
    gradients read, q's and k's written), cos and sin read once a position."""
    dev = ctx.bench.device
    b, t, hq, hk, d = ctx.cfg.rms_norm.rotary
    xt, rt, _ = dtypes(mix)
    q = torch.randn(b, t, hq * d, device=dev, dtype=xt).view(b, t, hq, d).transpose(1, 2)
    k = torch.randn(b, t, hk * d, device=dev, dtype=xt).view(b, t, hk, d).transpose(1, 2)
    angle = torch.arange(t, device=dev, dtype=torch.float32)[:, None] * torch.rand(d, device=dev)
    cos, sin = (f(angle)[None].expand(b, t, d).to(rt).contiguous() for f in (torch.cos, torch.sin))
    size = {dt: torch.empty((), dtype=dt).element_size() for dt in (xt, rt)}
    out_size = max(size[xt], size[rt])
    elems, trig = b * t * (hq + hk) * d, 2 * b * t * d * size[rt]
    fns = {"cuops": cuops_rotary, "eager": hf_rotary}
    if compiled is not None:
        fns["compiled"] = compiled
    for kind, per_elem in (("fwd", size[xt] + out_size), ("bwd", out_size + size[xt])):
        row = {"family": "rms_norm", "op": "rotary", "kind": kind, "dtype": mix, "precision": None,
               "size": f"{b * t}x{hq + hk}x{d}", "rows": b * t * (hq + hk), "D": d,
               "bytes": elems * per_elem + trig}
        measure_row(ctx, row, fns, (q, k, cos, sin), grads_of=2)


def dtypes(mix: str):
    """(x, residual stream, weight) dtypes of a mix."""
    return {"bfloat16": (torch.bfloat16,) * 3, "float32": (torch.float32,) * 3,
            "auto": (torch.bfloat16, torch.float32, torch.float32)}[mix]


def one_shape(ctx: Run, op: str, mix: str, rows: int, d: int, compiled) -> None:
    dev = ctx.bench.device
    xt, rt, wt = dtypes(mix)
    x, r = torch.randn(rows, d, device=dev, dtype=xt), torch.randn(rows, d, device=dev, dtype=rt)
    w = torch.randn(d, device=dev, dtype=wt)
    size = {t: torch.empty((), dtype=t).element_size() for t in (xt, rt, wt)}
    y_size = max(size[rt], size[wt])
    if op == "rms_norm":
        args, fns = (r, w), {"cuops": cuops_norm, "eager": hf_norm}
        fwd = size[rt] + y_size
        bwd = y_size + 2 * size[rt]  # dy, s read; ds written
    else:
        args, fns = (x, r, w), {"cuops": cuops_add_norm, "eager": hf_add_norm}
        s_size = max(size[xt], size[rt])
        fwd = size[xt] + size[rt] + s_size + y_size
        # dy, the sum's gradient and s read; ds written, and again in x's dtype where it differs.
        bwd = y_size + 3 * s_size + (size[xt] if size[xt] != s_size else 0)
    if compiled is not None:
        fns["compiled"] = compiled
    for kind, per_row in (("fwd", fwd), ("bwd", bwd)):
        row = {"family": "rms_norm", "op": op, "kind": kind, "dtype": mix, "precision": None,
               "size": f"{rows}x{d}", "rows": rows, "D": d, "bytes": rows * d * per_row}
        measure_row(ctx, row, fns, args)


def measure_row(ctx: Run, row: dict, fns: dict, args: tuple, grads_of=None) -> None:
    """Every side of row's pass (row["kind"]) timed in alternating rounds, and the bytes per second
    against the copy's at the operands' size; a failure recorded in the row."""
    def measure(row):
        calls = {key: make_call(ctx.bench, fn, args, row["kind"], grads_of) for key, fn in fns.items()}
        time_sides(ctx.bench, row, calls, ctx.cfg.rms_norm.rounds)
        copy = ctx.ceiling.at(max(4, row["bytes"] // 2 // 4 * 4))
        row.update(GBps=row["bytes"] / row["cuops_ms"] / 1e6, copy_GBps=copy.get("GBps"))
        if copy.get("GBps"):
            row["fraction"] = row["GBps"] / copy["GBps"]
    guarded(ctx.rows, row, measure)


def make_call(bench, fn, args, kind, grads_of=None):
    """fn's forward, or its backward alone on one kept graph (torch.autograd.grad: no accumulation) to
    the first grads_of arguments (all by default), replayed from a CUDA graph (harness.graphed: the
    kernels, not autograd's host work)."""
    if kind == "fwd":
        return lambda: fn(*args)
    n = len(args) if grads_of is None else grads_of

    def backward():
        leaves = [a.detach().requires_grad_() for a in args[:n]]
        out = fn(*leaves, *args[n:])
        outs = out if isinstance(out, tuple) else (out,)
        grads = [torch.randn_like(o) for o in outs]
        return lambda: torch.autograd.grad(outs, leaves, grads, retain_graph=True)
    return graphed(bench, backward)


def time_sides(bench, row: dict, calls: dict, rounds: int) -> None:
    """Every side in `rounds` rounds of alternating order; medians; ratios = side / cuops."""
    runs = {key: [] for key in calls}
    order = list(calls)
    for i in range(rounds):
        for key in (order if i % 2 == 0 else order[::-1]):
            runs[key].append(bench.measure(calls[key]).ms)
    ms = {key: statistics.median(ts) for key, ts in runs.items()}
    labels = {"eager": "Hugging Face's code as written", "compiled": COMPILED}
    row["baselines"] = {key: {"call": labels[key], "ms": ms[key], "runs_ms": runs[key],
                              "ratio": ms[key] / ms["cuops"]} for key in calls if key != "cuops"}
    row.update(status="ok", cuops_ms=ms["cuops"], cuops_runs_ms=runs["cuops"], ratio=ms["eager"] / ms["cuops"],
               timer=f"do_bench, median of {rounds} rounds, sides alternating")
