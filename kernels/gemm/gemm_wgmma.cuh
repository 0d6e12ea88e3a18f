// Hopper GEMM (sm_90a): operands brought in by the bulk tensor copy engine (TMA) into 128-byte
// swizzled shared memory over a multi-stage mbarrier ring, multiplied by wgmma with float32
// accumulators. Warp-specialised: warpgroup 0 is the producer (one thread issues the copies; the
// group gives its registers to the others with setmaxnreg), the others (two, or three for the 192-row
// tile) each compute 64 rows of the BM x BN block tile. Persistent: one block per SM walks the tiles in
// grouped order, so the producer already fills the ring for the next tile while the consumers run the
// epilogue.
// bfloat16 / float16 take all four layouts (wgmma transposes m-major A and n-major B itself). float32
// runs as TF32 (torch's "high" precision), whose wgmma reads shared operands k-major only: a k-major A
// comes from shared memory, an m-major one from registers (each consumer loads its fragments from the
// swizzled m-major tile), and B must be k-major. The usual row-major a and b (B n-major) run as the
// transposed problem C^T = B^T A^T, B^T from registers, with the epilogue storing the transpose: no
// operand is copied. The epilogue applies alpha/beta and rounds once to the output type; the fused
// ops' epilogues (gemm_wgmma_fused: linear's bias and activation, swiglu's dual GEMM) apply theirs
// (epilogue.cuh). The tile, cluster, grid and epilogue come from the plan (gemm_plan.cpp says why).
// This header holds the kernel and its launch templates; each of gemm_wgmma_{bf16,f16,tf32}.cu
// instantiates one dtype's plain instances and gemm_wgmma_fused_{bf16,f16}.cu the fused ones
// (compiler runs in parallel: the one file took 49 s on the H100 machine, the longest step of the
// build), gemm_wgmma.cu dispatches. Included only where CMake compiles for compute_90a
// (CUOPS_WGMMA_BUILD).
#pragma once

#include "gemm.cuh"
#include "wgmma.cuh"

namespace cuops::kernels::detail {

namespace {

// The block tile's rows: BM = 128 (two consumer warpgroups of 64 rows) or 192 (three). cuBLAS runs
// 192-row tiles where they make one full wave of a long reduction (the c_attn weight gradient
// 3072 x 1024 x 8192: 128 tiles of 192 x 128 where 128 x 128 leaves 1.45 waves).
// The producer warpgroup gives its registers to the consumers with setmaxnreg: 128 * 40 + 256 * 232 and
// 128 * 40 + 384 * 152 fit the SM's 65536.
template <int BM> struct WgShape {
  static_assert(BM == 128 || BM == 192, "two or three consumer warpgroups");
  static constexpr int kConsumers = BM / 64, kThreads = 128 * (1 + kConsumers);
  static constexpr int kProducerRegs = 40, kConsumerRegs = BM == 128 ? 232 : 152;
  // Named barriers: 1 + cw for consumer cw's epilogue, kAll for all consumers together.
  static constexpr int kAll = 1 + kConsumers;
};

// Geometry of one ring stage: A BM x BK and B BN x BK, BK = one 128-byte swizzle row of k. Each
// operand is a set of boxes of 64 rows (or its whole k-major extent) that TMA writes with the
// 128-byte swizzle wgmma's descriptors name; every box starts 1024-byte aligned.
// 16-bit outputs leave through shared memory (kCBytes: the BM x BN tile, as boxes of 64 x 64) by
// TMA stores that run on while the consumers start the next tile: the stores of the direct epilogue
// cost 10-13 % of the time at 4096^3-8192^3. float32 (TF32) results would need 128 KiB
// there, so they are stored directly.
template <typename T, int BM, int BN> struct WgCfg {
  static constexpr int kBK = 128 / static_cast<int>(sizeof(T));
  static constexpr int kABytes = BM * 128, kBBytes = BN * 128;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr bool kTmaStore = sizeof(T) == 2;
  // The output tile leaves in kCSplit parts through a buffer of 1 / kCSplit of it: at 128 x 256 half
  // (32 KiB), so the ring keeps 4 stages instead of 3; at 192 x 128 half (24 KiB),
  // 5 stages of 40 KiB instead of 4.
  static constexpr int kCSplit = BN == 256 || BM == 192 ? 2 : 1;
  static constexpr int kCBytes = kTmaStore ? BM * BN * 2 / kCSplit : 0;
  // 128 rows: 4 stages of 48 KiB, 6 of 32 KiB or 8 of 24 KiB beside the output buffer; 4 of 48 KiB
  // without it. 192 x 128: 5 of 40 KiB.
  static constexpr int kStages = (225 * 1024 - kCBytes) / kStageBytes;
  static constexpr int kSmem =
      kStages * kStageBytes + kCBytes + 1024 + 2 * kStages * 8;  // + alignment, barriers
  static_assert(kSmem <= 227 * 1024, "one block per SM's shared memory");
};

// kCM: CTAs per cluster along m (1 or 2). In a pair, both CTAs compute tiles of the same columns
// (rows 128 apart), so each loads half of the shared B tile and multicasts it to both: a third less
// traffic from L2 for 128 x 256 tiles. Each stage is then released to the producers of both CTAs.
// TF32 with A from registers (kRS, below): the row of the consumer's 64 that fragment row lane / 4 of
// warp `warp` (second: lane / 4 + 8) is loaded from and its results stored to. Warp w reads box w / 2
// of the consumer's two 32-row boxes, at rows 8 (w % 2) + {0..7, 16..23} rather than 16 (w % 2) + 0..15:
// then a load's 32 lanes (8 rows x 4 k) cover 8 distinct 16-byte chunks under the 128-byte swizzle
// (chunk q of k-row x sits at q ^ (x % 8)), where 16 consecutive rows span only 4. The two rows of a
// lane are adjacent, so its transposed stores write 8-byte pairs (half the store transactions), at the
// price of 2 lanes to a bank on the loads: 0.957x -> 1.048x cuBLAS at 4096^3.
__device__ __forceinline__ int rs_row(int warp, int lane, int second) {
  const int base = (warp / 2) * 32 + 8 * (warp % 2) + 16 * (lane / 16);
  return base + 2 * ((lane / 4) % 4) + second;
}

// A position in the ring of kStages stages: the stage, and the parity of its current use. The
// producer and both consumer paths count k-tiles through it the same way.
template <int kStages> struct WgRing {
  uint32_t stage = 0, phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == kStages) stage = 0, phase ^= 1;
  }
};

// The split tail (GemmPlan::tail_units, tail_split; kCM = 1, no cluster split): the walk's last
// `units` tiles (the partial last wave) are each cut into `split` runs of k-tiles, CTA b taking run
// b / units of tile b % units, so the CTAs that run at once read the same k-slices of neighbouring
// tiles (L2 serves the shared panels, as in the data-parallel waves). Stream-K's contiguous runs over
// the flattened (tile, k-tile) sequence, tried first, put every CTA at another k: each B panel then
// came from HBM once per tile row, and it ran 0.3-0.9x the data-parallel tiles on the bf16 suite
// (docs/performance.md, "split tail"). A run past the first is a
// Tail: its sums go to the workspace, slot b, then its flag; the first run is the Head: it waits for
// its tile's other runs (CTAs b + units, b + 2 units, ...: all resident, grid <= SMs, and none of them
// waits) and adds them in run order before the epilogue: the same bits on every run.
// part: G x kConsumers x (BN / 8) x 128 float4 (a BM x BN float tile each) in accumulator-fragment
// order (each thread writes and reads only its own, coalesced); flags: G ints, zeroed before the launch.
struct WgTail {
  float4* part;
  int* flags;
  int64_t units;
  int split;
};
enum class WgPart { Whole, Head, Tail };

