"""cuops.patch with PEFT adapters and everything else a user puts on a model (docs/patch.md "The rule"): a
patched model with LoRA (r 8 and 64, dropout 0 and 0.05; q/k/v/o + MLP, MLP only, lm_head), DoRA,
trainable tokens, merged or disabled adapters, hooks on each kind of module the patch reads, a user's
subclass, a custom loss_function, logits_to_keep with labels and return_dict=False computes exactly
what the same model unpatched does -- float32 logits, loss and every trainable gradient -- whether
cuops.patch runs before or after get_peft_model; 50 AdamW steps; the report; the class names
save_pretrained writes; HF Trainer. Small random models from configs (test_patch.py's): no download."""
import collections
import contextlib
import copy
import json

import pytest
import torch

import cuops
from conftest import DEVICES, DEVICES_CPU_IN_CI, rel_error, requires_cuda
from test_patch import FAMILIES, VOCAB, adamw_losses, assert_layer_compiles, grads, op_calls, tiny_config, tokens

transformers = pytest.importorskip("transformers", reason="transformers is the patch's optional dependency")
peft = pytest.importorskip("peft", reason="peft: tools/env.sh installs it for these tests")

ATTN_MLP = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TARGETS = {"attention+mlp": ATTN_MLP, "mlp": ["gate_proj", "up_proj", "down_proj"], "lm_head": ["lm_head"]}


def base_model(family, device, seed=0, **over):
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(tiny_config(family, **over)).to(device)


def peft_twins(family, device, when, seed=0, model_over=None, **lora):
    """(the PEFT model unpatched, the same PEFT model patched `when` = "before" or "after"
    get_peft_model), with the same adapter weights: B non-zero (PEFT starts it at zero, which would
    hide an adapter the patch skips)."""
    lora.setdefault("target_modules", ATTN_MLP)
    base = base_model(family, device, seed, **(model_over or {}))
    other = copy.deepcopy(base)
    ref = peft.get_peft_model(base, peft.LoraConfig(init_lora_weights=False, **lora))
    if when == "before":
        model = peft.get_peft_model(cuops.patch(other), peft.LoraConfig(**lora))
    else:
        model = cuops.patch(peft.get_peft_model(other, peft.LoraConfig(**lora)))
    model.load_state_dict(ref.state_dict())
    return ref, model


def assert_same_step(ref, model, ids, labels=None, seed=3, grad_tol=1e-4, backward=True):
    """Eval logits, the training loss (dropout's masks from the same seed) and every trainable gradient."""
    labels = ids if labels is None else labels
    ref.eval(), model.eval()
    with torch.no_grad():
        assert rel_error(model(input_ids=ids).logits, ref(input_ids=ids).logits) <= 1e-5
    ref.train(), model.train()
    losses = []
    for m in (ref, model):
        torch.manual_seed(seed)
        out = m(input_ids=ids, labels=labels)
        if backward:
            out.loss.backward()
        losses.append(out.loss)
    assert rel_error(losses[1], losses[0]) <= 1e-5
    if not backward:
        return
    g_ref, g = grads(ref), grads(model)
    assert set(g) == set(g_ref) and g_ref, (set(g) ^ set(g_ref))
    for n in g_ref:
        assert rel_error(g[n], g_ref[n]) <= grad_tol, n


@contextlib.contextmanager
def fused_calls():
    """A Counter of the fused ops cuops.patch calls (test_patch.op_calls' spy), filled when the block ends."""
    counts = collections.Counter()
    with op_calls("swiglu", "linear", "lora_swiglu", "lora_linear", "linear_cross_entropy") as seen:
        yield counts
    counts.update({name: len(calls) for name, calls in seen.items() if calls})


# What a training forward of the 2-layer model runs, by the adapters' targets: the LoRA ops where
# an adapter is (q/k/v in one lora_linear, o in one, gate/up in lora_swiglu, down in lora_linear),
# the plain ones elsewhere; an adapter on lm_head keeps HF's loss (the fused loss takes none). Eval
# runs the adapters as PEFT's modules (test_adapters_in_eval_run_as_peft_modules).
FUSED_CALLS = {"attention+mlp": {"lora_swiglu": 2, "lora_linear": 6, "linear_cross_entropy": 1},
               "mlp": {"lora_swiglu": 2, "lora_linear": 2, "linear_cross_entropy": 1},
               "lm_head": {"swiglu": 2, "linear": 2}}


