// Mixture of experts (docs/ops.md#grouped_mm, #moe_topk_softmax, #moe_experts): checks, CPU, CUDA,
// Meta, Autograd, Autocast.
//
// grouped_mm is the family's GEMM: torch._grouped_mm's two forms (groups of rows against a 3-D
// weight; groups along K, a per-group weight gradient), the group ends on the device. moe_experts is
// a whole experts module (Hugging Face's [E, 2I, H] gate_up and [E, H, I] down, read in place):
// a stable sort of the (token, slot) pairs by expert into a row layout (route(): each expert's rows
// from a multiple of 128), the gate/up grouped GEMM on the tokens gathered into it, the gated
// activation, the down grouped GEMM, and the weighted sum of each token's k rows in slot order, in
// the accumulation type, rounded once. Every step is a fixed function of the routing, so the bits
// repeat; no size is read back to the host, so the shapes are fixed (CUDA graphs, torch.compile
// without a graph break).
//
// The pieces run on CPU and CUDA alike (one composition; the grouped products and index passes are
// the device's), and the backward keeps the layout and the gate/up products [rows, 2I]:
//   dh' = dout[tok] @ down[e]             (grouped, rows)      dw = <dh', h> per pair
//   ddown[e] = dout[tok]^T (w h)           (grouped along K)    dgu = act_bwd(w dh', g, u)
//   dgate_up[e] = dgu^T x[tok]            (grouped along K)    dx = sum over slots of dgu @ gate_up[e]
// dw from <dh', h> = <dout, h down^T> needs no [rows, H] down output kept.
#include "ops/common.h"

#include "ops/fused_gemm.h"

#include "kernels/gemm/gemm_plan.h"

#include <limits>
#include <string_view>