// This CTA's work in order: f(unit, kt0, ktiles, part) for each whole unit of the data-parallel walk
// (from first_unit by unit_step, k-tiles kt0 .. kt0 + ktiles - 1: a cluster split's slice), then its
// run of a tail tile.
template <typename F>
__device__ __forceinline__ void walk_units(int64_t units, int64_t first_unit, int64_t unit_step,
                                           int kt0, int ktiles, const WgTail& tail, F&& f) {
  const int64_t dp = units - tail.units;
  for (int64_t u = first_unit; u < dp; u += unit_step) f(u, kt0, ktiles, WgPart::Whole);
  if (tail.units <= 0 || blockIdx.x >= tail.units * tail.split) return;
  // 32-bit: tail.units <= the grid (<= SMs), split <= 16 and ktiles <= 2^26 (k <= INT32_MAX: tma_describes),
  // so ktiles x (run + 1) < 2^32
  // (in 64 bits the Tails' first load came ~0.15 us later: 1.07 -> 0.92 us after entry).
  const uint32_t units32 = static_cast<uint32_t>(tail.units),
                 split = static_cast<uint32_t>(tail.split);
  const uint32_t run = blockIdx.x / units32, kt = static_cast<uint32_t>(ktiles);
  const int k0 = static_cast<int>(kt * run / split), k1 = static_cast<int>(kt * (run + 1) / split);
  f(dp + blockIdx.x % units32, k0, k1 - k0,
    tail.split == 1 ? WgPart::Whole
    : run == 0      ? WgPart::Head
                    : WgPart::Tail);
}

__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// A Tail's sums into this CTA's slot, then its flag (after all consumers' stores: named barrier kAll).
template <int BM, int BN> __device__ __forceinline__ void tail_put(const WgTail& tail,
                                                                   const float (&d)[BN / 2], int cw,
                                                                   int tid) {
  using Sh = WgShape<BM>;
  float4* slot = tail.part + (int64_t{blockIdx.x} * Sh::kConsumers + cw) * (BN / 8) * 128 + tid;
#pragma unroll
  for (int q = 0; q < BN / 8; ++q)
    __stcg(slot + q * 128, make_float4(d[4 * q], d[4 * q + 1], d[4 * q + 2], d[4 * q + 3]));
  __threadfence();
  wg::named_sync(Sh::kAll, 128 * Sh::kConsumers);
  if (cw == 0 && tid == 0) st_release(tail.flags + blockIdx.x, 1);
}

// A Head's tile: wait for its other runs' slots (CTAs blockIdx.x + r units) and add them to d in run
// order.
template <int BM, int BN>
__device__ __forceinline__ void tail_add(const WgTail& tail, float (&d)[BN / 2], int cw, int tid) {
  using Sh = WgShape<BM>;
  // Each run's flag polled by its own thread: one round trip, where one thread polling them in turn
  // waited one round trip per run (128 x 768 x 3072 on 12 tiles x 11 runs: 17.4 -> 15.3 us).
  if (cw == 0 && tid + 1 < tail.split) {
    while (ld_acquire(tail.flags + blockIdx.x + (tid + 1) * tail.units) == 0) __nanosleep(32);
  }
  wg::named_sync(Sh::kAll, 128 * Sh::kConsumers);
  for (int r = 1; r < tail.split; ++r) {
    const float4* slot =
        tail.part + ((blockIdx.x + r * tail.units) * Sh::kConsumers + cw) * (BN / 8) * 128 + tid;
    constexpr int kBatch =
        BN / 8 < 16 ? BN / 8 : 16;  // loads in flight, within the consumer's registers
#pragma unroll
    for (int q0 = 0; q0 < BN / 8; q0 += kBatch) {
      float4 v[kBatch];
#pragma unroll
      for (int q = 0; q < kBatch; ++q) v[q] = __ldcg(slot + (q0 + q) * 128);
#pragma unroll
      for (int q = 0; q < kBatch; ++q) {
        float* e = d + 4 * (q0 + q);
        e[0] += v[q].x, e[1] += v[q].y, e[2] += v[q].z, e[3] += v[q].w;
      }
    }
  }
}

// The producer thread: k-tiles kt0 .. kt0 + ktiles - 1 of the unit whose tile starts at (row0, col0),
// each into the next free stage (waited on with the parity of the use before: for a fresh barrier that
// preceding phase counts as complete, so the first kStages waits return at once).
// The dual GEMM (kDual: B k-major, map_b2 the second weight): the B tile's first BN / 2 rows are
// map_b's rows col0 .. col0 + BN / 2 - 1, the rest map_b2's same rows (a pair's CTAs load one each).
// kGrouped (the grouped kernel, single CTAs): map_b (and map_b2) are 3-D, one matrix an expert, and
// B's boxes come from matrix `expert`.
template <typename T, int BM, int BN, bool AK, bool BNM, int kCM, bool kDual = false,
          bool kGrouped = false>
__device__ __forceinline__ void load_unit(const CUtensorMap& map_a, const CUtensorMap& map_b,
                                          int row0, int col0, int kt0, int ktiles, uint32_t base_s,
                                          uint32_t full_s, uint32_t empty_s, uint32_t rank,
                                          WgRing<WgCfg<T, BM, BN>::kStages>& ring,
                                          const CUtensorMap* map_b2 = nullptr, int expert = 0,
                                          int k_off = 0) {
  static_assert(!kGrouped || kCM == 1, "the grouped kernel runs single CTAs");
  using Cfg = WgCfg<T, BM, BN>;
  constexpr int kConsumers = WgShape<BM>::kConsumers;
  constexpr bool kRS = std::is_same_v<T, float> && !AK;
  for (int kt = 0; kt < ktiles; ++kt) {
    wg::mbar_wait(empty_s + 8 * ring.stage, ring.phase ^ 1);
    const uint32_t sa = base_s + ring.stage * Cfg::kStageBytes, sb = sa + Cfg::kABytes,
                   bar = full_s + 8 * ring.stage;
    wg::mbar_expect_tx(bar, Cfg::kStageBytes);
    const int k0 = (kt0 + kt) * Cfg::kBK + k_off;
    if constexpr (AK) {
      wg::tma_load(sa, &map_a, k0, row0, bar);
    } else if constexpr (kRS) {  // boxes of 32 m x 32 k, two per consumer
#pragma unroll
      for (int i = 0; i < 2 * kConsumers; ++i)
        wg::tma_load(sa + i * 4096, &map_a, row0 + 32 * i, k0, bar);
    } else {  // boxes of 64 m x 64 k, one per consumer
#pragma unroll
      for (int i = 0; i < kConsumers; ++i)
        wg::tma_load(sa + i * 8192, &map_a, row0 + 64 * i, k0, bar);
    }
    // This CTA's share of B: all of it, or (in a pair) half, multicast to both.
    auto load_b = [&](uint32_t dst, int c0, int c1) {
      if constexpr (kGrouped) {
        wg::tma_load3(dst, &map_b, c0, c1, expert, bar);
      } else if constexpr (kCM == 1) {
        wg::tma_load(dst, &map_b, c0, c1, bar);
      } else {
        wg::tma_load_multicast(dst, &map_b, c0, c1, bar, (1u << kCM) - 1);
      }
    };
    if constexpr (kDual) {
      static_assert(!BNM && (kCM == 1 || kCM == 2), "the dual GEMM reads nn.Linear's weights");
      if constexpr (kGrouped) {
        wg::tma_load3(sb, &map_b, k0, col0, expert, bar);
        wg::tma_load3(sb + (BN / 2) * 128, map_b2, k0, col0, expert, bar);
      } else if constexpr (kCM == 1) {
        wg::tma_load(sb, &map_b, k0, col0, bar);
        wg::tma_load(sb + (BN / 2) * 128, map_b2, k0, col0, bar);
      } else {
        wg::tma_load_multicast(sb + rank * (BN / 2) * 128, rank == 0 ? &map_b : map_b2, k0, col0,
                               bar, (1u << kCM) - 1);
      }
    } else if constexpr (BNM) {  // boxes of 64 n x 64 k, 8 KiB apart
      constexpr int kBoxes = BN / 64 / kCM;
#pragma unroll
      for (int i = 0; i < kBoxes; ++i) {
        const int box = static_cast<int>(rank) * kBoxes + i;
        load_b(sb + box * 8192, col0 + 64 * box, k0);
      }
    } else {  // rows of 128 bytes, BN / kCM of them per CTA
      const int first = static_cast<int>(rank) * (BN / kCM);
      load_b(sb + first * 128, k0, col0 + first);
    }
    ring.advance();
  }
}

// d += this consumer's 64 rows of A times B over all k-tiles, both operands from shared memory by
// descriptors: da_lo / db_lo are the low words of the stage-0, k-step-0 descriptors, advanced by
// constants (make_desc: no carry out of the address field), the high words constant. Each stage goes
// back (release) once the group after it is issued: one group stays in flight, so the tensor cores
// never wait on this thread. before(kt, stage): run once a k-tile's stage has landed, before its
// products (the packed weight gradient's edge; elsewhere nothing).
struct NoStageHook {
  __device__ __forceinline__ void operator()(int, uint32_t) const {}
};
template <typename T, int BM, int BN, bool AK, bool BNM, typename Release,
          typename Before = NoStageHook>
