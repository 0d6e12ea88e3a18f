"""cuops.patch: a built Hugging Face Llama-family model (dense: Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma,
Gemma 3, OLMo2, Granite; or a mixture of experts: Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE) onto cuops' fused
ops, in place (docs/patch.md).

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
  (SwiGLU) or gelu_tanh-gated (Gemma's GeGLU) without biases (other MLPs are left alone);
- a mixture of experts' experts module is cuops.moe_experts (its 3-D weights read in place); the
  block around it (router, shared expert, Mixtral's jitter) stays the family's own code, so the
  router's output recorders (output_router_logits) and hooks see what they see unpatched;
- the causal LM's training forward with labels returns the loss of cuops.linear_cross_entropy over
  the final hidden states (the [tokens, vocab] logits are never made: LOGITS_NOT_MADE stands in their
  place and raises, naming fused_loss=False, on any use), and gives
  attention sdpa's is_causal where the mask is the plain causal one (_plain_causal); eval, or no
  labels: logits as before.

Every patched path obeys one rule (_plain, docs/patch.md "The rule"), decided at each call: a fused
op stands in for a module only where the module would compute exactly what the op does -- a plain
nn.Linear or a patched module, nothing run around it (hooks, a forward set on the instance), its
parameters plain tensors; anything else (a PEFT adapter the ops do not take, a quantized or sharded
weight, a user's subclass) runs as its own module. HF's contracts are delegated, not copied: the fused
loss only where the model's loss_function is transformers' causal-LM loss and the LM head is plain.

Each patched module's class is swapped for a subclass of its own, under the transformers class's
name (tools read names: config.architectures, _no_split_modules), that overrides forward (isinstance
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
    prefix: str  # class name prefix: Llama, Mistral, Qwen2, Qwen3, Qwen3Moe, ...
    # The sliding window the family's attention hands to the attention interface (None: no argument).
    sliding_window: Optional[Callable[[nn.Module], Optional[int]]]
    qk_norm: bool  # q_norm / k_norm on each head before the rotation (Qwen3)
    # Whether its attention is Llama's (plus the fields here); OLMoE's normalises the whole q and k
    # projections and clamps them (clip_qkv): it runs as its module.
    llama_attention: bool = True
    # Its RMSNorm (_NORM_FORWARDS): "llama" weight * normed.to(x's dtype); "cast" (weight * normed).to(x's
    # dtype) (OLMo2); "gemma" (normed * (1 + weight)) in float32, to x's dtype.
    norm: str = "llama"
    layer: bool = True  # a Llama decoder layer (pre-norm); OLMo2's normalises after the sublayers
    qk_norm_whole: bool = False  # q_norm / k_norm over the whole q and k projections (OLMo2)
    module: Optional[str] = None  # its modeling module's model where it is not the model_type (gemma3)
    base_model: str = "Model"  # the base model's class suffix (Gemma 3's text model: TextModel)
    attn_softcap: bool = False  # its attention hands attn_logit_softcapping to the interface (Gemma 2)


_FAMILIES = {
    "llama": _Family("Llama", None, False),
    "mistral": _Family("Mistral", lambda attn: getattr(attn.config, "sliding_window", None), False),
    "qwen2": _Family("Qwen2", lambda attn: attn.sliding_window, False),
    "qwen3": _Family("Qwen3", lambda attn: attn.sliding_window, True),
    # Phi-3: q/k/v and gate/up each one stored projection (qkv_proj, gate_up_proj: _PACKED), dropout on
    # the residual branches (resid_pdrop: a layer with it live runs as its module).
    "phi3": _Family("Phi3", lambda attn: getattr(attn.config, "sliding_window", None), False),
    # Gemma: its norms' (1 + weight) order; its GeGLU MLP on swiglu's gelu_tanh gate.
    "gemma": _Family("Gemma", None, False, norm="gemma"),
    # OLMo2: norms after attention and the MLP (its decoder layer runs as its own, the norms patched).
    "olmo2": _Family("Olmo2", None, False, norm="cast", layer=False, qk_norm_whole=True),
    # Granite: Llama's layers with multipliers: the residual branches' (residual_multiplier, in the
    # patched layer), attention's scale (its own self.scaling), the embeddings' (its model's forward)
    # and the logits' divisor (logits_scaling, in the fused loss).
    "granite": _Family("Granite", None, False),
    # Gemma 2: Gemma's norms, the sandwich-normed layer as its own around the patched parts, its
    # attention's logit softcap handed on as its attention does; the final logits' softcap in the fused
    # loss (linear_cross_entropy's softcap).
    "gemma2": _Family("Gemma2", lambda attn: attn.sliding_window, False, norm="gemma", layer=False,
                      attn_softcap=True),
    # Gemma 3 (text): Gemma's norms (its q / k norms per head too), sliding windows by layer, the
    # sandwich-normed decoder layer as its own around the patched parts (the GeGLU MLP patched).
    "gemma3_text": _Family("Gemma3", lambda attn: attn.sliding_window, True, norm="gemma", layer=False,
                           module="gemma3", base_model="TextModel"),
    # Mixtures of experts: the dense families' layers with an experts module in the MLP's place.
    "mixtral": _Family("Mixtral", lambda attn: getattr(attn.config, "sliding_window", None), False),
    "qwen2_moe": _Family("Qwen2Moe", None, False),  # its attention's mask carries the window
    "qwen3_moe": _Family("Qwen3Moe", lambda attn: attn.sliding_window, True),
    "olmoe": _Family("Olmoe", None, False, llama_attention=False),
}
_BY_MODULE = {(f.module or key): f for key, f in _FAMILIES.items()}  # by modeling module: modeling_<key>

_SUBCLASSES: dict[tuple[type, Callable], type] = {}


def _swap_forward(module: nn.Module, forward: Callable, role: str) -> None:
    """module's class becomes a subclass of it whose forward is `forward` (one subclass a class, so
    every layer of a model, and every model, shares it); a module already patched is left as it is.
    The subclass keeps the class's name and module (save_pretrained writes type(model).__name__ into
    config.architectures; accelerate's FSDP wrap and _no_split_modules match layers by name); role
    names the forward (_plain checks it; _forward_for makes it again when a pickled module loads)."""
    cls = type(module)
    if getattr(cls, "_cuops_patched", False):
        return
    sub = _SUBCLASSES.get((cls, forward))
    if sub is None:
        sub = type(cls.__name__, (cls,), {"forward": forward, "_cuops_patched": True, "_cuops_role": role,
                                          "_cuops_base": cls, "__reduce_ex__": _reduce_patched,
                                          "__module__": cls.__module__, "__qualname__": cls.__qualname__})
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
    return (_load_patched, (sub._cuops_base, sub._cuops_role)) + reduced[2:]


def _load_patched(cls: type, role: str) -> nn.Module:
    module = cls.__new__(cls)
    _swap_forward(module, _forward_for(cls, role), role)
    return module


def _forward_for(cls: type, role: str, family: Optional[_Family] = None, mod=None) -> Callable:
    """The patched forward of a module of class cls in role (patch() chooses the roles); attention's and
    the norm's need the family (and its modeling module), found from cls's transformers base where not
    given."""
    if role == "decoder_layer":
        return _decoder_layer_forward
    if role == "mlp":
        return _mlp_forward
    if role == "experts":
        return _experts_forward
    if role == "causal_lm":
        return _causal_lm_forward(cls)
    if family is None:
        for c in cls.__mro__:
            name = c.__module__.rsplit(".", 1)[-1]
            if c.__module__.startswith("transformers.models.") and name.removeprefix("modeling_") in _BY_MODULE:
                family, mod = _BY_MODULE[name.removeprefix("modeling_")], importlib.import_module(c.__module__)
                break
        else:
            raise TypeError(f"cuops.patch: {cls.__qualname__} is no Llama-family module of transformers")
    if role == "rms_norm":
        return _NORM_FORWARDS[family.norm]
    return _attention_forward(family, mod.eager_attention_forward)


# --- The rule: where a fused op may stand in for a module --------------------------------------------

class _Lora(NamedTuple):
    """A PEFT LoRA layer the LoRA ops compute exactly: its base nn.Linear, its one active adapter's A
    [r, K] and B [N, r] weights, scale, dropout (None: the identity) and the dtype PEFT casts x to
    before the dropout (A's; None where the layer's cast_input_dtype_enabled is off)."""
    base: nn.Module
    a: torch.Tensor
    b: torch.Tensor
    scale: float
    dropout: Optional[nn.Module]
    cast: Optional[torch.dtype]


def _plain(module: nn.Module, kind, adapters: bool = False) -> "nn.Module | _Lora | str":
    """The one rule every patched path asks, at each call (PEFT may wrap modules after cuops.patch): the
    module whose parameters a fused op may read in `module`'s place, or why none may (for the report).

    kind is nn.Linear (module must run nn.Linear's own forward) or a patch role ("rms_norm",
    "attention", "mlp": module must be a patched module of that role). Either way nothing may run
    around it -- no hooks on it, no global module hooks, no forward set on the instance -- and its
    parameters must be plain tensors (not DTensor, not a quantized or other tensor subclass). A PEFT
    LoRA layer stands for its base nn.Linear where PEFT's forward is the base's alone (adapters merged
    into the weight, or disabled and not merged); with a live adapter it runs as PEFT's module.
    Attribute reads only: cheap every call, and what torch.compile guards on anyway.

    A live adapter is a _Lora where the path takes adapters (`adapters`: the MLP's and q/k/v's LoRA
    ops) and PEFT's forward is what the ops compute (_lora), else why not."""
    cls = type(module)
    if kind is nn.Linear:
        if cls.__module__ == "peft.tuners.lora.layer" and cls.__name__ == "Linear":
            why = _around(module)
            if why is not None:
                return why
            if module.merged != module.disable_adapters:  # PEFT's forward is the base's alone
                return _plain(module.base_layer, nn.Linear)
            if module.merged:  # both: PEFT unmerges first
                return "a PEFT LoRA layer both merged and disabled"
            return _lora(module) if adapters else "a PEFT LoRA adapter (this path takes none)"
        if cls.forward is not nn.Linear.forward:
            return f"a {cls.__module__}.{cls.__qualname__}, not an nn.Linear"
    elif getattr(cls, "_cuops_role", None) != kind:
        return f"a {cls.__module__}.{cls.__qualname__}, not the patched {kind}"
    why = _around(module)
    return module if why is None else why


