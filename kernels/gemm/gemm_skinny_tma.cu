// The small-M GEMM's streaming form (gemm_skinny.cuh says what the two families are): the weight and
// x arrive by TMA into a ring of stages that four warps multiply; sm_90 only.
#include "gemm_skinny.cuh"
#include "tma.cuh"

namespace cuops::kernels::detail {
namespace {

// ---- The streaming form (sm_90; gemm_plan.h's kSkinnyTma)
// Per CTA: 64 outputs over a slice of k. Warp kSkinnyWarps (the producer; one lane) keeps a ring of
// stages full by TMA: a stage is the weight's 64 outputs x chunk k (k-contiguous: boxes of 64 rows x
// 64 k, each row 128 bytes; o-contiguous: one box of chunk rows of k x 64 outputs) and x's
// [MT tokens x chunk] (boxes of MT x 64; tokens past the last and k past the end arrive as zeros, so
// no edge needs code). The other warps each multiply 16 of the outputs: ldmatrix from the 128-byte
// swizzled tiles (conflict-free: the 8 rows of each 8 x 8 matrix sit in 8 different 16-byte units),
// .trans for the o-contiguous weight, then m16n8k16 on out^T = W x^T (float32 "highest": FP32 FMAs,
// fma_consume, 8 outputs x 8 tokens a thread). Each releases a stage to the
// producer through the stage's `empty` barrier. Where per-lane loads kept at most ~32 KB per SM in
// flight, each CTA here has its whole ring (4 x 18-20 KB) outstanding, and every weight row is read
// in runs of chunk * 2 bytes.
constexpr int kTmaThreads = (kSkinnyWarps + 1) * 32;

// Dynamic shared memory of a streaming CTA (elements of `elem` bytes): the ring, the part (MT x 64
// sums: doubles for float64, floats otherwise), two barriers per stage, and slack to align the ring
// to 1024 bytes (the swizzle's period).
constexpr int tma_smem(int elem, int mt, int stages, int chunk) {
  const int acc = elem == 8 ? 8 : 4;
  return stages * (kSkinnyTma.outputs + mt) * chunk * elem + mt * kSkinnyTma.outputs * acc +
         16 * stages + 1024;
}

#if __CUDA_ARCH__ >= 900  // the streaming form's helpers (its kernel body is sm_90 only)
__device__ __forceinline__ uint32_t to_tf32(uint32_t x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(__uint_as_float(x)));
  return r;
}
__device__ __forceinline__ void mma1688_tf32(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}
// The shared-memory address of 16-byte unit `unit` of row `row` in a 128-byte swizzled box.
__device__ __forceinline__ uint32_t swz(uint32_t box, int row, int unit) {
  return box + row * 128 + ((unit ^ (row & 7)) << 4);
}
__device__ __forceinline__ float4 lds128(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0,%1,%2,%3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr));
  return v;
}

