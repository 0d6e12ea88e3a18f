"""Mixture of experts (SPEC §3 "Mixture of experts"): the grouped GEMM against torch._grouped_mm and a
per-expert loop, and transformers' Qwen3-MoE and Mixtral-shaped models unpatched against cuops.patch.

Grouped GEMM (rows "grouped_mm", one a shape, routing and product): the tokens of a layer sorted by
expert, T·k rows in groups of the routing's counts (balanced: random top-k; skewed: Zipf-like, the first
experts taking most pairs), against the experts' [E, N, K] weight read transposed as transformers does;
the three products of a training step: forward ([S, K] x [E, K, N]), dX ([S, N] x [E, N, K]) and dW
(grouped along S: [K, S] x [S, N] -> [E, K, N]). bf16. Baselines: torch._grouped_mm (CUTLASS on sm_90)
and a loop of one torch.mm an expert over host-known counts (what a model without a grouped kernel runs).
Alternating rounds (MoeBench.rounds), medians.

Training step (rows "train_step", one a model and variant): 8 x 1024 tokens, AdamW(fused), the loss
from labels with output_router_logits (the load-balancing loss). Variants: HF with float32 weights under
bf16 autocast (how HF Trainer's bf16=True trains), HF with bf16 weights (transformers' torch._grouped_mm
path), Liger-Kernel where it is installed and patches the family (float32 weights + autocast), cuops.patch
with float32 weights + autocast, with bf16 weights, and compiled. A model of Qwen3-30B-A3B's layer shape
holds ~40 GB of weights and optimizer state in float32: the variants are built, timed and freed one
after another (rounds alternate within a variant only; the device's clock drift falls between
variants, so the table gives each variant's median of rounds and the run order). Memory: the peak a
step adds over what is allocated before it.

Decode (rows "decode"): bf16 weights, eager, 1 and 8 tokens a step over a fixed KV length (hf_llama's
decode_steps), HF against patch alternating. And the experts alone at decode (rows "experts_decode", one
a layer shape and token count): moe_experts replayed from a CUDA graph, the routed experts' weight bytes
(read once) per second against the copy's at that size (SPEC §3: >= 0.85).
"""
from __future__ import annotations

import copy
import statistics
import time

import torch

from ..context import MoeBench, Run
from ..harness import BudgetSpent, guarded, log
from .hf_llama import added_gb, decode_steps

FAMILY = "moe"


def run(ctx: Run) -> None:
    cfg: MoeBench = ctx.cfg.moe
    bench = ctx.bench
    ctx.results["moe"] = {"config": {k: v for k, v in cfg.__dict__.items()},
                          "optimizer": "AdamW(fused)" if bench.cuda else "AdamW"}
    grouped_rows(ctx, cfg)
    decode_experts_rows(ctx, cfg)
    for name in cfg.models:
        rows = [{"family": FAMILY, "op": "train_step", "model": name, "mode": v, "size": f"{cfg.batch}x{cfg.seq}",
                 "dtype": "bf16" if bench.cuda else "float32"} for v in variants(cfg, bench.cuda)]
        rows += [{"family": FAMILY, "op": "decode", "model": name, "batch": b, "size": f"{b}x1 kv {cfg.kv}",
                  "dtype": "bfloat16" if bench.cuda else "float32"} for b in cfg.decode_batches]
        for row in rows:
            try:
                bench.check_budget()
            except BudgetSpent as e:
                ctx.rows.append(dict(row, status="skipped", skip_reason=str(e)))
                continue
            t0 = time.perf_counter()
            work = time_variant if row["op"] == "train_step" else time_decode
            guarded(ctx.rows, row, lambda r: work(bench, cfg, r))
            done = ctx.rows[-1]
            log(f"moe {name} {row['op']} {row.get('mode', row.get('batch'))}: {time.perf_counter() - t0:.1f}s "
                f"({done.get('status')}: {done.get('cuops_ms', float('nan')):.1f} ms, "
                f"{done.get('cuops_added_gb') or float('nan'):.2f} GB added)")
            bench.free_memory(collect=True)
            if ctx.save is not None:  # a run cut short keeps the variants it measured
                ctx.save()


# ---- the grouped GEMM


def counts_for(tokens: int, k: int, experts: int, routing: str, seed: int) -> list[int]:
    """Pairs per expert of tokens x top-k routing: balanced (random distinct experts a token) or skewed
    (a token's experts drawn with weights 1 / (rank + 1), distinct)."""
    g = torch.Generator().manual_seed(seed)
    weights = torch.ones(experts) if routing == "balanced" else 1.0 / torch.arange(1, experts + 1).double()
    idx = torch.multinomial(weights.expand(tokens, experts), k, replacement=False, generator=g)
    return torch.bincount(idx.flatten(), minlength=experts).tolist()


