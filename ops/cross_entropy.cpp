// linear_cross_entropy: the cross-entropy of softmax(x @ weight^T + bias) against target, without the
// [T, V] logits (docs/ops.md#linear_cross_entropy): checks, the vocabulary-chunked computation (CPU
// and CUDA), Meta, Autograd, Autocast. Two internal ops carry the pieces: _linear_cross_entropy_fwd
// returns the loss and each token's log-sum-exp (float32 for half inputs), the only thing the
// backward keeps besides the inputs; _linear_cross_entropy_bwd recomputes the logits chunk by chunk
// and turns each chunk into the gradients' share.
//
// Both passes walk the vocabulary in chunks of vocab_chunk() columns: a chunk's logits [T, chunk]
// are made (CPU: in the accumulation type; CUDA: on cuops::mm in x's dtype, rounded as F.linear
// rounds them, then widened), folded into a running max and sum of exponentials per token
// (forward), or turned into the gradient tile g = scale * (softmax - one-hot) whose products give
// dweight's rows of the chunk (written once) and a share of dx (summed in the accumulation type).
// What a pass allocates beyond its inputs and results is the chunk's tiles and, in the backward,
// dx's float accumulator: bounded by kChunkBytes, not by V. The backward recomputes the logits (four
// products where three would do): the CUDA kernel that keeps the gradient tiles of the forward is
// the next step (docs/performance.md, "linear_cross_entropy").
#include "ops/common.h"

#include <ATen/DeviceGuard.h>

#include <array>
#include <limits>
#include <string_view>

