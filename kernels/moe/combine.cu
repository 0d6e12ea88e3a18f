// A mixture of experts' weighted sum back to token order (ops/moe.cpp's combine): out[t] = the sum
// over the slots j, in slot order, of w[t k + j] * y[rows[t k + j]], in the accumulation type
// (float32; float64 for float64), rounded once to y's type; w null: weights of 1 (dx's sum). One
// pass reading each token's k rows and writing its output row, where index_select, a float32 cast,
// the multiply and the sum wrote and read [T, k, H] in float32 three times. A block a token, each
// thread a 16-byte vector a step where the rows allow (else one element): the same bits every run.
// With k = 1, weights of 1 and a negative row for "none" it is also the layout's gather (x's rows
// into the expert order, zeros on the spare rows): one pass, where zeros + index_put took 0.6 ms
// a layer's [82k, 2048] bf16 rows on the H200 (docs/performance.md, "Mixture of experts").
#include "kernels/common.cuh"
#include "kernels/kernels.h"

namespace cuops::kernels {
using namespace detail;
namespace {

constexpr int kCombineThreads = 256;

template <typename T, int V> __global__ void __launch_bounds__(kCombineThreads)
    moe_combine(const T* y, int64_t ldy, const int64_t* rows, const acc_t<T>* w, int64_t k,
                int64_t h, T* out) {
  using A = acc_t<T>;
  const int64_t t = blockIdx.x;
  for (int64_t c = int64_t{threadIdx.x} * V; c < h; c += int64_t{kCombineThreads} * V) {
    A sum[V] = {};
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = rows[t * k + j];
      if (r < 0) continue;  // no row: gather_rows' spare layout rows
      const A wj = w != nullptr ? w[t * k + j] : A(1);
      A v[V];
      load_elems<T, V>(y + r * ldy + c, v);
#pragma unroll
      for (int i = 0; i < V; ++i) sum[i] += wj * v[i];
    }
    store_elems<T, V>(out + t * h + c, sum);
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
