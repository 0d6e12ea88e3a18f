// Helpers shared by the ops/ files: the current stream of a tensor's device, and the headers they all use.
#pragma once

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "cuops/cuops.h"
#include "ops/checks.h"

namespace cuops::ops {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

inline cudaStream_t current_stream(const at::Tensor& t) {
  return at::cuda::getCurrentCUDAStream(t.get_device()).stream();
}

// x [..., K] as [rows, K] (rows: the product of the leading dims; a reshape with -1 cannot size an
// empty x): the fused linear ops flatten their input's leading dims so.
inline at::Tensor as_rows(const at::Tensor& x) {
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) rows *= x.size(d);
  return x.reshape({rows, x.size(-1)});
}

// t2 [rows, N] viewed as x's leading dims by N.
inline at::Tensor like_rows_of(const at::Tensor& t2, const at::Tensor& x, int64_t n) {
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = n;
  return t2.view(shape);
}

// The accumulation type of t's dtype: float32 for float16 and bfloat16 (their products, sums and
// activations run in it and are rounded once), else the dtype itself.
inline at::ScalarType acc_type(const at::Tensor& t) {
  const auto d = t.scalar_type();
  return d == at::kHalf || d == at::kBFloat16 ? at::kFloat : d;
}

// Under CUDA autocast the product ops (mm, linear, swiglu, linear_cross_entropy) cast their floating
// tensors as torch.mm and F.linear do: to the autocast dtype, a float32 master weight through
// autocast's cache (one cast a step, not one a call).
inline at::Tensor autocast_cuda(const at::Tensor& t) {
  return at::autocast::cached_cast(at::autocast::get_autocast_dtype(at::kCUDA), t,
                                   c10::DeviceType::CUDA);
}
inline std::optional<at::Tensor> autocast_cuda(const std::optional<at::Tensor>& t) {
  return t.has_value() ? std::optional<at::Tensor>(autocast_cuda(*t)) : std::nullopt;
}

}  // namespace cuops::ops
