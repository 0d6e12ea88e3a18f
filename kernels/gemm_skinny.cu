// The small-M GEMM: out[t][o] = alpha * sum_k x[t][k] w(o, k) + beta * out[t][o] for at most
// kSkinnyMaxTokens tokens t (a decode step's x @ W.t() and g @ W, gemm_plan.h). Such a product is
// bound by reading the weight once, so everything here serves the stream. Two families:
//   - the streaming form (every dtype on sm_90, gemm_skinny_tma below): a producer warp keeps a ring
//     of TMA stages (64 outputs x 128 k of the weight, and x's tokens at the same k) full, four warps
//     multiply them, on the tensor cores (bf16/fp16/TF32; float64 by DMMA with float64 sums, its only
//     form) or by FP32 FMAs (float32 "highest");
//     ~72 KB in flight per CTA, within 2-5 % of a TMA read that does nothing else
//     (bench/sweep/probe/stream_probe.cu);
//   - the per-lane forms (GPUs before sm_90, operands TMA cannot describe): each lane loads its own
//     16-byte vectors (16-bit: into registers, two chunks ahead; float32: a per-warp cp.async ring).
// Both:
//   - k is split where the outputs alone cannot fill the SMs: over the warps of a block (per-lane
//     forms), then over the CTAs of a cluster (sm_90), and the partial sums meet in shared memory
//     (the cluster's distributed shared memory) in a fixed order, so the bits are the same on every
//     run and nothing is written to global memory but the result (no workspace, no counters:
//     CUDA-graph replays just work);
//   - bf16/fp16 multiply on the tensor cores (mma.sync m16n8k16, float32 accumulation, the swapped
//     product out^T = W x^T so the weight is the 16-row operand and the tokens the 8-wide one). In the
//     per-lane forms a product's sum over k may take its terms in any order as long as both operands
//     agree, so each lane's 16-byte vectors go into the fragments as they are (the k-contiguous
//     weight), or after a byte permute (the o-contiguous one): no shared memory, no ldmatrix;
//   - float32 in the per-lane forms (both "highest" and TF32, which may compute in true FP32 and there
//     does) runs FP32 FMAs.

#include "gemm.cuh"
#include "tma.cuh"

