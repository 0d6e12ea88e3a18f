// float32 GEMM without tensor cores ("highest" precision: true FP32 FMAs, as cuBLAS SGEMM).
// Block tile BM x BN x BK, 256 threads in a 16 x 16 grid, each holding a (BM/16) x (BN/16) register
// block split in two halves BM/2 rows and BN/2 columns apart, so a warp's 16-byte shared-memory reads
// are contiguous and conflict-free. Both operands sit in shared memory k-outer (a[k][m], b[k][n]);
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
    for (int q = 0; q < N; q += 4)
      *reinterpret_cast<float4*>(dst + q) = *reinterpret_cast<const float4*>(src + q);
  } else {
    static_assert(N == 2, "fragment halves of 2 or a multiple of 4 floats");
    *reinterpret_cast<float2*>(dst) = *reinterpret_cast<const float2*>(src);
  }
}

// acc += a b^T in the order j outer, i inner, zigzag (i runs backwards on odd j). The order decides
// which registers ptxas gives the accumulators and which operands it can serve from its reuse cache,
// so how many FFMAs read two registers of one bank and wait a cycle for the second (Nsight Compute's
// "dispatch stall"). Counted in the SASS of the 128 x 128 loop (4 banks, register % 4, one reuse entry
// per operand slot and bank), rows first had 0.19-0.35 conflicts per FFMA over the four layouts and
// this order 0.10-0.25; cuBLAS's SGEMM has 0.07. On the H100 it took the 128 x 128 tile from 0.91-0.93x
// cuBLAS to 0.97-0.99x at 4096^3.
template <int TM, int TN> __device__ __forceinline__ void outer_product(float (&acc)[TM][TN],
                                                                        const float* a,
                                                                        const float* b) {
#pragma unroll
  for (int j = 0; j < TN; ++j)
#pragma unroll
    for (int ii = 0; ii < TM; ++ii) {
      const int i = j % 2 ? TM - 1 - ii : ii;
      acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
}

// `p` moved on by `bytes`: the buffer offset is kept in bytes, so no shift per use.
template <typename T> __device__ __forceinline__ T* byte_offset(T* p, int bytes) {
  using C = std::conditional_t<std::is_const_v<T>, const char, char>;
  return reinterpret_cast<T*>(reinterpret_cast<C*>(p) + bytes);
}

// A thread's share of moving a BK slice of both operands in: 16-byte chunks into registers (ra, rb),
// then, one slice later, into a shared buffer. Both operands sit in shared memory k-outer.
template <int BM, int BN, int BK, bool AK, bool BNM> struct SimtStaging {
  static constexpr int A_CHUNKS = BM * BK / 4, B_CHUNKS = BN * BK / 4;
  static_assert(A_CHUNKS % kSimtThreads == 0 && B_CHUNKS % kSimtThreads == 0,
                "whole chunks per thread");
  static constexpr int A_LOADS = A_CHUNKS / kSimtThreads, B_LOADS = B_CHUNKS / kSimtThreads;
  // An operand transposed on its way in is stored with 4 floats of padding per k row: a warp's
  // scalar stores then land on 32 distinct banks instead of two-way conflicting (BK = 8).
  static constexpr int APAD = AK ? 4 : 0, BPAD = BNM ? 0 : 4;
  // Both operands of one buffer in one struct, so a single offset (0 or kStage bytes) names the
  // buffer for every shared address of a thread, toggled once per slice; recomputing each address
  // from the buffer index cost ~17 instructions per slice at the 128-register cap.
  struct Stage {
    float a[BK][BM + APAD];
    float b[BK][BN + BPAD];
  };
  static constexpr int kStage = sizeof(Stage);  // bytes between the buffers
  // Chunk i of a thread (4 floats): `outer` along the operand's strided axis and `inner` along its
  // contiguous one, relative to the slice's corner; `inner` is the same for all of a thread's chunks.
  static constexpr int A_ROW = AK ? BK / 4 : BM / 4,
                       B_ROW = BNM ? BN / 4 : BK / 4;  // chunks per stored row
  static_assert(kSimtThreads % A_ROW == 0 && kSimtThreads % B_ROW == 0,
                "a thread's chunks share `inner`");

  const GemmProblem& p;
  const float* A;
  const float* B;
  int64_t row0, col0;
  int tid, a_inner, b_inner;
  float* a_st;  // the thread's shared addresses in buffer 0; buffer 1 is kStage bytes on
  float* b_st;
  float4 ra[A_LOADS], rb[B_LOADS];

  __device__ __forceinline__ int a_outer(int i) const { return (tid + i * kSimtThreads) / A_ROW; }
  __device__ __forceinline__ int b_outer(int i) const { return (tid + i * kSimtThreads) / B_ROW; }

  // A slice at an edge of A, B or k: bounds-checked loads, zeros outside.
  __device__ __forceinline__ void fetch_edge(int64_t k0) {
#pragma unroll
    for (int i = 0; i < A_LOADS; ++i) {
      if constexpr (AK) {  // rows of A, k contiguous
        const int64_t gr = row0 + a_outer(i), gk = k0 + a_inner;
        ra[i] = load_chunk(A + gr * p.lda + gk, gr < p.m ? chunk_valid<4>(p.k - gk) : 0);
      } else {  // k rows of A^T, m contiguous
        const int64_t gk = k0 + a_outer(i), gr = row0 + a_inner;
        ra[i] = load_chunk(A + gk * p.lda + gr, gk < p.k ? chunk_valid<4>(p.m - gr) : 0);
      }
    }
#pragma unroll
    for (int i = 0; i < B_LOADS; ++i) {
      if constexpr (BNM) {  // k rows of B, n contiguous
        const int64_t gk = k0 + b_outer(i), gc = col0 + b_inner;
        rb[i] = load_chunk(B + gk * p.ldb + gc, gk < p.k ? chunk_valid<4>(p.n - gc) : 0);
      } else {  // columns of B, k contiguous
        const int64_t gc = col0 + b_outer(i), gk = k0 + b_inner;
        rb[i] = load_chunk(B + gc * p.ldb + gk, gc < p.n ? chunk_valid<4>(p.k - gk) : 0);
      }
    }
  }
  // A slice wholly in bounds (most slices of most blocks): no bounds arithmetic, which costs issue
  // slots here; pa / pb point at the thread's first chunk of the slice.
  __device__ __forceinline__ void fetch_full(const float* pa, const float* pb) {
#pragma unroll
    for (int i = 0; i < A_LOADS; ++i)
      ra[i] = *reinterpret_cast<const float4*>(pa + int64_t{a_outer(i) - a_outer(0)} * p.lda);
#pragma unroll
    for (int i = 0; i < B_LOADS; ++i)
      rb[i] = *reinterpret_cast<const float4*>(pb + int64_t{b_outer(i) - b_outer(0)} * p.ldb);
  }
  // The registers into the buffer at byte offset `off`.
  __device__ __forceinline__ void stash(int off) {
    float* sa = byte_offset(a_st, off);
    float* sb = byte_offset(b_st, off);
#pragma unroll
    for (int i = 0; i < A_LOADS; ++i) {
      if constexpr (AK) {
        float* s = sa + (a_outer(i) - a_outer(0));
        s[0 * (BM + APAD)] = ra[i].x;
        s[1 * (BM + APAD)] = ra[i].y;
        s[2 * (BM + APAD)] = ra[i].z;
        s[3 * (BM + APAD)] = ra[i].w;
      } else {
        *reinterpret_cast<float4*>(sa + (a_outer(i) - a_outer(0)) * (BM + APAD)) = ra[i];
      }
    }
#pragma unroll
    for (int i = 0; i < B_LOADS; ++i) {
      if constexpr (BNM) {
        *reinterpret_cast<float4*>(sb + (b_outer(i) - b_outer(0)) * (BN + BPAD)) = rb[i];
      } else {
        float* s = sb + (b_outer(i) - b_outer(0));
        s[0 * (BN + BPAD)] = rb[i].x;
        s[1 * (BN + BPAD)] = rb[i].y;
        s[2 * (BN + BPAD)] = rb[i].z;
        s[3 * (BN + BPAD)] = rb[i].w;
      }
    }
  }
};

// The register block out: acc[i][j] is element (tile row row_of(i), tile column col_of(j)), the
// block's two halves BM/2 rows and BN/2 columns apart.
template <int BM, int BN, int TM, int TN>
__device__ __forceinline__ void store_simt_tile(const GemmProblem& out, const float (&acc)[TM][TN],
                                                int64_t row0, int64_t col0, int tx, int ty) {
  auto row_of = [&](int i) { return (i / (TM / 2)) * (BM / 2) + ty * (TM / 2) + i % (TM / 2); };
  auto col_of = [&](int j) { return (j / (TN / 2)) * (BN / 2) + tx * (TN / 2) + j % (TN / 2); };
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; j += 2)
      Epilogue::pair<float>(out, row0 + row_of(i), col0 + col_of(j), acc[i][j], acc[i][j + 1]);
}