// float32 "highest" on the ring: true FP32 FMAs. A consumer thread owns 8 outputs x 8 tokens over a
// share of k, so each weight vector it loads serves 8 tokens and each x vector 8 outputs (one output
// per lane was bound by the shared-memory loads), in 64 sums (more spilled
// at the 168 registers two CTAs per SM leave). At MT = 16 the warp pairs take the two token halves;
// at MT = 8 they split k. Every 8 consecutive lanes read 8 different 16-byte units of one swizzled row
// (or one x vector, a broadcast): no bank conflicts. The threads' k shares are fixed and summed at
// the end in one order (lanes by warp_reduce_scatter, then warps through shared memory), into part.
//   k-contiguous weight: lane & 7 is the unit (4 k) of each 32-k box, outputs 8 og .. 8 og + 7 with
//     og = lane >> 3 + 4 (warp & 1); at MT = 8 the warp pairs take alternate boxes;
//   o-contiguous weight: lane & 7 owns outputs 4u .. 4u + 3 of both 32-output boxes, and the k
//     groups j (lane >> 3 and the warps not on tokens) k 4j .. 4j + 3 of each 4 x groups.
template <int MT, bool WK>
__device__ __forceinline__ void fma_consume(void* ring, uint32_t base, int stage_bytes, int w_bytes,
                                            int chunk, int stages, int n, uint32_t full,
                                            uint32_t empty, int warp, int lane, float* part) {
  constexpr int kOut = kSkinnyTma.outputs, kN = 64;
  constexpr int kHalves = MT / 8,
                kGroups = (WK ? 2 : 4) / kHalves;  // token halves; k groups of warps
  float acc[kN] = {};  // acc[o * 8 + tt]: the thread's output o, token 8 th + tt
  const int u = lane & 7, th = kHalves == 2 ? warp >> 1 : 0;
  const int group = kHalves == 2 ? (WK ? 0 : warp & 1) : (WK ? warp >> 1 : warp);
  const int og = (lane >> 3) + 4 * (warp & 1), j = (lane >> 3) + 4 * group;
  for (int i = 0; i < n; ++i) {
    const int slot = i % stages;
    mbar_wait(full + 8 * slot, (i / stages) & 1);
    const uint32_t wt = base + slot * stage_bytes, xt = wt + w_bytes;
    if constexpr (WK) {
#pragma unroll 1
      for (int b = group; b < chunk / 32; b += kGroups) {
        const uint32_t xb = xt + b * MT * 128;
        float4 w[8];
#pragma unroll
        for (int o = 0; o < 8; ++o) w[o] = lds128(swz(wt + b * kOut * 128, 8 * og + o, u));
#pragma unroll
        for (int tt = 0; tt < 8; ++tt) {
          const float4 x = lds128(swz(xb, 8 * th + tt, u));
#pragma unroll
          for (int o = 0; o < 8; ++o) {
            float& a = acc[o * 8 + tt];
            a = fmaf(w[o].x, x.x, a);
            a = fmaf(w[o].y, x.y, a);
            a = fmaf(w[o].z, x.z, a);
            a = fmaf(w[o].w, x.w, a);
          }
        }
      }
    } else {
      constexpr int kBlock = 16 * kGroups;  // the k the thread groups cover together
#pragma unroll 1
      for (int k0 = 4 * j; k0 < chunk; k0 += kBlock) {
        const uint32_t xb = xt + (k0 / 32) * MT * 128;
        float4 w[2][4];  // [box][k row]: outputs 4u .. 4u + 3 of 32-output box h at k0 + r
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int r = 0; r < 4; ++r) w[h][r] = lds128(swz(wt + h * chunk * 128, k0 + r, u));
#pragma unroll
        for (int tt = 0; tt < 8; ++tt) {
          const float4 x = lds128(swz(xb, 8 * th + tt, j & 7));
          const float xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
              float* a = acc + 4 * h * 8 + tt;
              a[0] = fmaf(w[h][r].x, xs[r], a[0]);
              a[8] = fmaf(w[h][r].y, xs[r], a[8]);
              a[16] = fmaf(w[h][r].z, xs[r], a[16]);
              a[24] = fmaf(w[h][r].w, xs[r], a[24]);
            }
        }
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(empty + 8 * slot);
  }
  // Lanes first; then, once no consumer reads the ring (every stage issued was waited for, so no
  // copy is still landing), each warp group's sums go to the ring and are added in group order.
  constexpr int kKeep = WK ? kN / 8 : kN / 4;
  if constexpr (WK) {
    warp_reduce_scatter<kN, 4, 1>(acc, lane);
  } else {
    warp_reduce_scatter<kN, 16, 8>(acc, lane);
  }
  asm volatile("bar.sync 1, %0;\n" ::"n"(kSkinnyWarps * 32) : "memory");  // the consumers only
  float* const red = static_cast<float*>(ring);                           // at `base`
#pragma unroll
  for (int i = 0; i < kKeep; ++i) {
    // The sum at acc index (the lane's share) * kKeep + i: the thread's output idx / 8, token idx % 8.
    const int idx = (WK ? u : lane >> 3) * kKeep + i, o = idx / 8, t = 8 * th + idx % 8;
    const int out = WK ? 8 * og + o : (o / 4) * 32 + 4 * u + o % 4;
    red[(group * MT + t) * kOut + out] = acc[i];
  }
  asm volatile("bar.sync 1, %0;\n" ::"n"(kSkinnyWarps * 32) : "memory");
  for (int e = warp * 32 + lane; e < MT * kOut; e += kSkinnyWarps * 32) {
    float v = red[e];
#pragma unroll
    for (int g = 1; g < kGroups; ++g) v += red[g * MT * kOut + e];
    part[e] = v;
  }
}

__device__ __forceinline__ void lds_f64x2(double& x, double& y, uint32_t addr) {
  asm volatile("ld.shared.v2.f64 {%0,%1}, [%2];\n" : "=d"(x), "=d"(y) : "r"(addr));
}