namespace cuops::kernels::detail {
namespace {

constexpr int kThreads = kSkinnyWarps * 32;

// The kernel's view of the product: tokens x rows k-contiguous (x[t][k] at t * ldx + k); the weight
// k-contiguous (w(o, k) at o * ldw + k) or o-contiguous (at k * ldw + o); out[t][o] at
// t * ldo_t + o * ldo_n. k of slice s: [s * slice, (s + 1) * slice) within [0, k).
struct Skinny {
  int64_t tokens, outputs, k;
  const void* x;
  int64_t ldx;
  const void* w;
  int64_t ldw;
  void* out;
  int64_t ldo_t, ldo_n;
  float alpha, beta;
  double alpha64, beta64;  // the same scalars unrounded, for float64
  int64_t slice;
  int rw, kw;
};

// A weight load: 16 bytes read once, not kept in L1 (where x lives), and a 256-byte L2 prefetch
// granule (the warp's neighbouring loads are next).
__device__ __forceinline__ uint4 ld_weight(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
// x loads (read through L1, where x stays while every warp re-reads it).
__device__ __forceinline__ uint4 ld_x16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ld_x8(const void* p) {
  uint2 v;
  asm volatile("ld.global.nc.v2.u32 {%0,%1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

// `valid` (0 .. 16 / kElem) elements of size kElem from p, the rest of the 16 (or kBytes) zero: the
// edges of k and of the outputs, where a whole vector would read past the tensor.
template <int kElem, int kBytes = 16>
__device__ __forceinline__ void ld_partial(void* dst, const void* p, int valid) {
  using R = std::conditional_t<kElem == 4, uint32_t, uint16_t>;
  constexpr int kPer = kBytes / kElem;
  R e[kPer];
  const R* src = static_cast<const R*>(p);
#pragma unroll
  for (int i = 0; i < kPer; ++i) e[i] = i < valid ? src[i] : R(0);
  __builtin_memcpy(dst, e, kBytes);
}
template <int kElem> __device__ __forceinline__ uint4 ld16_partial(const void* p, int valid) {
  uint4 v;
  ld_partial<kElem>(&v, p, valid);
  return v;
}

template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

// Each form's warp computes part[t][o] for its kRows outputs from row0 over k in [kb, ke) and
// leaves it in red[t * kRows + o], its share of the block's shared memory (run()). Two ways to keep
// the weight's bytes in flight, each where it measured faster (H100, docs/performance.md, "small-M streaming form"):
//   - stream_ring (float32): each lane copies its 16-byte vectors into a ring of kStages chunks in the
//     warp's shared memory by cp.async and reads back only those (no barrier), kStages - 1 chunks in
//     flight at no cost in registers; the float32 forms hold up to 64 registers of x per chunk;
//   - stream_k (bf16/fp16): the next kUnroll chunks' loads, x's included, go to registers before the
//     current ones are multiplied. The ring ran the 16-bit forms at 0.70 of the copy rate where this
//     reaches 0.90 (235 MB weight), with x's load exposed every chunk, or prefetched one ahead.
// The last, partial chunk (only at the end of k) is read directly, by masked loads.
template <typename F> struct RingSize {
  static constexpr int kBytesPerWarp =
      F::kStages * F::kVecs * 32 * 16;  // also holds the part (static_assert)
};

template <typename F>
__device__ __forceinline__ void stream_ring(F& f, int64_t kb, int64_t ke, uint4* ring, int lane) {
  constexpr int kStages = F::kStages, kVecs = F::kVecs;
  const int64_t chunks = (ke - kb) / F::kChunk;
  auto slot = [&](int64_t c, int v) {
    return ring + (static_cast<int>(c % kStages) * kVecs + v) * 32 + lane;
  };
#pragma unroll
  for (int c = 0; c < kStages - 1; ++c) {
    if (c < chunks) f.stage(slot(c, 0), kb + int64_t{c} * F::kChunk);
    cp_async_commit();
  }
  if (chunks > 0) f.begin(kb);
  for (int64_t c = 0; c < chunks; ++c) {
    cp_async_wait<kStages - 2>();
    uint4 w[kVecs];
#pragma unroll
    for (int v = 0; v < kVecs; ++v) w[v] = *slot(c, v);
    f.compute(w, kb + c * F::kChunk, c + 1 < chunks);
    // The slot of chunk c - 1, which this lane read last trip.
    if (c + kStages - 1 < chunks)
      f.stage(slot(c + kStages - 1, 0), kb + (c + kStages - 1) * F::kChunk);
    cp_async_commit();
  }
  cp_async_wait<0>();
  if (kb + chunks * F::kChunk < ke) f.tail(kb + chunks * F::kChunk);
}

// One 16-byte weight vector into this lane's ring slot: whole by cp.async, or (an edge of the
// outputs) `valid` elements by plain loads and zeros (copy_chunk), none where valid is 0.
template <int kElem>
__device__ __forceinline__ void stage_vec(uint4* slot, const void* src, int valid) {
  copy_chunk<kElem>(slot, src, valid);
}

template <int kChunk, int kUnroll, typename G, typename Load, typename Compute, typename Tail>
__device__ __forceinline__ void stream_k(int64_t kb, int64_t ke, Load&& load, Compute&& compute,
                                         Tail&& tail) {
  constexpr int64_t kStep = int64_t{kChunk} * kUnroll;
  const int64_t full = kb + (ke - kb) / kChunk * kChunk;
  int64_t k = kb;
  if (k + kStep <= full) {
    G cur[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) load(cur[u], k + u * kChunk);
    for (k += kStep; k + kStep <= full; k += kStep) {
      G next[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) load(next[u], k + u * kChunk);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) compute(cur[u], k - kStep + u * kChunk);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) cur[u] = next[u];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) compute(cur[u], k - kStep + u * kChunk);
  }
  for (; k < full; k += kChunk) {
    G one;
    load(one, k);
    compute(one, k);
  }
  if (k < ke) tail(k);
}

// bf16/fp16, weight k-contiguous. Lane (g, q) loads outputs row0 + g and row0 + g + 8 at
// k + 8q .. k + 8q + 7 and tokens g (and g + 8) at the same k: words 0-1 of each 16 bytes are the
// A (weight) and B (x) fragments of one m16n8k16 at its k slots {2q, 2q+1, 2q+8, 2q+9}, words 2-3 of
// a second; weight and x agree on the order, so the sum is the product's.
template <typename T, int MT> struct HalfK {
  static constexpr int kRows = kSkinnyHalfK.outputs, kChunk = kSkinnyHalfK.chunk, kUnroll = 2,
                       kTiles = MT / 8;
  static constexpr int kSmemPerWarp = MT * kRows * 4;  // the warp's part
  struct Chunk {
    uint4 lo, hi, x[kTiles];
  };
  __device__ static void run(const Skinny& s, int64_t row0, int64_t kb, int64_t ke, int lane,
                             float* red) {
    const int g = lane >> 2, q = lane & 3;
    const T* w = static_cast<const T*>(s.w);
    const T* x = static_cast<const T*>(s.x);
    const bool ok_lo = row0 + g < s.outputs, ok_hi = row0 + g + 8 < s.outputs;
    const T* w_lo = w + (ok_lo ? row0 + g : 0) * s.ldw + 8 * q;
    const T* w_hi = w + (ok_hi ? row0 + g + 8 : 0) * s.ldw + 8 * q;
    const T* xr[kTiles];
    bool ok_t[kTiles];
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      ok_t[j] = g + 8 * j < s.tokens;
      xr[j] = x + (ok_t[j] ? g + 8 * j : 0) * s.ldx + 8 * q;
    }
    float acc[kTiles][4] = {};
    const uint4 zero = make_uint4(0, 0, 0, 0);
    auto compute = [&](const Chunk& c, int64_t) {
#pragma unroll
      for (int j = 0; j < kTiles; ++j) {
        mma16816<T>(acc[j], c.lo.x, c.hi.x, c.lo.y, c.hi.y, c.x[j].x, c.x[j].y);
        mma16816<T>(acc[j], c.lo.z, c.hi.z, c.lo.w, c.hi.w, c.x[j].z, c.x[j].w);
      }
    };
    auto load = [&](Chunk& c, int64_t k) {
      c.lo = ok_lo ? ld_weight(w_lo + k) : zero;
      c.hi = ok_hi ? ld_weight(w_hi + k) : zero;
#pragma unroll
      for (int j = 0; j < kTiles; ++j) c.x[j] = ok_t[j] ? ld_x16(xr[j] + k) : zero;
    };
    auto tail = [&](int64_t k) {
      const int valid = static_cast<int>(max(int64_t{0}, min(int64_t{8}, s.k - k - 8 * q)));
      Chunk c;
      c.lo = ok_lo ? ld16_partial<2>(w_lo + k, valid) : zero;
      c.hi = ok_hi ? ld16_partial<2>(w_hi + k, valid) : zero;
#pragma unroll
      for (int j = 0; j < kTiles; ++j) c.x[j] = ok_t[j] ? ld16_partial<2>(xr[j] + k, valid) : zero;
      compute(c, k);
    };
    stream_k<kChunk, kUnroll, Chunk>(kb, ke, load, compute, tail);
    // acc[j]: (output g, tokens 8j + 2q, +1), (output g + 8, the same tokens).
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      const int t = 8 * j + 2 * q;
      red[t * kRows + g] = acc[j][0];
      red[(t + 1) * kRows + g] = acc[j][1];
      red[t * kRows + g + 8] = acc[j][2];
      red[(t + 1) * kRows + g + 8] = acc[j][3];
    }
  }
};

// bf16/fp16, weight o-contiguous (g @ W's W). Lane (g, q) loads outputs row0 + 8g .. + 7 of the
// weight's rows k + 4q .. k + 4q + 3 (four 16-byte loads) and tokens g (and g + 8) at those k (8
// bytes). Byte permutes pair the rows' values of one output into the (k, k+1) words the A fragment
// holds: mma i takes outputs 8g + 2i (fragment row g) and 8g + 2i + 1 (row g + 8).
template <typename T, int MT> struct HalfN {
  static constexpr int kRows = kSkinnyHalfN.outputs, kChunk = kSkinnyHalfN.chunk, kUnroll = 2,
                       kTiles = MT / 8;
  static constexpr int kSmemPerWarp = MT * kRows * 4;  // the warp's part
  struct Chunk {
    uint4 w[4];
    uint2 x[kTiles];
  };
  __device__ static void run(const Skinny& s, int64_t row0, int64_t kb, int64_t ke, int lane,
                             float* red) {
    const int g = lane >> 2, q = lane & 3;
    const T* w = static_cast<const T*>(s.w);
    const T* x = static_cast<const T*>(s.x);
    const int64_t col = row0 + 8 * g;
    const int cols = static_cast<int>(max(int64_t{0}, min(int64_t{8}, s.outputs - col)));
    const T* wc = w + (cols > 0 ? col : 0) + int64_t{4} * q * s.ldw;
    const T* xr[kTiles];
    bool ok_t[kTiles];
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      ok_t[j] = g + 8 * j < s.tokens;
      xr[j] = x + (ok_t[j] ? g + 8 * j : 0) * s.ldx + 4 * q;
    }
    float acc[4][kTiles][4] = {};
    const uint4 zero = make_uint4(0, 0, 0, 0);
    const uint2 zero2 = make_uint2(0, 0);
    // rows: of this lane's four weight rows, how many lie before the end of k.
    auto load_rows = [&](Chunk& c, int64_t k, int rows) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const T* p = wc + (k + r) * s.ldw;
        if (r >= rows || cols == 0)
          c.w[r] = zero;
        else if (cols == 8)
          c.w[r] = ld_weight(p);
        else
          c.w[r] = ld16_partial<2>(p, cols);
      }
    };
    auto compute = [&](const Chunk& c, int64_t) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t r0 = (&c.w[0].x)[i], r1 = (&c.w[1].x)[i], r2 = (&c.w[2].x)[i],
                       r3 = (&c.w[3].x)[i];
        const uint32_t a0 = prmt(r0, r1, 0x5410), a1 = prmt(r0, r1, 0x7632);
        const uint32_t a2 = prmt(r2, r3, 0x5410), a3 = prmt(r2, r3, 0x7632);