def grouped_rows(ctx: Run, cfg: MoeBench) -> None:
    bench = ctx.bench
    dtype = torch.bfloat16 if bench.cuda else torch.float32
    for name, experts, k, hidden, n in cfg.grouped_shapes:
        for routing in cfg.routings:
            counts = counts_for(cfg.batch * cfg.seq, k, experts, routing, cfg.seed)
            for product in ("forward", "dX", "dW"):
                row = {"family": FAMILY, "op": "grouped_mm", "model": name, "routing": routing, "kind": product,
                       "size": f"E {experts} S {sum(counts)} K {hidden} N {n}", "dtype": str(dtype)[6:]}
                try:
                    bench.check_budget()
                except BudgetSpent as e:
                    ctx.rows.append(dict(row, status="skipped", skip_reason=str(e)))
                    continue
                guarded(ctx.rows, row, lambda r: time_grouped(bench, cfg, r, counts, hidden, n, product, dtype))
                bench.free_memory()


def time_grouped(bench, cfg: MoeBench, row: dict, counts: list, hidden: int, n: int, product: str, dtype) -> None:
    import cuops
    device = bench.device
    experts, rows = len(counts), sum(counts)
    offs = torch.tensor(counts, device=device).cumsum(0).int()
    weight = torch.randn(experts, n, hidden, device=device, dtype=dtype) / hidden ** 0.5  # [E, N, K] as HF
    if product == "forward":
        a, b = torch.randn(rows, hidden, device=device, dtype=dtype), weight.transpose(1, 2)
    elif product == "dX":
        a, b = torch.randn(rows, n, device=device, dtype=dtype), weight
    else:
        a = torch.randn(rows, hidden, device=device, dtype=dtype).t()
        b = torch.randn(rows, n, device=device, dtype=dtype)
    ends = [0] + torch.tensor(counts).cumsum(0).tolist()

    def loop():
        if product == "dW":
            return torch.stack([a[:, s:e] @ b[s:e] for s, e in zip(ends, ends[1:])])
        return torch.cat([a[s:e] @ b[i] for i, (s, e) in enumerate(zip(ends, ends[1:]))])

    sides = {"cuops": lambda: cuops.grouped_mm(a, b, offs), "loop": loop}
    if bench.cuda and dtype == torch.bfloat16:
        sides["torch._grouped_mm"] = lambda: torch._grouped_mm(a, b, offs)
    want = loop().float()
    got = sides["cuops"]().float()
    err = float((got - want).norm() / want.norm().clamp_min(1e-30))
    times = {key: [] for key in sides}
    for r in range(cfg.rounds):
        for key in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            times[key].append(bench.measure(sides[key], flush=False).ms)
    ms = {key: statistics.median(v) for key, v in times.items()}
    flops = 2 * rows * hidden * n
    base = "torch._grouped_mm" if "torch._grouped_mm" in ms else "loop"
    row.update(status="ok", cuops_ms=ms["cuops"], ratio=ms[base] / ms["cuops"], cuops_tflops=flops / ms["cuops"] / 1e9,
               check={"rel_error_vs_loop": err}, counts=counts,
               timer=f"{bench.timer_name}, median of {cfg.rounds} rounds, the sides alternating")
    row["baselines"] = {key: {"ms": v, "ratio": v / ms["cuops"], "tflops": flops / v / 1e9}
                        for key, v in ms.items() if key != "cuops"}


# ---- the experts at decode


def decode_experts_rows(ctx: Run, cfg: MoeBench) -> None:
    bench = ctx.bench
    if not bench.cuda:
        return
    for name, experts, k, hidden, inter in cfg.decode_shapes:
        for tokens in cfg.decode_batches:
            row = {"family": FAMILY, "op": "experts_decode", "model": name, "tokens": tokens,
                   "size": f"T {tokens} E {experts} k {k} H {hidden} I {inter}", "dtype": "bfloat16"}
            try:
                bench.check_budget()
            except BudgetSpent as e:
                ctx.rows.append(dict(row, status="skipped", skip_reason=str(e)))
                continue
            guarded(ctx.rows, row, lambda r: time_decode_experts(ctx, cfg, r, experts, k, hidden, inter))
            bench.free_memory()