namespace cuops::ops {
namespace {

// ---- grouped_mm: a [S, K] with b [E, K, N] (Rows: out [S, N]) or a [M, S] with b [S, N] (K: out
// [E, M, N]); offs int32 or int64 [E], group e's end.

enum class Grouped { Rows, K };

Grouped check_grouped_mm(const char* op, const at::Tensor& a, const at::Tensor& b,
                         const at::Tensor& offs) {
  check_dtypes_and_devices(op, {{"a", &a}, {"b", &b}});
  TORCH_CHECK(offs.scalar_type() == at::kInt || offs.scalar_type() == at::kLong, "cuops::", op,
              ": expected offs to have dtype int32 or int64, got ", dtype_name(offs.scalar_type()));
  TORCH_CHECK(offs.device() == a.device(), "cuops::", op, ": expected offs on the device of a (",
              a.device(), "), got ", offs.device());
  check_dim(op, "offs", offs, 1);
  TORCH_CHECK(a.dim() == 2, "cuops::", op, ": expected a to be 2-D ([S, K] or [M, S]), got ",
              a.dim(), "-D tensor of shape ", shape_str(a));
  TORCH_CHECK(offs.sym_size(0) <= kernels::kGroupedMaxGroups, "cuops::", op, ": expected at most ",
              kernels::kGroupedMaxGroups, " groups (offs' length), got ", offs.sym_size(0));
  if (b.dim() == 3) {
    TORCH_CHECK(b.sym_size(0) == offs.sym_size(0), "cuops::", op,
                ": expected b [E, K, N] to have one matrix per group (offs ", shape_str(offs),
                "), got b ", shape_str(b));
    TORCH_CHECK(b.sym_size(1) == a.sym_size(1), "cuops::", op,
                ": expected a [S, K] and b [E, K, N] to share K, got a ", shape_str(a), " and b ",
                shape_str(b));
    return Grouped::Rows;
  }
  TORCH_CHECK(b.dim() == 2, "cuops::", op,
              ": expected b to be 3-D ([E, K, N], groups of a's rows) or 2-D ([S, N], groups "
              "along a's columns), got ",
              b.dim(), "-D tensor of shape ", shape_str(b));
  TORCH_CHECK(b.sym_size(0) == a.sym_size(1), "cuops::", op,
              ": expected a [M, S] and b [S, N] to share S, got a ", shape_str(a), " and b ",
              shape_str(b));
  return Grouped::K;
}

std::vector<c10::SymInt> grouped_out_shape(Grouped form, const at::Tensor& a, const at::Tensor& b,
                                           const at::Tensor& offs) {
  if (form == Grouped::Rows) return {a.sym_size(0), b.sym_size(2)};
  return {offs.sym_size(0), a.sym_size(0), b.sym_size(1)};
}

// CPU: the ends checked (non-decreasing, within [0, extent]), each group's product in the
// accumulation type, rounded once; rows (Rows) past the last group and empty groups (K) are zeros.
at::Tensor grouped_mm_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& offs) {
  const Grouped form = check_grouped_mm("grouped_mm", a, b, offs);
  const int64_t extent = form == Grouped::Rows ? a.size(0) : a.size(1);
  const at::Tensor ends = offs.to(at::kLong).contiguous();
  const int64_t* end = ends.data_ptr<int64_t>();
  const auto acc = acc_type(a);
  at::Tensor out =
      at::zeros(form == Grouped::Rows ? std::vector<int64_t>{a.size(0), b.size(2)}
                                      : std::vector<int64_t>{offs.size(0), a.size(0), b.size(1)},
                a.options().dtype(acc));
  int64_t start = 0;
  for (int64_t e = 0; e < offs.size(0); ++e) {
    TORCH_CHECK(end[e] >= start && end[e] <= extent, "cuops::grouped_mm: expected offs to be ",
                "non-decreasing group ends within [0, ", extent, "], got offs[", e, "] = ", end[e],
                e > 0 ? " after " : "", e > 0 ? std::to_string(end[e - 1]) : std::string());
    const int64_t len = end[e] - start;
    if (len > 0) {
      if (form == Grouped::Rows)
        out.narrow(0, start, len).copy_(at::mm(a.narrow(0, start, len).to(acc), b[e].to(acc)));
      else
        out[e].copy_(at::mm(a.narrow(1, start, len).to(acc), b.narrow(0, start, len).to(acc)));
    }
    start = end[e];
  }
  return out.to(a.scalar_type());
}

// A tensor map's terms for t's 2-D matrices along dims (outer, inner): inner contiguous, the rows
// ld elements apart with ld and the base whole 16 bytes: ld, or -1 where t cannot be read so. A
// dimension of one row may have any stride: its ld is then the rows' length rounded up.
int64_t tma_ld(const at::Tensor& t, int64_t outer, int64_t inner) {
  const int64_t es = static_cast<int64_t>(t.element_size()), per = 16 / es;
  if (t.stride(inner) != 1) return -1;
  const int64_t ld = t.size(outer) == 1 ? (t.size(inner) + per - 1) / per * per : t.stride(outer);
  const bool ok =
      ld >= t.size(inner) && ld % per == 0 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  return ok ? ld : -1;
}

// The Hopper grouped kernel in torch's packed form (gemm_wgmma_grouped.cu) where plan_grouped picks it
// and the operands are TMA-readable: a's rows k-contiguous (Rows) or a^T's (K: a [M, S] m-contiguous),
// b's matrices either way (Rows) or n-contiguous (K); into out, made here. False (nothing enqueued)
// elsewhere.
bool grouped_mm_wgmma(Grouped form, const at::Tensor& a, const at::Tensor& b,
                      const at::Tensor& ends, at::Tensor& out) {
  const int64_t groups = ends.size(0), es = static_cast<int64_t>(a.element_size());
  const bool rows = form == Grouped::Rows;
  if (groups == 0 || (rows ? a.size(0) : a.size(1)) == 0 || a.numel() == 0) return false;
  kernels::GroupedGemm g{};
  g.dtype = kernel_dtype(a.scalar_type());
  g.packed = true, g.groups = groups;
  bool aligned;
  if (rows) {
    g.rows = a.size(0), g.k = a.size(1), g.n = b.size(2);
    g.lda = tma_ld(a, 0, 1);
    g.b_nmajor = b.stride(1) != 1;  // [n, k] rows (nn.Linear's, HF's weight.transpose) else [k, n]
    g.ldb = g.b_nmajor ? tma_ld(b, 1, 2) : tma_ld(b, 2, 1);
    g.b_group_stride = b.size(0) == 1 ? g.ldb * (g.b_nmajor ? b.size(1) : b.size(2)) : b.stride(0);
    aligned = g.lda > 0 && g.ldb > 0 && (g.b_group_stride * es) % 16 == 0 && (g.n * es) % 16 == 0;
  } else {
    g.rows = a.size(1), g.m = a.size(0), g.n = b.size(1), g.along_k = true, g.b_nmajor = true;
    g.lda = tma_ld(a, 1, 0), g.ldb = tma_ld(b, 0, 1);
    aligned = g.lda > 0 && g.ldb > 0 && (g.n * es) % 16 == 0;
  }
  const kernels::GroupedPlan plan =
      kernels::plan_grouped({g.dtype, g.n, g.k, g.m, g.along_k, false, g.b_nmajor, aligned},
                            kernels::current_gemm_device());
  if (!plan.wgmma) return false;
  out = at::empty(rows ? std::vector<int64_t>{g.rows, g.n} : std::vector<int64_t>{groups, g.m, g.n},
                  a.options());
  const at::Tensor ws = at::empty({2 * (groups + 1)}, ends.options());
  g.a = a.data_ptr(), g.b = b.data_ptr(), g.c = out.data_ptr(), g.ldc = g.n;
  g.ends = ends.data_ptr<int32_t>(), g.workspace = ws.data_ptr<int32_t>(), g.bn = plan.bn;
  C10_CUDA_CHECK(kernels::launch_grouped_wgmma(
      g, at::cuda::getDeviceProperties(a.get_device())->multiProcessorCount, current_stream(a)));
  return true;
}

// CUDA: the Hopper grouped kernel where grouped_mm_wgmma takes the product, else the general grouped
// kernels (kernels/gemm/grouped_simt.cu), any strides; offs as int32 (an int64 end past 2^31 is past
// any extent these take) and never read on the host.
at::Tensor grouped_mm_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& offs) {
  const Grouped form = check_grouped_mm("grouped_mm", a, b, offs);
  const c10::cuda::CUDAGuard guard(a.device());
  const int64_t extent = form == Grouped::Rows ? a.size(0) : a.size(1);
  TORCH_CHECK(extent <= std::numeric_limits<int32_t>::max(), "cuops::grouped_mm: expected fewer ",
              "than 2^31 grouped rows, got ", extent);
  const at::Tensor ends = offs.to(at::kInt).contiguous();
  const int64_t groups = offs.size(0);
  at::Tensor out;
  if (grouped_mm_wgmma(form, a, b, ends, out)) return out;
  out = at::empty(form == Grouped::Rows ? std::vector<int64_t>{a.size(0), b.size(2)}
                                        : std::vector<int64_t>{groups, a.size(0), b.size(1)},
                  a.options());
  if (form == Grouped::Rows)
    C10_CUDA_CHECK(kernels::launch_grouped_mm_rows(
        kernel_dtype(a.scalar_type()), a.data_ptr(), a.stride(0), a.stride(1), b.data_ptr(),
        b.stride(0), b.stride(1), b.stride(2), ends.data_ptr<int32_t>(), groups, a.size(0),
        a.size(1), b.size(2), out.data_ptr(), current_stream(a)));
  else
    C10_CUDA_CHECK(kernels::launch_grouped_mm_k(
        kernel_dtype(a.scalar_type()), a.data_ptr(), a.stride(0), a.stride(1), b.data_ptr(),
        b.stride(0), b.stride(1), ends.data_ptr<int32_t>(), groups, a.size(0), a.size(1), b.size(1),
        out.data_ptr(), current_stream(a)));
  return out;
}

at::Tensor grouped_mm_meta(const at::Tensor& a, const at::Tensor& b, const at::Tensor& offs) {
  const Grouped form = check_grouped_mm("grouped_mm", a, b, offs);
  return at::empty_symint(grouped_out_shape(form, a, b, offs), a.options());
}

