// lora_linear and lora_swiglu: linear and swiglu with LoRA adapters (SPEC §1c, docs/ops.md#lora_linear,
// #lora_swiglu): checks, one device-generic forward (CPU, CUDA and Meta through
// CompositeExplicitAutograd), Autograd, Autocast.
//
// An adapter is the frozen-or-not base W [N, K] plus lora_a [R, K] and lora_b [N, R] (its scale folded
// into lora_b by the caller), applied to lora_x (PEFT's dropout of x; x itself where absent):
// y = act(x W^T + (lora_x A^T) B^T + bias). The rank-R update enters the base's own GEMM as an extra K
// chunk, [x | u] [W | B]^T with u = lora_x A^T [rows, R] -- so the activation (swiglu's gate) sees the
// sum, and the output [rows, N] is written once, never read back for a second term. The chunks are
// concatenated along K here (one pass over x and W; the GEMM kernels then run as for linear and
// swiglu); a kernel reading the chunk from its own pointer would drop that pass.
//
// Backward: only what is asked. v = dz B [rows, R] (one read of dz) carries the adapter's share: dx =
// dz W + v A (x's gradient through base and adapter; to lora_x where it is apart), dA = v^T lora_x,
// dB = dz^T u; a frozen W (PEFT's base) gets no product. Every sum is cuops::mm's fixed-order one.
#include "ops/common.h"

#include "ops/fused_gemm.h"

#include <string_view>

