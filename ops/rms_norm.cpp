// rms_norm and add_rms_norm (docs/ops.md#rms_norm): checks, the dtype rules, CPU reference, CUDA,
// Meta, Autograd. The internal ops _rms_norm_fwd (the output, the sum x + residual where a residual
// is given, and 1 / rms per row, which the backward keeps) and _rms_norm_bwd (the gradient of the
// normalised input, and of the weight where asked) carry both ops.
//
// Dtypes follow Hugging Face's RMSNorm (`weight * normed.to(input_dtype)`) and its residual add
// (`residual + hidden`): the sum s in promote(x, residual), the output in promote(s, weight). Under
// autocast nothing is cast (as aten::rms_norm, which has no autocast kernel): the mixes autocast
// makes (a float32 residual stream beside half sublayer outputs, float32 master weights) run in the
// kernels as they come. An optional dtype sets the norm's output dtype instead (the half type the
// next GEMM reads under autocast: the values of the default output cast to it, without the cast's
// pass; its gradient comes back in that dtype).
#include "ops/common.h"

namespace cuops::ops {
namespace {

at::ScalarType sum_dtype(const at::Tensor& x, const std::optional<at::Tensor>& residual) {
  return residual.has_value() ? at::promote_types(x.scalar_type(), residual->scalar_type())
                              : x.scalar_type();
}

// x [..., D], residual x's shape, weight [D]; supported dtypes (mixes allowed), one device.
void check_rms_norm(const char* op, const at::Tensor& x, const std::optional<at::Tensor>& residual,
                    const at::Tensor& weight, double eps,
                    std::optional<at::ScalarType> dtype = std::nullopt) {
  const bool has_res = residual.has_value();
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"x", &x},
                                {"weight", &weight},
                                {"residual", has_res ? &*residual : nullptr}}) {
    if (t == nullptr) continue;
    TORCH_CHECK(is_supported_dtype(t->scalar_type()), "cuops::", op, ": expected ", name,
                " to have dtype float32, float64, float16 or bfloat16, got ",
                dtype_name(t->scalar_type()));
    TORCH_CHECK(t->device() == x.device(), "cuops::", op, ": expected ", name,
                " on the device of x (", x.device(), "), got ", t->device());
  }
  TORCH_CHECK(x.dim() >= 1, "cuops::", op, ": expected x to be at least 1-D ([..., D]), got 0-D");
  check_dim(op, "weight", weight, 1);
  TORCH_CHECK(weight.sym_size(0) == x.sym_size(-1), "cuops::", op,
              ": expected weight [D] to match x's last dimension, got x ", shape_str(x),
              " and weight ", shape_str(weight));
  if (has_res) check_same_shape(op, {{"x", &x}, {"residual", &*residual}});
  TORCH_CHECK(eps >= 0, "cuops::", op, ": expected eps >= 0, got ", eps);
  TORCH_CHECK(!dtype.has_value() || is_supported_dtype(*dtype), "cuops::", op,
              ": expected dtype float32, float64, float16 or bfloat16 (or None), got ",
              dtype.has_value() ? dtype_name(*dtype) : "");
}

// The accumulation type of the op's math: float64 where the sum or the weight is, else float32.
at::ScalarType math_dtype(at::ScalarType s_type, at::ScalarType w_type) {
  return at::promote_types(s_type, w_type) == at::kDouble ? at::kDouble : at::kFloat;
}

// The norm's dtype: dtype where given, else Hugging Face's promote(s, weight).
at::ScalarType norm_dtype(at::ScalarType s_type, const at::Tensor& weight,
                          std::optional<at::ScalarType> dtype) {
  return dtype.value_or(at::promote_types(s_type, weight.scalar_type()));
}

// ---- CPU reference: s rounded to its dtype, then the norm in the accumulation type, rounded once.