__device__ __forceinline__ void mma_unit_shared(float (&d)[BN / 2], int ktiles, uint32_t full_s,
                                                uint64_t da_hi, uint32_t da_lo, uint64_t db_hi,
                                                uint32_t db_lo,
                                                WgRing<WgCfg<T, BM, BN>::kStages>& ring,
                                                Release release, Before before = {}) {
  using Cfg = WgCfg<T, BM, BN>;
  uint32_t prev = 0;  // the stage of the group before
  for (int kt = 0; kt < ktiles; ++kt) {
    wg::mbar_wait(full_s + 8 * ring.stage, ring.phase);
    before(kt, ring.stage);
    const uint32_t so = ring.stage * (Cfg::kStageBytes / 16);
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      // One instruction k-step is 32 bytes of k: 32 bytes along a k-major row (the swizzle is
      // applied by the hardware on the address), 16 rows of 128 bytes in an m/n-major box.
      // m/n-major: 64-element core-matrix columns 8 KiB apart (the boxes), 8-row groups 1 KiB.
      constexpr uint32_t kStepA = AK ? 32 / 16 : 2048 / 16, kStepB = BNM ? 2048 / 16 : 32 / 16;
      wg::mma<T, BN, AK ? 0 : 1, BNM ? 1 : 0>(d, da_hi | (da_lo + so + kk * kStepA),
                                              db_hi | (db_lo + so + kk * kStepB));
    }
    wg::commit();
    wg::wait<1>();
    if (kt > 0) release(prev);
    prev = ring.stage;
    ring.advance();
  }
  wg::wait<0>();
  if (ktiles > 0) release(prev);
}

// The same for TF32 with an m-major A, read from registers: each k-tile's fragments come from the
// m-major tile by 16 loads of 4 bytes per thread, from the rows rs_row names (the epilogue stores
// them there), into one of two register sets: a group's registers stay untouched until it has been
// waited for, so the next k-tile loads into the other. box0: this warp's 32-row box in stage 0.
template <int BM, int BN, typename Release> __device__ __forceinline__ void mma_unit_registers(
    float (&d)[BN / 2], int ktiles, uint32_t full_s, uint32_t box0, const uint32_t (&off)[2][2],
    uint64_t db_hi, uint32_t db_lo, WgRing<WgCfg<float, BM, BN>::kStages>& ring, Release release) {
  using Cfg = WgCfg<float, BM, BN>;
  uint32_t prev = 0;  // the stage of the group before
  // step(fr, other, first): the next k-tile into fr; other holds the previous k-tile's fragments, free
  // again once that group has been waited for.
  auto step = [&](uint32_t (&fr)[4][4], uint32_t (&other)[4][4], bool first) {
    wg::mbar_wait(full_s + 8 * ring.stage, ring.phase);
    const uint32_t box = box0 + ring.stage * Cfg::kStageBytes,
                   so = ring.stage * (Cfg::kStageBytes / 16);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      fr[kk][0] = wg::lds32(box + kk * 1024 + off[0][0]);
      fr[kk][1] = wg::lds32(box + kk * 1024 + off[0][1]);
      fr[kk][2] = wg::lds32(box + kk * 1024 + off[1][0]);
      fr[kk][3] = wg::lds32(box + kk * 1024 + off[1][1]);
    }
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wg::mma_tf32_rs<BN>(d, fr[kk], db_hi | (db_lo + so + kk * (32 / 16)));
    wg::commit();
    wg::wait<1>();
    wg::keep(other);
    if (!first) release(prev);
    prev = ring.stage;
    ring.advance();
  };
  uint32_t fr0[4][4] = {}, fr1[4][4] = {};
  // Pairs, then an odd last k-tile into fr0: on no path is a set loaded while its group may still
  // run (a conditional second step in the loop would make one, and ptxas would then serialise
  // every wgmma).
  int kt = 0;
  for (; kt + 1 < ktiles; kt += 2) {
    step(fr0, fr1, kt == 0);
    step(fr1, fr0, false);
  }
  if (kt < ktiles) step(fr0, fr1, kt == 0);
  wg::wait<0>();
  wg::keep(fr0);
  wg::keep(fr1);
  if (ktiles > 0) release(prev);
}

// A consumer's 64 rows (from `row`) by NC columns (from col0; a multiple of 64) through its share
// of the shared buffer by TMA stores that run on while it starts the next tile: boxes of 64 x 64
// (8 KiB), 128-byte swizzled as the store's tensor map reads them (16-byte chunk q of row x at chunk
// q ^ (x % 8), so a warp's 8 rows x 16 bytes land on 32 different banks), in parts of what the
// buffer holds (BN / 64 / kCSplit boxes) one after the other, each written once the last stores
// have read the buffer. pack(j, h): the packed pair of fragment column block j (columns 8j + 2
// (lane % 4) + {0, 1}) in the lane's row (h = 0) or the row 8 below (h = 1).
// add: the boxes are added to c (beta = 1), not written over it.
template <typename T, int BM, int BN, int NC, typename Pack>
__device__ __forceinline__ void store_tile_tma(const CUtensorMap& map, uint32_t mine, int64_t row,
                                               int64_t col0, int cw, int tid, int warp, int lane,
                                               Pack&& pack, bool add = false) {
  using Cfg = WgCfg<T, BM, BN>;
  constexpr int kBufBoxes = BN / 64 / Cfg::kCSplit, kBoxes = NC / 64;
  static_assert(NC % 64 == 0 && (kBoxes <= kBufBoxes || kBoxes % kBufBoxes == 0), "whole parts");
  constexpr int kPartBoxes = kBoxes < kBufBoxes ? kBoxes : kBufBoxes, kParts = kBoxes / kPartBoxes;
  const int x = warp * 16 + lane / 4;
  const uint32_t row_x = mine + x * 128 + (lane % 4) * 4, row_x8 = row_x + 8 * 128;
#pragma unroll
  for (int part = 0; part < kParts; ++part) {
    if (tid == 0) wg::bulk_wait_read();
    wg::named_sync(1 + cw, 128);
#pragma unroll
    for (int jj = 0; jj < 8 * kPartBoxes; ++jj) {
      const int j = part * 8 * kPartBoxes + jj;
      const uint32_t chunk = (jj / 8) * 8192 + ((j % 8) ^ (x % 8)) * 16;
      wg::sts32(row_x + chunk, pack(j, 0));
      wg::sts32(row_x8 + chunk, pack(j, 1));
    }
    wg::fence_proxy_async();
    wg::named_sync(1 + cw, 128);
    if (tid == 0) {
#pragma unroll
      for (int b = 0; b < kPartBoxes; ++b) {
        const int col = static_cast<int>(col0) + 64 * (part * kPartBoxes + b);
        if (add)
          wg::tma_store_add(&map, mine + b * 8192, col, static_cast<int>(row));
        else
          wg::tma_store(&map, mine + b * 8192, col, static_cast<int>(row));
      }
      wg::bulk_commit();
    }
  }
}

// A consumer's 64 x BN rows of the tile (tm, tn), alpha applied and rounded (the plain epilogue),
// written over c (beta = 0) or added to it (beta = 1: the plan stages no other beta).
template <typename T, int BM, int BN>
__device__ __forceinline__ void store_unit_tma(const CUtensorMap& map_c, const float (&d)[BN / 2],
                                               uint32_t mine, const GemmProblem& p, int64_t tm,
                                               int64_t tn, int cw, int tid, int warp, int lane) {
  store_tile_tma<T, BM, BN, BN>(
      map_c, mine, tm * BM + cw * 64, tn * BN, cw, tid, warp, lane,
      [&](int j, int h) {
        return Epilogue::staged<T>(p.alpha, d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
      },
      p.beta != 0.f);
}

// linear's bias at a lane's columns of a tile (kOn: the BiasActivation epilogue; elsewhere an
// empty shell): load() issues every load before the k-loop and nothing reads them until the
// epilogue, so their latency hides under the products. (Loaded at the epilogue, each load's value
// converted as it came, ptxas waited on every one in turn: 32 L2 round trips a 128 x 256 tile,
// +13-22 % of the kernel's time at 8192 tokens.) Zeros past n and without a bias; a 4-byte pair
// each where the bias allows (n even, its base 4-byte aligned), else two 2-byte loads.
template <typename T, int BN, bool kOn> struct LaneBias {
  uint32_t raw[kOn ? BN / 8 : 1];
  __device__ __forceinline__ void load(const FusedArgs& f, const GemmProblem& p, int64_t col0,
                                       int lane) {
    if constexpr (kOn) {
      const T* bias = static_cast<const T*>(f.bias);
      const int64_t c0 = col0 + 2 * (lane % 4), n = bias == nullptr ? 0 : p.n;
      if (((reinterpret_cast<uintptr_t>(bias) & 3) | (p.n & 1)) == 0) {
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          const int64_t c = c0 + j * 8;
          raw[j] = c < n ? __ldg(reinterpret_cast<const unsigned*>(bias + c)) : 0u;
        }
      } else {
        const unsigned short* bits = reinterpret_cast<const unsigned short*>(bias);
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          const int64_t c = c0 + j * 8;
          const uint32_t lo = c < n ? __ldg(bits + c) : 0u,
                         hi = c + 1 < n ? __ldg(bits + c + 1) : 0u;
          raw[j] = lo | hi << 16;
        }
      }
    }
  }
  __device__ __forceinline__ float2 operator[](int j) const { return unpack_pair(raw[j], T{}); }
};

