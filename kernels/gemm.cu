// GEMM dispatch, and the general kernel every case falls back to. Problems whose operands are
// row-major or transposed views with 16-byte aligned rows go to the fast kernels (on Hopper
// gemm_wgmma.cu for bfloat16/float16 and TF32; elsewhere gemm_half.cu for bfloat16/float16,
// gemm_tf32.cu when TF32 is allowed; gemm_simt.cu for true FP32); everything else
// (float64, arbitrary strides, misaligned slices) runs the general kernel below: shared-memory tiling
// (64x64 block tile, 16-deep k slices, 4x4 register blocking) reading operands through their
// strides, so it needs no copy and is correct for every shape.
#include "gemm.cuh"

namespace cuops::kernels {
using namespace detail;
namespace {

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

// A [rows, cols] view read as row-major (element (i, j) at i * ld + j, ld a multiple of `mult`),
// possible when its column stride is 1 or it has one column (a one-row view's leading stride is
// never used: reported as 0).
bool row_major(int64_t rows, int64_t cols, int64_t s0, int64_t s1, int64_t mult, int64_t& ld) {
  if (s1 != 1 && cols != 1) return false;
  ld = rows == 1 ? 0 : s0;
  return ld % mult == 0;
}

bool aligned(const void* p, uintptr_t to) { return reinterpret_cast<uintptr_t>(p) % to == 0; }

// The fast kernels' contract (gemm.cuh): c row-major (any leading stride: the epilogue stores a pair
// whole where it is aligned, else element by element); a and b each row-major or transposed, 16-byte
// aligned, leading strides a whole number of 16 bytes. A c that is only column-major is the transposed
// problem c^T = b^T a^T.
// Anything else: cudaErrorNotSupported (the caller falls back to the general kernel).
cudaError_t launch_fast(DType dtype, int64_t m, int64_t n, int64_t k, double alpha, MatrixView a, MatrixView b,
                        double beta, void* c, int64_t sc0, int64_t sc1, bool allow_tf32, cudaStream_t stream) {
  if (dtype == DType::Float64) return cudaErrorNotSupported;
  const int64_t elsize = dtype == DType::Float32 ? 4 : 2, per16 = 16 / elsize;
  GemmProblem p{};
  if (row_major(m, n, sc0, sc1, 1, p.ldc)) {
    p.m = m, p.n = n;
  } else if (row_major(n, m, sc1, sc0, 1, p.ldc)) {
    std::swap(a, b);
    std::swap(a.stride0, a.stride1);
    std::swap(b.stride0, b.stride1);
    p.m = n, p.n = m;
  } else {
    return cudaErrorNotSupported;
  }
  p.k = k;
  const bool a_kmajor = row_major(p.m, p.k, a.stride0, a.stride1, per16, p.lda);
  if (!a_kmajor && !row_major(p.k, p.m, a.stride1, a.stride0, per16, p.lda)) return cudaErrorNotSupported;
  const bool b_nmajor = row_major(p.k, p.n, b.stride0, b.stride1, per16, p.ldb);
  if (!b_nmajor && !row_major(p.n, p.k, b.stride1, b.stride0, per16, p.ldb)) return cudaErrorNotSupported;
  if (!aligned(a.ptr, 16) || !aligned(b.ptr, 16) || !aligned(c, elsize)) return cudaErrorNotSupported;
  p.a = a.ptr, p.b = b.ptr, p.c = c;
  p.alpha = static_cast<float>(alpha), p.beta = static_cast<float>(beta);
  if (dtype != DType::Float32 || allow_tf32) {
    // Hopper's wgmma kernel first (it answers "not supported" off sm_90a, and for TF32 unless both
    // operands are k-major), then the portable tensor-core kernels.
    const cudaError_t err = launch_gemm_wgmma(dtype, p, a_kmajor, b_nmajor, stream);
    if (err != cudaErrorNotSupported) return err;
  }
  if (dtype != DType::Float32) return launch_hgemm_mma(dtype, p, a_kmajor, b_nmajor, stream);
  return allow_tf32 ? launch_sgemm_tf32(p, a_kmajor, b_nmajor, stream)
                    : launch_sgemm_simt(p, a_kmajor, b_nmajor, stream);
}

// 32 x 32 tiles through shared memory, so both the reads of src rows and the writes of dst rows are
// whole 128-byte lines; the padding column keeps the transposed reads off one bank. Tiles are
// enumerated in gridDim.x, as gemm_tiled's are.
constexpr int kTile = 32, kTileRows = 8;
__global__ void __launch_bounds__(kTile * kTileRows)
    transpose_f32(const float* src, int64_t rows, int64_t cols, int64_t ld, float* dst, int64_t ld_dst) {
  __shared__ float t[kTile][kTile + 1];
  const int64_t tiles_c = (cols + kTile - 1) / kTile;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) / tiles_c * kTile;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) % tiles_c * kTile;
  const int x = threadIdx.x % kTile, y = threadIdx.x / kTile;
#pragma unroll
  for (int j = y; j < kTile; j += kTileRows) {
    if (r0 + j < rows && c0 + x < cols) t[j][x] = src[(r0 + j) * ld + c0 + x];
  }
  __syncthreads();
#pragma unroll
  for (int j = y; j < kTile; j += kTileRows) {
    if (c0 + j < cols && r0 + x < rows) dst[(c0 + j) * ld_dst + r0 + x] = t[x][j];
  }
}

}  // namespace

cudaError_t launch_transpose_f32(const float* src, int64_t rows, int64_t cols, int64_t ld, float* dst,
                                 int64_t ld_dst, cudaStream_t stream) {
  if (rows < 0 || cols < 0 || ld < cols || ld_dst < rows) return cudaErrorInvalidValue;
  const int64_t tiles = ((rows + kTile - 1) / kTile) * ((cols + kTile - 1) / kTile);
  if (tiles == 0) return cudaSuccess;
  if (tiles > INT32_MAX) return cudaErrorInvalidValue;
  transpose_f32<<<static_cast<unsigned>(tiles), kTile * kTileRows, 0, stream>>>(src, rows, cols, ld, dst, ld_dst);
  return cudaGetLastError();
}

cudaError_t launch_gemm(DType dtype, int64_t m, int64_t n, int64_t k, double alpha, MatrixView a, MatrixView b,
                        double beta, void* c, int64_t c_stride0, int64_t c_stride1, bool allow_tf32,
                        cudaStream_t stream) {
  if (m == 0 || n == 0) return cudaSuccess;
  const cudaError_t err = launch_fast(dtype, m, n, k, alpha, a, b, beta, c, c_stride0, c_stride1, allow_tf32, stream);
  if (err != cudaErrorNotSupported) return err;
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