// MINB 2 holds a tile to 128 registers so two blocks share an SM (16 warps to hide latency with):
// the 128 x 128 and 64 x 64 tiles the library compiles (256 x 128 needed ~250 registers, one block).
// k split (TiledParams::split_k CTAs along y, any GPU): each CTA multiplies its slice of k (whole BK slices)
// into its plane of the workspace; gemm.cuh's sum_planes adds the planes into c.

// kSplit: the split instance (its own, so the unsplit loop keeps the problem in parameter space:
// moving a, b and k into registers spilled at the 128-register cap).
template <int BM, int BN, int BK, int MINB, bool AK, bool BNM, bool kSplit>
__global__ void __launch_bounds__(kSimtThreads, MINB) sgemm_simt(const GemmProblem whole) {
  // This CTA's problem: the whole one, or (split k) its slice of k, a and b moved to its start.
  GemmProblem p = whole;
  if constexpr (kSplit) take_k_slice<float, BK, AK, BNM>(p);
  using St = SimtStaging<BM, BN, BK, AK, BNM>;
  constexpr int TM = BM / 16, TN = BN / 16;
  static_assert(TM >= 4 && TN >= 4, "register block of at least 4 x 4");
  constexpr int APAD = St::APAD, BPAD = St::BPAD, kStage = St::kStage;
  __shared__ __align__(16) typename St::Stage sm[2];

  const float* A = static_cast<const float*>(p.a);
  const float* B = static_cast<const float*>(p.b);
  int64_t tm, tn;
  tile_coords<8>((p.m + BM - 1) / BM, (p.n + BN - 1) / BN, tm, tn);
  const int64_t row0 = tm * BM, col0 = tn * BN;
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;

  St st{p, A, B, row0, col0, tid, (tid % St::A_ROW) * 4, (tid % St::B_ROW) * 4};
  const int64_t a_kstep = AK ? 1 : p.lda, b_kstep = BNM ? p.ldb : 1;
  const float* a_base =
      A + (AK ? row0 * p.lda : row0) + int64_t{st.a_outer(0)} * p.lda + st.a_inner;
  const float* b_base =
      B + (BNM ? col0 : col0 * p.ldb) + int64_t{st.b_outer(0)} * p.ldb + st.b_inner;
  st.a_st = AK ? &sm[0].a[st.a_inner][st.a_outer(0)] : &sm[0].a[st.a_outer(0)][st.a_inner];
  st.b_st = BNM ? &sm[0].b[st.b_outer(0)][st.b_inner] : &sm[0].b[st.b_inner][st.b_outer(0)];
  const float* const a_rd = &sm[0].a[0][ty * TM / 2];
  const float* const b_rd = &sm[0].b[0][tx * TN / 2];

  const bool inside = row0 + BM <= p.m && col0 + BN <= p.n;
  float acc[TM][TN] = {};
  if (inside && BK <= p.k)
    st.fetch_full(a_base, b_base);
  else
    st.fetch_edge(0);
  st.stash(0);
  __syncthreads();
  int off = 0;  // the buffer being multiplied: byte offset 0 or kStage
  // Fragments double-buffered in registers across the slice boundary. Loading each k's fragments
  // at that k and passing the barrier between slices had every warp stalled (SASS) at the stash, the barrier and the first shared loads after it at the same time.
  float fa[2][TM], fb[2][TN];
  auto load_frag = [&](int s, int o, int kk) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      copy_frag<TM / 2>(fa[s] + h * TM / 2, byte_offset(a_rd, o) + kk * (BM + APAD) + h * BM / 2);
      copy_frag<TN / 2>(fb[s] + h * TN / 2, byte_offset(b_rd, o) + kk * (BN + BPAD) + h * BN / 2);
    }
  };
  load_frag(0, 0, 0);
  // One slice computed from the buffer at `cur`; fetch_next loads the next slice into registers.
  // kMore: a next slice exists (known at compile time in the main loops, which then have no branch
  // for ptxas to schedule around).
  auto slice = [&](auto fetch_next, auto more_tag, bool more, int cur) {
    constexpr bool kMore = decltype(more_tag)::value;
    const int nxt = cur ^ kStage;
    if (kMore || more) fetch_next();
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      if (kk == BK - 1 && (kMore || more)) {
        st.stash(nxt);
        __syncthreads();
      }
      if (kk < BK - 1 || kMore || more)
        load_frag((kk + 1) % 2, kk == BK - 1 ? nxt : cur, (kk + 1) % BK);
      outer_product(acc, fa[kk % 2], fb[kk % 2]);
    }
  };
  int64_t k0 = 0;
  if (inside) {
    // Pointers advanced by a slice per trip, and the trip count held in A's pointer, rather than
    // addresses recomputed from a 64-bit k0 (a multiply by the leading stride, its moves and a
    // 64-bit compare, every slice). One slice per trip: two (shared buffers as compile-time
    // constants) made the loop body twice as long and ran 2 % slower on the H100.
    const int64_t trips = p.k / BK - 1;  // full slices that have a next slice
    const int64_t a_step = BK * a_kstep, b_step = BK * b_kstep;  // a_step != 0: launch_sgemm_simt
    const float* pa = a_base;
    const float* pb = b_base;
    const float* const pa_end = a_base + (trips > 0 ? trips : 0) * a_step;
    while (pa != pa_end) {
      pa += a_step;
      pb += b_step;
      slice([&] { st.fetch_full(pa, pb); }, std::true_type{}, true, off);
      off ^= kStage;
    }
    if (trips > 0) k0 = trips * BK;
  }
  for (; k0 < p.k; k0 += BK) {
    const bool more = k0 + BK < p.k;
    slice([&] { st.fetch_edge(k0 + BK); }, std::false_type{}, more, off);
    if (more) off ^= kStage;
  }
  // The output: c, or (split) this CTA's plane of the workspace.
  const GemmProblem out = kSplit ? planes_problem<float>(whole) : p;
  store_simt_tile<BM, BN>(out, acc, row0, col0, tx, ty);
}

}  // namespace