@pytest.mark.parametrize("device", DEVICES_CPU_IN_CI)
@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "phi3"])  # Phi-3's module names differ: below
def test_lora_matches_the_unpatched_peft_model(device, when, family):
    """Each target set with r 8 / dropout 0 and r 64 / dropout 0.05: the adapters run inside the LoRA
    ops (the spy's count), and every adapter gets the gradient the unpatched PEFT model gives it (the
    patch used to read the MLP's base weights past PEFT's wrappers: 12 of 28 adapters got none)."""
    ids = tokens(2, 11, device)
    for key, targets in TARGETS.items():
        for r, dropout in ((8, 0.0), (64, 0.05)):
            ref, model = peft_twins(family, device, when, target_modules=targets, r=r, lora_alpha=2 * r,
                                    lora_dropout=dropout)
            model.train()
            with fused_calls() as seen:
                model(input_ids=ids, labels=ids)
            assert dict(seen) == FUSED_CALLS[key], (key, dict(seen))
            assert_same_step(ref, model, ids)
            n_adapters = sum(1 for n, p in model.named_parameters() if p.requires_grad)
            assert n_adapters == 2 * len(targets) * (1 if targets == ["lm_head"] else 2), n_adapters


@pytest.mark.parametrize("device", DEVICES_CPU_IN_CI)
@pytest.mark.parametrize("when", ["before", "after"])
def test_phi3_lora_matches_the_unpatched_peft_model(device, when):
    """Phi-3's own module names (qkv_proj, o_proj, gate_up_proj, down_proj) and each alone, r 8 / dropout 0
    and r 64 / dropout 0.05: qkv_proj's adapter on lora_linear, gate_up_proj's on lora_swiglu (its B split
    as the weight is), o_proj's and down_proj's on lora_linear; every adapter's gradient as the unpatched
    PEFT model gives it."""
    ids = tokens(2, 11, device)
    for targets in (["qkv_proj", "o_proj", "gate_up_proj", "down_proj"], ["qkv_proj"], ["gate_up_proj"],
                    ["down_proj"], ["o_proj"]):
        for r, dropout in ((8, 0.0), (64, 0.05)):
            ref, model = peft_twins("phi3", device, when, target_modules=targets, r=r, lora_alpha=2 * r,
                                    lora_dropout=dropout)
            model.train()
            with fused_calls() as seen:
                model(input_ids=ids, labels=ids)
            want = collections.Counter(linear_cross_entropy=1)
            want["lora_linear"] += 2 * sum(t in targets for t in ("qkv_proj", "o_proj", "down_proj"))
            want["lora_swiglu" if "gate_up_proj" in targets else "swiglu"] += 2
            if "down_proj" not in targets:
                want["linear"] += 2
            assert seen == want, (targets, dict(seen))
            assert_same_step(ref, model, ids)
            assert sum(1 for _, p in model.named_parameters() if p.requires_grad) == 4 * len(targets)


@pytest.mark.parametrize("device", DEVICES)
def test_adapters_in_eval_run_as_peft_modules(device):
    """Eval (decode: each weight read once for a few tokens) keeps live adapters as PEFT's modules, since
    the LoRA ops concatenate [W | B] each call; the report says so, the logits are PEFT's."""
    ref, model = peft_twins("qwen3", device, "after", r=8, lora_alpha=16)
    ref.eval(), model.eval()
    ids = tokens(2, 7, device)
    with torch.no_grad(), fused_calls() as seen:
        got = model(input_ids=ids).logits
    assert seen["lora_swiglu"] == seen["lora_linear"] == seen["swiglu"] == 0, dict(seen)
    assert rel_error(got, ref(input_ids=ids).logits) <= 1e-5
    report = {n: why for n, _, why in cuops.patch_report(model).rows}
    assert report["base_model.model.model.layers.0.mlp"] == "eval: its adapters as PEFT's modules", report