// Both gradients are grouped_mm again: Rows: da = dout @ b[e]^T, db[e] = a_e^T dout_e (along K);
// K: da^T = b @ dout[e]^T (rows), db = a^T @ dout[e] (rows).
class GroupedMmFunction : public torch::autograd::Function<GroupedMmFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b,
                            const at::Tensor& offs) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->save_for_backward({a, b, offs});
    return cuops::grouped_mm(a, b, offs);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &a = saved[0], &b = saved[1], &offs = saved[2], &dout = grads[0];
    at::Tensor da, db;
    if (b.dim() == 3) {
      if (ctx->needs_input_grad(0)) da = cuops::grouped_mm(dout, b.transpose(1, 2), offs);
      if (ctx->needs_input_grad(1)) db = cuops::grouped_mm(a.t(), dout, offs);
    } else {
      if (ctx->needs_input_grad(0)) da = cuops::grouped_mm(b, dout.transpose(1, 2), offs).t();
      if (ctx->needs_input_grad(1)) db = cuops::grouped_mm(a.t(), dout, offs);
    }
    return {da, db, at::Tensor()};
  }
};

at::Tensor grouped_mm_autograd(const at::Tensor& a, const at::Tensor& b, const at::Tensor& offs) {
  return GroupedMmFunction::apply(a, b, offs);
}

// Under CUDA autocast, as F.linear: a and b in the autocast dtype (a float32 expert weight through
// autocast's cache).
at::Tensor grouped_mm_autocast(const at::Tensor& a, const at::Tensor& b, const at::Tensor& offs) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  return cuops::grouped_mm(autocast_cuda(a), autocast_cuda(b), offs);
}

// ---- moe_topk_softmax: softmax over the last dim in the math type (float32; float64 for float64
// logits), the k largest (ties: the lower expert index first, a stable sort), optionally divided by
// their sum, cast to weight_dtype (default: the math type); indices int64 as torch.topk's.

at::ScalarType softmax_type(const at::Tensor& logits) {
  return logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

void check_topk_softmax(const at::Tensor& logits, int64_t k) {
  check_dtypes_and_devices("moe_topk_softmax", {{"logits", &logits}});
  TORCH_CHECK(logits.dim() >= 1, "cuops::moe_topk_softmax: expected logits to be at least 1-D ",
              "([..., E]), got 0-D");
  TORCH_CHECK(k >= 1 && k <= logits.sym_size(-1), "cuops::moe_topk_softmax: expected k in [1, ",
              logits.sym_size(-1), "] (logits' last dimension), got ", k);
}

std::tuple<at::Tensor, at::Tensor> topk_softmax_kernel(const at::Tensor& logits, int64_t k,
                                                       bool renorm,
                                                       std::optional<at::ScalarType> wtype) {
  check_topk_softmax(logits, k);
  const at::Tensor p = at::softmax(logits, -1, softmax_type(logits));
  auto [sorted, order] = at::sort(p, /*stable=*/true, /*dim=*/-1, /*descending=*/true);
  at::Tensor v = sorted.narrow(-1, 0, k);
  if (renorm) v = v / v.sum(-1, /*keepdim=*/true);
  return {v.to(wtype.value_or(p.scalar_type())).contiguous(), order.narrow(-1, 0, k).contiguous()};
}

std::tuple<at::Tensor, at::Tensor> topk_softmax_meta(const at::Tensor& logits, int64_t k,
                                                     bool renorm,
                                                     std::optional<at::ScalarType> wtype) {
  check_topk_softmax(logits, k);
  std::vector<c10::SymInt> shape(logits.sym_sizes().begin(), logits.sym_sizes().end());
  shape.back() = k;
  return {at::empty_symint(shape, logits.options().dtype(wtype.value_or(softmax_type(logits)))),
          at::empty_symint(shape, logits.options().dtype(at::kLong))};
}

// d logits = p (d - <d, p>), d the weights' gradient on the chosen experts (through the division by
// their sum where renorm: (dw - <dw, w>) / sum) and 0 elsewhere; p recomputed from the logits ([T, E],
// one pass) rather than kept.
class TopkSoftmaxFunction : public torch::autograd::Function<TopkSoftmaxFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& logits, int64_t k,
                               bool renorm, std::optional<at::ScalarType> wtype) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [w, idx] = cuops::moe_topk_softmax(logits, k, renorm, wtype);
    ctx->save_for_backward({logits, idx});
    ctx->saved_data["renorm"] = renorm;
    ctx->mark_non_differentiable({idx});
    return {w, idx};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &logits = saved[0], &idx = saved[1];
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const at::Tensor p = at::softmax(logits, -1, softmax_type(logits));
    at::Tensor dv = grads[0].to(p.scalar_type());
    if (ctx->saved_data["renorm"].toBool()) {
      const at::Tensor v = p.gather(-1, idx), s = v.sum(-1, true);
      dv = (dv - (dv * (v / s)).sum(-1, true)) / s;
    }
    // Out of place: under DTensor this runs on the sharded tensors, whose in-place scatter has no rule.
    const at::Tensor d = at::scatter(at::zeros_like(p), -1, idx, dv);
    const at::Tensor dlogits = p * (d - (d * p).sum(-1, true));
    return {dlogits.to(logits.scalar_type()), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> topk_softmax_autograd(const at::Tensor& logits, int64_t k,
                                                         bool renorm,
                                                         std::optional<at::ScalarType> wtype) {
  if (!(c10::GradMode::is_enabled() && logits.requires_grad())) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return cuops::moe_topk_softmax(logits, k, renorm, wtype);
  }
  auto out = TopkSoftmaxFunction::apply(logits, k, renorm, wtype);
  return {out[0], out[1]};
}

// ---- moe_experts: x [T, H], topk_idx [T, k] (int32/int64), topk_w [T, k] (any floating dtype),
// gate_up [E, 2I, H], down [E, H, I]. A pair whose index is outside [0, E) adds nothing (Hugging
// Face's expert-parallel convention: such pairs are another rank's).

using Gate = kernels::Activation;  // the experts' gate: parse_gate's silu or gelu_tanh