#pragma unroll
        for (int j = 0; j < kTiles; ++j) mma16816<T>(acc[i][j], a0, a1, a2, a3, c.x[j].x, c.x[j].y);
      }
    };
    auto load = [&](Chunk& c, int64_t k) {
      load_rows(c, k, 4);
#pragma unroll
      for (int j = 0; j < kTiles; ++j) c.x[j] = ok_t[j] ? ld_x8(xr[j] + k) : zero2;
    };
    auto tail = [&](int64_t k) {
      const int rows = static_cast<int>(max(int64_t{0}, min(int64_t{4}, s.k - k - 4 * q)));
      Chunk c;
      load_rows(c, k, rows);
#pragma unroll
      for (int j = 0; j < kTiles; ++j) {
        c.x[j] = zero2;
        if (ok_t[j]) ld_partial<2, 8>(&c.x[j], xr[j] + k, rows);
      }
      compute(c, k);
    };
    stream_k<kChunk, kUnroll, Chunk>(kb, ke, load, compute, tail);
    // acc[i][j]: (output 8g + 2i, tokens 8j + 2q, +1), (output 8g + 2i + 1, the same tokens).
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < kTiles; ++j) {
        const int t = 8 * j + 2 * q, o = 8 * g + 2 * i;
        red[t * kRows + o] = acc[i][j][0];
        red[(t + 1) * kRows + o] = acc[i][j][1];
        red[t * kRows + o + 1] = acc[i][j][2];
        red[(t + 1) * kRows + o + 1] = acc[i][j][3];
      }
  }
};

