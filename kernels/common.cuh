// Shared device helpers: dtype traits, conversions, dtype dispatch with an erroring default.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuops/kernels/kernels.h"

namespace cuops::kernels::detail {

// Accumulation type: half types compute in float, float in float, double in double.
template <typename T> struct AccType { using type = float; };
template <> struct AccType<double> { using type = double; };
template <typename T> using acc_t = typename AccType<T>::type;

template <typename T> __device__ __forceinline__ acc_t<T> to_acc(T x) { return static_cast<acc_t<T>>(x); }
template <typename T> __device__ __forceinline__ T from_acc(acc_t<T> x) { return static_cast<T>(x); }
template <> __device__ __forceinline__ __half from_acc<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// 16 bytes of T, the widest single global load/store.
template <typename T, int V> struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

inline bool aligned_like(const void* p, const void* q, uintptr_t to) {
  return (reinterpret_cast<uintptr_t>(p) % to) == (reinterpret_cast<uintptr_t>(q) % to);
}

// Calls f(T{}) for the C++ element type of dtype; unknown dtypes are an error, never a guess.
template <typename F> cudaError_t dispatch_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::Float32: return f(float{});
    case DType::Float64: return f(double{});
    case DType::Float16: return f(__half{});
    case DType::BFloat16: return f(__nv_bfloat16{});
  }
  return cudaErrorInvalidValue;
}

inline unsigned int blocks_for(int64_t work, int64_t per_block) {
  return static_cast<unsigned int>((work + per_block - 1) / per_block);
}

}  // namespace cuops::kernels::detail