std::tuple<at::Tensor, at::Tensor, at::Tensor> rms_norm_fwd_cpu(
    const at::Tensor& x, const std::optional<at::Tensor>& residual, const at::Tensor& weight,
    double eps, std::optional<at::ScalarType> dtype) {
  check_rms_norm("_rms_norm_fwd", x, residual, weight, eps, dtype);
  const auto s_type = sum_dtype(x, residual);
  const auto y_type = norm_dtype(s_type, weight, dtype);
  const auto acc = math_dtype(s_type, weight.scalar_type());
  const at::Tensor s =
      residual.has_value() ? at::add(x.to(s_type), residual->to(s_type)) : x.contiguous();
  const at::Tensor sa = s.to(acc);
  const at::Tensor rstd = at::rsqrt(sa.pow(2).mean(-1) + eps);
  const at::Tensor y = (sa * rstd.unsqueeze(-1) * weight.to(acc)).to(y_type);
  return {y.contiguous(), residual.has_value() ? s.contiguous() : at::empty({0}, s.options()),
          rstd.reshape({-1}).contiguous()};
}

// ds = rstd (g - s rstd^2 mean(g s)) + dsum, g = dy w; dweight = sum over rows of dy s rstd.
std::tuple<at::Tensor, at::Tensor> rms_norm_bwd_reference(const at::Tensor& dy, const at::Tensor& s,
                                                          const at::Tensor& weight,
                                                          const at::Tensor& rstd,
                                                          const std::optional<at::Tensor>& dsum,
                                                          bool want_dweight) {
  const auto acc = rstd.scalar_type();
  const at::Tensor sa = as_rows(s).to(acc), r = rstd.reshape({-1, 1}), dya = as_rows(dy).to(acc);
  const at::Tensor g = dya * weight.to(acc);
  const at::Tensor dot = (g * sa).mean(-1, true);
  at::Tensor ds = r * (g - sa * r * r * dot);
  if (dsum.has_value()) ds = ds + as_rows(*dsum).to(acc);
  const at::Tensor dweight = want_dweight ? (dya * sa * r).sum(0).to(weight.scalar_type())
                                          : at::empty({0}, weight.options());
  return {ds.to(s.scalar_type()).reshape(s.sizes()).contiguous(), dweight};
}

void check_rms_norm_bwd(const at::Tensor& dy, const at::Tensor& s, const at::Tensor& weight,
                        const at::Tensor& rstd, const std::optional<at::Tensor>& dsum,
                        std::optional<at::ScalarType> x_dtype) {
  const char* op = "_rms_norm_bwd";
  check_rms_norm(op, s, dsum, weight, 0.0);
  TORCH_CHECK(!x_dtype.has_value() || is_supported_dtype(*x_dtype), "cuops::", op,
              ": expected x_dtype float32, float64, float16 or bfloat16 (or None), got ",
              x_dtype.has_value() ? dtype_name(*x_dtype) : "");
  check_same_shape(op, {{"s", &s}, {"dy", &dy}});
  TORCH_CHECK(is_supported_dtype(dy.scalar_type()), "cuops::", op,
              ": expected dy to have dtype float32, float64, float16 or bfloat16, got ",
              dtype_name(dy.scalar_type()));
  TORCH_CHECK(!dsum.has_value() || dsum->scalar_type() == s.scalar_type(), "cuops::", op,
              ": expected dsum to have s's dtype");
  TORCH_CHECK(rstd.scalar_type() == math_dtype(s.scalar_type(), weight.scalar_type()) &&
                  rstd.sym_numel() * s.sym_size(-1) == s.sym_numel(),
              "cuops::", op, ": expected rstd to hold one value per row of s in the math dtype");
}

