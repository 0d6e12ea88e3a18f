// float64 GEMM on the FP64 tensor cores (DMMA), float64 accumulation: mma.sync m16n8k8 on sm_90 (the
// same products in m8n8k4 pieces on sm_80-89, which lack that shape). Tiles (F64Tiling, below):
// 128 x 128 of 8 warps; 128 x 64, 64 x 64 and 32 x 64 of 4 warps, two or three blocks per SM, the
// shapes of cuBLAS's sm90 DGEMM (its warps keep the FP64 pipes 95 % busy, Nsight Compute); 16 x 128 of 8 warps for few-row products. Operands come in by cp.async
// over a shared-memory ring, each laid out as it is in global memory, so every layout is a straight
// 16-byte copy; an interior stage's copies are issued among the DMMAs of the stage before it, and the
// next stage's first fragments load under a stage's last DMMAs (the main loop below says why).
//
// Why this shape: a DMMA m16n8k4 is 512 FMAs, 16 cycles of its sub-partition's FP64 tensor pipe (the
// H100's 67 TFLOPS: 128 FP64 FMAs per clock per SM), so the pipe, not the issue slots or shared memory,
// sets the pace. What matters is that every SM's pipe always has independent MMAs waiting: 16 a warp
// per 4-deep step, and stages in flight to cover the loads from L2.
//
// k split (kSplit, any GPU): CTAs along y each multiply a slice of k into a plane of the workspace,
// which gemm.cuh's sum_planes adds in order into c (as kernels/gemm/gemm_simt.cu's).
#include "gemm.cuh"

