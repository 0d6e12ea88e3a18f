"""transformers' LlamaForCausalLM unpatched against cuops.patch (issue 50's model: 8 layers, width 2048, FFN
5632, 16 / 4 heads, vocabulary 128256; random weights from a config): the training step, decode and prefill.

Training (rows "train_step", one a mode): float32 weights under bf16 autocast, AdamW(fused=True),
`zero_grad(set_to_none=True)`, the loss from `labels` (the patched model's fused loss: no logits made).
Both models start from the same weights (the patched one a deep copy); first `loss_steps` eager steps of
both on the same batches (the loss check: the largest relative difference, with torch's own step-to-step
change beside it), then the four variants (torch eager, torch.compile, patch eager, patch + compile: a
compiled model shares its eager twin's parameters and optimizer) timed in rounds of `steps` steps, all
four alternating (the order reversed every other round), each variant's median round. Memory: the peak a
step adds over what is allocated before it (weights, optimizer state, no gradients).

Decode (rows "decode", one a batch): eager, the KV cache filled by a `kv`-token prompt and cropped back
to it after each step (the KV length held fixed), one token a sequence a step, torch and patch
alternating. Prefill ("prefill"): one sequence of prefill_tokens, logits_to_keep=1, eager. bf16 weights
for both (inference).
"""
from __future__ import annotations

import copy
import statistics
import time

import torch

from ..context import HfLlamaBench, Run
from ..harness import Bench, BudgetSpent, guarded, log

FAMILY = "hf_llama"
VARIANTS = ("torch eager", "torch compile", "patch eager", "patch compile")


# A family's config fields: token ids whose defaults do not fit a random model of cfg.vocab tokens;
# Granite-3.0-2B's multipliers (the defaults, 1, would leave the patch's multiplier paths untimed).
CONFIG_FIXES = {"phi3": dict(pad_token_id=None, bos_token_id=1, eos_token_id=2),
                "olmo2": dict(pad_token_id=None, bos_token_id=1, eos_token_id=2),
                "granite": dict(embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0078125,
                                logits_scaling=8.0)}


def build(cfg: HfLlamaBench, device: str, dtype: torch.dtype):
    import transformers
    torch.manual_seed(cfg.seed)
    config = transformers.AutoConfig.for_model(
        cfg.model_type, vocab_size=cfg.vocab, hidden_size=cfg.hidden, intermediate_size=cfg.ffn,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads,
        max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False,
        **CONFIG_FIXES.get(cfg.model_type, {}))
    return transformers.AutoModelForCausalLM.from_config(config).to(device, dtype)


def run(ctx: Run) -> None:
    cfg: HfLlamaBench = ctx.cfg.hf_llama
    bench = ctx.bench
    ctx.results["hf_llama"] = {"config": dict(cfg.__dict__), "optimizer": "AdamW(fused)" if bench.cuda else "AdamW"}
    rows = ([{"family": FAMILY, "op": "train_step", "mode": m, "batch": cfg.batch, "size": f"{cfg.batch}x{cfg.seq}",
              "dtype": "bf16 autocast" if bench.cuda else "float32"} for m in cfg.modes]
            + [{"family": FAMILY, "op": "decode", "batch": b, "size": f"{b}x1 kv {cfg.kv}", "dtype": dtype_name(bench)}
               for b in cfg.decode_batches]
            + [{"family": FAMILY, "op": "prefill", "batch": 1, "size": f"1x{cfg.prefill_tokens}",
                "dtype": dtype_name(bench)}])
    if cfg.model_type != "llama":  # the row key's model: Llama's rows keep the key they always had
        rows = [dict(r, model=cfg.model_type) for r in rows]
    try:
        bench.check_budget()
    except BudgetSpent as e:
        ctx.rows.extend(dict(r, status="skipped", skip_reason=str(e)) for r in rows)
        return
    train_rows = [r for r in rows if r["op"] == "train_step"]
    t0 = time.perf_counter()
    for_all(ctx.rows, train_rows, lambda: time_training(bench, cfg, train_rows))
    log(f"hf_llama training: {time.perf_counter() - t0:.1f}s")
    bench.free_memory(collect=True)
    t0 = time.perf_counter()
    infer_rows = [r for r in rows if r["op"] != "train_step"]
    for_all(ctx.rows, infer_rows, lambda: time_inference(bench, cfg, infer_rows))
    log(f"hf_llama inference: {time.perf_counter() - t0:.1f}s")
    bench.free_memory(collect=True)


