// The activations of the fused linear ops and their derivatives, in the accumulation type (float
// for float32 and the half types, double for float64): one home for the math that the GEMM
// epilogue (forward) and the activation's backward share. The formulas are torch's (gelu: erf;
// gelu_tanh: its tanh approximation; silu: x * sigmoid(x)), so results match F.gelu / F.silu to the
// rounding of their own float math.
#pragma once

#include <cuda_runtime.h>

#include "kernels.h"

namespace cuops::kernels::detail {

// tanh on the SFU (tanh.approx.f32: one instruction, absolute error <= ~5e-4 near 1).
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The forward in float, as the fused GEMM epilogue (16-bit outputs) runs it over every output of a
// tile while the tensor cores wait: its cost adds to the product's time (kernels/epilogue.cuh), and
// the SFU, a quarter of the FMA rate, bounds it. gelu_tanh: 0.5 z (1 + tanh u) with the SFU's tanh,
// one SFU operation (tanhf took ~30 instructions: 128 x 256 tiles of 2048 x 5632 ran at 0.81 of
// the bare product); its error, <= 2.5e-4 of z, is below bf16's rounding and half fp16's. silu:
// z * sigmoid(z) by one exp2 and one approximate division (relative error ~1e-6; exp(-z)
// overflowing to inf gives the limit, -0). gelu keeps erff.
__device__ __forceinline__ float act_forward_fast(Activation act, float z) {
  constexpr float kSqrtHalf = 0.70710678118654752440f, kBeta = 0.79788456080286535588f;
  constexpr float kKappa = 0.044715f;
  switch (act) {
    case Activation::None:
      return z;
    case Activation::Relu:
      return z > 0.f ? z : 0.f;
    case Activation::Gelu:
      return 0.5f * z * (1.f + erff(z * kSqrtHalf));
    case Activation::GeluTanh: {
      const float h = 0.5f * z;  // 0.5 z (1 + tanh u), u = z (beta + beta kappa z^2): 5 FP32 ops
      return fmaf(h, tanh_approx(z * fmaf(kBeta * kKappa, z * z, kBeta)), h);
    }
    case Activation::Silu:
      return __fdividef(z, 1.f + __expf(-z));
  }
  return z;
}

template <typename A> __device__ __forceinline__ A act_forward(Activation act, A z) {
  constexpr A kSqrtHalf = A(0.70710678118654752440), kBeta = A(0.79788456080286535588);
  constexpr A kKappa = A(0.044715);
  switch (act) {
    case Activation::None:
      return z;
    case Activation::Relu:
      return z > A(0) ? z : A(0);
    case Activation::Gelu:
      return A(0.5) * z * (A(1) + erf(z * kSqrtHalf));
    case Activation::GeluTanh:
      return A(0.5) * z * (A(1) + tanh(kBeta * (z + kKappa * z * z * z)));
    case Activation::Silu:
      return z / (A(1) + exp(-z));
  }
  return z;
}

// d act(z) / dz.
template <typename A> __device__ __forceinline__ A act_derivative(Activation act, A z) {
  constexpr A kSqrtHalf = A(0.70710678118654752440), kBeta = A(0.79788456080286535588);
  constexpr A kKappa = A(0.044715), kInvSqrt2Pi = A(0.39894228040143267794);
  switch (act) {
    case Activation::None:
      return A(1);
    case Activation::Relu:
      return z > A(0) ? A(1) : A(0);
    case Activation::Gelu:
      return A(0.5) * (A(1) + erf(z * kSqrtHalf)) + z * kInvSqrt2Pi * exp(A(-0.5) * z * z);
    case Activation::GeluTanh: {
      const A t = tanh(kBeta * (z + kKappa * z * z * z));
      return A(0.5) * (A(1) + t) +
             A(0.5) * z * (A(1) - t * t) * kBeta * (A(1) + A(3) * kKappa * z * z);
    }
    case Activation::Silu: {
      const A s = A(1) / (A(1) + exp(-z));
      return s * (A(1) + z * (A(1) - s));
    }
  }
  return A(1);
}

}  // namespace cuops::kernels::detail
