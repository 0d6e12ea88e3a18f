// The MoE decode step's routing (ops/moe.cpp's decode path, before the grouped small-M products of
// kernels/gemm/gemm_skinny_tma.cu): at most kDecodeMaxPairs (token, slot) pairs placed by expert into
// slots of mt rows, in one launch.
//   - An expert holding c pairs takes ceil(c / mt) consecutive slots; the experts in increasing
//     order; slots[a] = the expert of slot a, -1 past the last (those slots do nothing).
//   - A pair's row: slot * mt + its rank among its expert's pairs in pair order (taken mod mt into
//     the expert's slots): rows[p]; -1 for an expert outside [0, E) (transformers' expert-parallel
//     convention: it adds nothing; the combine skips negative rows, so no zero row and no fill).
//   - xg [slots_n mt, h]: row r = x[the token of the pair placed there], zeros where none is.
// Every block routes all pairs in shared memory (at most kDecodeMaxPairs, O(pairs) a thread: cheaper
// than a second launch) and copies its share of xg's rows; block 0 writes slots and rows. The
// placement is a fixed function of the indices: the same rows every run.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/common.cuh"
#include "kernels/gemm/gemm.cuh"
#include "kernels/kernels.h"

namespace cuops::kernels {
namespace {

constexpr int kRouteThreads = kDecodeMaxPairs;

template <typename I> __global__ void __launch_bounds__(kRouteThreads)
    decode_route(const I* idx, int pairs, int k, int64_t experts, const uint4* x, int64_t ldx16,
                 int64_t h16, int mt, int slots_n, int32_t* slots, int32_t* rows, uint4* xg) {
  __shared__ int ex[kDecodeMaxPairs], count[kDecodeMaxPairs], row_of[kDecodeMaxPairs];
  __shared__ bool first[kDecodeMaxPairs];
  extern __shared__ int src[];  // [slots_n * mt]: the token of each xg row, -1 none
  const int p = static_cast<int>(threadIdx.x);
  // idx may come from the kernel just before (the router's top-k).
  detail::end_dependent_prologue();
  if (p < pairs) {
    const int64_t e = static_cast<int64_t>(idx[p]);
    ex[p] = e >= 0 && e < experts ? static_cast<int>(e) : -1;
  }
  for (int r = p; r < slots_n * mt; r += kRouteThreads) src[r] = -1;
  __syncthreads();
  int e = -1, rank = 0, slot0 = 0;
  if (p < pairs && (e = ex[p]) >= 0) {
    int c = 0;
    bool is_first = true;
    for (int q = 0; q < pairs; ++q) {
      c += ex[q] == e;
      if (q < p && ex[q] == e) ++rank, is_first = false;
    }
    count[p] = c, first[p] = is_first;
  } else if (p < pairs) {
    first[p] = false;
  }
  __syncthreads();
  if (e >= 0) {
    for (int q = 0; q < pairs; ++q)  // the slots of the experts below e
      if (first[q] && ex[q] < e) slot0 += (count[q] + mt - 1) / mt;
    const int row = (slot0 + rank / mt) * mt + rank % mt;
    row_of[p] = row;
    src[row] = p / k;
  } else if (p < pairs) {
    row_of[p] = -1;
  }
  __syncthreads();
  if (blockIdx.x == 0) {
    if (p < pairs) rows[p] = row_of[p];
    for (int a = p; a < slots_n; a += kRouteThreads) slots[a] = -1;
    __syncthreads();
    if (e >= 0 && first[p])
      for (int a = 0; a < (count[p] + mt - 1) / mt; ++a) slots[slot0 + a] = e;
  }
  for (int r = static_cast<int>(blockIdx.x); r < slots_n * mt; r += static_cast<int>(gridDim.x)) {
    const int t = src[r];
    for (int64_t c = p; c < h16; c += kRouteThreads)
      xg[r * h16 + c] = t >= 0 ? x[t * ldx16 + c] : make_uint4(0, 0, 0, 0);
  }
}

}  // namespace

cudaError_t launch_moe_decode_route(const void* idx, bool idx64, int64_t tokens, int64_t k,
                                    int64_t experts, const void* x, int64_t ldx, int64_t h,
                                    int64_t elem, int mt, int64_t slots_n, int32_t* slots,
                                    int32_t* rows, void* xg, int sms, cudaStream_t stream) {
  const int64_t pairs = tokens * k;
  if (pairs <= 0 || pairs > kDecodeMaxPairs || (mt != 8 && mt != 16) || slots_n <= 0 ||
      slots_n * mt > 12288 || (h * elem) % 16 != 0 || (ldx * elem) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(xg) % 16 != 0)
    return cudaErrorInvalidValue;
  const int64_t rows_n = slots_n * mt;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(rows_n, 2 * int64_t{sms}));
  const size_t smem = static_cast<size_t>(rows_n) * sizeof(int);
  const int64_t h16 = h * elem / 16, ldx16 = ldx * elem / 16;
  // A programmatic dependent of the kernel before it, and the gate/up product after it of this one
  // (launch_grouped_skinny): each launch and prologue overlap the previous kernel's end, where the
  // decode step's four kernels are each a few microseconds.
  const detail::ClusterLaunch launch(dim3(blocks), dim3(1), kRouteThreads, static_cast<int>(smem),
                                     stream, true);
  auto go = [&](auto* ix) {
    return cudaLaunchKernelEx(
        &launch.cfg, decode_route<std::remove_const_t<std::remove_pointer_t<decltype(ix)>>>, ix,
        static_cast<int>(pairs), static_cast<int>(k), experts, static_cast<const uint4*>(x), ldx16,
        h16, mt, static_cast<int>(slots_n), slots, rows, static_cast<uint4*>(xg));
  };
  return idx64 ? go(static_cast<const int64_t*>(idx)) : go(static_cast<const int32_t*>(idx));
}

}  // namespace cuops::kernels