// The fused epilogues (FusedArgs), a consumer's 64 rows of the tile (tm, tn), by TMA stores.
// BiasActivation: z = alpha * acc + bias[col] (b, in float), kept in aux where f.keep; then
// act(z) into c, rounded once. Gated: the accumulator tile's columns are BN / 2 of the gate
// product g (d[0 .. BN / 4)) then the same columns of the up product u (d[BN / 4 ..)): each lane
// holds both halves of its columns, so y = act(g) * u needs no exchange; g and u kept in aux and
// aux2 where f.keep; the tile's outputs are its BN / 2 columns.
template <typename T, int BM, int BN, GemmEpilogue E, bool kBias>
__device__ __forceinline__ void store_unit_fused(
    const CUtensorMap& map_c, const CUtensorMap& map_aux, const CUtensorMap& map_aux2,
    const FusedArgs& f, const GemmProblem& p, float (&d)[BN / 2], const LaneBias<T, BN, kBias>& b,
    uint32_t mine, int64_t tm, int64_t tn, int cw, int tid, int warp, int lane) {
  const int64_t row = tm * BM + cw * 64;
  auto packed = [&](int base) {
    return [&, base](int j, int h) {
      return pack_pair(d[base + 4 * j + 2 * h], d[base + 4 * j + 2 * h + 1], T{});
    };
  };
  if constexpr (E == GemmEpilogue::BiasActivation) {
    const int64_t col0 = tn * BN;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const float2 bj = b[j];
      d[4 * j] = fmaf(p.alpha, d[4 * j], bj.x);
      d[4 * j + 1] = fmaf(p.alpha, d[4 * j + 1], bj.y);
      d[4 * j + 2] = fmaf(p.alpha, d[4 * j + 2], bj.x);
      d[4 * j + 3] = fmaf(p.alpha, d[4 * j + 3], bj.y);
    }
    if (f.keep)
      store_tile_tma<T, BM, BN, BN>(map_aux, mine, row, col0, cw, tid, warp, lane, packed(0));
    BiasActivation::activate(f.act, d);
    store_tile_tma<T, BM, BN, BN>(map_c, mine, row, col0, cw, tid, warp, lane, packed(0));
  } else {
    static_assert(E == GemmEpilogue::Gated, "a fused epilogue");
    constexpr int kHalf = BN / 4;
    const int64_t col0 = tn * (BN / 2);
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) d[i] *= p.alpha;
    if (f.keep) {
      store_tile_tma<T, BM, BN, BN / 2>(map_aux, mine, row, col0, cw, tid, warp, lane, packed(0));
      store_tile_tma<T, BM, BN, BN / 2>(map_aux2, mine, row, col0, cw, tid, warp, lane,
                                        packed(kHalf));
    }
    Gated::combine<kHalf>(f.act, d);
    store_tile_tma<T, BM, BN, BN / 2>(map_c, mine, row, col0, cw, tid, warp, lane, packed(0));
  }
}

// The same rows stored directly (alpha, beta, rounding: epilogue.cuh's pairs). Accumulator
// fragment of m64nN: warp w holds rows 16w .. 16w + 15; registers 4j, 4j + 1 are (row lane / 4,
// columns 8j + 2 (lane % 4) + {0, 1}), 4j + 2, 4j + 3 the same 8 rows lower; under kRS the warp's
// rows are the permuted ones the fragments were loaded from. c_trans (float only): the problem is
// C^T = B^T A^T, so each lane's two adjacent rows go out as pairs of c's columns.
template <typename T, int BM, int BN, bool kRS>
__device__ __forceinline__ void store_unit_direct(const GemmProblem& p, const float (&d)[BN / 2],
                                                  int64_t tm, int64_t tn, int cw, int warp,
                                                  int lane, bool c_trans) {
  const int64_t r = tm * BM + cw * 64 + (kRS ? rs_row(warp, lane, 0) : warp * 16 + lane / 4);
  const int64_t r8 = tm * BM + cw * 64 + (kRS ? rs_row(warp, lane, 1) : warp * 16 + lane / 4 + 8);
  if constexpr (std::is_same_v<T, float>) {
    if (c_trans) {
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        const int64_t c = tn * BN + j * 8 + 2 * (lane % 4);
        Epilogue::quad_transposed(p, r, c, d[4 * j], d[4 * j + 1], d[4 * j + 2], d[4 * j + 3]);
      }
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    const int64_t c = tn * BN + j * 8 + 2 * (lane % 4);
    Epilogue::pair<T>(p, r, c, d[4 * j], d[4 * j + 1]);
    Epilogue::pair<T>(p, r8, c, d[4 * j + 2], d[4 * j + 3]);
  }
}

// Thread 0's setup: the tensor maps prefetched, the ring's barriers initialised (full: the
// producer's expect_tx arrival plus the bytes; empty: kReleases, each consumer warpgroup of each CTA)
// and the initialisation made visible to the cluster.
template <int kStages, int kReleases>
__device__ __forceinline__ void init_cta(const CUtensorMap& map_a, const CUtensorMap& map_b,
                                         const CUtensorMap& map_c, bool tma_store, uint64_t* full,
                                         uint64_t* empty) {
  prefetch_map(&map_a);
  prefetch_map(&map_b);
  if (tma_store) prefetch_map(&map_c);
  for (int s = 0; s < kStages; ++s) {
    wg::mbar_init(&full[s], 1);
    wg::mbar_init(&empty[s], kReleases);
  }
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// The register-A path's byte offsets of a lane's fragment words in its warp's box at k-step 0:
// [column half e][fragment row].
__device__ __forceinline__ void rs_offsets(int warp, int lane, uint32_t (&off)[2][2]) {
#pragma unroll
  for (int e = 0; e < 2; ++e)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int x = rs_row(warp, lane, r) % 32, k = lane % 4 + 4 * e;
      off[e][r] = k * 128 + (((x / 4) ^ k) * 16) + (x % 4) * 4;
    }
}

// A tile's epilogue, as the plan says: a fused one, the TMA store, or direct stores. mine: this
// consumer's share of the shared output buffer.
template <typename T, int BM, int BN, bool kRS, GemmEpilogue E, bool kBias>
__device__ __forceinline__ void store_unit(const CUtensorMap& map_c, const CUtensorMap* map_aux,
                                           const CUtensorMap* map_aux2, const FusedArgs& f,
                                           const GemmProblem& p, float (&d)[BN / 2],
                                           const LaneBias<T, BN, kBias>& bias, uint32_t mine,
                                           bool tma_store, bool c_trans, int64_t tm, int64_t tn,
                                           int cw, int tid, int warp, int lane) {
  if constexpr (E != GemmEpilogue::Plain) {
    store_unit_fused<T, BM, BN, E>(map_c, *map_aux, *map_aux2, f, p, d, bias, mine, tm, tn, cw, tid,
                                   warp, lane);
    return;
  }
  if constexpr (WgCfg<T, BM, BN>::kTmaStore) {
    if (tma_store) {
      store_unit_tma<T, BM, BN>(map_c, d, mine, p, tm, tn, cw, tid, warp, lane);
      return;
    }
  }
  store_unit_direct<T, BM, BN, kRS>(p, d, tm, tn, cw, warp, lane, c_trans);
}

