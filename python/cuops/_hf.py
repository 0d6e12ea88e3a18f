"""cuops.patch: a built Hugging Face Llama-family model onto cuops' fused ops, in place (docs/patch.md).

What changes, module by module (the parameters, buffers and state_dict stay as they are):
- every RMSNorm (Qwen3's q_norm / k_norm too) runs cuops.rms_norm; a layer's input norm comes out in
  the half type the projections read under CUDA autocast (HF's float32 norm cast, without the cast's
  pass each way);
- a decoder layer adds the attention output to the residual stream inside its post-attention norm
  (cuops.add_rms_norm); the add after the MLP, which crosses to the next layer, stays, so a layer is
  still a unit that exports on its own. Where the MLP is patched and CUDA autocast is on, the norm
  comes out in autocast's dtype: its one reader, cuops.swiglu, would cast it to that first, and
  the values are HF's float32 norm cast, without the cast's pass each way.
- attention projects q, k and v in one GEMM in training (x's three gradients meet in its float32
  accumulator: the bf16 input norm gets no sum of rounded ones), three in eval; it rotates q and k
  with cuops.rotary (one pass, both heads' sets), under CUDA autocast in the half type attention reads
  (so a KV cache keeps keys in the values' dtype);
- the MLP is cuops.swiglu (gate and up in one op) and cuops.linear (down), where it is silu-gated
  without biases (other MLPs are left alone);
- the causal LM's training forward with labels returns the loss of cuops.linear_cross_entropy over
  the final hidden states, logits None (the [tokens, vocab] logits are never made), and gives
  attention sdpa's is_causal where the mask is the plain causal one (_plain_causal); eval, or no
  labels: logits as before.

Each patched module's class is swapped for a subclass of its own that overrides forward (isinstance
still holds, torch.compile and torch.export trace the override as the class's forward, FSDP2's own
subclassing composes with it); a patched module pickles as its transformers class and is patched
again on load. Imports transformers; cuops itself does not.
"""
from __future__ import annotations

import functools
import importlib
from typing import Callable, NamedTuple, Optional

import torch
from torch import nn

import cuops


class _Family(NamedTuple):
    prefix: str  # class name prefix: Llama, Mistral, Qwen2, Qwen3
    # The sliding window the family's attention hands to the attention interface (None: no argument).
    sliding_window: Optional[Callable[[nn.Module], Optional[int]]]
    qk_norm: bool  # q_norm / k_norm on each head before the rotation (Qwen3)


_FAMILIES = {
    "llama": _Family("Llama", None, False),
    "mistral": _Family("Mistral", lambda attn: getattr(attn.config, "sliding_window", None), False),
    "qwen2": _Family("Qwen2", lambda attn: attn.sliding_window, False),
    "qwen3": _Family("Qwen3", lambda attn: attn.sliding_window, True),
}

_SUBCLASSES: dict[tuple[type, Callable], type] = {}


def _swap_forward(module: nn.Module, forward: Callable, role: str) -> None:
    """module's class becomes a subclass of it whose forward is `forward` (one subclass a class, so
    every layer of a model, and every model, shares it); a module already patched is left as it is.
    role names the forward (_forward_for makes it again when a pickled module is loaded)."""
    cls = type(module)
    if getattr(cls, "_cuops_patched", False):
        return
    sub = _SUBCLASSES.get((cls, forward))
    if sub is None:
        sub = type(f"Cuops{cls.__name__}", (cls,), {"forward": forward, "_cuops_patched": True,
                                                    "_cuops_role": role, "__reduce_ex__": _reduce_patched,
                                                    "__module__": cls.__module__})
        _SUBCLASSES[(cls, forward)] = sub
    module.__class__ = sub