def time_decode_experts(ctx: Run, cfg: MoeBench, row: dict, experts: int, k: int, hidden: int, inter: int) -> None:
    import cuops
    from ..harness import graphed
    bench, device, tokens = ctx.bench, ctx.bench.device, row["tokens"]
    dt = torch.bfloat16
    x = torch.randn(tokens, hidden, device=device, dtype=dt)
    gate_up = torch.randn(experts, 2 * inter, hidden, device=device, dtype=dt) / hidden ** 0.5
    down = torch.randn(experts, hidden, inter, device=device, dtype=dt) / inter ** 0.5
    g = torch.Generator().manual_seed(cfg.seed)
    idx = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)]).to(device)
    w = torch.rand(tokens, k, device=device)
    routed = int(idx.unique().numel())
    nbytes = routed * 3 * inter * hidden * x.element_size()
    with torch.no_grad():
        call = graphed(bench, lambda: lambda: cuops.moe_experts(x, idx, w, gate_up, down))
        ms = statistics.median(bench.measure(call).ms for _ in range(cfg.rounds))
    copy = ctx.ceiling.at(max(4, nbytes // 2 // 4 * 4))
    row.update(status="ok", cuops_ms=ms, bytes=nbytes, routed_experts=routed, GBps=nbytes / ms / 1e6,
               copy_GBps=copy.get("GBps"), timer=f"{bench.timer_name} of a CUDA-graph replay, median of {cfg.rounds}")
    if copy.get("GBps"):
        row["fraction"] = row["GBps"] / copy["GBps"]


# ---- the models


def variants(cfg: MoeBench, cuda: bool) -> tuple:
    return cfg.variants if cuda else tuple(v for v in cfg.variants if v in ("hf fp32", "patch fp32"))


def build(cfg: MoeBench, name: str, device: str, dtype: torch.dtype):
    import transformers
    family, layers, hidden, experts, k, inter, heads, kv_heads = dict(cfg.model_shapes)[name]
    torch.manual_seed(cfg.seed)
    common = dict(vocab_size=cfg.vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                  num_key_value_heads=kv_heads, num_experts_per_tok=k, max_position_embeddings=4096,
                  rms_norm_eps=1e-6, tie_word_embeddings=False, output_router_logits=True)
    if family == "mixtral":
        config = transformers.MixtralConfig(num_local_experts=experts, intermediate_size=inter, **common)
    else:
        config = transformers.Qwen3MoeConfig(num_experts=experts, moe_intermediate_size=inter, intermediate_size=inter,
                                             head_dim=hidden // heads, **common)
    with torch.device(device):  # initialised where it runs: a CPU init of 10 GB of experts takes ~20 s
        model = transformers.AutoModelForCausalLM.from_config(config).to(dtype)
    with torch.no_grad():  # transformers leaves the 3-D expert parameters to a checkpoint
        for pname, p in model.named_parameters():
            if p.dim() == 3:
                p.normal_(0, config.initializer_range)
    return model


def make_model(cfg: MoeBench, name: str, variant: str, device: str):
    """The model of one variant, or a reason it cannot run (Liger without the package or the family)."""
    import cuops
    dtype = torch.bfloat16 if variant.endswith("bf16") else torch.float32
    model = build(cfg, name, device, dtype)
    if variant.startswith("patch"):
        cuops.patch(model)
    elif variant.startswith("liger"):
        try:
            import liger_kernel.transformers as liger
        except ImportError as e:
            return None, f"liger_kernel not installed ({e})"
        apply = getattr(liger, f"apply_liger_kernel_to_{model.config.model_type}", None)  # qwen3_moe, mixtral
        if apply is None:
            return None, f"Liger-Kernel {getattr(liger, '__version__', '')} does not patch {type(model).__name__}"
        apply(model=model)
    return model, None


def time_variant(bench, cfg: MoeBench, row: dict) -> None:
    device = bench.device
    variant = row["mode"]
    model, why = make_model(cfg, row["model"], variant, device)
    if model is None:
        row.update(status="skipped", skip_reason=why)
        return
    autocast = bench.cuda and not variant.endswith("bf16")
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, fused=bench.cuda)
    step_model = torch.compile(model) if variant.endswith("compile") else model
    gen = torch.Generator(device=device).manual_seed(cfg.seed + 1)
    batches = [torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq), generator=gen, device=device) for _ in range(4)]
    n = [0]

    def step():
        ids = batches[n[0] % len(batches)]
        n[0] += 1
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            loss = step_model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    first = float(step())
    for _ in range(cfg.warmup):
        step()
    added = added_gb(bench, step)
    times = [bench.elapsed_ms(step, cfg.steps) for _ in range(cfg.rounds)]
    tokens = cfg.batch * cfg.seq
    row.update(status="ok", cuops_ms=statistics.median(times), cuops_runs_ms=times, cuops_added_gb=added,
               cuops_tokens_per_s=tokens / statistics.median(times) * 1e3, check={"first_loss": first},
               timer=f"{'cuda events' if bench.cuda else 'wall clock'} around {cfg.steps} steps, median of "
                     f"{cfg.rounds} rounds; variants one after another (memory)")
    del step_model, model, opt


def time_decode(bench, cfg: MoeBench, row: dict) -> None:
    import cuops
    dtype = torch.bfloat16 if bench.cuda else torch.float32
    ref = build(cfg, row["model"], bench.device, dtype).eval()
    ref.config.output_router_logits = False
    models = {"torch": ref, "patch": cuops.patch(copy.deepcopy(ref))}
    gen = torch.Generator(device=bench.device).manual_seed(cfg.seed + 2)
    with torch.no_grad():
        fns, check = decode_steps(cfg, models, row["batch"], gen, bench.device)
        times = {k: [] for k in fns}
        for r in range(cfg.rounds):
            for key in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                for _ in range(2):
                    fns[key]()
                times[key].append(bench.elapsed_ms(fns[key], cfg.decode_steps))
    ms = {k: statistics.median(v) for k, v in times.items()}
    row.update(status="ok", cuops_ms=ms["patch"], ratio=ms["torch"] / ms["patch"], check=check,
               timer=f"{cfg.decode_steps} steps a round, median of {cfg.rounds} rounds, torch and patch alternating")
    row["baselines"] = {"torch": {"ms": ms["torch"], "ratio": ms["torch"] / ms["patch"]}}
    del models, ref