// Sums v[] (kN values per lane) over the warp's 32 lanes, halving the values each lane keeps at
// every exchange: afterwards a lane holds max(1, kN / 32) sums, of the values at index
// lane * kN / 32 + i (kN >= 32) or lane / (32 / kN) (kN < 32). Each sum is taken in one fixed order.
// With kHi / kLo, over the lanes that differ only in the bits from kHi down to kLo (powers of two):
// the same with `lane` read as those bits' number and 32 as the lanes in such a group.
template <int kN, int kHi = 16, int kLo = 1>
__device__ __forceinline__ void warp_reduce_scatter(float (&v)[kN], int lane) {
  int len = kN;
#pragma unroll
  for (int off = kHi; off >= kLo; off >>= 1) {
    if (len > 1) {
      const int half = len / 2;
      const bool upper = lane & off;
#pragma unroll
      for (int i = 0; i < kN / 2; ++i) {
        if (i < half) {
          const float keep = upper ? v[i + half] : v[i], send = upper ? v[i] : v[i + half];
          v[i] = keep + __shfl_xor_sync(0xffffffffu, send, off);
        }
      }
      len = half;
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], off);
    }
  }
}

__device__ __forceinline__ float4 as_float4(const uint4& v) {
  return make_float4(__uint_as_float(v.x), __uint_as_float(v.y), __uint_as_float(v.z),
                     __uint_as_float(v.w));
}

// float32, weight k-contiguous. The lanes split each chunk of 128 k (4 floats each) over kRows
// outputs; at the end the lanes' partial dot products are summed across the warp. Tokens past the
// last read the last one's x (their sums are never stored): loads without a branch, which the
// compiler issues together (behind `if (t >= tokens)` each load waited on its own).
template <int MT> struct FloatK {
  static constexpr int kRows = kSkinnyFloatK.outputs, kChunk = kSkinnyFloatK.chunk;
  static constexpr int kVecs = kRows, kStages = 4;
  static constexpr int kSmemPerWarp = RingSize<FloatK>::kBytesPerWarp;
  __device__ static void run(const Skinny& s, int64_t row0, int64_t kb, int64_t ke, int lane,
                             float* red) {
    FloatK f(s, row0, lane);
    stream_ring(f, kb, ke, reinterpret_cast<uint4*>(red), lane);
    f.finish(red);
  }
  const Skinny& s;
  int lane;
  bool ok_r[kRows];
  const float *wr[kRows], *xr;
  float acc[kRows * MT] = {};

  __device__ FloatK(const Skinny& sk, int64_t row0, int ln) : s(sk), lane(ln) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      ok_r[r] = row0 + r < s.outputs;
      wr[r] = static_cast<const float*>(s.w) + (ok_r[r] ? row0 + r : 0) * s.ldw + 4 * lane;
    }
    xr = static_cast<const float*>(s.x) + 4 * lane;
  }
  __device__ void stage(uint4* slot, int64_t k) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) stage_vec<4>(slot + 32 * r, wr[r] + k, ok_r[r] ? 4 : 0);
  }
  __device__ void multiply(const uint4 (&w)[kRows], int64_t k, int valid) {
    const int last = static_cast<int>(s.tokens) - 1;
#pragma unroll
    for (int t = 0; t < MT; ++t) {
      const float* xp = xr + min(t, last) * s.ldx + k;
      const float4 xf = as_float4(valid == 4 ? ld_x16(xp) : ld16_partial<4>(xp, valid));
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float4 wf = as_float4(w[r]);
        float& a = acc[r * MT + t];
        a = fmaf(wf.x, xf.x, a);
        a = fmaf(wf.y, xf.y, a);
        a = fmaf(wf.z, xf.z, a);
        a = fmaf(wf.w, xf.w, a);
      }
    }
  }
  __device__ void begin(int64_t) {}
  __device__ void compute(const uint4 (&w)[kVecs], int64_t k, bool) { multiply(w, k, 4); }
  __device__ void tail(int64_t k) {
    const int valid = static_cast<int>(max(int64_t{0}, min(int64_t{4}, s.k - k - 4 * lane)));
    uint4 w[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      w[r] = ok_r[r] ? ld16_partial<4>(wr[r] + k, valid) : make_uint4(0, 0, 0, 0);
    multiply(w, k, valid);
  }
  __device__ void finish(float* red) {
    warp_reduce_scatter(acc, lane);
    constexpr int kN = kRows * MT;
    if constexpr (kN >= 32) {
#pragma unroll
      for (int i = 0; i < kN / 32; ++i) {
        const int idx = lane * (kN / 32) + i;
        red[(idx % MT) * kRows + idx / MT] = acc[i];
      }
    } else {
      const int idx = lane / (32 / kN);
      if (lane % (32 / kN) == 0) red[(idx % MT) * kRows + idx / MT] = acc[0];
    }
  }
};

