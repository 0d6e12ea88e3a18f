"""Writes what the C++ demo and C++ tests load to prove Python -> C++ round trips:
  model.pt          a TorchScript module using cuops ops (scripted and saved here),
  model_<dev>.pt2   an AOTInductor package of the same module (torch.export + aoti_compile_and_package),
  io_<dev>.pt       its inputs and this process's outputs, in a scripted holder C++ can torch::jit::load;
  fused_<dev>.pt2, io_fused_<dev>.pt   the same for a model of the fused ops (linear with bias and
                    gelu_tanh, then swiglu, then an LM head's linear_cross_entropy; bf16 on CUDA, where
                    the fused GEMM epilogues run);
  decoder_<dev>.pt2, io_decoder_<dev>.pt   a transformers LlamaDecoderLayer put on cuops by cuops.patch
                    (rms_norm, rotary, attention, add_rms_norm, swiglu, linear; a small random config;
                    bf16 on CUDA), called on hidden states, cos and sin.
Usage: python make_artifacts.py [OUT_DIR]   (default: artifacts/ beside the library; cpu always, cuda too
when a GPU is visible)."""
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The package is the one place that finds the library ($CUOPS_LIBRARY, $CUOPS_BUILD_DIR, build/).
sys.path.insert(0, str(ROOT / "python"))
import cuops  # noqa: E402,F401


class Model(torch.nn.Module):
    """Every tensor op of cuops, gemm and add2 included."""

    def forward(self, a: torch.Tensor, b: torch.Tensor, w: torch.Tensor):
        c = torch.empty_like(a)
        torch.ops.cuops.add2(c, a, b)
        h = torch.ops.cuops.mm(torch.ops.cuops.square(torch.ops.cuops.vector_add(c, b)), w)
        g = torch.empty([h.shape[0], w.shape[1]], dtype=h.dtype, device=h.device)
        torch.ops.cuops.gemm(g, torch.ops.cuops.scale(h, 0.25), w, 1.0, 0.0)
        return g, torch.ops.cuops.two_norm(g, h)


class FusedModel(torch.nn.Module):
    """The fused ops: linear's bias and activation, swiglu's gated product, and the loss of an LM head
    over it (ignore_index -100 on one token): the MLP's output and the loss."""

    def forward(self, x, w, b, w_gate, w_up, w_head, target):
        h = torch.ops.cuops.swiglu(torch.ops.cuops.linear(x, w, b, "gelu_tanh"), w_gate, w_up)
        return h, torch.ops.cuops.linear_cross_entropy(h, w_head, target, None, -100, "mean")


class DecoderLayer(torch.nn.Module):
    """One patched Llama decoder layer (causal self-attention over the whole sequence, no cache)."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, h, cos, sin):
        return self.layer(h, position_embeddings=(cos, sin))


def patched_decoder_layer(dev, dtype):
    """A cuops.patch'ed LlamaDecoderLayer of a small random config, its rotary embedding, in dtype."""
    import transformers
    torch.manual_seed(11)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = cuops.patch(transformers.LlamaForCausalLM(cfg)).to(dev, dtype).eval()
    return DecoderLayer(model.model.layers[0]), model.model.rotary_emb


class Holder(torch.nn.Module):
    def __init__(self, tensors):
        super().__init__()
        for name, t in tensors.items():
            self.register_buffer(name, t)


def main(out):
    out.mkdir(parents=True, exist_ok=True)
    torch.jit.script(Model()).save(str(out / "model.pt"))
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for dev in devices:
        gen = torch.Generator().manual_seed(7)
        a, b, w = (torch.randn(s, generator=gen).to(dev) for s in [(16, 8), (16, 8), (8, 8)])
        g, norm = Model()(a, b, w)
        torch.jit.script(Holder({"a": a, "b": b, "w": w, "g": g, "norm": norm})).save(str(out / f"io_{dev}.pt"))
        program = torch.export.export(Model(), (a, b, w))
        torch._inductor.aoti_compile_and_package(program, package_path=str(out / f"model_{dev}.pt2"))
        # 64 rows, K and N whole 16 bytes: on an H100 both ops run as single fused kernels.
        dtype = torch.bfloat16 if dev == "cuda" else torch.float32
        args = tuple((torch.randn(s, generator=gen) / s[-1] ** 0.5).to(dev, dtype)
                     for s in [(64, 32), (48, 32), (48,), (40, 48), (40, 48), (100, 40)])
        target = torch.randint(0, 100, (64,), generator=gen)
        target[5] = -100
        args += (target.to(dev),)
        y, loss = FusedModel()(*args)
        torch.jit.script(Holder({**{f"arg{i}": t for i, t in enumerate(args)}, "y": y, "loss": loss})).save(
            str(out / f"io_fused_{dev}.pt"))
        torch._inductor.aoti_compile_and_package(torch.export.export(FusedModel(), args),
                                                 package_path=str(out / f"fused_{dev}.pt2"))
        layer, rotary = patched_decoder_layer(dev, dtype)
        h = torch.randn(2, 24, 128, generator=gen).to(dev, dtype)
        cos, sin = rotary(h, torch.arange(24, device=dev)[None])
        with torch.no_grad():
            y = layer(h, cos, sin)
            torch.jit.script(Holder({"h": h, "cos": cos, "sin": sin, "y": y})).save(str(out / f"io_decoder_{dev}.pt"))
            torch._inductor.aoti_compile_and_package(torch.export.export(layer, (h, cos, sin)),
                                                     package_path=str(out / f"decoder_{dev}.pt2"))
        print(f"wrote {out}/model.pt, model_{dev}.pt2, io_{dev}.pt, fused_{dev}.pt2, io_fused_{dev}.pt, "
              f"decoder_{dev}.pt2, io_decoder_{dev}.pt")


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else pathlib.Path(cuops.library_path).parent / "artifacts")
