// linear: act(x @ weight^T + bias) (docs/ops.md#linear): checks, CPU reference, CUDA, Meta, Autograd,
// Autocast. Two internal ops carry the pieces the backward needs: _linear_fwd also returns the
// pre-activation (kept only when grad is required and there is an activation), _linear_act_bwd turns
// dy into the pre-activation's gradient and the bias gradient in one call.
//
// On CUDA the bias and the activation are the GEMM's epilogue (kernels/gemm/epilogue.cuh's
// BiasActivation on the wgmma kernel), the pre-activation stored beside the output only when the
// backward needs it; where the planner does not fuse (kernels/gemm/gemm_plan.cpp, FusedEpilogueApart:
// float32, float64, <= 16 rows, layouts the fused kernel does not read) the product runs on
// cuops::mm and the bias and activation in a second pass. The backward's activation derivative and
// bias gradient are one pass over dy (kernels/gemm/linear.cu).
#include "ops/common.h"

#include "ops/fused_gemm.h"

#include <array>
#include <string_view>

namespace cuops::ops {

using Act = kernels::Activation;
constexpr std::array<std::pair<std::string_view, Act>, 5> kActs = {{{"none", Act::None},
                                                                    {"relu", Act::Relu},
                                                                    {"gelu", Act::Gelu},
                                                                    {"gelu_tanh", Act::GeluTanh},
                                                                    {"silu", Act::Silu}}};

Act parse_act(const char* op, c10::string_view name) {
  for (const auto& [text, act] : kActs)
    if (std::string_view(name.data(), name.size()) == text) return act;
  TORCH_CHECK(false, "cuops::", op,
              ": expected activation to be one of none, relu, gelu, gelu_tanh, silu, got '",
              std::string(name.data(), name.size()), "'");
  return Act::None;
}

Act parse_gate(const char* op, c10::string_view name) {
  const std::string_view text(name.data(), name.size());
  if (text == "silu") return Act::Silu;
  if (text == "gelu_tanh") return Act::GeluTanh;
  TORCH_CHECK(false, "cuops::", op, ": expected activation to be one of silu, gelu_tanh, got '",
              std::string(text), "'");
  return Act::Silu;
}

at::Tensor gate_of(const at::Tensor& g, Act act) {
  return act == Act::Silu ? at::silu(g) : at::gelu(g, "tanh");
}

namespace {

// x [..., K], weight [N, K], bias [N]; one dtype and device.
Act check_linear(const char* op, const at::Tensor& x, const at::Tensor& weight,
                 const std::optional<at::Tensor>& bias, c10::string_view activation) {
  if (bias.has_value())
    check_dtypes_and_devices(op, {{"x", &x}, {"weight", &weight}, {"bias", &*bias}});
  else
    check_dtypes_and_devices(op, {{"x", &x}, {"weight", &weight}});
  TORCH_CHECK(x.dim() >= 1, "cuops::", op, ": expected x to be at least 1-D ([..., K]), got 0-D");
  check_dim(op, "weight", weight, 2);
  TORCH_CHECK(weight.sym_size(1) == x.sym_size(-1), "cuops::", op,
              ": expected weight [N, K] to share K with x's last dimension, got x ", shape_str(x),
              " and weight ", shape_str(weight));
  if (bias.has_value()) {
    check_dim(op, "bias", *bias, 1);
    TORCH_CHECK(bias->sym_size(0) == weight.sym_size(0), "cuops::", op,
                ": expected bias of shape [", weight.sym_size(0), "] (weight's rows), got ",
                shape_str(*bias));
  }
  return parse_act(op, activation);
}

std::vector<c10::SymInt> out_shape(const at::Tensor& x, const at::Tensor& weight) {
  std::vector<c10::SymInt> shape(x.sym_sizes().begin(), x.sym_sizes().end());
  shape.back() = weight.sym_size(0);
  return shape;
}

// The activation, out of place, in the tensor's own dtype (torch's kernels compute half types in
// float32 and round once).
at::Tensor activate(const at::Tensor& z, Act act) {
  switch (act) {
    case Act::None:
      return z;
    case Act::Relu:
      return at::relu(z);
    case Act::Gelu:
      return at::gelu(z, "none");
    case Act::GeluTanh:
      return at::gelu(z, "tanh");
    case Act::Silu:
      return at::silu(z);
  }
  return z;
}

// ---- CPU reference: the product, bias and activation in the accumulation type (float32 for half
// types, float64 for float64), rounded once to x's dtype; the pre-activation rounded likewise.

std::pair<at::Tensor, at::Tensor> linear_reference(const at::Tensor& x, const at::Tensor& weight,
                                                   const std::optional<at::Tensor>& bias, Act act) {
  const auto acc = acc_type(x);
  at::Tensor z = at::matmul(x.to(acc), weight.to(acc).t());
  if (bias.has_value()) z = z + bias->to(acc);
  return {activate(z, act).to(x.scalar_type()).contiguous(), z.to(x.scalar_type()).contiguous()};
}

at::Tensor linear_cpu(const at::Tensor& x, const at::Tensor& weight,
                      const std::optional<at::Tensor>& bias, c10::string_view activation) {
  const Act act = check_linear("linear", x, weight, bias, activation);
  return linear_reference(x, weight, bias, act).first;
}

std::tuple<at::Tensor, at::Tensor> linear_fwd_cpu(const at::Tensor& x, const at::Tensor& weight,
                                                  const std::optional<at::Tensor>& bias,
                                                  c10::string_view activation) {
  const Act act = check_linear("_linear_fwd", x, weight, bias, activation);
  auto [y, z] = linear_reference(x, weight, bias, act);
  return {act == Act::None ? y.clone() : y, z};  // two outputs never alias
}

// ---- CUDA: the pre-activation on cuops::mm (x's leading dims flattened, weight^T read in place),
// then the bias and the activation.

at::Tensor pre_activation(const at::Tensor& x, const at::Tensor& weight,
                          const std::optional<at::Tensor>& bias) {
  at::Tensor z = cuops::mm(as_rows(x), weight.t());
  if (bias.has_value()) z.add_(*bias);
  return like_rows_of(z, x, weight.size(0));
}

// y = act(x @ weight^T + bias), and the pre-activation z where `keep`, by the fused epilogue; false
// (nothing enqueued) where the planner leaves the epilogue apart.
bool linear_fused(const at::Tensor& x, const at::Tensor& weight,
                  const std::optional<at::Tensor>& bias, Act act, bool keep, at::Tensor& y,
                  at::Tensor& z) {
  const at::Tensor x2 = as_rows(x);
  const int64_t n = weight.size(0);
  at::Tensor y2 = at::empty({x2.size(0), n}, x.options());
  at::Tensor z2 = keep ? at::empty({x2.size(0), n}, x.options()) : at::Tensor();
  const at::Tensor b = bias.has_value() ? bias->contiguous() : at::Tensor();
  FusedEpilogue e;
  e.bias = bias.has_value() ? &b : nullptr;
  e.act = act;
  e.z = keep ? &z2 : nullptr;
  if (!run_fused_gemm(y2, x2, weight, e)) return false;
  y = like_rows_of(y2, x, n);
  if (keep) z = like_rows_of(z2, x, n);
  return true;
}

at::Tensor linear_cuda(const at::Tensor& x, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, c10::string_view activation) {
  const Act act = check_linear("linear", x, weight, bias, activation);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y, unused;
  if (linear_fused(x, weight, bias, act, false, y, unused)) return y;
  at::Tensor z = pre_activation(x, weight, bias);
  switch (act) {
    case Act::None:
      return z;
    case Act::Relu:
      return z.relu_();
    case Act::Gelu:
      return at::gelu_(z, "none");
    case Act::GeluTanh:
      return at::gelu_(z, "tanh");
    case Act::Silu:
      return at::silu_(z);
  }
  return z;
}

std::tuple<at::Tensor, at::Tensor> linear_fwd_cuda(const at::Tensor& x, const at::Tensor& weight,
                                                   const std::optional<at::Tensor>& bias,
                                                   c10::string_view activation) {
  const Act act = check_linear("_linear_fwd", x, weight, bias, activation);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y, z;
  if (linear_fused(x, weight, bias, act, true, y, z)) return {y, z};
  z = pre_activation(x, weight, bias);
  return {act == Act::None ? z.clone() : activate(z, act).contiguous(), z};
}

// ---- the activation's backward: dz = dy * act'(z) (in the tensors' dtype, computed in float32 for
// half types by torch's kernels) and the bias gradient, dz summed over the rows (accumulated in
// float32 for half types; a fixed-order reduction, so the same bits on every run). dy and z are
// [rows, N].

void check_act_bwd(const at::Tensor& dy, const at::Tensor& z) {
  check_dtypes_and_devices("_linear_act_bwd", {{"dy", &dy}, {"pre", &z}});
  check_dim("_linear_act_bwd", "dy", dy, 2);
  check_same_shape("_linear_act_bwd", {{"dy", &dy}, {"pre", &z}});
}

std::tuple<at::Tensor, at::Tensor> linear_act_bwd_cpu(const at::Tensor& dy, const at::Tensor& z,
                                                      c10::string_view activation) {
  check_act_bwd(dy, z);
  const Act act = parse_act("_linear_act_bwd", activation);
  at::Tensor dz;
  switch (act) {
    case Act::None:
      dz = dy.clone(at::MemoryFormat::Contiguous);
      break;
    case Act::Relu:
      dz = at::threshold_backward(dy, z, 0);
      break;
    case Act::Gelu:
      dz = at::gelu_backward(dy, z, "none");
      break;
    case Act::GeluTanh:
      dz = at::gelu_backward(dy, z, "tanh");
      break;
    case Act::Silu:
      dz = at::silu_backward(dy, z);
      break;
  }
  const at::Tensor dbias =
      at::sum(dz, at::IntArrayRef{0}, false, acc_type(dz)).to(dz.scalar_type());
  return {dz.contiguous(), dbias};
}

// One pass over dy and the pre-activation (kernels/gemm/linear.cu): dz, and the bias gradient summed in
// the accumulation type before dz is rounded, in a fixed order.
std::tuple<at::Tensor, at::Tensor> linear_act_bwd_cuda(const at::Tensor& dy, const at::Tensor& z,
                                                       c10::string_view activation) {
  check_act_bwd(dy, z);
  const Act act = parse_act("_linear_act_bwd", activation);
  const c10::cuda::CUDAGuard guard(dy.device());
  const int64_t rows = dy.size(0), n = dy.size(1);
  // Rows with unit column stride, any leading stride (a row-major slice reads in place).
  auto rowwise = [&](const at::Tensor& t) {
    return t.stride(1) == 1 && t.stride(0) >= n ? t : t.contiguous();
  };
  const at::Tensor g = rowwise(dy), p = rowwise(z);
  at::Tensor dz = at::empty({rows, n}, dy.options());
  at::Tensor dbias = at::empty({n}, dy.options());
  const int64_t bytes = kernels::act_bwd_workspace_bytes(kernel_dtype(dy.scalar_type()), rows, n);
  at::Tensor workspace;
  if (bytes > 0) workspace = at::empty({bytes}, dy.options().dtype(at::kByte));
  C10_CUDA_CHECK(kernels::launch_act_bwd(
      kernel_dtype(dy.scalar_type()), act, g.data_ptr(), rows > 0 ? g.stride(0) : n, p.data_ptr(),
      rows > 0 ? p.stride(0) : n, rows, n, dz.data_ptr(), dbias.data_ptr(),
      workspace.defined() ? workspace.data_ptr() : nullptr, current_stream(dy)));
  return {dz, dbias};
}

// ---- Meta

at::Tensor linear_meta(const at::Tensor& x, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, c10::string_view activation) {
  check_linear("linear", x, weight, bias, activation);
  return at::empty_symint(out_shape(x, weight), x.options());
}

std::tuple<at::Tensor, at::Tensor> linear_fwd_meta(const at::Tensor& x, const at::Tensor& weight,
                                                   const std::optional<at::Tensor>& bias,
                                                   c10::string_view activation) {
  check_linear("_linear_fwd", x, weight, bias, activation);
  return {at::empty_symint(out_shape(x, weight), x.options()),
          at::empty_symint(out_shape(x, weight), x.options())};
}

std::tuple<at::Tensor, at::Tensor> linear_act_bwd_meta(const at::Tensor& dy, const at::Tensor& z,
                                                       c10::string_view activation) {
  check_act_bwd(dy, z);
  parse_act("_linear_act_bwd", activation);
  return {at::empty_symint(dy.sym_sizes(), dy.options()),
          at::empty_symint({dy.sym_size(1)}, dy.options())};
}

// ---- Autograd: x, weight and the pre-activation (only with an activation) are kept.

class LinearFunction : public torch::autograd::Function<LinearFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, c10::string_view activation) {
    const Act act = parse_act("linear", activation);
    ctx->saved_data["activation"] = std::string(activation.data(), activation.size());
    ctx->saved_data["has_bias"] = bias.has_value();
    at::AutoDispatchBelowADInplaceOrView guard;
    if (act == Act::None) {
      ctx->save_for_backward({x, weight});
      return cuops::linear(x, weight, bias, "none");
    }
    auto [y, z] = cuops::_linear_fwd(x, weight, bias, activation);
    ctx->save_for_backward({x, weight, z});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1];
    const std::string activation = ctx->saved_data["activation"].toStringRef();
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const int64_t n = weight.size(0);
    const at::Tensor x2 = as_rows(x);
    const at::Tensor dy = grads[0].reshape({x2.size(0), n});
    at::Tensor dz = dy, dbias;
    if (activation != "none" || (has_bias && ctx->needs_input_grad(2))) {
      const at::Tensor z = activation != "none" ? saved[2].reshape({x2.size(0), n}) : dy;
      std::tie(dz, dbias) = cuops::_linear_act_bwd(dy, z, activation);
    }
    at::Tensor dx, dweight;
    if (ctx->needs_input_grad(0)) dx = cuops::mm(dz, weight).view(x.sizes());
    if (ctx->needs_input_grad(1)) dweight = cuops::mm(dz.t(), x2);
    return {dx, dweight, has_bias && ctx->needs_input_grad(2) ? dbias : at::Tensor(), at::Tensor()};
  }
};