def dtype_name(bench: Bench) -> str:
    return "bfloat16" if bench.cuda else "float32"


def for_all(out: list, rows: list, work) -> None:
    """work() fills every row of the group (one model pair serves them); a failure marks them all."""
    holder = {"op": rows[0]["op"], "size": rows[0]["size"], "dtype": rows[0]["dtype"]}
    guarded([], holder, lambda _: work())
    for r in rows:
        if holder.get("status") in ("skipped", "error"):
            r.update({k: holder[k] for k in ("status", "skip_reason", "error") if k in holder})
        out.append(r)


def time_training(bench: Bench, cfg: HfLlamaBench, rows: list, adapt=None) -> None:
    """The four variants' steps (rows: one a mode); adapt(model) -> model, where given, wraps both
    models after the patch (hf_lora: PEFT's get_peft_model), and the optimizer takes what then needs a
    gradient."""
    import cuops
    device = bench.device
    torch._dynamo.config.cache_size_limit = 64
    ref = build(cfg, device, torch.float32)
    models = {"torch": ref, "patch": cuops.patch(copy.deepcopy(ref))}
    if adapt is not None:
        models = {k: adapt(m) for k, m in models.items()}
    gen = torch.Generator(device=device).manual_seed(cfg.seed + 1)
    # More batches than a run's warm-up and timed steps see twice: random tokens the model cannot
    # memorise, so the loss stays near its entropy and the check compares like with like.
    batches = [torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq), generator=gen, device=device)
               for _ in range(cfg.batches)]
    n = [0]

    def make_step(model, opt):
        def step():
            ids = batches[n[0] % len(batches)]
            with torch.autocast(device, dtype=torch.bfloat16, enabled=bench.cuda):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()
        return step

    opts = {k: torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=cfg.lr, fused=bench.cuda)
            for k, m in models.items()}
    eager = {k: make_step(models[k], opts[k]) for k in models}
    losses = {k: [] for k in models}
    for i in range(cfg.loss_steps):  # from the common start, the same batches
        n[0] = i
        for k in models:
            losses[k].append(float(eager[k]()))
    diffs = [abs(a - b) / abs(a) for a, b in zip(losses["torch"], losses["patch"])]
    check_abs = max(abs(a - b) for a, b in zip(losses["torch"], losses["patch"]))
    change = [abs(a - b) / abs(a) for a, b in zip(losses["torch"], losses["torch"][1:])]
    check = {"losses": losses, "max_rel_loss_diff": max(diffs), "max_abs_loss_diff": check_abs,
             "median_step_change": statistics.median(change) if change else None}
    variants = {}
    for key in VARIANTS:
        side, mode = key.split()
        if mode not in cfg.modes:
            continue
        model = models[side] if mode == "eager" else torch.compile(models[side])
        variants[key] = make_step(model, opts[side])
    mem = {}
    for key, step in variants.items():
        t0 = time.perf_counter()
        for _ in range(cfg.warmup):
            step()
        mem[key] = added_gb(bench, step)
        log(f"hf_llama {key}: warm-up {time.perf_counter() - t0:.1f}s")
    times = {k: [] for k in variants}
    keys = list(variants)
    for r in range(cfg.rounds):
        for key in (keys if r % 2 == 0 else keys[::-1]):
            bench.check_budget()
            times[key].append(bench.elapsed_ms(variants[key], cfg.steps))
    ms = {k: statistics.median(v) for k, v in times.items()}
    tokens = cfg.batch * cfg.seq
    for row in rows:
        mode = row["mode"]
        mine, base = f"patch {mode}", f"torch {mode}"
        row.update(status="ok", cuops_ms=ms[mine], cuops_runs_ms=times[mine], ratio=ms[base] / ms[mine],
                   cuops_tokens_per_s=tokens / ms[mine] * 1e3, cuops_added_gb=mem[mine], check=check,
                   timer=f"{'cuda events' if bench.cuda else 'wall clock'} around {cfg.steps} steps, median of "
                         f"{cfg.rounds} rounds, the variants alternating")
        row["baselines"] = {k: {"ms": ms[k], "runs_ms": times[k], "ratio": ms[k] / ms[mine], "added_gb": mem[k]}
                            for k in variants if k != mine}
    del variants, eager, opts, models, ref


