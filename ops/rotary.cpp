// rotary (docs/ops.md#rotary): checks, the dtype rule, the reference, Meta, Autograd. The internal
// op _rotary_bwd carries the backward of q and k.
//
// Hugging Face's apply_rotary_pos_emb: q·cos + rotate_half(q)·sin (k likewise), cos and sin [B or 1,
// T, D] broadcast over the heads, rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2]). The result in
// promote(q, cos) (HF under autocast: bf16 q and k with float32 cos / sin give float32), the math in
// float32 (float64 for float64), rounded once. An optional dtype sets the outputs' dtype instead: the
// half type attention reads under autocast, the default result's values cast to it without the cast's
// pass each way (the gradients then arrive in it: half the bytes the backward reads).
//
// The outputs keep their input's layout (empty_like: HF's q is a transposed view of the projection,
// and attention reads either layout). CPU runs the reference's composite of torch ops; CUDA runs
// kernels/elementwise/rotary.cu in one pass (q and k read once), with the composite for mixes the kernel has no
// instance for (a float32 q with half cos, fp16 with bf16) and for rows without a unit element stride.
#include "ops/common.h"

namespace cuops::ops {
namespace {

void check_rotary(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                  const at::Tensor& sin, std::optional<at::ScalarType> dtype = std::nullopt) {
  TORCH_CHECK(!dtype.has_value() || is_supported_dtype(*dtype), "cuops::", op,
              ": expected dtype float32, float64, float16 or bfloat16 (or None), got ",
              dtype.has_value() ? dtype_name(*dtype) : "");
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"q", &q},
                                {"k", &k},
                                {"cos", &cos},
                                {"sin", &sin}}) {
    TORCH_CHECK(is_supported_dtype(t->scalar_type()), "cuops::", op, ": expected ", name,
                " to have dtype float32, float64, float16 or bfloat16, got ",
                dtype_name(t->scalar_type()));
    TORCH_CHECK(t->device() == q.device(), "cuops::", op, ": expected ", name,
                " on the device of q (", q.device(), "), got ", t->device());
  }
  check_dim(op, "q", q, 4);
  check_dim(op, "k", k, 4);
  check_dim(op, "cos", cos, 3);
  check_same_shape(op, {{"cos", &cos}, {"sin", &sin}});
  TORCH_CHECK(q.scalar_type() == k.scalar_type(), "cuops::", op,
              ": expected k to have the dtype of q (", dtype_name(q.scalar_type()), "), got ",
              dtype_name(k.scalar_type()));
  TORCH_CHECK(cos.scalar_type() == sin.scalar_type(), "cuops::", op,
              ": expected sin to have the dtype of cos (", dtype_name(cos.scalar_type()), "), got ",
              dtype_name(sin.scalar_type()));
  const auto& b = q.sym_size(0);
  const auto& t = q.sym_size(2);
  const auto& d = q.sym_size(3);
  TORCH_CHECK(k.sym_size(0) == b && k.sym_size(2) == t && k.sym_size(3) == d, "cuops::", op,
              ": expected q [B, Hq, T, D] and k [B, Hk, T, D] to share B, T and D, got q ",
              shape_str(q), " and k ", shape_str(k));
  TORCH_CHECK((cos.sym_size(0) == b || cos.sym_size(0) == 1) && cos.sym_size(1) == t &&
                  cos.sym_size(2) == d,
              "cuops::", op, ": expected cos and sin [B or 1, T, D] for q ", shape_str(q), ", got ",
              shape_str(cos));
  TORCH_CHECK(d % 2 == 0, "cuops::", op, ": expected an even head dimension D, got ", d);
}

// dtype where given, else Hugging Face's promote(q, cos).
at::ScalarType out_dtype(const at::Tensor& q, const at::Tensor& cos,
                         std::optional<at::ScalarType> dtype) {
  return dtype.value_or(at::promote_types(q.scalar_type(), cos.scalar_type()));
}

