"""A GPT-style training step end to end (>= 1.00x torch eager, >= 0.98x torch compiled): a decoder of
nn.Linear layers against the same model with its MLP's first Linear and gelu on torch.ops.cuops.linear
(FusedGeluMlp) and every other Linear on torch.ops.cuops.mm (CuopsLinear), bf16 autocast, AdamW,
cross-entropy over the next token.

Both models start from the same weights (the cuops one a deep copy whose Linears are then swapped) and
train on the same batches. Losses: the first loss_steps steps of both, from that common start; bf16
products that sum in different orders drift apart by rounding only, so the check is the largest
relative loss difference over those steps (reported, with torch's own step-to-step change beside it
for scale), not an equality. Time: a round is `steps` back-to-back steps of one side (CUDA events
around them), after warm-up steps (and, under torch.compile, the compile); the sides alternate over
the rounds and each side's median round is its time per step. Modes: eager, and torch.compile of the
model (default mode), each side compiled separately.

Rows (family "gpt_train"): one per mode.
"""
from __future__ import annotations

import copy
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from ..context import GptTrainBench, Run
from ..harness import Bench, BudgetSpent, guarded, log
from ..llama_model import FUSED_TWINS, CuopsLinear, cuops_twin

FAMILY = "gpt_train"
SIDES = ("torch", "cuops")
LABELS = {"torch": "nn.Linear", "cuops": "CuopsLinear, MLP on cuops.linear(..., 'gelu')"}


class Block(nn.Module):
    def __init__(self, cfg: GptTrainBench):
        super().__init__()
        w = cfg.width
        self.heads = cfg.heads
        self.ln1, self.ln2 = nn.LayerNorm(w), nn.LayerNorm(w)
        self.qkv = nn.Linear(w, 3 * w, bias=False)   # fused q/k/v, as shapes.py's gpt-1024 c_attn
        self.proj = nn.Linear(w, w, bias=False)
        self.mlp = GeluMlp(w, cfg.ffn)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in self.qkv(self.ln1(x)).split(C, -1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class GeluMlp(nn.Module):
    def __init__(self, width: int, ffn: int):
        super().__init__()
        self.fc = nn.Linear(width, ffn, bias=False)
        self.out = nn.Linear(ffn, width, bias=False)

    def forward(self, x):
        return self.out(F.gelu(self.fc(x)))


class FusedGeluMlp(nn.Module):
    """GeluMlp's forward with fc and its gelu as one torch.ops.cuops.linear (the activation in the GEMM's
    epilogue) and a CuopsLinear out projection, on the same weight tensors."""

    def __init__(self, mlp: GeluMlp):
        super().__init__()
        self.weight = mlp.fc.weight
        self.out = CuopsLinear(mlp.out)

    def forward(self, x):
        return self.out(torch.ops.cuops.linear(x, self.weight, None, "gelu"))


FUSED_TWINS[GeluMlp] = FusedGeluMlp


class Gpt(nn.Module):
    def __init__(self, cfg: GptTrainBench):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.width)
        self.pos = nn.Embedding(cfg.seq, cfg.width)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.width)
        self.head = nn.Linear(cfg.width, cfg.vocab, bias=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def run(ctx: Run) -> None:
    cfg: GptTrainBench = ctx.cfg.gpt_train
    bench = ctx.bench
    dtype = "bfloat16" if cfg.autocast else "float32"
    ctx.results["gpt_train"] = {"config": dict(cfg.__dict__), "dtype": dtype, "optimizer": "AdamW"}
    rows = [{"family": FAMILY, "op": "train_step", "mode": mode, "dtype": dtype, "precision": None,
             "size": f"{cfg.batch}x{cfg.seq}", "tokens": cfg.batch * cfg.seq} for mode in cfg.modes]
    try:
        bench.check_budget()
    except BudgetSpent as e:
        ctx.rows.extend(dict(r, status="skipped", skip_reason=str(e)) for r in rows)
        return
    torch.manual_seed(cfg.seed)
    base = Gpt(cfg).to(bench.device)
    models = {"torch": base, "cuops": cuops_twin(copy.deepcopy(base))}
    gen = torch.Generator(device=bench.device).manual_seed(cfg.seed + 1)
    batches = [torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq + 1), generator=gen, device=bench.device)
               for _ in range(4)]
    try:
        for row in rows:
            t0 = time.perf_counter()
            # A fresh pair for each mode (the same start), so each mode's losses compare from step 0.
            pair = {key: copy.deepcopy(m) for key, m in models.items()}
            guarded(ctx.rows, row, lambda r: time_mode(bench, cfg, pair, batches, r))
            del pair
            log(f"gpt_train {row['mode']}: {time.perf_counter() - t0:.1f}s")
    finally:
        del models, base
        bench.free_memory(collect=True)


def make_step(model, opt, device_type: str, autocast: bool):
    def step(batch):
        x, y = batch[:, :-1], batch[:, 1:]
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()
    return step


def time_mode(bench: Bench, cfg: GptTrainBench, pair: dict, batches: list, row: dict) -> None:
    device_type = torch.device(bench.device).type
    steps = {}
    for key, model in pair.items():
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.1)
        fwd = torch.compile(model) if row["mode"] == "compile" else model
        steps[key] = make_step(fwd, opt, device_type, cfg.autocast)
    # Losses from the common start (this also compiles, under torch.compile).
    loss = {key: [float(steps[key](batches[i % len(batches)])) for i in range(cfg.loss_steps)] for key in SIDES}
    diffs = [abs(a - b) / abs(a) for a, b in zip(loss["torch"], loss["cuops"])]
    change = [abs(a - b) / abs(a) for a, b in zip(loss["torch"], loss["torch"][1:])]
    row["check"] = {"losses": loss, "max_rel_loss_diff": max(diffs),
                    "median_step_change": statistics.median(change) if change else None}
    times = {key: [] for key in SIDES}
    n = 0
    for r in range(cfg.rounds):
        for key in (SIDES if r % 2 == 0 else SIDES[::-1]):
            bench.check_budget()

            def call(key=key):
                nonlocal n
                steps[key](batches[n % len(batches)])
                n += 1
            times[key].append(bench.elapsed_ms(call, cfg.steps))
    ms = {key: statistics.median(ts) for key, ts in times.items()}
    tokens = cfg.batch * cfg.seq
    row.update(status="ok", cuops_ms=ms["cuops"], cuops_runs_ms=times["cuops"], ratio=ms["torch"] / ms["cuops"],
               cuops_tokens_per_s=tokens / ms["cuops"] * 1e3,
               timer=f"{'cuda events' if bench.cuda else 'wall clock (cpu)'} around {cfg.steps} steps, median of "
                     f"{cfg.rounds} rounds, torch and cuops alternating")
    row["baselines"] = {"torch": {"label": LABELS["torch"], "ms": ms["torch"], "runs_ms": times["torch"],
                                  "ratio": ms["torch"] / ms["cuops"], "tokens_per_s": tokens / ms["torch"] * 1e3}}
