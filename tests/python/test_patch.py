"""cuops.patch (python/cuops/_hf.py, docs/patch.md): a Hugging Face Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma, Gemma 2, Gemma 3, OLMo2 and Granite model
patched in place against the same model unpatched: outputs and every gradient (float32 tight; bfloat16
autocast within torch's own bfloat16 error against float32), the fused loss (mean, num_items_in_batch,
shift_labels, ignored tokens; the logits' place holds LOGITS_NOT_MADE), 50 training steps whose losses track, greedy generate()
tokens equal, gradient checkpointing, no graph break inside a compiled decoder layer, the state_dict
and tied embeddings untouched, patching twice, pickling the whole model, an unknown model refused; DDP
and FSDP2 on two processes. Small random models (2 layers, width 64), built from configs: no download."""
import collections
import contextlib
import copy
import inspect
import os
import pickle
import subprocess
import sys

import pytest
import torch

import cuops
from conftest import DEVICES, DEVICES_CPU_IN_CI, HAS_CUDA, ROOT, rel_error, requires_cuda

transformers = pytest.importorskip("transformers", reason="transformers is the patch's optional dependency")
from cuops._hf import LOGITS_NOT_MADE  # noqa: E402  (imports transformers)

FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gemma3_text", "olmo2", "granite"]
# What cuops.patch swaps in each family (OLMo2's decoder layer normalises after the sublayers: its own
# forward around the patched norms, attention and MLP; Gemma 3's has sandwich norms).
ROLES = {f: {None, "rms_norm", "attention", "mlp", "decoder_layer", "causal_lm"} for f in FAMILIES}
ROLES["olmo2"] -= {"decoder_layer"}
ROLES["gemma2"] -= {"decoder_layer"}
ROLES["gemma3_text"] -= {"decoder_layer"}
VOCAB = 96


def tiny_config(family, tie=False, **over):
    kw = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=112, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=tie, rms_norm_eps=1e-5)
    if family in ("qwen3", "gemma", "gemma2", "gemma3_text"):
        kw["head_dim"] = 16
    if family == "gemma2":  # both softcaps live, small enough to bend the scores and the logits
        kw.update(attn_logit_softcapping=0.5, final_logit_softcapping=3.0, query_pre_attn_scalar=16,
                  sliding_window=6)
    if family in ("phi3", "olmo2"):  # their defaults name tokens of a larger vocabulary
        kw.update(pad_token_id=None, bos_token_id=1, eos_token_id=2)
    if family == "granite":  # every multiplier away from 1
        kw.update(embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=4.0)
    kw.update(over)
    return transformers.AutoConfig.for_model(family, **kw)


def twins(family, device, dtype=torch.float32, seed=0, **over):
    """(the model, a deep copy patched) from one random initialisation."""
    torch.manual_seed(seed)
    ref = transformers.AutoModelForCausalLM.from_config(tiny_config(family, **over)).to(device, dtype)
    if family in ("gemma", "gemma2", "gemma3_text", "olmo2"):  # norm weights off their init (zeros, ones): the (1 + w) and order count
        with torch.no_grad():
            for name, p in ref.named_parameters():
                if "norm" in name:
                    p.normal_(0.5, 0.3)
    return ref, cuops.patch(copy.deepcopy(ref))


def tokens(batch, t, device, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, t), generator=g).to(device)


def grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", FAMILIES)
def test_patched_model_matches_unpatched(device, family):
    """float32: eval logits, the training loss (no logits made) and every parameter's gradient to 1e-5;
    the swapped modules are subclasses of HF's, the state_dict the same tensors."""
    ref, model = twins(family, device)
    roles = {getattr(type(m), "_cuops_role", None) for m in model.modules()}
    assert roles == ROLES[family], roles
    assert isinstance(model, type(ref)) and type(model).__name__ == type(ref).__name__
    sd_ref, sd = ref.state_dict(), model.state_dict()
    assert list(sd) == list(sd_ref) and all(torch.equal(sd[k], sd_ref[k]) for k in sd)

    ids = tokens(2, 11, device)
    ref.eval(), model.eval()
    with torch.no_grad():
        assert rel_error(model(ids).logits, ref(ids).logits) <= 1e-5
    ref.train(), model.train()
    labels = ids.clone()
    labels[0, :3] = -100
    out_ref, out = ref(ids, labels=labels), model(ids, labels=labels)
    assert out.logits is LOGITS_NOT_MADE and out.loss.dtype == out_ref.loss.dtype == torch.float32
    assert rel_error(out.loss, out_ref.loss) <= 1e-5
    out_ref.loss.backward(), out.loss.backward()
    g_ref, g = grads(ref), grads(model)
    assert set(g) == set(g_ref) == {n for n, _ in ref.named_parameters()}
    for n in g:
        assert rel_error(g[n], g_ref[n]) <= 1e-4, n


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", FAMILIES)
def test_padded_batch_with_checkpointing_and_num_items(device, family):
    """A left-padded batch (its attention mask), labels ignored at the padding and elsewhere, a sum over
    num_items_in_batch (gradient accumulation's loss), gradient checkpointing on: the loss and every
    gradient as the unpatched model's (float32)."""
    ref, model = twins(family, device)
    ids = tokens(3, 12, device)
    mask = torch.ones_like(ids)
    mask[0, :4], mask[2, :1] = 0, 0
    labels = ids.masked_fill(mask == 0, -100)
    labels[1, 5:7] = -100
    n = torch.tensor(int((labels[:, 1:] != -100).sum()) + 5, device=device)  # as if a second micro-batch
    for m in (ref, model):
        m.gradient_checkpointing_enable()
        m.train()
    out_ref = ref(ids, attention_mask=mask, labels=labels, num_items_in_batch=n)
    out = model(ids, attention_mask=mask, labels=labels, num_items_in_batch=n)
    assert rel_error(out.loss, out_ref.loss) <= 1e-5
    out_ref.loss.backward(), out.loss.backward()
    g_ref, g = grads(ref), grads(model)
    assert set(g) == set(g_ref)
    for name in g:
        assert rel_error(g[name], g_ref[name]) <= 1e-4, name


@pytest.mark.parametrize("device", DEVICES)
def test_fused_loss_follows_hugging_face_loss_kwargs(device):
    """num_items_in_batch (a sum over it: gradient accumulation's loss), shift_labels given instead of
    labels, a return_dict=False tuple; eval with labels keeps the logits and HF's loss."""
    ref, model = twins("llama", device)
    ids = tokens(2, 9, device)
    labels = ids.clone()
    labels[1, 4:] = -100
    n = torch.tensor(13, device=device)
    for kw in ({"labels": labels, "num_items_in_batch": n},
               {"labels": labels, "shift_labels": torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:].contiguous()}):
        want, got = ref(ids, **kw).loss, model(ids, **kw).loss
        assert rel_error(got, want) <= 1e-5, kw.keys()
    loss, *_ = model(ids, labels=labels, return_dict=False)
    assert rel_error(loss, ref(ids, labels=labels).loss) <= 1e-5
    # shift_labels without labels: transformers makes no loss (logits as usual).
    shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:].contiguous()
    out = model(ids, shift_labels=shifted)
    assert out.loss is None and rel_error(out.logits, ref(ids, shift_labels=shifted).logits) <= 1e-5
    model.eval(), ref.eval()
    with torch.no_grad():
        out, want = model(ids, labels=labels), ref(ids, labels=labels)
    assert out.logits is not None and rel_error(out.loss, want.loss) <= 1e-5