at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t h = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, h, h), x.narrow(-1, 0, h)}, -1);
}

// The math dtype of x (q, k or their gradients) with cos: float64 where either is, else float32.
at::ScalarType math_dtype(const at::Tensor& x, const at::Tensor& cos) {
  return at::promote_types(x.scalar_type(), cos.scalar_type()) == at::kDouble ? at::kDouble
                                                                              : at::kFloat;
}

// x·cos + rotate_half(x)·sin in the math dtype, rounded once to `out`.
at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                  at::ScalarType out) {
  const auto acc = math_dtype(x, cos);
  const at::Tensor xa = x.to(acc), c = cos.to(acc).unsqueeze(1), s = sin.to(acc).unsqueeze(1);
  return (xa * c + rotate_half(xa) * s).to(out).contiguous();
}

// x's layout (dense strides kept), in dtype.
at::Tensor like(const at::Tensor& x, at::ScalarType dtype) {
  return at::empty_like(x, x.options().dtype(dtype));
}

std::tuple<at::Tensor, at::Tensor> rotary_cpu(const at::Tensor& q, const at::Tensor& k,
                                              const at::Tensor& cos, const at::Tensor& sin,
                                              std::optional<at::ScalarType> dtype) {
  check_rotary("rotary", q, k, cos, sin, dtype);
  const auto out = out_dtype(q, cos, dtype), def = out_dtype(q, cos, std::nullopt);
  // The default result, cast: what dtype means, a wider one included.
  return {like(q, out).copy_(rotate(q, cos, sin, def)),
          like(k, out).copy_(rotate(k, cos, sin, def))};
}

// The gradient of x from g = d(x·cos + rotate_half(x)·sin): g·cos - rotate_half(g·sin) in the math
// dtype, rounded once to `out`.
at::Tensor unrotate(const at::Tensor& g, const at::Tensor& cos, const at::Tensor& sin,
                    at::ScalarType out) {
  const auto acc = math_dtype(g, cos);
  const at::Tensor ga = g.to(acc), c = cos.to(acc).unsqueeze(1), s = sin.to(acc).unsqueeze(1);
  return (ga * c - rotate_half(ga * s)).to(out).contiguous();
}

void check_rotary_bwd(const at::Tensor& gq, const at::Tensor& gk, const at::Tensor& cos,
                      const at::Tensor& sin, at::ScalarType dtype) {
  check_rotary("_rotary_bwd", gq, gk, cos, sin);
  TORCH_CHECK(is_supported_dtype(dtype),
              "cuops::_rotary_bwd: expected dtype float32, float64, "
              "float16 or bfloat16, got ",
              dtype_name(dtype));
}

std::tuple<at::Tensor, at::Tensor> rotary_bwd_cpu(const at::Tensor& gq, const at::Tensor& gk,
                                                  const at::Tensor& cos, const at::Tensor& sin,
                                                  at::ScalarType dtype) {
  check_rotary_bwd(gq, gk, cos, sin, dtype);
  return {like(gq, dtype).copy_(unrotate(gq, cos, sin, dtype)),
          like(gk, dtype).copy_(unrotate(gk, cos, sin, dtype))};
}

// ---- CUDA

kernels::RotaryTensor view_of(const at::Tensor& t) {
  return {t.data_ptr(), t.stride(0), t.stride(1), t.stride(2)};
}

bool aligned16(const at::Tensor& t) {
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  for (int64_t i = 0; i + 1 < t.dim(); ++i)
    if (t.size(i) > 1 && (t.stride(i) * t.element_size()) % 16 != 0) return false;
  return true;
}

