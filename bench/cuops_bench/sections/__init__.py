"""The sections a run can choose with --only, in the order they run. Adding one is a module with
run(ctx: context.Run) and a line here."""
from . import (cross_entropy, elementwise, fused, gemm_shapes, gemm_squares, gpt_train, hf_llama, hf_lora, llama,
               moe, norm, overhead, rms_norm)

SECTIONS = {
    "elementwise": elementwise.run,
    "norm": norm.run,
    "gemm": gemm_squares.run,
    "overhead": overhead.run,
    "gemm_shapes": gemm_shapes.run,
    "llama": llama.run,
    "gpt_train": gpt_train.run,
    "fused": fused.run,
    "cross_entropy": cross_entropy.run,
    "rms_norm": rms_norm.run,
    "hf_llama": hf_llama.run,
    "hf_lora": hf_lora.run,
    "moe": moe.run,
}
# What a run without --only measures: the sections that fit the bench's slot on the GPU machine (one
# 10-minute device call, tools/gpu_check.sh). The shape suite (tens of minutes over every class and
# dtype, more with compiled baselines), the models, the fused ops (~5 minutes, compiling their torch
# baselines), the LM-head loss and the norms run when named:
# --only gemm_shapes,llama,gpt_train,fused,cross_entropy,rms_norm,hf_llama,hf_lora,moe (or all).
DEFAULT = ("elementwise", "norm", "gemm", "overhead")