def test_a_bf16_base_with_float32_adapters_runs_as_peft_computes_it():
    """PEFT keeps a bf16 model's adapters in float32 (autocast_adapter_dtype) and adds their float32 term to
    the bf16 base output: without autocast the LoRA ops (one dtype) do not take that, so those
    projections run as PEFT's modules -- no error, the loss within bf16's rounding of PEFT's."""
    base = base_model("llama", "cpu").to(torch.bfloat16)
    other = copy.deepcopy(base)
    ref = peft.get_peft_model(base, peft.LoraConfig(r=8, lora_alpha=16, target_modules=ATTN_MLP,
                                                    init_lora_weights=False))
    model = cuops.patch(peft.get_peft_model(other, peft.LoraConfig(r=8, lora_alpha=16, target_modules=ATTN_MLP)))
    model.load_state_dict(ref.state_dict())
    assert ref.base_model.model.model.layers[0].mlp.up_proj.lora_A["default"].weight.dtype == torch.float32
    ids = tokens(2, 9, "cpu")
    ref.train(), model.train()
    with fused_calls() as seen:
        got = model(input_ids=ids, labels=ids).loss
    assert seen["lora_swiglu"] == seen["lora_linear"] == 0, dict(seen)
    report = {n: why for n, _, why in cuops.patch_report(model).rows}
    assert report["base_model.model.model.layers.0.mlp"].startswith(
        "fused under CUDA autocast only (float32 adapters on a bfloat16 base"), report
    assert rel_error(got, ref(input_ids=ids, labels=ids).loss) <= 1e-2
    got.backward()


@pytest.mark.parametrize("device", DEVICES_CPU_IN_CI)
def test_fifty_lora_steps_equal_peft(device):
    """AdamW on the adapters, 50 steps, dropout 0, float32: every loss equal to the unpatched PEFT
    model's to 1e-5 relative, and falling."""
    losses = adamw_losses(peft_twins("llama", device, "after", r=8, lora_alpha=16), device)
    for step, (a, b) in enumerate(zip(*losses)):
        assert abs(a - b) <= 1e-5 * abs(a), (step, a, b)
    assert losses[1][-1] < 0.97 * losses[1][0]


@pytest.mark.parametrize("device", DEVICES)
def test_merged_and_disabled_adapters_run_fused(device):
    """merge_adapter() folds the adapter into the base weight and disable_adapter() leaves the base
    alone: PEFT's forward is then the base Linear's, so the plain fused ops read its weight;
    unmerge_adapter() brings the live adapter back onto the LoRA ops. The report says fused throughout."""
    ref, model = peft_twins("llama", device, "after", r=8, lora_alpha=16)
    ids = tokens(2, 9, device)
    model.train()
    every = [name for name, _, _ in cuops.patch_report(model).rows]
    assert cuops.patch_report(model).fused() == every
    for m in (ref, model):
        m.merge_adapter()
    assert cuops.patch_report(model).fused() == every
    with fused_calls() as seen:
        model(input_ids=ids, labels=ids)
    assert dict(seen) == {"swiglu": 2, "linear": 2, "linear_cross_entropy": 1}, dict(seen)
    assert_same_step(ref, model, ids, backward=False)  # merged: the adapters are not in the graph
    for m in (ref, model):
        m.unmerge_adapter()
        m.zero_grad(set_to_none=True)
    with fused_calls() as seen:
        model(input_ids=ids, labels=ids)
    assert dict(seen) == FUSED_CALLS["attention+mlp"], dict(seen)
    assert_same_step(ref, model, ids)
    mlp = "base_model.model.model.layers.0.mlp"
    ref.eval(), model.eval()
    with torch.no_grad(), ref.disable_adapter(), model.disable_adapter():
        assert cuops.patch_report(model).rows[-1][2] is None
        assert {name: why for name, _, why in cuops.patch_report(model).rows}[mlp] is None
        assert rel_error(model(input_ids=ids).logits, ref(input_ids=ids).logits) <= 1e-5


