// add2, vector_add, scale, square: checks, CPU reference, CUDA host wrappers, Meta, Autograd.
#include "ops/common.h"

#include <torch/csrc/autograd/variable.h>

namespace cuops::ops {
namespace {

void check_add2(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b) {
  check_dtypes_and_devices("add2", {{"c", &c}, {"a", &a}, {"b", &b}});
  check_same_shape("add2", {{"c", &c}, {"a", &a}, {"b", &b}});
}

void check_add2_memory(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b) {
  check_output_not_self_overlapping("add2", "c", c);
  check_output_overlap("add2", "c", c, "a", a, /*allow_same=*/true);
  check_output_overlap("add2", "c", c, "b", b, /*allow_same=*/true);
}

void check_binary(const char* op, const at::Tensor& a, const at::Tensor& b) {
  check_dtypes_and_devices(op, {{"a", &a}, {"b", &b}});
  check_same_shape(op, {{"a", &a}, {"b", &b}});
}

void check_unary(const char* op, const at::Tensor& x) { check_dtypes_and_devices(op, {{"x", &x}}); }

// ---- CPU: the reference path (ATen computes half types in float and rounds once, like the kernels).

void add2_cpu(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b) {
  check_add2(c, a, b);
  check_add2_memory(c, a, b);
  at::add_out(const_cast<at::Tensor&>(c), a, b);
}

at::Tensor vector_add_cpu(const at::Tensor& a, const at::Tensor& b) {
  check_binary("vector_add", a, b);
  at::Tensor out = at::empty(a.sizes(), a.options());
  at::add_out(out, a, b);
  return out;
}

at::Tensor scale_cpu(const at::Tensor& x, double alpha) {
  check_unary("scale", x);
  at::Tensor out = at::empty(x.sizes(), x.options());
  at::mul_out(out, x, c10::Scalar(alpha));
  return out;
}

at::Tensor square_cpu(const at::Tensor& x) {
  check_unary("square", x);
  at::Tensor out = at::empty(x.sizes(), x.options());
  at::mul_out(out, x, x);
  return out;
}

// ---- CUDA

// Runs launch(out_ptr, in_ptrs..., n) over flat memory: directly when out and inputs share a dense
// layout, else on contiguous copies of the inputs into a contiguous result copied back into out.
template <typename Launch>
void run_flat(const at::Tensor& out, std::initializer_list<at::Tensor> inputs, Launch launch) {
  if (out.numel() == 0) return;
  std::vector<const at::Tensor*> all{&out};
  for (const at::Tensor& t : inputs) all.push_back(&t);
  bool direct = out.is_non_overlapping_and_dense();
  for (const at::Tensor* t : all)
    direct = direct && t->strides().equals(out.strides()) && t->is_non_overlapping_and_dense();
  std::vector<at::Tensor> ins;
  if (direct) {
    ins.assign(inputs.begin(), inputs.end());
    launch(out, ins);
    return;
  }
  for (const at::Tensor& t : inputs) ins.push_back(t.contiguous());
  if (out.is_contiguous()) {
    launch(out, ins);
  } else {
    at::Tensor tmp = at::empty(out.sizes(), out.options());
    launch(tmp, ins);
    const_cast<at::Tensor&>(out).copy_(tmp);
  }
}

void add2_cuda(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b) {
  check_add2(c, a, b);
  check_add2_memory(c, a, b);
  const c10::cuda::CUDAGuard guard(c.device());
  run_flat(c, {a, b}, [&](const at::Tensor& out, const std::vector<at::Tensor>& in) {
    C10_CUDA_CHECK(kernels::launch_add(kernel_dtype(out.scalar_type()), out.data_ptr(),
                                       in[0].data_ptr(), in[1].data_ptr(), out.numel(),
                                       current_stream(out)));
  });
}

at::Tensor vector_add_cuda(const at::Tensor& a, const at::Tensor& b) {
  check_binary("vector_add", a, b);
  const c10::cuda::CUDAGuard guard(a.device());
  at::Tensor out = at::empty(a.sizes(), a.options());
  run_flat(out, {a, b}, [&](const at::Tensor& o, const std::vector<at::Tensor>& in) {
    C10_CUDA_CHECK(kernels::launch_add(kernel_dtype(o.scalar_type()), o.data_ptr(),
                                       in[0].data_ptr(), in[1].data_ptr(), o.numel(),
                                       current_stream(o)));
  });
  return out;
}

at::Tensor scale_cuda(const at::Tensor& x, double alpha) {
  check_unary("scale", x);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty(x.sizes(), x.options());
  run_flat(out, {x}, [&](const at::Tensor& o, const std::vector<at::Tensor>& in) {
    C10_CUDA_CHECK(kernels::launch_scale(kernel_dtype(o.scalar_type()), o.data_ptr(),
                                         in[0].data_ptr(), alpha, o.numel(), current_stream(o)));
  });
  return out;
}

at::Tensor square_cuda(const at::Tensor& x) {
  check_unary("square", x);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty(x.sizes(), x.options());
  run_flat(out, {x}, [&](const at::Tensor& o, const std::vector<at::Tensor>& in) {
    C10_CUDA_CHECK(kernels::launch_square(kernel_dtype(o.scalar_type()), o.data_ptr(),
                                          in[0].data_ptr(), o.numel(), current_stream(o)));
  });
  return out;
}

// ---- Meta: checks and output shapes only (symbolic sizes trace under dynamic shapes).

void add2_meta(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b) {
  check_add2(c, a, b);
}

at::Tensor vector_add_meta(const at::Tensor& a, const at::Tensor& b) {
  check_binary("vector_add", a, b);
  return at::empty_symint(a.sym_sizes(), a.options());
}

at::Tensor scale_meta(const at::Tensor& x, double) {
  check_unary("scale", x);
  return at::empty_symint(x.sym_sizes(), x.options());
}

at::Tensor square_meta(const at::Tensor& x) {
  check_unary("square", x);
  return at::empty_symint(x.sym_sizes(), x.options());
}

// ---- Autograd: forward redispatches below autograd; backward is written in cuops ops so it traces.

void add2_autograd(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b) {
  check_no_grad("add2", "vector_add", {{"c", &c}, {"a", &a}, {"b", &b}});
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    cuops::add2(c, a, b);
  }
  torch::autograd::impl::bump_version(c);
}

class VectorAddFunction : public torch::autograd::Function<VectorAddFunction> {
 public:
  static at::Tensor forward(AutogradContext*, const at::Tensor& a, const at::Tensor& b) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return cuops::vector_add(a, b);
  }
  static variable_list backward(AutogradContext*, variable_list grads) {
    return {grads[0], grads[0]};
  }
};

