// cuops public C++ API: typed calls through the PyTorch dispatcher, so C++ programs get the same
// device routing, autograd, autocast and tracing as Python's torch.ops.cuops.*.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>

#if defined(_WIN32)
#define CUOPS_API __declspec(dllimport)
#else
#define CUOPS_API __attribute__((visibility("default")))
#endif

namespace cuops {

// Defined in libcuops. Every program that includes this header references it (below), so a linker
// using --as-needed keeps libcuops, and with it the TORCH_LIBRARY registrations that run at load.
CUOPS_API int64_t link_anchor();
namespace detail {
// Weak, so each translation unit may define it; a weak definition is always emitted (an inline
// variable would be dropped when unused, and the reference with it).
__attribute__((weak)) int64_t (*keep_libcuops_linked)() = &link_anchor;

template <typename Signature> c10::TypedOperatorHandle<Signature> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}
}  // namespace detail

// c <- a + b (in place into c; c may be a or b).
inline void add2(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b) {
  static const auto handle =
      detail::op<void(const at::Tensor&, const at::Tensor&, const at::Tensor&)>("cuops::add2");
  handle.call(c, a, b);
}

// a + b as a new tensor; differentiable.
inline at::Tensor vector_add(const at::Tensor& a, const at::Tensor& b) {
  static const auto handle =
      detail::op<at::Tensor(const at::Tensor&, const at::Tensor&)>("cuops::vector_add");
  return handle.call(a, b);
}

// alpha * x; differentiable in x.
inline at::Tensor scale(const at::Tensor& x, double alpha = 2.0) {
  static const auto handle = detail::op<at::Tensor(const at::Tensor&, double)>("cuops::scale");
  return handle.call(x, alpha);
}

// x * x elementwise; differentiable.
inline at::Tensor square(const at::Tensor& x) {
  static const auto handle = detail::op<at::Tensor(const at::Tensor&)>("cuops::square");
  return handle.call(x);
}

// 0-dim ||a - b||_2 over all elements; differentiable.
inline at::Tensor two_norm(const at::Tensor& a, const at::Tensor& b) {
  static const auto handle =
      detail::op<at::Tensor(const at::Tensor&, const at::Tensor&)>("cuops::two_norm");
  return handle.call(a, b);
}

// c <- alpha * a @ b + beta * c (in place; beta == 0 ignores c's contents).
inline void gemm(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double alpha = 1.0,
                 double beta = 0.0) {
  static const auto handle =
      detail::op<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, double, double)>(
          "cuops::gemm");
  handle.call(c, a, b, alpha, beta);
}

// a @ b as a new [M, N] tensor; differentiable.
inline at::Tensor mm(const at::Tensor& a, const at::Tensor& b) {
  static const auto handle =
      detail::op<at::Tensor(const at::Tensor&, const at::Tensor&)>("cuops::mm");
  return handle.call(a, b);
}

// act(x @ weight^T + bias) for x [..., K], weight [N, K] (nn.Linear's layout), bias [N]; activation
// one of "none", "relu", "gelu", "gelu_tanh", "silu"; differentiable in x, weight and bias.
inline at::Tensor linear(const at::Tensor& x, const at::Tensor& weight,
                         const std::optional<at::Tensor>& bias = std::nullopt,
                         std::string_view activation = "none") {
  static const auto handle =
      detail::op<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                            std::string_view)>("cuops::linear");
  return handle.call(x, weight, bias, activation);
}

// linear's pieces for its backward (internal; their schemas may change): the output and the
// pre-activation; the pre-activation's gradient and the bias gradient from dy [rows, N].
inline std::tuple<at::Tensor, at::Tensor> _linear_fwd(const at::Tensor& x, const at::Tensor& weight,
                                                      const std::optional<at::Tensor>& bias,
                                                      std::string_view activation) {
  static const auto handle = detail::op<std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, std::string_view)>(
      "cuops::_linear_fwd");
  return handle.call(x, weight, bias, activation);
}
inline std::tuple<at::Tensor, at::Tensor> _linear_act_bwd(const at::Tensor& dy,
                                                          const at::Tensor& pre,
                                                          std::string_view activation) {
  static const auto handle = detail::op<std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, std::string_view)>("cuops::_linear_act_bwd");
  return handle.call(dy, pre, activation);
}