namespace cuops::ops {
namespace {

// [..., K] as [rows, K] with symbolic sizes (Meta under torch.compile sees SymInts).
at::Tensor rows_of(const at::Tensor& x) {
  c10::SymInt rows = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) rows *= x.sym_size(d);
  return x.reshape_symint({rows, x.sym_size(-1)});
}

// t2 [rows, n] viewed as x's leading dims by n.
at::Tensor like_x(const at::Tensor& t2, const at::Tensor& x, const c10::SymInt& n) {
  std::vector<c10::SymInt> shape(x.sym_sizes().begin(), x.sym_sizes().end());
  shape.back() = n;
  return t2.view_symint(shape);
}

// x [..., K]; each weight [N, K] with its adapter's lora_b [N, R]; lora_a [R, K]; lora_x x's shape;
// bias [N]; one dtype and device.
void check_lora(const char* op, const at::Tensor& x, std::initializer_list<NamedTensor> weights,
                std::initializer_list<NamedTensor> bs, const at::Tensor& lora_a,
                const std::optional<at::Tensor>& lora_x, const std::optional<at::Tensor>& bias) {
  std::vector<NamedTensor> all = {{"x", &x}, {"lora_a", &lora_a}};
  all.insert(all.end(), weights.begin(), weights.end());
  all.insert(all.end(), bs.begin(), bs.end());
  if (lora_x.has_value()) all.push_back({"lora_x", &*lora_x});
  if (bias.has_value()) all.push_back({"bias", &*bias});
  check_dtypes_and_devices(op, all);
  TORCH_CHECK(x.dim() >= 1, "cuops::", op, ": expected x to be at least 1-D ([..., K]), got 0-D");
  check_dim(op, "lora_a", lora_a, 2);
  if (lora_x.has_value()) {
    // lora_x may be wider than x (several adapters' dropped inputs side by side, lora_a
    // block-diagonal over them): its rows are x's.
    TORCH_CHECK(
        lora_x->dim() == x.dim() &&
            lora_x->sym_sizes().slice(0, x.dim() - 1).equals(x.sym_sizes().slice(0, x.dim() - 1)),
        "cuops::", op, ": expected lora_x [..., K'] to have x's leading dimensions, got x ",
        shape_str(x), " and lora_x ", shape_str(*lora_x));
    TORCH_CHECK(lora_a.sym_size(1) == lora_x->sym_size(-1), "cuops::", op,
                ": expected lora_a [R, K'] to share K' with lora_x's last dimension, got lora_x ",
                shape_str(*lora_x), " and lora_a ", shape_str(lora_a));
  } else {
    TORCH_CHECK(lora_a.sym_size(1) == x.sym_size(-1), "cuops::", op,
                ": expected lora_a [R, K] to share K with x's last dimension, got x ", shape_str(x),
                " and lora_a ", shape_str(lora_a));
  }
  const at::Tensor& w0 = *weights.begin()->second;
  auto b = bs.begin();
  for (const auto& [name, w] : weights) {
    check_dim(op, name, *w, 2);
    TORCH_CHECK(w->sym_size(1) == x.sym_size(-1), "cuops::", op, ": expected ", name,
                " [N, K] to share K with x's last dimension, got x ", shape_str(x), " and ", name,
                " ", shape_str(*w));
    TORCH_CHECK(w->sym_sizes().equals(w0.sym_sizes()), "cuops::", op, ": expected ", name,
                " to have the shape of ", weights.begin()->first, " ", shape_str(w0), ", got ",
                shape_str(*w));
    const auto& [bname, bt] = *b++;
    check_dim(op, bname, *bt, 2);
    TORCH_CHECK(bt->sym_size(0) == w->sym_size(0) && bt->sym_size(1) == lora_a.sym_size(0),
                "cuops::", op, ": expected ", bname, " [N, R] (", name,
                "'s rows by lora_a's rows) of shape [", w->sym_size(0), ", ", lora_a.sym_size(0),
                "], got ", shape_str(*bt));
  }
  if (bias.has_value()) {
    check_dim(op, "bias", *bias, 1);
    TORCH_CHECK(bias->sym_size(0) == w0.sym_size(0), "cuops::", op, ": expected bias [N] of ",
                w0.sym_size(0), " elements, got ", shape_str(*bias));
  }
}

// ([x | lora_x A^T] [rows, K + R], u = lora_x A^T [rows, R]): the product's input with the adapter's
// K chunk beside x's, u rounded to x's dtype as PEFT's lora_A output is.
std::pair<at::Tensor, at::Tensor> extended_input(const at::Tensor& x, const at::Tensor& lora_a,
                                                 const std::optional<at::Tensor>& lora_x) {
  const at::Tensor x2 = rows_of(x);
  const at::Tensor u = cuops::mm(lora_x.has_value() ? rows_of(*lora_x) : x2, lora_a.t());
  return {at::cat({x2, u}, 1), u};
}

at::Tensor no_pre(const at::Tensor& x) { return at::empty({0}, x.options()); }

// ---- lora_linear

std::tuple<at::Tensor, at::Tensor, at::Tensor> lora_linear_fwd(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& lora_a,
    const at::Tensor& lora_b, const std::optional<at::Tensor>& bias, c10::string_view activation,
    const std::optional<at::Tensor>& lora_x) {
  check_lora("lora_linear", x, {{"weight", &weight}}, {{"lora_b", &lora_b}}, lora_a, lora_x, bias);
  parse_act("lora_linear", activation);
  auto [xe, u] = extended_input(x, lora_a, lora_x);
  const at::Tensor we = at::cat({weight, lora_b}, 1);
  const c10::SymInt n = weight.sym_size(0), r = lora_a.sym_size(0);
  if (std::string_view(activation.data(), activation.size()) == "none")
    return {like_x(cuops::linear(xe, we, bias, "none"), x, n), no_pre(x), like_x(u, x, r)};
  auto [y, pre] = cuops::_linear_fwd(xe, we, bias, activation);
  return {like_x(y, x, n), like_x(pre, x, n), like_x(u, x, r)};
}

at::Tensor lora_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& lora_a,
                       const at::Tensor& lora_b, const std::optional<at::Tensor>& bias,
                       c10::string_view activation, const std::optional<at::Tensor>& lora_x) {
  check_lora("lora_linear", x, {{"weight", &weight}}, {{"lora_b", &lora_b}}, lora_a, lora_x, bias);
  parse_act("lora_linear", activation);
  auto [xe, u] = extended_input(x, lora_a, lora_x);
  return like_x(cuops::linear(xe, at::cat({weight, lora_b}, 1), bias, activation), x,
                weight.sym_size(0));
}