// The forward's outputs or the backward's gradients of q and k in one launch, in `out`; the composite
// where the kernel has no instance (rotary_supports) or q, k or an output lacks a unit element stride.
std::tuple<at::Tensor, at::Tensor> rotary_cuda_pass(const at::Tensor& q_in, const at::Tensor& k_in,
                                                    const at::Tensor& cos_in,
                                                    const at::Tensor& sin_in, at::ScalarType out,
                                                    bool backward) {
  const c10::cuda::CUDAGuard guard(q_in.device());
  const int64_t d = q_in.size(3);
  const at::Tensor cos = cos_in.contiguous(), sin = sin_in.contiguous();
  at::Tensor oq = like(q_in, out), ok = like(k_in, out);
  const auto x_t = kernel_dtype(q_in.scalar_type()), trig_t = kernel_dtype(cos.scalar_type()),
             out_t = kernel_dtype(out);
  const int e = kernels::rotary_vector_elems(x_t, trig_t, out_t);
  const auto unit = [](const at::Tensor& t) { return t.stride(-1) == 1 || t.size(-1) <= 1; };
  const bool vec = (d / 2) % e == 0 && aligned16(q_in) && aligned16(k_in) && aligned16(cos) &&
                   aligned16(sin) && aligned16(oq) && aligned16(ok);
  if (!kernels::rotary_supports(x_t, trig_t, out_t) || !unit(q_in) || !unit(k_in) || !unit(oq) ||
      !unit(ok)) {
    if (backward) {
      return {oq.copy_(unrotate(q_in, cos, sin, out)), ok.copy_(unrotate(k_in, cos, sin, out))};
    }
    return {oq.copy_(rotate(q_in, cos, sin, out)), ok.copy_(rotate(k_in, cos, sin, out))};
  }
  kernels::RotaryArgs a{};
  a.x = x_t, a.trig = trig_t, a.out = out_t, a.backward = backward;
  a.batch = q_in.size(0), a.heads_q = q_in.size(1), a.heads_k = k_in.size(1);
  a.seq = q_in.size(2), a.d = d;
  a.q = view_of(q_in), a.k = view_of(k_in), a.oq = view_of(oq), a.ok = view_of(ok);
  a.cos = cos.data_ptr(), a.sin = sin.data_ptr();
  a.trig_sb = cos.size(0) == 1 ? 0 : cos.stride(0);
  C10_CUDA_CHECK(kernels::launch_rotary(a, vec, current_stream(q_in)));
  return {oq, ok};
}

std::tuple<at::Tensor, at::Tensor> rotary_cuda(const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& cos, const at::Tensor& sin,
                                               std::optional<at::ScalarType> dtype) {
  check_rotary("rotary", q, k, cos, sin, dtype);
  const auto out = out_dtype(q, cos, dtype), def = out_dtype(q, cos, std::nullopt);
  // A dtype the kernel has no instance for (a wider one, another half type): the default result,
  // cast, so that dtype means that cast on every path. The instances round their float32 math to
  // dtype once, which is that cast.
  if (out != def && !kernels::rotary_supports(kernel_dtype(q.scalar_type()),
                                              kernel_dtype(cos.scalar_type()), kernel_dtype(out))) {
    auto [oq, ok] = rotary_cuda_pass(q, k, cos, sin, def, false);
    return {like(q, out).copy_(oq), like(k, out).copy_(ok)};
  }
  return rotary_cuda_pass(q, k, cos, sin, out, false);
}

std::tuple<at::Tensor, at::Tensor> rotary_bwd_cuda(const at::Tensor& gq, const at::Tensor& gk,
                                                   const at::Tensor& cos, const at::Tensor& sin,
                                                   at::ScalarType dtype) {
  check_rotary_bwd(gq, gk, cos, sin, dtype);
  return rotary_cuda_pass(gq, gk, cos, sin, dtype, true);
}

// ---- Meta: shapes and dtypes only.

std::tuple<at::Tensor, at::Tensor> rotary_meta(const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& cos, const at::Tensor& sin,
                                               std::optional<at::ScalarType> dtype) {
  check_rotary("rotary", q, k, cos, sin, dtype);
  const auto out = out_dtype(q, cos, dtype);
  return {like(q, out), like(k, out)};
}