// The grouped kernel's groups. Rows (WgGroup::Rows): group e owns the rows [ends[e - 1], ends[e]) of
// A and c, every group starting at a multiple of BM (ops/moe.cpp's row layout), so each BM-row tile
// is one group's; rows from ends[E - 1] on are in none (their tiles compute and store zeros). Along
// k (WgGroup::K, a weight gradient): group e sums A's and B's k rows [ends[e - 1], ends[e]) (whole
// k-tiles: the layout's multiples of 128) into c's rows [e m, (e + 1) m), m = tiles_per_group BM;
// an empty group stores zeros. ends: int32 [experts] on the device, read after the dependent-launch
// wait.
// Packed (torch._grouped_mm's rows: groups start anywhere): ends [experts + 1] as grouped_prep
// leaves them (non-decreasing, ends[experts] = the rows), tile_ends [experts + 1] the running count
// of each group's BM-row tiles, group `experts` the rows past the last group (zeros). A tile starts
// at its group's first row plus a multiple of BM: its A rows past the group belong to the next one
// (read, never stored); a tile the group fills leaves by TMA, a partial one by direct stores. The
// units: tile_ends[experts] tile rows, read on the device.
// PackedK (torch's weight-gradient form): group e sums k rows [ends[e - 1], ends[e]) (ends as
// Packed's) from that row on, so its last k-tile may hold the next group's rows: they are zeroed in
// the stage before its products (both operands: 0 * inf would be NaN). c as K's.
enum class WgGroup { None, Rows, K, Packed, PackedK };
struct WgGroups {
  const int32_t* ends;
  int experts;
  int tiles_per_group;                 // K, PackedK: c's row tiles a group
  const int32_t* tile_ends = nullptr;  // Packed
};

