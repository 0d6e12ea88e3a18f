// The grouped GEMM's general kernels (every dtype, any strides): groups of rows (torch._grouped_mm's
// 2-D x 3-D form, an expert's tokens against its weight) and groups along K (the 2-D x 2-D form, an
// expert's weight gradient). The group ends come on the device; nothing is read back to the host, so
// a launch is capturable in a CUDA graph and its output shape is fixed.
//
// Tile 64 x 64 x 16, 256 threads, each holding a 4 x 4 block of accumulators (acc_t: float32 for half
// types, float64 for float64) at rows and columns 16 apart. A row tile that meets several groups runs
// the k loop once per group, with the other groups' rows zeroed in shared memory: each output sums
// its own group's k terms in k order, so the bits do not depend on the grid or on other groups.
// These are the correctness path (float32, float64, and every dtype until the wgmma grouped kernel
// covers it), not a fast one.
#include "kernels/common.cuh"

namespace cuops::kernels {
using namespace detail;
namespace {

constexpr int kBM = 64, kBN = 64, kBK = 16, kThreads = 256;

// The group ends as the kernels use them: end(e) = min(rows, max(offs[0..e], 0)), non-decreasing
// whatever offs holds (offs the caller could not check without a host sync); group e is
// [end(e-1), end(e)), end(-1) = 0. Thread 0 takes the running maximum: E is small (<= kMaxGroups).
__device__ void load_ends(const int32_t* offs, int64_t groups, int64_t rows, int32_t* ends) {
  if (threadIdx.x == 0) {
    int64_t run = 0;
    for (int64_t e = 0; e < groups; ++e) {
      run = max(run, min(static_cast<int64_t>(offs[e]), rows));
      ends[e] = static_cast<int32_t>(run);
    }
  }
  __syncthreads();
}

// The 16 x 64 slice of an operand stored k-outer in shared memory (s[k][j]) from a strided
// source: element (j, k) at p + j * sj + k * sk, zero outside [jlo, jhi) x [klo, khi). Consecutive
// threads walk the operand's contiguous axis (j where sj == 1, else k) so the reads coalesce.
template <typename T, typename A>
__device__ __forceinline__ void stage(A (&s)[kBK][kBN], const T* p, int64_t sj, int64_t sk,
                                      int64_t jlo, int64_t jhi, int64_t k0, int64_t klo,
                                      int64_t khi) {
  const bool j_fast = sj == 1;
#pragma unroll
  for (int q = 0; q < kBK * kBN / kThreads; ++q) {
    const int idx = threadIdx.x + q * kThreads;
    const int j = j_fast ? idx % kBN : idx / kBK, kk = j_fast ? idx / kBN : idx % kBK;
    const int64_t k = k0 + kk;
    s[kk][j] = j >= jlo && j < jhi && k >= klo && k < khi
                   ? static_cast<A>(to_acc(p[j * sj + k * sk]))
                   : static_cast<A>(0);
  }
}

// acc += the slice's product for the thread's rows in [r0, r1) only: another group's rows are
// zeros in sa, but 0 * inf in this group's weight would still reach them.
template <typename A>
__device__ __forceinline__ void multiply(A (&acc)[4][4], const A (&sa)[kBK][kBN],
                                         const A (&sb)[kBK][kBN], int64_t r0, int64_t r1) {
  const int tr = threadIdx.x / 16, tc = threadIdx.x % 16;
#pragma unroll
  for (int kk = 0; kk < kBK; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      if (tr + 16 * i >= r0 && tr + 16 * i < r1)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += sa[kk][tr + 16 * i] * sb[kk][tc + 16 * j];
}

template <typename T, typename A>
__device__ __forceinline__ void store_tile(const A (&acc)[4][4], T* out, int64_t ld, int64_t rows,
                                           int64_t cols) {
  const int tr = threadIdx.x / 16, tc = threadIdx.x % 16;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (tr + 16 * i < rows && tc + 16 * j < cols)
        out[(tr + 16 * i) * ld + tc + 16 * j] = from_acc<T>(acc[i][j]);
}

// out [rows, n] (contiguous) = for each row r of group e: a[r, :] @ b[e]; a [rows, k] (strides
// sa0, sa1), b [groups, k, n] (strides sb0, sb1, sb2). Rows past the last group are zeros.
template <typename T> __global__ void __launch_bounds__(kThreads)
    grouped_rows(const T* a, int64_t sa0, int64_t sa1, const T* b, int64_t sb0, int64_t sb1,
                 int64_t sb2, const int32_t* offs, int64_t groups, int64_t rows, int64_t k,
                 int64_t n, T* out) {
  using A = acc_t<T>;
  extern __shared__ int32_t ends[];
  __shared__ A sa[kBK][kBN], sb[kBK][kBN];
  load_ends(offs, groups, rows, ends);
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kBM;
  const int64_t col0 = static_cast<int64_t>(blockIdx.y) * kBN;
  const int64_t row_end = min(row0 + kBM, rows);
  int64_t lo = 0, hi = groups;  // the first group whose end passes row0
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (ends[mid] <= row0)
      lo = mid + 1;
    else
      hi = mid;
  }
  A acc[4][4] = {};
  for (int64_t e = lo; e < groups; ++e) {
    const int64_t g0 = e == 0 ? 0 : ends[e - 1], g1 = ends[e];
    if (g0 >= row_end) break;
    if (g1 <= g0) continue;
    // This tile's rows of group e; the others are staged as zeros.
    const int64_t r0 = max(g0, row0) - row0, r1 = min(g1, row_end) - row0;
    for (int64_t k0 = 0; k0 < k; k0 += kBK) {
      stage(sa, a + row0 * sa0, sa0, sa1, r0, r1, k0, 0, k);
      stage(sb, b + e * sb0 + col0 * sb2, sb2, sb1, 0, n - col0, k0, 0, k);
      __syncthreads();
      multiply(acc, sa, sb, r0, r1);
      __syncthreads();
    }
  }
  store_tile(acc, out + row0 * n + col0, n, row_end - row0, n - col0);
}

// out [groups, m, n] (contiguous) = for each group e: a[:, ks] @ b[ks, :] over the k range ks of
// group e; a [m, k] (strides sa0, sa1), b [k, n] (strides sb0, sb1). Empty groups give zeros.
template <typename T> __global__ void __launch_bounds__(kThreads)
    grouped_k(const T* a, int64_t sa0, int64_t sa1, const T* b, int64_t sb0, int64_t sb1,
              const int32_t* offs, int64_t groups, int64_t m, int64_t k, int64_t n, T* out) {
  using A = acc_t<T>;
  extern __shared__ int32_t ends[];
  __shared__ A sa[kBK][kBN], sb[kBK][kBN];
  load_ends(offs, groups, k, ends);
  const int64_t e = blockIdx.z;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kBM;
  const int64_t col0 = static_cast<int64_t>(blockIdx.y) * kBN;
  const int64_t g0 = e == 0 ? 0 : ends[e - 1], g1 = ends[e];
  A acc[4][4] = {};
  for (int64_t k0 = g0 - g0 % kBK; k0 < g1; k0 += kBK) {
    stage(sa, a + row0 * sa0, sa0, sa1, 0, m - row0, k0, g0, g1);
    stage(sb, b + col0 * sb1, sb1, sb0, 0, n - col0, k0, g0, g1);
    __syncthreads();
    multiply(acc, sa, sb, 0, kBM);
    __syncthreads();
  }
  store_tile(acc, out + (e * m + row0) * n + col0, n, m - row0, n - col0);
}

bool grid_ok(int64_t x, int64_t y, int64_t z) {
  return x <= 0x7fffffff && y <= 65535 && z <= 65535;
}

}  // namespace

cudaError_t launch_grouped_mm_rows(DType dtype, const void* a, int64_t sa0, int64_t sa1,
                                   const void* b, int64_t sb0, int64_t sb1, int64_t sb2,
                                   const int32_t* offs, int64_t groups, int64_t rows, int64_t k,
                                   int64_t n, void* out, cudaStream_t stream) {
  if (rows < 0 || k < 0 || n < 0 || groups < 0 || groups > kGroupedMaxGroups || rows > 0x7fffffff)
    return cudaErrorInvalidValue;
  if (rows == 0 || n == 0) return cudaSuccess;
  const int64_t gx = (rows + kBM - 1) / kBM, gy = (n + kBN - 1) / kBN;
  if (!grid_ok(gx, gy, 1)) return cudaErrorInvalidValue;
  const size_t smem = static_cast<size_t>(std::max<int64_t>(groups, 1)) * sizeof(int32_t);
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    grouped_rows<T>
        <<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), kThreads, smem, stream>>>(
            static_cast<const T*>(a), sa0, sa1, static_cast<const T*>(b), sb0, sb1, sb2, offs,
            groups, rows, k, n, static_cast<T*>(out));
    return cudaGetLastError();
  });
}

cudaError_t launch_grouped_mm_k(DType dtype, const void* a, int64_t sa0, int64_t sa1, const void* b,
                                int64_t sb0, int64_t sb1, const int32_t* offs, int64_t groups,
                                int64_t m, int64_t k, int64_t n, void* out, cudaStream_t stream) {
  if (m < 0 || k < 0 || n < 0 || groups < 0 || groups > kGroupedMaxGroups || k > 0x7fffffff)
    return cudaErrorInvalidValue;
  if (groups == 0 || m == 0 || n == 0) return cudaSuccess;
  const int64_t gx = (m + kBM - 1) / kBM, gy = (n + kBN - 1) / kBN;
  if (!grid_ok(gx, gy, groups)) return cudaErrorInvalidValue;
  const size_t smem = static_cast<size_t>(groups) * sizeof(int32_t);
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    grouped_k<T><<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy),
                        static_cast<unsigned>(groups)),
                   kThreads, smem, stream>>>(static_cast<const T*>(a), sa0, sa1,
                                             static_cast<const T*>(b), sb0, sb1, offs, groups, m, k,
                                             n, static_cast<T*>(out));
    return cudaGetLastError();
  });
}

}  // namespace cuops::kernels