def _lora(layer: nn.Module) -> "_Lora | str":
    """The live adapter of a PEFT lora.Linear (nothing around it: _plain) as the LoRA ops take it, or why
    not: PEFT's forward must be result = base(x) + lora_B(lora_A(dropout(x))) * scaling for one active
    adapter -- no other variant (DoRA, ...), no lora_B bias, plain A, B, base and dropout modules."""
    active = [name for name in layer.active_adapters if name in layer.lora_A]
    if len(active) != 1:
        return f"{len(active)} active PEFT adapters"
    name = active[0]
    variant = getattr(layer, "lora_variant", {}).get(name)
    if variant is not None or getattr(layer, "use_dora", {}).get(name):
        return f"a PEFT LoRA variant ({type(variant).__name__ if variant is not None else 'DoRA'})"
    if getattr(layer, "fan_in_fan_out", False):
        return "a PEFT LoRA layer with fan_in_fan_out"
    base, a, b = _plain(layer.base_layer, nn.Linear), _plain(layer.lora_A[name], nn.Linear), \
        _plain(layer.lora_B[name], nn.Linear)
    for part, what in ((base, "its base"), (a, "lora_A"), (b, "lora_B")):
        if isinstance(part, str):
            return f"{what}: {part}"
    if a.bias is not None or b.bias is not None:
        return "a PEFT LoRA adapter with a bias (lora_bias)"
    drop = layer.lora_dropout[name]
    if type(drop) not in (nn.Identity, nn.Dropout) or _around(drop) is not None:
        return f"its adapter's dropout is a {type(drop).__qualname__} or has hooks"
    if type(drop) is nn.Identity or drop.p == 0 or not drop.training:
        drop = None
    cast = a.weight.dtype if getattr(layer, "cast_input_dtype_enabled", True) else None
    return _Lora(base, a.weight, b.weight, layer.scaling[name], drop, cast)