// act(x @ w_gate^T) * (x @ w_up^T) for x [..., K], w_gate and w_up [I, K] (nn.Linear's layout), act
// "silu" (SwiGLU) or "gelu_tanh" (GeGLU); differentiable in x, w_gate and w_up.
inline at::Tensor swiglu(const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up,
                         std::string_view activation = "silu") {
  static const auto handle = detail::op<at::Tensor(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, std::string_view)>("cuops::swiglu");
  return handle.call(x, w_gate, w_up, activation);
}

// swiglu's pieces for its backward (internal; its schema may change): the output and the products
// g = x @ w_gate^T and u = x @ w_up^T.
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> _swiglu_fwd(
    const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up,
    std::string_view activation = "silu") {
  static const auto handle = detail::op<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, std::string_view)>(
      "cuops::_swiglu_fwd");
  return handle.call(x, w_gate, w_up, activation);
}
// swiglu's gate backward (internal): (dy * u * act'(g), dy * act(g)) for dy, g, u [rows, I].
inline std::tuple<at::Tensor, at::Tensor> _swiglu_bwd(const at::Tensor& dy, const at::Tensor& g,
                                                      const at::Tensor& u,
                                                      std::string_view activation = "silu") {
  static const auto handle = detail::op<std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, std::string_view)>(
      "cuops::_swiglu_bwd");
  return handle.call(dy, g, u, activation);
}

// act(x @ weight^T + (lora_x @ lora_a^T) @ lora_b^T + bias): linear with a LoRA adapter, lora_a
// [R, K] and lora_b [N, R] (the adapter's scale folded into lora_b); lora_x, the adapter's input
// (PEFT's dropout of x), defaults to x. Differentiable in every tensor; a weight that needs no
// gradient (a frozen base) costs no product in the backward.
inline at::Tensor lora_linear(const at::Tensor& x, const at::Tensor& weight,
                              const at::Tensor& lora_a, const at::Tensor& lora_b,
                              const std::optional<at::Tensor>& bias = std::nullopt,
                              std::string_view activation = "none",
                              const std::optional<at::Tensor>& lora_x = std::nullopt) {
  static const auto handle =
      detail::op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const at::Tensor&, const std::optional<at::Tensor>&, std::string_view,
                            const std::optional<at::Tensor>&)>("cuops::lora_linear");
  return handle.call(x, weight, lora_a, lora_b, bias, activation, lora_x);
}

// lora_linear's pieces for its backward (internal; its schema may change): the output, the
// pre-activation (empty [0] without an activation) and lora_x @ lora_a^T.
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> _lora_linear_fwd(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& lora_a,
    const at::Tensor& lora_b, const std::optional<at::Tensor>& bias, std::string_view activation,
    const std::optional<at::Tensor>& lora_x) {
  static const auto handle = detail::op<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
      const std::optional<at::Tensor>&, std::string_view, const std::optional<at::Tensor>&)>(
      "cuops::_lora_linear_fwd");
  return handle.call(x, weight, lora_a, lora_b, bias, activation, lora_x);
}

// swiglu with LoRA adapters on the gate and up projections: the adapters' A stacked in lora_a [R, K],
// lora_b_gate and lora_b_up [I, R] (each zero outside its adapter's columns, its scale folded in);
// lora_x as lora_linear's; activation as swiglu's. Differentiable in every tensor.
inline at::Tensor lora_swiglu(const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up,
                              const at::Tensor& lora_a, const at::Tensor& lora_b_gate,
                              const at::Tensor& lora_b_up,
                              const std::optional<at::Tensor>& lora_x = std::nullopt,
                              std::string_view activation = "silu") {
  static const auto handle = detail::op<at::Tensor(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
      const at::Tensor&, const std::optional<at::Tensor>&, std::string_view)>("cuops::lora_swiglu");
  return handle.call(x, w_gate, w_up, lora_a, lora_b_gate, lora_b_up, lora_x, activation);
}

