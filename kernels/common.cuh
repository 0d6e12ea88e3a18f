// Shared device helpers: dtype traits, conversions, dtype dispatch with an erroring default.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

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

// Elements 2i and 2i+1 as one packed pair. memcpy, not a pointer cast: a cast of a register array's
// address pushed the whole array to local memory (160-byte stack frame in the bf16 norm).
template <typename T2, typename T, int V> __device__ __forceinline__ T2 pair_at(const Vec<T, V>& x, int i) {
  T2 p;
  __builtin_memcpy(&p, &x.v[2 * i], sizeof(T2));
  return p;
}

// Applies f (acc_t<T> x, acc_t<T> y) -> acc_t<T> to each element of two vectors. The half types go
// two at a time through the packed conversions (one instruction per pair each way, where scalar
// conversions plus repacking cost enough to fall a few percent behind the memory bus); the rounding
// is the same correctly-rounded float -> half conversion either way.
template <typename T, int V, typename F>
__device__ __forceinline__ Vec<T, V> map_vec(const Vec<T, V>& x, const Vec<T, V>& y, F f) {
  Vec<T, V> r;
  if constexpr ((std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) && V % 2 == 0) {
    using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
#pragma unroll
    for (int i = 0; i < V / 2; ++i) {
      const T2 x2 = pair_at<T2>(x, i), y2 = pair_at<T2>(y, i);
      T2 r2;
      if constexpr (std::is_same_v<T, __half>) {
        const float2 a = __half22float2(x2), b = __half22float2(y2);
        r2 = __floats2half2_rn(f(a.x, b.x), f(a.y, b.y));
      } else {
        const float2 a = __bfloat1622float2(x2), b = __bfloat1622float2(y2);
        r2 = __floats2bfloat162_rn(f(a.x, b.x), f(a.y, b.y));
      }
      __builtin_memcpy(&r.v[2 * i], &r2, sizeof(T2));
    }
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) r.v[i] = from_acc<T>(f(to_acc(x.v[i]), to_acc(y.v[i])));
  }
  return r;
}

// Sum over the elements of two vectors of g(x, y), in acc_t<T> (one 16-byte vector's worth only,
// so float loses nothing measurable), returned as A for the caller's longer running sum; the half
// types go in pairs.
template <typename A, typename T, int V, typename G>
__device__ __forceinline__ A sum_vec(const Vec<T, V>& x, const Vec<T, V>& y, G g) {
  acc_t<T> s = 0;
  if constexpr ((std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) && V % 2 == 0) {
    using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
#pragma unroll
    for (int i = 0; i < V / 2; ++i) {
      const T2 x2 = pair_at<T2>(x, i), y2 = pair_at<T2>(y, i);
      float2 a, b;
      if constexpr (std::is_same_v<T, __half>) {
        a = __half22float2(x2);
        b = __half22float2(y2);
      } else {
        a = __bfloat1622float2(x2);
        b = __bfloat1622float2(y2);
      }
      s += g(a.x, b.x) + g(a.y, b.y);
    }
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) s += g(to_acc(x.v[i]), to_acc(y.v[i]));
  }
  return static_cast<A>(s);
}

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