def _around(module: nn.Module) -> Optional[str]:
    """What runs around module's forward or stands in its parameters, or None (_plain)."""
    if "forward" in module.__dict__:
        return "a forward set on the instance"
    if module._forward_hooks or module._forward_pre_hooks or module._backward_hooks or module._backward_pre_hooks:
        return "hooks on the module"
    hooks = nn.modules.module
    if (hooks._global_forward_hooks or hooks._global_forward_pre_hooks or hooks._global_backward_hooks
            or hooks._global_backward_pre_hooks):
        return "global module hooks"
    for name, p in module._parameters.items():
        if p is not None and type(p) not in _PLAIN_TENSORS:
            return f"its {name} is a {type(p).__qualname__}"
    return None


# Parameter types a fused op reads as they are: plain ones, and what tracing stands in for them
# (torch.export's default non-strict trace swaps in FakeTensors, make_fx functional ones); a DTensor or
# quantized subclass keeps its own type under tracing, so it is still refused.
_PLAIN_TENSORS = (nn.Parameter, torch.Tensor, torch._subclasses.fake_tensor.FakeTensor,
                  torch._subclasses.functional_tensor.FunctionalTensor)


def _linears(parent: nn.Module, names: tuple[str, ...], adapters: bool = False) -> Optional[list]:
    """The plain nn.Linear (_plain) behind each of parent's children `names` -- or, with `adapters`, a
    _Lora -- or None if any has neither."""
    out = []
    for n in names:
        lin = _plain(getattr(parent, n), nn.Linear, adapters)
        if isinstance(lin, str):
            return None
        out.append(lin)
    return out


def _weight_of(lin) -> torch.Tensor:
    return (lin.base if isinstance(lin, _Lora) else lin).weight


def _bias_of(lin) -> Optional[torch.Tensor]:
    return (lin.base if isinstance(lin, _Lora) else lin).bias


def _one_dtype(x: torch.Tensor, lins: list) -> bool:
    """Whether the LoRA ops take x with these projections as PEFT computes them: under CUDA autocast
    (every tensor cast to its dtype, as PEFT's F.linear calls are), or all of one dtype. PEFT keeps a
    bf16 base's adapters in float32 (autocast_adapter_dtype) and adds their float32 term to the bf16
    base output; such a model runs as PEFT's modules."""
    if _autocast_dtype(x) is not None:
        return True
    return all(t is None or t.dtype == x.dtype for lin in lins for t in (
        (lin.base.weight, lin.base.bias, lin.a, lin.b) if isinstance(lin, _Lora) else (lin.weight, lin.bias)))


def _adapter_args(x: torch.Tensor, lins: list) -> Optional[tuple]:
    """(lora_a, [each projection's lora_b], lora_x) for the LoRA ops over projections sharing x (each
    a plain Linear or a _Lora), or None where none has an adapter: the adapters' A stacked, each
    projection's scaled B in its own columns of R (zeros elsewhere), and lora_x None -- unless an
    adapter's dropout is live: then each adapter's own dropped x side by side (drawn in the order PEFT
    calls the modules, so the masks are PEFT's) and A block-diagonal over them."""
    loras = [lin for lin in lins if isinstance(lin, _Lora)]
    if not loras:
        return None
    ranks = [lin.a.shape[0] if isinstance(lin, _Lora) else 0 for lin in lins]
    total, start, bs = sum(ranks), 0, []
    for lin, r in zip(lins, ranks):
        if r:
            b = lin.b if lin.scale == 1 else lin.b * lin.scale
            bs.append(nn.functional.pad(b, (start, total - start - r)) if r != total else b)
        else:
            bs.append(_weight_of(lin).new_zeros(_weight_of(lin).shape[0], total))
        start += r
    if all(lin.dropout is None for lin in loras):
        a = loras[0].a if len(loras) == 1 else torch.cat([lin.a for lin in loras])
        return a, bs, None
    # Each dropped input drawn over x in the dtype the op reads it in. Outside autocast that is A's, as
    # PEFT casts x to (the same masks). Under CUDA autocast PEFT draws over x cast to float32 adapters'
    # dtype and the GEMM casts the product back; drawing in autocast's dtype gives the same distribution
    # (other draws: torch's dropout kernel maps its random numbers by dtype) with no cast, at half the
    # traffic of the draw, the concatenation and their backward: dropout 0.05's cost in hf_lora's
    # llama step fell from 19 ms to 7 (docs/performance.md).
    dtype = _autocast_dtype(x)
    x = x if dtype is None else x.to(dtype)
    lora_x = torch.cat([x if lin.dropout is None else lin.dropout(x if dtype is not None or lin.cast is None
                                                                  else x.to(lin.cast)) for lin in loras], -1)
    return torch.block_diag(*[lin.a for lin in loras]), bs, lora_x