@pytest.mark.parametrize("device", DEVICES)
def test_dora_and_trainable_tokens_run_as_peft_computes_them(device):
    """DoRA (a magnitude vector and the combined weight's norm: another computation) and trainable
    token rows on a tied-embedding model (PEFT wraps lm_head too): those modules run as PEFT's, so the
    loss is HF's own where the head is wrapped."""
    ids = tokens(2, 10, device)
    ref, model = peft_twins("qwen2", device, "after", r=8, lora_alpha=16, use_dora=True)
    assert_same_step(ref, model, ids)
    assert all("variant (DoraLinearVariant)" in why for name, _, why in cuops.patch_report(model).rows
               if name.endswith("mlp")), str(cuops.patch_report(model))
    ref, model = peft_twins("qwen2", device, "before", r=8, lora_alpha=16, model_over={"tie": True},
                            trainable_token_indices=[3, 5, 7])
    report = cuops.patch_report(model)
    assert report.rows[-1][0].endswith("lm_head") and report.rows[-1][2] is not None, report.rows[-1]
    assert_same_step(ref, model, ids)


def two_models(family, device, **over):
    base = base_model(family, device, **over)
    return base, cuops.patch(copy.deepcopy(base))


def each(models, fn):
    for m in models:
        fn(m)


@pytest.mark.parametrize("device", DEVICES)
def test_hooks_on_every_module_kind_the_patch_reads_fire(device):
    """A forward hook that changes the output, on each module whose weights a fused path would read
    (both norms of a layer, a q/k/v projection, gate / up / down, lm_head) and on the containers
    (attention, MLP), and a global forward pre-hook: each fires, the result equals the unpatched model's."""
    ids = tokens(2, 9, device)
    def scale(mod, args, out):
        return (out[0] * 1.25, *out[1:]) if isinstance(out, tuple) else out * 1.25

    paths = ["model.layers.0.input_layernorm", "model.layers.1.post_attention_layernorm",
             "model.layers.0.self_attn.k_proj", "model.layers.1.mlp.gate_proj", "model.layers.0.mlp.up_proj",
             "model.layers.1.mlp.down_proj", "lm_head", "model.layers.0.self_attn", "model.layers.1.mlp",
             "model.norm"]
    for path in paths:
        ref, model = two_models("llama", device)
        handles = [m.get_submodule(path).register_forward_hook(scale) for m in (ref, model)]
        report = {n: why for n, _, why in cuops.patch_report(model).rows}
        if path in report:  # a hooked MLP still fuses inside (its hook fires); a hooked norm or head runs
            want = None if path.endswith("mlp") else "hooks on the module"
            assert report[path] == want, (path, report[path])
        assert_same_step(ref, model, ids)
        for h in handles:
            h.remove()
    ref, model = two_models("llama", device)
    seen = []
    handle = torch.nn.modules.module.register_module_forward_pre_hook(lambda m, a: seen.append(type(m).__name__))
    try:
        assert all(why == "global module hooks" for _, _, why in cuops.patch_report(model).rows)
        assert_same_step(ref, model, ids)
    finally:
        handle.remove()
    assert "LlamaRMSNorm" in seen and "Linear" in seen