// The gradient in x's dtype: a copy, never ds itself (an op's outputs do not alias).
at::Tensor narrow_grad(const at::Tensor& ds, const at::Tensor& s,
                       std::optional<at::ScalarType> x_dtype) {
  if (!x_dtype.has_value()) return at::empty({0}, s.options());
  return ds.to(*x_dtype, /*non_blocking=*/false, /*copy=*/true);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> rms_norm_bwd_cpu(
    const at::Tensor& dy, const at::Tensor& s, const at::Tensor& weight, const at::Tensor& rstd,
    const std::optional<at::Tensor>& dsum, std::array<bool, 2> mask,
    std::optional<at::ScalarType> x_dtype) {
  check_rms_norm_bwd(dy, s, weight, rstd, dsum, x_dtype);
  auto [ds, dweight] = rms_norm_bwd_reference(dy, s, weight, rstd, dsum, mask[1]);
  at::Tensor dx = narrow_grad(ds, s, x_dtype);
  return {mask[0] ? ds : at::empty({0}, s.options()), dweight, dx};
}

// ---- CUDA

// The kernels' dtypes for x (+ residual) and the weight: x + residual is symmetric, so the narrower
// is x and the residual is read in the sum's dtype (cast first where it has another: mixes no model
// makes, such as fp16 with bf16).
struct Mix {
  at::Tensor x, res;
  kernels::RmsNormTypes types;
};

Mix kernel_mix(const at::Tensor& x_in, const std::optional<at::Tensor>& res_in, const at::Tensor& w,
               at::ScalarType y_type) {
  Mix m{x_in, res_in.has_value() ? *res_in : at::Tensor(), {}};
  const auto s_type = sum_dtype(x_in, res_in);
  const auto half = [](at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; };
  if (m.res.defined() && half(m.res.scalar_type()) && !half(m.x.scalar_type()))
    std::swap(m.x, m.res);
  if (m.res.defined() && m.res.scalar_type() != s_type) m.res = m.res.to(s_type);
  m.types = {kernel_dtype(m.x.scalar_type()), kernel_dtype(s_type), kernel_dtype(w.scalar_type()),
             kernel_dtype(y_type)};
  return m;
}

// Rows with a unit element stride read in place; others are made contiguous.
at::Tensor rows_of(const at::Tensor& t, int64_t d) {
  const at::Tensor r = as_rows(t);
  return r.stride(-1) == 1 && (r.size(0) <= 1 || r.stride(0) >= d) ? r : r.contiguous();
}

bool aligned16(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 &&
         (t.dim() < 2 || t.size(0) <= 1 || (t.stride(0) * t.element_size()) % 16 == 0);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> rms_norm_fwd_cuda(
    const at::Tensor& x_in, const std::optional<at::Tensor>& residual, const at::Tensor& weight,
    double eps, std::optional<at::ScalarType> dtype) {
  check_rms_norm("_rms_norm_fwd", x_in, residual, weight, eps, dtype);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const auto s_type = sum_dtype(x_in, residual);
  const auto y_type = norm_dtype(s_type, weight, dtype);
  const int64_t d = x_in.size(-1);
  const Mix m = kernel_mix(x_in, residual, weight, y_type);
  const at::Tensor x = rows_of(m.x, d), res = m.res.defined() ? rows_of(m.res, d) : at::Tensor();
  const at::Tensor w = weight.contiguous();
  const int64_t rows = x.size(0);
  const auto opts = x_in.options();
  at::Tensor y = at::empty({rows, d}, opts.dtype(y_type));
  at::Tensor s = res.defined() ? at::empty({rows, d}, opts.dtype(s_type)) : at::empty({0}, opts);
  at::Tensor rstd = at::empty({rows}, opts.dtype(math_dtype(s_type, weight.scalar_type())));
  const int e = kernels::rms_norm_vector_elems(m.types, true);
  const bool vec = d % e == 0 && aligned16(x) && aligned16(w) && aligned16(y) &&
                   (!res.defined() || (aligned16(res) && aligned16(s)));
  if (d == 0 || !kernels::rms_norm_supports(m.types, vec) ||
      !kernels::rms_norm_fits(d, kernels::rms_norm_vector_elems(m.types, vec), false)) {
    // Rows too long for the kernels' registers, a mix without a kernel, or empty rows (whose mean
    // square, and so rstd, is NaN, as the reference has it): the reference.
    auto [y_ref, s_ref, r_ref] = rms_norm_fwd_cpu(x_in, residual, weight, eps, dtype);
    return {y_ref.view(x_in.sizes()), residual.has_value() ? s_ref.view(x_in.sizes()) : s_ref,
            r_ref.view({rows})};
  }
  kernels::RmsNormArgs a{};
  a.types = m.types;
  a.rows = rows, a.d = d;
  a.x = x.data_ptr(), a.ld_x = rows > 0 ? x.stride(0) : d;
  a.res = res.defined() ? res.data_ptr() : nullptr,
  a.ld_res = res.defined() && rows > 0 ? res.stride(0) : d;
  a.w = w.data_ptr(), a.eps = eps;
  a.y = y.data_ptr(), a.sum = res.defined() ? s.data_ptr() : nullptr, a.rstd = rstd.data_ptr();
  C10_CUDA_CHECK(kernels::launch_rms_norm_fwd(a, vec, current_stream(x_in)));
  return {y.view(x_in.sizes()), res.defined() ? s.view(x_in.sizes()) : s, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> rms_norm_bwd_cuda(
    const at::Tensor& dy_in, const at::Tensor& s_in, const at::Tensor& weight,
    const at::Tensor& rstd, const std::optional<at::Tensor>& dsum_in, std::array<bool, 2> mask,
    std::optional<at::ScalarType> x_dtype) {
  check_rms_norm_bwd(dy_in, s_in, weight, rstd, dsum_in, x_dtype);
  const c10::cuda::CUDAGuard guard(s_in.device());
  const int64_t d = s_in.size(-1);
  const auto s_type = kernel_dtype(s_in.scalar_type());
  // The kernels' vectors are the sum's (types.x = s's type); types.x is dx's type where the kernel
  // writes x's gradient from its own pass: the mix it has for that (a half x beside a float32 sum).
  kernels::RmsNormTypes types{s_type, s_type, kernel_dtype(weight.scalar_type()),
                              kernel_dtype(dy_in.scalar_type())};
  const at::Tensor dy = as_rows(dy_in).contiguous(), s = as_rows(s_in).contiguous();
  const at::Tensor dsum = dsum_in.has_value() ? as_rows(*dsum_in).contiguous() : at::Tensor();
  const at::Tensor w = weight.contiguous(), r = rstd.contiguous();
  const int64_t rows = s.size(0);
  const int e = kernels::rms_norm_vector_elems(types, true);
  const bool vec = d % e == 0 && aligned16(s) && aligned16(dy) && aligned16(w) &&
                   (!dsum.defined() || aligned16(dsum));
  if (!kernels::rms_norm_bwd_supports(types, vec) ||
      !kernels::rms_norm_fits(d, kernels::rms_norm_vector_elems(types, vec), true)) {
    auto [ds, dw] = rms_norm_bwd_reference(dy_in, s_in, weight, rstd, dsum_in, mask[1]);
    at::Tensor dx = narrow_grad(ds, s_in, x_dtype);
    return {mask[0] ? ds.view(s_in.sizes()) : at::empty({0}, s_in.options()), dw,
            x_dtype.has_value() ? dx.view(s_in.sizes()) : dx};
  }
  kernels::RmsNormTypes one_pass = types;
  if (x_dtype.has_value()) one_pass.x = kernel_dtype(*x_dtype);
  const bool dx_in_pass = one_pass.x != types.x && kernels::rms_norm_bwd_supports(one_pass, vec);
  if (dx_in_pass) types = one_pass;
  // ds where asked, or where a cast makes dx from it.
  const bool want_ds = mask[0] || (x_dtype.has_value() && !dx_in_pass);
  at::Tensor ds = want_ds ? at::empty({rows, d}, s.options()) : at::empty({0}, s.options());
  at::Tensor dx =
      dx_in_pass ? at::empty({rows, d}, s.options().dtype(*x_dtype)) : at::empty({0}, s.options());
  at::Tensor dweight =
      mask[1] ? at::empty({d}, weight.options()) : at::empty({0}, weight.options());
  const auto finish = [&]() -> std::tuple<at::Tensor, at::Tensor, at::Tensor> {
    if (x_dtype.has_value() && !dx_in_pass) dx = narrow_grad(ds, s_in, x_dtype);
    return {mask[0] ? ds.view(s_in.sizes()) : at::empty({0}, s_in.options()), dweight,
            x_dtype.has_value() ? dx.view(s_in.sizes()) : dx};
  };
  if (rows == 0) {
    if (mask[1]) dweight.zero_();
    return finish();
  }
  at::Tensor workspace;
  if (mask[1]) {
    workspace = at::empty({kernels::rms_norm_bwd_workspace_bytes(types, rows, d, vec)},
                          s.options().dtype(at::kByte));
  }
  kernels::RmsNormBwdArgs a{};
  a.types = types;
  a.rows = rows, a.d = d;
  a.dy = dy.data_ptr(), a.s = s.data_ptr(), a.w = w.data_ptr(), a.rstd = r.data_ptr();
  a.dsum = dsum.defined() ? dsum.data_ptr() : nullptr;
  a.ds = want_ds ? ds.data_ptr() : nullptr;
  a.dx = dx_in_pass ? dx.data_ptr() : nullptr;
  a.dweight = mask[1] ? dweight.data_ptr() : nullptr;
  a.workspace = mask[1] ? workspace.data_ptr() : nullptr;
  C10_CUDA_CHECK(kernels::launch_rms_norm_bwd(a, vec, current_stream(s_in)));
  return finish();
}

// ---- Meta

std::tuple<at::Tensor, at::Tensor, at::Tensor> rms_norm_fwd_meta(
    const at::Tensor& x, const std::optional<at::Tensor>& residual, const at::Tensor& weight,
    double eps, std::optional<at::ScalarType> dtype) {
  check_rms_norm("_rms_norm_fwd", x, residual, weight, eps, dtype);
  const auto s_type = sum_dtype(x, residual);
  const auto y_type = norm_dtype(s_type, weight, dtype);
  c10::SymInt rows = 1;
  for (int64_t i = 0; i + 1 < x.dim(); ++i) rows *= x.sym_size(i);
  return {at::empty_symint(x.sym_sizes(), x.options().dtype(y_type)),
          residual.has_value() ? at::empty_symint(x.sym_sizes(), x.options().dtype(s_type))
                               : at::empty({0}, x.options()),
          at::empty_symint({rows}, x.options().dtype(math_dtype(s_type, weight.scalar_type())))};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> rms_norm_bwd_meta(
    const at::Tensor& dy, const at::Tensor& s, const at::Tensor& weight, const at::Tensor& rstd,
    const std::optional<at::Tensor>& dsum, std::array<bool, 2> mask,
    std::optional<at::ScalarType> x_dtype) {
  check_rms_norm_bwd(dy, s, weight, rstd, dsum, x_dtype);
  return {mask[0] ? at::empty_symint(s.sym_sizes(), s.options()) : at::empty({0}, s.options()),
          mask[1] ? at::empty_symint(weight.sym_sizes(), weight.options())
                  : at::empty({0}, weight.options()),
          x_dtype.has_value() ? at::empty_symint(s.sym_sizes(), s.options().dtype(*x_dtype))
                              : at::empty({0}, s.options())};
}

// ---- The public ops below the autograd key: the internal forward on every backend (CPU, CUDA and
// Meta register the same function).

at::Tensor rms_norm_impl(const at::Tensor& x, const at::Tensor& weight, double eps,
                         std::optional<at::ScalarType> dtype) {
  check_rms_norm("rms_norm", x, std::nullopt, weight, eps, dtype);  // errors name the op called
  return std::get<0>(cuops::_rms_norm_fwd(x, std::nullopt, weight, eps, dtype));
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm_impl(const at::Tensor& x,
                                                     const at::Tensor& residual,
                                                     const at::Tensor& weight, double eps,
                                                     std::optional<at::ScalarType> dtype) {
  check_rms_norm("add_rms_norm", x, residual, weight, eps, dtype);
  auto [y, s, rstd] = cuops::_rms_norm_fwd(x, residual, weight, eps, dtype);
  return {y, s};
}

// ---- Autograd: s (x for rms_norm), the weight and rstd are kept.

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x,
                               const std::optional<at::Tensor>& residual, const at::Tensor& weight,
                               double eps, std::optional<at::ScalarType> dtype) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [y, s, rstd] = cuops::_rms_norm_fwd(x, residual, weight, eps, dtype);
    // An output nobody differentiates (the sum, say) comes back undefined, not as zeros to fill
    // and read again.
    ctx->set_materialize_grads(false);
    const bool has_res = residual.has_value();
    ctx->save_for_backward({has_res ? s : x, weight, rstd});
    ctx->saved_data["has_res"] = has_res;
    ctx->saved_data["x_dtype"] = x.scalar_type();
    ctx->saved_data["res_dtype"] = has_res ? residual->scalar_type() : x.scalar_type();
    ctx->saved_data["y_dtype"] = y.scalar_type();
    if (!has_res) return {y};
    return {y, s};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &s = saved[0], &weight = saved[1], &rstd = saved[2];
    const bool has_res = ctx->saved_data["has_res"].toBool();
    const auto s_dtype = s.scalar_type();
    const auto x_dtype = ctx->saved_data["x_dtype"].toScalarType();
    const auto res_dtype = ctx->saved_data["res_dtype"].toScalarType();
    const bool want_x = ctx->needs_input_grad(0), want_res = has_res && ctx->needs_input_grad(1);
    // x's gradient in its own (narrower) dtype comes from the backward's pass (autocast's half
    // sublayer output beside a float32 stream), not from a cast pass over the sum's gradient.
    const bool x_apart = want_x && x_dtype != s_dtype;
    const bool want_s = (want_x && !x_apart) || want_res;
    // needs_input_grad counts the tensors given: the weight's is 1 without a residual.
    const bool want_w = ctx->needs_input_grad(has_res ? 2 : 1);
    at::Tensor dy = grads[0];
    if (!dy.defined()) {
      dy = at::zeros(s.sizes(), s.options().dtype(ctx->saved_data["y_dtype"].toScalarType()));
    }
    std::optional<at::Tensor> dsum;
    if (has_res && grads.size() > 1 && grads[1].defined()) dsum = grads[1].to(s_dtype);
    auto [ds, dweight, dx_apart] =
        cuops::_rms_norm_bwd(dy, s, weight, rstd, dsum, {want_s, want_w},
                             x_apart ? std::optional<at::ScalarType>(x_dtype) : std::nullopt);
    at::Tensor dx, dres;
    if (want_x) dx = x_apart ? dx_apart : ds;
    if (want_res) dres = ds.to(res_dtype);
    return {dx, dres, want_w ? dweight : at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

bool needs_grad(std::initializer_list<const at::Tensor*> ts) {
  if (!c10::GradMode::is_enabled()) return false;
  for (const at::Tensor* t : ts)
    if (t != nullptr && t->requires_grad()) return true;
  return false;
}

at::Tensor rms_norm_autograd(const at::Tensor& x, const at::Tensor& weight, double eps,
                             std::optional<at::ScalarType> dtype) {
  check_rms_norm("rms_norm", x, std::nullopt, weight, eps, dtype);
  if (!needs_grad({&x, &weight})) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return cuops::rms_norm(x, weight, eps, dtype);
  }
  return RmsNormFunction::apply(x, std::nullopt, weight, eps, dtype)[0];
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm_autograd(const at::Tensor& x,
                                                         const at::Tensor& residual,
                                                         const at::Tensor& weight, double eps,
                                                         std::optional<at::ScalarType> dtype) {
  check_rms_norm("add_rms_norm", x, residual, weight, eps, dtype);
  if (!needs_grad({&x, &residual, &weight})) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return cuops::add_rms_norm(x, residual, weight, eps, dtype);
  }
  auto out = RmsNormFunction::apply(x, residual, weight, eps, dtype);
  return {out[0], out[1]};
}

}  // namespace

TORCH_LIBRARY_IMPL(cuops, CPU, m) {
  m.impl("rms_norm", &rms_norm_impl);
  m.impl("add_rms_norm", &add_rms_norm_impl);
  m.impl("_rms_norm_fwd", &rms_norm_fwd_cpu);
  m.impl("_rms_norm_bwd", &rms_norm_bwd_cpu);
}
TORCH_LIBRARY_IMPL(cuops, CUDA, m) {
  m.impl("rms_norm", &rms_norm_impl);
  m.impl("add_rms_norm", &add_rms_norm_impl);
  m.impl("_rms_norm_fwd", &rms_norm_fwd_cuda);
  m.impl("_rms_norm_bwd", &rms_norm_bwd_cuda);
}
TORCH_LIBRARY_IMPL(cuops, Meta, m) {
  m.impl("rms_norm", &rms_norm_impl);
  m.impl("add_rms_norm", &add_rms_norm_impl);
  m.impl("_rms_norm_fwd", &rms_norm_fwd_meta);
  m.impl("_rms_norm_bwd", &rms_norm_bwd_meta);
}

TORCH_LIBRARY_IMPL(cuops, Autograd, m) {
  m.impl("rms_norm", &rms_norm_autograd);
  m.impl("add_rms_norm", &add_rms_norm_autograd);
}

}  // namespace cuops::ops