def _autocast_dtype(x: torch.Tensor) -> Optional[torch.dtype]:
    """The dtype the GEMM or attention reading x casts it to: CUDA autocast's where it is on (cuops
    registers AutocastCUDA only: under CPU autocast swiglu runs as its inputs come), else None."""
    if x.device.type != "cuda" or x.dtype == torch.float64 or not torch.is_autocast_enabled("cuda"):
        return None
    return torch.get_autocast_dtype("cuda")


_MLP = ("gate_proj", "up_proj", "down_proj")
_QKV = ("q_proj", "k_proj", "v_proj")
# Phi-3's stored concatenations: qkv_proj [q; k; v] and gate_up_proj [gate; up], each one nn.Linear.
_PACKED_QKV, _PACKED_MLP = ("qkv_proj",), ("gate_up_proj", "down_proj")


def _packed(module: nn.Module, names: tuple[str, ...]) -> bool:
    # The children's dict, not hasattr: a name a module lacks costs nn.Module.__getattr__ an exception,
    # on every layer of every decode step.
    return all(n in module._modules for n in names)


def _rms_norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    return cuops.rms_norm(hidden_states, self.weight, self.variance_epsilon)


def _rms_norm_cast_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    return cuops.rms_norm(hidden_states, self.weight, self.variance_epsilon, dtype=hidden_states.dtype)


def _gemma_rms_norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    return cuops.rms_norm(hidden_states, 1.0 + self.weight.float(), self.eps, dtype=hidden_states.dtype)


# cuops.rms_norm's math is float32 rounded once to the result's dtype, so each family's order of the
# weight and the cast is its weight operand and the result's dtype (_Family.norm).
_NORM_FORWARDS = {"llama": _rms_norm_forward, "cast": _rms_norm_cast_forward, "gemma": _gemma_rms_norm_forward}


def _norm_operands(norm: nn.Module) -> tuple[torch.Tensor, float, bool]:
    """(the weight the norm ops multiply by, eps, whether the result keeps the input's dtype) of a
    patched norm (its family's forward)."""
    forward = type(norm).forward
    if forward is _gemma_rms_norm_forward:
        return 1.0 + norm.weight.float(), norm.eps, True
    return norm.weight, norm.variance_epsilon, forward is _rms_norm_cast_forward


def _mlp_linears(mlp: nn.Module) -> Optional[list]:
    """gate, up and down as the patched MLP computes them (plain nn.Linears without biases: swiglu +
    linear; in training, live adapters too: the LoRA ops), or None: then it runs HF's forward. Live
    adapters on the LoRA ops in training only: they concatenate [W | B] each call, which a decode step
    (reading each weight once for a few tokens) would pay twice over. Phi-3's gate_up_proj and
    down_proj likewise (two, where the others are three)."""
    names = _PACKED_MLP if _packed(mlp, _PACKED_MLP) else _MLP
    lins = _linears(mlp, names, adapters=mlp.training)
    return lins if lins is not None and all(_bias_of(lin) is None for lin in lins) else None


def _mlp_forward(self, x: torch.Tensor) -> torch.Tensor:
    lins = _mlp_linears(self)
    if lins is None or not _one_dtype(x, lins):
        return self._cuops_base.forward(self, x)
    if len(lins) == 2:  # Phi-3: up * act(gate) of gate_up_proj's halves, the gate's rows first (chunk's
        # backward joins the halves' gradients in one pass); an adapter's B splits the same way
        gate_up, down = lins
        w_gate, w_up = _weight_of(gate_up).chunk(2)
        adapted = _adapter_args(x, [gate_up])
        if adapted is not None:
            a, (b,), lora_x = adapted
            adapted = a, b.chunk(2), lora_x
    else:
        gate, up, down = lins
        w_gate, w_up = _weight_of(gate), _weight_of(up)
        adapted = _adapter_args(x, [gate, up])
    gate = _gate(self)
    if adapted is None:
        h = cuops.swiglu(x, w_gate, w_up, gate)
    else:
        a, (b_gate, b_up), lora_x = adapted
        h = cuops.lora_swiglu(x, w_gate, w_up, a, b_gate, b_up, lora_x, gate)
    adapted = _adapter_args(h, [down])
    if adapted is None:
        return cuops.linear(h, down.weight)
    a, (b,), lora_x = adapted
    return cuops.lora_linear(h, _weight_of(down), a, b, None, "none", lora_x)


# The experts implementations that compute what moe_experts does (transformers' own three); one
# registered by a user through ExpertsInterface may compute anything, so it runs.
_HF_EXPERTS = ("eager", "grouped_mm", "batched_mm")
_GATES = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


def _experts_why_not(experts: nn.Module) -> Optional[str]:
    """Why an experts module (transformers' 3-D gate_up_proj [E, 2I, H] and down_proj [E, H, I]) runs
    as its module, or None where cuops.moe_experts computes exactly what it does (_plain: nothing around
    it, plain parameters; gate and up concatenated, not transposed, no biases, the default gating of
    act(gate) * up with silu or gelu_tanh, one of transformers' implementations)."""
    plain = _plain(experts, "experts")
    if isinstance(plain, str):
        return plain
    if not (experts.has_gate and experts.is_concatenated) or experts.is_transposed or experts.has_bias:
        return "an experts layout moe_experts does not read (interleaved, transposed, biased or ungated)"
    from transformers.integrations.moe import _default_apply_gate
    if "_apply_gate" in experts.__dict__ or type(experts)._apply_gate is not _default_apply_gate:
        return "a gating of its own (_apply_gate)"
    if _GATES.get(experts.config.hidden_act) is None:
        return f"activation {experts.config.hidden_act!r}"
    impl = experts.config._experts_implementation
    if impl is not None and impl not in _HF_EXPERTS:
        return f"experts implementation {impl!r} (a registered one runs as it is)"
    return None


