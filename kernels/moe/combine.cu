// A mixture of experts' weighted sum back to token order (ops/moe.cpp's combine): out[t] = the sum
// over the slots j, in slot order, of w[t k + j] * y[rows[t k + j]], in the accumulation type
// (float32; float64 for float64), rounded once to y's type; w null: weights of 1 (dx's sum). One
// pass reading each token's k rows and writing its output row, where index_select, a float32 cast,
// the multiply and the sum wrote and read [T, k, H] in float32 three times. A block a token, each
// thread a 16-byte vector a step where the rows allow (else one element): the same bits every run.
#include "kernels/common.cuh"
#include "kernels/kernels.h"

namespace cuops::kernels {
using namespace detail;
namespace {

constexpr int kCombineThreads = 256;

// V elements of p (16 bytes where V > 1: the half types as packed pairs) into the accumulation type.
template <typename T, int V>
__device__ __forceinline__ void load_acc(const T* p, acc_t<T> (&a)[V]) {
  if constexpr (V == 1) {
    a[0] = to_acc(p[0]);
  } else if constexpr (is_half_type<T>) {
    const Vec<T, V> v = *reinterpret_cast<const Vec<T, V>*>(p);
#pragma unroll
    for (int i = 0; i < V / 2; ++i) {
      const float2 f = unpack_pair(v.w[i], T{});
      a[2 * i] = f.x, a[2 * i + 1] = f.y;
    }
  } else {
    const Vec<T, V> v = *reinterpret_cast<const Vec<T, V>*>(p);
#pragma unroll
    for (int i = 0; i < V; ++i) a[i] = v.v[i];
  }
}

template <typename T, int V>
__device__ __forceinline__ void store_acc(T* p, const acc_t<T> (&a)[V]) {
  if constexpr (V == 1) {
    p[0] = from_acc<T>(a[0]);
  } else if constexpr (is_half_type<T>) {
    Vec<T, V> v;
#pragma unroll
    for (int i = 0; i < V / 2; ++i) v.w[i] = pack_pair(a[2 * i], a[2 * i + 1], T{});
    *reinterpret_cast<Vec<T, V>*>(p) = v;
  } else {
    Vec<T, V> v;
#pragma unroll
    for (int i = 0; i < V; ++i) v.v[i] = a[i];
    *reinterpret_cast<Vec<T, V>*>(p) = v;
  }
}

template <typename T, int V> __global__ void __launch_bounds__(kCombineThreads)
    moe_combine(const T* y, int64_t ldy, const int64_t* rows, const acc_t<T>* w, int64_t k,
                int64_t h, T* out) {
  using A = acc_t<T>;
  const int64_t t = blockIdx.x;
  for (int64_t c = int64_t{threadIdx.x} * V; c < h; c += int64_t{kCombineThreads} * V) {
    A sum[V] = {};
    for (int64_t j = 0; j < k; ++j) {
      const A wj = w != nullptr ? w[t * k + j] : A(1);
      A v[V];
      load_acc<T, V>(y + rows[t * k + j] * ldy + c, v);
#pragma unroll
      for (int i = 0; i < V; ++i) sum[i] += wj * v[i];
    }
    store_acc<T, V>(out + t * h + c, sum);
  }
}

}  // namespace

cudaError_t launch_moe_combine(DType dtype, const void* y, int64_t ldy, const int64_t* rows,
                               const void* w, int64_t tokens, int64_t k, int64_t h, void* out,
                               cudaStream_t stream) {
  if (tokens < 0 || k < 0 || h < 0 || tokens > INT32_MAX) return cudaErrorInvalidValue;
  if (tokens == 0 || h == 0) return cudaSuccess;
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kV = 16 / sizeof(T);
    const bool wide = h % kV == 0 && ldy % kV == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(out) % 16 == 0;
    const auto* yt = static_cast<const T*>(y);
    const auto* wt = static_cast<const acc_t<T>*>(w);
    auto* ot = static_cast<T*>(out);
    const dim3 grid(static_cast<unsigned>(tokens));
    if (wide)
      moe_combine<T, kV><<<grid, kCombineThreads, 0, stream>>>(yt, ldy, rows, wt, k, h, ot);
    else
      moe_combine<T, 1><<<grid, kCombineThreads, 0, stream>>>(yt, ldy, rows, wt, k, h, ot);
    return cudaGetLastError();
  });
}

}  // namespace cuops::kernels
