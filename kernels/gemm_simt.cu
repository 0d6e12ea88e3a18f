// float32 GEMM without tensor cores ("highest" precision: true FP32 FMAs, as cuBLAS SGEMM).
// Block tile BM x BN x BK, 256 threads in a 16 x 16 grid, each holding a (BM/16) x (BN/16) register
// block split in two halves BM/2 rows and BN/2 columns apart, so a warp's 16-byte shared-memory reads
// are contiguous and conflict-free. Both operands sit in shared memory k-outer (As[k][m], Bs[k][n]);
// an operand whose contiguous axis is k is transposed on its way in. Two shared buffers and two
// register fragments: the next k-slice is fetched into registers while the current one is
// multiplied, and stashed, with the one barrier per slice, during the slice's last k, whose FMAs
// then cover the next slice's first shared loads.
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
// latency with); 256 x 128 needs ~250 and runs one.
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
  // Chunk i of a thread (4 floats): `outer` along the operand's strided axis and `inner` along its
  // contiguous one, relative to the slice's corner; `inner` is the same for all of a thread's chunks.
  constexpr int A_ROW = AK ? BK / 4 : BM / 4, B_ROW = BNM ? BN / 4 : BK / 4;  // chunks per stored row
  static_assert(kSimtThreads % A_ROW == 0 && kSimtThreads % B_ROW == 0, "a thread's chunks share `inner`");
  auto a_outer = [&](int i) { return (tid + i * kSimtThreads) / A_ROW; };
  const int a_inner = (tid % A_ROW) * 4, b_inner = (tid % B_ROW) * 4;
  auto b_outer = [&](int i) { return (tid + i * kSimtThreads) / B_ROW; };
  const int64_t a_kstep = AK ? 1 : p.lda, b_kstep = BNM ? p.ldb : 1;
  const float* a_base = A + (AK ? row0 * p.lda : row0) + int64_t{a_outer(0)} * p.lda + a_inner;
  const float* b_base = B + (BNM ? col0 : col0 * p.ldb) + int64_t{b_outer(0)} * p.ldb + b_inner;
  // A slice at an edge of A, B or k: bounds-checked loads, zeros outside.
  auto fetch_edge = [&](int64_t k0) {
#pragma unroll
    for (int i = 0; i < A_LOADS; ++i) {
      if constexpr (AK) {  // rows of A, k contiguous
        const int64_t gr = row0 + a_outer(i), gk = k0 + a_inner;
        ra[i] = load_chunk(A + gr * p.lda + gk, gr < p.m ? clamp4(p.k - gk) : 0);
      } else {  // k rows of A^T, m contiguous
        const int64_t gk = k0 + a_outer(i), gr = row0 + a_inner;
        ra[i] = load_chunk(A + gk * p.lda + gr, gk < p.k ? clamp4(p.m - gr) : 0);
      }
    }
#pragma unroll
    for (int i = 0; i < B_LOADS; ++i) {
      if constexpr (BNM) {  // k rows of B, n contiguous
        const int64_t gk = k0 + b_outer(i), gc = col0 + b_inner;
        rb[i] = load_chunk(B + gk * p.ldb + gc, gk < p.k ? clamp4(p.n - gc) : 0);
      } else {  // columns of B, k contiguous
        const int64_t gc = col0 + b_outer(i), gk = k0 + b_inner;
        rb[i] = load_chunk(B + gc * p.ldb + gk, gc < p.n ? clamp4(p.k - gk) : 0);
      }
    }
  };
  // A slice wholly in bounds (most slices of most blocks): no bounds arithmetic, which costs issue
  // slots here; pa / pb point at the thread's first chunk of the slice.
  auto fetch_full = [&](const float* pa, const float* pb) {
#pragma unroll
    for (int i = 0; i < A_LOADS; ++i)
      ra[i] = *reinterpret_cast<const float4*>(pa + int64_t{a_outer(i) - a_outer(0)} * p.lda);
#pragma unroll
    for (int i = 0; i < B_LOADS; ++i)
      rb[i] = *reinterpret_cast<const float4*>(pb + int64_t{b_outer(i) - b_outer(0)} * p.ldb);
  };
  auto stash = [&](int buf) {
#pragma unroll
    for (int i = 0; i < A_LOADS; ++i) {
      if constexpr (AK) {
        const int r = a_outer(i);
        As[buf][a_inner + 0][r] = ra[i].x;
        As[buf][a_inner + 1][r] = ra[i].y;
        As[buf][a_inner + 2][r] = ra[i].z;
        As[buf][a_inner + 3][r] = ra[i].w;
      } else {
        *reinterpret_cast<float4*>(&As[buf][a_outer(i)][a_inner]) = ra[i];
      }
    }
#pragma unroll
    for (int i = 0; i < B_LOADS; ++i) {
      if constexpr (BNM) {
        *reinterpret_cast<float4*>(&Bs[buf][b_outer(i)][b_inner]) = rb[i];
      } else {
        const int r = b_outer(i);
        Bs[buf][b_inner + 0][r] = rb[i].x;
        Bs[buf][b_inner + 1][r] = rb[i].y;
        Bs[buf][b_inner + 2][r] = rb[i].z;
        Bs[buf][b_inner + 3][r] = rb[i].w;
      }
    }
  };

  const bool inside = row0 + BM <= p.m && col0 + BN <= p.n;
  float acc[TM][TN] = {};
  if (inside && BK <= p.k) fetch_full(a_base, b_base);
  else fetch_edge(0);
  stash(0);
  __syncthreads();
  int buf = 0;
  // Fragments double-buffered in registers across the slice boundary. The v3 loop loaded each k's
  // fragments at that k and passed the barrier between slices: its SASS had every warp stalled at
  // the stash, the barrier and the first shared loads after it at the same time (bench/NOTES.md).
  float fa[2][TM], fb[2][TN];
  auto load_frag = [&](int s, int bf, int kk) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      copy_frag<TM / 2>(fa[s] + h * TM / 2, &As[bf][kk][h * BM / 2 + ty * TM / 2]);
      copy_frag<TN / 2>(fb[s] + h * TN / 2, &Bs[bf][kk][h * BN / 2 + tx * TN / 2]);
    }
  };
  load_frag(0, 0, 0);
  // One slice computed from shared buffer `cur`; fetch_next loads the next slice into registers.
  // kMore: a next slice exists (known at compile time in the main loops, which then have no branch
  // for ptxas to schedule around).
  auto slice = [&](auto fetch_next, auto more_tag, bool more, int cur) {
    constexpr bool kMore = decltype(more_tag)::value;
    if (kMore || more) fetch_next();
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      if (kk == BK - 1 && (kMore || more)) {
        stash(cur ^ 1);
        __syncthreads();
      }
      if (kk < BK - 1 || kMore || more) load_frag((kk + 1) % 2, kk == BK - 1 ? cur ^ 1 : cur, (kk + 1) % BK);
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(fa[kk % 2][i], fb[kk % 2][j], acc[i][j]);
    }
  };
  int64_t k0 = 0;
  if (inside) {
    // One slice per trip: two (shared buffers as compile-time constants) made the loop body twice
    // as long and ran 2 % slower on the H100.
    for (; k0 + 2 * BK <= p.k; k0 += BK) {
      slice([&] { fetch_full(a_base + (k0 + BK) * a_kstep, b_base + (k0 + BK) * b_kstep); }, std::true_type{}, true, buf);
      buf ^= 1;
    }
  }
  for (; k0 < p.k; k0 += BK) {
    const bool more = k0 + BK < p.k;
    slice([&] { fetch_edge(k0 + BK); }, std::false_type{}, more, buf);
    if (more) buf ^= 1;
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
  // Measured on the H100 (bench/sweep/gemm_lib_sweep.cu, NOTES.md): 128 x 128 (two blocks per SM,
  // 16 warps) is fastest from 2048^3 up, ahead of 256 x 128 (one block, 8 warps) by 1-2 %; 64 x 64
  // at 1024^3 and below, where larger tiles leave SMs idle.
  const int64_t tiles_128x128 = ((p.m + 127) / 128) * ((p.n + 127) / 128);
  if (tiles_128x128 >= 256) return launch_simt_tile<128, 128, 8>(p, a_kmajor, b_nmajor, stream);
  return launch_simt_tile<64, 64, 16>(p, a_kmajor, b_nmajor, stream);
}

}  // namespace cuops::kernels::detail
