// The cuops operator library: every schema, in one place. Kernels live in ops/, one file per family.
#include <torch/library.h>

#include "cuops/cuops.h"

namespace cuops {
int64_t link_anchor() { return 1; }
}  // namespace cuops

TORCH_LIBRARY(cuops, m) {
  const std::vector<at::Tag> tags = {at::Tag::pt2_compliant_tag};
  // gemm and mm read any strides (the planner copies only what its kernels cannot read), so the
  // compiler may hand them any layout (flexible_layout). Without it Inductor materializes each input in
  // its eager strides, and a value two of them read (g and g^T in a Linear's backward) was written to
  // two buffers. Other ops keep the default: their kernels want what eager gives them.
  const std::vector<at::Tag> gemm_tags = {at::Tag::pt2_compliant_tag, at::Tag::flexible_layout};
  // c <- a + b elementwise, written into c (c may be a or b); equal shapes, no broadcasting.
  m.def("add2(Tensor(a!) c, Tensor a, Tensor b) -> ()", tags);
  // a + b elementwise as a new contiguous tensor.
  m.def("vector_add(Tensor a, Tensor b) -> Tensor", tags);
  // alpha * x as a new contiguous tensor.
  m.def("scale(Tensor x, float alpha=2.0) -> Tensor", tags);
  // x * x elementwise as a new contiguous tensor.
  m.def("square(Tensor x) -> Tensor", tags);
  // 0-dim Euclidean norm of a - b over all elements (0 for empty inputs).
  m.def("two_norm(Tensor a, Tensor b) -> Tensor", tags);
  // c <- alpha * a @ b + beta * c for a [M, K], b [K, N], c [M, N]; beta = 0 ignores c's contents.
  m.def("gemm(Tensor(a!) c, Tensor a, Tensor b, float alpha=1.0, float beta=0.0) -> ()", gemm_tags);
  // a @ b as a new contiguous [M, N] tensor.
  m.def("mm(Tensor a, Tensor b) -> Tensor", gemm_tags);
  // act(x @ weight^T + bias): x [..., K], weight [N, K], bias [N]; activation none, relu, gelu,
  // gelu_tanh or silu; [..., N] in x's dtype (docs/ops.md#linear).
  m.def("linear(Tensor x, Tensor weight, Tensor? bias=None, str activation=\"none\") -> Tensor",
        gemm_tags);
  // linear's output and its pre-activation (x @ weight^T + bias), for linear's backward (internal).
  m.def("_linear_fwd(Tensor x, Tensor weight, Tensor? bias, str activation) -> (Tensor, Tensor)",
        gemm_tags);
  // (dy * act'(pre), the sum of that over rows) for dy, pre [rows, N]: linear's backward (internal).
  m.def("_linear_act_bwd(Tensor dy, Tensor pre, str activation) -> (Tensor, Tensor)", tags);
  // act(x @ w_gate^T) * (x @ w_up^T), x [..., K], w_gate and w_up [I, K]; act silu (SwiGLU) or
  // gelu_tanh (GeGLU) (docs/ops.md#swiglu).
  m.def("swiglu(Tensor x, Tensor w_gate, Tensor w_up, str activation=\"silu\") -> Tensor",
        gemm_tags);
  // swiglu's output and g = x @ w_gate^T, u = x @ w_up^T, for swiglu's backward (internal).
  m.def(
      "_swiglu_fwd(Tensor x, Tensor w_gate, Tensor w_up, str activation=\"silu\") -> (Tensor out, "
      "Tensor g, Tensor u)",
      gemm_tags);
  // (dy * u * act'(g), dy * act(g)) for dy, g, u [rows, I]: swiglu's backward (internal).
  m.def("_swiglu_bwd(Tensor dy, Tensor g, Tensor u, str activation=\"silu\") -> (Tensor, Tensor)",
        tags);
  // act(x @ weight^T + (lora_x @ lora_a^T) @ lora_b^T + bias): linear with a LoRA adapter (lora_a
  // [R, K], lora_b [N, R], its scale folded into lora_b), the rank-R update an extra K chunk of the
  // same GEMM; lora_x (PEFT's dropout of x) defaults to x (docs/ops.md#lora_linear).
  m.def(
      "lora_linear(Tensor x, Tensor weight, Tensor lora_a, Tensor lora_b, Tensor? bias=None, "
      "str activation=\"none\", Tensor? lora_x=None) -> Tensor",
      gemm_tags);
  // lora_linear's output, pre-activation (empty [0] without an activation) and lora_x @ lora_a^T
  // [..., R], for its backward (internal).
  m.def(
      "_lora_linear_fwd(Tensor x, Tensor weight, Tensor lora_a, Tensor lora_b, Tensor? bias, "
      "str activation, Tensor? lora_x) -> (Tensor out, Tensor pre, Tensor lora_u)",
      gemm_tags);
  // swiglu with LoRA adapters on both projections: act(x @ w_gate^T + (lora_x @ lora_a^T) @
  // lora_b_gate^T) * (x @ w_up^T + (lora_x @ lora_a^T) @ lora_b_up^T), the two adapters' A stacked
  // in lora_a [R, K], each lora_b [I, R]; act as swiglu's (docs/ops.md#lora_swiglu).
  m.def(
      "lora_swiglu(Tensor x, Tensor w_gate, Tensor w_up, Tensor lora_a, Tensor lora_b_gate, "
      "Tensor lora_b_up, Tensor? lora_x=None, str activation=\"silu\") -> Tensor",
      gemm_tags);
  // lora_swiglu's output, its gate and up products and lora_x @ lora_a^T, for its backward (internal).
  m.def(
      "_lora_swiglu_fwd(Tensor x, Tensor w_gate, Tensor w_up, Tensor lora_a, Tensor lora_b_gate, "
      "Tensor lora_b_up, Tensor? lora_x, str activation=\"silu\") -> (Tensor out, Tensor g, "
      "Tensor u, Tensor lora_u)",
      gemm_tags);
  // The cross-entropy of softmax(x @ weight^T + bias) against target without the [T, V] logits: x
  // [..., K], weight [V, K], target int64 [...]; reduction mean, sum or none; softcap c: each logit
  // read as c tanh(z / c) (Gemma 2 / 3's final_logit_softcapping) (docs/ops.md#linear_cross_entropy).
  m.def(
      "linear_cross_entropy(Tensor x, Tensor weight, Tensor target, Tensor? bias=None, "
      "int ignore_index=-100, str reduction=\"mean\", float? softcap=None) -> Tensor",
      tags);
  // linear_cross_entropy's loss and each token's log-sum-exp [T], for its backward (internal).
  m.def(
      "_linear_cross_entropy_fwd(Tensor x, Tensor weight, Tensor target, Tensor? bias, "
      "int ignore_index, str reduction, float? softcap=None) -> (Tensor, Tensor)",
      tags);
  // The gradients of x, weight and bias from the loss's gradient (internal).
  m.def(
      "_linear_cross_entropy_bwd(Tensor grad, Tensor x, Tensor weight, Tensor target, Tensor? "
      "bias, Tensor lse, int ignore_index, str reduction, float? softcap=None) -> (Tensor, Tensor, "
      "Tensor)",
      tags);
  // A loss of one value (mean, sum) and its gradients of x, weight and bias for a gradient of 1,
  // made in one walk over the logits, those output_mask leaves out as empty [0] tensors; the
  // backward scales them (internal).
  m.def(
      "_linear_cross_entropy_fwd_grad(Tensor x, Tensor weight, Tensor target, Tensor? bias, "
      "int ignore_index, str reduction, bool[3] output_mask, float? softcap=None) -> (Tensor, "
      "Tensor, Tensor, Tensor)",
      tags);
  // x / sqrt(mean(x^2, last dim) + eps) * weight, x [..., D], weight [D]; in promote(x, weight), or
  // dtype where given (docs/ops.md#rms_norm).
  m.def("rms_norm(Tensor x, Tensor weight, float eps=1e-6, ScalarType? dtype=None) -> Tensor",
        tags);
  // (rms_norm(x + residual, weight, eps), x + residual): the residual add and the norm after it in
  // one pass (docs/ops.md#add_rms_norm).
  m.def(
      "add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps=1e-6, ScalarType? "
      "dtype=None) -> (Tensor, Tensor)",
      tags);
  // The norm of x (+ residual), the sum (empty [0] without a residual) and 1 / rms per row [rows]
  // in the math dtype (float32; float64 for float64), for the backward (internal).
  m.def(
      "_rms_norm_fwd(Tensor x, Tensor? residual, Tensor weight, float eps, ScalarType? dtype) -> "
      "(Tensor, Tensor, Tensor)",
      tags);
  // (the gradient of the normalised input s, plus dsum where given; the weight's gradient; the first
  // in x_dtype where given, from the same pass), those output_mask leaves out (and the third without
  // x_dtype) as empty [0] tensors (internal).
  m.def(
      "_rms_norm_bwd(Tensor dy, Tensor s, Tensor weight, Tensor rstd, Tensor? dsum, bool[2] "
      "output_mask, ScalarType? x_dtype=None) -> (Tensor, Tensor, Tensor)",
      tags);
  // (q cos + rotate_half(q) sin, k cos + rotate_half(k) sin), Hugging Face's rotary embedding: q [B,
  // Hq, T, D], k [B, Hk, T, D], cos and sin [B or 1, T, D]; in promote(q, cos), or dtype where given
  // (docs/ops.md#rotary).
  m.def(
      "rotary(Tensor q, Tensor k, Tensor cos, Tensor sin, ScalarType? dtype=None) -> (Tensor, "
      "Tensor)",
      tags);
  // The gradients of q and k from the outputs' gradients, in dtype (q's; internal).
  m.def(
      "_rotary_bwd(Tensor grad_q, Tensor grad_k, Tensor cos, Tensor sin, ScalarType dtype) -> "
      "(Tensor, Tensor)",
      tags);
  // Grouped GEMM, torch._grouped_mm's forms: a [S, K] with b [E, K, N] -> [S, N], row r of group e
  // (offs[e-1] <= r < offs[e]) times b[e], zeros past offs[E-1]; a [M, S] with b [S, N] -> [E, M, N],
  // group e's columns of a times its rows of b. offs: int32/int64 [E] group ends, on the device
  // (docs/ops.md#grouped_mm).
  m.def("grouped_mm(Tensor a, Tensor b, Tensor offs) -> Tensor", tags);
  // A router's softmax and top-k: (the k largest probabilities, renormalised to sum 1 where
  // renorm, in weight_dtype or float32; their expert indices, int64) (docs/ops.md#moe_topk_softmax).
  m.def(
      "moe_topk_softmax(Tensor logits, int k, bool renorm=False, ScalarType? weight_dtype=None) -> "
      "(Tensor, Tensor)",
      tags);
  // out[t] = sum_j topk_w[t, j] * down_e(act(g) * u), [g | u] = gate_up_e x[t], e = topk_idx[t, j]:
  // x [T, H], gate_up [E, 2I, H], down [E, H, I] (Hugging Face's experts), activation silu or
  // gelu_tanh (docs/ops.md#moe_experts).
  m.def(
      "moe_experts(Tensor x, Tensor topk_idx, Tensor topk_w, Tensor gate_up, Tensor down, str "
      "activation=\"silu\") -> Tensor",
      tags);
  // moe_experts' output and, for its backward (internal), its row layout: the gate/up products [R,
  // 2I] with each expert's pairs from a multiple of 128 rows (R a bound on the rows that takes; the
  // last row in no expert), each pair's row (int64 [S]) and each expert's end row (int32 [E]).
  m.def(
      "_moe_experts_fwd(Tensor x, Tensor topk_idx, Tensor topk_w, Tensor gate_up, Tensor down, str "
      "activation) -> (Tensor out, Tensor gu, Tensor rows, Tensor offs)",
      tags);
  // The gradients of x, topk_w, gate_up and down that output_mask asks for (the others empty [0])
  // (internal).
  m.def(
      "_moe_experts_bwd(Tensor dout, Tensor x, Tensor topk_w, Tensor gate_up, Tensor down, Tensor "
      "gu, Tensor rows, Tensor offs, str activation, bool[4] output_mask) -> (Tensor, Tensor, "
      "Tensor, Tensor)",
      tags);
  // JSON: cuops version, torch and CUDA versions built against, CUDA archs, compiler, build type.
  m.def("build_info() -> str", tags);
  // Sets one of the library's switches (README.md) for this process, or reads it when on is None;
  // returns whether it was on.
  m.def("set_switch(str name, bool? on=None) -> bool");
}