// lora_swiglu's pieces for its backward (internal; its schema may change): the output, the products g
// and u (the adapters' terms included) and lora_x @ lora_a^T.
inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> _lora_swiglu_fwd(
    const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up, const at::Tensor& lora_a,
    const at::Tensor& lora_b_gate, const at::Tensor& lora_b_up,
    const std::optional<at::Tensor>& lora_x, std::string_view activation = "silu") {
  static const auto handle = detail::op<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
      const at::Tensor&, const std::optional<at::Tensor>&, std::string_view)>(
      "cuops::_lora_swiglu_fwd");
  return handle.call(x, w_gate, w_up, lora_a, lora_b_gate, lora_b_up, lora_x, activation);
}

// The cross-entropy of softmax(x @ weight^T + bias) against target, without the [T, V] logits: x
// [..., K], weight [V, K], target int64 shaped like x's leading dims, bias [V]; reduction "mean" (over
// the tokens whose target is not ignore_index), "sum" or "none" (per token); float32 for half inputs.
// softcap c: each logit read as c tanh(z / c) (Gemma 2 / 3's final_logit_softcapping). Differentiable
// in x, weight and bias.
inline at::Tensor linear_cross_entropy(const at::Tensor& x, const at::Tensor& weight,
                                       const at::Tensor& target,
                                       const std::optional<at::Tensor>& bias = std::nullopt,
                                       int64_t ignore_index = -100,
                                       std::string_view reduction = "mean",
                                       std::optional<double> softcap = std::nullopt) {
  static const auto handle = detail::op<at::Tensor(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
      int64_t, std::string_view, std::optional<double>)>("cuops::linear_cross_entropy");
  return handle.call(x, weight, target, bias, ignore_index, reduction, softcap);
}

// linear_cross_entropy's pieces (internal; their schemas may change): the loss and each token's
// log-sum-exp [T]; the gradients of x, weight and bias from the loss's gradient; a loss of one value
// with its gradients for a gradient of 1.
inline std::tuple<at::Tensor, at::Tensor> _linear_cross_entropy_fwd(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
    const std::optional<at::Tensor>& bias, int64_t ignore_index, std::string_view reduction,
    std::optional<double> softcap = std::nullopt) {
  static const auto handle = detail::op<std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
      int64_t, std::string_view, std::optional<double>)>("cuops::_linear_cross_entropy_fwd");
  return handle.call(x, weight, target, bias, ignore_index, reduction, softcap);
}
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> _linear_cross_entropy_bwd(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
    const std::optional<at::Tensor>& bias, const at::Tensor& lse, int64_t ignore_index,
    std::string_view reduction, std::optional<double> softcap = std::nullopt) {
  static const auto handle = detail::op<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
      const std::optional<at::Tensor>&, const at::Tensor&, int64_t, std::string_view,
      std::optional<double>)>("cuops::_linear_cross_entropy_bwd");
  return handle.call(grad, x, weight, target, bias, lse, ignore_index, reduction, softcap);
}
inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> _linear_cross_entropy_fwd_grad(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
    const std::optional<at::Tensor>& bias, int64_t ignore_index, std::string_view reduction,
    std::array<bool, 3> output_mask = {true, true, true},
    std::optional<double> softcap = std::nullopt) {
  static const auto handle = detail::op<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
      int64_t, std::string_view, std::array<bool, 3>, std::optional<double>)>(
      "cuops::_linear_cross_entropy_fwd_grad");
  return handle.call(x, weight, target, bias, ignore_index, reduction, output_mask, softcap);
}