void check_moe_experts(const char* op, const at::Tensor& x, const at::Tensor& idx,
                       const at::Tensor& w, const at::Tensor& gate_up, const at::Tensor& down,
                       c10::string_view activation) {
  check_dtypes_and_devices(op, {{"x", &x}, {"gate_up", &gate_up}, {"down", &down}});
  parse_gate(op, activation);
  check_dim(op, "x", x, 2);
  check_dim(op, "topk_idx", idx, 2);
  check_dim(op, "gate_up", gate_up, 3);
  check_dim(op, "down", down, 3);
  TORCH_CHECK(idx.scalar_type() == at::kInt || idx.scalar_type() == at::kLong, "cuops::", op,
              ": expected topk_idx to have dtype int32 or int64, got ",
              dtype_name(idx.scalar_type()));
  TORCH_CHECK(is_supported_dtype(w.scalar_type()), "cuops::", op,
              ": expected topk_w to have dtype float32, float64, float16 or bfloat16, got ",
              dtype_name(w.scalar_type()));
  TORCH_CHECK(idx.device() == x.device() && w.device() == x.device(), "cuops::", op,
              ": expected topk_idx and topk_w on the device of x (", x.device(), "), got ",
              idx.device(), " and ", w.device());
  TORCH_CHECK(idx.sym_size(0) == x.sym_size(0), "cuops::", op,
              ": expected topk_idx [T, k] to have a row per token of x ", shape_str(x), ", got ",
              shape_str(idx));
  check_same_shape(op, {{"topk_idx", &idx}, {"topk_w", &w}});
  TORCH_CHECK(gate_up.sym_size(2) == x.sym_size(1) && gate_up.sym_size(1) % 2 == 0, "cuops::", op,
              ": expected gate_up [E, 2I, H] with H x's width, got x ", shape_str(x),
              " and gate_up ", shape_str(gate_up));
  TORCH_CHECK(down.sym_size(0) == gate_up.sym_size(0) && down.sym_size(1) == x.sym_size(1) &&
                  down.sym_size(2) * 2 == gate_up.sym_size(1),
              "cuops::", op, ": expected down [E, H, I] to match gate_up [E, 2I, H] ",
              shape_str(gate_up), ", got ", shape_str(down));
  TORCH_CHECK(gate_up.sym_size(0) <= kernels::kGroupedMaxGroups, "cuops::", op,
              ": expected at most ", kernels::kGroupedMaxGroups, " experts, got ",
              gate_up.sym_size(0));
}

// The expert-ordered row layout both grouped products run on: each expert's pairs (stable: in pair
// order) from a row that is a multiple of kRowAlign, its last tile's spare rows zeros. Every tile of
// kRowAlign rows then holds one expert's rows only: the wgmma grouped kernel's full-tile loads and
// stores need no masking, and a group along K (the weight gradients) starts and ends on whole
// 64-row k-tiles over zeros. The rows' count is a host bound (padded_rows), so every shape is fixed;
// the last row is in no group: the pairs outside [0, E) point there, and it stays zeros in every
// product. kRowAlign: the wgmma tile's BM.
constexpr int64_t kRowAlign = 128;

// Rows of the layout for `pairs` pairs over `experts` experts: at most min(E, S) experts hold pairs,
// each padding at most kRowAlign - 1; plus the row in no group.
c10::SymInt padded_rows(const c10::SymInt& pairs, int64_t experts) {
  const c10::SymInt busy = pairs < experts ? pairs : c10::SymInt(experts);
  return (pairs + busy * (kRowAlign - 1) + kRowAlign - 1) / kRowAlign * kRowAlign + 1;
}

// rows: each pair's row (int64 [S]); offs: each expert's end (int32 [E]); count: padded_rows.
struct Routing {
  at::Tensor rows, offs;
  int64_t count;
};

Routing route(const at::Tensor& idx, int64_t experts) {
  const at::Tensor flat = idx.reshape(-1).to(at::kLong);
  const int64_t pairs = flat.numel(), count = padded_rows(pairs, experts).expect_int();
  const at::Tensor valid = flat.ge(0).logical_and(flat.lt(experts));
  auto [sorted, order] =
      at::sort(at::where(valid, flat, experts), /*stable=*/true, /*dim=*/0, /*descending=*/false);
  const at::Tensor ids = at::arange(experts, flat.options());
  const at::Tensor starts = at::searchsorted(sorted, ids, /*out_int32=*/false, /*right=*/false);
  const at::Tensor ends = at::searchsorted(sorted, ids, /*out_int32=*/false, /*right=*/true);
  const at::Tensor padded = (ends - starts + (kRowAlign - 1)).div(kRowAlign, "floor") * kRowAlign;
  const at::Tensor pad_ends = padded.cumsum(0);
  // The pair at sorted place r, of expert e: row pad_start(e) + r - start(e); past the experts: the
  // last row.
  const at::Tensor e = sorted.clamp_max(experts - 1);
  const at::Tensor in_expert = at::arange(pairs, flat.options()) - starts.index_select(0, e);
  const at::Tensor row =
      at::where(sorted.lt(experts), (pad_ends - padded).index_select(0, e) + in_expert, count - 1);
  return {at::empty_like(row).scatter_(0, order, row), pad_ends.to(at::kInt), count};
}

