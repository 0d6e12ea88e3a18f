// The small-M GEMM's per-lane forms (gemm_skinny.cuh says what the two families are): each lane
// loads its own 16-byte vectors of the weight; k split over a block's warps, then a cluster's CTAs.
#include "gemm_skinny.cuh"

namespace cuops::kernels::detail {
namespace {

constexpr int kThreads = kSkinnyWarps * 32;

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
  // The ring becomes the warp's part of the sums (finish): every lane's copies into it must land
  // before any lane writes there. The shuffles of finish order them in practice, not in the memory
  // model; racecheck flagged the plain-store writes (edge vectors) against finish's stores.
  __syncwarp();
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

template <typename T, typename F, int MT>
cudaError_t launch(const GemmPlan& plan, const Skinny& s, cudaStream_t stream) {
  if (!grid_fits(plan.grid) || plan.skinny().split < 1 || plan.skinny().split > 8)
    return cudaErrorInvalidConfiguration;
  constexpr int kSmem = kSkinnyWarps * F::kSmemPerWarp;
  static_assert(kSmem <= 48 * 1024, "no opt-in to more shared memory needed");
  const unsigned split = static_cast<unsigned>(plan.skinny().split);
  const ClusterLaunch launch(dim3(static_cast<unsigned>(plan.grid), split), dim3(1, split),
                             kThreads, kSmem, stream);
  return cudaLaunchKernelEx(&launch.cfg, gemm_skinny<T, F, MT>, s);
}

template <typename T, template <typename, int> class FK, template <typename, int> class FN>
cudaError_t launch_half(const GemmPlan& plan, const Skinny& s, cudaStream_t stream) {
  if (plan.skinny().mt == 8)
    return plan.skinny().w_kmajor ? launch<T, FK<T, 8>, 8>(plan, s, stream)
                                  : launch<T, FN<T, 8>, 8>(plan, s, stream);
  if (plan.skinny().mt == 16)
    return plan.skinny().w_kmajor ? launch<T, FK<T, 16>, 16>(plan, s, stream)
                                  : launch<T, FN<T, 16>, 16>(plan, s, stream);
  return cudaErrorInvalidValue;
}

cudaError_t launch_float(const GemmPlan& plan, const Skinny& s, cudaStream_t stream) {
  const bool k = plan.skinny().w_kmajor;
  switch (plan.skinny().mt) {
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

cudaError_t launch_skinny_lanes(const GemmPlan& plan, const Skinny& s, cudaStream_t stream) {
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

}  // namespace cuops::kernels::detail
