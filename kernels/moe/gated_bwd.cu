// The MoE experts' backward between its grouped products (ops/moe.cpp's experts_bwd): from the
// forward's [g | u] and h's gradient before the routing weight, the gate/up gradient, the down
// weight's gradient operand h * w and the routing weight's gradient, in one pass over the layout's
// rows. In torch ops the same step was ~15 elementwise kernels (strided float32 casts of g and u,
// silu and its backward, a cat, the row sum) and took ~3.5 ms a step of Qwen3-30B-A3B's four layers
// on the H200 (docs/performance.md, "Mixture of experts"). A block a row, each thread a 16-byte
// vector of columns a step where the rows allow (else one element); the row sum adds each thread's
// partial, then the warps', in a fixed order: the same bits every run.
#include <algorithm>

#include "kernels/common.cuh"
#include "kernels/gemm/activation.cuh"
#include "kernels/kernels.h"

namespace cuops::kernels {
using namespace detail;
namespace {

constexpr int kMaxThreads = 256;

template <typename T, int V> __global__ void __launch_bounds__(kMaxThreads)
    moe_gated_bwd(const T* gu, const T* dh1, const acc_t<T>* wr, Activation act, int64_t inter,
                  T* dgu, T* hw, acc_t<T>* dwr) {
  using A = acc_t<T>;
  const int64_t r = blockIdx.x;
  const T* g = gu + r * 2 * inter;
  const T* u = g + inter;
  const A w = wr[r];
  A part = A(0);
  for (int64_t c = int64_t{threadIdx.x} * V; c < inter; c += int64_t{blockDim.x} * V) {
    A vg[V], vu[V], vd[V] = {}, out_h[V], out_g[V], out_u[V];
    load_elems<T, V>(g + c, vg);
    load_elems<T, V>(u + c, vu);
    if (dh1 != nullptr) load_elems<T, V>(dh1 + r * inter + c, vd);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const A a = act_forward(act, vg[i]);
      const A h = to_acc(from_acc<T>(a * vu[i]));  // h as the forward stored it
      out_h[i] = h * w;
      part += vd[i] * h;
      const A dh = vd[i] * w;
      out_g[i] = dh * vu[i] * act_derivative_for<T>(act, vg[i]);
      out_u[i] = dh * a;
    }
    if (hw != nullptr) store_elems<T, V>(hw + r * inter + c, out_h);
    if (dgu != nullptr) {
      store_elems<T, V>(dgu + r * 2 * inter + c, out_g);
      store_elems<T, V>(dgu + r * 2 * inter + inter + c, out_u);
    }
  }
  if (dwr == nullptr) return;
  for (int off = 16; off >= 1; off /= 2) part += __shfl_xor_sync(0xffffffffu, part, off);
  __shared__ A warp_sum[kMaxThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sum[threadIdx.x / 32] = part;
  __syncthreads();
  if (threadIdx.x == 0) {
    A total = A(0);
    for (unsigned i = 0; i < blockDim.x / 32; ++i) total += warp_sum[i];
    dwr[r] = total;
  }
}

}  // namespace

cudaError_t launch_moe_gated_bwd(DType dtype, Activation act, const void* gu, const void* dh1,
                                 const void* wr, int64_t rows, int64_t inter, void* dgu, void* hw,
                                 void* dwr, cudaStream_t stream) {
  if (rows < 0 || inter < 0 || rows > INT32_MAX ||
      (act != Activation::Silu && act != Activation::GeluTanh))
    return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (dh1 == nullptr) dgu = nullptr, dwr = nullptr;
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    constexpr int kV = 16 / sizeof(T);
    const auto fits = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    const bool wide = inter % kV == 0 && fits(gu) && (dh1 == nullptr || fits(dh1)) &&
                      (dgu == nullptr || fits(dgu)) && (hw == nullptr || fits(hw));
    // Threads: the row's vectors in whole warps, at most kMaxThreads (a 768-wide bf16 row: 96).
    const int64_t vectors = wide ? inter / kV : inter;
    const int threads = static_cast<int>(
        std::min<int64_t>(kMaxThreads, std::max<int64_t>(32, (vectors + 31) / 32 * 32)));
    const auto* pg = static_cast<const T*>(gu);
    const auto* pd = static_cast<const T*>(dh1);
    const auto* pw = static_cast<const A*>(wr);
    auto* og = static_cast<T*>(dgu);
    auto* oh = static_cast<T*>(hw);
    auto* ow = static_cast<A*>(dwr);
    const dim3 grid(static_cast<unsigned>(rows));
    if (wide)
      moe_gated_bwd<T, kV><<<grid, threads, 0, stream>>>(pg, pd, pw, act, inter, og, oh, ow);
    else
      moe_gated_bwd<T, 1><<<grid, threads, 0, stream>>>(pg, pd, pw, act, inter, og, oh, ow);
    return cudaGetLastError();
  });
}

}  // namespace cuops::kernels