// float64 on the ring: DMMA.16x8x8 (mma_f64_k8) on out^T = W x^T with float64 sums, warp w owning
// outputs 16 w .. 16 w + 15 over the whole stage, as the 16-bit consumer does; at 16 tokens a stream
// of 3 TB/s keeps the FP64 pipe ~20 % busy. A step is 8 k; a box row (128 bytes) holds 16 doubles, two
// steps. The mma's k slots may stand for any k as long as A and B agree, so each lane's 16-byte units
// feed two slots at once (slot t and t + 4), one 16-byte shared load per fragment pair:
//   k-contiguous weight: step h of a box takes logical unit 2t + h of a row (its two doubles in slots
//     t, t + 4) for the weight's output rows g, g + 8 and x's token rows: 8 consecutive lanes read rows
//     g, g + 1 at units {0, 2, 4, 6} + h, which the swizzle (unit ^ row % 8) puts on 8 distinct units;
//   o-contiguous weight: slot t is k 8 h + 2 t and slot t + 4 the k after it, so lane (g, t) reads
//     unit g (outputs 2 g, 2 g + 1: the mma's rows g and g + 8) of the box's k rows 8 h + 2 t and
//     + 1 (distinct units again), and x's unit 4 h + t of token g (two lanes a bank: x is an eighth
//     of the bytes).
// The stage is released after its last batch's fragments are read, before their DMMAs, as the
// 16-bit consumer does; two accumulator sets (even and odd steps) halve the chain of dependent DMMAs.
template <int MT, bool WK>
__device__ __forceinline__ void dmma_consume(uint32_t base, int stage_bytes, int w_bytes, int chunk,
                                             int stages, int n, uint32_t full, uint32_t empty,
                                             int warp, int lane, double* part) {
  constexpr int kOut = kSkinnyTma.outputs, kNT = MT / 8, kSteps = 4;  // a batch: two boxes
  const int g = lane >> 2, t = lane & 3;
  double acc[2][kNT][4] = {};
  double a[kSteps][4], b[kSteps][kNT][2];
  auto load = [&](uint32_t wt, uint32_t xt, int kk, double (&ra)[4], double (&rb)[kNT][2]) {
    const int box = kk / 2, h = kk % 2;
    const uint32_t xb = xt + box * MT * 128;
    int xu;
    if constexpr (WK) {
      const uint32_t wb = wt + box * kOut * 128;
      xu = 2 * t + h;
      lds_f64x2(ra[0], ra[2], swz(wb, 16 * warp + g, xu));
      lds_f64x2(ra[1], ra[3], swz(wb, 16 * warp + g + 8, xu));
    } else {
      const uint32_t wb = wt + warp * chunk * 128;
      const int kr = 16 * box + 8 * h + 2 * t;
      xu = 4 * h + t;
      lds_f64x2(ra[0], ra[1], swz(wb, kr, g));
      lds_f64x2(ra[2], ra[3], swz(wb, kr + 1, g));
    }
#pragma unroll
    for (int j = 0; j < kNT; ++j) lds_f64x2(rb[j][0], rb[j][1], swz(xb, 8 * j + g, xu));
  };
  const int steps = chunk / 8;
  for (int i = 0; i < n; ++i) {
    const int slot = i % stages;
    mbar_wait(full + 8 * slot, (i / stages) & 1);
    const uint32_t wt = base + slot * stage_bytes, xt = wt + w_bytes;
    for (int k0 = 0; k0 < steps; k0 += kSteps) {
#pragma unroll
      for (int s = 0; s < kSteps; ++s) load(wt, xt, k0 + s, a[s], b[s]);
      if (k0 + kSteps == steps) {
        __syncwarp();
        if (lane == 0) mbar_arrive(empty + 8 * slot);
      }
#pragma unroll
      for (int s = 0; s < kSteps; ++s)
#pragma unroll
        for (int j = 0; j < kNT; ++j) mma_f64_k8(acc[s & 1][j], a[s], b[s][j]);
    }
  }
  // acc[.][j][2 r + c]: the mma's row g + 8 r, token 8 j + 2 t + c; row g + 8 r is output
  // 16 warp + g + 8 r (k-contiguous weight) or 16 warp + 2 g + r (o-contiguous).
#pragma unroll
  for (int j = 0; j < kNT; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int o = 16 * warp + (WK ? g + 8 * r : 2 * g + r), tok = 8 * j + 2 * t + c;
        part[tok * kOut + o] = acc[0][j][2 * r + c] + acc[1][j][2 * r + c];
      }
}
// bf16/fp16 and TF32 on the ring, out^T = W x^T on the tensor cores, warp w owning outputs 16 w ..
// 16 w + 15. Two accumulator sets (even and odd k steps) halve the chain of dependent mma per
// stage. Each 8 steps (two boxes) of a stage are read into registers first (ldmatrix), and the
// stage is released to the producer after its last such read, before the multiplies: the ring
// refills while they run. TF32 (m16n8k8) reads the same units: a 16-byte unit is 4 floats there,
// and ldmatrix's b16 view hands lane (g, q) word q of row g, the fragment's element; the
// o-contiguous weight, which would need a 32-bit transpose, is read by 32-bit loads instead.
template <typename T, int MT, bool WK>
__device__ __forceinline__ void mma_consume(uint32_t base, int stage_bytes, int w_bytes, int chunk,
                                            int stages, int n, uint32_t full, uint32_t empty,
                                            int warp, int lane, float* part) {
  constexpr int kOut = kSkinnyTma.outputs;
  // One mma step takes kStepK of k (two 16-byte units).
  constexpr int kStepK = 32 / static_cast<int>(sizeof(T));
  constexpr bool kTf32 = std::is_same_v<T, float>;
  constexpr int kSteps = 8;
  constexpr int kB = MT == 16 ? 4 : 2;
  float acc[2][MT / 8][4] = {};
  uint32_t a[kSteps][4], b[kSteps][kB];
  auto load = [&](uint32_t wt, uint32_t xt, int kk, uint32_t (&ra)[4], uint32_t (&rb)[kB]) {
    const int box = kk / 4, unit = (kk % 4) * 2;  // the step's first unit in its box
    const int g = lane >> 2, q = lane & 3;
    if constexpr (WK) {
      // Matrices: outputs 0-7 / 8-15 of the warp's 16 at k units `unit`, `unit` + 1.
      const int row = 16 * warp + (lane & 15);
      ldsm_x4(ra, swz(wt + box * kOut * 128, row, unit + (lane >> 4)));
    } else if constexpr (!kTf32) {
      // Matrices: rows k 0-7 / 8-15 of the 16, outputs 0-7 / 8-15 of the warp's, transposed.
      const int kr = 16 * kk + (lane & 7) + ((lane >> 4) << 3);
      ldsm_x4_trans(ra, swz(wt, kr, 2 * warp + ((lane >> 3) & 1)));
    } else {
      // a0..a3: (output g, k q), (g + 8, q), (g, q + 4), (g + 8, q + 4) of the warp's 16 outputs,
      // which lie in box (16 warp) / 32 of the two of 32 outputs, at units (o % 32) / 4.
      const uint32_t ob = wt + (warp / 2) * chunk * 128;
      const int o = (16 * warp) % 32 + g, k0 = 8 * kk + q;
      auto at = [&](int k, int oo) { return swz(ob, k, oo / 4) + (oo % 4) * 4; };
      ra[0] = lds32(at(k0, o));
      ra[1] = lds32(at(k0, o + 8));
      ra[2] = lds32(at(k0 + 4, o));
      ra[3] = lds32(at(k0 + 4, o + 8));
    }
    const uint32_t xb = xt + box * MT * 128;
    if constexpr (MT == 16) {
      // Matrices: tokens 0-7 at units `unit`, +1; tokens 8-15 at the same.
      ldsm_x4(rb, swz(xb, (lane & 7) + ((lane >> 4) << 3), unit + ((lane >> 3) & 1)));
    } else {
      ldsm_x2(rb, swz(xb, lane & 7, unit + ((lane >> 3) & 1)));
    }
  };
  for (int i = 0; i < n; ++i) {
    const int slot = i % stages;
    mbar_wait(full + 8 * slot, (i / stages) & 1);
    const uint32_t wt = base + slot * stage_bytes, xt = wt + w_bytes;
    for (int k0 = 0; k0 < chunk / kStepK; k0 += kSteps) {
#pragma unroll
      for (int s = 0; s < kSteps; ++s) load(wt, xt, k0 + s, a[s], b[s]);
      if (k0 + kSteps == chunk / kStepK) {
        __syncwarp();
        if (lane == 0) mbar_arrive(empty + 8 * slot);
      }
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        if constexpr (kTf32) {
          // Rounded to TF32 (cvt.rna) as they leave shared memory, as the other TF32 kernels do.
#pragma unroll
          for (int e = 0; e < 4; ++e) a[s][e] = to_tf32(a[s][e]);
#pragma unroll
          for (int e = 0; e < kB; ++e) b[s][e] = to_tf32(b[s][e]);
          mma1688_tf32(acc[s & 1][0], a[s][0], a[s][1], a[s][2], a[s][3], b[s][0], b[s][1]);
          if constexpr (MT == 16)
            mma1688_tf32(acc[s & 1][1], a[s][0], a[s][1], a[s][2], a[s][3], b[s][2], b[s][3]);
        } else {
          mma16816<T>(acc[s & 1][0], a[s][0], a[s][1], a[s][2], a[s][3], b[s][0], b[s][1]);
          if constexpr (MT == 16)
            mma16816<T>(acc[s & 1][1], a[s][0], a[s][1], a[s][2], a[s][3], b[s][2], b[s][3]);
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < MT / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[0][j][e] += acc[1][j][e];
  // acc[j]: (output 16 warp + g, tokens 8j + 2q, +1), (output 16 warp + g + 8, the same tokens).
  const int g = lane >> 2, q = lane & 3, o = 16 * warp + g;
#pragma unroll
  for (int j = 0; j < MT / 8; ++j) {
    const int t = 8 * j + 2 * q;
    part[t * kOut + o] = acc[0][j][0];
    part[(t + 1) * kOut + o] = acc[0][j][1];
    part[t * kOut + o + 8] = acc[0][j][2];
    part[(t + 1) * kOut + o + 8] = acc[0][j][3];
  }
}

#endif

// The kernels' body. E: the epilogue (gemm_skinny.cuh's store_outputs). Gated (k-contiguous
// weights only) reads a stage's 64 weight rows as 32 outputs of the gate (map mw) over 32 of the up
// weight (map mw2), boxes of 32 rows each: the consumers multiply them as one 64-row tile and the
// epilogue finds g and u of one output 32 sums apart. Elsewhere mw2 is not read.
// kGroups (the MoE decode products, gemm_skinny_tma_grouped): block x is block x % per_slot of slot
// x / per_slot, whose expert slots[slot] names the matrix of the 3-D weight maps and whose MT rows
// of x and out start at row slot * MT; a slot of no expert (-1) loads and stores nothing.
template <typename T, int MT, bool WK, bool FMA, GemmEpilogue E, bool kGroups = false>
__device__ __forceinline__ void skinny_tma_body(const CUtensorMap& mw, const CUtensorMap& mw2,
                                                const CUtensorMap& mx, const Skinny& s,
                                                const SkinnyFusion* f, int stages, int chunk,
                                                const int32_t* slots = nullptr, int per_slot = 1) {
#if __CUDA_ARCH__ >= 900
  constexpr bool kDual = E == GemmEpilogue::Gated;
  static_assert(!kDual || WK, "the dual product reads nn.Linear's k-contiguous weights");
  constexpr int kOut = kSkinnyTma.outputs;
  constexpr int kElem = sizeof(T), kBoxK = 128 / kElem;  // a box row is 128 bytes: kBoxK elements
  using Acc = acc_t<T>;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_addr(smem_raw), base = (raw + 1023) & ~1023u;
  unsigned char* const smem = smem_raw + (base - raw);
  const int w_bytes = kOut * chunk * kElem, stage_bytes = (kOut + MT) * chunk * kElem;
  Acc* const part = reinterpret_cast<Acc*>(smem + stages * stage_bytes);
  uint64_t* const bars = reinterpret_cast<uint64_t*>(part + MT * kOut);
  const uint32_t full = smem_addr(bars), empty = full + 8 * stages;  // barrier i at + 8 i
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    prefetch_map(&mw);
    if constexpr (kDual) prefetch_map(&mw2);
    prefetch_map(&mx);
    for (int i = 0; i < stages; ++i) {
      mbar_init(bars + i, 1);
      mbar_init(bars + stages + i, kSkinnyWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  end_dependent_prologue();  // launched as a programmatic dependent (plan.skinny().pdl)
  __syncthreads();
  int block = static_cast<int>(blockIdx.x), group = 0, expert = 0;  // group: the slot (kGroups)
  if constexpr (kGroups) {
    group = block / per_slot, block %= per_slot;
    expert = __ldg(slots + group);
    if (expert < 0) return;  // every thread of the CTA (and of its cluster: the same x)
  }
  const int row0 = block * (kDual ? kOut / 2 : kOut);
  const int64_t kb = min(s.k, int64_t{blockIdx.y} * s.slice), ke = min(s.k, kb + s.slice);
  const int n = static_cast<int>((ke - kb + chunk - 1) / chunk);
  if (warp == kSkinnyWarps) {
    if (lane == 0) {
      for (int i = 0; i < n; ++i) {
        const int slot = i % stages;
        if (i >= stages) mbar_wait(empty + 8 * slot, (i / stages - 1) & 1);
        const uint32_t bar = full + 8 * slot, wt = base + slot * stage_bytes, xt = wt + w_bytes;
        mbar_expect_tx(bar, stage_bytes);
        const int k = static_cast<int>(kb + int64_t{i} * chunk);
        if constexpr (!WK) {
          for (int b = 0; b < kOut / kBoxK; ++b)
            tma_load(wt + b * chunk * 128, &mw, row0 + b * kBoxK, k, bar);
        }
        auto load_w = [&](uint32_t dst, const CUtensorMap* map, int kk) {
          if constexpr (kGroups) {
            tma_load3(dst, map, kk, row0, expert, bar);
          } else {
            tma_load(dst, map, kk, row0, bar);
          }
        };
        for (int b = 0; b < chunk / kBoxK; ++b) {
          if constexpr (kDual) {
            load_w(wt + b * kOut * 128, &mw, k + b * kBoxK);
            load_w(wt + b * kOut * 128 + kOut / 2 * 128, &mw2, k + b * kBoxK);
          } else if constexpr (WK) {
            load_w(wt + b * kOut * 128, &mw, k + b * kBoxK);
          }
          tma_load(xt + b * MT * 128, &mx, k + b * kBoxK, group * MT, bar);
        }
      }
    }
  } else if constexpr (FMA) {
    fma_consume<MT, WK>(smem, base, stage_bytes, w_bytes, chunk, stages, n, full, empty, warp, lane,
                        part);
  } else if constexpr (std::is_same_v<T, double>) {
    dmma_consume<MT, WK>(base, stage_bytes, w_bytes, chunk, stages, n, full, empty, warp, lane,
                         part);
  } else {
    mma_consume<T, MT, WK>(base, stage_bytes, w_bytes, chunk, stages, n, full, empty, warp, lane,
                           part);
  }
  auto sum_at = [&](int t, int o) { return part + t * kOut + o; };
  if constexpr (kGroups) {  // the slot's rows of out (and of the kept products)
    Skinny sg = s;
    sg.out = static_cast<T*>(s.out) + int64_t{group} * MT * s.ldo_t;
    SkinnyFusion fg = *f;
    if (fg.aux != nullptr) fg.aux = static_cast<T*>(fg.aux) + int64_t{group} * MT * fg.ld_aux;
    if (fg.aux2 != nullptr) fg.aux2 = static_cast<T*>(fg.aux2) + int64_t{group} * MT * fg.ld_aux;
    store_outputs<T, MT, E>(sg, kOut, sum_at, &fg, block);
  } else {
    store_outputs<T, MT, E>(s, kOut, sum_at, f);
  }
#else
  __trap();  // the planner streams only where the sm_90 code runs (GemmDevice::skinny_tma)
#endif
}

// The product (mm, gemm).
template <typename T, int MT, bool WK, bool FMA>
__global__ void __launch_bounds__(kTmaThreads, FMA ? 2 : 1)
    gemm_skinny_tma(const __grid_constant__ CUtensorMap mw, const __grid_constant__ CUtensorMap mx,
                    Skinny s, int stages, int chunk) {
  skinny_tma_body<T, MT, WK, FMA, GemmEpilogue::Plain>(mw, mw, mx, s, nullptr, stages, chunk);
}

// The product with a fused epilogue E: bias and activation (one weight map), or the dual product
// (swiglu; mw2 the up weight's).
template <typename T, int MT, GemmEpilogue E> __global__ void __launch_bounds__(kTmaThreads, 1)
    gemm_skinny_tma_fused(const __grid_constant__ CUtensorMap mw,
                          const __grid_constant__ CUtensorMap mw2,
                          const __grid_constant__ CUtensorMap mx, Skinny s, SkinnyFusion f,
                          int stages, int chunk) {
  skinny_tma_body<T, MT, true, false, E>(mw, mw2, mx, s, &f, stages, chunk);
}

// The MoE decode products (ops/moe.cpp): kGroups' body, 16-bit, the experts' weights k-contiguous
// (nn.Linear's rows: Hugging Face's gate_up_proj and down_proj), Plain or Gated.
template <typename T, int MT, GemmEpilogue E> __global__ void __launch_bounds__(kTmaThreads, 1)
    gemm_skinny_tma_grouped(const __grid_constant__ CUtensorMap mw,
                            const __grid_constant__ CUtensorMap mw2,
                            const __grid_constant__ CUtensorMap mx, Skinny s, SkinnyFusion f,
                            const int32_t* slots, int per_slot, int stages, int chunk) {
  skinny_tma_body<T, MT, true, false, E, true>(mw, mw2, mx, s, &f, stages, chunk, slots, per_slot);
}

// Its launch: one CTA a slot's 64 rows of the weight (32 of each for Gated) over the whole k (the
// slots' blocks fill the SMs at decode's 8-128 slots: no k split), the ring of kSkinnyTmaStages
// stages of kSkinnyTma.chunk k, or of kSkinnyTmaDeepChunk where the blocks fill half the SMs or
// fewer (the small-M planner's rule).
template <typename T, int MT, GemmEpilogue E>
cudaError_t launch_grouped_tma(const GroupedSkinny& g, int sms, cudaStream_t stream) {
  constexpr bool kDual = E == GemmEpilogue::Gated;
  constexpr int kElem = sizeof(T), kBoxK = 128 / kElem;
  constexpr int kRows = kDual ? kSkinnyTma.outputs / 2 : kSkinnyTma.outputs;
  const int64_t per_slot = (g.n + kRows - 1) / kRows, blocks = per_slot * g.slots_n;
  const int chunk = 2 * blocks > sms ? kSkinnyTma.chunk : kSkinnyTmaDeepChunk;
  const int stages = kSkinnyTmaStages, smem = tma_smem(kElem, MT, stages, chunk);
  if (blocks <= 0 || blocks > INT32_MAX || smem > 227 * 1024) return cudaErrorInvalidValue;
  CUtensorMap mw, mw2{}, mx;
  const bool maps =
      make_map3<T>(mw, g.w, g.k, g.n, g.experts, g.ldw, g.w_group_stride, kBoxK, kRows) &&
      (!kDual ||
       make_map3<T>(mw2, g.w2, g.k, g.n, g.experts, g.ldw, g.w_group_stride, kBoxK, kRows)) &&
      make_map<T>(mx, g.x, g.k, g.slots_n * MT, g.ldx, kBoxK, MT);
  if (!maps) return cudaErrorInvalidValue;
  Skinny s{};
  s.tokens = MT, s.outputs = g.n, s.k = g.k;
  s.x = g.x, s.ldx = g.ldx, s.w = g.w, s.ldw = g.ldw;
  s.out = g.out, s.ldo_t = g.ldo, s.ldo_n = 1;
  s.alpha = 1.f, s.beta = 0.f, s.alpha64 = 1.0, s.beta64 = 0.0;
  s.slice = (g.k + chunk - 1) / chunk * chunk;
  s.rw = kSkinnyWarps, s.kw = 1;
  const SkinnyFusion f{nullptr, Activation::Silu, g.w2,
                       g.aux,   g.aux2,           g.ld_aux};  // the experts' gate
  constexpr auto kernel = gemm_skinny_tma_grouped<T, MT, E>;
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  // A programmatic dependent (the routing, then gate/up, before it): its launch and prologue overlap
  // that kernel's end.
  const ClusterLaunch launch(dim3(static_cast<unsigned>(blocks)), dim3(1), kTmaThreads, smem,
                             stream, true);
  return cudaLaunchKernelEx(&launch.cfg, kernel, mw, kDual ? mw2 : mw, mx, s, f, g.slots,
                            static_cast<int>(per_slot), stages, chunk);
}

template <typename T>
cudaError_t launch_grouped_tma_typed(const GroupedSkinny& g, int sms, cudaStream_t stream) {
  const bool dual = g.w2 != nullptr;
  if (g.mt == 8)
    return dual ? launch_grouped_tma<T, 8, GemmEpilogue::Gated>(g, sms, stream)
                : launch_grouped_tma<T, 8, GemmEpilogue::Plain>(g, sms, stream);
  if (g.mt == 16)
    return dual ? launch_grouped_tma<T, 16, GemmEpilogue::Gated>(g, sms, stream)
                : launch_grouped_tma<T, 16, GemmEpilogue::Plain>(g, sms, stream);
  return cudaErrorInvalidValue;
}

template <typename T, int MT, bool WK, bool FMA, GemmEpilogue E = GemmEpilogue::Plain>
cudaError_t launch_tma(const GemmPlan& plan, const Skinny& s, const SkinnyFusion& f,
                       cudaStream_t stream) {
  const int stages = plan.skinny().stages, chunk = plan.skinny().chunk, split = plan.skinny().split;
  constexpr int kElem = sizeof(T), kBoxK = 128 / kElem;
  const int smem = tma_smem(kElem, MT, stages, chunk);
  // A stage is whole register batches of 8 steps (two boxes), at most 256 rows (a box's limit).
  if (stages < 2 || chunk < 2 * kBoxK || chunk > 256 || chunk % (2 * kBoxK) != 0 ||
      s.slice % chunk != 0 || smem > 227 * 1024 || split < 1 || split > 8 ||
      !grid_fits(plan.grid)) {
    return cudaErrorInvalidValue;
  }
  constexpr bool kDual = E == GemmEpilogue::Gated;
  constexpr uint32_t kRows = kDual ? kSkinnyTma.outputs / 2 : kSkinnyTma.outputs;
  CUtensorMap mw, mw2, mx;
  const bool maps = (WK ? make_map<T>(mw, s.w, s.k, s.outputs, s.ldw, kBoxK, kRows)
                        : make_map<T>(mw, s.w, s.outputs, s.k, s.ldw, kBoxK, chunk)) &&
                    (!kDual || make_map<T>(mw2, f.w2, s.k, s.outputs, s.ldw, kBoxK, kRows)) &&
                    make_map<T>(mx, s.x, s.k, s.tokens, s.ldx, kBoxK, MT);
  if (!maps) return cudaErrorInvalidValue;  // the planner asked tma_describes first
  const ClusterLaunch launch(dim3(static_cast<unsigned>(plan.grid), static_cast<unsigned>(split)),
                             dim3(1, static_cast<unsigned>(split)), kTmaThreads, smem, stream,
                             plan.skinny().pdl);
  // The attribute per device, so set on every launch (one cheap driver call), as the wgmma launch
  // does.
  auto run = [&](auto kernel, auto... args) {
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
    return cudaLaunchKernelEx(&launch.cfg, kernel, args..., stages, chunk);
  };
  if constexpr (E != GemmEpilogue::Plain) {
    static_assert(WK && !FMA, "the fused products: 16-bit, k-contiguous weights");
    return run(gemm_skinny_tma_fused<T, MT, E>, mw, kDual ? mw2 : mw, mx, s, f);
  } else {
    return run(gemm_skinny_tma<T, MT, WK, FMA>, mw, mx, s);
  }
}

// A fused plan's kernel (16-bit, the weight k-contiguous: the planner's SmallMFused).
template <typename T> cudaError_t launch_tma_fused(const GemmPlan& plan, const Skinny& s,
                                                   const SkinnyFusion& f, cudaStream_t stream) {
  const GemmEpilogue e = plan.req.fusion.kind;
  const int mt = plan.skinny().mt;
  if (!plan.skinny().w_kmajor || (mt != 8 && mt != 16)) return cudaErrorInvalidValue;
  if (e == GemmEpilogue::BiasActivation) {
    return mt == 8
               ? launch_tma<T, 8, true, false, GemmEpilogue::BiasActivation>(plan, s, f, stream)
               : launch_tma<T, 16, true, false, GemmEpilogue::BiasActivation>(plan, s, f, stream);
  }
  if (e == GemmEpilogue::Gated) {
    return mt == 8 ? launch_tma<T, 8, true, false, GemmEpilogue::Gated>(plan, s, f, stream)
                   : launch_tma<T, 16, true, false, GemmEpilogue::Gated>(plan, s, f, stream);
  }
  return cudaErrorInvalidValue;
}

// FMA: float32 "highest" (true FP32 FMAs, fma_consume) rather than the tensor cores.
template <typename T, bool FMA = false>
cudaError_t launch_tma_typed(const GemmPlan& plan, const Skinny& s, const SkinnyFusion& f,
                             cudaStream_t stream) {
  if constexpr (std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>) {
    if (plan.fused) return launch_tma_fused<T>(plan, s, f, stream);
  }
  if (plan.fused) return cudaErrorInvalidValue;  // the planner fuses only 16-bit products
  const bool k = plan.skinny().w_kmajor;
  if (plan.skinny().mt == 8)
    return k ? launch_tma<T, 8, true, FMA>(plan, s, f, stream)
             : launch_tma<T, 8, false, FMA>(plan, s, f, stream);
  if (plan.skinny().mt == 16)
    return k ? launch_tma<T, 16, true, FMA>(plan, s, f, stream)
             : launch_tma<T, 16, false, FMA>(plan, s, f, stream);
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launch_skinny_tma(const GemmPlan& plan, const Skinny& s, const SkinnyFusion& f,
                              cudaStream_t stream) {
  switch (plan.req.dtype) {
    case DType::BFloat16:
      return launch_tma_typed<__nv_bfloat16>(plan, s, f, stream);
    case DType::Float16:
      return launch_tma_typed<__half>(plan, s, f, stream);
    case DType::Float32:
      return plan.req.allow_tf32 ? launch_tma_typed<float>(plan, s, f, stream)
                                 : launch_tma_typed<float, true>(plan, s, f, stream);
    case DType::Float64:
      return launch_tma_typed<double>(plan, s, f, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

// Whether the streaming form can run on `dev`. (The switch CUOPS_DISABLE_SKINNY_TMA applies on top,
// in current_gemm_device: the per-lane forms other GPUs take, and racecheck's path, which does not
// model the ring's mbarrier transactions.)
bool skinny_tma_on(int dev) { return skinny_clusters_on(dev) && tma_encoder() != nullptr; }

}  // namespace cuops::kernels::detail

namespace cuops::kernels {
cudaError_t launch_grouped_skinny(const GroupedSkinny& g, int sms, cudaStream_t stream) {
  if (g.slots_n <= 0 || g.slots == nullptr || g.n <= 0 || g.k <= 0 || g.experts <= 0 || sms <= 0 ||
      current_gemm_device().skinny_tma == false)
    return cudaErrorInvalidValue;
  switch (g.dtype) {
    case DType::BFloat16:
      return detail::launch_grouped_tma_typed<__nv_bfloat16>(g, sms, stream);
    case DType::Float16:
      return detail::launch_grouped_tma_typed<__half>(g, sms, stream);
    default:
      return cudaErrorInvalidValue;
  }
}
}  // namespace cuops::kernels