namespace cuops::kernels::detail {
namespace {

// Each tile's shape: warps along m and n, k per ring stage, stages and blocks per SM. cuBLAS's sm90
// DGEMM picks small tiles of 4 warps, three blocks an SM, for all but the largest products
// (torch.profiler on the shape suite: 64 x 64 x 16 with 4 stages,
// 32 x 64 x 32, 32 x 32 x 32; 128 x 128 x 16 of 8 warps from ~28672 x 4096 up): the third block on an
// SM keeps its FP64 pipes fed while the other two wait on the ring, and more, smaller CTAs even out the
// last wave. Every tile multiplies in DMMA.16x8x8 steps, two or more a stage, so a warp holds two
// steps' fragments and the next step's (or the next stage's) loads run under the current step's
// DMMAs. (cuBLAS runs DMMA.16x8x16; its fragments, double-buffered, spill 128 x 64, and single-buffered
// on 64 x 64 and 32 x 64 they ran 4-25 % slower than k8 with the loads overlapped.)
//   128 x 128: 8 warps (2 x 4, each 64 x 32), 32 k a stage, 3 stages (216 KB), one block an SM; its 64
//     accumulators and double-buffered fragments fill a thread's 255 registers.
//   128 x 64: 4 warps (each 64 x 32), 4 stages (<= 100 KB with k-major operands swizzled, F64Smem),
//     two blocks (242-255 registers of 128 threads fill the register file twice over exactly).
//   64 x 64 and 32 x 64: 4 warps (32 x 32, 16 x 32), three blocks an SM (168 registers at most),
//     rings of 4 x <= 17 and 5 x <= 13 KB. The deeper rings (against 3 and 4 stages of padded rows)
//     ran 3-7 % faster where an operand is k-major, 1 % where neither is.
//   32 x 32: 4 warps (each 16 x 16), 32 k a stage, 4 stages, three blocks: twice 32 x 64's CTAs where
//     its tiles leave most SMs idle over a short k (gpt-2's 128 x 768 x 768: 48 CTAs of 32 x 64), a
//     barrier per 8 DMMAs of a warp (16 k a stage: per 4).
//   16 x 128: 8 warps (1 x 8, each 16 x 16) for few-row products (decode: the weight streamed, the
//     tensor pipe mostly idle), two blocks.
template <int WM_, int WN_, int BK, int STAGES, int BLOCKS, bool SWIZZLE> struct F64Shape {
  static constexpr int kWM = WM_, kWN = WN_, kThreads = 32 * WM_ * WN_;
  static constexpr int kBK = BK, kStages = STAGES, kMinBlocks = BLOCKS;
  static constexpr bool kSwizzle = SWIZZLE;
};
template <int BM, int BN> struct F64Tiling;
template <> struct F64Tiling<128, 128> : F64Shape<2, 4, 32, 3, 1, false> {};
template <> struct F64Tiling<128, 64> : F64Shape<2, 2, 16, 4, 2, true> {};
template <> struct F64Tiling<64, 64> : F64Shape<2, 2, 16, 4, 3, true> {};
template <> struct F64Tiling<32, 64> : F64Shape<2, 2, 16, 5, 3, true> {};
template <> struct F64Tiling<32, 32> : F64Shape<2, 2, 32, 4, 3, true> {};
template <> struct F64Tiling<16, 128> : F64Shape<1, 8, 16, 4, 2, false> {};

// One stage's operands, each stored row as it lies in global memory. The fragment reads are 8-byte
// loads, served half a warp per wavefront, and lanes (g, t) of a half warp (g = 0..3, t = 0..3) read
// element (g, t) of a 4 x 4 block of stored rows (or (t, g)), the block's corner at a row and a column
// that are multiples of 4. Two layouts keep those 16 reads on 16 distinct 8-byte slots of the 32 banks:
//   padded: rows ld = 4 (mod 16) doubles apart (slot g * ld + t);
//   swizzled: rows of the stored width (a multiple of 16 doubles), element (r, c) at column
//     c ^ 4 (r % 4), i.e. the 16-byte chunk index XOR 2 (r % 4), so the four rows' two chunks land on
//     eight distinct chunk positions of a 128-byte bank line.
// Padding a k-major operand's 16-wide rows costs a quarter of its stage, an m- or n-major one's 32- to
// 128-wide rows 3-12 %; a swizzled operand costs registers instead (four row bases, Frag below). So the
// 4-warp tiles (kSwizzle) swizzle their k-major operands and pad the others, which fits cuBLAS's ring
// depth in every layout: 64 x 64 4 stages of <= 17 KB for three blocks an SM (padded: 3 of <= 20 KB);
// 128 x 64 4 of <= 25 KB for two (3 of <= 30 KB); 32 x 64 5 of <= 13 KB (4 of <= 15 KB).
// Row pitches stay 16-byte multiples and chunks stay whole (the XOR moves whole chunks) for cp.async.
// The 128 x 128 tile's 32-deep stages: one barrier per 32 DMMAs of a warp (at 16 deep it ran 0.73x
// cuBLAS); its 3 stages of 66-72 KB (64 KB unpadded) fill the SM either way, so it keeps the padded rows.
template <int BM, int BN, bool AK, bool BNM> struct F64Smem {
  static constexpr int kBK = F64Tiling<BM, BN>::kBK;
  static constexpr bool kASwz = F64Tiling<BM, BN>::kSwizzle && AK,
                        kBSwz = F64Tiling<BM, BN>::kSwizzle && !BNM;
  static constexpr int kALd =
      (AK ? kBK : BM) + (kASwz ? 0 : 4);  // AK: [BM][kALd] (k inner); else [BK][kALd]
  static constexpr int kBLd =
      (BNM ? BN : kBK) + (kBSwz ? 0 : 4);  // BNM: [BK][kBLd] (n inner); else [BN][kBLd]
  static_assert(kALd % 16 == (kASwz ? 0 : 4) && kBLd % 16 == (kBSwz ? 0 : 4),
                "conflict-free fragment reads");
  static constexpr int kA = AK ? BM * kALd : kBK * kALd;
  static constexpr int kB = BNM ? kBK * kBLd : BN * kBLd;
  static constexpr int kStage = kA + kB;  // doubles
  static constexpr int kStages = F64Tiling<BM, BN>::kStages;
  static constexpr int kBytes = kStages * kStage * 8;
  // The blocks an SM is meant to hold fit its 227 KB (plus 1 KB the runtime reserves per block).
  static_assert(F64Tiling<BM, BN>::kMinBlocks * (kBytes + 1024) <= 228 * 1024,
                "ring too large for its blocks");

  // A thread's fragment reads: element (w_r + rl + R, w_c + cl + C) of a stored operand, with w_r, w_c
  // the warp's corner (multiples of 16), rl, cl the lane's part (g or t) and R, C constants of the
  // unrolled loop (multiples of 4). Swizzled, the column's bits 2-3 mix with the row's, so the lane's
  // offset depends on C / 4 mod 4: base[u] holds it for each u, set once, and a read is base[u] plus
  // a constant (ptxas otherwise rebuilt every address in the main loop: 50-80 % more instructions
  // there). Padded, base[u] = base[0] + 4 u, which the compiler folds into the constant.
  template <bool SWZ> struct Frag {
    int base[4];
    __device__ Frag(int w_r, int rl, int w_c, int cl, int ld) {
#pragma unroll
      for (int u = 0; u < 4; ++u)
        base[u] = (w_r + rl) * ld + w_c + (SWZ ? (4 * u + cl) ^ ((rl & 3) << 2) : 4 * u + cl);
    }
    __device__ int at(int R, int C, int ld) const {
      return base[(C >> 2) & 3] + R * ld + (C & ~15);
    }
  };
  using AFrag = Frag<kASwz>;
  using BFrag = Frag<kBSwz>;
  // A's and B's fragment readers for lane (g, t) of a warp whose tile starts at (wm0, wn0): A[m][k]
  // read at m = wm0 + g + R, k = t + C (AK, else stored transposed); B[k][n] at k = t + C, n = wn0 + g + R.
  __device__ static AFrag a_frag(int wm0, int g, int t) {
    return AK ? AFrag(wm0, g, 0, t, kALd) : AFrag(0, t, wm0, g, kALd);
  }
  __device__ static BFrag b_frag(int wn0, int g, int t) {
    return BNM ? BFrag(0, t, wn0, g, kBLd) : BFrag(wn0, g, 0, t, kBLd);
  }
  __device__ static double a(const double* as, const AFrag& f, int m, int k) {
    return as[AK ? f.at(m, k, kALd) : f.at(k, m, kALd)];
  }
  __device__ static double b(const double* bs, const BFrag& f, int k, int n) {
    return bs[BNM ? f.at(k, n, kBLd) : f.at(n, k, kBLd)];
  }
};

// The 16-byte copies of one operand's stage when the whole stage lies inside the matrix: OUTER
// stored rows of INNER doubles, ld apart in global memory, kLd apart in the stage. A thread's chunks
// are kRowsPerPass rows apart, so its addresses are one pointer and one stride, set once: an interior
// stage costs ~3 instructions a chunk instead of the ~45 of CUOPS_STAGE_OPERANDS's bounds, edge and
// 64-bit index arithmetic (which, issued by the warps that also feed the DMMAs, held the first
// version at 0.62x cuBLAS). Edge tiles and a ragged last slice keep the
// checked copy.
template <int OUTER, int INNER, int kLd, int THREADS, bool SWIZZLE> struct F64StageCopy {
  static constexpr int kRowChunks = INNER / 2, kChunks = OUTER * kRowChunks;
  static constexpr int kRowsPerPass = THREADS / kRowChunks;
  static constexpr int kPasses = (kChunks + THREADS - 1) / THREADS;
  static_assert(THREADS % kRowChunks == 0 && (kChunks % THREADS == 0 || kChunks < THREADS),
                "whole passes, or one partial pass");
  const double* src;  // this thread's first chunk at slice 0
  int64_t pass_step;  // elements between its chunks in global memory
  int row, col;       // its first chunk's stored row and column in the stage
  bool active;
  __device__ F64StageCopy(const double* tile, int64_t ld, int tid) {
    row = tid / kRowChunks, col = (tid % kRowChunks) * 2;
    src = tile + row * ld + col;
    pass_step = kRowsPerPass * ld;
    active = kChunks % THREADS == 0 || tid < kChunks;
  }
  // advance: elements from slice 0 to this slice (kBK along a stored row, or kBK rows).
  __device__ __forceinline__ void copy(double* stage, int64_t advance) const {
#pragma unroll
    for (int i = 0; i < kPasses; ++i) pass(stage, advance, i);
  }
  // The i-th of a thread's kPasses chunks (i a constant once unrolled). Swizzled, a chunk's column
  // depends on its row mod 4, the same for all passes when they are a multiple of 4 rows apart.
  __device__ __forceinline__ void pass(double* stage, int64_t advance, int i) const {
    const int r = kRowsPerPass % 4 == 0 ? row : row + i * kRowsPerPass;
    const int dst = r * kLd + (SWIZZLE ? col ^ ((r & 3) << 2) : col);
    if (active)
      cp_async16(stage + dst + (kRowsPerPass % 4 == 0 ? i * kRowsPerPass * kLd : 0),
                 src + advance + i * pass_step, 16);
  }
};

// A thread's part of the tile's product, multiplied a stage at a time in DMMA.16x8x8 steps: views of
// the kernel's accumulators, its two fragment buffers and its warp's fragment readers.
// A stage's product is software-pipelined: step s + 1's fragments (24 loads for the 64 x 32 warp
// tile) come in while step s's DMMAs run, so no warp waits on shared memory between its DMMAs
// (loading a 16-deep slice's 48 fragments, then multiplying, ran 0.80x cuBLAS at 4096^3 with one
// block of 8 warps). Across stages too ("crossing"): the ring's wait and barrier sit before a stage's
// last step, and the next stage's first fragments load under that step's DMMAs, as CUTLASS's
// multistage mainloop does. Without it, a warp issued a stage's last DMMA, then waited at the barrier
// and on the next stage's first loads with at most a DMMA or two left in its pipe: a bubble every
// stage that an SM's other blocks filled only in part (Nsight Compute: 26 % of 128 x 64's samples
// before a stage's first DMMA). Crossing ran 5-10 % faster on the 128-row tiles, and 128 x 64 alone
// on its SM (1024^3, cuBLAS's grid there) 0.81 -> 1.00x cuBLAS.
// It holds references: the arrays are the kernel's locals.
template <int BM, int BN, bool AK, bool BNM> struct F64Product {
  using S = F64Smem<BM, BN, AK, BNM>;
  static constexpr int WM = F64Tiling<BM, BN>::kWM, WN = F64Tiling<BM, BN>::kWN;
  static constexpr int kMmaK = 8;  // DMMA.16x8x8 steps (F64Tiling says why)
  static constexpr int MI = BM / WM / 16, NI = BN / WN / 8;  // m16 and n8 blocks per warp
  static_assert(MI >= 1 && NI >= 1 && BM % (16 * WM) == 0 && BN % (8 * WN) == 0,
                "whole MMA blocks per warp");
  static_assert((BM / WM) % 16 == 0 && (BN / WN) % 16 == 0,
                "warp corners leave the swizzled bits alone");
  static constexpr int kSteps = S::kBK / kMmaK;
  static_assert(kSteps % 2 == 0,
                "a stage's steps alternate the two buffers, the next stage starts in buffer 0");
  using Acc = double[MI][NI][4];
  using FragsA = double[2][MI][kMmaK / 2];
  using FragsB = double[2][NI][kMmaK / 4];

  Acc& acc;
  FragsA& fa;
  FragsB& fb;
  const typename S::AFrag& frag_a;
  const typename S::BFrag& frag_b;

  // Step ks's fragments of the stage at `as` into buffer buf.
  __device__ __forceinline__ void load_step(int buf, const double* as, int ks) {
    const double* bs = as + S::kA;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int i = 0; i < kMmaK / 2; ++i)
        fa[buf][mi][i] = S::a(as, frag_a, mi * 16 + 8 * (i % 2), ks + 4 * (i / 2));
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int j = 0; j < kMmaK / 4; ++j) fb[buf][ni][j] = S::b(bs, frag_b, ks + 4 * j, ni * 8);
  }

