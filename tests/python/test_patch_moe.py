"""cuops.patch on Hugging Face's mixtures of experts (Mixtral, Qwen2-MoE with its shared expert, Qwen3-MoE with a
dense layer among its sparse ones, OLMoE with its own attention): patched against unpatched in float32 -- eval
logits, the training loss with the routers' load-balancing loss, every gradient (the routers' too), greedy
generate(); the experts module runs as its own where moe_experts would compute something else (hooks, a
registered implementation); a compiled MoE decoder layer without graph breaks. Small random models from
configs: no download."""
import copy

import pytest
import torch

import cuops
from conftest import DEVICES, DEVICES_CPU_IN_CI, rel_error

transformers = pytest.importorskip("transformers", reason="transformers is the patch's optional dependency")
from cuops._hf import LOGITS_NOT_MADE  # noqa: E402  (imports transformers)
from test_patch import assert_layer_compiles, grads, tokens  # noqa: E402  (the dense families' helpers)

FAMILIES = ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe"]
VOCAB = 96  # test_patch's tokens() draws below it


def tiny_config(family, **over):
    kw = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False, rms_norm_eps=1e-5,
              num_experts_per_tok=2, router_aux_loss_coef=0.02)
    if family == "mixtral":
        kw.update(num_local_experts=6)
    else:
        kw.update(num_experts=8, moe_intermediate_size=32)
    if family == "qwen2_moe":
        kw.update(shared_expert_intermediate_size=40, qkv_bias=True)
    if family == "qwen3_moe":
        kw.update(head_dim=16, mlp_only_layers=[1], norm_topk_prob=True)
    kw.update(over)
    return transformers.AutoConfig.for_model(family, **kw)


def twins(family, device, seed=0, **over):
    """(the model, a deep copy patched) from one random initialisation; the experts' weights drawn at the
    scale of the dense layers' (transformers leaves empty 3-D parameters to the checkpoint)."""
    torch.manual_seed(seed)
    ref = transformers.AutoModelForCausalLM.from_config(tiny_config(family, **over)).to(device)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.endswith(("gate_up_proj", "down_proj")) and p.dim() == 3:
                p.normal_(0, 0.1)
    return ref, cuops.patch(copy.deepcopy(ref))


@pytest.mark.parametrize("device", DEVICES_CPU_IN_CI)
@pytest.mark.parametrize("family", FAMILIES)
def test_patched_moe_model_matches_unpatched(device, family):
    """float32: eval logits; the training loss with the load-balancing loss added (no logits made), aux_loss
    and the routers' logits; every parameter's gradient, the routers' and experts' included."""
    ref, model = twins(family, device)
    roles = {getattr(type(m), "_cuops_role", None) for m in model.modules()}
    want = {None, "rms_norm", "decoder_layer", "experts", "causal_lm"} | (
        {"attention"} if family != "olmoe" else set()) | ({"mlp"} if family in ("qwen2_moe", "qwen3_moe") else set())
    assert roles == want, roles
    assert all(why is None for _, what, why in cuops.patch_report(model).rows if what == "moe_experts")
    ids = tokens(2, 11, device)
    ref.eval(), model.eval()
    with torch.no_grad():
        assert rel_error(model(ids).logits, ref(ids).logits) <= 1e-5
    ref.train(), model.train()
    labels = ids.clone()
    labels[0, :3] = -100
    out_ref = ref(ids, labels=labels, output_router_logits=True)
    out = model(ids, labels=labels, output_router_logits=True)
    assert out.logits is LOGITS_NOT_MADE
    assert rel_error(out.aux_loss, out_ref.aux_loss) <= 1e-5
    assert len(out.router_logits) == len(out_ref.router_logits)
    for got, want_logits in zip(out.router_logits, out_ref.router_logits):
        assert rel_error(got, want_logits) <= 1e-5
    assert rel_error(out.loss, out_ref.loss) <= 1e-5
    out_ref.loss.backward(), out.loss.backward()
    g_ref, g = grads(ref), grads(model)
    assert set(g) == set(g_ref) == {n for n, _ in ref.named_parameters()}
    for n in g:
        assert rel_error(g[n], g_ref[n]) <= 1e-4, n


@pytest.mark.parametrize("device", DEVICES_CPU_IN_CI)
@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_greedy_generate_gives_the_same_tokens(device, family):
    ref, model = twins(family, device)
    ref.eval(), model.eval()
    ids = tokens(2, 5, device)
    kw = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(ids, **kw), ref.generate(ids, **kw))


@pytest.mark.parametrize("device", DEVICES)
def test_experts_with_hooks_or_a_registered_implementation_run_as_their_module(device):
    """A hook on an experts module, or an implementation registered through transformers' ExpertsInterface,
    could compute anything: the module runs (the report says why), and the hook fires."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    ref, model = twins("qwen3_moe", device)
    experts = model.model.layers[0].mlp.experts
    seen = []
    handle = experts.register_forward_hook(lambda m, args, out: seen.append(out.shape))
    ids = tokens(1, 7, device)
    model.eval(), ref.eval()
    with torch.no_grad():
        assert rel_error(model(ids).logits, ref(ids).logits) <= 1e-5
    assert seen == [(7, 64)]
    rows = {name: why for name, what, why in cuops.patch_report(model).rows if what == "moe_experts"}
    assert rows["model.layers.0.mlp.experts"] == "hooks on the module"
    handle.remove()

    calls = []

    def doubled(self, hidden_states, top_k_index, top_k_weights):
        calls.append(1)
        return 2 * ALL_EXPERTS_FUNCTIONS["grouped_mm"](self, hidden_states, top_k_index, top_k_weights)

    ALL_EXPERTS_FUNCTIONS.register("cuops_test_doubled", doubled)
    for m in (model, ref):
        m.config._experts_implementation = "cuops_test_doubled"
    with torch.no_grad():
        assert rel_error(model(ids).logits, ref(ids).logits) <= 1e-5
    assert len(calls) == 2  # the patched model's and the reference's
    assert "cuops_test_doubled" in rows_why(model)


def rows_why(model):
    return " ".join(why or "" for _, what, why in cuops.patch_report(model).rows if what == "moe_experts")


@pytest.mark.parametrize("device", DEVICES_CPU_IN_CI)
@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_moe_decoder_layer_compiles_without_graph_breaks(device, family):
    """A patched MoE decoder layer (HF's router, cuops.moe_experts) under torch.compile(fullgraph=True)
    (aot_eager, test_patch's check), forward and x's gradient equal to eager."""
    _, model = twins(family, device)
    assert_layer_compiles(model, device, ["aot_eager"])