@pytest.mark.parametrize("device", DEVICES)
def test_subclasses_and_instance_forwards_keep_their_forward(device):
    """A user's subclass with a forward of its own (the causal LM adding an auxiliary term, an MLP that
    scales its output) is not replaced, a forward set on an instance runs, and a Linear subclass with
    its own forward (a quantized layer's shape) runs as it is."""
    mod = transformers.models.llama.modeling_llama

    class MyLM(mod.LlamaForCausalLM):
        def forward(self, *args, labels=None, **kwargs):
            out = super().forward(*args, labels=labels, **kwargs)
            if out.loss is not None:
                out.loss = out.loss + 0.1 * out.logits.float().square().mean()
            return out

    class HalfMLP(mod.LlamaMLP):
        def forward(self, x):
            return 0.5 * super().forward(x)

    class FakeQuantLinear(torch.nn.Linear):
        def forward(self, x):
            return torch.nn.functional.linear(x, self.weight.round(decimals=2), self.bias)

    torch.manual_seed(0)
    ref = MyLM(tiny_config("llama"))
    for m in ref.modules():
        if type(m) is mod.LlamaMLP:
            m.__class__ = HalfMLP
    layer = ref.model.layers[0]
    old = layer.self_attn.v_proj
    layer.self_attn.v_proj = FakeQuantLinear(old.in_features, old.out_features, bias=False)
    layer.self_attn.v_proj.weight.data.copy_(old.weight)
    ref = ref.to(device)
    model = cuops.patch(copy.deepcopy(ref))
    assert type(model) is MyLM and all(type(m) is HalfMLP for m in model.modules() if isinstance(m, mod.LlamaMLP))
    attn = model.model.layers[1].self_attn
    for m in (ref, model):
        o = m.model.layers[1].self_attn.o_proj
        o.forward = (lambda lin: (lambda x: torch.nn.functional.linear(x, 2 * lin.weight)))(o)
        q = m.model.layers[1].self_attn.q_proj
        q.forward = (lambda lin: (lambda x: torch.nn.functional.linear(x, lin.weight) - 1))(q)
    assert cuops.patch_report(model).rows and "instance" in dict(
        (n, w) for n, _, w in cuops.patch_report(model).rows)["model.layers.1.self_attn.q_proj,k_proj,v_proj"]
    assert attn.training
    assert_same_step(ref, model, tokens(2, 9, device))


@pytest.mark.parametrize("device", DEVICES)
def test_hugging_face_loss_contracts_are_delegated(device):
    """A custom model.loss_function (label smoothing) gets its logits; logits_to_keep with shift_labels
    is HF's loss over the kept positions; fused_loss=False gives training logits; return_dict=False keeps
    HF's positions, the logits' place holding an object whose use names the switch."""
    ids = tokens(2, 9, device)
    ref, model = two_models("llama", device)

    def smoothed(logits, labels, vocab_size, **kwargs):
        shift = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:]
        return torch.nn.functional.cross_entropy(logits.float().view(-1, vocab_size), shift.reshape(-1),
                                                 label_smoothing=0.2)

    for m in (ref, model):
        m.loss_function = smoothed
    assert cuops.patch_report(model).rows[-1][2].startswith("a loss_function")
    assert_same_step(ref, model, ids)
    ref, model = two_models("llama", device)
    ref.train(), model.train()
    shifted = torch.nn.functional.pad(ids, (0, 1), value=-100)[:, 1:][:, -3:].contiguous()
    want = ref(input_ids=ids, labels=ids, shift_labels=shifted, logits_to_keep=3)
    got = model(input_ids=ids, labels=ids, shift_labels=shifted, logits_to_keep=3)
    assert got.logits.shape == want.logits.shape and rel_error(got.loss, want.loss) <= 1e-5
    # The tuple: the same length and positions as HF's; the logits' place raises naming the switch.
    want, got = ref(input_ids=ids, labels=ids, return_dict=False), model(input_ids=ids, labels=ids, return_dict=False)
    assert len(got) == len(want) and rel_error(got[0], want[0]) <= 1e-5
    assert [type(x) for x in got[2:]] == [type(x) for x in want[2:]]
    for use in (lambda x: x.shape, lambda x: x[..., :-1], lambda x: x.argmax(-1), lambda x: torch.softmax(x, -1),
                lambda x: x + 1):
        with pytest.raises(RuntimeError, match=r"fused_loss=False"):
            use(got[1])
    assert copy.deepcopy(got[1]) is got[1]
    # output_hidden_states as HF gives them (through the model, whose output the fused loss keeps).
    want = ref(input_ids=ids, labels=ids, output_hidden_states=True)
    got = model(input_ids=ids, labels=ids, output_hidden_states=True)
    assert len(got.hidden_states) == len(want.hidden_states) == 3
    for g, w in zip(got.hidden_states, want.hidden_states):
        assert rel_error(g, w) <= 1e-5
    cuops.patch(model, fused_loss=False)
    out = model(input_ids=ids, labels=ids)
    assert rel_error(out.logits, ref(input_ids=ids, labels=ids).logits) <= 1e-5
    assert cuops.patch_report(model).rows[-1][2] == "fused_loss=False"