// float32, weight o-contiguous. Lane l owns outputs row0 + 4l .. + 3 (16 bytes of each weight row)
// and walks k four rows at a time; x's four values per token are one 16-byte load the whole warp
// shares (one address); tokens past the last as in FloatK.
template <int MT> struct FloatN {
  static constexpr int kRows = kSkinnyFloatN.outputs, kChunk = kSkinnyFloatN.chunk;
  static constexpr int kVecs = 4, kStages = 4;
  static constexpr int kSmemPerWarp = RingSize<FloatN>::kBytesPerWarp;
  __device__ static void run(const Skinny& s, int64_t row0, int64_t kb, int64_t ke, int lane,
                             float* red) {
    FloatN f(s, row0, lane);
    stream_ring(f, kb, ke, reinterpret_cast<uint4*>(red), lane);
    f.finish(red);
  }
  const Skinny& s;
  int lane, cols;
  const float* wc;
  float acc[4][MT] = {};

  __device__ FloatN(const Skinny& sk, int64_t row0, int ln) : s(sk), lane(ln) {
    const int64_t col = row0 + 4 * lane;
    cols = static_cast<int>(max(int64_t{0}, min(int64_t{4}, s.outputs - col)));
    wc = static_cast<const float*>(s.w) + (cols > 0 ? col : 0);
  }
  __device__ void stage(uint4* slot, int64_t k) {
#pragma unroll
    for (int r = 0; r < 4; ++r) stage_vec<4>(slot + 32 * r, wc + (k + r) * s.ldw, cols);
  }
  __device__ void multiply(const uint4 (&w)[4], int64_t k, int rows) {
    const int last = static_cast<int>(s.tokens) - 1;
    const float* x = static_cast<const float*>(s.x);
#pragma unroll
    for (int t = 0; t < MT; ++t) {
      const float* xp = x + min(t, last) * s.ldx + k;
      const float4 xf = as_float4(rows == 4 ? ld_x16(xp) : ld16_partial<4>(xp, rows));
      const float xs[4] = {xf.x, xf.y, xf.z, xf.w};
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float4 wf = as_float4(w[r]);
        acc[0][t] = fmaf(wf.x, xs[r], acc[0][t]);
        acc[1][t] = fmaf(wf.y, xs[r], acc[1][t]);
        acc[2][t] = fmaf(wf.z, xs[r], acc[2][t]);
        acc[3][t] = fmaf(wf.w, xs[r], acc[3][t]);
      }
    }
  }
  __device__ void begin(int64_t) {}
  __device__ void compute(const uint4 (&w)[kVecs], int64_t k, bool) { multiply(w, k, 4); }
  __device__ void tail(int64_t k) {
    const int rows = static_cast<int>(s.k - k);
    uint4 w[4];
#pragma unroll
    for (int r = 0; r < 4; ++r)
      w[r] = r < rows ? ld16_partial<4>(wc + (k + r) * s.ldw, cols) : make_uint4(0, 0, 0, 0);
    multiply(w, k, rows);
  }
  __device__ void finish(float* red) {
#pragma unroll
    for (int t = 0; t < MT; ++t) {
      *reinterpret_cast<float4*>(red + t * kRows + 4 * lane) =
          make_float4(acc[0][t], acc[1][t], acc[2][t], acc[3][t]);
    }
  }
};

#if __CUDA_ARCH__ >= 900
// The sum at `local` (this CTA's shared memory) in the shared memory of cluster CTA `rank`.
__device__ __forceinline__ float ld_cluster(const float* local, int rank) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n"
               : "=f"(v)
               : "r"(map_cluster(smem_addr(local), rank)));
  return v;
}
__device__ __forceinline__ double ld_cluster(const double* local, int rank) {
  double v;
  asm volatile("ld.shared::cluster.f64 %0, [%1];\n"
               : "=d"(v)
               : "r"(map_cluster(smem_addr(local), rank)));
  return v;
}
#endif