class ScaleFunction : public torch::autograd::Function<ScaleFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, double alpha) {
    ctx->saved_data["alpha"] = alpha;
    at::AutoDispatchBelowADInplaceOrView guard;
    return cuops::scale(x, alpha);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {cuops::scale(grads[0], ctx->saved_data["alpha"].toDouble()), at::Tensor()};
  }
};

class SquareFunction : public torch::autograd::Function<SquareFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    ctx->save_for_backward({x});
    at::AutoDispatchBelowADInplaceOrView guard;
    return cuops::square(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    return {cuops::scale(grads[0] * x, 2.0)};
  }
};

at::Tensor vector_add_autograd(const at::Tensor& a, const at::Tensor& b) {
  return VectorAddFunction::apply(a, b);
}
at::Tensor scale_autograd(const at::Tensor& x, double alpha) {
  return ScaleFunction::apply(x, alpha);
}
at::Tensor square_autograd(const at::Tensor& x) { return SquareFunction::apply(x); }

}  // namespace

TORCH_LIBRARY_IMPL(cuops, CPU, m) {
  m.impl("add2", &add2_cpu);
  m.impl("vector_add", &vector_add_cpu);
  m.impl("scale", &scale_cpu);
  m.impl("square", &square_cpu);
}

TORCH_LIBRARY_IMPL(cuops, CUDA, m) {
  m.impl("add2", &add2_cuda);
  m.impl("vector_add", &vector_add_cuda);
  m.impl("scale", &scale_cuda);
  m.impl("square", &square_cuda);
}

TORCH_LIBRARY_IMPL(cuops, Meta, m) {
  m.impl("add2", &add2_meta);
  m.impl("vector_add", &vector_add_meta);
  m.impl("scale", &scale_meta);
  m.impl("square", &square_meta);
}

TORCH_LIBRARY_IMPL(cuops, Autograd, m) {
  m.impl("add2", &add2_autograd);
  m.impl("vector_add", &vector_add_autograd);
  m.impl("scale", &scale_autograd);
  m.impl("square", &square_autograd);
}

}  // namespace cuops::ops