  // A stage's product, between(rows, q) after the DMMAs of its q-th row of blocks (q < rows, a
  // constant once unrolled); crossing, it ends with the next stage's first fragments in buffer 0.
  template <typename Crossing, typename Between>
  __device__ __forceinline__ void multiply(Crossing, const double* as, const double* next_as,
                                           Between&& between) {
    constexpr bool kX = Crossing::value;
    constexpr int kRows = (kX ? kSteps - 1 : kSteps) * MI;
    if constexpr (!kX) load_step(0, as, 0);
#pragma unroll
    for (int st = 0; st < kSteps; ++st) {
      if (st + 1 < kSteps) {
        load_step((st + 1) % 2, as, kMmaK * (st + 1));
      } else if constexpr (kX) {
        cp_async_commit();
        cp_async_wait<S::kStages - 2>();
        __syncthreads();  // the next stage has landed; every warp holds its last fragments of this one
        // Unguarded (crossing stops short of the last stage): with a guard the loads were predicated
        // and ptxas hoisted all but two of the step's DMMAs above the barrier, leaving nothing to
        // cover them (128 x 64 at 1024^3: 1.00 -> 0.91x cuBLAS).
        load_step(0, next_as, 0);
      }
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) mma_f64_k8(acc[mi][ni], fa[st % 2][mi], fb[st % 2][ni]);
        if (st * MI + mi < kRows) between(std::integral_constant<int, kRows>{}, st * MI + mi);
      }
    }
  }
};

