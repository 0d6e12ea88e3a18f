// swiglu: silu(x @ w_gate^T) * (x @ w_up^T) (docs/ops.md#swiglu): checks, CPU reference, CUDA, Meta,
// Autograd, Autocast. The internal op _swiglu_fwd also returns the two products g = x @ w_gate^T and
// u = x @ w_up^T, which the backward keeps (only when a gradient is required).
//
// On CUDA the two products run on cuops::mm, one after the other, and silu(g) * u in a further pass
// (torch's elementwise kernels); the dual GEMM (two B operands, one pass over x) with an epilogue
// forming silu(g) * u replaces all three.
#include "ops/common.h"

#include <ATen/autocast_mode.h>

namespace cuops::ops {
namespace {

// x [..., K], w_gate and w_up [I, K] (the same shape); one dtype and device.
void check_swiglu(const char* op, const at::Tensor& x, const at::Tensor& w_gate,
                  const at::Tensor& w_up) {
  check_dtypes_and_devices(op, {{"x", &x}, {"w_gate", &w_gate}, {"w_up", &w_up}});
  TORCH_CHECK(x.dim() >= 1, "cuops::", op, ": expected x to be at least 1-D ([..., K]), got 0-D");
  check_dim(op, "w_gate", w_gate, 2);
  check_dim(op, "w_up", w_up, 2);
  TORCH_CHECK(w_gate.sym_size(1) == x.sym_size(-1), "cuops::", op,
              ": expected w_gate [I, K] to share K with x's last dimension, got x ", shape_str(x),
              " and w_gate ", shape_str(w_gate));
  check_same_shape(op, {{"w_gate", &w_gate}, {"w_up", &w_up}});
}

std::vector<c10::SymInt> out_shape(const at::Tensor& x, const at::Tensor& w_gate) {
  std::vector<c10::SymInt> shape(x.sym_sizes().begin(), x.sym_sizes().end());
  shape.back() = w_gate.sym_size(0);
  return shape;
}

bool is_half(const at::Tensor& t) {
  return t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16;
}

// ---- CPU reference: both products and silu(g) * u in the accumulation type (float32 for half
// types, float64 for float64), rounded once to x's dtype; g and u rounded likewise.

std::tuple<at::Tensor, at::Tensor, at::Tensor> swiglu_reference(const at::Tensor& x,
                                                                const at::Tensor& w_gate,
                                                                const at::Tensor& w_up) {
  const auto acc = is_half(x) ? at::kFloat : x.scalar_type();
  const at::Tensor xa = x.to(acc);
  const at::Tensor g = at::matmul(xa, w_gate.to(acc).t());
  const at::Tensor u = at::matmul(xa, w_up.to(acc).t());
  const at::Tensor y = at::silu(g) * u;
  return {y.to(x.scalar_type()).contiguous(), g.to(x.scalar_type()).contiguous(),
          u.to(x.scalar_type()).contiguous()};
}

at::Tensor swiglu_cpu(const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up) {
  check_swiglu("swiglu", x, w_gate, w_up);
  return std::get<0>(swiglu_reference(x, w_gate, w_up));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> swiglu_fwd_cpu(const at::Tensor& x,
                                                              const at::Tensor& w_gate,
                                                              const at::Tensor& w_up) {
  check_swiglu("_swiglu_fwd", x, w_gate, w_up);
  return swiglu_reference(x, w_gate, w_up);  // three new tensors: no output aliases another
}

// ---- CUDA: g and u on cuops::mm (x's leading dims flattened, the weights^T read in place), then
// silu(g) * u.

// g and u as [rows, I].
std::pair<at::Tensor, at::Tensor> gate_and_up(const at::Tensor& x, const at::Tensor& w_gate,
                                              const at::Tensor& w_up) {
  const at::Tensor x2 = as_rows(x);
  return {cuops::mm(x2, w_gate.t()), cuops::mm(x2, w_up.t())};
}

at::Tensor swiglu_cuda(const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up) {
  check_swiglu("swiglu", x, w_gate, w_up);
  const c10::cuda::CUDAGuard guard(x.device());
  auto [g, u] = gate_and_up(x, w_gate, w_up);
  return like_rows_of(at::silu_(g).mul_(u), x, w_gate.size(0));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> swiglu_fwd_cuda(const at::Tensor& x,
                                                               const at::Tensor& w_gate,
                                                               const at::Tensor& w_up) {
  check_swiglu("_swiglu_fwd", x, w_gate, w_up);
  const c10::cuda::CUDAGuard guard(x.device());
  auto [g, u] = gate_and_up(x, w_gate, w_up);
  return {like_rows_of(at::silu(g).mul_(u), x, w_gate.size(0)), like_rows_of(g, x, w_gate.size(0)),
          like_rows_of(u, x, w_gate.size(0))};
}

// ---- Meta

at::Tensor swiglu_meta(const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up) {
  check_swiglu("swiglu", x, w_gate, w_up);
  return at::empty_symint(out_shape(x, w_gate), x.options());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> swiglu_fwd_meta(const at::Tensor& x,
                                                               const at::Tensor& w_gate,
                                                               const at::Tensor& w_up) {
  check_swiglu("_swiglu_fwd", x, w_gate, w_up);
  return {at::empty_symint(out_shape(x, w_gate), x.options()),
          at::empty_symint(out_shape(x, w_gate), x.options()),
          at::empty_symint(out_shape(x, w_gate), x.options())};
}

// ---- the gate's backward: dg = dy * u * silu'(g), du = dy * silu(g), in float32 for half types
// (float64 for float64), each rounded once to the tensors' dtype. dy, g, u are [rows, I].
std::pair<at::Tensor, at::Tensor> gate_grads(const at::Tensor& dy, const at::Tensor& g,
                                             const at::Tensor& u) {
  const auto dtype = dy.scalar_type();
  const auto acc = is_half(dy) ? at::kFloat : dtype;
  const at::Tensor dya = dy.to(acc), ga = g.to(acc), ua = u.to(acc);
  return {at::silu_backward(dya * ua, ga).to(dtype).contiguous(),
          (dya * at::silu(ga)).to(dtype).contiguous()};
}

// ---- Autograd: with a gradient required, x, the weights, g and u are kept (g and u from
// _swiglu_fwd); without one, nothing is kept and swiglu runs as is.

class SwigluFunction : public torch::autograd::Function<SwigluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w_gate,
                            const at::Tensor& w_up, bool keep) {
    at::AutoDispatchBelowADInplaceOrView guard;
    if (!keep) return cuops::swiglu(x, w_gate, w_up);
    auto [y, g, u] = cuops::_swiglu_fwd(x, w_gate, w_up);
    ctx->save_for_backward({x, w_gate, w_up, g, u});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w_gate = saved[1], &w_up = saved[2];
    const int64_t inter = w_gate.size(0);
    const at::Tensor x2 = as_rows(x);
    const int64_t rows = x2.size(0);
    auto [dg, du] = gate_grads(grads[0].reshape({rows, inter}), saved[3].reshape({rows, inter}),
                               saved[4].reshape({rows, inter}));
    at::Tensor dx, dw_gate, dw_up;
    if (ctx->needs_input_grad(0))
      dx = cuops::mm(dg, w_gate).add_(cuops::mm(du, w_up)).view(x.sizes());
    if (ctx->needs_input_grad(1)) dw_gate = cuops::mm(dg.t(), x2);
    if (ctx->needs_input_grad(2)) dw_up = cuops::mm(du.t(), x2);
    return {dx, dw_gate, dw_up, at::Tensor()};
  }
};

at::Tensor swiglu_autograd(const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up) {
  const bool keep = c10::GradMode::is_enabled() &&
                    (x.requires_grad() || w_gate.requires_grad() || w_up.requires_grad());
  return SwigluFunction::apply(x, w_gate, w_up, keep);
}

// Under CUDA autocast, as F.linear: every tensor cast to the autocast dtype (float32 master weights
// through autocast's weight cache).
at::Tensor swiglu_autocast(const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  const auto dtype = at::autocast::get_autocast_dtype(at::kCUDA);
  return cuops::swiglu(at::autocast::cached_cast(dtype, x, c10::DeviceType::CUDA),
                       at::autocast::cached_cast(dtype, w_gate, c10::DeviceType::CUDA),
                       at::autocast::cached_cast(dtype, w_up, c10::DeviceType::CUDA));
}

}  // namespace

TORCH_LIBRARY_IMPL(cuops, CPU, m) {
  m.impl("swiglu", &swiglu_cpu);
  m.impl("_swiglu_fwd", &swiglu_fwd_cpu);
}
TORCH_LIBRARY_IMPL(cuops, CUDA, m) {
  m.impl("swiglu", &swiglu_cuda);
  m.impl("_swiglu_fwd", &swiglu_fwd_cuda);
}
TORCH_LIBRARY_IMPL(cuops, Meta, m) {
  m.impl("swiglu", &swiglu_meta);
  m.impl("_swiglu_fwd", &swiglu_fwd_meta);
}
TORCH_LIBRARY_IMPL(cuops, Autograd, m) { m.impl("swiglu", &swiglu_autograd); }
TORCH_LIBRARY_IMPL(cuops, AutocastCUDA, m) { m.impl("swiglu", &swiglu_autocast); }

}  // namespace cuops::ops