cudaError_t launch_gemm_simt(const GemmPlan& plan, const GemmProblem& p, cudaStream_t stream) {
  return with_layouts(plan.a_kmajor, plan.b_nmajor, [&](auto ak, auto bn) {
    constexpr bool AK = decltype(ak)::value, BNM = decltype(bn)::value;
    if (plan.tiled().bm == 128 && plan.tiled().bn == 128 && plan.tiled().bk == 8) {
      if (plan.tiled().split_k > 1)
        return launch_split_planes<float>(sgemm_simt<128, 128, 8, 2, AK, BNM, true>, plan.grid,
                                          plan.tiled().split_k, kSimtThreads, 0, stream, p);
      return launch_blocks(sgemm_simt<128, 128, 8, 2, AK, BNM, false>, plan.grid, kSimtThreads, 0,
                           stream, p);
    }
    if (plan.tiled().bm == 64 && plan.tiled().bn == 64 && plan.tiled().bk == 16) {
      if (plan.tiled().split_k > 1)
        return launch_split_planes<float>(sgemm_simt<64, 64, 16, 2, AK, BNM, true>, plan.grid,
                                          plan.tiled().split_k, kSimtThreads, 0, stream, p);
      return launch_blocks(sgemm_simt<64, 64, 16, 2, AK, BNM, false>, plan.grid, kSimtThreads, 0,
                           stream, p);
    }
    return cudaErrorInvalidValue;
  });
}

}  // namespace cuops::kernels::detail