// Without a gradient to compute, no autograd Function (and no pre-activation kept).
at::Tensor linear_autograd(const at::Tensor& x, const at::Tensor& weight,
                           const std::optional<at::Tensor>& bias, c10::string_view activation) {
  const bool grad = c10::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad() ||
                                                    (bias.has_value() && bias->requires_grad()));
  if (!grad) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return cuops::linear(x, weight, bias, activation);
  }
  return LinearFunction::apply(x, weight, bias, activation);
}

// Under CUDA autocast, as F.linear: every tensor cast to the autocast dtype (a float32 master
// weight through autocast's weight cache).
at::Tensor linear_autocast(const at::Tensor& x, const at::Tensor& weight,
                           const std::optional<at::Tensor>& bias, c10::string_view activation) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  return cuops::linear(autocast_cuda(x), autocast_cuda(weight), autocast_cuda(bias), activation);
}

}  // namespace

TORCH_LIBRARY_IMPL(cuops, CPU, m) {
  m.impl("linear", &linear_cpu);
  m.impl("_linear_fwd", &linear_fwd_cpu);
  m.impl("_linear_act_bwd", &linear_act_bwd_cpu);
}
TORCH_LIBRARY_IMPL(cuops, CUDA, m) {
  m.impl("linear", &linear_cuda);
  m.impl("_linear_fwd", &linear_fwd_cuda);
  m.impl("_linear_act_bwd", &linear_act_bwd_cuda);
}
TORCH_LIBRARY_IMPL(cuops, Meta, m) {
  m.impl("linear", &linear_meta);
  m.impl("_linear_fwd", &linear_fwd_meta);
  m.impl("_linear_act_bwd", &linear_act_bwd_meta);
}
TORCH_LIBRARY_IMPL(cuops, Autograd, m) { m.impl("linear", &linear_autograd); }
TORCH_LIBRARY_IMPL(cuops, AutocastCUDA, m) { m.impl("linear", &linear_autocast); }

}  // namespace cuops::ops