namespace cuops::ops {
namespace {

enum class Reduction { None, Mean, Sum };
constexpr std::array<std::pair<std::string_view, Reduction>, 3> kReductions = {
    {{"none", Reduction::None}, {"mean", Reduction::Mean}, {"sum", Reduction::Sum}}};

Reduction parse_reduction(const char* op, c10::string_view name) {
  for (const auto& [text, r] : kReductions)
    if (std::string_view(name.data(), name.size()) == text) return r;
  TORCH_CHECK(false, "cuops::", op, ": expected reduction to be one of none, mean, sum, got '",
              std::string(name.data(), name.size()), "'");
  return Reduction::Mean;
}

// x [..., K], weight [V, K], target int64 shaped like x's leading dims, bias [V]; x, weight and
// bias of one dtype, everything on one device.
Reduction check_lce(const char* op, const at::Tensor& x, const at::Tensor& weight,
                    const at::Tensor& target, const std::optional<at::Tensor>& bias,
                    c10::string_view reduction) {
  if (bias.has_value())
    check_dtypes_and_devices(op, {{"x", &x}, {"weight", &weight}, {"bias", &*bias}});
  else
    check_dtypes_and_devices(op, {{"x", &x}, {"weight", &weight}});
  TORCH_CHECK(x.dim() >= 1, "cuops::", op, ": expected x to be at least 1-D ([..., K]), got 0-D");
  check_dim(op, "weight", weight, 2);
  TORCH_CHECK(weight.sym_size(1) == x.sym_size(-1), "cuops::", op,
              ": expected weight [V, K] to share K with x's last dimension, got x ", shape_str(x),
              " and weight ", shape_str(weight));
  TORCH_CHECK(target.scalar_type() == at::kLong, "cuops::", op,
              ": expected target to be int64, got ", dtype_name(target.scalar_type()));
  TORCH_CHECK(target.device() == x.device(), "cuops::", op, ": expected target on x's device ",
              x.device(), ", got ", target.device());
  TORCH_CHECK(target.sym_sizes() == x.sym_sizes().slice(0, x.dim() - 1), "cuops::", op,
              ": expected target shaped like x's leading dimensions, got x ", shape_str(x),
              " and target ", shape_str(target));
  if (bias.has_value()) {
    check_dim(op, "bias", *bias, 1);
    TORCH_CHECK(bias->sym_size(0) == weight.sym_size(0), "cuops::", op,
                ": expected bias of shape [", weight.sym_size(0), "] (weight's rows), got ",
                shape_str(*bias));
  }
  return parse_reduction(op, reduction);
}

// The columns of the logits a pass holds at once: the chunk's tiles (the product in x's dtype, its
// float copy, the softmax, the one-hot mask: <= 16 bytes an element) within kChunkBytes, whole
// 64-column blocks, at least one. 256 MiB: with dx's float accumulator (128 MiB at T = 8192, K =
// 4096) under SPEC §1b's bound, 1/8 of the float32 logits at T = 8192, V = 128256 (526 MB).
constexpr int64_t kChunkBytes = int64_t{256} << 20, kChunkElementBytes = 16;

int64_t vocab_chunk(int64_t rows, int64_t vocab) {
  const int64_t cols = kChunkBytes / (kChunkElementBytes * std::max<int64_t>(rows, 1));
  return std::min(vocab, std::max<int64_t>(64, cols / 64 * 64));
}

// Logits of columns [v0, v0 + n) for every row of x2 [T, K], in the accumulation type.
at::Tensor logits_chunk(const at::Tensor& x2, const at::Tensor& weight,
                        const std::optional<at::Tensor>& bias, int64_t v0, int64_t n) {
  const at::Tensor w = weight.narrow(0, v0, n);
  const auto acc = acc_type(x2);
  at::Tensor l;
  if (x2.is_cuda()) {
    l = cuops::mm(x2, w.t());
    if (bias.has_value()) l.add_(bias->narrow(0, v0, n));
    l = l.to(acc);
  } else {
    l = at::matmul(x2.to(acc), w.to(acc).t());
    if (bias.has_value()) l.add_(bias->narrow(0, v0, n).to(acc));
  }
  return l;
}

// [T, n]: true where column v0 + j is row t's target.
at::Tensor one_hot_chunk(const at::Tensor& t, int64_t v0, int64_t n) {
  return at::arange(v0, v0 + n, t.options()).unsqueeze(0) == t.unsqueeze(1);
}

// Tokens whose target is neither ignore_index nor in [0, V): the CPU refuses them (a host check is
// free there); on CUDA their loss is NaN (no device assert, no host sync: SPEC §1b).
at::Tensor out_of_range(const at::Tensor& t, int64_t vocab, int64_t ignore_index) {
  const at::Tensor bad = (t != ignore_index) & ((t < 0) | (t >= vocab));
  if (!t.is_cuda() && t.numel() > 0 && bad.any().item<bool>()) {
    const int64_t first = at::nonzero(bad)[0][0].item<int64_t>();
    TORCH_CHECK(false, "cuops::linear_cross_entropy: target ", t[first].item<int64_t>(),
                " of token ", first, " out of range [0, ", vocab, ") (ignore_index ", ignore_index,
                ")");
  }
  return bad;
}

// ---- forward: the loss as `reduction` says and each token's log-sum-exp [T].

std::tuple<at::Tensor, at::Tensor> lce_fwd(const at::Tensor& x, const at::Tensor& weight,
                                           const at::Tensor& target,
                                           const std::optional<at::Tensor>& bias,
                                           int64_t ignore_index, c10::string_view reduction) {
  constexpr const char* op = "_linear_cross_entropy_fwd";
  const Reduction r = check_lce(op, x, weight, target, bias, reduction);
  const c10::OptionalDeviceGuard guard(at::device_of(x));
  const at::Tensor x2 = as_rows(x), t = target.reshape({-1});
  const int64_t rows = x2.size(0), vocab = weight.size(0);
  const auto acc = acc_type(x);
  const at::Tensor bad = out_of_range(t, vocab, ignore_index);
  at::Tensor m = at::full({rows}, -std::numeric_limits<double>::infinity(), x.options().dtype(acc));
  at::Tensor s = at::zeros({rows}, x.options().dtype(acc)), picked = at::zeros_like(s);
  const int64_t chunk = vocab_chunk(rows, vocab);
  for (int64_t v0 = 0; v0 < vocab && rows > 0; v0 += chunk) {
    const int64_t n = std::min(chunk, vocab - v0);
    at::Tensor l = logits_chunk(x2, weight, bias, v0, n);
    picked.add_(at::where(one_hot_chunk(t, v0, n), l, 0).sum(1));
    const at::Tensor m_new = at::maximum(m, std::get<0>(l.max(1)));
    // Where the max has not moved the factor is 1 (exp(-inf - -inf) would be NaN).
    const at::Tensor rescale = at::where(m_new == m, 1, at::exp(m - m_new));
    s = s * rescale + l.sub_(m_new.unsqueeze(1)).exp_().sum(1);
    m = m_new;
  }
  const at::Tensor lse = m + at::log(s);
  const at::Tensor valid = t != ignore_index;
  at::Tensor loss = at::where(valid, lse - picked, 0);
  loss.masked_fill_(bad, std::numeric_limits<double>::quiet_NaN());
  switch (r) {
    case Reduction::None:
      return {loss.view(target.sizes()), lse};
    case Reduction::Sum:
      return {loss.sum(), lse};
    case Reduction::Mean:  // over the tokens not ignored: 0 / 0 (NaN) when all are, as torch
      return {loss.sum() / valid.sum().to(acc), lse};
  }
  return {loss, lse};
}

// ---- backward: dloss/dlogits = scale_t (softmax - one-hot), scale_t = grad (sum), grad / (tokens
// not ignored) (mean) or grad_t (none), 0 for ignored tokens, NaN for out-of-range ones; then
// dx = g @ weight, dweight = g^T @ x, dbias = g summed over tokens, chunk by chunk.

std::tuple<at::Tensor, at::Tensor, at::Tensor> lce_bwd(const at::Tensor& grad, const at::Tensor& x,
                                                       const at::Tensor& weight,
                                                       const at::Tensor& target,
                                                       const std::optional<at::Tensor>& bias,
                                                       const at::Tensor& lse, int64_t ignore_index,
                                                       c10::string_view reduction) {
  constexpr const char* op = "_linear_cross_entropy_bwd";
  const Reduction r = check_lce(op, x, weight, target, bias, reduction);
  const c10::OptionalDeviceGuard guard(at::device_of(x));
  const at::Tensor x2 = as_rows(x), t = target.reshape({-1});
  const int64_t rows = x2.size(0), vocab = weight.size(0);
  const auto acc = acc_type(x);
  TORCH_CHECK(lse.dim() == 1 && lse.size(0) == rows && lse.scalar_type() == acc, "cuops::", op,
              ": expected lse [", rows, "] of ", dtype_name(acc), ", got ", shape_str(lse), " of ",
              dtype_name(lse.scalar_type()));
  const at::Tensor bad = out_of_range(t, vocab, ignore_index);
  const at::Tensor valid = t != ignore_index;
  at::Tensor scale =
      r == Reduction::None ? grad.reshape({-1}).to(acc) : grad.to(acc).expand({rows});
  if (r == Reduction::Mean) scale = scale / valid.sum().to(acc);
  scale = at::where(valid, scale, 0).masked_fill_(bad, std::numeric_limits<double>::quiet_NaN());
  at::Tensor dx = at::zeros({rows, x2.size(1)}, x.options().dtype(acc));
  at::Tensor dweight = at::empty_like(weight, at::MemoryFormat::Contiguous);
  at::Tensor dbias = at::empty({vocab}, weight.options());
  const int64_t chunk = vocab_chunk(rows, vocab);
  for (int64_t v0 = 0; v0 < vocab; v0 += chunk) {
    const int64_t n = std::min(chunk, vocab - v0);
    at::Tensor g = logits_chunk(x2, weight, bias, v0, n);
    g.sub_(lse.unsqueeze(1)).exp_().sub_(one_hot_chunk(t, v0, n).to(acc)).mul_(scale.unsqueeze(1));
    dbias.narrow(0, v0, n).copy_(g.sum(0));
    const at::Tensor w = weight.narrow(0, v0, n);
    if (x.is_cuda()) {
      const at::Tensor gx = g.to(x.scalar_type());
      dx.add_(cuops::mm(gx, w));
      at::Tensor dw = dweight.narrow(0, v0, n);
      cuops::gemm(dw, gx.t(), x2, 1.0, 0.0);
    } else {
      dx.add_(at::matmul(g, w.to(acc)));
      dweight.narrow(0, v0, n).copy_(at::matmul(g.t(), x2.to(acc)));
    }
  }
  return {dx.to(x.scalar_type()).view(x.sizes()), dweight, dbias};
}

// ---- Meta

std::tuple<at::Tensor, at::Tensor> lce_fwd_meta(const at::Tensor& x, const at::Tensor& weight,
                                                const at::Tensor& target,
                                                const std::optional<at::Tensor>& bias,
                                                int64_t ignore_index, c10::string_view reduction) {
  const Reduction r = check_lce("_linear_cross_entropy_fwd", x, weight, target, bias, reduction);
  const auto opts = x.options().dtype(acc_type(x));
  at::Tensor loss =
      r == Reduction::None ? at::empty_symint(target.sym_sizes(), opts) : at::empty({}, opts);
  return {loss, at::empty_symint({target.sym_numel()}, opts)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lce_bwd_meta(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
    const std::optional<at::Tensor>& bias, const at::Tensor& lse, int64_t ignore_index,
    c10::string_view reduction) {
  check_lce("_linear_cross_entropy_bwd", x, weight, target, bias, reduction);
  return {at::empty_symint(x.sym_sizes(), x.options()),
          at::empty_symint(weight.sym_sizes(), weight.options()),
          at::empty_symint({weight.sym_size(0)}, weight.options())};
}

at::Tensor lce(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
               const std::optional<at::Tensor>& bias, int64_t ignore_index,
               c10::string_view reduction) {
  check_lce("linear_cross_entropy", x, weight, target, bias, reduction);
  return std::get<0>(
      cuops::_linear_cross_entropy_fwd(x, weight, target, bias, ignore_index, reduction));
}

// ---- Autograd: the inputs and each token's log-sum-exp are kept (no logits).

class LinearCrossEntropyFunction : public torch::autograd::Function<LinearCrossEntropyFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& target, const std::optional<at::Tensor>& bias,
                            int64_t ignore_index, c10::string_view reduction) {
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["reduction"] = std::string(reduction.data(), reduction.size());
    ctx->saved_data["has_bias"] = bias.has_value();
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [loss, lse] =
        cuops::_linear_cross_entropy_fwd(x, weight, target, bias, ignore_index, reduction);
    ctx->save_for_backward({x, weight, target, bias.value_or(at::Tensor()), lse});
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const std::optional<at::Tensor> bias =
        has_bias ? std::optional<at::Tensor>(saved[3]) : std::nullopt;
    auto [dx, dweight, dbias] = cuops::_linear_cross_entropy_bwd(
        grads[0], saved[0], saved[1], saved[2], bias, saved[4],
        ctx->saved_data["ignore_index"].toInt(), ctx->saved_data["reduction"].toStringRef());
    return {ctx->needs_input_grad(0) ? dx : at::Tensor(),
            ctx->needs_input_grad(1) ? dweight : at::Tensor(),
            at::Tensor(),
            has_bias && ctx->needs_input_grad(3) ? dbias : at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

at::Tensor lce_autograd(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
                        const std::optional<at::Tensor>& bias, int64_t ignore_index,
                        c10::string_view reduction) {
  check_lce("linear_cross_entropy", x, weight, target, bias, reduction);
  const bool grad = c10::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad() ||
                                                    (bias.has_value() && bias->requires_grad()));
  if (!grad) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return cuops::linear_cross_entropy(x, weight, target, bias, ignore_index, reduction);
  }
  return LinearCrossEntropyFunction::apply(x, weight, target, bias, ignore_index, reduction);
}

// Under CUDA autocast, as F.linear: x, weight and bias cast to the autocast dtype (a float32 master
// weight through autocast's weight cache); the loss is float32 as F.cross_entropy's of autocast's
// float32 logits.
at::Tensor lce_autocast(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
                        const std::optional<at::Tensor>& bias, int64_t ignore_index,
                        c10::string_view reduction) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  return cuops::linear_cross_entropy(autocast_cuda(x), autocast_cuda(weight), target,
                                     autocast_cuda(bias), ignore_index, reduction);
}

}  // namespace

TORCH_LIBRARY_IMPL(cuops, CPU, m) {
  m.impl("linear_cross_entropy", &lce);
  m.impl("_linear_cross_entropy_fwd", &lce_fwd);
  m.impl("_linear_cross_entropy_bwd", &lce_bwd);
}
TORCH_LIBRARY_IMPL(cuops, CUDA, m) {
  m.impl("linear_cross_entropy", &lce);
  m.impl("_linear_cross_entropy_fwd", &lce_fwd);
  m.impl("_linear_cross_entropy_bwd", &lce_bwd);
}
TORCH_LIBRARY_IMPL(cuops, Meta, m) {
  m.impl("linear_cross_entropy", [](const at::Tensor& x, const at::Tensor& weight,
                                    const at::Tensor& target, const std::optional<at::Tensor>& bias,
                                    int64_t ignore_index, c10::string_view reduction) {
    return std::get<0>(lce_fwd_meta(x, weight, target, bias, ignore_index, reduction));
  });
  m.impl("_linear_cross_entropy_fwd", &lce_fwd_meta);
  m.impl("_linear_cross_entropy_bwd", &lce_bwd_meta);
}
TORCH_LIBRARY_IMPL(cuops, Autograd, m) { m.impl("linear_cross_entropy", &lce_autograd); }
TORCH_LIBRARY_IMPL(cuops, AutocastCUDA, m) { m.impl("linear_cross_entropy", &lce_autocast); }

}  // namespace cuops::ops