def _experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                     top_k_weights: torch.Tensor) -> torch.Tensor:
    """cuops.moe_experts where it computes what the module does (_experts_why_not) and the tokens come in
    the weights' dtype or CUDA autocast casts both (transformers' grouped_mm casts the tokens to a
    float32 weight's dtype, which the op refuses outside autocast); else the module's own forward."""
    if _experts_why_not(self) is not None or (
            hidden_states.dtype != self.gate_up_proj.dtype and _autocast_dtype(hidden_states) is None):
        return self._cuops_base.forward(self, hidden_states, top_k_index, top_k_weights)
    return cuops.moe_experts(hidden_states, top_k_index, top_k_weights, self.gate_up_proj, self.down_proj,
                             _GATES[self.config.hidden_act])


_RESID_DROPOUTS = ("resid_attn_dropout", "resid_mlp_dropout")  # Phi-3's, on the sublayers' outputs


def _decoder_layer_forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,
                           use_cache=False, position_embeddings=None, **kwargs):
    drops = [self._modules.get(n) for n in _RESID_DROPOUTS]  # (as _packed)
    if any(d is not None and (type(d) is not nn.Dropout or (d.training and d.p > 0) or _around(d) is not None)
           for d in drops):  # a live dropout between the sublayer and the add: the layer's own forward
        return self._cuops_base.forward(self, hidden_states, attention_mask=attention_mask,
                                        position_ids=position_ids, past_key_values=past_key_values,
                                        use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
    residual = hidden_states
    norm = _plain(self.input_layernorm, "rms_norm")
    if isinstance(norm, str):
        hidden_states = self.input_layernorm(hidden_states)
    else:
        # In the half type the projections read under CUDA autocast where one GEMM reads it (the fused
        # q/k/v projection, with adapters too: x's three gradients meet in its float32 accumulator) or
        # no gradient comes back; float32 where three projections' gradients do (HF sums their bf16
        # gradients in float32).
        dtype = _autocast_dtype(hidden_states)
        if dtype is not None:
            qkv = _qkv_linears(self.self_attn)
            if qkv is None or (torch.is_grad_enabled() and not _fuses_qkv(self.self_attn, qkv)):
                dtype = None
        weight, eps, keep = _norm_operands(norm)
        if dtype is None and keep:
            dtype = hidden_states.dtype
        hidden_states = cuops.rms_norm(hidden_states, weight, eps, dtype=dtype)
    hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask,
                                      position_ids=position_ids, past_key_values=past_key_values,
                                      use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
    # Granite's residual_multiplier on each branch before its add, as its layer computes it (the
    # branch's dtype times a Python float, then the add's promotion).
    scale = self.__dict__.get("residual_multiplier", 1.0)  # a plain attribute where set (as _packed)
    post = _plain(self.post_attention_layernorm, "rms_norm")
    if isinstance(post, str):
        summed = residual + (hidden_states if scale == 1 else hidden_states * scale)
        normed = self.post_attention_layernorm(summed)
    else:
        # (rms_norm(h + residual), h + residual) in one pass: the sum in promote(h, residual) as
        # `residual + hidden_states` makes it (float32 beside a half h under autocast). In autocast's
        # dtype where the patched MLP's swiglu reads it (it would cast it to that first).
        dtype = _autocast_dtype(hidden_states)
        if dtype is not None and (isinstance(_plain(self.mlp, "mlp"), str) or _mlp_linears(self.mlp) is None):
            dtype = None
        weight, eps, keep = _norm_operands(post)
        if dtype is None and keep:
            dtype = torch.promote_types(hidden_states.dtype, residual.dtype)
        if scale != 1:
            hidden_states = hidden_states * scale
        normed, summed = cuops.add_rms_norm(hidden_states, residual, weight, eps, dtype=dtype)
    out = self.mlp(normed)
    return summed + (out if scale == 1 else out * scale)


def _qkv_linears(attn: nn.Module) -> Optional[list]:
    """q, k and v as _qkv reads them (plain nn.Linears; in training, live adapters too) of a patched
    attention nothing runs around, or None: then the input norm hands attention what HF's does."""
    if isinstance(_plain(attn, "attention"), str):
        return None
    names = _PACKED_QKV if _packed(attn, _PACKED_QKV) else _QKV
    return _linears(attn, names, adapters=attn.training)


def _project(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """module(x) -- on cuops.lora_linear in training where module is a PEFT LoRA layer the op computes
    (_plain; the attention's output projection)."""
    lin = _plain(module, nn.Linear, adapters=True) if module.training else None
    if not isinstance(lin, _Lora) or not _one_dtype(x, [lin]):
        return module(x)
    a, (b,), lora_x = _adapter_args(x, [lin])
    return cuops.lora_linear(x, lin.base.weight, a, b, lin.base.bias, "none", lora_x)


def _fuses_qkv(attn: nn.Module, qkv: Optional[list]) -> bool:
    """Whether the patched attention projects q, k and v in one GEMM (_qkv): in training, where each
    projection (qkv: _linears of them, None where one is neither) is a plain nn.Linear or a PEFT LoRA
    layer the LoRA ops compute (a DTensor weight, another adapter or an observer keeps its module),
    with biases on all three or none. Eval keeps three: decode reads every weight for a few tokens,
    and a concatenation would double what it reads. Phi-3's qkv_proj is one GEMM already, in eval too."""
    if qkv is not None and len(qkv) == 1:
        return True
    return attn.training and qkv is not None and len({_bias_of(p) is None for p in qkv}) == 1


def _qkv(attn: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k and v projections of x: where _fuses_qkv, one GEMM of the three weights concatenated (a
    float32 concatenation and autocast's cast of 6M weights a layer eager, one fused pass under
    torch.compile): one wider product in place of three (two of them 512 wide), and x's gradient one
    product accumulating all three in float32 (HF sums three rounded ones); with adapters,
    cuops.lora_linear, their B block-diagonal (each projection's columns get its own adapter's term).
    Else the three modules. Phi-3's qkv_proj: one GEMM as it is (with an adapter: _project), split."""
    if _packed(attn, _PACKED_QKV):
        q = attn.config.num_attention_heads * attn.head_dim
        kv = attn.config.num_key_value_heads * attn.head_dim
        return _project(attn.qkv_proj, x).split([q, kv, kv], dim=-1)
    qkv = _linears(attn, _QKV, adapters=True) if attn.training else None
    if not _fuses_qkv(attn, qkv) or not _one_dtype(x, qkv):
        return tuple(getattr(attn, n)(x) for n in _QKV)
    bias = torch.cat([_bias_of(p) for p in qkv]) if _bias_of(qkv[0]) is not None else None
    weight = torch.cat([_weight_of(p) for p in qkv])
    adapted = _adapter_args(x, qkv)
    if adapted is None:
        out = nn.functional.linear(x, weight, bias)
    else:
        a, bs, lora_x = adapted
        out = cuops.lora_linear(x, weight, a, torch.cat(bs), bias, "none", lora_x)
    return out.split([_weight_of(p).shape[0] for p in qkv], dim=-1)


@functools.lru_cache(maxsize=None)  # one forward (so one subclass) a family
def _attention_forward(family: _Family, eager_attention: Callable) -> Callable:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None,
                **kwargs):
        if kwargs.pop("_cuops_plain_causal", False):
            attention_mask = None  # sdpa's is_causal instead of the mask (_plain_causal)
        cos, sin = position_embeddings
        if cos.shape[-1] != self.head_dim:  # a partial rotation (Phi-3's partial_rotary_factor < 1)
            return self._cuops_base.forward(self, hidden_states, position_embeddings, attention_mask,
                                            past_key_values, **kwargs)
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        q, k, v = _qkv(self, hidden_states)
        if family.qk_norm_whole:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.view(hidden_shape), k.view(hidden_shape)
        if family.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        v = v.view(hidden_shape).transpose(1, 2)
        # In the dtype attention casts q and k to under autocast (HF's float32 values cast, without
        # the cast's pass each way; the KV cache then holds keys in the values' dtype); else in q's, as
        # every family's rotation returns (OLMo2's float32 cos and sin included: it casts back). A
        # dtype only where it differs from the op's own: torch 2.11's AOTInductor hands a custom op's
        # dtype argument over by export's enum numbers (pytorch/pytorch#169157: float32 arrives as
        # float64), so an exported Llama layer keeps the argument out.
        dtype = _autocast_dtype(q)
        if dtype is None and torch.promote_types(q.dtype, cos.dtype) != q.dtype:
            dtype = q.dtype
        q, k = cuops.rotary(q.transpose(1, 2), k.transpose(1, 2), cos, sin, dtype=dtype)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention)
        if family.sliding_window is not None:
            kwargs["sliding_window"] = family.sliding_window(self)
        if family.attn_softcap:
            kwargs["softcap"] = self.attn_logit_softcapping
        out, weights = interface(self, q, k, v, attention_mask,
                                 dropout=0.0 if not self.training else self.attention_dropout,
                                 scaling=self.scaling, **kwargs)
        out = out.reshape(*input_shape, -1).contiguous()
        return _project(self.o_proj, out), weights

    return forward


class _LogitsNotMade:
    """What a patched model's training forward with labels returns in place of its logits: the fused
    loss never makes the [tokens, vocab] logits. It keeps HF's positions (a return_dict=False tuple has
    the loss at 0, this at 1, the cache after), and any use of it raises an error naming the switch
    that makes the logits (a None would fail later with a TypeError that names nothing)."""
    __slots__ = ()
    MESSAGE = ("cuops.patch: this training forward with labels computed the loss without making the logits "
               "(the fused loss). To read logits in training, patch with cuops.patch(model, fused_loss=False) "
               "(or set model._cuops_fused_loss = False); eval and forwards without labels return logits.")

    def __getattr__(self, name):
        if name.startswith("_"):  # protocol probes (copy, pickle, hasattr of dunders) see no attribute
            raise AttributeError(name)
        raise RuntimeError(self.MESSAGE)

    def _refuse(self, *args, **kwargs):
        raise RuntimeError(self.MESSAGE)

    __getitem__ = __iter__ = __float__ = __array__ = _refuse
    __add__ = __radd__ = __sub__ = __mul__ = __truediv__ = __matmul__ = _refuse

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(cls.MESSAGE)

    def __repr__(self):
        return "<logits not made: cuops.patch's fused loss (cuops.patch(model, fused_loss=False) makes them)>"

    def __reduce__(self):
        return "LOGITS_NOT_MADE"


LOGITS_NOT_MADE = _LogitsNotMade()


def _fused_loss_why_not(model: nn.Module, logits_to_keep, causal_lm_loss: Callable) -> Optional[str]:
    """Why the causal LM's training forward with labels runs HF's own (logits, then model.loss_function),
    or None where the fused loss computes exactly that: the switch on, the model's loss_function
    transformers' causal-LM loss (a custom one, or config.loss_type's, gets its logits), all positions
    kept (HF slices the logits before its loss), and the LM head a plain nn.Linear (_plain: an
    adapter, trainable tokens or a hook on it runs)."""
    if not getattr(model, "_cuops_fused_loss", True):
        return "fused_loss=False"
    if model.loss_function is not causal_lm_loss:
        return "a loss_function other than transformers' ForCausalLMLoss"
    if not isinstance(logits_to_keep, int) or logits_to_keep != 0:
        return "logits_to_keep set"
    head = _plain(model.lm_head, nn.Linear)
    return head if isinstance(head, str) else None


@functools.lru_cache(maxsize=None)
def _causal_lm_forward(base: type) -> Callable:
    from transformers.loss.loss_utils import ForCausalLMLoss
    from transformers.modeling_outputs import CausalLMOutputWithPast, MoeCausalLMOutputWithPast

    # A mixture of experts' causal LM also returns its routers' logits and adds their load-balancing
    # loss (its family's load_balancing_loss_func, as its own forward calls it).
    balance = getattr(importlib.import_module(base.__module__), "load_balancing_loss_func", None)

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, **kwargs):
        # transformers makes a loss only from labels; HF's own forward wherever the fused loss is not
        # exactly what it computes.
        if not self.training or labels is None or _fused_loss_why_not(self, logits_to_keep, ForCausalLMLoss) is not None:
            return base.forward(self, input_ids=input_ids, attention_mask=attention_mask,
                                position_ids=position_ids, past_key_values=past_key_values,
                                inputs_embeds=inputs_embeds, labels=labels, use_cache=use_cache,
                                logits_to_keep=logits_to_keep, **kwargs)
        # transformers' ForCausalLMLoss without the logits: labels shifted left (the last position
        # ignored), a mean over the tokens not ignored, or a sum over num_items_in_batch.
        shift_labels = kwargs.pop("shift_labels", None)
        num_items = kwargs.pop("num_items_in_batch", None)
        ignore_index = kwargs.pop("ignore_index", -100)
        return_dict = kwargs.pop("return_dict", None)
        if return_dict is None:  # as transformers' can_return_tuple: the config decides
            return_dict = getattr(self.config, "return_dict", True)
        if balance is not None:
            router_logits = kwargs.pop("output_router_logits", None)
            kwargs["output_router_logits"] = (self.config.output_router_logits if router_logits is None
                                              else router_logits)
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
        divisor = getattr(self.config, "logits_scaling", 1.0)  # Granite's logits / logits_scaling
        if divisor != 1:
            hidden = hidden / divisor  # (h / s) W^T: its logits, the [tokens, H] side divided, not [tokens, V]
        # Gemma 2 / 3's final_logit_softcapping: c tanh(z / c) on the logits, inside the op's pass.
        loss = cuops.linear_cross_entropy(hidden, self.lm_head.weight, shift_labels.to(hidden.device),
                                          self.lm_head.bias, ignore_index,
                                          "mean" if num_items is None else "sum",
                                          getattr(self.config, "final_logit_softcapping", None))
        if num_items is not None:
            loss = loss / (num_items.to(loss.device) if torch.is_tensor(num_items) else num_items)
        if balance is None:
            out = CausalLMOutputWithPast(loss=loss, logits=LOGITS_NOT_MADE, past_key_values=outputs.past_key_values,
                                         hidden_states=outputs.hidden_states, attentions=outputs.attentions)
            return out if return_dict else out.to_tuple()
        aux_loss = None
        if kwargs["output_router_logits"]:
            aux_loss = balance(outputs.router_logits, self.num_experts, self.num_experts_per_tok, attention_mask)
            loss = loss + self.router_aux_loss_coef * aux_loss.to(loss.device)
        out = MoeCausalLMOutputWithPast(loss=loss, aux_loss=aux_loss, logits=LOGITS_NOT_MADE,
                                        past_key_values=outputs.past_key_values, hidden_states=outputs.hidden_states,
                                        attentions=outputs.attentions, router_logits=outputs.router_logits)
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
    supported = ", ".join(f"{f.prefix}ForCausalLM / {f.prefix}{f.base_model}" for f in _FAMILIES.values())
    config = getattr(model, "config", None)
    family = _FAMILIES.get(getattr(config, "model_type", None))
    if family is not None:
        name = family.module or config.model_type
        mod = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
        known = (getattr(mod, f"{family.prefix}ForCausalLM"), getattr(mod, f"{family.prefix}{family.base_model}"))
        if isinstance(model, known):
            return family, mod
    raise TypeError(f"cuops.patch: expected a Hugging Face model of the Llama family ({supported}), "
                    f"got {type(model).__module__}.{type(model).__qualname__}")


