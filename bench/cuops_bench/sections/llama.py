"""A Llama-style model end to end (SPEC §3: greedy decode under CUDA graphs >= 1.08x torch at batch 1
and 8, prefill >= 1.00x): the model of llama_model.py with nn.Linear against its cuops twin (each MLP's
gate and up projections and their silu-gate as one torch.ops.cuops.swiglu, every other Linear on
torch.ops.cuops.mm; the same weight tensors).

Rows (family "llama"): prefill of one sequence of prefill_tokens (each call timed with CUDA events,
median of the rounds), and greedy decode at each batch: one token step per sequence, captured once as
a CUDA graph (the step reads the current tokens and position from device tensors, writes the KV cache
there and leaves the argmax and position + 1 for the next replay), replayed `steps` times a round;
ms per step is the round's time / steps. Torch and cuops alternate over the rounds.

Agreement. Both models compute in bf16 with float32 accumulation, but the GEMMs sum in different
orders and round their bf16 outputs differently, and 8 layers carry those last-bit differences to the
logits; where two candidate tokens' logits are closer than that noise, the argmax may differ, and from
then on free-running greedy decodes drift apart for good. So the token check is teacher-forced: torch
decodes greedily (eager, the same step function), then cuops is fed torch's tokens, and the per-step
logits are compared: the argmax agreement rate over every (step, sequence), the largest logit
difference relative to the largest |logit| (and the RMS difference relative to the RMS logit), and,
over the positions where the argmaxes differ, torch's largest top-1 - top-2 margin: when that margin
is below the logit difference seen, each flip is a near-tie that bf16 cannot decide, not a wrong
product. The free-running tokens of the two CUDA-graph decodes are compared too (common prefix, per
sequence), and torch's graph tokens against its eager tokens (the capture must not change them).
Random weights give near-flat logits unless scaled: init std 0.02 and the final RMSNorm make logits of
std ~1.3 over the vocabulary (LlamaConfig.init_std), so the median top-1 margin (~0.2) is several bf16
spacings at the top logits (0.03); the few percent of positions closer than that are expected to flip
now and then, which is why agreement is reported as a rate with the margins beside it, not asserted.
"""
from __future__ import annotations

import statistics
import time

import torch

from ..context import LlamaBench, Run
from ..harness import GRAPH_WARMUP_CALLS, Bench, BudgetSpent, guarded, log
from ..llama_model import GreedyDecoder, Llama, cuops_twin

FAMILY = "llama"
DTYPE = torch.bfloat16
SIDES = ("torch", "cuops")  # "torch": nn.Linear (cuBLAS through F.linear); "cuops": cuops_twin's
LABELS = {"torch": "nn.Linear", "cuops": "CuopsLinear, MLP on cuops.swiglu"}