def test_names_tools_read_stay_transformers(tmp_path):
    """save_pretrained writes the transformers class into config.json (vLLM and SGLang pick the model
    class from it); the layers keep the names _no_split_modules and FSDP auto-wrap match."""
    ref, model = two_models("qwen3", "cpu")
    assert type(model).__name__ == "Qwen3ForCausalLM" and getattr(type(model), "_cuops_patched", False)
    assert {type(m).__name__ for m in model.modules()} == {type(m).__name__ for m in ref.modules()}
    assert type(model.model.layers[0]).__name__ in model._no_split_modules
    from accelerate.utils.dataclasses import get_module_class_from_name  # FSDP's auto-wrap by class name
    assert get_module_class_from_name(model, "Qwen3DecoderLayer") is type(model.model.layers[0])
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = tokens(1, 6, "cpu")
    ref.eval(), loaded.eval()
    with torch.no_grad():
        assert rel_error(loaded(ids).logits, ref(ids).logits) <= 1e-6


def test_the_report_names_every_path():
    _, model = two_models("qwen3", "cpu")
    model.train()
    report = cuops.patch_report(model)
    text = str(report)
    assert len(report.rows) == 2 * 4 + 1 and report.fused() == [n for n, _, _ in report.rows]
    assert "9 of 9 paths fused" in text and "model.layers.1.mlp" in text and "linear_cross_entropy" in text
    model.eval()
    assert "eval: three projections" in str(cuops.patch_report(model))
    with pytest.raises(TypeError, match="cuops.patch: expected"):
        cuops.patch_report(torch.nn.Linear(2, 2))


def test_hugging_face_trainer_trains_a_patched_model(tmp_path):
    """transformers' Trainer, 4 steps on CPU: the patched model's logged losses equal the unpatched one's."""
    ref, model = two_models("llama", "cpu")
    gen = torch.Generator().manual_seed(2)
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, VOCAB, (8, 12), generator=gen)]
    losses = []
    for i, m in enumerate((ref, model)):
        args = transformers.TrainingArguments(output_dir=str(tmp_path / str(i)), max_steps=4,
                                              per_device_train_batch_size=2, learning_rate=1e-3, logging_steps=1,
                                              report_to=[], use_cpu=True, save_strategy="no", seed=0)
        trainer = transformers.Trainer(model=m, args=args, train_dataset=data)
        trainer.train()
        losses.append([h["loss"] for h in trainer.state.log_history if "loss" in h])
    assert len(losses[0]) == 4 and losses[1][0] == pytest.approx(losses[0][0], rel=1e-5)
    assert losses[1] == pytest.approx(losses[0], rel=1e-3)  # after AdamW steps: test_trl_sft_trainer's reason


def test_trl_sft_trainer_trains_a_patched_model(tmp_path):
    """TRL's SFTTrainer (its own chunked LM head reads the patched decoder's hidden states and lm_head),
    3 steps on CPU: losses and token accuracies equal the unpatched model's."""
    trl = pytest.importorskip("trl", reason="trl: tools/env.sh installs it for this test")
    datasets = pytest.importorskip("datasets", reason="datasets: tools/env.sh installs it with trl")
    import tokenizers
    vocab = {f"t{i}": i for i in range(VOCAB)}
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="t1")),
        pad_token="t0", eos_token="t2", unk_token="t1")
    ref, model = two_models("llama", "cpu")
    gen = torch.Generator().manual_seed(2)
    data = datasets.Dataset.from_dict({"input_ids": torch.randint(3, VOCAB, (8, 12), generator=gen).tolist()})
    logs = []
    for i, m in enumerate((ref, model)):
        args = trl.SFTConfig(output_dir=str(tmp_path / str(i)), max_steps=3, per_device_train_batch_size=2,
                             learning_rate=1e-3, logging_steps=1, report_to=[], use_cpu=True, save_strategy="no",
                             seed=0)
        trainer = trl.SFTTrainer(model=m, args=args, train_dataset=data, processing_class=tok)
        trainer.train()
        logs.append([(h["loss"], h["mean_token_accuracy"]) for h in trainer.state.log_history if "loss" in h])
    assert len(logs[0]) == 3
    for step, ((loss_ref, acc_ref), (loss, acc)) in enumerate(zip(*logs)):
        # The first step's loss to float32 rounding; later ones after AdamW steps from gradients
        # equal to 1e-4 (test_patch.py's training tolerance: Adam scales a rounding on a tiny gradient).
        assert loss == pytest.approx(loss_ref, rel=1e-5 if step == 0 else 1e-3) and acc == acc_ref