// x / sqrt(mean(x^2, last dim) + eps) * weight: x [..., D], weight [D], float32 math; the result in
// promote(x, weight) (Hugging Face's RMSNorm's dtype), or dtype where given (the half type the next
// GEMM reads). Differentiable in x and weight.
inline at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps = 1e-6,
                           std::optional<at::ScalarType> dtype = std::nullopt) {
  static const auto handle =
      detail::op<at::Tensor(const at::Tensor&, const at::Tensor&, double,
                            std::optional<at::ScalarType>)>("cuops::rms_norm");
  return handle.call(x, weight, eps, dtype);
}

// (rms_norm(x + residual, weight, eps), x + residual) in one pass: the sum in promote(x, residual),
// the norm in promote(that, weight) or dtype where given. Differentiable in x, residual and weight.
inline std::tuple<at::Tensor, at::Tensor> add_rms_norm(
    const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, double eps = 1e-6,
    std::optional<at::ScalarType> dtype = std::nullopt) {
  static const auto handle = detail::op<std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
      std::optional<at::ScalarType>)>("cuops::add_rms_norm");
  return handle.call(x, residual, weight, eps, dtype);
}

// The norms' pieces (internal; their schemas may change): the output, the sum (empty without a
// residual) and 1 / rms per row; the gradients of the normalised input and of the weight, and the
// first again in x_dtype where given.
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> _rms_norm_fwd(
    const at::Tensor& x, const std::optional<at::Tensor>& residual, const at::Tensor& weight,
    double eps, std::optional<at::ScalarType> dtype = std::nullopt) {
  static const auto handle = detail::op<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const std::optional<at::Tensor>&, const at::Tensor&, double,
      std::optional<at::ScalarType>)>("cuops::_rms_norm_fwd");
  return handle.call(x, residual, weight, eps, dtype);
}
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> _rms_norm_bwd(
    const at::Tensor& dy, const at::Tensor& s, const at::Tensor& weight, const at::Tensor& rstd,
    const std::optional<at::Tensor>& dsum, std::array<bool, 2> output_mask,
    std::optional<at::ScalarType> x_dtype = std::nullopt) {
  static const auto handle = detail::op<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
      const std::optional<at::Tensor>&, std::array<bool, 2>, std::optional<at::ScalarType>)>(
      "cuops::_rms_norm_bwd");
  return handle.call(dy, s, weight, rstd, dsum, output_mask, x_dtype);
}

// Hugging Face's rotary embedding of q [B, Hq, T, D] and k [B, Hk, T, D] by cos and sin [B or 1, T,
// D] (broadcast over the heads): (q cos + rotate_half(q) sin, k cos + rotate_half(k) sin) in
// promote(q, cos), or dtype (the half type attention reads under autocast). Differentiable in every
// tensor input.
inline std::tuple<at::Tensor, at::Tensor> rotary(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
    std::optional<at::ScalarType> dtype = std::nullopt) {
  static const auto handle = detail::op<std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
      std::optional<at::ScalarType>)>("cuops::rotary");
  return handle.call(q, k, cos, sin, dtype);
}
// rotary's backward of q and k, in dtype (q's; internal; its schema may change).
inline std::tuple<at::Tensor, at::Tensor> _rotary_bwd(const at::Tensor& grad_q,
                                                      const at::Tensor& grad_k,
                                                      const at::Tensor& cos, const at::Tensor& sin,
                                                      at::ScalarType dtype) {
  static const auto handle = detail::op<std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, at::ScalarType)>(
      "cuops::_rotary_bwd");
  return handle.call(grad_q, grad_k, cos, sin, dtype);
}

// Grouped GEMM (torch._grouped_mm's forms): a [S, K] with b [E, K, N] -> [S, N], the rows of group e
// (offs[e-1] <= r < offs[e]) times b[e], zeros past offs[E-1]; or a [M, S] with b [S, N] ->
// [E, M, N], group e's columns of a times its rows of b. offs int32/int64 [E] on a's device, never
// read on the host. Differentiable in a and b.
inline at::Tensor grouped_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& offs) {
  static const auto handle =
      detail::op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>(
          "cuops::grouped_mm");
  return handle.call(a, b, offs);
}