def _transformers_model(model: nn.Module) -> nn.Module:
    """The transformers model inside a PEFT model (get_peft_model's wrapper), or model itself."""
    inner = getattr(model, "get_base_model", None)
    return inner() if callable(inner) and type(model).__module__.startswith("peft.") else model


def _roles(model: nn.Module):
    """(class, role) pairs patch() swaps: each matched by its forward, so a user's subclass with a
    forward of its own keeps it (one that only adds methods is patched as its base)."""
    family, mod = _family_of(model)
    names = [("RMSNorm", "rms_norm"), ("DecoderLayer", "decoder_layer"), ("Attention", "attention"), ("MLP", "mlp"),
             ("Experts", "experts"), ("ForCausalLM", "causal_lm")]
    return family, mod, [(getattr(mod, family.prefix + name), role) for name, role in names
                         if hasattr(mod, family.prefix + name) and (role != "attention" or family.llama_attention)
                         and (role != "decoder_layer" or family.layer)]


def patch(model: nn.Module, fused_loss: bool = True) -> nn.Module:
    target = _transformers_model(model)
    family, mod, roles = _roles(target)
    for module in target.modules():
        for kind, role in roles:
            if isinstance(module, kind) and type(module).forward is kind.forward:
                if role != "mlp" or _gate(module) is not None:
                    _swap_forward(module, _forward_for(type(module), role, family, mod), role)
    target._cuops_fused_loss = bool(fused_loss)  # read at each call (_fused_loss_why_not)
    return model