def sdpa_backends():
    """One fixed set of attention backends for both models and every run (cuDNN's, chosen by version
    and shape heuristics, left out): flash at prefill, efficient or math for the masked decode step,
    all capturable."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
    except Exception:  # noqa: BLE001 - an older torch: its default choice
        import contextlib
        return contextlib.nullcontext()


def run(ctx: Run) -> None:
    setup: LlamaBench = ctx.cfg.llama
    bench, cfg = ctx.bench, setup.model
    ctx.results["llama"] = {"config": cfg.as_dict(), "dtype": "bfloat16", "prefill_tokens": setup.prefill_tokens,
                            "prompt": setup.prompt, "steps": setup.steps, "batches": list(setup.batches),
                            "rounds": setup.rounds, "cuda_graphs": bench.cuda,
                            "weight_bytes": cfg.weight_count() * DTYPE.itemsize}
    rows = [prefill_template(setup)] + [decode_template(setup, b) for b in setup.batches]
    try:
        bench.check_budget()  # before building 4 GB of weights
        reason = bench.check_memory(memory_needed(setup))
    except BudgetSpent as e:
        ctx.rows.extend(dict(r, status="skipped", skip_reason=str(e)) for r in rows)
        return
    if reason is not None:
        ctx.rows.extend(dict(r, status="skipped", skip_reason=reason) for r in rows)
        return
    started = time.perf_counter()
    max_positions = max(setup.prefill_tokens, setup.prompt + setup.steps)
    model = Llama(cfg, max_positions, device=bench.device, dtype=DTYPE)
    models = {"torch": model, "cuops": cuops_twin(model)}
    log(f"llama: {cfg.layers} layers, hidden {cfg.hidden}, {cfg.weight_count() / 1e9:.2f} G weights "
        f"({time.perf_counter() - started:.1f}s to build)")
    try:
        with torch.no_grad(), sdpa_backends():
            for row in rows:
                t0 = time.perf_counter()
                work = time_prefill if row["op"] == "prefill" else time_decode
                guarded(ctx.rows, row, lambda r: work(bench, models, setup, r))
                log(f"llama {row['op']} {row['size']}: {time.perf_counter() - t0:.1f}s")
    finally:
        del models, model
        bench.free_memory(collect=True)


def memory_needed(setup: LlamaBench) -> float:
    """Weights once (the twin shares them), prefill activations (a few [T, ffn] tensors), the caches."""
    cfg, es = setup.model, DTYPE.itemsize
    act = 6 * setup.prefill_tokens * 2 * cfg.ffn * es
    per_position = cfg.layers * 2 * cfg.kv_heads * cfg.head_dim * es
    caches = 2 * per_position * (setup.prefill_tokens + sum(setup.batches) * (setup.prompt + setup.steps))
    return cfg.weight_count() * es + act + caches


def base_row(setup: LlamaBench) -> dict:
    cfg = setup.model
    return {"family": FAMILY, "dtype": "bfloat16", "precision": None, "layers": cfg.layers, "hidden": cfg.hidden}


def prefill_template(setup: LlamaBench) -> dict:
    T = setup.prefill_tokens
    return dict(base_row(setup), op="prefill", size=f"1x{T}", batch=1, tokens=T)


def decode_template(setup: LlamaBench, batch: int) -> dict:
    return dict(base_row(setup), op="decode", size=f"b{batch} x{setup.steps}", batch=batch, steps=setup.steps,
                context=setup.prompt)


def random_tokens(vocab: int, shape: tuple, device: str, seed: int):
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randint(0, vocab, shape, generator=g, device=device)


def alternating(bench: Bench, timed, rounds: int) -> dict:
    """{side: [timed(side), one per round]}, the order flipped every round (as Bench.steady_rounds), so
    clock drift under the power cap falls on both sides alike."""
    times = {key: [] for key in SIDES}
    for i in range(rounds):
        for key in (SIDES if i % 2 == 0 else SIDES[::-1]):
            bench.check_budget()
            times[key].append(timed(key))
    return times


def record(row: dict, times: dict, timer: str, tokens_per_call: int) -> None:
    ms = {key: statistics.median(ts) for key, ts in times.items()}
    row.update(status="ok", cuops_ms=ms["cuops"], cuops_runs_ms=times["cuops"], timer=timer,
               cuops_tokens_per_s=tokens_per_call / ms["cuops"] * 1e3, ratio=ms["torch"] / ms["cuops"])
    row["baselines"] = {"torch": {"label": LABELS["torch"], "call": "nn.Linear (F.linear)", "ms": ms["torch"],
                                  "runs_ms": times["torch"], "ratio": ms["torch"] / ms["cuops"],
                                  "tokens_per_s": tokens_per_call / ms["torch"] * 1e3}}


def compare_logits(ref, got) -> dict:
    """ref, got [..., vocab]: how far got's logits and argmaxes are from ref's (docstring above)."""
    ref, got = ref.float(), got.float()
    diff = (got - ref).abs()
    agree = ref.argmax(-1) == got.argmax(-1)
    top2 = ref.topk(2, dim=-1).values
    margin = top2[..., 0] - top2[..., 1]
    out = {"positions": agree.numel(), "argmax_agreement": agree.float().mean().item(),
           "disagreements": int((~agree).sum().item()),
           "max_abs_diff": diff.max().item(), "max_abs_logit": ref.abs().max().item(),
           "max_rel_diff": (diff.max() / ref.abs().max().clamp_min(1e-30)).item(),
           "rms_rel_diff": (diff.pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-30)).item(),
           "median_margin": margin.median().item()}
    if not agree.all():
        out["disagree_max_margin"] = margin[~agree].max().item()
    return out


def time_prefill(bench: Bench, models: dict, setup: LlamaBench, row: dict) -> None:
    cfg, T = setup.model, setup.prefill_tokens
    tokens = random_tokens(cfg.vocab, (1, T), bench.device, cfg.seed + 1)
    caches = {key: m.new_cache(1, T) for key, m in models.items()}
    fns = {key: (lambda m=m, c=caches[key]: m.prefill(tokens, c)) for key, m in models.items()}
    logits = {key: fn() for key, fn in fns.items()}  # also the warm-up call
    row["check"] = compare_logits(logits["torch"], logits["cuops"])
    times = alternating(bench, lambda key: bench.elapsed_ms(fns[key], 1), setup.rounds)
    record(row, times, f"{'cuda events' if bench.cuda else 'wall clock (cpu)'} around one call, median of "
                       f"{setup.rounds} rounds, torch and cuops alternating", T)


def teacher_forced(decoders: dict, prompt, steps: int) -> tuple:
    """torch decodes greedily; cuops is fed torch's tokens. ([steps + 1, B, vocab] logits of each, the
    torch tokens [B, steps + 1])."""
    ref, twin = decoders["torch"], decoders["cuops"]
    ref_logits = [ref.start(prompt).float()]
    for _ in range(steps):
        ref_logits.append(ref.step().float())
    tokens = ref.generated().clone()
    twin_logits = [twin.start(prompt).float()]
    for i in range(steps):
        twin.tokens.copy_(tokens[:, i])  # the input at this step is torch's token, not cuops' own argmax
        twin_logits.append(twin.step().float())
    return torch.stack(ref_logits), torch.stack(twin_logits), tokens


class DecodeLoop:
    """Greedy decode of `steps` tokens from the prompt's first token: CUDA graph replays of one step
    on a GPU, the same step called eagerly on cpu."""

    def __init__(self, bench: Bench, decoder: GreedyDecoder):
        self.decoder, self.graph = decoder, None
        if not bench.cuda:
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(GRAPH_WARMUP_CALLS):
                decoder.step()
        torch.cuda.current_stream().wait_stream(side)
        decoder.restart()
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            decoder.step()
        self.graph.replay()  # uploads the graph; restart() comes before every timed decode
        torch.cuda.synchronize()

    def step(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self.decoder.step()

    def close(self) -> None:
        if self.graph is not None:
            self.graph.reset()
            self.graph = None


def common_prefix(a, b) -> list[int]:
    """Per row of a and b ([B, L]): how many leading tokens agree."""
    same = (a == b).int()
    return same.cumprod(dim=1).sum(dim=1).tolist()


def time_decode(bench: Bench, models: dict, setup: LlamaBench, row: dict) -> None:
    cfg, batch, steps = setup.model, row["batch"], setup.steps
    prompt = random_tokens(cfg.vocab, (batch, setup.prompt), bench.device, cfg.seed + 2 + batch)
    decoders = {key: GreedyDecoder(m, batch, setup.prompt, steps) for key, m in models.items()}
    ref_logits, twin_logits, eager_tokens = teacher_forced(decoders, prompt, steps)
    row["check"] = compare_logits(ref_logits, twin_logits)
    del ref_logits, twin_logits
    for dec in decoders.values():
        dec.restart()
    loops = {}
    try:
        for key in SIDES:
            loops[key] = DecodeLoop(bench, decoders[key])

        # Every round restarts from the prompt's first token and decodes `steps` tokens; the events
        # cover the steps only (restart is three small copies).
        def timed(key):
            decoders[key].restart()
            return bench.elapsed_ms(loops[key].step, steps)

        for key in SIDES:  # one untimed decode each: first replays, clocks up
            timed(key)
        times = alternating(bench, timed, setup.rounds)
    finally:
        for loop in loops.values():
            loop.close()
    how = (f"cuda graph of one step replayed {steps} times" if bench.cuda else f"{steps} eager steps (cpu)")
    record(row, times, f"{how}, events around the decode, median of {setup.rounds} rounds, torch and cuops "
                       "alternating", batch)
    graph_tokens = {key: dec.generated() for key, dec in decoders.items()}
    free = common_prefix(graph_tokens["torch"], graph_tokens["cuops"])
    row["check"].update(free_running_prefix=free, free_running_tokens=steps + 1,
                        graph_vs_eager_prefix=common_prefix(graph_tokens["torch"], eager_tokens))
    if min(row["check"]["graph_vs_eager_prefix"]) < steps + 1:
        row["check"]["warning"] = "torch's decode under the CUDA graph gave other tokens than its eager decode"
    del decoders, graph_tokens
    if bench.cuda:
        bench.free_memory()