// A mixture-of-experts router after its logits [..., E]: (the k largest softmax probabilities,
// divided by their sum where renorm, in weight_dtype or float32; their indices, int64). Ties go to
// the lower index. Differentiable in logits.
inline std::tuple<at::Tensor, at::Tensor> moe_topk_softmax(
    const at::Tensor& logits, int64_t k, bool renorm = false,
    std::optional<at::ScalarType> weight_dtype = std::nullopt) {
  static const auto handle = detail::op<std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, int64_t, bool, std::optional<at::ScalarType>)>("cuops::moe_topk_softmax");
  return handle.call(logits, k, renorm, weight_dtype);
}

// A mixture of experts' experts: out[t] = sum_j topk_w[t, j] * down[e] (act(g) * u), [g | u] =
// gate_up[e] x[t], e = topk_idx[t, j]; x [T, H], topk_idx [T, k] int32/int64 (an index outside
// [0, E) adds nothing), topk_w [T, k], gate_up [E, 2I, H], down [E, H, I]; activation silu or
// gelu_tanh. Differentiable in x, topk_w, gate_up and down.
inline at::Tensor moe_experts(const at::Tensor& x, const at::Tensor& topk_idx,
                              const at::Tensor& topk_w, const at::Tensor& gate_up,
                              const at::Tensor& down, std::string_view activation = "silu") {
  static const auto handle =
      detail::op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const at::Tensor&, const at::Tensor&, std::string_view)>(
          "cuops::moe_experts");
  return handle.call(x, topk_idx, topk_w, gate_up, down, activation);
}
// moe_experts' pieces for its backward (internal; the schema may change): the output, the gate/up
// products in its row layout (each expert's pairs from a multiple of 128 rows), each pair's row, each
// expert's end row.
inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> _moe_experts_fwd(
    const at::Tensor& x, const at::Tensor& topk_idx, const at::Tensor& topk_w,
    const at::Tensor& gate_up, const at::Tensor& down, std::string_view activation) {
  static const auto handle = detail::op<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
      std::string_view)>("cuops::_moe_experts_fwd");
  return handle.call(x, topk_idx, topk_w, gate_up, down, activation);
}
// moe_experts' backward (internal): the gradients of x, topk_w, gate_up and down output_mask asks for.
inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> _moe_experts_bwd(
    const at::Tensor& dout, const at::Tensor& x, const at::Tensor& topk_w,
    const at::Tensor& gate_up, const at::Tensor& down, const at::Tensor& gu, const at::Tensor& rows,
    const at::Tensor& offs, std::string_view activation, std::array<bool, 4> output_mask) {
  static const auto handle = detail::op<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
      const at::Tensor&, const at::Tensor&, const at::Tensor&, std::string_view,
      std::array<bool, 4>)>("cuops::_moe_experts_bwd");
  return handle.call(dout, x, topk_w, gate_up, down, gu, rows, offs, activation, output_mask);
}

// JSON describing the build: cuops, torch and CUDA versions, CUDA archs, compiler, build type.
inline std::string build_info() {
  static const auto handle = detail::op<std::string()>("cuops::build_info");
  return handle.call();
}

// Sets one of the library's switches (CUOPS_DISABLE_WGMMA, CUOPS_DISABLE_SKINNY_TMA,
// CUOPS_DISABLE_BULK_NORM; README.md) for this process, or only reads it when `on` is empty; returns
// whether it was on. Products planned afterwards follow it.
inline bool set_switch(const std::string& name, std::optional<bool> on = std::nullopt) {
  static const auto handle =
      detail::op<bool(std::string_view, std::optional<bool>)>("cuops::set_switch");
  return handle.call(name, on);
}

}  // namespace cuops