// Whether t (read contiguous: its rows' lengths `dims`, each a whole 16 bytes) and its base are
// 16-byte aligned for the tensor maps (plan_grouped's `aligned`).
bool whole_16_bytes(const at::Tensor& t, std::initializer_list<int64_t> dims) {
  const int64_t es = static_cast<int64_t>(t.element_size());
  for (const int64_t d : dims)
    if ((d * es) % 16 != 0) return false;
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// The row layout's grouped products on CUDA: the Hopper grouped kernel (gemm_wgmma_grouped.cu) where
// plan_grouped picks it (its rows in gemm_plan.cpp), which relies on the layout's groups starting at
// multiples of 128 rows; false (nothing enqueued) elsewhere.
// out [rows, n] = a [rows, k] times each group's w[e]: w [E, n, k] read as [n, k] rows (k_major:
// nn.Linear's, the product with w[e]^T) or w [E, k, n] as [k, n]. dual: w holds [gate; up] as
// [E, 2n, k]: out = act(a gate^T) * (a up^T) (silu), and gu [rows, 2n] = [g | u] where defined.
bool layout_mm_wgmma(const at::Tensor& a, const at::Tensor& w, bool k_major, bool dual,
                     const at::Tensor& offs, at::Tensor& out, at::Tensor* gu) {
  if (!a.is_cuda() || !is_supported_dtype(a.scalar_type())) return false;
  const int64_t rows = a.size(0), k = a.size(1);
  const int64_t n = dual ? w.size(1) / 2 : (k_major ? w.size(1) : w.size(2));
  const kernels::GroupedPlan plan =
      kernels::plan_grouped({kernel_dtype(a.scalar_type()), n, k, 0, false, dual, !k_major,
                             whole_16_bytes(a, {k}) && whole_16_bytes(w, {w.size(1), w.size(2)})},
                            kernels::current_gemm_device());
  if (!plan.wgmma) return false;
  const at::Tensor wc = w.contiguous(), ac = a.contiguous();
  out = at::empty({rows, n}, a.options());
  kernels::GroupedGemm g{};
  g.dtype = kernel_dtype(a.scalar_type());
  g.rows = rows, g.n = n, g.k = k;
  g.a = ac.data_ptr(), g.lda = k;
  g.b = wc.data_ptr(), g.ldb = w.size(2), g.b_group_stride = w.size(1) * w.size(2);
  g.b_nmajor = !k_major;
  g.c = out.data_ptr(), g.ldc = n;
  g.bn = plan.bn;
  if (dual) {
    g.b2 = static_cast<const char*>(wc.data_ptr()) + n * w.size(2) * wc.element_size();
    if (gu != nullptr) {
      *gu = at::empty({rows, 2 * n}, a.options());
      g.aux = gu->data_ptr();
      g.aux2 = static_cast<char*>(gu->data_ptr()) + n * gu->element_size();
      g.ld_aux = 2 * n;
    }
  }
  const at::Tensor ends = offs.to(at::kInt).contiguous();
  g.ends = ends.data_ptr<int32_t>(), g.groups = offs.size(0);
  C10_CUDA_CHECK(kernels::launch_grouped_wgmma(
      g, at::cuda::getDeviceProperties(a.get_device())->multiProcessorCount, current_stream(a)));
  return true;
}

// [E, m, n]: for each group e, a's rows of e transposed times b's rows of e (a [rows, m], b [rows, n]
// in the layout: a weight gradient), on the Hopper grouped kernel where plan_grouped picks it, else
// grouped_mm.
at::Tensor layout_mm_k(const at::Tensor& a, const at::Tensor& b, const at::Tensor& offs) {
  const int64_t m = a.size(1), n = b.size(1), groups = offs.size(0);
  const kernels::GroupedPlan plan =
      a.is_cuda() && groups > 0
          ? kernels::plan_grouped({kernel_dtype(a.scalar_type()), n, 0, m, true, false, true,
                                   a.is_contiguous() && b.is_contiguous() &&
                                       whole_16_bytes(a, {m}) && whole_16_bytes(b, {n})},
                                  kernels::current_gemm_device())
          : kernels::GroupedPlan{};
  if (plan.wgmma) {
    at::Tensor out = at::empty({groups, m, n}, a.options());
    kernels::GroupedGemm g{};
    g.dtype = kernel_dtype(a.scalar_type());
    g.rows = a.size(0), g.n = n, g.m = m, g.along_k = true, g.bn = plan.bn;
    g.a = a.data_ptr(), g.lda = m, g.b = b.data_ptr(), g.ldb = n;
    g.c = out.data_ptr(), g.ldc = n;
    const at::Tensor ends = offs.to(at::kInt).contiguous();
    g.ends = ends.data_ptr<int32_t>(), g.groups = groups;
    C10_CUDA_CHECK(kernels::launch_grouped_wgmma(
        g, at::cuda::getDeviceProperties(a.get_device())->multiProcessorCount, current_stream(a)));
    return out;
  }
  return cuops::grouped_mm(a.t(), b, offs);
}

// out = a times each group's w[e] (as layout_mm_wgmma), on that kernel or grouped_mm.
at::Tensor layout_mm(const at::Tensor& a, const at::Tensor& w, bool k_major,
                     const at::Tensor& offs) {
  at::Tensor out;
  if (layout_mm_wgmma(a, w, k_major, false, offs, out, nullptr)) return out;
  return cuops::grouped_mm(a, k_major ? w.transpose(1, 2) : w, offs);
}

// act(g) * u in the accumulation type, from gu [rows, 2I] = [g | u].
at::Tensor gated(const at::Tensor& gu, Gate gate, at::ScalarType acc) {
  const int64_t inter = gu.size(1) / 2;
  return gate_of(gu.narrow(1, 0, inter).to(acc), gate) * gu.narrow(1, inter, inter).to(acc);
}

// out[t] = sum over j of w[t, j] * layout[rows[t * k + j]] (w null: weight 1), in j order, in the
// accumulation type, rounded once to the layout's dtype.
at::Tensor combine(const at::Tensor& layout, const at::Tensor& rows, const at::Tensor* w,
                   int64_t tokens, int64_t k) {
  const auto acc = acc_type(layout);
  if (layout.is_cuda()) {  // one pass (kernels/moe/combine.cu)
    const c10::cuda::CUDAGuard guard(layout.device());
    const at::Tensor y = layout.stride(1) == 1 ? layout : layout.contiguous();
    // Rows int32 or int64 and weights in the accumulation type or the layout's, as they come: a
    // cast pass each otherwise (the decode step's launches).
    const at::Tensor r =
        rows.scalar_type() == at::kInt ? rows.contiguous() : rows.to(at::kLong).contiguous();
    const bool w_own = w != nullptr && w->scalar_type() == layout.scalar_type();
    const at::Tensor wa = w == nullptr ? at::Tensor() : (w_own ? *w : w->to(acc)).contiguous();
    at::Tensor out = at::empty({tokens, layout.size(1)}, layout.options());
    C10_CUDA_CHECK(kernels::launch_moe_combine(
        kernel_dtype(layout.scalar_type()), y.data_ptr(), y.stride(0), r.data_ptr(),
        r.scalar_type() == at::kLong, wa.defined() ? wa.data_ptr() : nullptr, !w_own, tokens, k,
        layout.size(1), out.data_ptr(), current_stream(layout)));
    return out;
  }
  at::Tensor r = layout.index_select(0, rows).view({tokens, k, layout.size(1)}).to(acc);
  if (w) r = r * w->to(acc).unsqueeze(-1);
  return r.sum(1).to(layout.scalar_type());
}

// rows [count, H]: the pairs' tokens of x (row rows[t * k + j] = x[t]) and zeros elsewhere. On CUDA
// combine's one pass over each layout row's token (none: -1; the last row, where pairs outside the
// experts point, stays zeros), where zeros + index_put wrote the rows twice.
at::Tensor gather_rows(const at::Tensor& x, const at::Tensor& rows, int64_t count, int64_t k) {
  if (x.is_cuda()) {
    const at::Tensor src = at::full({count}, -1, rows.options().dtype(at::kLong));
    src.scatter_(0, rows, at::arange(rows.numel(), src.options()).div(k, "floor"));
    src.narrow(0, count - 1, 1).fill_(-1);
    return combine(x, src, nullptr, count, 1);
  }
  at::Tensor out = at::zeros({count, x.size(1)}, x.options());
  return out.index_put_({rows.view({x.size(0), k})},
                        x.unsqueeze(1).expand({x.size(0), k, x.size(1)}));
}

// The forward; keep: the backward's gu is wanted (moe_experts alone does not keep it where the
// gate/up kernel forms silu(g) * u itself: two [rows, I] stores fewer).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> run_experts(
    const at::Tensor& x, const at::Tensor& idx, const at::Tensor& w, const at::Tensor& gate_up,
    const at::Tensor& down, c10::string_view activation, bool keep) {
  check_moe_experts("moe_experts", x, idx, w, gate_up, down, activation);
  const Gate gate = parse_gate("moe_experts", activation);
  const int64_t tokens = x.size(0), k = idx.size(1);
  const Routing r = route(idx, gate_up.size(0));
  const at::Tensor xr = gather_rows(x, r.rows, r.count, k);
  at::Tensor h, gu;
  // silu(g) * u in the gate/up product's epilogue where the Hopper kernel runs; else apart.
  if (gate != Gate::Silu ||
      !layout_mm_wgmma(xr, gate_up, true, true, r.offs, h, keep ? &gu : nullptr)) {
    gu = layout_mm(xr, gate_up, true, r.offs);
    h = gated(gu, gate, acc_type(x)).to(x.scalar_type());
  }
  const at::Tensor y = layout_mm(h, down, true, r.offs);
  return {combine(y, r.rows, &w, tokens, k), gu, r.rows, r.offs};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> experts_fwd(
    const at::Tensor& x, const at::Tensor& idx, const at::Tensor& w, const at::Tensor& gate_up,
    const at::Tensor& down, c10::string_view activation) {
  return run_experts(x, idx, w, gate_up, down, activation, true);
}

// The decode step (at most kDecodeMaxPairs pairs, no gradient): only the routed experts' weights
// are read, once, by the small-M streaming kernel over slots of mt rows (kernels/moe/decode_route.cu
// places the pairs and gathers x; kernels/gemm/gemm_skinny_tma.cu's grouped form multiplies, silu
// in the gate/up product's epilogue), then combine (int32 rows, pairs of no expert at -1, the
// weights in float32 or x's dtype as they come): four launches. False (nothing
// enqueued) where it does not apply: no streaming form on this device, not 16-bit, not silu, more
// pairs, or operands TMA cannot read.
bool decode_experts(const at::Tensor& x, const at::Tensor& idx, const at::Tensor& w,
                    const at::Tensor& gate_up, const at::Tensor& down, Gate gate, at::Tensor& out) {
  const int64_t tokens = x.size(0), k = idx.size(1), pairs = tokens * k;
  const int64_t experts = gate_up.size(0), hidden = x.size(1), inter = down.size(2);
  const bool half = x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf;
  if (!x.is_cuda() || !half || gate != Gate::Silu || tokens > kernels::kSkinnyMaxTokens ||
      pairs == 0 || pairs > kernels::kDecodeMaxPairs || !kernels::current_gemm_device().skinny_tma)
    return false;
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor xc = x.contiguous(), guc = gate_up.contiguous(), dc = down.contiguous();
  if (!whole_16_bytes(xc, {hidden}) || !whole_16_bytes(guc, {hidden}) ||
      !whole_16_bytes(dc, {inter}))
    return false;
  const at::Tensor ic = idx.contiguous();
  const int mt = tokens <= 8 ? 8 : 16;
  const int64_t slots_n = std::min(experts, pairs) + pairs / mt, rows_n = slots_n * mt;
  const auto i32 = x.options().dtype(at::kInt);
  at::Tensor slots = at::empty({slots_n}, i32), rows = at::empty({pairs}, i32);
  at::Tensor xg = at::empty({rows_n, hidden}, x.options());
  const int sms = at::cuda::getDeviceProperties(x.get_device())->multiProcessorCount;
  const cudaStream_t stream = current_stream(x);
  C10_CUDA_CHECK(kernels::launch_moe_decode_route(
      ic.data_ptr(), ic.scalar_type() == at::kLong, tokens, k, experts, xc.data_ptr(), hidden,
      hidden, xc.element_size(), mt, slots_n, slots.data_ptr<int32_t>(), rows.data_ptr<int32_t>(),
      xg.data_ptr(), sms, stream));
  at::Tensor h = at::empty({rows_n, inter}, x.options());
  at::Tensor y = at::empty({rows_n, hidden}, x.options());
  kernels::GroupedSkinny g{};
  g.dtype = kernel_dtype(x.scalar_type()), g.mt = mt, g.slots_n = slots_n, g.experts = experts;
  g.slots = slots.data_ptr<int32_t>();
  // gate/up: gate_up[e] is [gate; up], I rows each, k = H.
  g.n = inter, g.k = hidden, g.x = xg.data_ptr(), g.ldx = hidden;
  g.w = guc.data_ptr();
  g.w2 = static_cast<const char*>(guc.data_ptr()) + inter * hidden * guc.element_size();
  g.ldw = hidden, g.w_group_stride = 2 * inter * hidden;
  g.out = h.data_ptr(), g.ldo = inter;
  C10_CUDA_CHECK(kernels::launch_grouped_skinny(g, sms, stream));
  // down: [H, I] rows, k = I.
  g.n = hidden, g.k = inter, g.x = h.data_ptr(), g.ldx = inter;
  g.w = dc.data_ptr(), g.w2 = nullptr, g.ldw = inter, g.w_group_stride = hidden * inter;
  g.out = y.data_ptr(), g.ldo = hidden;
  C10_CUDA_CHECK(kernels::launch_grouped_skinny(g, sms, stream));
  out = combine(y, rows, &w, tokens, k);
  return true;
}

at::Tensor moe_experts_kernel(const at::Tensor& x, const at::Tensor& idx, const at::Tensor& w,
                              const at::Tensor& gate_up, const at::Tensor& down,
                              c10::string_view activation) {
  check_moe_experts("moe_experts", x, idx, w, gate_up, down, activation);
  at::Tensor out;
  if (decode_experts(x, idx, w, gate_up, down, parse_gate("moe_experts", activation), out))
    return out;
  return std::get<0>(run_experts(x, idx, w, gate_up, down, activation, false));
}

at::Tensor moe_experts_meta(const at::Tensor& x, const at::Tensor& idx, const at::Tensor& w,
                            const at::Tensor& gate_up, const at::Tensor& down,
                            c10::string_view activation) {
  check_moe_experts("moe_experts", x, idx, w, gate_up, down, activation);
  return at::empty_symint(x.sym_sizes(), x.options());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> experts_fwd_meta(
    const at::Tensor& x, const at::Tensor& idx, const at::Tensor& w, const at::Tensor& gate_up,
    const at::Tensor& down, c10::string_view activation) {
  check_moe_experts("_moe_experts_fwd", x, idx, w, gate_up, down, activation);
  const int64_t experts = gate_up.size(0);
  return {
      at::empty_symint(x.sym_sizes(), x.options()),
      at::empty_symint({padded_rows(idx.sym_numel(), experts), gate_up.sym_size(1)}, x.options()),
      at::empty_symint({idx.sym_numel()}, idx.options().dtype(at::kLong)),
      at::empty({experts}, idx.options().dtype(at::kInt))};
}

// ---- the backward (_moe_experts_bwd): the gradients of x, topk_w, gate_up and down that
// output_mask asks for (the others empty [0]), from the forward's gu, rows and offs.

void check_experts_bwd(const at::Tensor& dout, const at::Tensor& x, const at::Tensor& w,
                       const at::Tensor& gate_up, const at::Tensor& down, const at::Tensor& gu,
                       const at::Tensor& rows, const at::Tensor& offs) {
  const char* op = "_moe_experts_bwd";
  check_dtypes_and_devices(
      op, {{"dout", &dout}, {"x", &x}, {"gate_up", &gate_up}, {"down", &down}, {"gu", &gu}});
  check_same_shape(op, {{"dout", &dout}, {"x", &x}});
  check_dim(op, "topk_w", w, 2);
  TORCH_CHECK(rows.numel() == w.numel() &&
                  gu.size(0) == padded_rows(w.numel(), gate_up.size(0)).expect_int() &&
                  offs.numel() == gate_up.size(0),
              "cuops::", op, ": expected the forward's gu, rows and offs for ", w.numel(),
              " pairs and ", gate_up.size(0), " experts");
}

// The elementwise step between the backward's products (launch_moe_gated_bwd says what): dgu
// [count, 2I], hw [count, I] (dtype) and dwr [count] (accumulation type), each where wanted. On CUDA
// one pass (kernels/moe/gated_bwd.cu); elsewhere torch ops in the accumulation type.
struct GatedGrads {
  at::Tensor dgu, hw, dwr;
};

GatedGrads gated_bwd(const at::Tensor& gu, const at::Tensor& dh1, const at::Tensor& wr, Gate gate,
                     bool need_dgu, bool need_hw, bool need_dwr) {
  const auto dtype = gu.scalar_type();
  const auto acc = acc_type(gu);
  const int64_t count = gu.size(0), inter = gu.size(1) / 2;
  GatedGrads out;
  if (gu.is_cuda()) {
    const c10::cuda::CUDAGuard guard(gu.device());
    const at::Tensor guc = gu.contiguous(), dhc = dh1.defined() ? dh1.contiguous() : dh1;
    if (need_dgu) out.dgu = at::empty({count, 2 * inter}, gu.options());
    if (need_hw) out.hw = at::empty({count, inter}, gu.options());
    if (need_dwr) out.dwr = at::empty({count}, wr.options());
    auto ptr = [](const at::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; };
    C10_CUDA_CHECK(kernels::launch_moe_gated_bwd(
        kernel_dtype(dtype), gate, guc.data_ptr(), ptr(dhc), wr.data_ptr(), count, inter,
        ptr(out.dgu), ptr(out.hw), ptr(out.dwr), current_stream(gu)));
    return out;
  }
  const at::Tensor h = gated(gu, gate, acc).to(dtype).to(acc);  // as the forward stored it
  const at::Tensor d1 = dh1.defined() ? dh1.to(acc) : dh1;
  if (need_dwr) out.dwr = (d1 * h).sum(-1);
  if (need_hw) out.hw = (h * wr.unsqueeze(-1)).to(dtype);
  if (need_dgu) {
    const at::Tensor dh = d1 * wr.unsqueeze(-1);
    const at::Tensor g = gu.narrow(1, 0, inter).to(acc), u = gu.narrow(1, inter, inter).to(acc);
    const at::Tensor dg =
        gate == Gate::Silu ? at::silu_backward(dh * u, g) : at::gelu_backward(dh * u, g, "tanh");
    out.dgu = at::cat({dg, dh * gate_of(g, gate)}, 1).to(dtype);
  }
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> experts_bwd(
    const at::Tensor& dout, const at::Tensor& x, const at::Tensor& w, const at::Tensor& gate_up,
    const at::Tensor& down, const at::Tensor& gu, const at::Tensor& rows, const at::Tensor& offs,
    c10::string_view activation, std::array<bool, 4> mask) {
  check_experts_bwd(dout, x, w, gate_up, down, gu, rows, offs);
  const Gate gate = parse_gate("_moe_experts_bwd", activation);
  const auto acc = acc_type(x);
  const int64_t tokens = x.size(0), k = w.size(1), count = gu.size(0);
  // Each row's routing weight (0 on spare rows) and its token's gradient, in the layout.
  const at::Tensor wr =
      at::zeros({count}, w.options().dtype(acc)).index_put_({rows}, w.reshape(-1).to(acc));
  const at::Tensor dr = gather_rows(dout, rows, count, k);
  const bool need_dgu = mask[0] || mask[2];
  at::Tensor dx = at::empty({0}, x.options()), dw = at::empty({0}, w.options()),
             dgate_up = at::empty({0}, x.options()), ddown = at::empty({0}, x.options());
  at::Tensor dh1;  // dout @ down[e]: h's gradient before the routing weight
  if (mask[1] || need_dgu) dh1 = layout_mm(dr, down, false, offs);
  const GatedGrads gg = gated_bwd(gu, dh1, wr, gate, need_dgu, mask[3], mask[1]);
  if (mask[1]) dw = gg.dwr.index_select(0, rows).view({tokens, k}).to(w.scalar_type());
  if (mask[3]) ddown = layout_mm_k(dr, gg.hw, offs);
  if (mask[2]) dgate_up = layout_mm_k(gg.dgu, gather_rows(x, rows, count, k), offs);
  if (mask[0]) dx = combine(layout_mm(gg.dgu, gate_up, false, offs), rows, nullptr, tokens, k);
  return {dx, dw, dgate_up, ddown};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> experts_bwd_meta(
    const at::Tensor& dout, const at::Tensor& x, const at::Tensor& w, const at::Tensor& gate_up,
    const at::Tensor& down, const at::Tensor& gu, const at::Tensor& rows, const at::Tensor& offs,
    c10::string_view activation, std::array<bool, 4> mask) {
  parse_gate("_moe_experts_bwd", activation);
  auto like = [](bool on, const at::Tensor& t) {
    return on ? at::empty_symint(t.sym_sizes(), t.options()) : at::empty({0}, t.options());
  };
  return {like(mask[0], x), like(mask[1], w), like(mask[2], gate_up), like(mask[3], down)};
}

// ---- Autograd: with a gradient required the forward keeps x, topk_w, both weights, gu and the
// layout (rows, offs); without one, nothing.

class MoeExpertsFunction : public torch::autograd::Function<MoeExpertsFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& idx,
                            const at::Tensor& w, const at::Tensor& gate_up, const at::Tensor& down,
                            c10::string_view activation) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [out, gu, rows, offs] = cuops::_moe_experts_fwd(x, idx, w, gate_up, down, activation);
    ctx->save_for_backward({x, w, gate_up, down, gu, rows, offs});
    ctx->saved_data["activation"] = std::string(activation.data(), activation.size());
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const std::array<bool, 4> mask = {ctx->needs_input_grad(0), ctx->needs_input_grad(2),
                                      ctx->needs_input_grad(3), ctx->needs_input_grad(4)};
    auto [dx, dw, dgate_up, ddown] =
        cuops::_moe_experts_bwd(grads[0], s[0], s[1], s[2], s[3], s[4], s[5], s[6],
                                ctx->saved_data["activation"].toStringRef(), mask);
    auto or_none = [](bool on, const at::Tensor& t) { return on ? t : at::Tensor(); };
    return {or_none(mask[0], dx),    at::Tensor(), or_none(mask[1], dw), or_none(mask[2], dgate_up),
            or_none(mask[3], ddown), at::Tensor()};
  }
};

at::Tensor moe_experts_autograd(const at::Tensor& x, const at::Tensor& idx, const at::Tensor& w,
                                const at::Tensor& gate_up, const at::Tensor& down,
                                c10::string_view activation) {
  const bool keep =
      c10::GradMode::is_enabled() &&
      (x.requires_grad() || w.requires_grad() || gate_up.requires_grad() || down.requires_grad());
  if (!keep) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return cuops::moe_experts(x, idx, w, gate_up, down, activation);
  }
  return MoeExpertsFunction::apply(x, idx, w, gate_up, down, activation);
}