// Writes the block's outputs [blockIdx.x * outs, + outs) for every token: alpha times the sum that
// sum_at(t, o) points to in this CTA's shared memory (all of them written before the call), plus beta
// times out. With a cluster along k (gridDim.y CTAs), each CTA stores a share and every output's sum
// is taken over the cluster in rank order, whichever CTA finishes it. All threads of the block call.
template <typename T, int MT, typename SumAt>
__device__ __forceinline__ void store_outputs(const Skinny& s, int outs, SumAt&& sum_at) {
  const int split = static_cast<int>(gridDim.y);
  int rank = 0;
#if __CUDA_ARCH__ >= 900
  if (split > 1) {
    cluster_sync();
    rank = static_cast<int>(cluster_rank());
  }
#else
  if (split > 1)
    __trap();  // the planner splits over clusters only where they exist (GemmDevice::clusters)
#endif
  __syncthreads();
  // Output element e: token e / outs, output e % outs (consecutive threads along o).
  const int threads = static_cast<int>(blockDim.x);
  for (int e = static_cast<int>(threadIdx.x) + rank * threads; e < MT * outs;
       e += threads * split) {
    const int t = e / outs, o = e % outs;
    const int64_t og = int64_t{blockIdx.x} * outs + o;
    if (t >= s.tokens || og >= s.outputs) continue;
    const acc_t<T>* sum = sum_at(t, o);
    acc_t<T> v = *sum;
#if __CUDA_ARCH__ >= 900
    if (split > 1) {
      v = ld_cluster(sum, 0);
      for (int c = 1; c < split; ++c) v += ld_cluster(sum, c);
    }
#endif
    T* dst = static_cast<T*>(s.out) + t * s.ldo_t + og * s.ldo_n;
    if constexpr (std::is_same_v<T, double>) {
      double r = s.alpha64 * v;
      if (s.beta64 != 0.0) r = fma(s.beta64, *dst, r);  // beta == 0 never reads out
      *dst = r;
    } else {
      float r = s.alpha * v;
      if (s.beta != 0.f) r = fmaf(s.beta, to_acc(*dst), r);
      *dst = from_acc<T>(r);
    }
  }
#if __CUDA_ARCH__ >= 900
  if (split > 1) cluster_sync();  // no CTA leaves while another may still read its shared memory
#endif
}

template <typename T, typename F, int MT> __global__ void __launch_bounds__(kThreads)
    gemm_skinny(Skinny s) {
  constexpr int kRows = F::kRows, kRed = MT * kRows;
  static_assert(kRed * 4 <= F::kSmemPerWarp, "a warp's part fits in its share");
  // Per warp: its ring (float32), then (after its last copy landed) its part of the sums.
  extern __shared__ __align__(16) unsigned char smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  auto part = [&](int w) { return reinterpret_cast<float*>(smem + w * F::kSmemPerWarp); };
  const int rw = warp / s.kw, kw = warp % s.kw;
  const int64_t row0 = (int64_t{blockIdx.x} * s.rw + rw) * kRows;
  const int64_t slice = int64_t{blockIdx.y} * s.kw + kw;
  const int64_t kb = min(s.k, slice * s.slice), ke = min(s.k, kb + s.slice);
  F::run(s, row0, kb, ke, lane, part(warp));
  __syncthreads();

  // red[r * kw][i] <- sum over the block's k-warps of red[r * kw + j][i], j in order.
  const int per_block = s.rw * MT * kRows;
  for (int e = threadIdx.x; e < per_block; e += kThreads) {
    const int r = e / kRed, i = e % kRed;
    float v = part(r * s.kw)[i];
    for (int j = 1; j < s.kw; ++j) v += part(r * s.kw + j)[i];
    part(r * s.kw)[i] = v;
  }
  // Output (t, o): the sum in the first k-warp's part of o's row of warps.
  store_outputs<T, MT>(s, s.rw * kRows, [&](int t, int o) {
    return part((o / kRows) * s.kw) + t * kRows + o % kRows;
  });
}

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
#endif

