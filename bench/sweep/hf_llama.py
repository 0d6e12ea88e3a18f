"""transformers' LlamaForCausalLM (issue 50's config: 8 layers, width 2048, FFN 5632, 16 / 4 heads, vocabulary
128256; random weights) unpatched against cuops.patch: the bf16-autocast AdamW training step (torch eager,
torch.compile, patch eager, patch + compile) with the memory a step adds over the weights and optimizer
state; eager decode at batch 1 and 8 with the KV length held fixed; eager prefill 1 x 2048 with
logits_to_keep=1. Sides alternate over rounds; medians. An experiment: its output is not committed.

    python3 bench/sweep/hf_llama.py [train] [decode] [prefill] [profile] [parts]
"""
import copy
import os
import re
import statistics
import sys
import time

import torch

import cuops
import transformers

CONFIG = dict(vocab_size=128256, hidden_size=2048, intermediate_size=5632, num_hidden_layers=8,
              num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=4096, rms_norm_eps=1e-5,
              tie_word_embeddings=False)


def build(dtype):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**CONFIG)
    return transformers.LlamaForCausalLM(cfg).to("cuda", dtype)


def timed(fn, n):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


def train_steps(sides=("torch", "patch")):
    """{"torch eager": step, ...}: each side's model (float32 weights, AdamW) eager and compiled."""
    torch._dynamo.config.cache_size_limit = 64
    ref = build(torch.float32)
    models = {"torch": ref, "patch": cuops.patch(copy.deepcopy(ref)) if "patch" in sides else None}
    g = torch.Generator(device="cuda").manual_seed(1)
    ids = torch.randint(0, CONFIG["vocab_size"], (8, 1024), device="cuda", generator=g)
    variants = {}
    for name in sides:
        model = models[name]
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
        compiled = torch.compile(model)
        for mode, m in (("eager", model), ("compile", compiled)):
            def step(m=m, opt=opt):
                with torch.autocast("cuda", torch.bfloat16):
                    loss = m(input_ids=ids, labels=ids).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                return loss
            variants[f"{name} {mode}"] = step
    return variants


# A kernel's class by its name (first match): where a step's GPU time goes.
CLASSES = [("attention", r"sdpa|flash|fmha|attention"), ("gemm", r"gemm|nvjet|cutlass|xmma|sm90_"),
           ("optimizer", r"multi_tensor|adam"), ("norm", r"rms_norm|mean_mul_pow_rsqrt|pow_sum"),
           ("rotary", r"rotary|cos_mul_neg_sin"), ("loss", r"ce_rows|log_softmax|nll|cross"),
           ("swiglu/silu", r"swiglu|silu"), ("cast/copy", r"copy|cast|convert"),
           ("add/mul", r"add|mul|fill"), ("triton", r"triton")]


def profile(keys=("torch compile", "patch compile", "patch eager"), top=22):
    """Each variant's kernels over 2 steps after warm-up, summed by name (PDL overlap inflates the sums
    of cuops' GEMMs: where to look, not a timing)."""
    variants = train_steps()
    for key in keys:
        sums = kernel_sums(variants[key])
        total = sum(sums.values())
        print(f"== {key}: {total:.1f} ms of kernels a step")
        classes = {}
        for name, ms in sums.items():
            label = next((c for c, pat in CLASSES if re.search(pat, name, re.I)), "other")
            classes[label] = classes.get(label, 0) + ms
        print("  by class: " + ", ".join(f"{c} {ms:.2f}" for c, ms in sorted(classes.items(), key=lambda kv: -kv[1])))
        for name, ms in sorted(sums.items(), key=lambda kv: -kv[1])[:top]:
            print(f"  {ms:7.2f}  {name[:110]}")


def kernel_sums(fn, steps=2):
    """{kernel name: ms a call} over `steps` calls of fn after warm-up."""
    from torch.profiler import ProfilerActivity, profile as prof
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with prof(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    sums = {}
    for e in p.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            sums[e.name] = sums.get(e.name, 0) + e.device_time_total / steps / 1e3
    return sums


def parts(rounds=6, profile_layer=True):
    """The training step's pieces on their own, forward + backward under bf16 autocast, the four
    variants alternating: one decoder layer (float32 residual stream in and out) and the head (a model
    of 0 layers: embeddings, final norm, lm_head and the loss). 8 layers + head ~ the step less AdamW."""
    from triton.testing import do_bench
    torch._dynamo.config.cache_size_limit = 64
    g = torch.Generator(device="cuda").manual_seed(1)
    ids = torch.randint(0, CONFIG["vocab_size"], (8, 1024), device="cuda", generator=g)
    h = torch.randn(8, 1024, CONFIG["hidden_size"], device="cuda", generator=g).requires_grad_()
    dy = torch.randn(h.shape, device="cuda", generator=g)
    pos = torch.arange(1024, device="cuda")[None]
    torch.manual_seed(0)
    full = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).cuda()
    head = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**CONFIG, "num_hidden_layers": 0})).cuda()
    pe = full.model.rotary_emb(h, pos)
    pieces = {"layer": full.model.layers[0], "head": head}
    pieces = {k: v for k, v in pieces.items() if k in os.environ.get("PARTS", "layer,head").split(",")}

    def run(piece, m):
        with torch.autocast("cuda", torch.bfloat16):
            if piece == "head":
                return m(input_ids=ids, labels=ids).loss.backward()
            out = m(h, position_embeddings=pe, position_ids=pos)
        (out[0] if isinstance(out, tuple) else out).backward(dy)

    for piece, ref in pieces.items():
        pat = cuops.patch(copy.deepcopy(head)) if piece == "head" else cuops.patch(copy.deepcopy(full)).model.layers[0]
        sides = {"torch eager": ref, "torch compile": torch.compile(ref), "patch eager": pat,
                 "patch compile": torch.compile(pat)}
        params = [p for m in (ref, pat) for p in m.parameters()] + [h]
        fns = {k: (lambda m=m: run(piece, m)) for k, m in sides.items()}
        for f in fns.values():
            f()
        times = {k: [] for k in fns}
        for r in range(rounds):
            for key in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                times[key].append(do_bench(fns[key], warmup=25, rep=150, grad_to_none=params))
        base = statistics.median(times["torch compile"])
        if piece == "layer" and profile_layer:
            def fresh(fn):  # gradients set to None first, as do_bench's grad_to_none: no accumulation adds
                return lambda: ([setattr(p, "grad", None) for p in params], fn())
            for key in ("torch compile", "patch compile"):
                sums = kernel_sums(fresh(fns[key]))
                print(f"== {key}: {sum(sums.values()):.3f} ms of kernels a layer")
                for name, ms in sorted(sums.items(), key=lambda kv: -kv[1])[:30]:
                    print(f"  {ms * 1e3:8.1f} us  {name[:120]}")
        print(f"{piece}: " + ", ".join(f"{k} {statistics.median(v):.3f} ms ({base / statistics.median(v):.3f}x compile)"
                                      for k, v in times.items()), flush=True)