def _gate(mlp: nn.Module) -> Optional[str]:
    """down(act(gate(x)) * up(x)): swiglu's name of the config's activation (_GATES: silu or
    gelu_tanh), or None: the MLP stays its module (biases are the call's rule)."""
    return _GATES.get(_activation(mlp.config))


def _activation(config) -> Optional[str]:
    """The MLP's activation: hidden_act, or Gemma 3's hidden_activation."""
    return getattr(config, "hidden_act", None) or getattr(config, "hidden_activation", None)


class PatchReport(NamedTuple):
    """cuops.patch_report(model): each patched path and whether it runs fused now (in the model's
    current mode), with why not; str() prints it as a table."""
    rows: list[tuple[str, str, Optional[str]]]  # (module name, what is fused, None or why not)

    def fused(self) -> list[str]:
        return [name for name, _, why in self.rows if why is None]

    def __str__(self) -> str:
        width = max([len(n) for n, _, _ in self.rows] + [6])
        lines = [f"{'module':<{width}}  {'fused path':<28}  runs"]
        for name, what, why in self.rows:
            lines.append(f"{name:<{width}}  {what:<28}  {'fused' if why is None else 'as its module: ' + why}")
        n = len(self.fused())
        lines.append(f"{n} of {len(self.rows)} paths fused")
        return "\n".join(lines)


