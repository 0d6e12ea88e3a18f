// float32 GEMM without tensor cores ("highest" precision: true FP32 FMAs, as cuBLAS SGEMM).
// Block tile BM x BN x BK, 256 threads in a 16 x 16 grid, each holding a (BM/16) x (BN/16) register
// block split in two halves BM/2 rows and BN/2 columns apart, so a warp's 16-byte shared-memory reads
// are contiguous and conflict-free. Both operands sit in shared memory k-outer (As[k][m], Bs[k][n]);
// an operand whose contiguous axis is k is transposed on its way in. Two shared buffers: the next
// k-slice is fetched into registers while the current one is multiplied, one barrier per slice.
#include "gemm.cuh"

namespace cuops::kernels::detail {
namespace {

constexpr int kSimtThreads = 256;

// Up to four consecutive floats from `p` (16-byte aligned when all four are valid), zeros past `valid`.
__device__ __forceinline__ float4 load_chunk(const float* p, int valid) {
  if (valid >= 4) return *reinterpret_cast<const float4*>(p);
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
  if (valid > 0) v.x = p[0];
  if (valid > 1) v.y = p[1];
  if (valid > 2) v.z = p[2];
  return v;
}

template <int N> __device__ __forceinline__ void copy_frag(float* dst, const float* src) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int q = 0; q < N; q += 4) *reinterpret_cast<float4*>(dst + q) = *reinterpret_cast<const float4*>(src + q);
  } else {
    static_assert(N == 2, "fragment halves of 2 or a multiple of 4 floats");
    *reinterpret_cast<float2*>(dst) = *reinterpret_cast<const float2*>(src);
  }
}

// Tiles up to 128 x 128 are held to 128 registers so two blocks share an SM (16 warps to hide
// latency with); 256 x 128 needs ~230 and runs one.
template <int BM, int BN, int BK, int MINB, bool AK, bool BNM>
__global__ void __launch_bounds__(kSimtThreads, MINB) sgemm_simt(GemmProblem p) {
  constexpr int TM = BM / 16, TN = BN / 16;
  static_assert(TM >= 4 && TN >= 4, "register block of at least 4 x 4");
  constexpr int A_CHUNKS = BM * BK / 4, B_CHUNKS = BN * BK / 4;
  static_assert(A_CHUNKS % kSimtThreads == 0 && B_CHUNKS % kSimtThreads == 0, "whole chunks per thread");
  constexpr int A_LOADS = A_CHUNKS / kSimtThreads, B_LOADS = B_CHUNKS / kSimtThreads;
  // An operand transposed on its way in is stored with 4 floats of padding per k row: a warp's
  // scalar stores then land on 32 distinct banks instead of two-way conflicting (BK = 8).
  constexpr int APAD = AK ? 4 : 0, BPAD = BNM ? 0 : 4;
  __shared__ __align__(16) float As[2][BK][BM + APAD];
  __shared__ __align__(16) float Bs[2][BK][BN + BPAD];

  const float* A = static_cast<const float*>(p.a);
  const float* B = static_cast<const float*>(p.b);
  int64_t tm, tn;
  tile_coords<8>((p.m + BM - 1) / BM, (p.n + BN - 1) / BN, tm, tn);
  const int64_t row0 = tm * BM, col0 = tn * BN;
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;

  float4 ra[A_LOADS], rb[B_LOADS];
  // Chunk coordinates: (outer, inner) with inner along the operand's contiguous axis, in floats.
  // kGuard = false: the whole BM x BK and BK x BN slices are in bounds (most slices of most
  // blocks), so the loads go without the bounds arithmetic that otherwise costs issue slots here.
  auto fetch = [&](int64_t k0, auto guard) {
    constexpr bool kGuard = decltype(guard)::value;
#pragma unroll
    for (int i = 0; i < A_LOADS; ++i) {
      const int idx = tid + i * kSimtThreads;
      if constexpr (AK) {  // rows of A, k contiguous
        const int r = idx / (BK / 4), c = (idx % (BK / 4)) * 4;
        const int64_t gr = row0 + r, gk = k0 + c;
        ra[i] = kGuard ? load_chunk(A + gr * p.lda + gk, gr < p.m ? clamp4(p.k - gk) : 0)
                       : *reinterpret_cast<const float4*>(A + gr * p.lda + gk);
      } else {  // k rows of A^T, m contiguous
        const int r = idx / (BM / 4), c = (idx % (BM / 4)) * 4;
        const int64_t gk = k0 + r, gr = row0 + c;
        ra[i] = kGuard ? load_chunk(A + gk * p.lda + gr, gk < p.k ? clamp4(p.m - gr) : 0)
                       : *reinterpret_cast<const float4*>(A + gk * p.lda + gr);
      }
    }
#pragma unroll
    for (int i = 0; i < B_LOADS; ++i) {
      const int idx = tid + i * kSimtThreads;
      if constexpr (BNM) {  // k rows of B, n contiguous
        const int r = idx / (BN / 4), c = (idx % (BN / 4)) * 4;
        const int64_t gk = k0 + r, gc = col0 + c;
        rb[i] = kGuard ? load_chunk(B + gk * p.ldb + gc, gk < p.k ? clamp4(p.n - gc) : 0)
                       : *reinterpret_cast<const float4*>(B + gk * p.ldb + gc);
      } else {  // columns of B, k contiguous
        const int r = idx / (BK / 4), c = (idx % (BK / 4)) * 4;
        const int64_t gc = col0 + r, gk = k0 + c;
        rb[i] = kGuard ? load_chunk(B + gc * p.ldb + gk, gc < p.n ? clamp4(p.k - gk) : 0)
                       : *reinterpret_cast<const float4*>(B + gc * p.ldb + gk);
      }
    }
  };
  auto stash = [&](int buf) {
#pragma unroll
    for (int i = 0; i < A_LOADS; ++i) {
      const int idx = tid + i * kSimtThreads;
      if constexpr (AK) {
        const int r = idx / (BK / 4), c = (idx % (BK / 4)) * 4;
        As[buf][c + 0][r] = ra[i].x;
        As[buf][c + 1][r] = ra[i].y;
        As[buf][c + 2][r] = ra[i].z;
        As[buf][c + 3][r] = ra[i].w;
      } else {
        const int r = idx / (BM / 4), c = (idx % (BM / 4)) * 4;
        *reinterpret_cast<float4*>(&As[buf][r][c]) = ra[i];
      }
    }
#pragma unroll
    for (int i = 0; i < B_LOADS; ++i) {
      const int idx = tid + i * kSimtThreads;
      if constexpr (BNM) {
        const int r = idx / (BN / 4), c = (idx % (BN / 4)) * 4;
        *reinterpret_cast<float4*>(&Bs[buf][r][c]) = rb[i];
      } else {
        const int r = idx / (BK / 4), c = (idx % (BK / 4)) * 4;
        Bs[buf][c + 0][r] = rb[i].x;
        Bs[buf][c + 1][r] = rb[i].y;
        Bs[buf][c + 2][r] = rb[i].z;
        Bs[buf][c + 3][r] = rb[i].w;
      }
    }
  };

  using Guarded = std::true_type;
  using Unguarded = std::false_type;
  const bool inside = row0 + BM <= p.m && col0 + BN <= p.n;
  float acc[TM][TN] = {};
  if (inside && BK <= p.k) fetch(int64_t{0}, Unguarded{});
  else fetch(int64_t{0}, Guarded{});
  stash(0);
  __syncthreads();
  int buf = 0;
  for (int64_t k0 = 0; k0 < p.k; k0 += BK) {
    const bool more = k0 + BK < p.k;
    if (inside && k0 + 2 * BK <= p.k) fetch(k0 + BK, Unguarded{});
    else if (more) fetch(k0 + BK, Guarded{});
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      float a[TM], b[TN];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        copy_frag<TM / 2>(a + h * TM / 2, &As[buf][kk][h * BM / 2 + ty * TM / 2]);
        copy_frag<TN / 2>(b + h * TN / 2, &Bs[buf][kk][h * BN / 2 + tx * TN / 2]);
      }
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    if (more) {
      stash(buf ^ 1);
      __syncthreads();
      buf ^= 1;
    }
  }

