"""The GEMM products real models run, for the shape suite (SPEC §3 "the shapes real models run"):
public transformer configurations written down from their published sizes (no downloads), and the
three products each nn.Linear(K -> N) runs on M tokens:

    forward         y = x @ W.t()     a = x [M, K] row-major, b = W.t() (W [N, K] row-major): k-major
    input gradient  dx = g @ W        a = g [M, N] row-major, b = W [N, K] row-major: n-major
    weight gradient dW = g.t() @ x    a = g.t() (g [M, N] row-major): m-major, b = x [M, K] row-major

Classes (SPEC §3): decode (forward and input gradient at M <= 16: memory-bound, timed in steady
state), mid (M = 128..1024), training (weight gradients: the reduction runs over the M tokens), large
(M >= 4096). The section that times them (issue 23) builds its rows from products().
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Linear:
    model: str
    name: str
    k: int  # in_features
    n: int  # out_features


def _llama(model, hidden, heads, kv_heads, intermediate):
    head_dim = hidden // heads
    return [Linear(model, "qkv_proj", hidden, hidden + 2 * kv_heads * head_dim),
            Linear(model, "o_proj", hidden, hidden),
            Linear(model, "gate_up_proj", hidden, 2 * intermediate),
            Linear(model, "down_proj", intermediate, hidden)]


# Published sizes: Llama-3-8B (hidden 4096, 32 heads, 8 KV heads, FFN 14336; q/k/v and gate/up fused
# as serving engines run them); GPT-2 124M (hidden 768, FFN 3072, fused c_attn); Falcon-7B's MLP
# (hidden 4544, FFN 18176: a wide FFN, 4x). gpt-1024: the GPT-style decoder whose training step the
# training-shape issue times (width 1024, FFN 4096, fused q/k/v), at its 8 x 1024 tokens only.
MODELS = {
    "llama-3-8b": _llama("llama-3-8b", 4096, 32, 8, 14336),
    "gpt-2": [Linear("gpt-2", "c_attn", 768, 2304), Linear("gpt-2", "attn.c_proj", 768, 768),
              Linear("gpt-2", "c_fc", 768, 3072), Linear("gpt-2", "mlp.c_proj", 3072, 768)],
    "falcon-7b-mlp": [Linear("falcon-7b-mlp", "dense_h_to_4h", 4544, 18176),
                      Linear("falcon-7b-mlp", "dense_4h_to_h", 18176, 4544)],
    "gpt-1024": [Linear("gpt-1024", "c_attn", 1024, 3072), Linear("gpt-1024", "attn.c_proj", 1024, 1024),
                 Linear("gpt-1024", "c_fc", 1024, 4096), Linear("gpt-1024", "mlp.c_proj", 4096, 1024)],
}
# Models measured at their own token counts only (a training step's batch), whatever the suite's.
MODEL_TOKENS = {"gpt-1024": (8192,)}

DECODE_M = (1, 2, 4, 8, 16)
MID_M = (128, 512, 1024)
LARGE_M = (4096, 16384)


@dataclass(frozen=True)
class Product:
    """One product c [m, n] = a [m, k] @ b [k, n] as an nn.Linear runs it."""
    linear: Linear
    kind: str   # "forward" | "input_grad" | "weight_grad"
    tokens: int  # M, the tokens in flight
    m: int
    n: int
    k: int
    a_major: str  # "k" (row-major a) or "m" (a transposed view)
    b_major: str  # "k" (a transposed view, W.t()) or "n" (row-major)

    @property
    def cls(self) -> str:
        if self.kind == "weight_grad":
            return "training"
        if self.tokens <= 16:
            return "decode"
        return "mid" if self.tokens <= 1024 else "large"

    @property
    def weight_elements(self) -> int:
        """Elements of W the product reads: decode rows report W's bytes over the copy rate."""
        return self.linear.n * self.linear.k

    def label(self) -> str:
        return (f"{self.linear.model} {self.linear.name} {self.kind} M={self.tokens}: "
                f"{self.m}x{self.n}x{self.k}")

    def operands(self, dtype: torch.dtype, device: str, generator: torch.Generator | None = None):
        """(a, b) with the strides the product has in a model: views of freshly drawn row-major tensors."""
        # Drawn where the generator lives (the device's default one when none is given): the largest
        # sets hold 10^8+ elements, seconds a set on the host.
        draw_on = generator.device if generator is not None else device

        def randn(*shape):
            return torch.randn(*shape, generator=generator, dtype=torch.float32, device=draw_on).to(
                dtype=dtype, device=device)
        L, t = self.linear, self.tokens
        if self.kind == "forward":
            return randn(t, L.k), randn(L.n, L.k).t()       # x, W.t()
        if self.kind == "input_grad":
            return randn(t, L.n), randn(L.n, L.k)           # g, W
        return randn(t, L.n).t(), randn(t, L.k)             # g.t(), x


def products(models=None, tokens=DECODE_M + MID_M + LARGE_M, kinds=("forward", "input_grad", "weight_grad"),
             scale: int = 1):
    """Every product of the chosen models' Linears at the chosen token counts. Weight gradients are
    listed for the training token counts only (M >= 128): at decode there is no backward. scale > 1
    divides every Linear's features by it (the cpu smoke run's tiny shapes, same structure)."""
    out = []
    for model in (models or MODELS):
        for L in MODELS[model]:
            if scale != 1:
                L = Linear(L.model, L.name, max(1, L.k // scale), max(1, L.n // scale))
            for t in MODEL_TOKENS.get(model, tokens):
                if "forward" in kinds:
                    out.append(Product(L, "forward", t, t, L.n, L.k, "k", "k"))
                if "input_grad" in kinds:
                    out.append(Product(L, "input_grad", t, t, L.k, L.n, "k", "n"))
                if "weight_grad" in kinds and t >= 128:
                    out.append(Product(L, "weight_grad", t, L.n, L.k, t, "m", "n"))
    return out
