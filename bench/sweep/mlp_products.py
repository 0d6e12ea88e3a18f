"""The patched Llama MLP's products against cuBLAS at the hf_llama bench's shapes (bf16, 8 x 1024
tokens, width 2048, FFN 5632): each product of the forward and backward as the patch's autograd runs it
(ops/swiglu.cpp, ops/linear.cpp) against torch.mm on the same operand views, then the whole MLP forward
+ backward, eager and compiled, cuops against Hugging Face's code. Sides alternate over rounds; each
round one do_bench (L2 flush) a side. An experiment: its output is not committed.

    python3 bench/sweep/mlp_products.py [tokens width ffn] [--rounds 6]
"""
from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import cuops  # noqa: F401  (registers torch.ops.cuops)


def ab(name: str, flops: float, sides: dict, rounds: int, grad_to_none=None) -> None:
    keys = list(sides)
    times: dict = {key: [] for key in keys}
    for r in range(rounds):
        for key in keys if r % 2 == 0 else keys[::-1]:
            times[key].append(do_bench(sides[key], warmup=25, rep=100, grad_to_none=grad_to_none))
    med = {key: statistics.median(v) for key, v in times.items()}
    base = med[keys[0]]
    cells = "  ".join(f"{key} {med[key] * 1e3:8.1f} us ({base / med[key]:.3f}x"
                      + (f", {flops / med[key] / 1e9:5.0f} TF/s)" if flops else ")") for key in keys)
    print(f"{name:26s} {cells}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", nargs="*", type=int, default=[8192, 2048, 5632])
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    t, h, i = args.shape
    ops = torch.ops.cuops
    torch.manual_seed(0)
    dt = torch.bfloat16

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, device="cuda", dtype=dt) * scale

    x, dy = rnd(t, h), rnd(t, h)
    wg, wu, wd = rnd(i, h, scale=h ** -0.5), rnd(i, h, scale=h ** -0.5), rnd(h, i, scale=i ** -0.5)
    hh, dg, du = rnd(t, i), rnd(t, i), rnd(t, i)
    dx = torch.empty(t, h, device="cuda", dtype=dt)
    f1 = 2.0 * t * h * i
    r = args.rounds
    print(f"bf16, tokens {t}, width {h}, ffn {i}; {r} rounds; ratio = torch / side (>1: faster)")

    def torch_dual():
        g, u = torch.mm(x, wg.t()), torch.mm(x, wu.t())
        return g, u

    ab("gate+up fwd (dual)", 2 * f1, {"torch 2 mm": torch_dual,
                                      "cuops _swiglu_fwd": lambda: ops._swiglu_fwd(x, wg, wu),
                                      "cuops swiglu": lambda: ops.swiglu(x, wg, wu)}, r)
    ab("down fwd", f1, {"torch": lambda: torch.mm(hh, wd.t()), "cuops": lambda: ops.mm(hh, wd.t())}, r)
    ab("down dx", f1, {"torch": lambda: torch.mm(dy, wd), "cuops": lambda: ops.mm(dy, wd)}, r)
    ab("down dw", f1, {"torch": lambda: torch.mm(dy.t(), hh), "cuops": lambda: ops.mm(dy.t(), hh)}, r)

    def torch_dx():
        return torch.mm(dg, wg).addmm_(du, wu)

    def cuops_dx():
        ops.gemm(dx, dg, wg, 1.0, 0.0)
        ops.gemm(dx, du, wu, 1.0, 1.0)

    ab("gate+up dx (beta 1)", 2 * f1, {"torch mm+addmm_": torch_dx, "cuops 2 gemm": cuops_dx}, r)
    ab("gate dw", f1, {"torch": lambda: torch.mm(dg.t(), x), "cuops": lambda: ops.mm(dg.t(), x)}, r)

    # The whole MLP, forward + backward, bf16 weights (no autocast: the casts are the same either way).
    params = [p.requires_grad_() for p in (wg, wu, wd)]
    xr = x.clone().requires_grad_()

    def hf(z):
        return F.linear(F.silu(F.linear(z, wg)) * F.linear(z, wu), wd)

    def patched(z):
        return ops.linear(ops.swiglu(z, wg, wu), wd)

    hf_c, patched_c = torch.compile(hf), torch.compile(patched)
    for fn in (hf_c, patched_c):
        fn(xr).backward(dy)

    def step(fn):
        return lambda: fn(xr).backward(dy)

    ab("MLP fwd+bwd", 6 * f1 + 3 * f1, {"HF eager": step(hf), "HF compiled": step(hf_c),
                                        "patch eager": step(patched), "patch compiled": step(patched_c)},
       r, grad_to_none=params + [xr])


if __name__ == "__main__":
    main()