def _reduce_patched(self, protocol):
    """Pickles (and deep-copies) a patched module as its transformers class and its role, since the
    subclass is made at run time and no module holds it by name: loading patches it again, in a
    process that never called cuops.patch too. Another subclass on top (FSDP2's) keeps the default."""
    sub = next(c for c in type(self).__mro__ if "_cuops_role" in c.__dict__)
    reduced = object.__reduce_ex__(self, protocol)
    if type(self) is not sub or not isinstance(reduced, tuple):
        return reduced
    return (_load_patched, (sub.__bases__[0], sub._cuops_role)) + reduced[2:]


def _load_patched(cls: type, role: str) -> nn.Module:
    module = cls.__new__(cls)
    _swap_forward(module, _forward_for(cls, role), role)
    return module


def _forward_for(cls: type, role: str, family: Optional[_Family] = None, mod=None) -> Callable:
    """The patched forward of a module of class cls in role (patch() chooses the roles); attention's
    needs the family and its modeling module, found from cls's transformers base where not given."""
    if role == "rms_norm":
        return _rms_norm_forward
    if role == "decoder_layer":
        return _decoder_layer_forward
    if role == "mlp":
        return _mlp_forward
    if role == "causal_lm":
        return _causal_lm_forward(cls)
    if family is None:
        for c in cls.__mro__:
            name = c.__module__.rsplit(".", 1)[-1]
            if c.__module__.startswith("transformers.models.") and name.removeprefix("modeling_") in _FAMILIES:
                family, mod = _FAMILIES[name.removeprefix("modeling_")], importlib.import_module(c.__module__)
                break
        else:
            raise TypeError(f"cuops.patch: {cls.__qualname__} is no Llama-family attention of transformers")
    return _attention_forward(family, mod.eager_attention_forward)


def _autocast_dtype(x: torch.Tensor) -> Optional[torch.dtype]:
    """The dtype the GEMM or attention reading x casts it to: CUDA autocast's where it is on (cuops
    registers AutocastCUDA only: under CPU autocast swiglu runs as its inputs come), else None."""
    if x.device.type != "cuda" or x.dtype == torch.float64 or not torch.is_autocast_enabled("cuda"):
        return None
    return torch.get_autocast_dtype("cuda")


def _rms_norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    return cuops.rms_norm(hidden_states, self.weight, self.variance_epsilon)


def _mlp_forward(self, x: torch.Tensor) -> torch.Tensor:
    return cuops.linear(cuops.swiglu(x, self.gate_proj.weight, self.up_proj.weight), self.down_proj.weight)


def _decoder_layer_forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,
                           use_cache=False, position_embeddings=None, **kwargs):
    residual = hidden_states
    norm = self.input_layernorm
    # In the half type the projections read under CUDA autocast where one GEMM reads it (the fused
    # q/k/v projection: x's three gradients meet in its float32 accumulator) or no gradient comes back;
    # float32 where three projections' gradients do (HF sums their bf16 gradients in float32).
    attn = self.self_attn
    one_reader = not torch.is_grad_enabled() or (getattr(type(attn), "_cuops_patched", False) and _fuses_qkv(attn))
    hidden_states = cuops.rms_norm(hidden_states, norm.weight, norm.variance_epsilon,
                                   dtype=_autocast_dtype(hidden_states) if one_reader else None)
    hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask,
                                      position_ids=position_ids, past_key_values=past_key_values,
                                      use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
    post = self.post_attention_layernorm
    # (rms_norm(h + residual), h + residual) in one pass: the sum in promote(h, residual) as
    # `residual + hidden_states` makes it (float32 beside a half h under autocast).
    dtype = _autocast_dtype(hidden_states) if type(self.mlp).forward is _mlp_forward else None
    normed, summed = cuops.add_rms_norm(hidden_states, residual, post.weight, post.variance_epsilon, dtype=dtype)
    return summed + self.mlp(normed)


