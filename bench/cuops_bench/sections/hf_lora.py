"""PEFT LoRA on transformers' LlamaForCausalLM, unpatched against cuops.patch (SPEC §3 "Adapters"): the
training step of each model shape of HfLoraBench (hf_llama's 8-layer model; a Llama-3-8B-shaped one of
4 layers) at each adapter dropout: LoRA r 16, alpha 32 on q/k/v/o and gate/up/down, the base weights
frozen in float32 under bf16 autocast, AdamW(fused) on the adapters. The four variants (PEFT eager,
PEFT + torch.compile, patch eager, patch + compile) and the loss check are hf_llama's time_training
(the same alternation, medians and memory a step adds); the patched model is patched before
get_peft_model (tests/python/test_patch_peft.py shows both orders give the same model).
"""
from __future__ import annotations

import dataclasses
import time

from ..context import HfLoraBench, Run
from ..harness import BudgetSpent, log
from .hf_llama import for_all, time_training

FAMILY = "hf_lora"


def run(ctx: Run) -> None:
    cfg: HfLoraBench = ctx.cfg.hf_lora
    bench = ctx.bench
    ctx.results["hf_lora"] = {"config": {k: v for k, v in cfg.__dict__.items()},
                              "optimizer": "AdamW(fused)" if bench.cuda else "AdamW"}
    for name, layers, hidden, ffn, heads, kv_heads in cfg.shapes:
        shape = dataclasses.replace(cfg, layers=layers, hidden=hidden, ffn=ffn, heads=heads, kv_heads=kv_heads)
        for dropout in cfg.dropouts:
            rows = [{"family": FAMILY, "op": "train_step", "model": name, "dropout": dropout, "mode": m,
                     "shape": [layers, hidden, ffn, heads, kv_heads],
                     "batch": cfg.batch, "size": f"{cfg.batch}x{cfg.seq}",
                     "dtype": "bf16 autocast" if bench.cuda else "float32"} for m in cfg.modes]
            try:
                bench.check_budget()
            except BudgetSpent as e:
                ctx.rows.extend(dict(r, status="skipped", skip_reason=str(e)) for r in rows)
                continue
            t0 = time.perf_counter()
            for_all(ctx.rows, rows, lambda: time_training(bench, shape, rows, adapt=lora(cfg, dropout)))
            log(f"hf_lora {name} dropout {dropout}: {time.perf_counter() - t0:.1f}s")
            bench.free_memory(collect=True)


def lora(cfg: HfLoraBench, dropout: float):
    def adapt(model):
        import peft
        return peft.get_peft_model(model, peft.LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=dropout,
                                                          target_modules=list(cfg.targets)))
    return adapt