def _dtypes_why_not(lins: list) -> Optional[str]:
    """The report's reading of _one_dtype, which needs the call's x: adapters of another dtype than
    their base (PEFT's float32 adapters on a bf16 model) run fused only under CUDA autocast."""
    for lin in lins:
        if isinstance(lin, _Lora) and lin.a.dtype != lin.base.weight.dtype:
            return (f"fused under CUDA autocast only ({str(lin.a.dtype)[6:]} adapters on a "
                    f"{str(lin.base.weight.dtype)[6:]} base: PEFT's modules outside it)")
    return None


def patch_report(model: nn.Module) -> PatchReport:
    target = _transformers_model(model)
    _roles(target)  # refuses what patch() refuses
    prefix = "" if target is model else next(n for n, m in model.named_modules() if m is target)
    rows = []

    def add(name, what, got):
        rows.append(((f"{prefix}.{name}" if prefix else name) or "(model)", what,
                     got if isinstance(got, str) else None))

    modules = dict(target.named_modules())
    for name, m in modules.items():
        role = getattr(type(m), "_cuops_role", None)
        parent = modules.get(name.rpartition(".")[0]) if name else None
        if role == "rms_norm" and type(parent).__name__.endswith("DecoderLayer") and \
                getattr(type(parent), "_cuops_role", None) is None:  # OLMo2's norms after the sublayers
            add(name, "rms_norm", _plain(m, "rms_norm"))
        elif role is None and type(m).__name__.endswith("MLP") and type(parent).__name__.endswith("DecoderLayer"):
            add(name, "swiglu + linear", f"activation {_activation(m.config)!r} (swiglu gates by silu or gelu_tanh)")
        elif role == "decoder_layer":
            for norm, what in (("input_layernorm", "rms_norm"), ("post_attention_layernorm", "add_rms_norm")):
                add(f"{name}.{norm}", what, _plain(getattr(m, norm), "rms_norm"))
        elif role == "attention":
            if _packed(m, _PACKED_QKV):  # Phi-3's qkv_proj is one GEMM as it is
                partial = (getattr(m.config, "rope_parameters", None) or {}).get("partial_rotary_factor", 1.0)
                add(name, "rotary", None if partial == 1 else f"partial_rotary_factor {partial}: as its module")
            else:
                lins = [_plain(getattr(m, n), nn.Linear, adapters=True) for n in _QKV]
                why = next((w for w in lins if isinstance(w, str)), None)
                why = why or (None if _fuses_qkv(m, lins) else "eval: three projections" if not m.training
                              else "q, k and v biases differ") or _dtypes_why_not(lins)
                add(f"{name}.q_proj,k_proj,v_proj", "one GEMM (training)", why)
            for proj in ("qkv_proj", "o_proj"):  # a row where PEFT wraps one (_project runs it)
                if type(getattr(m, proj, None)).__module__.startswith("peft."):
                    out = _plain(getattr(m, proj), nn.Linear, adapters=True)
                    why = out if isinstance(out, str) else (
                        "eval: PEFT's module" if isinstance(out, _Lora) and not m.training else None)
                    add(f"{name}.{proj}", "lora_linear (training)", why or _dtypes_why_not([out]))
        elif role == "mlp":
            lins = [_plain(getattr(m, n), nn.Linear, adapters=True)
                    for n in (_PACKED_MLP if _packed(m, _PACKED_MLP) else _MLP)]
            why = next((w for w in lins if isinstance(w, str)), None)
            if why is None and not m.training and any(isinstance(lin, _Lora) for lin in lins):
                why = "eval: its adapters as PEFT's modules"
            if why is None and any(_bias_of(lin) is not None for lin in lins):
                why = "a projection with a bias"
            add(name, "swiglu + linear", why or _dtypes_why_not(lins))
        elif role == "experts":
            add(name, "moe_experts", _experts_why_not(m))
    if getattr(type(target), "_cuops_role", None) == "causal_lm":  # the head last, as the model runs it
        from transformers.loss.loss_utils import ForCausalLMLoss
        add("lm_head", "linear_cross_entropy (train)", _fused_loss_why_not(target, 0, ForCausalLMLoss))
    return PatchReport(rows)