@requires_cuda
@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_autocast_within_torchs_own_error(family):
    """Under bf16 autocast (float32 master weights, as mixed-precision training runs): the patched model's
    loss and gradients against the float32 model are within 2x (plus a floor) of what the unpatched model
    shows under the same autocast."""
    ref, model = twins(family, "cuda")
    ids = tokens(4, 64, "cuda")
    exact = ref(ids, labels=ids)
    exact.loss.backward()
    g_exact = grads(ref)
    ref.zero_grad(set_to_none=True)
    errs = {}
    for name, m in (("torch", ref), ("cuops", model)):
        with torch.autocast("cuda", torch.bfloat16):
            loss = m(ids, labels=ids).loss
        loss.backward()
        g = grads(m)
        errs[name] = [rel_error(loss, exact.loss)] + [rel_error(g[n], g_exact[n]) for n in sorted(g_exact)]
        m.zero_grad(set_to_none=True)
    for mine, theirs in zip(errs["cuops"], errs["torch"]):
        assert mine <= 2 * theirs + 2e-3, (mine, theirs)
    # Inside a patched layer: the input norm in autocast's bf16 (the fused q/k/v projection reads it);
    # the post-attention norm too where the patched MLP's swiglu reads it, float32 where HF's MLP's two
    # projections do (their gradients meet in float32 as in HF's). Where the layer runs as HF's, its
    # norms are the patched modules: no add_rms_norm.
    with norm_dtypes() as seen, torch.autocast("cuda", torch.bfloat16):
        model(ids, labels=ids)
    if "decoder_layer" not in ROLES[family]:
        assert not seen["add_rms_norm"], seen
        return
    post = torch.bfloat16 if "mlp" in ROLES[family] else torch.float32
    assert seen["rms_norm"][0] == torch.bfloat16 and seen["add_rms_norm"][0] == post, seen


@contextlib.contextmanager
def op_calls(*names):
    """{name: [the dtype each call returned, in order]} for the cuops functions `names` that cuops.patch
    calls by name (a spy on them; hooks on the modules would change what the rule decides)."""
    seen = {name: [] for name in names}
    originals = {name: getattr(cuops, name) for name in names}

    def spy(name):
        def call(*args, **kwargs):
            out = originals[name](*args, **kwargs)
            seen[name].append((out[0] if isinstance(out, tuple) else out).dtype)
            return out
        return call

    try:
        for name in names:
            setattr(cuops, name, spy(name))
        yield seen
    finally:
        for name, fn in originals.items():
            setattr(cuops, name, fn)


def norm_dtypes():
    return op_calls("rms_norm", "add_rms_norm")


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_cpu_autocast_runs_as_torch(family):
    """Under CPU autocast (cuops casts under CUDA autocast only): the patched model runs, its loss within
    bf16's error of the unpatched one's."""
    ref, model = twins(family, "cpu")
    ids = tokens(2, 12, "cpu")
    with torch.autocast("cpu", torch.bfloat16):
        got, want = model(ids, labels=ids).loss, ref(ids, labels=ids).loss
    got.backward()
    assert rel_error(got, want) <= 2e-2