def train(rounds=5, steps=3):
    variants = train_steps()
    losses, mem = {}, {}
    for key, step in variants.items():
        t0 = time.perf_counter()
        losses[key] = [step().item() for _ in range(3)]
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        mem[key] = (torch.cuda.max_memory_allocated() - base) / 1e9
        print(f"{key}: warm-up {time.perf_counter() - t0:.1f}s, losses {losses[key]}", flush=True)
    times = {k: [] for k in variants}
    keys = list(variants)
    for r in range(rounds):
        for key in (keys if r % 2 == 0 else keys[::-1]):
            times[key].append(timed(variants[key], steps))
    eager = statistics.median(times["torch eager"])
    comp = statistics.median(times["torch compile"])
    print(f"{'variant':<15} {'ms/step':>8} {'vs eager':>8} {'vs compile':>10} {'GB added':>9} {'vs eager':>8}")
    for key in keys:
        ms = statistics.median(times[key])
        print(f"{key:<15} {ms:8.2f} {eager / ms:8.3f} {comp / ms:10.3f} {mem[key]:9.2f} "
              f"{mem[key] / mem['torch eager']:8.3f}")
    del variants
    torch.cuda.empty_cache()


def decode(batches=(1, 8), kv=512, steps=32, rounds=5):
    ref = build(torch.bfloat16).eval()
    patched = cuops.patch(copy.deepcopy(ref))
    print(f"{'decode':<10} {'torch ms':>9} {'patch ms':>9} {'speedup':>8}")
    for b in batches:
        g = torch.Generator(device="cuda").manual_seed(2)
        prompt = torch.randint(0, CONFIG["vocab_size"], (b, kv), device="cuda", generator=g)
        nxt = prompt[:, -1:]
        pos = torch.full((b, 1), kv, device="cuda")
        fns = {}
        for name, model in (("torch", ref), ("patch", patched)):
            with torch.no_grad():
                cache = model(prompt, use_cache=True).past_key_values

            def step(model=model, cache=cache):
                with torch.no_grad():
                    out = model(nxt, past_key_values=cache, position_ids=pos, use_cache=True, logits_to_keep=1)
                cache.crop(kv)  # the KV length held fixed
                return out.logits
            fns[name] = step
        want, got = fns["torch"](), fns["patch"]()
        agree = (want.argmax(-1) == got.argmax(-1)).float().mean().item()
        times = {k: [] for k in fns}
        for r in range(rounds):
            for key in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                for _ in range(3):
                    fns[key]()
                times[key].append(timed(fns[key], steps))
        t, p = statistics.median(times["torch"]), statistics.median(times["patch"])
        print(f"batch {b:<4} {t:9.3f} {p:9.3f} {t / p:8.3f}  (argmax agreement {agree:.2f})")


def prefill(tokens=2048, rounds=7):
    ref = build(torch.bfloat16).eval()
    patched = cuops.patch(copy.deepcopy(ref))
    g = torch.Generator(device="cuda").manual_seed(3)
    ids = torch.randint(0, CONFIG["vocab_size"], (1, tokens), device="cuda", generator=g)
    fns = {name: (lambda m=m: m(ids, use_cache=True, logits_to_keep=1).logits) for name, m in
           (("torch", ref), ("patch", patched))}
    times = {k: [] for k in fns}
    with torch.no_grad():
        for f in fns.values():
            f()
        for r in range(rounds):
            for key in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                times[key].append(timed(fns[key], 3))
    t, p = statistics.median(times["torch"]), statistics.median(times["patch"])
    print(f"prefill 1x{tokens}: torch {t:.2f} ms, patch {p:.2f} ms, speedup {t / p:.3f}")


if __name__ == "__main__":
    what = sys.argv[1:] or ["train", "decode", "prefill"]
    print(torch.cuda.get_device_name(), "transformers", transformers.__version__)
    for w in what:
        globals()[w]()
        torch.cuda.empty_cache()
