// Helpers shared by the ops/ files: the current stream of a tensor's device, and the headers they all use.
#pragma once

#include <ATen/ATen.h>
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

}  // namespace cuops::ops