// The group of the tile starting at row0: the first e with ends[e] > row0 (a binary search, in the
// producer thread only: the consumers need no group).
__device__ __forceinline__ int group_of(const WgGroups& g, int64_t row0) {
  int lo = 0, hi = g.experts;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (__ldg(g.ends + mid) <= row0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// The ring's shared memory: the stages from a 1024-byte aligned base, the output tile's buffer, the
// full and empty barriers; and the same as shared-memory addresses (the loops use these, with
// constant offsets per stage, rather than convert generic pointers on every k-tile).
struct WgSmem {
  unsigned char* c_tile;
  uint64_t *full, *empty;
  uint32_t base_s, full_s, empty_s;
};
template <typename Cfg> __device__ __forceinline__ WgSmem wg_smem() {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* base = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  unsigned char* c_tile = base + Cfg::kStages * Cfg::kStageBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(c_tile + Cfg::kCBytes);
  uint64_t* empty = full + Cfg::kStages;
  return {c_tile, full, empty, smem_addr(base), smem_addr(full), smem_addr(empty)};
}

// PackedK's stage hook: on a group's last k-tile, the k rows past the group (from `edge` on) zeroed in
// every 64-k box of the stage (A's boxes then B's, 8 KiB each, one k a 128-byte row whatever the
// swizzle), by both consumer warpgroups, then made visible to the tensor cores' proxy.
template <typename Cfg> struct ZeroKEdge {
  uint32_t base_s;
  int last, edge, t;  // the last k-tile, its own rows, this thread (0 .. 255)
  __device__ __forceinline__ void operator()(int kt, uint32_t stage) const {
    static_assert(Cfg::kStageBytes % 8192 == 0 && Cfg::kBK == 64, "boxes of 64 k x 128 bytes");
    if (kt != last || edge == 0) return;
    constexpr int kBoxes = Cfg::kStageBytes / 8192;
    const int per_box = (64 - edge) * 8;  // 16-byte chunks
    const uint32_t sa = base_s + stage * Cfg::kStageBytes;
    for (int i = t; i < kBoxes * per_box; i += 256) {
      const int box = i / per_box, c = i % per_box;
      wg::sts128_zero(sa + box * 8192 + (edge + c / 8) * 128 + (c % 8) * 16);
    }
    wg::fence_proxy_async();
    wg::named_sync(WgShape<128>::kAll, 256);
  }
};

// A unit's share of the groups, as the producer and the consumers see it (G None: nothing). Rows:
// tiles from last_row on are in no group (nothing loaded, zeros stored), the producer's B comes from
// the tile's group. K: the tile's group gives the k-tiles, and A's rows are the group's own m.
template <WgGroup G, int BM, int kBK> struct WgGroupUnit {
  const WgGroups* g;
  int64_t last_row = 0;
  __device__ __forceinline__ explicit WgGroupUnit(const WgGroups* groups) : g(groups) {
    if constexpr (G == WgGroup::Rows)
      last_row = g->experts > 0 ? __ldg(g->ends + g->experts - 1) : 0;
  }
  __device__ __forceinline__ void k_range(int64_t tm, int& k0, int& n) const {
    const int e = static_cast<int>(tm / g->tiles_per_group);
    const int start = e == 0 ? 0 : __ldg(g->ends + e - 1), end = __ldg(g->ends + e);
    k0 = start / kBK;
    n = end > start ? (end - start) / kBK : 0;
  }
  // PackedK: the group's first k row, its k-tiles, and the rows of its last k-tile that are its own
  // (0: all).
  __device__ __forceinline__ void k_rows(int64_t tm, int& start, int& n, int& edge) const {
    const int e = static_cast<int>(tm / g->tiles_per_group);
    start = e == 0 ? 0 : __ldg(g->ends + e - 1);
    const int len = __ldg(g->ends + e) - start;
    n = (len + kBK - 1) / kBK;
    edge = len % kBK;
  }
  // Packed: the group of tile row tm (experts: the rows past the last group) and its rows
  // [row0, row_end) (row_end - row0 >= BM: the tile is the group's). tm < tile_ends[experts].
  __device__ __forceinline__ int packed_tile(int64_t tm, int64_t& row0, int64_t& row_end) const {
    int lo = 0, hi = g->experts;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (__ldg(g->tile_ends + mid) <= tm)
        lo = mid + 1;
      else
        hi = mid;
    }
    const int64_t t0 = lo == 0 ? 0 : __ldg(g->tile_ends + lo - 1);
    row0 = (lo == 0 ? 0 : __ldg(g->ends + lo - 1)) + (tm - t0) * BM;
    row_end = __ldg(g->ends + lo);
    return lo;
  }
  // The group whose matrix B comes from (Rows, Packed; else 0); k_off: the element k of the first
  // k-tile (PackedK; else 0).
  __device__ __forceinline__ int producer(int64_t tm, int64_t& row0, int& k0, int& n,
                                          int& k_off) const {
    k_off = 0;
    if constexpr (G == WgGroup::Rows) {
      if (row0 < last_row) return group_of(*g, row0);
      n = 0;
    } else if constexpr (G == WgGroup::K) {
      k_range(tm, k0, n);
      row0 = (tm % g->tiles_per_group) * BM;
    } else if constexpr (G == WgGroup::Packed) {
      int64_t row_end;
      const int e = packed_tile(tm, row0, row_end);
      if (e < g->experts) return e;
      n = 0;
    } else if constexpr (G == WgGroup::PackedK) {
      int edge;
      k0 = 0;
      k_rows(tm, k_off, n, edge);
      row0 = (tm % g->tiles_per_group) * BM;
    }
    return 0;
  }
  // Packed: the walk's units from the device.
  __device__ __forceinline__ void units(int64_t& units_m, int64_t& units, int64_t tiles_n) const {
    if constexpr (G == WgGroup::Packed) {
      units_m = __ldg(g->tile_ends + g->experts);
      units = units_m * tiles_n;
    }
  }
  // The consumers' k-tiles of tile row tm (n), and Packed's rows or PackedK's edge.
  struct Unit {
    int64_t row0 = 0, row_end = 0;
    int last = -1, edge = 0;
  };
  __device__ __forceinline__ Unit consumer(int64_t tm, int& n) const {
    Unit u;
    if constexpr (G == WgGroup::Rows) {
      if (tm * BM >= last_row) n = 0;
    } else if constexpr (G == WgGroup::K) {
      int k0;
      k_range(tm, k0, n);
    } else if constexpr (G == WgGroup::Packed) {
      if (packed_tile(tm, u.row0, u.row_end) == g->experts) n = 0;
    } else if constexpr (G == WgGroup::PackedK) {
      int start;
      k_rows(tm, start, n, u.edge);
      u.last = n - 1;
    }
    return u;
  }
  // mma_unit_shared's stage hook for the unit: PackedK's edge, else nothing.
  template <typename Cfg>
  __device__ __forceinline__ auto hook(const Unit& u, uint32_t base_s, int t) const {
    if constexpr (G == WgGroup::PackedK)
      return ZeroKEdge<Cfg>{base_s, u.last, u.edge, t};
    else
      return NoStageHook{};
  }
};

// Packed's store: a consumer's 64 rows of the tile from row0 (its group's rows end at row_end),
// alpha applied and rounded: by TMA where the group fills the tile, else directly, rows from row_end
// on left to the next group.
template <typename T, int BM, int BN> __device__ __forceinline__ void store_unit_packed(
    const CUtensorMap& map_c, const float (&d)[BN / 2], uint32_t mine, const GemmProblem& p,
    int64_t row0, int64_t row_end, int64_t tn, int cw, int tid, int warp, int lane) {
  if (row_end - row0 >= BM) {
    store_tile_tma<T, BM, BN, BN>(
        map_c, mine, row0 + cw * 64, tn * BN, cw, tid, warp, lane, [&](int j, int h) {
          return Epilogue::staged<T>(p.alpha, d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
        });
    return;
  }
  GemmProblem q = p;
  q.m = row_end;
  const int64_t r = row0 + cw * 64 + warp * 16 + lane / 4;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    const int64_t c = tn * BN + j * 8 + 2 * (lane % 4);
    Epilogue::pair<T>(q, r, c, d[4 * j], d[4 * j + 1]);
    Epilogue::pair<T>(q, r + 8, c, d[4 * j + 2], d[4 * j + 3]);
  }
}

// The producer thread's walk: each unit's k-tiles of A and B into the ring (load_unit), B from the
// tile's group where grouped.
template <typename T, int BM, int BN, bool AK, bool BNM, int kCM, bool kDual, WgGroup G, int kBK>
__device__ __forceinline__ void produce_units(const CUtensorMap& map_a, const CUtensorMap& map_b,
                                              const CUtensorMap* map_b2, int64_t units,
                                              int64_t units_m, int64_t tiles_n, int64_t first_unit,
                                              int64_t unit_step, int kt0, int ktiles,
                                              const WgTail& tail, uint32_t rank, uint32_t base_s,
                                              uint32_t full_s, uint32_t empty_s,
                                              const WgGroupUnit<G, BM, kBK>& grouped) {
  constexpr int kOutBN = kDual ? BN / 2 : BN;
  WgRing<WgCfg<T, BM, BN>::kStages> ring;
  walk_units(
      units, first_unit, unit_step, kt0, ktiles, tail, [&](int64_t unit, int k0, int n, WgPart) {
        int64_t um, tn;
        tile_coords<8>(unit, units_m, tiles_n, um, tn);
        int64_t row0 = (um * kCM + rank) * BM;
        int k_off;
        const int expert = grouped.producer(um, row0, k0, n, k_off);
        load_unit<T, BM, BN, AK, BNM, kCM, kDual, G == WgGroup::Rows || G == WgGroup::Packed>(
            map_a, map_b, static_cast<int>(row0), static_cast<int>(tn * kOutBN), k0, n, base_s,
            full_s, empty_s, rank, ring, map_b2, expert, k_off);
      });
}

// The kernel's body, for the plain epilogue (E Plain) and the fused ones (maps b2, aux, aux2 and f:
// gemm_wgmma_fused). TF32 with an m-major A (kRS) reads A from registers: its tile arrives as four
// boxes of 32 m x 32 k (one 128-byte swizzled row of m per k). c_trans (float only): the problem is
// C^T = B^T A^T, so the result (i, j) goes to c[j * ldc + i]. A fused tile covers kOutBN of c's
// columns (the dual GEMM's BN / 2).
template <typename T, int BM, int BN, bool AK, bool BNM, int kCM, GemmEpilogue E,
          WgGroup G = WgGroup::None>
__device__ __forceinline__ void wgmma_body(const CUtensorMap& map_a, const CUtensorMap& map_b,
                                           const CUtensorMap& map_c, const CUtensorMap* map_b2,
                                           const CUtensorMap* map_aux, const CUtensorMap* map_aux2,
                                           const GemmProblem& p, bool tma_store, bool c_trans,
                                           const WgTail& tail, const FusedArgs& f,
                                           const WgGroups* groups = nullptr) {
  constexpr bool kDual = E == GemmEpilogue::Gated;
  constexpr int kOutBN = kDual ? BN / 2 : BN;
  using Cfg = WgCfg<T, BM, BN>;
  using Sh = WgShape<BM>;
  constexpr int kStages = Cfg::kStages, kBK = Cfg::kBK;
  constexpr bool kRS = std::is_same_v<T, float> && !AK;
  static_assert(BM == 128 || (kCM == 1 && !kRS), "192-row tiles: 16-bit, single CTAs");
  const WgSmem sm = wg_smem<Cfg>();
  unsigned char* c_tile = sm.c_tile;
  uint64_t *full = sm.full, *empty = sm.empty;
  const uint32_t base_s = sm.base_s, full_s = sm.full_s, empty_s = sm.empty_s;
  // Work units: kCM vertically adjacent tiles, one per CTA of the cluster (a unit past the last
  // tile row computes zeros that its epilogue drops: TMA fills rows past m with zeros).
  const int64_t tiles_m = (p.m + BM - 1) / BM, tiles_n = (p.n + kOutBN - 1) / kOutBN;
  int64_t units_m = (tiles_m + kCM - 1) / kCM, units = units_m * tiles_n;
  const int64_t first_unit = blockIdx.x / kCM, unit_step = gridDim.x / kCM;
  const uint32_t rank = kCM == 1 ? 0 : wg::cluster_rank();  // the tile of a pair
  const int kt0 = 0, ktiles = static_cast<int>((p.k + kBK - 1) / kBK);
  if (threadIdx.x == 0)
    init_cta<kStages, Sh::kConsumers * kCM>(map_a, map_b, map_c, tma_store, full, empty);
  // The peer's barriers must be initialised before anything is multicast or arrives there.
  if constexpr (kCM > 1) {
    wg::cluster_sync();
  } else {
    __syncthreads();
  }
  end_dependent_prologue();  // launched as a programmatic dependent (launch_wg)
  const WgGroupUnit<G, BM, kBK> grouped(groups);
  grouped.units(units_m, units, tiles_n);

  if (threadIdx.x < 128) {
    wg::setmaxnreg_dec<Sh::kProducerRegs>();
    if (threadIdx.x == 0)
      produce_units<T, BM, BN, AK, BNM, kCM, kDual>(map_a, map_b, map_b2, units, units_m, tiles_n,
                                                    first_unit, unit_step, kt0, ktiles, tail, rank,
                                                    base_s, full_s, empty_s, grouped);
  } else {
    wg::setmaxnreg_inc<Sh::kConsumerRegs>();
    // This consumer's 64 rows of the block tile. Read through a shuffle from lane 0 so the compiler
    // knows it is warp-uniform and keeps the descriptors built from it in uniform registers.
    const int cw = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0) - 1;
    const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    WgRing<kStages> ring;
    // Hands stage st back: to this CTA's producer and, in a pair, to the peer's, whose multicast
    // also writes this CTA's copy of the stage.
    uint32_t empty_r[kCM];  // empty_s in each CTA of the cluster
#pragma unroll
    for (int r = 0; r < kCM; ++r) empty_r[r] = kCM == 1 ? empty_s : wg::map_cluster(empty_s, r);
    auto release = [&](uint32_t st) {
      if (tid != 0) return;
      if constexpr (kCM == 1) {
        wg::mbar_arrive(empty_s + 8 * st);
      } else {
#pragma unroll
        for (int r = 0; r < kCM; ++r) wg::mbar_arrive_cluster(empty_r[r] + 8 * st);
      }
    };
    // Descriptors of this consumer's A and of B in stage 0 at k-step 0.
    const uint64_t da0 = AK ? wg::make_desc(base_s + cw * 8192, 16, 1024)
                            : wg::make_desc(base_s + cw * 8192, 8192, 1024);
    const uint64_t db0 = BNM ? wg::make_desc(base_s + Cfg::kABytes, 8192, 1024)
                             : wg::make_desc(base_s + Cfg::kABytes, 16, 1024);
    const uint32_t da_lo = static_cast<uint32_t>(da0), db_lo = static_cast<uint32_t>(db0);
    const uint64_t da_hi = da0 & ~uint64_t{0xFFFFFFFF}, db_hi = db0 & ~uint64_t{0xFFFFFFFF};
    uint32_t off[2][2] = {};
    if constexpr (kRS) rs_offsets(warp, lane, off);
    walk_units(units, first_unit, unit_step, kt0, ktiles, tail,
               [&](int64_t unit, int, int n, WgPart part) {
                 int64_t um, tn;
                 tile_coords<8>(unit, units_m, tiles_n, um, tn);
                 const int64_t tm = um * kCM + rank;
                 const auto gu = grouped.consumer(tm, n);
                 LaneBias<T, BN, E == GemmEpilogue::BiasActivation> bias;
                 bias.load(f, p, tn * BN, lane);
                 float d[BN / 2];
#pragma unroll
                 for (int i = 0; i < BN / 2; ++i) d[i] = 0.f;
                 if constexpr (kRS) {
                   mma_unit_registers<BM, BN>(d, n, full_s, base_s + cw * 8192 + (warp / 2) * 4096,
                                              off, db_hi, db_lo, ring, release);
                 } else {
                   mma_unit_shared<T, BM, BN, AK, BNM>(
                       d, n, full_s, da_hi, da_lo, db_hi, db_lo, ring, release,
                       grouped.template hook<Cfg>(gu, base_s, tid + 128 * cw));
                 }
                 if constexpr (G == WgGroup::Packed)
                   return store_unit_packed<T, BM, BN>(
                       map_c, d, smem_addr(c_tile) + cw * (Cfg::kCBytes / Sh::kConsumers), p,
                       gu.row0, gu.row_end, tn, cw, tid, warp, lane);
                 if constexpr (kCM == 1) {
                   if (part == WgPart::Tail) {
                     tail_put<BM, BN>(tail, d, cw, tid);
                     return;
                   }
                   if (part == WgPart::Head) tail_add<BM, BN>(tail, d, cw, tid);
                 }
                 store_unit<T, BM, BN, kRS, E>(
                     map_c, map_aux, map_aux2, f, p, d, bias,
                     smem_addr(c_tile) + cw * (Cfg::kCBytes / Sh::kConsumers), tma_store, c_trans,
                     tm, tn, cw, tid, warp, lane);
               });
    if constexpr (Cfg::kTmaStore) {
      if (tma_store && tid == 0)
        wg::bulk_wait();  // the buffer stays until the last stores have read it
    }
  }
  // No CTA of a pair leaves while the peer may still arrive on its barriers.
  if constexpr (kCM > 1) wg::cluster_sync();
}