// The adapter's gradients and x's (or lora_x's) share, from z's gradient(s) dz_i [rows, N] against
// their lora_b_i (swiglu: gate and up): v = sum dz_i B_i, dA = v^T lora_x, dB_i = dz_i^T u; dx (x's
// gradient through the bases, or undefined) gets v A added unless lora_x is apart, which gets v A.
struct AdapterGrads {
  at::Tensor da, dlora_x;
  std::vector<at::Tensor> db;
};
AdapterGrads adapter_grads(AutogradContext* ctx, const std::vector<at::Tensor>& dz,
                           const std::vector<at::Tensor>& lora_b, const at::Tensor& lora_a,
                           const at::Tensor& lx2, const at::Tensor& u2, bool apart, at::Tensor& dx,
                           int64_t i_a, int64_t i_b, int64_t i_lora_x) {
  AdapterGrads g;
  const bool to_x = dx.defined() && !apart, to_lx = apart && ctx->needs_input_grad(i_lora_x);
  if (to_x || to_lx || ctx->needs_input_grad(i_a)) {
    at::Tensor v = cuops::mm(dz[0], lora_b[0]);
    for (size_t i = 1; i < dz.size(); ++i) cuops::gemm(v, dz[i], lora_b[i], 1.0, 1.0);
    if (to_x) cuops::gemm(dx, v, lora_a, 1.0, 1.0);
    if (to_lx) g.dlora_x = cuops::mm(v, lora_a);
    if (ctx->needs_input_grad(i_a)) g.da = cuops::mm(v.t(), lx2);
  }
  for (size_t i = 0; i < dz.size(); ++i)
    g.db.push_back(ctx->needs_input_grad(i_b + i) ? cuops::mm(dz[i].t(), u2) : at::Tensor());
  return g;
}

at::Tensor optional_or_undefined(const std::optional<at::Tensor>& t) {
  return t.has_value() ? *t : at::Tensor();
}

class LoraLinearFunction : public torch::autograd::Function<LoraLinearFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& lora_a, const at::Tensor& lora_b,
                            const std::optional<at::Tensor>& bias, c10::string_view activation,
                            const std::optional<at::Tensor>& lora_x) {
    ctx->saved_data["activation"] = std::string(activation.data(), activation.size());
    ctx->saved_data["has_bias"] = bias.has_value();
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [y, pre, u] = cuops::_lora_linear_fwd(x, weight, lora_a, lora_b, bias, activation, lora_x);
    ctx->save_for_backward({x, weight, lora_a, lora_b, pre, u, optional_or_undefined(lora_x)});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &lora_a = saved[2], &lora_b = saved[3];
    const std::string activation = ctx->saved_data["activation"].toStringRef();
    const bool has_bias = ctx->saved_data["has_bias"].toBool(), apart = saved[6].defined();
    const at::Tensor x2 = rows_of(x);
    const int64_t rows = x2.size(0), n = weight.size(0);
    const at::Tensor dy = grads[0].reshape({rows, n});
    at::Tensor dz = dy, dbias;
    if (activation != "none" || (has_bias && ctx->needs_input_grad(4))) {
      const at::Tensor z = activation != "none" ? saved[4].reshape({rows, n}) : dy;
      std::tie(dz, dbias) = cuops::_linear_act_bwd(dy, z, activation);
    }
    at::Tensor dx, dweight;
    if (ctx->needs_input_grad(0)) dx = cuops::mm(dz, weight);
    if (ctx->needs_input_grad(1)) dweight = cuops::mm(dz.t(), x2);
    const at::Tensor u2 = saved[5].reshape({rows, lora_a.size(0)});
    // needs_input_grad counts the tensors given (not activation, not an absent bias).
    AdapterGrads g = adapter_grads(ctx, {dz}, {lora_b}, lora_a, apart ? rows_of(saved[6]) : x2, u2,
                                   apart, dx, 2, 3, has_bias ? 5 : 4);
    return {dx.defined() ? dx.view(x.sizes()) : dx,
            dweight,
            g.da,
            g.db[0],
            has_bias && ctx->needs_input_grad(4) ? dbias : at::Tensor(),
            at::Tensor(),
            g.dlora_x.defined() ? g.dlora_x.view(saved[6].sizes()) : g.dlora_x};
  }
};

