"""What a section is handed: the sizes it runs at, the harness, and the results it adds to."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .harness import GRAPH_ROUNDS, Bench, CopyCeiling
from .llama_model import LlamaConfig
from .shapes import DECODE_M, LARGE_M, MID_M, MODELS

SHAPE_CLASSES = ("decode", "mid", "training", "large")
# The shape suite's dtype variants: (dtype, float32 matmul precision). "float32" is true FP32.
SHAPE_VARIANTS = {"bfloat16": ("bfloat16", None), "float16": ("float16", None), "tf32": ("float32", "high"),
                  "float32": ("float32", "highest"), "float64": ("float64", None)}
SHAPE_COMPILE = ("none", "decode1", "decode")
# The square-GEMM section's variants, in its order (names as SHAPE_VARIANTS).
GEMM_VARIANTS = ("float32", "tf32", "bfloat16", "float16", "float64")


@dataclass(frozen=True)
class ShapeSuite:
    """The gemm_shapes section's rows: which models, classes, dtype variants and token counts; the
    --shapes-* flags narrow it."""
    models: tuple = tuple(MODELS)
    classes: tuple = SHAPE_CLASSES
    variants: tuple = tuple(SHAPE_VARIANTS)
    # The compiled F.linear baseline at decode: "decode1" M = 1 and 16, "decode" every M <= 16. Each
    # shape is one max-autotune compile (seconds to tens of seconds on a GPU), hence the switch.
    compile: str = "decode1"
    compile_mode: str = "max-autotune-no-cudagraphs"
    tokens: tuple = DECODE_M + MID_M + LARGE_M
    scale: int = 1                 # every Linear's features divided by this (cpu: tiny shapes)
    rounds: int = GRAPH_ROUNDS     # steady-state rounds a side at decode


@dataclass(frozen=True)
class LlamaBench:
    """The llama section: the model, the prefill length, the decode prompt and steps, the batches."""
    model: LlamaConfig = LlamaConfig()
    prefill_tokens: int = 4096
    # Decode starts after a prompt this long; the KV cache holds prompt + steps positions, so attention
    # (the same in both models) stays a small part of a step and the ratio measures the Linears.
    prompt: int = 128
    steps: int = 64
    batches: tuple = (1, 8)
    rounds: int = GRAPH_ROUNDS


@dataclass(frozen=True)
class GptTrainBench:
    """The gpt_train section: the GPT-style decoder of the training-shape issue (8 layers, width 1024,
    8 x 1024 tokens; shapes.py's gpt-1024 Linears plus a vocabulary head), its timing and loss check."""
    layers: int = 8
    width: int = 1024
    heads: int = 16
    ffn: int = 4096
    vocab: int = 32768
    batch: int = 8
    seq: int = 1024
    steps: int = 10        # back-to-back steps a timed round
    rounds: int = 6        # rounds a side, alternating
    loss_steps: int = 20   # steps from the common start whose losses are compared
    modes: tuple = ("eager", "compile")
    lr: float = 3e-4
    seed: int = 0
    autocast: bool = True  # bf16 autocast (cuops registers AutocastCUDA only: the cpu run is float32)


@dataclass(frozen=True)
class FusedBench:
    """The fused section: (model, K, N) MLP shapes (GPT-2's c_fc; the width-2048 Llama of the end-to-end
    rows; Llama-3-8B), tokens 512-16384 and decode, bf16; spot rows (model, tokens, dtype, float32
    precision) in the other dtypes; sides alternating over `rounds`; compiled: the torch.compile side."""
    models: tuple = (("gpt2", 768, 3072), ("llama-2048", 2048, 5632), ("llama3-8b", 4096, 14336))
    tokens: tuple = (512, 2048, 8192, 16384)
    decode: tuple = (1, 8)
    spots: tuple = (("llama-2048", 8192, "float16", None), ("llama-2048", 8192, "float32", "high"))
    rounds: int = 3
    compiled: bool = True


@dataclass(frozen=True)
class CrossEntropyBench:
    """The cross_entropy section: (T, K, V) LM heads (Llama-2-style V = 32000, Llama-3's 128256, and a
    262144 vocabulary), forward + backward, sides alternating over `rounds`; compiled: the
    torch.compile side."""
    shapes: tuple = ((8192, 2048, 32000), (8192, 2048, 128256), (8192, 4096, 32000), (8192, 4096, 128256),
                     (8192, 2048, 262144))
    rounds: int = 3
    compiled: bool = True


@dataclass(frozen=True)
class RmsNormBench:
    """The rms_norm section: (rows, D) of model widths (tokens x hidden) and a q/k norm (tokens x heads
    x 128); rotary's (batch, tokens, q heads, k heads, head dim), issue 50's Llama; mixes: bfloat16,
    or autocast's (a bf16 x beside a float32 residual stream and weight; bf16 q and k beside float32
    cos and sin); sides alternating over `rounds`; compiled: the torch.compile side."""
    shapes: tuple = ((8192, 2048), (8192, 4096), (16384, 4096), (131072, 128))
    rotary: tuple = (8, 1024, 16, 4, 128)
    mixes: tuple = ("bfloat16", "auto")
    rounds: int = 3
    compiled: bool = True


@dataclass(frozen=True)
class HfLlamaBench:
    """The hf_llama section: transformers' LlamaForCausalLM (issue 50's model) unpatched and patched:
    the training step's batch, timing and loss check; decode's batches and fixed KV length; prefill.
    model_type: another family cuops.patch takes (phi3, qwen3, ...) at the same shape (--hf-model-type)."""
    model_type: str = "llama"
    layers: int = 8
    hidden: int = 2048
    ffn: int = 5632
    heads: int = 16
    kv_heads: int = 4
    vocab: int = 128256
    batch: int = 8
    seq: int = 1024
    steps: int = 3          # back-to-back steps a timed round
    rounds: int = 5         # rounds a variant, alternating
    warmup: int = 3         # steps before timing (compiles the compiled variants)
    loss_steps: int = 50    # eager steps from the common start whose losses are compared
    batches: int = 64       # distinct random batches, cycled
    modes: tuple = ("eager", "compile")
    lr: float = 1e-4
    decode_batches: tuple = (1, 8)
    kv: int = 512
    decode_steps: int = 32
    prefill_tokens: int = 2048
    seed: int = 0


@dataclass(frozen=True)
class HfLoraBench(HfLlamaBench):
    """The hf_lora section (SPEC §3 "Adapters"): PEFT LoRA on transformers' LlamaForCausalLM, the training
    step of each model shape (name, layers, width, FFN, heads, kv heads: hf_llama's model and a
    Llama-3-8B-shaped one of 4 layers) at each adapter dropout, the base frozen, AdamW on the adapters."""
    shapes: tuple = (("llama", 8, 2048, 5632, 16, 4), ("llama3-8b/4", 4, 4096, 14336, 32, 8))
    r: int = 16
    alpha: int = 32
    targets: tuple = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    dropouts: tuple = (0.0, 0.05)
    lr: float = 1e-3


@dataclass(frozen=True)
class MoeBench:
    """The moe section (SPEC §3 "Mixture of experts"): grouped GEMM shapes (name, experts, top-k, K, N: the
    gate/up and down products of Qwen3-30B-A3B's layer, 64 experts as the issue measured, and a Mixtral
    shape) over batch x seq tokens; model shapes (name, (family, layers, width, experts, top-k, expert FFN,
    heads, kv heads)); the training step's variants; decode batches over a fixed KV length."""
    grouped_shapes: tuple = (("qwen3-30b-a3b gate_up", 128, 8, 2048, 1536), ("qwen3-30b-a3b down", 128, 8, 768, 2048),
                             ("qwen3-moe/64 gate_up", 64, 8, 2048, 1536), ("mixtral gate_up", 8, 2, 4096, 28672),
                             ("mixtral down", 8, 2, 14336, 4096))
    routings: tuple = ("balanced", "skewed")
    model_shapes: tuple = (("qwen3-30b-a3b/4", ("qwen3_moe", 4, 2048, 128, 8, 768, 16, 4)),
                           ("mixtral-shaped/4", ("mixtral", 4, 2048, 8, 2, 7168, 16, 8)))
    models: tuple = ("qwen3-30b-a3b/4", "mixtral-shaped/4")
    variants: tuple = ("hf fp32", "hf bf16", "liger fp32", "patch fp32", "patch bf16", "patch fp32 compile")
    vocab: int = 32000
    batch: int = 8
    seq: int = 1024
    steps: int = 3
    rounds: int = 5
    warmup: int = 3
    lr: float = 1e-4
    decode_batches: tuple = (1, 8)
    # The experts alone at decode (name, experts, top-k, H, I): Qwen3-30B-A3B's layer and Mixtral's.
    decode_shapes: tuple = (("qwen3-30b-a3b", 128, 8, 2048, 768), ("mixtral", 8, 2, 4096, 14336))
    kv: int = 512
    decode_steps: int = 32
    seed: int = 0


@dataclass
class Config:
    sizes: list          # elements per operand of the memory-bound rows
    gemm_squares: list   # M = K = N
    gemm_odd: list       # (M, K, N)
    gemm_variants: tuple = GEMM_VARIANTS
    shapes: ShapeSuite = field(default_factory=ShapeSuite)
    llama: LlamaBench = field(default_factory=LlamaBench)
    gpt_train: GptTrainBench = field(default_factory=GptTrainBench)
    fused: FusedBench = field(default_factory=FusedBench)
    cross_entropy: CrossEntropyBench = field(default_factory=CrossEntropyBench)
    rms_norm: RmsNormBench = field(default_factory=RmsNormBench)
    hf_llama: HfLlamaBench = field(default_factory=HfLlamaBench)
    hf_lora: HfLoraBench = field(default_factory=HfLoraBench)
    moe: MoeBench = field(default_factory=MoeBench)


FULL = Config(sizes=[2**16, 2**20, 2**24, 2**28, 2**30],
              gemm_squares=[256, 512, 1024, 2048, 4096, 8192],
              gemm_odd=[(4097, 4097, 4097), (1, 4096, 4096), (4096, 4096, 1), (8192, 1, 8192), (1000, 1000, 1000)])
QUICK = Config(sizes=[2**16, 2**24], gemm_squares=[256, 1024], gemm_odd=[(1000, 1000, 1000), (1, 4096, 4096)],
               shapes=ShapeSuite(tokens=(1, 16, 512, 4096)),
               llama=LlamaBench(model=LlamaConfig(layers=2), prefill_tokens=1024, steps=16))
# The cpu smoke run goes through every code path at sizes that take seconds: GPT-2's Linears divided
# by 8, one half type and TF32; a two-layer model of width 64 without CUDA graphs.
CPU = Config(sizes=[2**10, 2**14], gemm_squares=[32, 64], gemm_odd=[(33, 17, 9), (1, 64, 64), (64, 64, 1), (64, 1, 64)],
             # The compiled baseline in inductor's default mode: the path is the same, and max-autotune's C++
             # GEMM templates take 15 s to build on a cold cache there.
             shapes=ShapeSuite(models=("gpt-2",), variants=("bfloat16", "tf32"), tokens=(1, 128), scale=8,
                               rounds=2, compile_mode="default"),
             llama=LlamaBench(model=LlamaConfig(layers=2, hidden=64, heads=4, kv_heads=2, ffn=224, vocab=128),
                              prefill_tokens=16, prompt=8, steps=4, batches=(1, 8), rounds=2),
             # eager only: inductor's C++ build of a training graph takes minutes on CI's 2 cores
             gpt_train=GptTrainBench(layers=2, width=64, heads=4, ffn=256, vocab=128, batch=2, seq=16, steps=2,
                                     rounds=2, loss_steps=3, modes=("eager",), autocast=False),
             # float32 (the cpu has no half GEMMs worth timing), no compiled side (inductor's C++ build)
             fused=FusedBench(models=(("tiny", 64, 224),), tokens=(32,), decode=(1,), spots=(), rounds=1,
                              compiled=False),
             cross_entropy=CrossEntropyBench(shapes=((64, 32, 500),), rounds=1, compiled=False),
             rms_norm=RmsNormBench(shapes=((64, 256),), rotary=(2, 16, 4, 2, 32), mixes=("float32",), rounds=1,
                                   compiled=False),
             # float32 eager only (inductor's C++ build of a training graph takes minutes on CI's 2 cores)
             hf_llama=HfLlamaBench(layers=2, hidden=64, ffn=112, heads=4, kv_heads=2, vocab=96, batch=2, seq=16,
                                   steps=1, rounds=2, warmup=1, loss_steps=3, batches=4, modes=("eager",), kv=8,
                                   decode_steps=2, prefill_tokens=16),
             hf_lora=HfLoraBench(shapes=(("tiny", 2, 64, 112, 4, 2),), vocab=96, batch=2, seq=16, steps=1, rounds=2,
                                 warmup=1, loss_steps=3, batches=4, modes=("eager",), r=4, alpha=8),
             moe=MoeBench(grouped_shapes=(("tiny", 6, 2, 64, 48),), routings=("skewed",),
                          model_shapes=(("tiny", ("qwen3_moe", 2, 64, 8, 2, 32, 4, 2)),), models=("tiny",),
                          vocab=96, batch=2, seq=16, steps=1, rounds=2, warmup=1, decode_batches=(1,), kv=8,
                          decode_steps=2))


def config_for(device: str, quick: bool, gemm_squares: str | None, shapes: dict | None = None,
               gemm_variants: tuple | None = None) -> Config:
    """gemm_squares (a comma list) replaces the square GEMM sizes and drops the odd shapes; shapes
    (ShapeSuite fields) narrows the shape suite; gemm_variants narrows the square GEMM's dtypes."""
    cfg = CPU if device == "cpu" else QUICK if quick else FULL
    if shapes:
        cfg = dataclasses.replace(cfg, shapes=dataclasses.replace(cfg.shapes, **shapes))
    if gemm_variants:
        cfg = dataclasses.replace(cfg, gemm_variants=gemm_variants)
    if gemm_squares is None:
        return cfg
    return dataclasses.replace(cfg, gemm_squares=[int(x) for x in gemm_squares.split(",") if x.strip()], gemm_odd=[])


@dataclass
class Run:
    bench: Bench
    cfg: Config
    results: dict          # the results file's object; sections append to results["rows"]
    ceiling: CopyCeiling
    save: object = None    # writes the results file so far: long sections call it after each row

    @property
    def rows(self) -> list:
        return self.results["rows"]
