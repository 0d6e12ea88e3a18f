// gemm (in place) and mm (functional): checks, CPU reference, CUDA host wrappers, Meta, Autograd,
// Autocast.
#include "ops/common.h"

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/variable.h>

namespace cuops::ops {
namespace {

void check_operands(const char* op, const at::Tensor& a, const at::Tensor& b) {
  check_dim(op, "a", a, 2);
  check_dim(op, "b", b, 2);
  TORCH_CHECK(a.sym_size(1) == b.sym_size(0), "cuops::", op, ": expected a and b to share the inner dimension, got a ",
              shape_str(a), " and b ", shape_str(b));
}

void check_gemm(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b) {
  check_dtypes_and_devices("gemm", {{"c", &c}, {"a", &a}, {"b", &b}});
  check_operands("gemm", a, b);
  check_dim("gemm", "c", c, 2);
  TORCH_CHECK(c.sym_size(0) == a.sym_size(0) && c.sym_size(1) == b.sym_size(1), "cuops::gemm: expected c of shape [",
              a.sym_size(0), ", ", b.sym_size(1), "] (rows of a, columns of b), got ", shape_str(c));
}

// c is read by no one but written everywhere, and a/b are re-read many times: any shared memory,
// even c being a itself, would change the inputs while they are being used.
void check_gemm_memory(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b) {
  check_output_not_self_overlapping("gemm", "c", c);
  check_output_overlap("gemm", "c", c, "a", a, /*allow_same=*/false);
  check_output_overlap("gemm", "c", c, "b", b, /*allow_same=*/false);
}

void check_mm(const at::Tensor& a, const at::Tensor& b) {
  check_dtypes_and_devices("mm", {{"a", &a}, {"b", &b}});
  check_operands("mm", a, b);
}

// ---- CPU reference: half types are multiplied in float32 (the accumulation type) and rounded once.

at::Tensor product_cpu(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() == at::kHalf || a.scalar_type() == at::kBFloat16) return at::mm(a.to(at::kFloat), b.to(at::kFloat));
  return at::mm(a, b);
}

void gemm_cpu(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double alpha, double beta) {
  check_gemm(c, a, b);
  check_gemm_memory(c, a, b);
  at::Tensor result = product_cpu(a, b).mul_(alpha);
  // beta == 0 ignores c entirely, so NaN or garbage in c never leaks into the result.
  if (beta != 0.0) result.add_(c.to(result.scalar_type()), beta);
  const_cast<at::Tensor&>(c).copy_(result);
}

at::Tensor mm_cpu(const at::Tensor& a, const at::Tensor& b) {
  check_mm(a, b);
  return product_cpu(a, b).to(a.scalar_type()).contiguous();
}

// ---- CUDA

kernels::MatrixView view(const at::Tensor& t) { return {t.data_ptr(), t.stride(0), t.stride(1)}; }

// Read at each call, like torch.mm: "high"/"medium" float32 matmul precision allows TF32.
bool allow_tf32() { return at::globalContext().allowTF32CuBLAS(); }

// Elements in 16 bytes: the fast kernels' unit for operand rows.
int64_t row_unit(const at::Tensor& t) { return 16 / t.element_size(); }

// An empty [rows, cols] view with rows a whole number of 16 bytes apart (the fast kernels' rule for
// operand leading strides), so a copy is always one they read.
at::Tensor padded_rows(int64_t rows, int64_t cols, const at::Tensor& like) {
  const int64_t unit = row_unit(like);
  return at::empty({rows, (cols + unit - 1) / unit * unit}, like.options()).narrow(1, 0, cols);
}

// x [r, c] float32 with unit column stride -> its [c, r] transpose, row-major with padded rows, by
// cuops' transpose kernel (torch's transposing copy ran at ~0.9 TB/s on the H100, a third of the bus:
// ~150 us at 4096^2, NOTES.md).
at::Tensor transposed_copy(const at::Tensor& x) {
  at::Tensor out = padded_rows(x.size(1), x.size(0), x);
  C10_CUDA_CHECK(kernels::launch_transpose_f32(x.data_ptr<float>(), x.size(0), x.size(1), x.stride(0),
                                               out.data_ptr<float>(), out.stride(0), current_stream(x)));
  return out;
}

// Whether t [rows, cols] is what the fast kernels read along dimension `inner` without a copy: unit
// stride there (or one element), the other stride a whole number of 16 bytes (or one element), and a
// 16-byte aligned base (kernels/gemm.cu's launch_fast applies the same rule).
bool fast_layout(const at::Tensor& t, int inner) {
  const int outer = 1 - inner;
  return (t.stride(inner) == 1 || t.size(inner) <= 1) && (t.size(outer) <= 1 || t.stride(outer) % row_unit(t) == 0) &&
         reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// Copies what the fast kernels cannot read, when the product pays for the copy: copying b costs
// about 500 / m of the product's time at H100 rates (a: 500 / n) and the fallback is at best 4x slower
// (the portable TF32 kernel; the general kernel ~50x), so from 256 rows on.
// - An operand with odd strides, rows not a whole number of 16 bytes (a contiguous [4097, 4097]) or a
//   misaligned base: into padded rows (a row-major; b row-major, or column-major for Hopper's TF32).
// - Hopper's TF32 (wgmma, shared operands k-major; with c row-major): a transposed a with a row-major b
//   has no copy-free form (kernels/gemm_wgmma.cu runs row-major a and b as the transposed problem, a
//   transposed a from registers), so the smaller of the two is copied by cuops' transpose kernel.
// float64 always runs the general kernel. The copies come from torch's allocator on the op's stream;
// this runs under the op's device guard.
void readable_operands(at::Tensor& a, at::Tensor& b, bool tf32, bool c_row_major) {
  if (a.scalar_type() == at::kDouble) return;
  const bool a_k = fast_layout(a, 1), a_m = fast_layout(a, 0);
  const bool b_k = fast_layout(b, 0), b_n = fast_layout(b, 1);
  const bool wgmma_tf32 =
      tf32 && c_row_major && a.scalar_type() == at::kFloat && kernels::gemm_tf32_wants_kmajor();
  bool copy_a = !a_k && !a_m, copy_b = !b_k && !b_n;
  if (wgmma_tf32 && !a_k && a_m && !b_k && b_n) (a.size(0) <= b.size(1) ? copy_a : copy_b) = true;
  if ((copy_a && b.size(1) < 256) || (copy_b && a.size(0) < 256)) return;
  const bool f32 = a.scalar_type() == at::kFloat;
  if (copy_a) {
    a = f32 && a.stride(0) == 1 && a.stride(1) >= a.size(0) ? transposed_copy(a.t())
                                                            : padded_rows(a.size(0), a.size(1), a).copy_(a);
  }
  if (copy_b && wgmma_tf32) {
    b = f32 && b.stride(1) == 1 && b.stride(0) >= b.size(1) ? transposed_copy(b).t()
                                                            : padded_rows(b.size(1), b.size(0), b).copy_(b.t()).t();
  } else if (copy_b) {
    b = padded_rows(b.size(0), b.size(1), b).copy_(b);
  }
}

void gemm_cuda(const at::Tensor& c, const at::Tensor& a_in, const at::Tensor& b_in, double alpha, double beta) {
  check_gemm(c, a_in, b_in);
  check_gemm_memory(c, a_in, b_in);
  const c10::cuda::CUDAGuard guard(c.device());
  const bool tf32 = allow_tf32();
  at::Tensor a = a_in, b = b_in;
  // c neither row- nor column-major runs the general kernel whatever the operands: nothing to copy for.
  if (c.stride(1) == 1 || c.stride(0) == 1 || c.size(0) <= 1 || c.size(1) <= 1) {
    readable_operands(a, b, tf32, c.stride(1) == 1 || c.size(1) <= 1);  // launch_fast's row-major test
  }
  C10_CUDA_CHECK(kernels::launch_gemm(kernel_dtype(c.scalar_type()), a.size(0), b.size(1), a.size(1), alpha, view(a),
                                      view(b), beta, c.data_ptr(), c.stride(0), c.stride(1), tf32, current_stream(c)));
}

at::Tensor mm_cuda(const at::Tensor& a_in, const at::Tensor& b_in) {
  check_mm(a_in, b_in);
  const c10::cuda::CUDAGuard guard(a_in.device());
  const bool tf32 = allow_tf32();
  at::Tensor a = a_in, b = b_in;
  readable_operands(a, b, tf32, /*c_row_major=*/true);
  at::Tensor out = at::empty({a.size(0), b.size(1)}, a.options());
  C10_CUDA_CHECK(kernels::launch_gemm(kernel_dtype(a.scalar_type()), a.size(0), b.size(1), a.size(1), 1.0, view(a),
                                      view(b), 0.0, out.data_ptr(), out.stride(0), out.stride(1), tf32,
                                      current_stream(a)));
  return out;
}

// ---- Meta

void gemm_meta(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double, double) { check_gemm(c, a, b); }

at::Tensor mm_meta(const at::Tensor& a, const at::Tensor& b) {
  check_mm(a, b);
  return at::empty_symint({a.sym_size(0), b.sym_size(1)}, a.options());
}

// ---- Autograd

void gemm_autograd(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double alpha, double beta) {
  check_no_grad("gemm", "mm", {{"c", &c}, {"a", &a}, {"b", &b}});
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    cuops::gemm(c, a, b, alpha, beta);
  }
  torch::autograd::impl::bump_version(c);
}

// grad_a = g @ b^T, grad_b = a^T @ g, through cuops::mm, which reads the transposed views in place.
class MmFunction : public torch::autograd::Function<MmFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b) {
    ctx->save_for_backward({a, b});
    at::AutoDispatchBelowADInplaceOrView guard;
    return cuops::mm(a, b);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& g = grads[0];
    at::Tensor grad_a, grad_b;
    if (ctx->needs_input_grad(0)) grad_a = cuops::mm(g, saved[1].t());
    if (ctx->needs_input_grad(1)) grad_b = cuops::mm(saved[0].t(), g);
    return {grad_a, grad_b};
  }
};

