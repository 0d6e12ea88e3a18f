// gemm (in place) and mm (functional): checks, CPU reference, CUDA host wrappers, Meta, Autograd,
// Autocast.
#include "ops/common.h"

#include "ops/fused_gemm.h"

#include "kernels/gemm/gemm_plan.h"
#include <torch/csrc/autograd/variable.h>

namespace cuops::ops {
namespace {

void check_operands(const char* op, const at::Tensor& a, const at::Tensor& b) {
  check_dim(op, "a", a, 2);
  check_dim(op, "b", b, 2);
  TORCH_CHECK(a.sym_size(1) == b.sym_size(0), "cuops::", op,
              ": expected a and b to share the inner dimension, got a ", shape_str(a), " and b ",
              shape_str(b));
}

void check_gemm(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b) {
  check_dtypes_and_devices("gemm", {{"c", &c}, {"a", &a}, {"b", &b}});
  check_operands("gemm", a, b);
  check_dim("gemm", "c", c, 2);
  TORCH_CHECK(c.sym_size(0) == a.sym_size(0) && c.sym_size(1) == b.sym_size(1),
              "cuops::gemm: expected c of shape [", a.sym_size(0), ", ", b.sym_size(1),
              "] (rows of a, columns of b), got ", shape_str(c));
}

// c is written everywhere (and read first where beta != 0) while a and b are re-read many times: any
// shared memory, even c being a itself, would change the inputs while they are being used.
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
  return at::mm(a.to(acc_type(a)), b.to(acc_type(a)));
}

void gemm_cpu(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double alpha,
              double beta) {
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

// Read at each call, like torch.mm: "high"/"medium" float32 matmul precision allows TF32.
bool allow_tf32() { return at::globalContext().allowTF32CuBLAS(); }

kernels::GemmOperand operand(const at::Tensor& t) {
  return {t.data_ptr(), t.stride(0), t.stride(1)};
}

kernels::GemmRequest request(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b,
                             double alpha, double beta) {
  return {kernel_dtype(c.scalar_type()),
          a.size(0),
          b.size(1),
          a.size(1),
          operand(a),
          operand(b),
          c.data_ptr(),
          c.stride(0),
          c.stride(1),
          alpha,
          beta,
          allow_tf32()};
}

// The copy a plan describes (kernels/gemm/gemm_plan.cpp decides when one pays, its layout and how it is
// made): a [rows, ld] buffer narrowed to `cols`, holding t (row-major) or t^T (column-major, returned
// viewed as t). From torch's allocator on the op's stream, under the op's device guard.
at::Tensor copied(const at::Tensor& t, const kernels::OperandCopy& copy) {
  const bool col = copy.layout == kernels::CopyLayout::ColumnMajor;
  const at::Tensor src = col ? t.t() : t;
  at::Tensor out = at::empty({copy.rows, copy.ld}, t.options()).narrow(1, 0, copy.cols);
  if (copy.via == kernels::CopyVia::Transpose) {
    // src's rows are its strided axis: the transpose kernel reads src^T, row-major, as its rows.
    const at::Tensor x = src.t();
    C10_CUDA_CHECK(kernels::launch_transpose_f32(x.data_ptr<float>(), x.size(0), x.size(1),
                                                 x.stride(0), out.data_ptr<float>(), out.stride(0),
                                                 current_stream(t)));
  } else {
    out.copy_(src);
  }
  return col ? out.t() : out;
}

// Runs a plan: the copies it asks for, its workspace, the kernel.
void run_plan(kernels::GemmPlan& plan, const at::Tensor& c, const at::Tensor& a,
              const at::Tensor& b) {
  // The copies live until the kernel is enqueued: the allocator reuses their memory only after
  // work queued later on this stream.
  at::Tensor a_copy, b_copy;
  if (plan.copy_a.layout != kernels::CopyLayout::None) {
    a_copy = copied(a, plan.copy_a);
    plan.a.ptr = a_copy.data_ptr();
  }
  if (plan.copy_b.layout != kernels::CopyLayout::None) {
    b_copy = copied(b, plan.copy_b);
    plan.b.ptr = b_copy.data_ptr();
  }
  // A split's workspace (the wgmma tail's partial tiles and flags, or the SIMT / float64 split's
  // partial planes): from torch's allocator on the op's stream (a CUDA graph keeps it in its pool;
  // launch_gemm zeroes the tail's flags on the stream before each run).
  at::Tensor workspace;
  if (plan.workspace_bytes > 0)
    workspace = at::empty({plan.workspace_bytes}, c.options().dtype(at::kByte));
  C10_CUDA_CHECK(kernels::launch_gemm(plan, current_stream(c),
                                      workspace.defined() ? workspace.data_ptr() : nullptr));
}

// c <- alpha * a @ b + beta * c on the kernel the planner picks, after the copies it plans.
void run_gemm(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double alpha,
              double beta) {
  kernels::GemmPlan plan =
      kernels::plan_gemm(request(c, a, b, alpha, beta), kernels::current_gemm_device());
  run_plan(plan, c, a, b);
}

}  // namespace

bool run_fused_gemm(const at::Tensor& out, const at::Tensor& x2, const at::Tensor& w,
                    const FusedEpilogue& e) {
  const at::Tensor b = w.t();
  kernels::GemmRequest req = request(out, x2, b, 1.0, 0.0);
  kernels::GemmFusion& f = req.fusion;
  f.kind = e.gated ? kernels::GemmEpilogue::Gated : kernels::GemmEpilogue::BiasActivation;
  f.act = e.act;
  if (e.bias != nullptr) {
    if (e.bias->numel() > 1 && e.bias->stride(0) != 1) return false;
    f.bias = e.bias->data_ptr();
  }
  if (e.gated) {
    if (e.w2 == nullptr || e.w2->strides() != w.strides()) return false;
    f.b2 = e.w2->data_ptr();
  }
  if (e.z != nullptr) {
    // The kept products share one leading stride (the kernel's maps of them do).
    if (e.z->stride(1) != 1 || (e.z2 != nullptr && e.z2->strides() != e.z->strides())) return false;
    f.aux = e.z->data_ptr();
    f.aux2 = e.z2 != nullptr ? e.z2->data_ptr() : nullptr;
    f.ld_aux = e.z->stride(0);
  }
  kernels::GemmPlan plan = kernels::plan_gemm(req, kernels::current_gemm_device());
  if (!plan.fused) return false;
  run_plan(plan, out, x2, b);
  return true;
}

namespace {

void gemm_cuda(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double alpha,
               double beta) {
  check_gemm(c, a, b);
  check_gemm_memory(c, a, b);
  const c10::cuda::CUDAGuard guard(c.device());
  run_gemm(c, a, b, alpha, beta);
}

at::Tensor mm_cuda(const at::Tensor& a, const at::Tensor& b) {
  check_mm(a, b);
  const c10::cuda::CUDAGuard guard(a.device());
  at::Tensor out = at::empty({a.size(0), b.size(1)}, a.options());
  run_gemm(out, a, b, 1.0, 0.0);
  return out;
}

// ---- Meta

void gemm_meta(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double, double) {
  check_gemm(c, a, b);
}

at::Tensor mm_meta(const at::Tensor& a, const at::Tensor& b) {
  check_mm(a, b);
  return at::empty_symint({a.sym_size(0), b.sym_size(1)}, a.options());
}

// ---- Autograd

void gemm_autograd(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double alpha,
                   double beta) {
  check_no_grad("gemm", "mm", {{"c", &c}, {"a", &a}, {"b", &b}});
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    cuops::gemm(c, a, b, alpha, beta);
  }
  torch::autograd::impl::bump_version(c);
}

// An operand laid out column-major (a transposed row-major tensor, such as nn.Linear's weight.t()) gets
// its gradient column-major too, as torch.mm's backward does: AccumulateGrad copies a gradient whose
// strides differ from its parameter's, and a row-major grad of weight.t() made that a transposing
// float32 copy of every weight on every training step. Symbolic sizes
// compare with a guard, so a compiled graph keeps the layout it was traced with.
bool column_major(const at::Tensor& t) {
  return t.sym_stride(0) == 1 && t.sym_stride(1) == t.sym_size(0);
}

// grad_a = g @ b^T, grad_b = a^T @ g, through cuops::mm, which reads the transposed views in place; a
// column-major operand's gradient as the transpose of grad^T's row-major product.
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
    const at::Tensor &a = saved[0], &b = saved[1];
    if (ctx->needs_input_grad(0))
      grad_a = column_major(a) ? cuops::mm(b, g.t()).t() : cuops::mm(g, b.t());
    if (ctx->needs_input_grad(1))
      grad_b = column_major(b) ? cuops::mm(g.t(), a).t() : cuops::mm(a.t(), g);
    return {grad_a, grad_b};
  }
};

at::Tensor mm_autograd(const at::Tensor& a, const at::Tensor& b) { return MmFunction::apply(a, b); }

// Under CUDA autocast mm runs in the autocast dtype, like torch.mm.
at::Tensor mm_autocast(const at::Tensor& a, const at::Tensor& b) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  return cuops::mm(autocast_cuda(a), autocast_cuda(b));
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
