// A mixture of experts' weighted sum back to token order (ops/moe.cpp's combine): out[t] = the sum
// over the slots j, in slot order, of w[t k + j] * y[rows[t k + j]], in the accumulation type
// (float32; float64 for float64), rounded once to y's type; w null: weights of 1 (dx's sum). One
// pass reading each token's k rows and writing its output row, where index_select, a float32 cast,
// the multiply and the sum wrote and read [T, k, H] in float32 three times. A block a token, each
// thread a 16-byte vector a step where the rows allow (else one element): the same bits every run.
// With k = 1, weights of 1 and a negative row for "none" it is also the layout's gather (x's rows
// into the expert order, zeros on the spare rows): one pass, where zeros + index_put took 0.6 ms
// a layer's [82k, 2048] bf16 rows on the H200 (docs/performance.md, "Mixture of experts").
#include <type_traits>

#include "kernels/common.cuh"
#include "kernels/kernels.h"

namespace cuops::kernels {
using namespace detail;
namespace {

constexpr int kCombineThreads = 256;

// R: the rows' index type (int32 from the decode routing, int64 from the layout); W: the weights'
// type (the accumulation type, or y's own: a bf16 router's weights need no cast pass first).
template <typename T, typename R, typename W, int V>
__global__ void __launch_bounds__(kCombineThreads)
    moe_combine(const T* y, int64_t ldy, const R* rows, const W* w, int64_t k, int64_t h, T* out) {
  using A = acc_t<T>;
  const int64_t t = blockIdx.x;
  for (int64_t c = int64_t{threadIdx.x} * V; c < h; c += int64_t{kCombineThreads} * V) {
    A sum[V] = {};
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = static_cast<int64_t>(rows[t * k + j]);
      if (r < 0) continue;  // no row: gather_rows' spare layout rows, decode's pairs of no expert
      const A wj = w != nullptr ? static_cast<A>(to_acc(w[t * k + j])) : A(1);
      A v[V];
      load_elems<T, V>(y + r * ldy + c, v);
#pragma unroll
      for (int i = 0; i < V; ++i) sum[i] += wj * v[i];
    }
    store_elems<T, V>(out + t * h + c, sum);
  }
}

}  // namespace

cudaError_t launch_moe_combine(DType dtype, const void* y, int64_t ldy, const void* rows,
                               bool rows64, const void* w, bool w_acc, int64_t tokens, int64_t k,
                               int64_t h, void* out, cudaStream_t stream) {
  if (tokens < 0 || k < 0 || h < 0 || tokens > INT32_MAX) return cudaErrorInvalidValue;
  if (tokens == 0 || h == 0) return cudaSuccess;
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kV = 16 / sizeof(T);
    const bool wide = h % kV == 0 && ldy % kV == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(out) % 16 == 0;
    const auto* yt = static_cast<const T*>(y);
    auto* ot = static_cast<T*>(out);
    const dim3 grid(static_cast<unsigned>(tokens));
    auto go = [&](auto* r, auto* wt) {
      using R = std::remove_const_t<std::remove_pointer_t<decltype(r)>>;
      using W = std::remove_const_t<std::remove_pointer_t<decltype(wt)>>;
      if (wide)
        moe_combine<T, R, W, kV><<<grid, kCombineThreads, 0, stream>>>(yt, ldy, r, wt, k, h, ot);
      else
        moe_combine<T, R, W, 1><<<grid, kCombineThreads, 0, stream>>>(yt, ldy, r, wt, k, h, ot);
    };
    auto with_rows = [&](auto* wt) {
      if (rows64)
        go(static_cast<const int64_t*>(rows), wt);
      else
        go(static_cast<const int32_t*>(rows), wt);
    };
    if (w_acc || w == nullptr)
      with_rows(static_cast<const acc_t<T>*>(w));
    else
      with_rows(static_cast<const T*>(w));
    return cudaGetLastError();
  });
}

}  // namespace cuops::kernels