def _fuses_qkv(attn: nn.Module) -> bool:
    """Whether the patched attention projects q, k and v in one GEMM (_qkv): in training, where each
    projection is a plain nn.Linear that would run as one (no hooks, no forward set on the instance, no
    DTensor weight: tensor parallelism, per-Linear sharding, adapters and observers keep their
    modules), with biases on all three or none. Eval keeps three: decode reads every weight for a few
    tokens, and a concatenation would double what it reads."""
    if not attn.training or nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks:
        return False
    projs = (attn.q_proj, attn.k_proj, attn.v_proj)
    for p in projs:
        if (type(p) is not nn.Linear or "forward" in p.__dict__ or p._forward_hooks or p._forward_pre_hooks
                or p._backward_hooks or p._backward_pre_hooks or _is_dtensor(p.weight)):
            return False
    return len({p.bias is None for p in projs}) == 1


def _is_dtensor(t: torch.Tensor) -> bool:
    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor
    return isinstance(t, DTensor)


def _qkv(attn: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k and v projections of x: where _fuses_qkv, one GEMM of the three weights concatenated (a
    float32 concatenation and autocast's cast of 6M weights a layer eager, one fused pass under
    torch.compile): one wider product in place of three (two of them 512 wide), and x's gradient one
    product accumulating all three in float32 (HF sums three rounded ones). Else the three modules."""
    projs = (attn.q_proj, attn.k_proj, attn.v_proj)
    if not _fuses_qkv(attn):
        return tuple(p(x) for p in projs)
    bias = torch.cat([p.bias for p in projs]) if projs[0].bias is not None else None
    qkv = nn.functional.linear(x, torch.cat([p.weight for p in projs]), bias)
    return qkv.split([p.out_features for p in projs], dim=-1)


@functools.lru_cache(maxsize=None)  # one forward (so one subclass) a family
def _attention_forward(family: _Family, eager_attention: Callable) -> Callable:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None,
                **kwargs):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        q, k, v = _qkv(self, hidden_states)
        q, k = q.view(hidden_shape), k.view(hidden_shape)
        if family.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        v = v.view(hidden_shape).transpose(1, 2)
        if kwargs.pop("_cuops_plain_causal", False):
            attention_mask = None  # sdpa's is_causal instead of the mask (_plain_causal)
        cos, sin = position_embeddings
        # In the dtype attention casts q and k to under autocast (HF's float32 values cast, without
        # the cast's pass each way; the KV cache then holds keys in the values' dtype).
        q, k = cuops.rotary(q.transpose(1, 2), k.transpose(1, 2), cos, sin, dtype=_autocast_dtype(q))
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention)
        if family.sliding_window is not None:
            kwargs["sliding_window"] = family.sliding_window(self)
        out, weights = interface(self, q, k, v, attention_mask,
                                 dropout=0.0 if not self.training else self.attention_dropout,
                                 scaling=self.scaling, **kwargs)
        out = out.reshape(*input_shape, -1).contiguous()
        return self.o_proj(out), weights

    return forward


@functools.lru_cache(maxsize=None)
def _causal_lm_forward(base: type) -> Callable:
    from transformers.modeling_outputs import CausalLMOutputWithPast

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, **kwargs):
        shift_labels = kwargs.get("shift_labels")
        if not self.training or labels is None:  # transformers makes a loss only from labels
            return base.forward(self, input_ids=input_ids, attention_mask=attention_mask,
                                position_ids=position_ids, past_key_values=past_key_values,
                                inputs_embeds=inputs_embeds, labels=labels, use_cache=use_cache,
                                logits_to_keep=logits_to_keep, **kwargs)
        # transformers' ForCausalLMLoss without the logits: labels shifted left (the last position
        # ignored), a mean over the tokens not ignored, or a sum over num_items_in_batch.
        kwargs.pop("shift_labels", None)
        num_items = kwargs.pop("num_items_in_batch", None)
        ignore_index = kwargs.pop("ignore_index", -100)
        return_dict = kwargs.pop("return_dict", None)
        if return_dict is None:  # as transformers' can_return_tuple: the config decides
            return_dict = getattr(self.config, "return_dict", True)
        tokens = input_ids if input_ids is not None else inputs_embeds
        if tokens is not None and _plain_causal(self.config, attention_mask, position_ids, past_key_values,
                                                tokens.shape[1]):
            kwargs["_cuops_plain_causal"] = True  # read and removed by the patched attention
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache,
                             **kwargs)
        hidden = outputs.last_hidden_state
        if shift_labels is None:
            shift_labels = nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
        loss = cuops.linear_cross_entropy(hidden, self.lm_head.weight, shift_labels.to(hidden.device),
                                          self.lm_head.bias, ignore_index,
                                          "mean" if num_items is None else "sum")
        if num_items is not None:
            loss = loss / (num_items.to(loss.device) if torch.is_tensor(num_items) else num_items)
        out = CausalLMOutputWithPast(loss=loss, logits=None, past_key_values=outputs.past_key_values,
                                     hidden_states=outputs.hidden_states, attentions=outputs.attentions)
        return out if return_dict else out.to_tuple()

    return forward


def _plain_causal(config, attention_mask, position_ids, past_key_values, length: int) -> bool:
    """Whether every layer's mask is the plain causal one: no padding mask, positions from 0 (no packed
    sequences), no cached tokens, no sliding window shorter than the sequence, sdpa attention. Eager,
    transformers then hands sdpa no mask (its is_causal); under torch.compile it materialises the mask
    (it never skips one while tracing, so an exported graph does not hard-code it), and cuDNN's
    attention backward with a mask took 2.6x as long on the bench's model (5.3 against 2.0 ms a step).
    The patched training forward, which is not exported, passes is_causal where this holds."""
    window = getattr(config, "sliding_window", None)
    return (config._attn_implementation == "sdpa" and attention_mask is None and position_ids is None
            and (past_key_values is None or past_key_values.get_seq_length() == 0)
            and (window is None or length <= window))


def _family_of(model: nn.Module):
    """(family, its transformers modeling module), or TypeError naming what is supported."""
    supported = ", ".join(f"{f.prefix}ForCausalLM / {f.prefix}Model" for f in _FAMILIES.values())
    config = getattr(model, "config", None)
    family = _FAMILIES.get(getattr(config, "model_type", None))
    if family is not None:
        mod = importlib.import_module(f"transformers.models.{config.model_type}.modeling_{config.model_type}")
        known = (getattr(mod, f"{family.prefix}ForCausalLM"), getattr(mod, f"{family.prefix}Model"))
        if isinstance(model, known):
            return family, mod
    raise TypeError(f"cuops.patch: expected a Hugging Face model of the Llama family ({supported}), "
                    f"got {type(model).__module__}.{type(model).__qualname__}")


def patch(model: nn.Module) -> nn.Module:
    family, mod = _family_of(model)
    cls = lambda name: getattr(mod, f"{family.prefix}{name}")  # noqa: E731
    roles = [(cls("RMSNorm"), "rms_norm"), (cls("DecoderLayer"), "decoder_layer"), (cls("Attention"), "attention")]
    for module in model.modules():
        for kind, role in roles:
            if isinstance(module, kind):
                _swap_forward(module, _forward_for(type(module), role, family, mod), role)
        if isinstance(module, cls("MLP")) and _is_plain_swiglu(module):
            _swap_forward(module, _mlp_forward, "mlp")
    if isinstance(model, cls("ForCausalLM")):
        _swap_forward(model, _causal_lm_forward(type(model)), "causal_lm")
    return model


def _is_plain_swiglu(mlp: nn.Module) -> bool:
    """down(silu(gate(x)) * up(x)): the config's activation silu and no projection biases."""
    return mlp.config.hidden_act in ("silu", "swish") and all(
        getattr(mlp, p).bias is None for p in ("gate_proj", "up_proj", "down_proj"))
