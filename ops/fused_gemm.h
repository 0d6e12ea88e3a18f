// The fused GEMM epilogues as the ops use them (kernels/gemm/gemm_plan.h's GemmFusion on torch tensors):
// one entry, in ops/gemm.cpp beside the plain product's, so the plan, the workspace and the launch
// are made one way for every op.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/string_view.h>

#include "kernels/kernels.h"

namespace cuops::ops {

// What follows x2 @ w^T: bias and activation (linear; z: the pre-activation kept), or the gated
// product act(x2 @ w^T) * (x2 @ w2^T) (swiglu, act its gate; z and z2: the two products kept).
// Null: none.
struct FusedEpilogue {
  bool gated = false;
  const at::Tensor* w2 = nullptr;
  const at::Tensor* bias = nullptr;
  kernels::Activation act = kernels::Activation::None;
  const at::Tensor* z = nullptr;
  const at::Tensor* z2 = nullptr;
};

// The activation named `name` (none, relu, gelu, gelu_tanh, silu), or RuntimeError naming op (the
// ops that take one: linear, lora_linear).
kernels::Activation parse_act(const char* op, c10::string_view name);
// The gated MLP's gate named `name` (silu, gelu_tanh: epilogue.cuh's Gated), or RuntimeError naming
// op (swiglu, lora_swiglu and their pieces).
kernels::Activation parse_gate(const char* op, c10::string_view name);
// act(g) for a gate of parse_gate's, torch's: F.silu, F.gelu(approximate="tanh") (HF's
// gelu_pytorch_tanh); the CPU references and the paths that run the epilogue apart.
at::Tensor gate_of(const at::Tensor& g, kernels::Activation act);

// out [rows, n] (and the kept products, [rows, n] each) from x2 [rows, k] and w [n, k] (w2 the same
// shape and strides), all of out's dtype and device, under the caller's device guard, on the
// current stream. False, with nothing enqueued, where the planner does not fuse this product
// (kernels/gemm/gemm_plan.cpp, FusedEpilogueApart): the caller runs it apart.
bool run_fused_gemm(const at::Tensor& out, const at::Tensor& x2, const at::Tensor& w,
                    const FusedEpilogue& e);

}  // namespace cuops::ops
