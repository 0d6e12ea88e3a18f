// The activations of the fused linear ops and their derivatives, in the accumulation type (float
// for float32 and the half types, double for float64): one home for the math that the GEMM
// epilogue (forward) and the activation's backward share. The formulas are torch's (gelu: erf;
// gelu_tanh: its tanh approximation; silu: x * sigmoid(x)), so results match F.gelu / F.silu to the
// rounding of their own float math.
#pragma once

#include <cuda_runtime.h>

#include "kernels/common.cuh"
#include "kernels/kernels.h"

namespace cuops::kernels::detail {

// tanh on the SFU (tanh.approx.f32: one instruction, absolute error <= ~5e-4 near 1).
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Phi(z) = 0.5 (1 + erf(z / sqrt 2)), the standard normal CDF, from e = exp(-z^2 / 2) (which gelu's
// derivative shares): erfc(a) = t P(t) e, t = 1 / (1 + p a), a = |z| / sqrt 2, the degree-5
// polynomial of Abramowitz and Stegun 7.1.26 (absolute error <= 1.5e-7), with the SFU's reciprocal.
// Branch-free, where erff takes one of two polynomials by |z| (a warp with both runs both).
__device__ __forceinline__ float normal_cdf_fast(float z, float e) {
  constexpr float kP = 0.3275911f, kA1 = 0.254829592f, kA2 = -0.284496736f, kA3 = 1.421413741f;
  constexpr float kA4 = -1.453152027f, kA5 = 1.061405429f, kSqrtHalf = 0.70710678118654752440f;
  const float t = __fdividef(1.f, fmaf(kP * kSqrtHalf, fabsf(z), 1.f));
  const float poly = t * fmaf(fmaf(fmaf(fmaf(kA5, t, kA4), t, kA3), t, kA2), t, kA1);
  const float half_erfc = 0.5f * poly * e;  // 0.5 erfc(|z| / sqrt 2)
  return z >= 0.f ? 1.f - half_erfc : half_erfc;
}

// The forward in float, as the fused GEMM epilogue (16-bit outputs) runs it over every output of a
// tile while the tensor cores wait: its cost adds to the product's time (kernels/gemm/epilogue.cuh), and
// the SFU, a quarter of the FMA rate, bounds it. gelu_tanh: 0.5 z (1 + tanh u) with the SFU's tanh,
// one SFU operation (tanhf took ~30 instructions: 128 x 256 tiles of 2048 x 5632 ran at 0.81 of
// the bare product); its error, <= 2.5e-4 of z, is below bf16's rounding and half fp16's. silu:
// z * sigmoid(z) by one exp2 and one approximate division (relative error ~1e-6; exp(-z)
// overflowing to inf gives the limit, -0). gelu: z Phi(z) by normal_cdf_fast (two SFU operations;
// with erff's two branches the epilogue cost 0.20-0.29x of the bare 2048-8192 x 3072 x 768 product
// more than gelu_tanh's).
__device__ __forceinline__ float act_forward_fast(Activation act, float z) {
  constexpr float kBeta = 0.79788456080286535588f, kKappa = 0.044715f;
  switch (act) {
    case Activation::None:
      return z;
    case Activation::Relu:
      return z > 0.f ? z : 0.f;
    case Activation::Gelu:
      return z * normal_cdf_fast(z, __expf(-0.5f * z * z));
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

// The derivative in float for the half types' backward (dz rounded to 8 or 11 bits): the SFU's
// exp and reciprocal in place of expf, tanhf and erff (relative error ~1e-6): gelu's derivative
// Phi(z) + z phi(z) shares phi's exponential with Phi (normal_cdf_fast); tanh u = 1 - 2 / (1 +
// e^{2u}) (the limits at overflow). float32 and float64 take act_derivative: torch's float math.
__device__ __forceinline__ float act_derivative_fast(Activation act, float z) {
  constexpr float kBeta = 0.79788456080286535588f, kKappa = 0.044715f;
  constexpr float kInvSqrt2Pi = 0.39894228040143267794f;
  switch (act) {
    case Activation::Gelu: {
      const float e = __expf(-0.5f * z * z);
      return fmaf(z * kInvSqrt2Pi, e, normal_cdf_fast(z, e));
    }
    case Activation::GeluTanh: {
      const float z2 = z * z, u = z * fmaf(kBeta * kKappa, z2, kBeta);
      const float t = 1.f - __fdividef(2.f, 1.f + __expf(2.f * u));
      return 0.5f * (1.f + t) + 0.5f * z * (1.f - t * t) * kBeta * fmaf(3.f * kKappa, z2, 1.f);
    }
    case Activation::Silu: {
      const float s = __fdividef(1.f, 1.f + __expf(-z));
      return s * fmaf(z, 1.f - s, 1.f);
    }
    default:
      return act_derivative(act, z);
  }
}

// The backward's derivative for elements of type T, in T's accumulation type.
template <typename T>
__device__ __forceinline__ acc_t<T> act_derivative_for(Activation act, acc_t<T> z) {
  if constexpr (is_half_type<T>) {
    return act_derivative_fast(act, z);
  } else {
    return act_derivative(act, z);
  }
}

}  // namespace cuops::kernels::detail