template <typename T, int BM, int BN, bool AK, bool BNM, int kCM>
__global__ void __launch_bounds__(WgShape<BM>::kThreads, 1)
    gemm_wgmma(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
               const __grid_constant__ CUtensorMap map_c, const GemmProblem p, bool tma_store,
               bool c_trans, const WgTail tail) {
  wgmma_body<T, BM, BN, AK, BNM, kCM, GemmEpilogue::Plain>(
      map_a, map_b, map_c, nullptr, nullptr, nullptr, p, tma_store, c_trans, tail, FusedArgs{});
}

// The fused epilogues (16-bit, TMA stores): x k-major and nn.Linear's weights (B k-major), the
// only layout the fused ops plan (gemm_plan.cpp, FusedEpilogue).
template <typename T, int BM, int BN, int kCM, GemmEpilogue E>
__global__ void __launch_bounds__(WgShape<BM>::kThreads, 1)
    gemm_wgmma_fused(const __grid_constant__ CUtensorMap map_a,
                     const __grid_constant__ CUtensorMap map_b,
                     const __grid_constant__ CUtensorMap map_c,
                     const __grid_constant__ CUtensorMap map_b2,
                     const __grid_constant__ CUtensorMap map_aux,
                     const __grid_constant__ CUtensorMap map_aux2, const GemmProblem p,
                     const WgTail tail, const FusedArgs f) {
  wgmma_body<T, BM, BN, true, false, kCM, E>(map_a, map_b, map_c, &map_b2, &map_aux, &map_aux2, p,
                                             true, false, tail, f);
}

// The grouped kernel (kernels/gemm/gemm_wgmma_grouped.cu): A k-major [rows, K] in the groups' row
// layout, B one matrix a group (3-D maps), c and the kept products by TMA stores; the plain epilogue
// or the dual GEMM's (gate/up: map_b the gate rows, map_b2 the up rows of each expert). K: A m-major
// and B n-major over the layout's rows (2-D maps), c [E m, N].
template <typename T, int BM, int BN, bool AK, bool BNM, GemmEpilogue E, WgGroup G>
__global__ void __launch_bounds__(WgShape<BM>::kThreads, 1)
    gemm_wgmma_grouped(const __grid_constant__ CUtensorMap map_a,
                       const __grid_constant__ CUtensorMap map_b,
                       const __grid_constant__ CUtensorMap map_c,
                       const __grid_constant__ CUtensorMap map_b2,
                       const __grid_constant__ CUtensorMap map_aux,
                       const __grid_constant__ CUtensorMap map_aux2, const GemmProblem p,
                       const FusedArgs f, const WgGroups groups) {
  wgmma_body<T, BM, BN, AK, BNM, 1, E, G>(map_a, map_b, map_c, &map_b2, &map_aux, &map_aux2, p,
                                          true, false, WgTail{nullptr, nullptr, 0, 1}, f, &groups);
}

// ---- host side

// Tensor maps: tma.cuh's make_map (one layout for both TMA kernels).

// The split tail's arguments for a plan of `units` tiles (plan.wgmma().tail_units > 0): every run
// resident at once (grid <= SMs, one CTA each: the planner's grid; a Head waits on its Tails), the
// workspace laid out as gemm_plan.h's tail_workspace_bytes counts it, the flags zeroed on the
// stream. Whole waves: no tail.
template <int BM, int BN, int kCM> cudaError_t wg_tail(const GemmPlan& plan, const GemmProblem& p,
                                                       int64_t units, cudaStream_t stream,
                                                       WgTail& tail) {
  const WgmmaParams& w = plan.wgmma();
  tail = WgTail{nullptr, nullptr, 0, 1};
  // A programmatic dependent as the plan says (never right after the split tail's memset).
  if (w.pdl && w.tail_units > 0) return cudaErrorInvalidValue;
  if (w.tail_units == 0) return cudaSuccess;
  if (kCM != 1 || w.tail_units > units || w.tail_split < 1 ||
      w.tail_units * w.tail_split > plan.grid || p.workspace == nullptr ||
      plan.workspace_bytes < tail_workspace_bytes(plan.grid, BM, BN)) {
    return cudaErrorInvalidValue;
  }
  tail.flags = static_cast<int*>(p.workspace);
  tail.part = reinterpret_cast<float4*>(static_cast<unsigned char*>(p.workspace) +
                                        tail_flag_bytes(plan.grid));
  tail.units = w.tail_units;
  tail.split = w.tail_split;
  return cudaMemsetAsync(tail.flags, 0, static_cast<size_t>(plan.grid) * sizeof(int), stream);
}

// The kernel's shared memory, set on every launch (one cheap driver call): the attribute is per
// device, and this launch's device is whichever the op's guard selected.
template <typename Kernel> cudaError_t wg_prepare(Kernel kernel, int smem, const GemmPlan& plan) {
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  return grid_fits(plan.grid) ? cudaSuccess : cudaErrorInvalidConfiguration;
}

template <typename T, int BM, int BN, bool AK, bool BNM, int kCM>
cudaError_t launch_wg(const GemmPlan& plan, const GemmProblem& p, cudaStream_t stream) {
  using Cfg = WgCfg<T, BM, BN>;
  constexpr int kThreads = WgShape<BM>::kThreads;
  const WgmmaParams& w = plan.wgmma();
  // The TMA store is the 16-bit instances' (the planner asks it only of them).
  if (w.tma_store && !Cfg::kTmaStore) return cudaErrorInvalidValue;
  CUtensorMap ma, mb, mc{};
  // m-major A: boxes of 128 bytes of m (64 16-bit elements, or the 32 floats of the TF32 register path).
  // The planner checked that TMA describes every operand; the driver refusing one is an error.
  const bool maps = (AK ? make_map<T>(ma, p.a, p.k, p.m, p.lda, Cfg::kBK, BM)
                        : make_map<T>(ma, p.a, p.m, p.k, p.lda, 128 / sizeof(T), Cfg::kBK)) &&
                    (BNM ? make_map<T>(mb, p.b, p.n, p.k, p.ldb, 64, Cfg::kBK)
                         : make_map<T>(mb, p.b, p.k, p.n, p.ldb, Cfg::kBK, BN / kCM)) &&
                    (!w.tma_store || make_map<T>(mc, p.c, p.n, p.m, p.ldc, 64, 64));
  if (!maps) return cudaErrorInvalidValue;
  constexpr auto kernel = gemm_wgmma<T, BM, BN, AK, BNM, kCM>;
  cudaError_t err = wg_prepare(kernel, Cfg::kSmem, plan);
  if (err != cudaSuccess) return err;
  WgTail tail;
  err = wg_tail<BM, BN, kCM>(plan, p, (p.m + BM - 1) / BM * ((p.n + BN - 1) / BN), stream, tail);
  if (err != cudaSuccess) return err;
  const ClusterLaunch launch(dim3(static_cast<unsigned>(plan.grid)), dim3(kCM), kThreads,
                             Cfg::kSmem, stream, w.pdl);
  return cudaLaunchKernelEx(&launch.cfg, kernel, ma, mb, mc, p, w.tma_store, w.c_trans, tail);
}

