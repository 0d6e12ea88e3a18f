// The activations of the fused linear ops and their derivatives, in the accumulation type (float
// for float32 and the half types, double for float64): one home for the math that the GEMM
// epilogue (forward) and the activation's backward share. The formulas are torch's (gelu: erf;
// gelu_tanh: its tanh approximation; silu: x * sigmoid(x)), so results match F.gelu / F.silu to the
// rounding of their own float math.
#pragma once

#include <cuda_runtime.h>

#include "kernels.h"

namespace cuops::kernels::detail {

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