bool any_requires_grad(std::initializer_list<const at::Tensor*> ts,
                       std::initializer_list<const std::optional<at::Tensor>*> opts) {
  if (!c10::GradMode::is_enabled()) return false;
  for (const at::Tensor* t : ts)
    if (t->requires_grad()) return true;
  for (const auto* t : opts)
    if (t->has_value() && (*t)->requires_grad()) return true;
  return false;
}

at::Tensor lora_linear_autograd(const at::Tensor& x, const at::Tensor& weight,
                                const at::Tensor& lora_a, const at::Tensor& lora_b,
                                const std::optional<at::Tensor>& bias, c10::string_view activation,
                                const std::optional<at::Tensor>& lora_x) {
  if (!any_requires_grad({&x, &weight, &lora_a, &lora_b}, {&bias, &lora_x})) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return cuops::lora_linear(x, weight, lora_a, lora_b, bias, activation, lora_x);
  }
  return LoraLinearFunction::apply(x, weight, lora_a, lora_b, bias, activation, lora_x);
}

// ---- lora_swiglu

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> lora_swiglu_fwd(
    const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up, const at::Tensor& lora_a,
    const at::Tensor& lora_b_gate, const at::Tensor& lora_b_up,
    const std::optional<at::Tensor>& lora_x, c10::string_view activation) {
  check_lora("lora_swiglu", x, {{"w_gate", &w_gate}, {"w_up", &w_up}},
             {{"lora_b_gate", &lora_b_gate}, {"lora_b_up", &lora_b_up}}, lora_a, lora_x,
             std::nullopt);
  parse_gate("lora_swiglu", activation);
  auto [xe, lu] = extended_input(x, lora_a, lora_x);
  auto [y, g, u] = cuops::_swiglu_fwd(xe, at::cat({w_gate, lora_b_gate}, 1),
                                      at::cat({w_up, lora_b_up}, 1), activation);
  const c10::SymInt n = w_gate.sym_size(0);
  return {like_x(y, x, n), like_x(g, x, n), like_x(u, x, n), like_x(lu, x, lora_a.sym_size(0))};
}

at::Tensor lora_swiglu(const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up,
                       const at::Tensor& lora_a, const at::Tensor& lora_b_gate,
                       const at::Tensor& lora_b_up, const std::optional<at::Tensor>& lora_x,
                       c10::string_view activation) {
  check_lora("lora_swiglu", x, {{"w_gate", &w_gate}, {"w_up", &w_up}},
             {{"lora_b_gate", &lora_b_gate}, {"lora_b_up", &lora_b_up}}, lora_a, lora_x,
             std::nullopt);
  parse_gate("lora_swiglu", activation);
  auto [xe, lu] = extended_input(x, lora_a, lora_x);
  return like_x(cuops::swiglu(xe, at::cat({w_gate, lora_b_gate}, 1), at::cat({w_up, lora_b_up}, 1),
                              activation),
                x, w_gate.sym_size(0));
}

class LoraSwigluFunction : public torch::autograd::Function<LoraSwigluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w_gate,
                            const at::Tensor& w_up, const at::Tensor& lora_a,
                            const at::Tensor& lora_b_gate, const at::Tensor& lora_b_up,
                            const std::optional<at::Tensor>& lora_x, c10::string_view activation) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [y, g, u, lu] = cuops::_lora_swiglu_fwd(x, w_gate, w_up, lora_a, lora_b_gate, lora_b_up,
                                                 lora_x, activation);
    ctx->save_for_backward(
        {x, w_gate, w_up, lora_a, lora_b_gate, lora_b_up, g, u, lu, optional_or_undefined(lora_x)});
    ctx->saved_data["activation"] = std::string(activation.data(), activation.size());
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w_gate = saved[1], &w_up = saved[2], &lora_a = saved[3];
    const bool apart = saved[9].defined();
    const at::Tensor x2 = rows_of(x);
    const int64_t rows = x2.size(0), inter = w_gate.size(0);
    auto [dg, du] = cuops::_swiglu_bwd(
        grads[0].reshape({rows, inter}), saved[6].reshape({rows, inter}),
        saved[7].reshape({rows, inter}), ctx->saved_data["activation"].toStringRef());
    at::Tensor dx, dw_gate, dw_up;
    if (ctx->needs_input_grad(0)) {
      dx = cuops::mm(dg, w_gate);
      cuops::gemm(dx, du, w_up, 1.0, 1.0);
    }
    if (ctx->needs_input_grad(1)) dw_gate = cuops::mm(dg.t(), x2);
    if (ctx->needs_input_grad(2)) dw_up = cuops::mm(du.t(), x2);
    const at::Tensor u2 = saved[8].reshape({rows, lora_a.size(0)});
    AdapterGrads g = adapter_grads(ctx, {dg, du}, {saved[4], saved[5]}, lora_a,
                                   apart ? rows_of(saved[9]) : x2, u2, apart, dx, 3, 4, 6);
    return {dx.defined() ? dx.view(x.sizes()) : dx,
            dw_gate,
            dw_up,
            g.da,
            g.db[0],
            g.db[1],
            g.dlora_x.defined() ? g.dlora_x.view(saved[9].sizes()) : g.dlora_x,
            at::Tensor()};
  }
};