// A fused plan's launch (16-bit, A and B k-major, TMA stores; gemm_plan.cpp's FusedEpilogue): the
// maps of x, the weight(s), c and the kept products (c's map stands in for those not kept: never
// read).
template <typename T, int BM, int BN, int kCM, GemmEpilogue E>
cudaError_t launch_wg_fused(const GemmPlan& plan, const GemmProblem& p, cudaStream_t stream) {
  using Cfg = WgCfg<T, BM, BN>;
  constexpr bool kDual = E == GemmEpilogue::Gated;
  constexpr int kOutBN = kDual ? BN / 2 : BN, kBoxN = kDual ? BN / 2 : BN / kCM;
  const WgmmaParams& w = plan.wgmma();
  const GemmFusion& fu = plan.req.fusion;
  const bool keep = fu.aux != nullptr;
  if (!w.tma_store || w.c_trans || (kDual && (fu.b2 == nullptr || (keep && !fu.aux2))))
    return cudaErrorInvalidValue;
  CUtensorMap ma, mb, mc, mb2{}, maux{}, maux2{};
  const bool maps = make_map<T>(ma, p.a, p.k, p.m, p.lda, Cfg::kBK, BM) &&
                    make_map<T>(mb, p.b, p.k, p.n, p.ldb, Cfg::kBK, kBoxN) &&
                    make_map<T>(mc, p.c, p.n, p.m, p.ldc, 64, 64) &&
                    (!kDual || make_map<T>(mb2, fu.b2, p.k, p.n, p.ldb, Cfg::kBK, kBoxN)) &&
                    (!keep || make_map<T>(maux, fu.aux, p.n, p.m, fu.ld_aux, 64, 64)) &&
                    (!keep || !kDual || make_map<T>(maux2, fu.aux2, p.n, p.m, fu.ld_aux, 64, 64));
  if (!maps) return cudaErrorInvalidValue;
  if (!keep) maux = maux2 = mc;
  constexpr auto kernel = gemm_wgmma_fused<T, BM, BN, kCM, E>;
  cudaError_t err = wg_prepare(kernel, Cfg::kSmem, plan);
  if (err != cudaSuccess) return err;
  WgTail tail;
  err = wg_tail<BM, BN, kCM>(plan, p, (p.m + BM - 1) / BM * ((p.n + kOutBN - 1) / kOutBN), stream,
                             tail);
  if (err != cudaSuccess) return err;
  const ClusterLaunch launch(dim3(static_cast<unsigned>(plan.grid)), dim3(kCM),
                             WgShape<BM>::kThreads, Cfg::kSmem, stream, w.pdl);
  const FusedArgs f{fu.bias, fu.act, keep};
  return cudaLaunchKernelEx(&launch.cfg, kernel, ma, mb, mc, mb2, maux, maux2, p, tail, f);
}

// The instance of the plan's tile and cluster, for 16-bit types in all four layouts and TF32 with B k-major (the planner's transposed problem makes every other TF32
// layout that); 192 x 128 single CTAs for 16-bit types only.
template <typename T, bool AK, bool BNM>
cudaError_t launch_wg_tile(const GemmPlan& plan, const GemmProblem& p, cudaStream_t stream) {
  const WgmmaParams& w = plan.wgmma();
  if (w.bm == 192) {
    if constexpr (sizeof(T) == 2) {
      if (w.bn == 128 && w.cluster_m == 1)
        return launch_wg<T, 192, 128, AK, BNM, 1>(plan, p, stream);
    }
    return cudaErrorInvalidValue;
  }
  if (w.bm != 128) return cudaErrorInvalidValue;
  if (w.bn == 256 && w.cluster_m == 2) return launch_wg<T, 128, 256, AK, BNM, 2>(plan, p, stream);
  if (w.bn == 256 && w.cluster_m == 1) return launch_wg<T, 128, 256, AK, BNM, 1>(plan, p, stream);
  if (w.bn == 128 && w.cluster_m == 1) return launch_wg<T, 128, 128, AK, BNM, 1>(plan, p, stream);
  if (w.bn == 64 && w.cluster_m == 1) return launch_wg<T, 128, 64, AK, BNM, 1>(plan, p, stream);
  return cudaErrorInvalidValue;
}

template <typename T>
cudaError_t launch_wg_typed(const GemmPlan& plan, const GemmProblem& p, cudaStream_t stream) {
  return with_layouts(plan.a_kmajor, plan.b_nmajor, [&](auto ak, auto bn) {
    constexpr bool AK = decltype(ak)::value, BNM = decltype(bn)::value;
    if constexpr (std::is_same_v<T, float> && BNM) {
      return cudaErrorInvalidValue;
    } else {
      return launch_wg_tile<T, AK, BNM>(plan, p, stream);
    }
  });
}

// A fused plan's instance: the plain kernel's tiles (the dual GEMM's at least 128 wide: 64 outputs
// a tile, one store box).
template <typename T, GemmEpilogue E>
cudaError_t launch_wg_fused_tile(const GemmPlan& plan, const GemmProblem& p, cudaStream_t stream) {
  const WgmmaParams& w = plan.wgmma();
  if (!plan.a_kmajor || plan.b_nmajor) return cudaErrorInvalidValue;
  if (w.bm == 192 && w.bn == 128 && w.cluster_m == 1)
    return launch_wg_fused<T, 192, 128, 1, E>(plan, p, stream);
  if (w.bm != 128) return cudaErrorInvalidValue;
  if (w.bn == 256 && w.cluster_m == 2) return launch_wg_fused<T, 128, 256, 2, E>(plan, p, stream);
  if (w.bn == 256 && w.cluster_m == 1) return launch_wg_fused<T, 128, 256, 1, E>(plan, p, stream);
  if (w.bn == 128 && w.cluster_m == 1) return launch_wg_fused<T, 128, 128, 1, E>(plan, p, stream);
  if constexpr (E != GemmEpilogue::Gated) {
    if (w.bn == 64 && w.cluster_m == 1) return launch_wg_fused<T, 128, 64, 1, E>(plan, p, stream);
  }
  return cudaErrorInvalidValue;
}

template <typename T>
cudaError_t launch_wg_fused_typed(const GemmPlan& plan, const GemmProblem& p, cudaStream_t stream) {
  switch (plan.req.fusion.kind) {
    case GemmEpilogue::BiasActivation:
      return launch_wg_fused_tile<T, GemmEpilogue::BiasActivation>(plan, p, stream);
    case GemmEpilogue::Gated:
      return launch_wg_fused_tile<T, GemmEpilogue::Gated>(plan, p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

// The three dtypes' launchers (gemm_wgmma_{bf16,f16,tf32}.cu), and the 16-bit types' fused ones
// (gemm_wgmma_fused_{bf16,f16}.cu), called by gemm_wgmma.cu's dispatch.
cudaError_t launch_wgmma_bf16(const GemmPlan& plan, const GemmProblem& p, cudaStream_t stream);
cudaError_t launch_wgmma_f16(const GemmPlan& plan, const GemmProblem& p, cudaStream_t stream);
cudaError_t launch_wgmma_tf32(const GemmPlan& plan, const GemmProblem& p, cudaStream_t stream);
cudaError_t launch_wgmma_fused_bf16(const GemmPlan& plan, const GemmProblem& p,
                                    cudaStream_t stream);
cudaError_t launch_wgmma_fused_f16(const GemmPlan& plan, const GemmProblem& p, cudaStream_t stream);

}  // namespace cuops::kernels::detail
