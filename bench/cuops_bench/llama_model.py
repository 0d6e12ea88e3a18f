"""A Llama-style decoder written for the bench (SPEC §3, "End to end"): RMSNorm, rotary embeddings,
grouped-query attention through F.scaled_dot_product_attention, a SwiGLU MLP, and a KV cache of fixed
length so that the decode step has static shapes and can be captured in a CUDA graph.

q/k/v and gate/up are fused into one Linear each, as serving engines run them, so the products are
the rows of the shape suite (shapes.py: qkv_proj, o_proj, gate_up_proj, down_proj; plus lm_head).
`cuops_twin(model)` is the same model with its MLPs on cuops.swiglu and every other nn.Linear replaced by a
CuopsLinear that holds the
very same weight tensor: the two models share every parameter and buffer, and differ only in which
GEMM runs.
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class LlamaConfig:
    layers: int = 8
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    ffn: int = 14336
    vocab: int = 32000
    rope_theta: float = 500000.0
    eps: float = 1e-5
    # Weights drawn N(0, init_std^2): the final RMSNorm makes the last hidden state unit-RMS, so logits
    # come out with a standard deviation of ~0.02 * sqrt(4096) = 1.3, not flat: over 32000 such logits
    # the top-1 margin has a median of ~0.2 (simulated), against bf16's spacing of 0.03 at the top
    # logits (~5). A few percent of positions are still near-ties; sections/llama.py reports them.
    init_std: float = 0.02
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def weight_count(self) -> int:
        hd, h = self.head_dim, self.hidden
        per_layer = h * (self.heads + 2 * self.kv_heads) * hd + self.heads * hd * h + h * 2 * self.ffn + self.ffn * h
        return self.layers * (per_layer + 2 * h) + 2 * self.vocab * h + h

    def as_dict(self) -> dict:
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def apply_rope(x, cos, sin):
    """x [B, H, T, hd]; cos, sin [T, hd / 2] (float32). Rotates the two halves of each head (the
    "rotate half" layout), in float32."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig, device=None, dtype=None):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.kv_heads, cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden, (cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim, bias=False,
                                  device=device, dtype=dtype)
        self.o_proj = nn.Linear(cfg.heads * cfg.head_dim, cfg.hidden, bias=False, device=device, dtype=dtype)

    def forward(self, x, cos, sin, cache_k, cache_v, pos, decode_mask):
        """x [B, T, hidden]; pos [T]: the positions of x's tokens (a device tensor); the cache
        [B, kv_heads, S, hd] gets k and v at those positions. decode_mask None: prefill (x is the whole
        sequence from position 0, causal attention over itself); else T == 1 and decode_mask [1, 1, 1, S] marks
        the cache positions up to pos."""
        B, T, _ = x.shape
        H, KV, hd = self.heads, self.kv_heads, self.head_dim
        q, k, v = self.qkv_proj(x).split((H * hd, KV * hd, KV * hd), dim=-1)
        q = apply_rope(q.view(B, T, H, hd).transpose(1, 2), cos, sin)
        k = apply_rope(k.view(B, T, KV, hd).transpose(1, 2), cos, sin)
        v = v.view(B, T, KV, hd).transpose(1, 2)
        # index_copy_ with a device index: the write position never goes through the host.
        cache_k.index_copy_(2, pos, k)
        cache_v.index_copy_(2, pos, v)
        group = H // KV
        if decode_mask is None:
            # Query head h reads KV head h // group. Expanded here rather than through enable_gqa so any
            # SDPA backend qualifies; at prefill the copy is small against the GEMMs.
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            # One token per sequence: the group's query heads become `group` query rows of their KV
            # head, so the cache is read once per KV head with no expanded copy.
            qg = q.reshape(B, KV, group, hd)
            out = F.scaled_dot_product_attention(qg, cache_k, cache_v, attn_mask=decode_mask)
            out = out.reshape(B, H, 1, hd)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, H * hd))


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig, device=None, dtype=None):
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden, 2 * cfg.ffn, bias=False, device=device, dtype=dtype)
        self.down_proj = nn.Linear(cfg.ffn, cfg.hidden, bias=False, device=device, dtype=dtype)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig, device=None, dtype=None):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden, cfg.eps, device, dtype)
        self.attn = Attention(cfg, device, dtype)
        self.mlp_norm = RMSNorm(cfg.hidden, cfg.eps, device, dtype)
        self.mlp = MLP(cfg, device, dtype)

    def forward(self, x, cos, sin, cache_k, cache_v, pos, decode_mask):
        x = x + self.attn(self.attn_norm(x), cos, sin, cache_k, cache_v, pos, decode_mask)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig, max_positions: int, device=None, dtype=torch.bfloat16):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden, device=device, dtype=dtype)
        self.layers = nn.ModuleList(Block(cfg, device, dtype) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.eps, device, dtype)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False, device=device, dtype=dtype)
        inv_freq = cfg.rope_theta ** (-torch.arange(0, cfg.head_dim, 2, device=device, dtype=torch.float32)
                                      / cfg.head_dim)
        angles = torch.outer(torch.arange(max_positions, device=device, dtype=torch.float32), inv_freq)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        self.requires_grad_(False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Seeded draws on the weights' device (the host would take a minute for 1.7 G weights)."""
        device = self.embed.weight.device
        generator = torch.Generator(device=device).manual_seed(self.cfg.seed)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.normal_(0.0, self.cfg.init_std, generator=generator)
            elif isinstance(module, RMSNorm):
                module.weight.fill_(1.0)

    def new_cache(self, batch: int, length: int) -> list:
        """[(k, v)] per layer, each [batch, kv_heads, length, head_dim], zeroed."""
        cfg, w = self.cfg, self.embed.weight
        shape = (batch, cfg.kv_heads, length, cfg.head_dim)
        return [(torch.zeros(shape, device=w.device, dtype=w.dtype), torch.zeros(shape, device=w.device, dtype=w.dtype))
                for _ in range(cfg.layers)]

    def prefill(self, tokens, cache):
        """tokens [B, T] from position 0; fills cache[:, :, :T]; returns the last position's logits [B, vocab]
        (the only ones greedy decoding reads, as serving engines compute them)."""
        T = tokens.shape[1]
        pos = torch.arange(T, device=tokens.device)
        x = self.embed(tokens)
        cos, sin = self.cos[:T], self.sin[:T]
        for layer, (k, v) in zip(self.layers, cache):
            x = layer(x, cos, sin, k, v, pos, None)
        return self.lm_head(self.norm(x[:, -1:]))[:, 0]

    def decode(self, tokens, pos, cache):
        """One token per sequence: tokens [B] at position pos ([1], a device tensor: no host sync, so the
        step can be captured and replayed while pos moves on); returns logits [B, vocab]."""
        x = self.embed(tokens[:, None])
        cos, sin = self.cos.index_select(0, pos), self.sin.index_select(0, pos)
        length = cache[0][0].shape[2]
        mask = (torch.arange(length, device=tokens.device) <= pos).view(1, 1, 1, length)  # the cache up to here
        for layer, (k, v) in zip(self.layers, cache):
            x = layer(x, cos, sin, k, v, pos, mask)
        return self.lm_head(self.norm(x))[:, 0]


class CuopsLinear(nn.Module):
    """nn.Linear's forward through torch.ops.cuops.mm, on the same weight tensor object as the
    nn.Linear it replaces (not a copy: both models read one weight, and memory holds one)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        if linear.bias is not None:
            raise ValueError("CuopsLinear: the bench's Linears have no bias")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight

    def forward(self, x):
        y = torch.ops.cuops.mm(x.reshape(-1, self.in_features), self.weight.t())
        return y.view(*x.shape[:-1], self.out_features)


class SwigluMlp(nn.Module):
    """MLP's forward as one torch.ops.cuops.swiglu (the dual GEMM; its gate and up weights are the row
    halves of gate_up_proj's weight, read in place) and a CuopsLinear down projection."""

    def __init__(self, mlp: MLP):
        super().__init__()
        self.weight = mlp.gate_up_proj.weight
        self.ffn = mlp.gate_up_proj.out_features // 2
        self.down_proj = CuopsLinear(mlp.down_proj)

    def forward(self, x):
        w = self.weight
        return self.down_proj(torch.ops.cuops.swiglu(x, w[:self.ffn], w[self.ffn:]))


# The modules a cuops twin replaces whole: module class -> its twin's class (a fused op where torch runs
# several). Sections add their models' MLPs (gpt_train's GeluMlp).
FUSED_TWINS: dict = {MLP: SwigluMlp}


def cuops_twin(module: nn.Module) -> nn.Module:
    """The module tree again, every nn.Linear replaced by a CuopsLinear and every module of FUSED_TWINS by
    its fused twin; every other parameter and buffer is the same tensor object as in `module` (shallow
    copies of the containers only)."""
    if isinstance(module, nn.Linear):
        return CuopsLinear(module)
    if type(module) in FUSED_TWINS:
        return FUSED_TWINS[type(module)](module)
    twin = copy.copy(module)
    twin._parameters = dict(module._parameters)
    twin._buffers = dict(module._buffers)
    twin._modules = {name: None if child is None else cuops_twin(child) for name, child in module._modules.items()}
    return twin


class GreedyDecoder:
    """Static state for greedy decoding of one model at one batch size: the KV cache, the current
    tokens and position as device tensors, and the tokens generated so far. step() advances by one
    token with no host synchronisation, so it can be captured once and replayed: each replay reads
    `tokens` and `pos`, writes the cache at pos, and leaves the argmax and pos + 1 for the next."""

    def __init__(self, model: Llama, batch: int, prompt_len: int, steps: int):
        self.model, self.prompt_len, self.steps = model, prompt_len, steps
        device = model.embed.weight.device
        self.cache = model.new_cache(batch, prompt_len + steps)
        self.tokens = torch.zeros(batch, dtype=torch.long, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.history = torch.zeros(batch, prompt_len + steps + 1, dtype=torch.long, device=device)
        self.first = None  # the prompt's greedy token, where every replayed decode restarts

    def start(self, prompt):
        """Prefills the prompt [B, prompt_len]; returns its last logits."""
        logits = self.model.prefill(prompt, self.cache)
        self.first = logits.argmax(-1)
        self.history[:, :self.prompt_len] = prompt
        self.restart()
        return logits

    def restart(self) -> None:
        """Back to the first generated token; the cache past the prompt is overwritten as decoding goes."""
        self.tokens.copy_(self.first)
        self.pos.fill_(self.prompt_len)
        self.history[:, self.prompt_len] = self.first

    def step(self):
        logits = self.model.decode(self.tokens, self.pos, self.cache)
        nxt = logits.argmax(-1)
        self.tokens.copy_(nxt)
        self.pos.add_(1)
        self.history.index_copy_(1, self.pos, nxt[:, None])
        return logits

    def generated(self):
        """[B, steps + 1]: the prompt's greedy token and the steps' tokens."""
        return self.history[:, self.prompt_len:]