@pytest.mark.parametrize("device", DEVICES)
def test_a_patched_lora_decoder_layer_compiles_without_graph_breaks(device):
    """torch.compile(fullgraph=True) of a patched decoder layer holding PEFT LoRA layers (the rule runs
    inside the graph: no break), forward and backward equal to eager."""
    _, model = peft_twins("llama", device, "after", r=8, lora_alpha=16)
    assert_layer_compiles(model.get_base_model(), device, ["aot_eager"] + (["inductor"] if device == "cuda" else []))


@pytest.mark.parametrize("device", DEVICES)
def test_a_quantized_base_runs_as_its_module(device):
    """bitsandbytes' Linear4bit (an nn.Linear subclass with its own forward, a packed weight) as the MLP's
    projections: they run as bitsandbytes computes them, the result equal to the unpatched model's."""
    bnb = pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed here (tools/env.sh does "
                                                     "not pin it: its wheel is the size of the rest together)")
    ref, model = two_models("llama", device)
    for m in (ref, model):
        for layer in m.model.layers:
            for name in ("gate_proj", "up_proj", "down_proj"):
                old = getattr(layer.mlp, name)
                q = bnb.nn.Linear4bit(old.in_features, old.out_features, bias=False, compute_dtype=torch.float32)
                q.load_state_dict(old.state_dict())
                setattr(layer.mlp, name, q.to(device))
    report = {n: why for n, _, why in cuops.patch_report(model).rows}
    assert "Linear4bit" in report["model.layers.0.mlp"], report
    ids = tokens(2, 9, device)
    ref.eval(), model.eval()
    with torch.no_grad():
        assert rel_error(model(input_ids=ids).logits, ref(input_ids=ids).logits) <= 1e-5


@requires_cuda
def test_dropout_under_autocast_gives_each_adapter_its_own_mask(monkeypatch):
    """bf16 autocast over float32 weights, dropout 0.3: the patch draws each adapter's mask over x in
    autocast's dtype, PEFT over x cast to A's float32 (the same distribution, other random draws). With
    the draws replaced by masks that depend on the call's order and shape alone, both models (which call
    the dropout modules in PEFT's order) must give every adapter's gradient within bf16's rounding of
    PEFT's, on the LoRA ops: a mask on the wrong adapter, or a wrong scale, changes them wholesale."""
    calls = [0]

    def dropout(x, p=0.5, training=True, inplace=False):
        if not training or p == 0:
            return x
        gen = torch.Generator(device=x.device).manual_seed(1000 + calls[0])
        calls[0] += 1
        return x * (torch.rand(x.shape, generator=gen, device=x.device) >= p) / (1 - p)

    monkeypatch.setattr(torch.nn.functional, "dropout", dropout)
    ref, model = peft_twins("llama", "cuda", "after", r=8, lora_alpha=16, lora_dropout=0.3)
    ids = tokens(2, 33, "cuda")
    ref.train(), model.train()
    for m in (ref, model):
        calls[0] = 0
        with fused_calls() as seen, torch.autocast("cuda", torch.bfloat16):
            loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        assert calls[0] == 2 * 7, calls[0]  # each adapter's dropout once
    assert dict(seen) == FUSED_CALLS["attention+mlp"], dict(seen)
    g_ref, g = grads(ref), grads(model)
    assert set(g) == set(g_ref) and g_ref
    for n in g_ref:
        assert rel_error(g[n], g_ref[n]) <= 5e-2, n