// f(row, col, v0, v1) for each pair of a thread's results: acc[mi][ni][2 h + j] is element
// (wm0 + 16 mi + g + 8 h, wn0 + 8 ni + 2 t + j) of the tile. f by value: taken by reference, the
// 64 x 64 instances compiled to other code.
template <int MI, int NI, typename F>
__device__ __forceinline__ void each_pair(const double (&acc)[MI][NI][4], int wm0, int wn0, int g,
                                          int t, F f) {
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        f(wm0 + mi * 16 + g + 8 * h, wn0 + ni * 8 + 2 * t, acc[mi][ni][2 * h],
          acc[mi][ni][2 * h + 1]);
}

template <int BM, int BN, bool AK, bool BNM, bool kSplit>
__global__ void __launch_bounds__(F64Tiling<BM, BN>::kThreads, F64Tiling<BM, BN>::kMinBlocks)
    dgemm_mma(const GemmProblem whole) {
  using S = F64Smem<BM, BN, AK, BNM>;
  using T = F64Tiling<BM, BN>;
  using Product = F64Product<BM, BN, AK, BNM>;
  constexpr int kThreads = T::kThreads, WM = T::kWM, WN = T::kWN;  // warps along m and n
  extern __shared__ __align__(16) double smem_f64[];
  GemmProblem p = whole;
  if constexpr (kSplit) take_k_slice<double, S::kBK, AK, BNM>(p);
  const double* A = static_cast<const double*>(p.a);
  const double* B = static_cast<const double*>(p.b);
  int64_t tm, tn;
  tile_coords<8>((p.m + BM - 1) / BM, (p.n + BN - 1) / BN, tm, tn);
  const int64_t row0 = tm * BM, col0 = tn * BN;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;
  const int wm0 = (warp / WN) * (BM / WM), wn0 = (warp % WN) * (BN / WN);  // the warp tile's corner
  const typename S::AFrag frag_a = S::a_frag(wm0, g, t);
  const typename S::BFrag frag_b = S::b_frag(wn0, g, t);
  const int64_t ktiles = (p.k + S::kBK - 1) / S::kBK;

  // Interior tiles copy every whole 16-deep slice unchecked (F64StageCopy); the rest, checked.
  const int64_t fast_ktiles = row0 + BM <= p.m && col0 + BN <= p.n ? p.k / S::kBK : 0;
  using CopyA = std::conditional_t<AK, F64StageCopy<BM, S::kBK, S::kALd, kThreads, S::kASwz>,
                                   F64StageCopy<S::kBK, BM, S::kALd, kThreads, S::kASwz>>;
  using CopyB = std::conditional_t<BNM, F64StageCopy<S::kBK, BN, S::kBLd, kThreads, S::kBSwz>,
                                   F64StageCopy<BN, S::kBK, S::kBLd, kThreads, S::kBSwz>>;
  const CopyA copy_a(AK ? A + row0 * p.lda : A + row0, p.lda, tid);
  const CopyB copy_b(BNM ? B + col0 : B + col0 * p.ldb, p.ldb, tid);

  auto load_stage = [&](int stage, int64_t kt) {
    const int64_t k0 = kt * S::kBK;
    double* as = smem_f64 + stage * S::kStage;
    double* bs = as + S::kA;
    if (kt < fast_ktiles) {
      copy_a.copy(as, AK ? k0 : k0 * p.lda);
      copy_b.copy(bs, BNM ? k0 * p.ldb : k0);
      return;
    }
    CUOPS_STAGE_OPERANDS(double, BM, BN, S::kBK, kThreads, AK, BNM, p, A, B, as, S::kALd, bs,
                         S::kBLd, row0, col0, k0, tid, S::kASwz, S::kBSwz);
  };

  double acc[Product::MI][Product::NI][4] = {};
  typename Product::FragsA fa;
  typename Product::FragsB fb;
  Product prod{acc, fa, fb, frag_a, frag_b};

  // The cp.async ring (as cp_async_ring), with an interior stage's copies spread over the product of
  // the stage before it: a warp that issued them all at once (~25 % of its time in Nsight Compute,
  // waiting on its own copies' register reads and the LSU queue) left its sub-partition's FP64 pipe to
  // the other warp; between DMMA rows they take the issue slots of the NOPs ptxas puts between DMMAs,
  // as cuBLAS's loop does. Crossing, they go in the steps before the last, so the stage's group is
  // committed before its barrier. Stage indices counted, not divided (64-bit % 3 was ~15 instructions).
  constexpr int kCopies = CopyA::kPasses + CopyB::kPasses;
  // The copies of the stage at k0 into ws: the c-th of a thread's kCopies after row q of `rows`.
  auto copies = [&](double* ws, int64_t k0) {
    return [&, ws, k0](auto rows, int q) {
      constexpr int kRows = decltype(rows)::value;
#pragma unroll
      for (int c = q * kCopies / kRows; c < (q + 1) * kCopies / kRows; ++c) {
        if (c < CopyA::kPasses) {
          copy_a.pass(ws, AK ? k0 : k0 * p.lda, c);
        } else {
          copy_b.pass(ws + S::kA, BNM ? k0 * p.ldb : k0, c - CopyA::kPasses);
        }
      }
    };
  };
  auto no_copies = [](auto, int) {};

#pragma unroll
  for (int st = 0; st < S::kStages - 1; ++st) {
    if (st < ktiles) load_stage(st, st);
    cp_async_commit();
  }
  int read = 0, write = S::kStages - 1;
  int64_t kt = 0;
  auto advance = [&] {
    read = read + 1 == S::kStages ? 0 : read + 1;
    write = write + 1 == S::kStages ? 0 : write + 1;
  };
  // The stages whose next stage is copied unchecked cross; the rest (the ring's last stages, an edge
  // tile's, a ragged last slice's) run the second loop. Its checked copies see no fragments held
  // across the barrier: with them held there, the checked copy's address arithmetic spilled 150-400
  // bytes in every 128-row instance. (Crossing the ring's last stages too, in a loop of their own,
  // spilled into 64 x 64's main loop in the kk layout.)
  const int64_t crossing = fast_ktiles - (S::kStages - 1);
  if (crossing > 0) {
    cp_async_wait<S::kStages - 2>();
    __syncthreads();
    prod.load_step(0, smem_f64, 0);
    for (; kt < crossing; ++kt) {
      const int64_t next = kt + S::kStages - 1;
      const double* as = smem_f64 + read * S::kStage;
      const double* next_as = smem_f64 + (read + 1 == S::kStages ? 0 : read + 1) * S::kStage;
      prod.multiply(std::true_type{}, as, next_as,
                    copies(smem_f64 + write * S::kStage, next * S::kBK));
      advance();
    }
  }
  for (; kt < ktiles; ++kt) {
    cp_async_wait<S::kStages - 2>();
    __syncthreads();  // stage `write` (read at the last trip) is free; stage `read` has landed
    const int64_t next = kt + S::kStages - 1;
    if (next < ktiles) load_stage(write, next);  // checked: the interior stages crossed above
    const double* as = smem_f64 + read * S::kStage;
    prod.multiply(std::false_type{}, as, as, no_copies);
    cp_async_commit();
    advance();
  }
  cp_async_wait<0>();
  // The output: c, or (split) this CTA's plane of the workspace.
  const GemmProblem out = kSplit ? planes_problem<double>(whole) : p;
  each_pair(acc, wm0, wn0, g, t, [&](int r, int c, double v0, double v1) {
    Epilogue::pair<double>(out, row0 + r, col0 + c, v0, v1);
  });
}