// Under CUDA autocast: x and both expert weights in the autocast dtype as F.linear casts them (float32
// masters through autocast's cache); the routing weights as they come (the combine runs in float32).
at::Tensor moe_experts_autocast(const at::Tensor& x, const at::Tensor& idx, const at::Tensor& w,
                                const at::Tensor& gate_up, const at::Tensor& down,
                                c10::string_view activation) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  return cuops::moe_experts(autocast_cuda(x), idx, w, autocast_cuda(gate_up), autocast_cuda(down),
                            activation);
}

}  // namespace

TORCH_LIBRARY_IMPL(cuops, CPU, m) {
  m.impl("grouped_mm", &grouped_mm_cpu);
  m.impl("moe_topk_softmax", &topk_softmax_kernel);
  m.impl("moe_experts", &moe_experts_kernel);
  m.impl("_moe_experts_fwd", &experts_fwd);
  m.impl("_moe_experts_bwd", &experts_bwd);
}
TORCH_LIBRARY_IMPL(cuops, CUDA, m) {
  m.impl("grouped_mm", &grouped_mm_cuda);
  m.impl("moe_topk_softmax", &topk_softmax_kernel);
  m.impl("moe_experts", &moe_experts_kernel);
  m.impl("_moe_experts_fwd", &experts_fwd);
  m.impl("_moe_experts_bwd", &experts_bwd);
}
TORCH_LIBRARY_IMPL(cuops, Meta, m) {
  m.impl("grouped_mm", &grouped_mm_meta);
  m.impl("moe_topk_softmax", &topk_softmax_meta);
  m.impl("moe_experts", &moe_experts_meta);
  m.impl("_moe_experts_fwd", &experts_fwd_meta);
  m.impl("_moe_experts_bwd", &experts_bwd_meta);
}
TORCH_LIBRARY_IMPL(cuops, Autograd, m) {
  m.impl("grouped_mm", &grouped_mm_autograd);
  m.impl("moe_topk_softmax", &topk_softmax_autograd);
  m.impl("moe_experts", &moe_experts_autograd);
}
TORCH_LIBRARY_IMPL(cuops, AutocastCUDA, m) {
  m.impl("grouped_mm", &grouped_mm_autocast);
  m.impl("moe_experts", &moe_experts_autocast);
}

}  // namespace cuops::ops