#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int64_t r = row0 + (i / (TM / 2)) * (BM / 2) + ty * (TM / 2) + i % (TM / 2);
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int q = 0; q < TN / 2; q += 2)
        store_pair(p, r, col0 + h * BN / 2 + tx * TN / 2 + q, acc[i][h * TN / 2 + q], acc[i][h * TN / 2 + q + 1]);
  }
}

template <int BM, int BN, int BK, int MINB = (BM * BN <= 128 * 128 ? 2 : 1)>
cudaError_t launch_simt_tile(const GemmProblem& p, bool a_kmajor, bool b_nmajor, cudaStream_t stream) {
  const int64_t tiles = ((p.m + BM - 1) / BM) * ((p.n + BN - 1) / BN);
  if (tiles > 0x7fffffff) return cudaErrorNotSupported;
  const dim3 grid(static_cast<unsigned int>(tiles));
  if (a_kmajor && b_nmajor) sgemm_simt<BM, BN, BK, MINB, true, true><<<grid, kSimtThreads, 0, stream>>>(p);
  else if (a_kmajor) sgemm_simt<BM, BN, BK, MINB, true, false><<<grid, kSimtThreads, 0, stream>>>(p);
  else if (b_nmajor) sgemm_simt<BM, BN, BK, MINB, false, true><<<grid, kSimtThreads, 0, stream>>>(p);
  else sgemm_simt<BM, BN, BK, MINB, false, false><<<grid, kSimtThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_sgemm_simt(const GemmProblem& p, bool a_kmajor, bool b_nmajor, cudaStream_t stream) {
  // Measured on the H100 (bench/sweep/gemm_lib_sweep.cu, NOTES.md): 256 x 128 (16 x 8 per thread,
  // one block per SM) is fastest from 2048^3 up, i.e. from about one tile per SM; 128 x 128 (two
  // blocks per SM) between; 64 x 64 at 1024^3 and below, where larger tiles leave SMs idle.
  const int64_t tiles_256x128 = ((p.m + 255) / 256) * ((p.n + 127) / 128);
  const int64_t tiles_128x128 = ((p.m + 127) / 128) * ((p.n + 127) / 128);
  if (tiles_256x128 >= 120) return launch_simt_tile<256, 128, 8>(p, a_kmajor, b_nmajor, stream);
  if (tiles_128x128 >= 256) return launch_simt_tile<128, 128, 8>(p, a_kmajor, b_nmajor, stream);
  return launch_simt_tile<64, 64, 16>(p, a_kmajor, b_nmajor, stream);
}

}  // namespace cuops::kernels::detail