template <typename T, int MT, bool WK, bool FMA>
__global__ void __launch_bounds__(kTmaThreads, FMA ? 2 : 1)
    gemm_skinny_tma(const __grid_constant__ CUtensorMap mw, const __grid_constant__ CUtensorMap mx,
                    Skinny s, int stages, int chunk) {
#if __CUDA_ARCH__ >= 900
  constexpr int kOut = kSkinnyTma.outputs;
  // A box row is 128 bytes: kBoxK elements; one mma step takes kStepK of k (two 16-byte units).
  constexpr int kElem = sizeof(T), kBoxK = 128 / kElem, kStepK = 32 / kElem;
  constexpr bool kTf32 = std::is_same_v<T, float>;
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
    prefetch_map(&mx);
    for (int i = 0; i < stages; ++i) {
      mbar_init(bars + i, 1);
      mbar_init(bars + stages + i, kSkinnyWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  end_dependent_prologue();  // launched as a programmatic dependent (plan.sk_pdl)
  __syncthreads();
  const int row0 = static_cast<int>(blockIdx.x) * kOut;
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
        for (int b = 0; b < chunk / kBoxK; ++b) {
          if constexpr (WK) tma_load(wt + b * kOut * 128, &mw, k + b * kBoxK, row0, bar);
          tma_load(xt + b * MT * 128, &mx, k + b * kBoxK, 0, bar);
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
    // Two accumulator sets (even and odd k steps) halve the chain of dependent mma per stage. Each
    // 8 steps (two boxes) of a stage are read into registers first (ldmatrix), and the stage is
    // released to the producer after its last such read, before the multiplies: the ring refills
    // while they run. TF32 (m16n8k8) reads the same units: a 16-byte unit is 4 floats there, and
    // ldmatrix's b16 view hands lane (g, q) word q of row g, the fragment's element; the
    // o-contiguous weight, which would need a 32-bit transpose, is read by 32-bit loads instead.
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
  store_outputs<T, MT>(s, kOut, [&](int t, int o) { return part + t * kOut + o; });
#else
  __trap();  // the planner streams only where the sm_90 code runs (GemmDevice::skinny_tma)
#endif
}

template <typename T, int MT, bool WK, bool FMA>
cudaError_t launch_tma(const GemmPlan& plan, const Skinny& s, cudaStream_t stream) {
  const int stages = plan.sk_stages, chunk = plan.sk_chunk, split = plan.sk_split;
  constexpr int kElem = sizeof(T), kBoxK = 128 / kElem;
  const int smem = tma_smem(kElem, MT, stages, chunk);
  // A stage is whole register batches of 8 steps (two boxes), at most 256 rows (a box's limit).
  if (stages < 2 || chunk < 2 * kBoxK || chunk > 256 || chunk % (2 * kBoxK) != 0 ||
      s.slice % chunk != 0 || smem > 227 * 1024 || split < 1 || split > 8 ||
      !grid_fits(plan.grid)) {
    return cudaErrorInvalidValue;
  }
  CUtensorMap mw, mx;
  const bool maps = (WK ? make_map<T>(mw, s.w, s.k, s.outputs, s.ldw, kBoxK, kSkinnyTma.outputs)
                        : make_map<T>(mw, s.w, s.outputs, s.k, s.ldw, kBoxK, chunk)) &&
                    make_map<T>(mx, s.x, s.k, s.tokens, s.ldx, kBoxK, MT);
  if (!maps) return cudaErrorInvalidValue;  // the planner asked tma_describes first
  constexpr auto kernel = gemm_skinny_tma<T, MT, WK, FMA>;
  // Per device, so set on every launch (one cheap driver call), as the wgmma launch does.
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attrs[2]{};
  cfg.gridDim = dim3(static_cast<unsigned>(plan.grid), static_cast<unsigned>(split));
  cfg.blockDim = dim3(kTmaThreads);
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg.stream = stream;
  cfg.attrs = attrs;
  if (split > 1) {
    cudaLaunchAttribute& a = attrs[cfg.numAttrs++];
    a.id = cudaLaunchAttributeClusterDimension;
    a.val.clusterDim.x = 1, a.val.clusterDim.y = static_cast<unsigned>(split),
    a.val.clusterDim.z = 1;
  }
  if (plan.sk_pdl) {
    cudaLaunchAttribute& a = attrs[cfg.numAttrs++];
    a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    a.val.programmaticStreamSerializationAllowed = 1;
  }
  return cudaLaunchKernelEx(&cfg, kernel, mw, mx, s, stages, chunk);
}

// FMA: float32 "highest" (true FP32 FMAs, fma_consume) rather than the tensor cores.
template <typename T, bool FMA = false>
cudaError_t launch_tma_typed(const GemmPlan& plan, const Skinny& s, cudaStream_t stream) {
  const bool k = plan.sk_w_kmajor;
  if (plan.sk_mt == 8)
    return k ? launch_tma<T, 8, true, FMA>(plan, s, stream)
             : launch_tma<T, 8, false, FMA>(plan, s, stream);
  if (plan.sk_mt == 16)
    return k ? launch_tma<T, 16, true, FMA>(plan, s, stream)
             : launch_tma<T, 16, false, FMA>(plan, s, stream);
  return cudaErrorInvalidValue;
}

template <typename T, typename F, int MT>
cudaError_t launch(const GemmPlan& plan, const Skinny& s, cudaStream_t stream) {
  if (!grid_fits(plan.grid) || plan.sk_split < 1 || plan.sk_split > 8)
    return cudaErrorInvalidConfiguration;
  constexpr int kSmem = kSkinnyWarps * F::kSmemPerWarp;
  static_assert(kSmem <= 48 * 1024, "no opt-in to more shared memory needed");
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr{};
  cfg.gridDim = dim3(static_cast<unsigned>(plan.grid), static_cast<unsigned>(plan.sk_split));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmem;
  cfg.stream = stream;
  if (plan.sk_split > 1) {
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = 1, attr.val.clusterDim.y = static_cast<unsigned>(plan.sk_split),
    attr.val.clusterDim.z = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&cfg, gemm_skinny<T, F, MT>, s);
}

template <typename T, template <typename, int> class FK, template <typename, int> class FN>
cudaError_t launch_half(const GemmPlan& plan, const Skinny& s, cudaStream_t stream) {
  if (plan.sk_mt == 8)
    return plan.sk_w_kmajor ? launch<T, FK<T, 8>, 8>(plan, s, stream)
                            : launch<T, FN<T, 8>, 8>(plan, s, stream);
  if (plan.sk_mt == 16)
    return plan.sk_w_kmajor ? launch<T, FK<T, 16>, 16>(plan, s, stream)
                            : launch<T, FN<T, 16>, 16>(plan, s, stream);
  return cudaErrorInvalidValue;
}

cudaError_t launch_float(const GemmPlan& plan, const Skinny& s, cudaStream_t stream) {
  const bool k = plan.sk_w_kmajor;
  switch (plan.sk_mt) {
    case 4:
      return k ? launch<float, FloatK<4>, 4>(plan, s, stream)
               : launch<float, FloatN<4>, 4>(plan, s, stream);
    case 8:
      return k ? launch<float, FloatK<8>, 8>(plan, s, stream)
               : launch<float, FloatN<8>, 8>(plan, s, stream);
    case 16:
      return k ? launch<float, FloatK<16>, 16>(plan, s, stream)
               : launch<float, FloatN<16>, 16>(plan, s, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launch_gemm_skinny(const GemmPlan& plan, const GemmProblem& p, cudaStream_t stream) {
  if (plan.sk_rw * plan.sk_kw != kSkinnyWarps || plan.sk_slice < 1) return cudaErrorInvalidValue;
  Skinny s{};
  s.k = p.k;
  s.out = p.c;
  s.alpha = p.alpha, s.beta = p.beta;
  s.alpha64 = p.alpha64, s.beta64 = p.beta64;
  s.slice = plan.sk_slice;
  s.rw = plan.sk_rw, s.kw = plan.sk_kw;
  if (plan.sk_tokens_m) {  // x = A (k-major), the weight B: out[t][o] = C[t][o]
    s.tokens = p.m, s.outputs = p.n;
    s.x = p.a, s.ldx = p.lda, s.w = p.b, s.ldw = p.ldb;
    s.ldo_t = p.ldc, s.ldo_n = 1;
  } else {  // x = B^T (B k-major), the weight A^T: out[t][o] = C[o][t]
    s.tokens = p.n, s.outputs = p.m;
    s.x = p.b, s.ldx = p.ldb, s.w = p.a, s.ldw = p.lda;
    s.ldo_t = 1, s.ldo_n = p.ldc;
  }
  if (plan.sk_tma) {
    switch (plan.req.dtype) {
      case DType::BFloat16:
        return launch_tma_typed<__nv_bfloat16>(plan, s, stream);
      case DType::Float16:
        return launch_tma_typed<__half>(plan, s, stream);
      case DType::Float32:
        return plan.req.allow_tf32 ? launch_tma_typed<float>(plan, s, stream)
                                   : launch_tma_typed<float, true>(plan, s, stream);
      case DType::Float64:
        return launch_tma_typed<double>(plan, s, stream);
      default:
        return cudaErrorInvalidValue;
    }
  }
  switch (plan.req.dtype) {
    case DType::BFloat16:
      return launch_half<__nv_bfloat16, HalfK, HalfN>(plan, s, stream);
    case DType::Float16:
      return launch_half<__half, HalfK, HalfN>(plan, s, stream);
    case DType::Float32:
      return launch_float(plan, s, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

// Clusters need the sm_90 form of the kernel: a build without it runs on a 9.0 device by JIT from
// compute_80 PTX, where the cluster code is compiled out.
bool skinny_clusters_on(int dev) {
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  cudaFuncAttributes attr{};
  if (major < 9 ||
      cudaFuncGetAttributes(&attr, gemm_skinny<__nv_bfloat16, HalfK<__nv_bfloat16, 8>, 8>) !=
          cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.ptxVersion >= 90;
}

// Whether the streaming form can run on `dev`. (The switch CUOPS_DISABLE_SKINNY_TMA applies on top,
// in current_gemm_device: the per-lane forms other GPUs take, and racecheck's path, which does not
// model the ring's mbarrier transactions.)
bool skinny_tma_on(int dev) { return skinny_clusters_on(dev) && tma_encoder() != nullptr; }

}  // namespace cuops::kernels::detail