at::Tensor lora_swiglu_autograd(const at::Tensor& x, const at::Tensor& w_gate,
                                const at::Tensor& w_up, const at::Tensor& lora_a,
                                const at::Tensor& lora_b_gate, const at::Tensor& lora_b_up,
                                const std::optional<at::Tensor>& lora_x,
                                c10::string_view activation) {
  if (!any_requires_grad({&x, &w_gate, &w_up, &lora_a, &lora_b_gate, &lora_b_up}, {&lora_x})) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return cuops::lora_swiglu(x, w_gate, w_up, lora_a, lora_b_gate, lora_b_up, lora_x, activation);
  }
  return LoraSwigluFunction::apply(x, w_gate, w_up, lora_a, lora_b_gate, lora_b_up, lora_x,
                                   activation);
}

// ---- Under CUDA autocast, as PEFT's F.linear calls: every tensor cast to the autocast dtype.

at::Tensor lora_linear_autocast(const at::Tensor& x, const at::Tensor& weight,
                                const at::Tensor& lora_a, const at::Tensor& lora_b,
                                const std::optional<at::Tensor>& bias, c10::string_view activation,
                                const std::optional<at::Tensor>& lora_x) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  return cuops::lora_linear(autocast_cuda(x), autocast_cuda(weight), autocast_cuda(lora_a),
                            autocast_cuda(lora_b), autocast_cuda(bias), activation,
                            autocast_cuda(lora_x));
}

at::Tensor lora_swiglu_autocast(const at::Tensor& x, const at::Tensor& w_gate,
                                const at::Tensor& w_up, const at::Tensor& lora_a,
                                const at::Tensor& lora_b_gate, const at::Tensor& lora_b_up,
                                const std::optional<at::Tensor>& lora_x,
                                c10::string_view activation) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  return cuops::lora_swiglu(autocast_cuda(x), autocast_cuda(w_gate), autocast_cuda(w_up),
                            autocast_cuda(lora_a), autocast_cuda(lora_b_gate),
                            autocast_cuda(lora_b_up), autocast_cuda(lora_x), activation);
}

}  // namespace

// One forward for every device: the pieces it calls (cuops::mm, linear, _linear_fwd, _swiglu_fwd,
// at::cat) are each registered for CPU, CUDA and Meta.
TORCH_LIBRARY_IMPL(cuops, CompositeExplicitAutograd, m) {
  m.impl("lora_linear", &lora_linear);
  m.impl("_lora_linear_fwd", &lora_linear_fwd);
  m.impl("lora_swiglu", &lora_swiglu);
  m.impl("_lora_swiglu_fwd", &lora_swiglu_fwd);
}
TORCH_LIBRARY_IMPL(cuops, Autograd, m) {
  m.impl("lora_linear", &lora_linear_autograd);
  m.impl("lora_swiglu", &lora_swiglu_autograd);
}
TORCH_LIBRARY_IMPL(cuops, AutocastCUDA, m) {
  m.impl("lora_linear", &lora_linear_autocast);
  m.impl("lora_swiglu", &lora_swiglu_autocast);
}

}  // namespace cuops::ops