std::tuple<at::Tensor, at::Tensor> rotary_bwd_meta(const at::Tensor& gq, const at::Tensor& gk,
                                                   const at::Tensor& cos, const at::Tensor& sin,
                                                   at::ScalarType dtype) {
  check_rotary_bwd(gq, gk, cos, sin, dtype);
  return {like(gq, dtype), like(gk, dtype)};
}

// ---- Autograd: cos and sin are kept (q and k too where cos or sin need a gradient).

class RotaryFunction : public torch::autograd::Function<RotaryFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& cos, const at::Tensor& sin,
                               std::optional<at::ScalarType> dtype) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [oq, ok] = cuops::rotary(q, k, cos, sin, dtype);
    const bool trig_grad = cos.requires_grad() || sin.requires_grad();
    ctx->save_for_backward(trig_grad ? variable_list{cos, sin, q, k} : variable_list{cos, sin});
    ctx->saved_data["q_dtype"] = q.scalar_type();
    return {oq, ok};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &cos = saved[0], &sin = saved[1];
    const auto q_dtype = ctx->saved_data["q_dtype"].toScalarType();
    at::Tensor gq = grads[0], gk = grads[1];
    at::Tensor dq, dk, dcos, dsin;
    if (ctx->needs_input_grad(0) || ctx->needs_input_grad(1)) {
      // In q's dtype from the kernel (a bf16 q under autocast gets float32 gradients).
      std::tie(dq, dk) = cuops::_rotary_bwd(gq, gk, cos, sin, q_dtype);
    }
    if (saved.size() > 2 && (ctx->needs_input_grad(2) || ctx->needs_input_grad(3))) {
      // d/dcos = sum over heads (and a broadcast batch) of g·x; d/dsin of g·rotate_half(x).
      const at::Tensor &q = saved[2], &k = saved[3];
      const auto acc = gq.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
      auto reduce = [&](const at::Tensor& a, const at::Tensor& b) {
        return a.sum(1).sum_to_size(cos.sizes()) + b.sum(1).sum_to_size(cos.sizes());
      };
      const at::Tensor gqa = gq.to(acc), gka = gk.to(acc), qa = q.to(acc), ka = k.to(acc);
      dcos = reduce(gqa * qa, gka * ka).to(cos.scalar_type());
      dsin = reduce(gqa * rotate_half(qa), gka * rotate_half(ka)).to(sin.scalar_type());
    }
    return {ctx->needs_input_grad(0) ? dq : at::Tensor(),
            ctx->needs_input_grad(1) ? dk : at::Tensor(), dcos, dsin, at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> rotary_autograd(const at::Tensor& q, const at::Tensor& k,
                                                   const at::Tensor& cos, const at::Tensor& sin,
                                                   std::optional<at::ScalarType> dtype) {
  check_rotary("rotary", q, k, cos, sin, dtype);
  const bool grad = c10::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() ||
                                                    cos.requires_grad() || sin.requires_grad());
  if (!grad) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return cuops::rotary(q, k, cos, sin, dtype);
  }
  auto out = RotaryFunction::apply(q, k, cos, sin, dtype);
  return {out[0], out[1]};
}

}  // namespace

TORCH_LIBRARY_IMPL(cuops, CPU, m) {
  m.impl("rotary", &rotary_cpu);
  m.impl("_rotary_bwd", &rotary_bwd_cpu);
}
TORCH_LIBRARY_IMPL(cuops, CUDA, m) {
  m.impl("rotary", &rotary_cuda);
  m.impl("_rotary_bwd", &rotary_bwd_cuda);
}
TORCH_LIBRARY_IMPL(cuops, Meta, m) {
  m.impl("rotary", &rotary_meta);
  m.impl("_rotary_bwd", &rotary_bwd_meta);
}
TORCH_LIBRARY_IMPL(cuops, Autograd, m) { m.impl("rotary", &rotary_autograd); }

}  // namespace cuops::ops
