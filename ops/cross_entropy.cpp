// linear_cross_entropy: the cross-entropy of softmax(x @ weight^T + bias) against target, without the
// [T, V] logits (docs/ops.md#linear_cross_entropy): checks, the CPU reference, the CUDA path, Meta,
// Autograd, Autocast. Three internal ops carry the pieces: _linear_cross_entropy_fwd returns the
// loss and each token's log-sum-exp (float32 for half inputs); _linear_cross_entropy_bwd makes the
// gradients from them, making the logits again; _linear_cross_entropy_fwd_grad returns a loss of
// one value with its gradients for a gradient of 1, from one making of the logits (what training
// runs: the backward only scales them).
//
// The CPU walks the vocabulary in chunks (vocab_chunk), in the accumulation type; CUDA walks the
// tokens in chunks (token_chunk), each chunk's logits made once by the GEMM and consumed by
// kernels/loss/cross_entropy.cu's pass. What either allocates beyond its inputs and results is bounded
// by its chunk, not by V (SPEC §1b).
#include "ops/common.h"

#include <ATen/FunctionalTensorWrapper.h>
#include <torch/csrc/autograd/graph_task.h>

#include <array>
#include <cmath>
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

// The logits' softcap c (each logit read as c tanh(z / c)): > 0 and finite, or none (0 here).
double cap_of(const char* op, std::optional<double> softcap) {
  if (!softcap.has_value()) return 0.0;
  TORCH_CHECK(*softcap > 0.0 && std::isfinite(*softcap), "cuops::", op,
              ": expected softcap > 0 and finite (or None), got ", *softcap);
  return *softcap;
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

// The backward's inputs besides check_lce's: grad shaped like the loss, lse [T] in the
// accumulation type.
Reduction check_lce_bwd(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight,
                        const at::Tensor& target, const std::optional<at::Tensor>& bias,
                        const at::Tensor& lse, c10::string_view reduction) {
  constexpr const char* op = "_linear_cross_entropy_bwd";
  const Reduction r = check_lce(op, x, weight, target, bias, reduction);
  const auto acc = acc_type(x);
  TORCH_CHECK(lse.dim() == 1 && lse.sym_size(0) == target.sym_numel() && lse.scalar_type() == acc,
              "cuops::", op, ": expected lse [", target.sym_numel(), "] of ", dtype_name(acc),
              ", got ", shape_str(lse), " of ", dtype_name(lse.scalar_type()));
  TORCH_CHECK(r == Reduction::None ? grad.sym_sizes() == target.sym_sizes() : grad.dim() == 0,
              "cuops::", op, ": expected grad shaped like the loss (",
              r == Reduction::None ? "target's shape" : "0-D", "), got ", shape_str(grad));
  TORCH_CHECK(grad.device() == x.device(), "cuops::", op, ": expected grad on x's device ",
              x.device(), ", got ", grad.device());
  return r;
}

// The forward that also makes the gradients: a loss of one value (mean or sum), whose gradient the
// backward only scales.
Reduction check_lce_fwd_grad(const at::Tensor& x, const at::Tensor& weight,
                             const at::Tensor& target, const std::optional<at::Tensor>& bias,
                             c10::string_view reduction) {
  constexpr const char* op = "_linear_cross_entropy_fwd_grad";
  const Reduction r = check_lce(op, x, weight, target, bias, reduction);
  TORCH_CHECK(r != Reduction::None, "cuops::", op,
              ": expected reduction mean or sum (a loss of one value), got 'none'");
  return r;
}

// The CPU's columns of the logits a pass holds at once: the chunk's tiles (the product, the softmax,
// the one-hot mask: <= 16 bytes an element) within kChunkBytes, whole 64-column blocks, at least
// one.
constexpr int64_t kChunkBytes = int64_t{256} << 20, kChunkElementBytes = 16;

int64_t vocab_chunk(int64_t rows, int64_t vocab) {
  const int64_t cols = kChunkBytes / (kChunkElementBytes * std::max<int64_t>(rows, 1));
  return std::min(vocab, std::max<int64_t>(64, cols / 64 * 64));
}

// Logits of columns [v0, v0 + n) for every row of x2 [T, K], in the accumulation type (CPU), as
// the loss reads them: c tanh(z / c) under a softcap c > 0.
at::Tensor logits_chunk(const at::Tensor& x2, const at::Tensor& weight,
                        const std::optional<at::Tensor>& bias, int64_t v0, int64_t n, double cap) {
  const auto acc = acc_type(x2);
  at::Tensor l = at::matmul(x2.to(acc), weight.narrow(0, v0, n).to(acc).t());
  if (bias.has_value()) l.add_(bias->narrow(0, v0, n).to(acc));
  if (cap > 0.0) l.div_(cap).tanh_().mul_(cap);
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

// The loss as `reduction` says from each token's loss [T] (0 where ignored, NaN where out of range).
at::Tensor reduce_loss(const at::Tensor& loss, const at::Tensor& valid, Reduction r,
                       const at::Tensor& target) {
  switch (r) {
    case Reduction::None:
      return loss.view(target.sizes());
    case Reduction::Sum:
      return loss.sum();
    case Reduction::Mean:  // over the tokens not ignored: 0 / 0 (NaN) when all are, as torch
      return loss.sum() / valid.sum().to(loss.scalar_type());
  }
  return loss;
}

// ---- CPU (the reference): the vocabulary in chunks; the forward folds each chunk's logits into a
// running max and sum of exponentials per token, the backward makes them again.

std::tuple<at::Tensor, at::Tensor> fwd_cpu(const at::Tensor& x, const at::Tensor& weight,
                                           const at::Tensor& target,
                                           const std::optional<at::Tensor>& bias,
                                           int64_t ignore_index, c10::string_view reduction,
                                           std::optional<double> softcap) {
  const Reduction r = check_lce("_linear_cross_entropy_fwd", x, weight, target, bias, reduction);
  const double cap = cap_of("_linear_cross_entropy_fwd", softcap);
  const at::Tensor x2 = as_rows(x), t = target.reshape({-1});
  const int64_t rows = x2.size(0), vocab = weight.size(0);
  const auto acc = acc_type(x);
  const at::Tensor bad = out_of_range(t, vocab, ignore_index);
  at::Tensor m = at::full({rows}, -std::numeric_limits<double>::infinity(), x.options().dtype(acc));
  at::Tensor s = at::zeros({rows}, x.options().dtype(acc)), picked = at::zeros_like(s);
  const int64_t chunk = vocab_chunk(rows, vocab);
  for (int64_t v0 = 0; v0 < vocab && rows > 0; v0 += chunk) {
    const int64_t n = std::min(chunk, vocab - v0);
    at::Tensor l = logits_chunk(x2, weight, bias, v0, n, cap);
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
  return {reduce_loss(loss, valid, r, target), lse};
}

// Each token's factor of the loss's gradient: grad (sum), grad / (tokens not ignored) (mean), or
// grad_t (none), as a tensor of one value (stride 0 across tokens) or one a token.
std::pair<at::Tensor, int64_t> grad_scale(const at::Tensor& grad, const at::Tensor& valid,
                                          Reduction r, at::ScalarType acc) {
  if (r == Reduction::None) return {grad.reshape({-1}).to(acc).contiguous(), 1};
  at::Tensor scale = grad.to(acc).reshape({1});
  if (r == Reduction::Mean) scale = scale / valid.sum().to(acc);
  return {scale, 0};
}

// dloss/dlogits = scale_t (softmax - one-hot), 0 for ignored tokens, NaN for out-of-range ones
// (under a softcap times its derivative 1 - (l / c)^2, l the capped logit); then dx = g @ weight,
// dweight = g^T @ x, dbias = g summed over tokens, chunk by chunk.
std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_cpu(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
    const std::optional<at::Tensor>& bias, const at::Tensor& lse, int64_t ignore_index,
    c10::string_view reduction, std::optional<double> softcap) {
  const Reduction r = check_lce_bwd(grad, x, weight, target, bias, lse, reduction);
  const double cap = cap_of("_linear_cross_entropy_bwd", softcap);
  const at::Tensor x2 = as_rows(x), t = target.reshape({-1});
  const int64_t rows = x2.size(0), vocab = weight.size(0);
  const auto acc = acc_type(x);
  const at::Tensor bad = out_of_range(t, vocab, ignore_index);
  const at::Tensor valid = t != ignore_index;
  at::Tensor scale = grad_scale(grad, valid, r, acc).first.expand({rows});
  scale = at::where(valid, scale, 0).masked_fill_(bad, std::numeric_limits<double>::quiet_NaN());
  at::Tensor dx = at::zeros({rows, x2.size(1)}, x.options().dtype(acc));
  at::Tensor dweight = at::empty_like(weight, at::MemoryFormat::Contiguous);
  at::Tensor dbias = at::empty({vocab}, weight.options());
  const int64_t chunk = vocab_chunk(rows, vocab);
  for (int64_t v0 = 0; v0 < vocab; v0 += chunk) {
    const int64_t n = std::min(chunk, vocab - v0);
    at::Tensor g = logits_chunk(x2, weight, bias, v0, n, cap);
    const at::Tensor slope = cap > 0.0 ? 1 - (g / cap).square() : at::Tensor();
    g.sub_(lse.unsqueeze(1)).exp_().sub_(one_hot_chunk(t, v0, n).to(acc)).mul_(scale.unsqueeze(1));
    if (slope.defined()) g.mul_(slope);
    dbias.narrow(0, v0, n).copy_(g.sum(0));
    dx.add_(at::matmul(g, weight.narrow(0, v0, n).to(acc)));
    dweight.narrow(0, v0, n).copy_(at::matmul(g.t(), x2.to(acc)));
  }
  return {dx.to(x.scalar_type()).view(x.sizes()), dweight, dbias};
}

// A gradient fwd_grad's output_mask leaves out: an empty [0] of its dtype.
at::Tensor left_out(const at::Tensor& like) { return at::empty({0}, like.options()); }

// The loss and its gradients for a gradient of 1 (mean and sum): the forward and the backward.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fwd_grad_cpu(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
    const std::optional<at::Tensor>& bias, int64_t ignore_index, c10::string_view reduction,
    std::array<bool, 3> output_mask, std::optional<double> softcap) {
  check_lce_fwd_grad(x, weight, target, bias, reduction);
  cap_of("_linear_cross_entropy_fwd_grad", softcap);
  auto [loss, lse] = fwd_cpu(x, weight, target, bias, ignore_index, reduction, softcap);
  auto [dx, dweight, dbias] =
      bwd_cpu(at::ones_like(loss), x, weight, target, bias, lse, ignore_index, reduction, softcap);
  return {loss, output_mask[0] ? dx : left_out(x), output_mask[1] ? dweight : left_out(weight),
          output_mask[2] ? dbias : left_out(weight)};
}

// ---- CUDA: the tokens in chunks. A chunk's logits [rows, V] are made once by the GEMM (in x's
// dtype, rounded as F.linear rounds them) into one buffer; kernels/loss/cross_entropy.cu's pass takes
// each row's log-sum-exp and loss from them and, where gradients are made, overwrites them with
// the gradient g = scale_t (softmax - one-hot), from which two more products give dx's rows of the
// chunk and add the chunk's share to dweight (beta = 1 after the first chunk: TMA's reduce-add).
// Three products (6TVK) and no [T, V] buffer; the chunk is written by the GEMM, read and
// overwritten by the pass, read by the two products. Its rows are the most whose logits fit
// kLogitsChunkBytes and 1/8 of the float32 logits, in whole 128-row tiles (token_chunk).
//
// 480 MiB: with the products' workspace (a split tail's, <= 17 MB) and the [T] vectors, what the op
// adds stays under SPEC §1b's 526 MB (1/8 of the float32 logits at T = 8192, V = 128256), where the
// chunk is 1920 rows. A larger chunk makes fewer passes over dweight (one read and write of it a
// chunk after the first) and fuller waves of the dx product's tiles: 1920 rows are 120 tiles of
// 128 x 256 at K = 2048 (0.91 of 132 SMs).
// And at most 1/8 of the float32 logits [T, V] at every V (SPEC §1b's bound, which the cap alone
// gave only at V = 128256: at V = 32000 it took 7808 rows, 500 MB, where the bound is 131 MB; in
// bf16 the bound is T / 4 rows), but never under one 128-row tile: a smaller chunk would re-read
// the whole weight for a few rows (a T of 16 in chunks of 4 read it four times).
constexpr int64_t kLogitsChunkBytes = int64_t{480} << 20;

int64_t token_chunk(int64_t rows, int64_t vocab, int64_t ld, int64_t element_bytes) {
  const int64_t row_bytes = ld * element_bytes;
  const int64_t eighth = std::max<int64_t>(rows * vocab * 4 / 8 / row_bytes, 128);
  const int64_t fit = std::min(kLogitsChunkBytes / row_bytes, eighth);
  return std::min(rows, fit >= 128 ? fit / 128 * 128 : std::max<int64_t>(fit, 1));
}

// What a walk over the token chunks makes: lse [T] (computed when `stats`, else read), each token's
// loss [T] (when defined), and, where scale is defined, the gradient of the logits from it (one
// value a token, or one for all when scale_stride is 0) and from that the gradients defined here.
struct ChunkWalk {
  bool stats = true;
  double softcap = 0.0;  // > 0: the logits read as c tanh(z / c)
  at::Tensor lse, loss;
  at::Tensor scale;
  int64_t scale_stride = 0;
  at::Tensor dx, dweight, dbias;  // dbias: float accumulator for half types, defined with bias
};

void walk_token_chunks(const at::Tensor& x2, const at::Tensor& weight, const at::Tensor& t,
                       const std::optional<at::Tensor>& bias, int64_t ignore_index, ChunkWalk& w) {
  const int64_t rows = x2.size(0), vocab = weight.size(0), esize = x2.element_size();
  const bool grad = w.scale.defined();
  const auto acc = acc_type(x2);
  if (w.dweight.defined() && rows == 0) w.dweight.zero_();
  if (rows == 0) return;
  if (vocab == 0) {  // no logits: lse = log 0; a target is ignored (loss 0) or out of range (NaN)
    if (w.stats) w.lse.fill_(-std::numeric_limits<double>::infinity());
    if (w.stats && w.loss.defined())
      w.loss.copy_(at::where(t == ignore_index, 0, std::numeric_limits<double>::quiet_NaN()));
    if (w.dx.defined()) w.dx.zero_();
    return;
  }
  const int64_t per_vector = 16 / esize, ld = (vocab + per_vector - 1) / per_vector * per_vector;
  const int64_t chunk = token_chunk(rows, vocab, ld, esize);
  const at::Tensor buffer = at::empty({chunk, ld}, x2.options());
  std::optional<at::Tensor> b;
  if (bias.has_value()) {  // the pass reads it by 16-byte vectors
    b = bias->contiguous();
    if (reinterpret_cast<uintptr_t>(b->data_ptr()) % 16 != 0) b = b->clone();
  }
  const int sms = at::cuda::getDeviceProperties(x2.get_device())->multiProcessorCount;
  const auto ptr = [](const at::Tensor& v, int64_t r0, int64_t n) {
    return v.defined() ? v.narrow(0, r0, n).data_ptr() : nullptr;
  };
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t n = std::min(chunk, rows - r0);
    const at::Tensor l = buffer.narrow(0, 0, n).narrow(1, 0, vocab), xc = x2.narrow(0, r0, n);
    cuops::gemm(l, xc, weight.t(), 1.0, 0.0);
    const void* scale = grad ? static_cast<const char*>(w.scale.data_ptr()) +
                                   r0 * w.scale_stride * w.scale.element_size()
                             : nullptr;
    C10_CUDA_CHECK(kernels::launch_ce_rows(
        kernel_dtype(x2.scalar_type()), l.data_ptr(), n, vocab, ld, b ? b->data_ptr() : nullptr,
        t.narrow(0, r0, n).data_ptr<int64_t>(), ignore_index, ptr(w.lse, r0, n), ptr(w.loss, r0, n),
        scale, w.scale_stride, w.stats, grad, w.softcap, sms, current_stream(x2)));
    if (w.dx.defined()) cuops::gemm(w.dx.narrow(0, r0, n), l, weight, 1.0, 0.0);
    if (w.dweight.defined()) cuops::gemm(w.dweight, l.t(), xc, 1.0, r0 == 0 ? 0.0 : 1.0);
    if (w.dbias.defined()) w.dbias.add_(l.sum({0}, false, acc));
  }
}

// The gradients' tensors of a walk that makes them, as `mask` asks: dx [T, K] and dweight like x
// and weight, dbias's accumulator [V] where there is a bias. A product nobody asks for is not run
// (a frozen head's weight gradient: a third of the work and its bytes).
void gradients_for(ChunkWalk& w, const at::Tensor& x2, const at::Tensor& weight,
                   const std::optional<at::Tensor>& bias, std::array<bool, 3> mask) {
  if (mask[0]) w.dx = at::empty_like(x2, at::MemoryFormat::Contiguous);
  if (mask[1]) w.dweight = at::empty_like(weight, at::MemoryFormat::Contiguous);
  if (mask[2] && bias.has_value())
    w.dbias = at::zeros({weight.size(0)}, x2.options().dtype(acc_type(x2)));
}

at::Tensor dbias_of(const ChunkWalk& w, const at::Tensor& weight) {
  return w.dbias.defined() ? w.dbias.to(weight.scalar_type())
                           : at::zeros({weight.size(0)}, weight.options());
}

std::tuple<at::Tensor, at::Tensor> fwd_cuda(const at::Tensor& x, const at::Tensor& weight,
                                            const at::Tensor& target,
                                            const std::optional<at::Tensor>& bias,
                                            int64_t ignore_index, c10::string_view reduction,
                                            std::optional<double> softcap) {
  const Reduction r = check_lce("_linear_cross_entropy_fwd", x, weight, target, bias, reduction);
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor x2 = as_rows(x), t = target.reshape({-1}).contiguous();
  ChunkWalk w;
  w.softcap = cap_of("_linear_cross_entropy_fwd", softcap);
  w.lse = at::empty({x2.size(0)}, x.options().dtype(acc_type(x)));
  w.loss = at::empty_like(w.lse);
  walk_token_chunks(x2, weight, t, bias, ignore_index, w);
  return {reduce_loss(w.loss, t != ignore_index, r, target), w.lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_cuda(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
    const std::optional<at::Tensor>& bias, const at::Tensor& lse, int64_t ignore_index,
    c10::string_view reduction, std::optional<double> softcap) {
  const Reduction r = check_lce_bwd(grad, x, weight, target, bias, lse, reduction);
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor x2 = as_rows(x), t = target.reshape({-1}).contiguous();
  ChunkWalk w;
  w.stats = false;
  w.softcap = cap_of("_linear_cross_entropy_bwd", softcap);
  w.lse = lse.contiguous();
  std::tie(w.scale, w.scale_stride) = grad_scale(grad, t != ignore_index, r, acc_type(x));
  gradients_for(w, x2, weight, bias, {true, true, true});
  walk_token_chunks(x2, weight, t, bias, ignore_index, w);
  return {w.dx.view(x.sizes()), w.dweight, dbias_of(w, weight)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fwd_grad_cuda(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
    const std::optional<at::Tensor>& bias, int64_t ignore_index, c10::string_view reduction,
    std::array<bool, 3> output_mask, std::optional<double> softcap) {
  const Reduction r = check_lce_fwd_grad(x, weight, target, bias, reduction);
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor x2 = as_rows(x), t = target.reshape({-1}).contiguous();
  const at::Tensor valid = t != ignore_index;
  ChunkWalk w;
  w.softcap = cap_of("_linear_cross_entropy_fwd_grad", softcap);
  w.lse = at::empty({x2.size(0)}, x.options().dtype(acc_type(x)));
  w.loss = at::empty_like(w.lse);
  std::tie(w.scale, w.scale_stride) =
      grad_scale(at::ones({}, w.lse.options()), valid, r, acc_type(x));
  gradients_for(w, x2, weight, bias, output_mask);
  walk_token_chunks(x2, weight, t, bias, ignore_index, w);
  return {reduce_loss(w.loss, valid, r, target),
          output_mask[0] ? w.dx.view(x.sizes()) : left_out(x),
          output_mask[1] ? w.dweight : left_out(weight),
          output_mask[2] ? dbias_of(w, weight) : left_out(weight)};
}

// ---- Meta

std::tuple<at::Tensor, at::Tensor> lce_fwd_meta(const at::Tensor& x, const at::Tensor& weight,
                                                const at::Tensor& target,
                                                const std::optional<at::Tensor>& bias,
                                                int64_t ignore_index, c10::string_view reduction,
                                                std::optional<double> softcap) {
  const Reduction r = check_lce("_linear_cross_entropy_fwd", x, weight, target, bias, reduction);
  cap_of("_linear_cross_entropy_fwd", softcap);
  const auto opts = x.options().dtype(acc_type(x));
  at::Tensor loss =
      r == Reduction::None ? at::empty_symint(target.sym_sizes(), opts) : at::empty({}, opts);
  return {loss, at::empty_symint({target.sym_numel()}, opts)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lce_bwd_meta(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
    const std::optional<at::Tensor>& bias, const at::Tensor& lse, int64_t ignore_index,
    c10::string_view reduction, std::optional<double> softcap) {
  check_lce_bwd(grad, x, weight, target, bias, lse, reduction);
  cap_of("_linear_cross_entropy_bwd", softcap);
  return {at::empty_symint(x.sym_sizes(), x.options()),
          at::empty_symint(weight.sym_sizes(), weight.options()),
          at::empty_symint({weight.sym_size(0)}, weight.options())};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> lce_fwd_grad_meta(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
    const std::optional<at::Tensor>& bias, int64_t ignore_index, c10::string_view reduction,
    std::array<bool, 3> output_mask, std::optional<double> softcap) {
  check_lce_fwd_grad(x, weight, target, bias, reduction);
  cap_of("_linear_cross_entropy_fwd_grad", softcap);
  return {
      at::empty({}, x.options().dtype(acc_type(x))),
      output_mask[0] ? at::empty_symint(x.sym_sizes(), x.options()) : left_out(x),
      output_mask[1] ? at::empty_symint(weight.sym_sizes(), weight.options()) : left_out(weight),
      output_mask[2] ? at::empty_symint({weight.sym_size(0)}, weight.options()) : left_out(weight)};
}

at::Tensor lce(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
               const std::optional<at::Tensor>& bias, int64_t ignore_index,
               c10::string_view reduction, std::optional<double> softcap) {
  check_lce("linear_cross_entropy", x, weight, target, bias, reduction);
  cap_of("linear_cross_entropy", softcap);
  return std::get<0>(
      cuops::_linear_cross_entropy_fwd(x, weight, target, bias, ignore_index, reduction, softcap));
}

// A gradient the forward made, times the loss's gradient g (0-D): in place unless `kept`. A plain
// CUDA tensor (eager) takes launch_scale_by, g read on the device in the accumulation type: torch's
// mul of a bf16 tensor by a float 0-D tensor converts element by element off its vectorised path
// (0.56 ms for dweight at V = 128256, K = 2048, ~1.6x the bus's time). Traced tensors (fake,
// functional, DTensor) and the CPU take torch's mul.
at::Tensor scaled_gradient(const at::Tensor& t, const at::Tensor& g, bool kept) {
  const bool plain = t.is_cuda() && t.is_contiguous() &&
                     !t.unsafeGetTensorImpl()->is_python_dispatch() &&
                     !at::functionalization::impl::isFunctionalTensor(t);
  if (!plain) return kept ? t * g : t.mul_(g);
  const at::Tensor out = kept ? at::empty_like(t) : t;
  const at::Tensor alpha = g.to(t.device(), acc_type(t)).contiguous();
  const c10::cuda::CUDAGuard guard(t.device());
  C10_CUDA_CHECK(kernels::launch_scale_by(kernel_dtype(t.scalar_type()), out.data_ptr(),
                                          t.data_ptr(), alpha.data_ptr(), t.numel(),
                                          current_stream(t)));
  return out;
}

// ---- Autograd. A loss of one value (mean, sum): the forward makes the gradients for a gradient of
// 1 in the same walk over the logits (three products, not four) and keeps them; the backward
// scales them, in place unless the graph is kept for another backward (retain_graph, gradcheck):
// a copy of dweight would add its bytes to what the op holds (SPEC §1b's bound). "none": the forward keeps the inputs and each token's log-sum-exp, and the backward
// makes the logits again (each token's own gradient is not known before it).
class LinearCrossEntropyFunction : public torch::autograd::Function<LinearCrossEntropyFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& target, const std::optional<at::Tensor>& bias,
                            int64_t ignore_index, c10::string_view reduction,
                            std::optional<double> softcap) {
    const bool made = parse_reduction("linear_cross_entropy", reduction) != Reduction::None;
    ctx->saved_data["made"] = made;
    ctx->saved_data["softcap"] = softcap.has_value() ? c10::IValue(*softcap) : c10::IValue();
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["reduction"] = std::string(reduction.data(), reduction.size());
    ctx->saved_data["has_bias"] = bias.has_value();
    const std::array<bool, 3> mask = {x.requires_grad(), weight.requires_grad(),
                                      bias.has_value() && bias->requires_grad()};
    at::AutoDispatchBelowADInplaceOrView guard;
    if (made) {
      auto [loss, dx, dweight, dbias] = cuops::_linear_cross_entropy_fwd_grad(
          x, weight, target, bias, ignore_index, reduction, mask, softcap);
      ctx->save_for_backward({dx, dweight, dbias});
      return loss;
    }
    auto [loss, lse] =
        cuops::_linear_cross_entropy_fwd(x, weight, target, bias, ignore_index, reduction, softcap);
    ctx->save_for_backward({x, weight, target, bias.value_or(at::Tensor()), lse});
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    at::Tensor dx, dweight, dbias;
    if (ctx->saved_data["made"].toBool()) {
      const at::Tensor& g = grads[0];
      const bool kept = torch::autograd::get_current_graph_task_keep_graph();
      const auto scaled = [&](int i, int input) {
        return ctx->needs_input_grad(input) ? scaled_gradient(saved[i], g, kept) : at::Tensor();
      };
      dx = scaled(0, 0), dweight = scaled(1, 1);
      if (has_bias) dbias = scaled(2, 3);
    } else {
      const std::optional<at::Tensor> bias =
          has_bias ? std::optional<at::Tensor>(saved[3]) : std::nullopt;
      const c10::IValue& cap = ctx->saved_data["softcap"];
      std::tie(dx, dweight, dbias) = cuops::_linear_cross_entropy_bwd(
          grads[0], saved[0], saved[1], saved[2], bias, saved[4],
          ctx->saved_data["ignore_index"].toInt(), ctx->saved_data["reduction"].toStringRef(),
          cap.isNone() ? std::nullopt : std::optional<double>(cap.toDouble()));
    }
    return {ctx->needs_input_grad(0) ? dx : at::Tensor(),
            ctx->needs_input_grad(1) ? dweight : at::Tensor(),
            at::Tensor(),
            has_bias && ctx->needs_input_grad(3) ? dbias : at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

at::Tensor lce_autograd(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
                        const std::optional<at::Tensor>& bias, int64_t ignore_index,
                        c10::string_view reduction, std::optional<double> softcap) {
  check_lce("linear_cross_entropy", x, weight, target, bias, reduction);
  cap_of("linear_cross_entropy", softcap);
  const bool grad = c10::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad() ||
                                                    (bias.has_value() && bias->requires_grad()));
  if (!grad) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return cuops::linear_cross_entropy(x, weight, target, bias, ignore_index, reduction, softcap);
  }
  return LinearCrossEntropyFunction::apply(x, weight, target, bias, ignore_index, reduction,
                                           softcap);
}

// Under CUDA autocast, as F.linear: x, weight and bias cast to the autocast dtype (a float32 master
// weight through autocast's weight cache); the loss is float32 as F.cross_entropy's of autocast's
// float32 logits.
at::Tensor lce_autocast(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
                        const std::optional<at::Tensor>& bias, int64_t ignore_index,
                        c10::string_view reduction, std::optional<double> softcap) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  return cuops::linear_cross_entropy(autocast_cuda(x), autocast_cuda(weight), target,
                                     autocast_cuda(bias), ignore_index, reduction, softcap);
}

}  // namespace

TORCH_LIBRARY_IMPL(cuops, CPU, m) {
  m.impl("linear_cross_entropy", &lce);
  m.impl("_linear_cross_entropy_fwd", &fwd_cpu);
  m.impl("_linear_cross_entropy_bwd", &bwd_cpu);
  m.impl("_linear_cross_entropy_fwd_grad", &fwd_grad_cpu);
}
TORCH_LIBRARY_IMPL(cuops, CUDA, m) {
  m.impl("linear_cross_entropy", &lce);
  m.impl("_linear_cross_entropy_fwd", &fwd_cuda);
  m.impl("_linear_cross_entropy_bwd", &bwd_cuda);
  m.impl("_linear_cross_entropy_fwd_grad", &fwd_grad_cuda);
}
TORCH_LIBRARY_IMPL(cuops, Meta, m) {
  m.impl("linear_cross_entropy", [](const at::Tensor& x, const at::Tensor& weight,
                                    const at::Tensor& target, const std::optional<at::Tensor>& bias,
                                    int64_t ignore_index, c10::string_view reduction,
                                    std::optional<double> softcap) {
    return std::get<0>(lce_fwd_meta(x, weight, target, bias, ignore_index, reduction, softcap));
  });
  m.impl("_linear_cross_entropy_fwd", &lce_fwd_meta);
  m.impl("_linear_cross_entropy_bwd", &lce_bwd_meta);
  m.impl("_linear_cross_entropy_fwd_grad", &lce_fwd_grad_meta);
}
TORCH_LIBRARY_IMPL(cuops, Autograd, m) { m.impl("linear_cross_entropy", &lce_autograd); }
TORCH_LIBRARY_IMPL(cuops, AutocastCUDA, m) { m.impl("linear_cross_entropy", &lce_autocast); }

}  // namespace cuops::ops