def added_gb(bench: Bench, step) -> float | None:
    """The GB one call of step adds at its peak over what is allocated before it (None on the cpu)."""
    bench.sync()
    if not bench.cuda:
        step()
        return None
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    bench.sync()
    return (torch.cuda.max_memory_allocated() - base) / 1e9


def time_inference(bench: Bench, cfg: HfLlamaBench, rows: list) -> None:
    import cuops
    device = bench.device
    dtype = torch.bfloat16 if bench.cuda else torch.float32
    ref = build(cfg, device, dtype).eval()
    models = {"torch": ref, "patch": cuops.patch(copy.deepcopy(ref))}
    gen = torch.Generator(device=device).manual_seed(cfg.seed + 2)
    for row in rows:
        if row["op"] == "decode":
            fns, check = decode_steps(cfg, models, row["batch"], gen, device)
            calls, tokens = cfg.decode_steps, row["batch"]
        else:
            ids = torch.randint(0, cfg.vocab, (1, cfg.prefill_tokens), generator=gen, device=device)
            fns = {k: (lambda m=m: m(ids, use_cache=True, logits_to_keep=1).logits) for k, m in models.items()}
            with torch.no_grad():
                got, want = fns["patch"](), fns["torch"]()
            check = {"argmax_agreement": float((got.argmax(-1) == want.argmax(-1)).float().mean())}
            calls, tokens = 3, cfg.prefill_tokens
        times = {k: [] for k in fns}
        with torch.no_grad():
            for r in range(cfg.rounds):
                for key in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                    bench.check_budget()
                    for _ in range(2):
                        fns[key]()
                    times[key].append(bench.elapsed_ms(fns[key], calls))
        ms = {k: statistics.median(v) for k, v in times.items()}
        row.update(status="ok", cuops_ms=ms["patch"], cuops_runs_ms=times["patch"], ratio=ms["torch"] / ms["patch"],
                   cuops_tokens_per_s=tokens / ms["patch"] * 1e3, check=check,
                   timer=f"{calls} calls a round, median of {cfg.rounds} rounds, torch and patch alternating")
        row["baselines"] = {"torch": {"ms": ms["torch"], "runs_ms": times["torch"], "ratio": ms["torch"] / ms["patch"]}}
    del models, ref


def decode_steps(cfg: HfLlamaBench, models: dict, batch: int, gen, device: str):
    """A step function a side over a cache of `kv` prompt positions, cropped back to kv after each
    step; and the first step's argmax agreement."""
    prompt = torch.randint(0, cfg.vocab, (batch, cfg.kv), generator=gen, device=device)
    nxt = prompt[:, -1:]
    pos = torch.full((batch, 1), cfg.kv, device=device)
    fns = {}
    for key, model in models.items():
        with torch.no_grad():
            cache = model(prompt, use_cache=True).past_key_values

        def step(model=model, cache=cache):
            out = model(nxt, past_key_values=cache, position_ids=pos, use_cache=True, logits_to_keep=1)
            cache.crop(-1)  # back to the prompt's kv positions
            return out.logits
        fns[key] = step
    with torch.no_grad():
        got, want = fns["patch"](), fns["torch"]()
    return fns, {"argmax_agreement": float((got.argmax(-1) == want.argmax(-1)).float().mean())}
