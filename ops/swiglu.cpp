// swiglu: act(x @ w_gate^T) * (x @ w_up^T), act silu (SwiGLU) or gelu_tanh (GeGLU: Gemma's MLP)
// (docs/ops.md#swiglu): checks, CPU reference, CUDA, Meta, Autograd, Autocast. The internal op
// _swiglu_fwd also returns the two products g = x @ w_gate^T and u = x @ w_up^T, which the backward
// keeps (only when a gradient is required).
//
// On CUDA the forward is one dual GEMM (kernels/gemm/gemm_wgmma.cuh: both weights' tiles against one
// pass over x, the epilogue forming act(g) * u, and storing g and u only when the backward keeps
// them); where the planner does not fuse (kernels/gemm/gemm_plan.cpp, FusedEpilogueApart) the two
// products run on cuops::mm and act(g) * u in a further pass. The backward keeps g and u rather
// than recomputing them (a third more forward work to save two [rows, I] tensors) and turns dy into
// dg and du in one pass (_swiglu_bwd, kernels/gemm/linear.cu).
#include "ops/common.h"

#include "ops/fused_gemm.h"

namespace cuops::ops {
namespace {

using Act = kernels::Activation;

// x [..., K], w_gate and w_up [I, K] (the same shape); one dtype and device; the gate's name.
Act check_swiglu(const char* op, const at::Tensor& x, const at::Tensor& w_gate,
                 const at::Tensor& w_up, c10::string_view activation) {
  check_dtypes_and_devices(op, {{"x", &x}, {"w_gate", &w_gate}, {"w_up", &w_up}});
  TORCH_CHECK(x.dim() >= 1, "cuops::", op, ": expected x to be at least 1-D ([..., K]), got 0-D");
  check_dim(op, "w_gate", w_gate, 2);
  check_dim(op, "w_up", w_up, 2);
  TORCH_CHECK(w_gate.sym_size(1) == x.sym_size(-1), "cuops::", op,
              ": expected w_gate [I, K] to share K with x's last dimension, got x ", shape_str(x),
              " and w_gate ", shape_str(w_gate));
  check_same_shape(op, {{"w_gate", &w_gate}, {"w_up", &w_up}});
  return parse_gate(op, activation);
}

std::vector<c10::SymInt> out_shape(const at::Tensor& x, const at::Tensor& w_gate) {
  std::vector<c10::SymInt> shape(x.sym_sizes().begin(), x.sym_sizes().end());
  shape.back() = w_gate.sym_size(0);
  return shape;
}

// ---- CPU reference: both products and act(g) * u in the accumulation type (float32 for half
// types, float64 for float64), rounded once to x's dtype; g and u rounded likewise.

std::tuple<at::Tensor, at::Tensor, at::Tensor> swiglu_reference(const at::Tensor& x,
                                                                const at::Tensor& w_gate,
                                                                const at::Tensor& w_up, Act act) {
  const auto acc = acc_type(x);
  const at::Tensor xa = x.to(acc);
  const at::Tensor g = at::matmul(xa, w_gate.to(acc).t());
  const at::Tensor u = at::matmul(xa, w_up.to(acc).t());
  const at::Tensor y = gate_of(g, act) * u;
  return {y.to(x.scalar_type()).contiguous(), g.to(x.scalar_type()).contiguous(),
          u.to(x.scalar_type()).contiguous()};
}

at::Tensor swiglu_cpu(const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up,
                      c10::string_view activation) {
  const Act act = check_swiglu("swiglu", x, w_gate, w_up, activation);
  return std::get<0>(swiglu_reference(x, w_gate, w_up, act));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> swiglu_fwd_cpu(const at::Tensor& x,
                                                              const at::Tensor& w_gate,
                                                              const at::Tensor& w_up,
                                                              c10::string_view activation) {
  const Act act = check_swiglu("_swiglu_fwd", x, w_gate, w_up, activation);
  return swiglu_reference(x, w_gate, w_up, act);  // three new tensors: no output aliases another
}

// ---- CUDA: g and u on cuops::mm (x's leading dims flattened, the weights^T read in place), then
// act(g) * u.

// g and u as [rows, I].
std::pair<at::Tensor, at::Tensor> gate_and_up(const at::Tensor& x, const at::Tensor& w_gate,
                                              const at::Tensor& w_up) {
  const at::Tensor x2 = as_rows(x);
  return {cuops::mm(x2, w_gate.t()), cuops::mm(x2, w_up.t())};
}

// y = act(g) * u [rows, I], and g and u where `keep`, by the dual GEMM; false (nothing enqueued)
// where the planner leaves the epilogue apart.
bool swiglu_fused(const at::Tensor& x2, const at::Tensor& w_gate, const at::Tensor& w_up, Act act,
                  bool keep, at::Tensor& y, at::Tensor& g, at::Tensor& u) {
  const auto shape = {x2.size(0), w_gate.size(0)};
  y = at::empty(shape, x2.options());
  if (keep) g = at::empty(shape, x2.options()), u = at::empty(shape, x2.options());
  FusedEpilogue e;
  e.gated = true;
  e.act = act;
  e.w2 = &w_up;
  e.z = keep ? &g : nullptr;
  e.z2 = keep ? &u : nullptr;
  return run_fused_gemm(y, x2, w_gate, e);
}

at::Tensor swiglu_cuda(const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up,
                       c10::string_view activation) {
  const Act act = check_swiglu("swiglu", x, w_gate, w_up, activation);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y, unused_g, unused_u;
  if (swiglu_fused(as_rows(x), w_gate, w_up, act, false, y, unused_g, unused_u))
    return like_rows_of(y, x, w_gate.size(0));
  auto [g, u] = gate_and_up(x, w_gate, w_up);
  return like_rows_of(gate_of(g, act).mul_(u), x, w_gate.size(0));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> swiglu_fwd_cuda(const at::Tensor& x,
                                                               const at::Tensor& w_gate,
                                                               const at::Tensor& w_up,
                                                               c10::string_view activation) {
  const Act act = check_swiglu("_swiglu_fwd", x, w_gate, w_up, activation);
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t inter = w_gate.size(0);
  at::Tensor y2, g2, u2;
  if (swiglu_fused(as_rows(x), w_gate, w_up, act, true, y2, g2, u2))
    return {like_rows_of(y2, x, inter), like_rows_of(g2, x, inter), like_rows_of(u2, x, inter)};
  auto [g, u] = gate_and_up(x, w_gate, w_up);
  return {like_rows_of(gate_of(g, act).mul_(u), x, inter), like_rows_of(g, x, inter),
          like_rows_of(u, x, inter)};
}

// ---- Meta

at::Tensor swiglu_meta(const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up,
                       c10::string_view activation) {
  check_swiglu("swiglu", x, w_gate, w_up, activation);
  return at::empty_symint(out_shape(x, w_gate), x.options());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> swiglu_fwd_meta(const at::Tensor& x,
                                                               const at::Tensor& w_gate,
                                                               const at::Tensor& w_up,
                                                               c10::string_view activation) {
  check_swiglu("_swiglu_fwd", x, w_gate, w_up, activation);
  return {at::empty_symint(out_shape(x, w_gate), x.options()),
          at::empty_symint(out_shape(x, w_gate), x.options()),
          at::empty_symint(out_shape(x, w_gate), x.options())};
}

// ---- the gate's backward (_swiglu_bwd): dg = dy * u * act'(g), du = dy * act(g), in float32 for
// half types (float64 for float64), each rounded once to the tensors' dtype. dy, g, u are [rows, I].

Act check_swiglu_bwd(const at::Tensor& dy, const at::Tensor& g, const at::Tensor& u,
                     c10::string_view activation) {
  check_dtypes_and_devices("_swiglu_bwd", {{"dy", &dy}, {"g", &g}, {"u", &u}});
  check_dim("_swiglu_bwd", "dy", dy, 2);
  check_same_shape("_swiglu_bwd", {{"dy", &dy}, {"g", &g}, {"u", &u}});
  return parse_gate("_swiglu_bwd", activation);
}

std::tuple<at::Tensor, at::Tensor> swiglu_bwd_cpu(const at::Tensor& dy, const at::Tensor& g,
                                                  const at::Tensor& u,
                                                  c10::string_view activation) {
  const Act act = check_swiglu_bwd(dy, g, u, activation);
  const auto dtype = dy.scalar_type();
  const auto acc = acc_type(dy);
  const at::Tensor dya = dy.to(acc), ga = g.to(acc), ua = u.to(acc);
  const at::Tensor dg =
      act == Act::Silu ? at::silu_backward(dya * ua, ga) : at::gelu_backward(dya * ua, ga, "tanh");
  return {dg.to(dtype).contiguous(), (dya * gate_of(ga, act)).to(dtype).contiguous()};
}

// One pass over dy, g and u (kernels/gemm/linear.cu).
std::tuple<at::Tensor, at::Tensor> swiglu_bwd_cuda(const at::Tensor& dy, const at::Tensor& g,
                                                   const at::Tensor& u,
                                                   c10::string_view activation) {
  const Act act = check_swiglu_bwd(dy, g, u, activation);
  const c10::cuda::CUDAGuard guard(dy.device());
  const int64_t rows = dy.size(0), n = dy.size(1);
  auto rowwise = [&](const at::Tensor& t) {
    return t.stride(1) == 1 && t.stride(0) >= n ? t : t.contiguous();
  };
  const at::Tensor d = rowwise(dy), gg = rowwise(g), uu = rowwise(u);
  at::Tensor dg = at::empty({rows, n}, dy.options()), du = at::empty({rows, n}, dy.options());
  auto ld = [&](const at::Tensor& t) { return rows > 1 ? t.stride(0) : n; };
  C10_CUDA_CHECK(kernels::launch_swiglu_bwd(
      kernel_dtype(dy.scalar_type()), act, d.data_ptr(), ld(d), gg.data_ptr(), ld(gg),
      uu.data_ptr(), ld(uu), rows, n, dg.data_ptr(), du.data_ptr(), current_stream(dy)));
  return {dg, du};
}

std::tuple<at::Tensor, at::Tensor> swiglu_bwd_meta(const at::Tensor& dy, const at::Tensor& g,
                                                   const at::Tensor& u,
                                                   c10::string_view activation) {
  check_swiglu_bwd(dy, g, u, activation);
  return {at::empty_symint(dy.sym_sizes(), dy.options()),
          at::empty_symint(dy.sym_sizes(), dy.options())};
}

// ---- Autograd: with a gradient required, x, the weights, g and u are kept (g and u from
// _swiglu_fwd) and the gate's name; without one, nothing is kept and swiglu runs as is.

class SwigluFunction : public torch::autograd::Function<SwigluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w_gate,
                            const at::Tensor& w_up, bool keep, c10::string_view activation) {
    at::AutoDispatchBelowADInplaceOrView guard;
    if (!keep) return cuops::swiglu(x, w_gate, w_up, activation);
    auto [y, g, u] = cuops::_swiglu_fwd(x, w_gate, w_up, activation);
    ctx->save_for_backward({x, w_gate, w_up, g, u});
    ctx->saved_data["activation"] = std::string(activation.data(), activation.size());
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w_gate = saved[1], &w_up = saved[2];
    const int64_t inter = w_gate.size(0);
    const at::Tensor x2 = as_rows(x);
    const int64_t rows = x2.size(0);
    auto [dg, du] = cuops::_swiglu_bwd(
        grads[0].reshape({rows, inter}), saved[3].reshape({rows, inter}),
        saved[4].reshape({rows, inter}), ctx->saved_data["activation"].toStringRef());
    at::Tensor dx, dw_gate, dw_up;
    if (ctx->needs_input_grad(0)) {
      // dx = dg @ w_gate + du @ w_up: the second product added in its epilogue (beta = 1).
      dx = cuops::mm(dg, w_gate);
      cuops::gemm(dx, du, w_up, 1.0, 1.0);
      dx = dx.view(x.sizes());
    }
    if (ctx->needs_input_grad(1)) dw_gate = cuops::mm(dg.t(), x2);
    if (ctx->needs_input_grad(2)) dw_up = cuops::mm(du.t(), x2);
    return {dx, dw_gate, dw_up, at::Tensor(), at::Tensor()};
  }
};

at::Tensor swiglu_autograd(const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up,
                           c10::string_view activation) {
  const bool keep = c10::GradMode::is_enabled() &&
                    (x.requires_grad() || w_gate.requires_grad() || w_up.requires_grad());
  return SwigluFunction::apply(x, w_gate, w_up, keep, activation);
}

// Under CUDA autocast, as F.linear: every tensor cast to the autocast dtype (float32 master weights
// through autocast's weight cache).
at::Tensor swiglu_autocast(const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up,
                           c10::string_view activation) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  return cuops::swiglu(autocast_cuda(x), autocast_cuda(w_gate), autocast_cuda(w_up), activation);
}

}  // namespace

TORCH_LIBRARY_IMPL(cuops, CPU, m) {
  m.impl("swiglu", &swiglu_cpu);
  m.impl("_swiglu_fwd", &swiglu_fwd_cpu);
  m.impl("_swiglu_bwd", &swiglu_bwd_cpu);
}
TORCH_LIBRARY_IMPL(cuops, CUDA, m) {
  m.impl("swiglu", &swiglu_cuda);
  m.impl("_swiglu_fwd", &swiglu_fwd_cuda);
  m.impl("_swiglu_bwd", &swiglu_bwd_cuda);
}
TORCH_LIBRARY_IMPL(cuops, Meta, m) {
  m.impl("swiglu", &swiglu_meta);
  m.impl("_swiglu_fwd", &swiglu_fwd_meta);
  m.impl("_swiglu_bwd", &swiglu_bwd_meta);
}
TORCH_LIBRARY_IMPL(cuops, Autograd, m) { m.impl("swiglu", &swiglu_autograd); }
TORCH_LIBRARY_IMPL(cuops, AutocastCUDA, m) { m.impl("swiglu", &swiglu_autocast); }

}  // namespace cuops::ops
