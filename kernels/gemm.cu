// GEMM, first version: shared-memory tiling (64x64 block tile, 16-deep k slices) with 4x4 register
// blocking per thread. Operands are read through their strides, so transposed and sliced views need
// no copy. Correct for every shape; tensor-core and pipelined versions replace it per dtype later.
#include "common.cuh"

namespace cuops::kernels {
namespace {
using namespace detail;

constexpr int kBM = 64, kBN = 64, kBK = 16;
constexpr int kTM = 4, kTN = 4;
constexpr int kThreads = (kBM / kTM) * (kBN / kTN);  // 256

// a: [m, k], b: [k, n], c: [m, n], all strided. Block tiles are enumerated in gridDim.x (up to
// 2^31-1 of them) rather than in x/y, whose 65535 limit would cap m.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    gemm_tiled(int64_t m, int64_t n, int64_t k, acc_t<T> alpha, const T* a, int64_t sa0, int64_t sa1, const T* b,
               int64_t sb0, int64_t sb1, acc_t<T> beta, T* c, int64_t sc0, int64_t sc1) {
  using A = acc_t<T>;
  // +1 column of padding keeps the transposed stores of the A tile off one bank.
  __shared__ A as[kBK][kBM + 1];
  __shared__ A bs[kBK][kBN + 1];

  const int64_t tiles_n = (n + kBN - 1) / kBN;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) / tiles_n) * kBM;
  const int64_t col0 = (static_cast<int64_t>(blockIdx.x) % tiles_n) * kBN;
  const int tx = threadIdx.x % (kBN / kTN), ty = threadIdx.x / (kBN / kTN);

  A acc[kTM][kTN] = {};
  for (int64_t k0 = 0; k0 < k; k0 += kBK) {
#pragma unroll
    for (int r = 0; r < kBM * kBK / kThreads; ++r) {
      const int l = threadIdx.x + r * kThreads;
      const int kk = l % kBK, mm = l / kBK;
      const int64_t gi = row0 + mm, gk = k0 + kk;
      as[kk][mm] = (gi < m && gk < k) ? to_acc(a[gi * sa0 + gk * sa1]) : A(0);
    }
#pragma unroll
    for (int r = 0; r < kBN * kBK / kThreads; ++r) {
      const int l = threadIdx.x + r * kThreads;
      const int nn = l % kBN, kk = l / kBN;
      const int64_t gk = k0 + kk, gj = col0 + nn;
      bs[kk][nn] = (gk < k && gj < n) ? to_acc(b[gk * sb0 + gj * sb1]) : A(0);
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      A af[kTM], bf[kTN];
#pragma unroll
      for (int i = 0; i < kTM; ++i) af[i] = as[kk][ty * kTM + i];
#pragma unroll
      for (int j = 0; j < kTN; ++j) bf[j] = bs[kk][tx * kTN + j];
#pragma unroll
      for (int i = 0; i < kTM; ++i)
#pragma unroll
        for (int j = 0; j < kTN; ++j) acc[i][j] = fma(af[i], bf[j], acc[i][j]);
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < kTM; ++i) {
    const int64_t gi = row0 + ty * kTM + i;
    if (gi >= m) continue;
#pragma unroll
    for (int j = 0; j < kTN; ++j) {
      const int64_t gj = col0 + tx * kTN + j;
      if (gj >= n) continue;
      T* dst = c + gi * sc0 + gj * sc1;
      A v = alpha * acc[i][j];
      // beta == 0 must not read c: its old contents may be NaN or uninitialised.
      if (beta != A(0)) v = fma(beta, to_acc(*dst), v);
      *dst = from_acc<T>(v);
    }
  }
}

}  // namespace

cudaError_t launch_gemm(DType dtype, int64_t m, int64_t n, int64_t k, double alpha, MatrixView a, MatrixView b,
                        double beta, void* c, int64_t c_stride0, int64_t c_stride1, cudaStream_t stream) {
  if (m == 0 || n == 0) return cudaSuccess;
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const int64_t tiles = ((m + kBM - 1) / kBM) * ((n + kBN - 1) / kBN);
    if (tiles > 0x7fffffff) return cudaErrorInvalidConfiguration;
    gemm_tiled<T><<<static_cast<unsigned int>(tiles), kThreads, 0, stream>>>(
        m, n, k, static_cast<A>(alpha), static_cast<const T*>(a.ptr), a.stride0, a.stride1,
        static_cast<const T*>(b.ptr), b.stride0, b.stride1, static_cast<A>(beta), static_cast<T*>(c), c_stride0,
        c_stride1);
    return cudaGetLastError();
  });
}

}  // namespace cuops::kernels