at::Tensor mm_autograd(const at::Tensor& a, const at::Tensor& b) { return MmFunction::apply(a, b); }

// Under CUDA autocast mm runs in the autocast dtype, like torch.mm.
at::Tensor mm_autocast(const at::Tensor& a, const at::Tensor& b) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  const auto dtype = at::autocast::get_autocast_dtype(at::kCUDA);
  return cuops::mm(at::autocast::cached_cast(dtype, a, c10::DeviceType::CUDA),
                   at::autocast::cached_cast(dtype, b, c10::DeviceType::CUDA));
}

}  // namespace

TORCH_LIBRARY_IMPL(cuops, CPU, m) {
  m.impl("gemm", &gemm_cpu);
  m.impl("mm", &mm_cpu);
}
TORCH_LIBRARY_IMPL(cuops, CUDA, m) {
  m.impl("gemm", &gemm_cuda);
  m.impl("mm", &mm_cuda);
}
TORCH_LIBRARY_IMPL(cuops, Meta, m) {
  m.impl("gemm", &gemm_meta);
  m.impl("mm", &mm_meta);
}
TORCH_LIBRARY_IMPL(cuops, Autograd, m) {
  m.impl("gemm", &gemm_autograd);
  m.impl("mm", &mm_autograd);
}
TORCH_LIBRARY_IMPL(cuops, AutocastCUDA, m) { m.impl("mm", &mm_autocast); }

}  // namespace cuops::ops
