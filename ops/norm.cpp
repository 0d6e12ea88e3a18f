// two_norm: checks, CPU reference, CUDA host wrapper, Meta, Autograd, Autocast (float32).
#include "ops/common.h"

#include <ATen/autocast_mode.h>

namespace cuops::ops {
namespace {

void check_two_norm(const at::Tensor& a, const at::Tensor& b) {
  check_dtypes_and_devices("two_norm", {{"a", &a}, {"b", &b}});
  check_same_shape("two_norm", {{"a", &a}, {"b", &b}});
}

// The reference path works in float64 throughout: ATen's float32 CPU norm sums naively and loses
// ~1e-3 relative at 2^24 elements; upcasting first also keeps a - b from rounding in half types.
at::Tensor two_norm_cpu(const at::Tensor& a, const at::Tensor& b) {
  check_two_norm(a, b);
  const at::Tensor diff = a.to(at::kDouble) - b.to(at::kDouble);
  return at::linalg_vector_norm(diff, 2).to(a.scalar_type());
}

at::Tensor two_norm_cuda(const at::Tensor& a, const at::Tensor& b) {
  check_two_norm(a, b);
  const c10::cuda::CUDAGuard guard(a.device());
  const at::Tensor ac = a.contiguous(), bc = b.contiguous();
  const auto dtype = kernel_dtype(a.scalar_type());
  const int64_t n = ac.numel();
  at::Tensor out = at::empty({}, a.options());
  const int sms = at::cuda::getDeviceProperties(a.get_device())->multiProcessorCount;
  const int64_t scratch_bytes = kernels::two_norm_scratch_bytes(n, sms);
  // Scratch through torch's allocator, so it is stream-ordered and CUDA-graph safe.
  at::Tensor scratch = at::empty({scratch_bytes}, a.options().dtype(at::kByte));
  C10_CUDA_CHECK(kernels::launch_two_norm(dtype, out.data_ptr(), ac.data_ptr(), bc.data_ptr(), n,
                                          scratch.data_ptr(), scratch_bytes, sms,
                                          current_stream(a)));
  return out;
}

at::Tensor two_norm_meta(const at::Tensor& a, const at::Tensor& b) {
  check_two_norm(a, b);
  return at::empty({}, a.options());
}

// d||a-b||/da = (a-b)/||a-b||, and 0 where the norm is 0 (the subgradient torch uses). The division
// is by a denominator that is never 0, so double backward sees no inf*0 either.
class TwoNormFunction : public torch::autograd::Function<TwoNormFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b) {
    at::Tensor out;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      out = cuops::two_norm(a, b);
    }
    ctx->save_for_backward({a, b, out});
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &a = saved[0], &b = saved[1], &norm = saved[2];
    const at::Tensor zero_norm = norm == 0;
    const at::Tensor coef = at::where(zero_norm, at::zeros_like(norm),
                                      grads[0] / at::where(zero_norm, at::ones_like(norm), norm));
    const at::Tensor grad_a = (a - b) * coef;
    return {grad_a, -grad_a};
  }
};

at::Tensor two_norm_autograd(const at::Tensor& a, const at::Tensor& b) {
  return TwoNormFunction::apply(a, b);
}

// Under CUDA autocast the norm runs in float32, as torch's own norms do.
at::Tensor two_norm_autocast(const at::Tensor& a, const at::Tensor& b) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  return cuops::two_norm(at::autocast::cached_cast(at::kFloat, a, c10::DeviceType::CUDA),
                         at::autocast::cached_cast(at::kFloat, b, c10::DeviceType::CUDA));
}

}  // namespace

TORCH_LIBRARY_IMPL(cuops, CPU, m) { m.impl("two_norm", &two_norm_cpu); }
TORCH_LIBRARY_IMPL(cuops, CUDA, m) { m.impl("two_norm", &two_norm_cuda); }
TORCH_LIBRARY_IMPL(cuops, Meta, m) { m.impl("two_norm", &two_norm_meta); }
TORCH_LIBRARY_IMPL(cuops, Autograd, m) { m.impl("two_norm", &two_norm_autograd); }
TORCH_LIBRARY_IMPL(cuops, AutocastCUDA, m) { m.impl("two_norm", &two_norm_autocast); }

}  // namespace cuops::ops