def adamw_losses(models, device, steps=50, lr=3e-3):
    """Each model's losses over `steps` AdamW steps (on its parameters that need a gradient) on the same
    random tokens of a narrow vocabulary (learnable in a few steps)."""
    opts = [torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=lr) for m in models]
    gen = torch.Generator().manual_seed(5)
    losses = [[] for _ in models]
    for _ in range(steps):
        ids = torch.randint(0, VOCAB // 4, (2, 16), generator=gen).to(device)
        for i, (m, opt) in enumerate(zip(models, opts)):
            loss = m(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses[i].append(loss.item())
    return losses


@pytest.mark.parametrize("device", DEVICES_CPU_IN_CI)
@pytest.mark.parametrize("family", FAMILIES)
def test_fifty_training_steps_track_torch(device, family):
    """AdamW, 50 steps on random tokens, float32: the patched model's losses follow the unpatched one's
    (1e-3 relative each step) and fall."""
    losses = adamw_losses(twins(family, device), device)
    for step, (a, b) in enumerate(zip(*losses)):
        assert abs(a - b) <= 1e-3 * abs(a), (step, a, b)
    assert losses[1][-1] < 0.8 * losses[1][0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", ["llama", "qwen3", "phi3", "gemma", "gemma2", "gemma3_text", "olmo2", "granite"])
def test_greedy_generate_gives_the_same_tokens(device, family):
    ref, model = twins(family, device)
    ref.eval(), model.eval()
    ids = tokens(2, 5, device)
    kw = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(ids, **kw), ref.generate(ids, **kw))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_model_keeps_its_dtype_in_eval(device, family):
    """A model stored in bf16 (how inference loads one): the patched eval forward and a cached decode
    step give bf16 logits within bf16's error of the unpatched model's (OLMo2's rotation takes float32
    cos and sin and casts back to q's dtype: a promoted q would meet the bf16 output projection)."""
    ref, model = twins(family, device, torch.bfloat16)
    ref.eval(), model.eval()
    ids = tokens(2, 9, device)
    with torch.no_grad():
        got, want = model(ids, use_cache=True), ref(ids, use_cache=True)
        assert got.logits.dtype == want.logits.dtype == torch.bfloat16
        assert rel_error(got.logits, want.logits) <= 3e-2
        nxt = ids[:, -1:]
        step, step_ref = (m(nxt, past_key_values=o.past_key_values, use_cache=True).logits
                          for m, o in ((model, got), (ref, want)))
    assert step.dtype == torch.bfloat16 and rel_error(step, step_ref) <= 3e-2


@pytest.mark.parametrize("device", DEVICES)
def test_gradient_checkpointing_gives_the_same_gradients(device):
    _, model = twins("llama", device)
    ids = tokens(2, 10, device)
    model(ids, labels=ids).loss.backward()
    plain = grads(model)
    model.zero_grad(set_to_none=True)
    model.gradient_checkpointing_enable()
    model(ids, labels=ids).loss.backward()
    for n, g in grads(model).items():
        assert rel_error(g, plain[n]) <= 1e-6, n


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", ["llama", "qwen3", "phi3", "gemma", "gemma2", "gemma3_text", "olmo2", "granite"])
def test_decoder_layer_compiles_without_graph_breaks(device, family):
    """A patched decoder layer under torch.compile(fullgraph=True) (aot_eager; inductor on CUDA), forward
    and backward, equals it eager."""
    _, model = twins(family, device)
    assert_layer_compiles(model, device, ["aot_eager"] + (["inductor"] if device == "cuda" else []))


@pytest.mark.parametrize("device", DEVICES)
def test_an_exported_patched_layer_runs_the_fused_ops(device):
    """torch.export (non-strict: FakeTensor parameters while tracing) records the fused ops the layer runs
    eager -- both norms, rotary, swiglu and the down projection -- and the program equals eager."""
    _, model = twins("llama", device)
    layer, rotary = model.model.layers[0].eval(), model.model.rotary_emb
    h = torch.randn(2, 7, 64, device=device)
    cos, sin = rotary(h, torch.arange(7, device=device)[None])

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = layer

        def forward(self, h, cos, sin):
            return self.layer(h, position_embeddings=(cos, sin))

    with torch.no_grad():
        want = Layer()(h, cos, sin)
        program = torch.export.export(Layer(), (h, cos, sin))
    ops = collections.Counter(str(n.target) for n in program.graph.nodes if n.op == "call_function")
    for op in ("cuops.rms_norm.default", "cuops.add_rms_norm.default", "cuops.rotary.default",
               "cuops.swiglu.default", "cuops.linear.default"):
        assert ops[op] == 1, (op, ops)
    with torch.no_grad():
        assert rel_error(program.module()(h, cos, sin), want) <= 1e-6


def assert_layer_compiles(model, device, backends):
    """model's first decoder layer under torch.compile(fullgraph=True) with each backend: forward and
    x's gradient equal to eager."""
    layer, rotary = model.model.layers[0], model.model.rotary_emb
    h = torch.randn(2, 7, 64, device=device, requires_grad=True)
    pos = torch.arange(7, device=device)[None]
    by_type = "layer_type" in inspect.signature(rotary.forward).parameters  # Gemma 3: a rotation a layer type
    cos, sin = rotary(h, pos, model.config.layer_types[0]) if by_type else rotary(h, pos)
    out = layer(h, position_embeddings=(cos, sin), position_ids=pos)
    out.square().sum().backward()
    want = h.grad.clone()
    for backend in backends:
        torch._dynamo.reset()
        h.grad = None
        compiled = torch.compile(layer, fullgraph=True, backend=backend)
        got = compiled(h, position_embeddings=(cos, sin), position_ids=pos)
        assert rel_error(got, out) <= 1e-5
        got.square().sum().backward()
        assert rel_error(h.grad, want) <= 1e-5
    torch._dynamo.reset()


def sdpa_masks(model, *args, **kwargs):
    """(the loss of model compiled, each attention call's (attn_mask, is_causal) in dynamo's graphs)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    loss = torch.compile(model, backend=backend)(*args, **kwargs).loss
    calls = [n for g in graphs for n in g.graph.nodes if n.target is torch._C._nn.scaled_dot_product_attention]
    return loss, [(n.kwargs.get("attn_mask"), n.kwargs.get("is_causal")) for n in calls]


@pytest.mark.parametrize("device", DEVICES_CPU_IN_CI)
def test_compiled_training_forward_gives_sdpa_is_causal(device):
    """transformers materialises the causal mask under torch.compile (never skipping one while tracing);
    the patched training forward, where the mask is the plain causal one, gives sdpa is_causal and no
    mask, with the loss and gradients of the unpatched model eager. A padding mask is kept."""
    ref, model = twins("llama", device)
    ids = tokens(2, 9, device)
    _, theirs = sdpa_masks(ref, ids, labels=ids)
    assert theirs and all(mask is not None for mask, _ in theirs)  # the premise: HF's compiled graph
    loss, mine = sdpa_masks(model, ids, labels=ids)
    assert len(mine) == len(theirs) and all(mask is None and causal for mask, causal in mine), mine
    out_ref = ref(ids, labels=ids)
    assert rel_error(loss, out_ref.loss) <= 1e-5
    loss.backward(), out_ref.loss.backward()
    g_ref, g = grads(ref), grads(model)
    for n in g_ref:
        assert rel_error(g[n], g_ref[n]) <= 1e-4, n
    pad = torch.ones_like(ids)
    pad[0, :2] = 0
    loss, mine = sdpa_masks(model, ids, attention_mask=pad, labels=ids)
    assert mine and all(mask is not None for mask, _ in mine)
    assert rel_error(loss, ref(ids, attention_mask=pad, labels=ids).loss) <= 1e-5
    # Positions given (packed sequences restart them): the mask is kept.
    pos = torch.cat([torch.arange(5), torch.arange(4)]).to(device)[None].expand(2, 9)
    loss, mine = sdpa_masks(model, ids, position_ids=pos, labels=ids)
    assert mine and all(mask is not None for mask, _ in mine)
    assert rel_error(loss, ref(ids, position_ids=pos, labels=ids).loss) <= 1e-5
    torch._dynamo.reset()


@pytest.mark.parametrize("device", DEVICES)
def test_a_sliding_window_shorter_than_the_sequence_keeps_the_mask(device):
    """Mistral with a 4-token window over 9 tokens: the mask is not the plain causal one; it is kept,
    and the compiled patched loss is HF's; a window of 16 over 9 tokens is plain causal again."""
    ref, model = twins("mistral", device, sliding_window=4)
    ids = tokens(2, 9, device)
    loss, mine = sdpa_masks(model, ids, labels=ids)
    assert mine and all(mask is not None for mask, _ in mine)
    assert rel_error(loss, ref(ids, labels=ids).loss) <= 1e-5
    _, model = twins("mistral", device, sliding_window=16)
    _, mine = sdpa_masks(model, ids, labels=ids)
    assert mine and all(mask is None and causal for mask, causal in mine)
    torch._dynamo.reset()


@pytest.mark.parametrize("device", DEVICES)
def test_phi3_partial_rotation_and_residual_dropout_run_as_their_modules(device):
    """Phi-3's parts the fused ops do not compute run as HF's: attention with partial_rotary_factor < 1 (the
    rotation covers part of each head), and a decoder layer whose residual dropout is live (training,
    resid_pdrop > 0; the same masks drawn, so the same loss); in eval the dropout is off and the layer
    patched. Loss and every gradient to 1e-5 / 1e-4; the report says which."""
    for over, note in (({"partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5"), ({"resid_pdrop": 0.2}, None)):
        ref, model = twins("phi3", device, **over)
        if note is not None:
            assert any(why is not None and note in why for _, _, why in cuops.patch_report(model).rows)
        ids = tokens(2, 11, device)
        losses = []
        for m in (ref, model):
            torch.manual_seed(3)
            loss = m(ids, labels=ids).loss
            loss.backward()
            losses.append(loss)
        assert rel_error(losses[1], losses[0]) <= 1e-5, over
        g_ref, g = grads(ref), grads(model)
        for n in g_ref:
            assert rel_error(g[n], g_ref[n]) <= 1e-4, (over, n)
        ref.eval(), model.eval()
        with torch.no_grad(), op_calls("add_rms_norm") as seen:
            assert rel_error(model(ids).logits, ref(ids).logits) <= 1e-5
        assert len(seen["add_rms_norm"]) == 2, over  # both layers patched in eval


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", ["gemma2", "gemma3_text"])
def test_a_softcapped_gemma_computes_its_loss_with_the_cap(device, family):
    """Gemma 2 / 3 with final_logit_softcapping (c tanh(z / c) on the logits, a small c so it bends them):
    the fused loss takes the cap inside the op (no logits made); loss and every gradient as unpatched."""
    ref, model = twins(family, device, final_logit_softcapping=0.7)
    assert dict((n, w) for n, _, w in cuops.patch_report(model).rows)["lm_head"] is None
    ids = tokens(2, 11, device)
    with op_calls("linear_cross_entropy") as seen:
        out = model(ids, labels=ids)
    out_ref = ref(ids, labels=ids)
    assert len(seen["linear_cross_entropy"]) == 1 and out.logits is LOGITS_NOT_MADE
    assert rel_error(out.loss, out_ref.loss) <= 1e-5
    uncapped = twins(family, device, final_logit_softcapping=None)[0](ids, labels=ids).loss
    assert abs(uncapped.item() - out_ref.loss.item()) > 1e-3  # the cap changes the loss
    out_ref.loss.backward(), out.loss.backward()
    g_ref, g = grads(ref), grads(model)
    for n in g_ref:
        assert rel_error(g[n], g_ref[n]) <= 1e-4, n


@pytest.mark.parametrize("device", DEVICES)
def test_tied_embeddings_stay_tied_and_patching_twice_changes_nothing(device):
    ref, model = twins("qwen2", device, tie=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    classes = [type(m) for m in model.modules()]
    assert cuops.patch(model) is model and [type(m) for m in model.modules()] == classes
    ids = tokens(1, 6, device)
    model(ids, labels=ids).loss.backward()
    assert model.lm_head.weight.grad is model.model.embed_tokens.weight.grad


def test_a_pickled_patched_model_loads_patched(tmp_path):
    """The whole patched model pickled (torch.save) or deep-copied: its subclasses are made at run time,
    so each patched module pickles as its transformers class and its role and is patched again on
    load, in this process and in a fresh one that never called cuops.patch; the outputs are the same."""
    ref, model = twins("qwen3", "cpu")
    model.eval()
    ids = tokens(2, 7, "cpu")
    with torch.no_grad():
        want = model(ids).logits
        for loaded in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
            assert [type(m) for m in loaded.modules()] == [type(m) for m in model.modules()]
            assert torch.equal(loaded(ids).logits, want)
    torch.save({"model": model, "ids": ids, "want": want}, tmp_path / "saved.pt")
    code = (
        "import torch\n"
        "saved = torch.load('saved.pt', weights_only=False)\n"
        "model = saved['model']\n"
        "roles = sorted({type(m)._cuops_role for m in model.modules() if getattr(type(m), '_cuops_patched', False)})\n"
        "assert roles == ['attention', 'causal_lm', 'decoder_layer', 'mlp', 'rms_norm'], roles\n"
        "with torch.no_grad():\n"
        "    assert torch.equal(model(saved['ids']).logits, saved['want'])\n"
        "import cuops\n"
        "assert cuops.patch(model) is model\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "python"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("device", DEVICES)
def test_a_wrapped_projection_is_called_not_bypassed(device):
    """In training the patch projects q, k and v in one product of the three weights, but only where each
    is a plain nn.Linear: a projection wrapped by something else (an adapter) runs as its module."""

    class Doubled(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return 2 * self.inner(x)

    ref, model = twins("llama", device)
    for m in (ref, model):
        attn = m.model.layers[1].self_attn
        attn.k_proj = Doubled(attn.k_proj)  # a wrapper module
        m.model.layers[0].self_attn.v_proj.register_forward_hook(lambda mod, a, out: 3 * out)  # a hook
    ids = tokens(2, 9, device)
    out_ref, out = ref(ids, labels=ids), model(ids, labels=ids)
    assert rel_error(out.loss, out_ref.loss) <= 1e-5
    out_ref.loss.backward(), out.loss.backward()
    g_ref, g = grads(ref), grads(model)
    for n in g_ref:
        assert rel_error(g[n], g_ref[n]) <= 1e-4, n


@requires_cuda
def test_input_norm_dtype_follows_its_readers():
    """Under CUDA autocast the input norm comes out bf16 where one GEMM reads it (the fused projection,
    training) or no gradient comes back (no_grad); float32 where three projections' gradients return (eval
    with gradients, or a projection the patch leaves as a module), so they meet in float32 as in HF."""
    _, model = twins("llama", "cuda")
    layer = model.model.layers[0]
    ids = tokens(2, 9, "cuda")

    def run():  # the first layer's input norm's dtype
        with norm_dtypes() as seen, torch.autocast("cuda", torch.bfloat16):
            model(ids)
        return seen["rms_norm"][0]

    assert run() == torch.bfloat16  # training: the fused projection
    model.eval()
    assert run() == torch.float32  # eval, gradients on: three projections
    with torch.no_grad():
        assert run() == torch.bfloat16
    model.train()
    layer.self_attn.q_proj.register_forward_hook(lambda mod, a, out: None)
    assert run() == torch.float32  # a hooked projection runs as its module
    with torch.no_grad():
        assert run() == torch.float32  # ... and sees HF's float32 input without gradients too


def test_unknown_models_are_refused():
    with pytest.raises(TypeError, match=r"cuops.patch: expected a Hugging Face model of the Llama family "
                                        r"\(LlamaForCausalLM / LlamaModel, .*got torch.nn.modules.linear.Linear"):
        cuops.patch(torch.nn.Linear(2, 2))
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32))
    with pytest.raises(TypeError, match=r"got transformers.models.gpt2.modeling_gpt2.GPT2LMHeadModel"):
        cuops.patch(gpt2)


def test_mlp_with_bias_runs_as_its_module():
    ref, model = twins("llama", "cpu", mlp_bias=True)
    assert type(model.model.layers[0])._cuops_role == "decoder_layer"
    mlps = [(n, why) for n, what, why in cuops.patch_report(model).rows if what == "swiglu + linear"]
    assert len(mlps) == 2 and all(why == "a projection with a bias" for _, why in mlps), mlps
    ids = tokens(2, 7, "cpu")
    assert rel_error(model(ids, labels=ids).loss, ref(ids, labels=ids).loss) <= 1e-5


@pytest.mark.parametrize("act, patched", [("gelu_pytorch_tanh", True), ("gelu", False), ("relu", False)])
def test_mlp_gate_follows_the_config_activation(act, patched):
    """A Llama with another hidden_act: gelu_pytorch_tanh (F.gelu's tanh form) is swiglu's gelu_tanh gate;
    exact gelu or relu have none, and the MLP runs as its module (the report says why). Loss and
    every gradient as the unpatched model's either way."""
    ref, model = twins("llama", "cpu", hidden_act=act)
    assert (getattr(type(model.model.layers[0].mlp), "_cuops_role", None) == "mlp") == patched
    mlps = [why for _, what, why in cuops.patch_report(model).rows if what == "swiglu + linear"]
    assert len(mlps) == 2 and all((why is None) == patched for why in mlps), mlps
    ids = tokens(2, 7, "cpu")
    with op_calls("swiglu") as seen:
        got = model(ids, labels=ids).loss
    assert len(seen["swiglu"]) == (2 if patched else 0)
    want = ref(ids, labels=ids).loss
    assert rel_error(got, want) <= 1e-5
    got.backward(), want.backward()
    g_ref = grads(ref)
    for n, g in grads(model).items():
        assert rel_error(g, g_ref[n]) <= 1e-4, n


def check_distributed(rank, world, port, device, backend, wrap):
    """Two processes, each on half the batch, wrap = "ddp" (DistributedDataParallel around the patched
    model) or "fsdp2" (fully_shard on each decoder layer, then the model): three steps, the mean
    of the ranks' losses at each step and every parameter after the last equal to one process's
    patched model on the whole batch (float32, 1e-5); SGD steps."""
    from test_dtensor import assert_same, join, teardown
    dev = join(rank, world, port, device, backend)
    try:
        import torch.distributed as dist
        ref, model = twins("llama", dev)
        ref = cuops.patch(ref)  # the reference: patched too, one process, the whole batch
        if wrap == "ddp":
            from torch.nn.parallel import DistributedDataParallel
            model = DistributedDataParallel(model)
        else:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard
            mesh = init_device_mesh(dev.type, (world,))
            for layer in model.model.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
        # SGD: parameters move with the gradients linearly (Adam's first steps scale a rare token's
        # embedding gradient of ~1e-8 to a full step, so its float32 rounding showed as 1e-4 there).
        opts = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (ref, model)]
        gen = torch.Generator().manual_seed(7)
        batch, mine = 4, slice(rank * 2, rank * 2 + 2)
        for step in range(3):
            ids = torch.randint(0, VOCAB, (batch, 12), generator=gen).to(dev)
            step_losses = []
            for m, opt, rows in ((ref, opts[0], slice(None)), (model, opts[1], mine)):
                loss = m(ids[rows], labels=ids[rows]).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                step_losses.append(loss.detach())
            mean = step_losses[1].clone()
            dist.all_reduce(mean)
            # Each rank's loss is a mean over its own tokens (all counted: no ignored labels but the
            # last position, the same number a rank), so the ranks' mean is the whole batch's.
            assert_same(mean / world, step_losses[0], f"mean loss of step {step}")
        inner = model.module if wrap == "ddp" else model
        for (name, p_ref), (_, p) in zip(ref.named_parameters(), inner.named_parameters()):
            assert_same(p.detach(), p_ref.detach(), f"{name} after 3 steps")
    finally:
        teardown()


@pytest.mark.parametrize("wrap", ["ddp", "fsdp2"])
def test_patched_model_trains_under_ddp_and_fsdp2(wrap):
    """On two gloo CPU processes (CI's place; the CUDA kernels under it are the single-process tests')."""
    from test_dtensor import spawn
    spawn(check_distributed, 2, "cpu", "gloo", wrap)