template <int BM, int BN, bool AK, bool BNM>
cudaError_t launch_f64(const GemmPlan& plan, const GemmProblem& p, cudaStream_t stream) {
  constexpr int smem = F64Smem<BM, BN, AK, BNM>::kBytes, threads = F64Tiling<BM, BN>::kThreads;
  // Every block an SM is meant to hold needs the whole carveout for shared memory (the rings bypass L1).
  auto kernel = plan.tiled().split_k <= 1 ? dgemm_mma<BM, BN, AK, BNM, false>
                                          : dgemm_mma<BM, BN, AK, BNM, true>;
  const cudaError_t err = cudaFuncSetAttribute(
      kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  if (err != cudaSuccess) return err;
  if (plan.tiled().split_k <= 1)
    return launch_blocks(dgemm_mma<BM, BN, AK, BNM, false>, plan.grid, threads, smem, stream, p);
  return launch_split_planes<double>(dgemm_mma<BM, BN, AK, BNM, true>, plan.grid,
                                     plan.tiled().split_k, threads, smem, stream, p);
}

}  // namespace

cudaError_t launch_gemm_mma_f64(const GemmPlan& plan, const GemmProblem& p, cudaStream_t stream) {
  return with_layouts(plan.a_kmajor, plan.b_nmajor, [&](auto ak, auto bn) {
    constexpr bool AK = decltype(ak)::value, BNM = decltype(bn)::value;
    if (plan.tiled().bm == 128 && plan.tiled().bn == 128)
      return launch_f64<128, 128, AK, BNM>(plan, p, stream);
    if (plan.tiled().bm == 128 && plan.tiled().bn == 64)
      return launch_f64<128, 64, AK, BNM>(plan, p, stream);
    if (plan.tiled().bm == 64 && plan.tiled().bn == 64)
      return launch_f64<64, 64, AK, BNM>(plan, p, stream);
    if (plan.tiled().bm == 32 && plan.tiled().bn == 64)
      return launch_f64<32, 64, AK, BNM>(plan, p, stream);
    if (plan.tiled().bm == 32 && plan.tiled().bn == 32)
      return launch_f64<32, 32, AK, BNM>(plan, p, stream);
    if (plan.tiled().bm == 16 && plan.tiled().bn == 128)
      return launch_f64<16, 128, AK, BNM>(plan, p, stream);
    return cudaErrorInvalidValue;
  });
}

bool dmma_runs_on(int dev, bool& wide) {
  // At least 160 KB of opt-in shared memory: the A100 (163 KB) and H100 (227 KB), not the 99 KB of
  // sm_86/89/120 GPUs, whose FP64 tensor path is a fraction of a percent of theirs anyway. The
  // 128 x 128 tile's 216 KB: the H100's.
  int major = 0, smem_optin = 0;
  wide = false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) !=
          cudaSuccess ||
      major < 8 || smem_optin < 160 * 1024) {
    (void)cudaGetLastError();
    return false;
  }
  // The code the runtime runs here must have been compiled for sm_80 or later: ptxVersion, not
  // binaryVersion (code JIT-compiled from older PTX reports the GPU's binary version, but holds the
  // trapping body).
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, dgemm_mma<64, 64, true, true, false>) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  wide = smem_optin >= F64Smem<128, 128, true, false>::kBytes && attr.ptxVersion >= 80;
  return attr.ptxVersion >= 80;
}

}  // namespace cuops::kernels::detail
