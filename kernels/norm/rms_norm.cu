// RMSNorm and the residual add before it (rms_norm, add_rms_norm; docs/ops.md): one pass over the
// rows each way, float32 math (float64 for float64).
//
// A row of d elements is held by a group of G threads (a power of two, 1 to 512), each with up to
// kPer vectors of E elements (16 bytes of the base type T, or single elements where rows are not
// 16-byte aligned) in registers, so the row is read once: its sum of squares is a sum within the
// group (shuffles, then shared memory across the group's warps) and the same registers are scaled
// and stored. A block holds at least kMinBlock threads, so short rows (q/k norms over a 128-wide
// head) put several rows in a block. kPer is kFwdPer vectors forward and kBwdPer backward (which
// holds three values an element): register arrays sized for 8 vectors of bf16 (64 floats) held
// the forward to a few blocks an SM (0.59 of copy at 8192 x 4096 bf16).
//
// Mixed dtypes (Hugging Face's under autocast: a float32 residual stream beside half sublayer
// outputs, float32 master weights; and a norm handing the next GEMM its half input): x (T), the sum
// s (S), the weight (W) and y (Y) each have their type, in the mixes fwd_instance lists. The sum is
// rounded to S before it is normalised, as torch's `residual + x` is before the norm reads it.
//
// The backward: ds = rstd (g - s rstd^2 mean(g s)) with g = dy w, plus the gradient reaching the
// sum directly (add_rms_norm's second output); dweight = the column sums of dy s rstd over the rows.
// Those column sums are deterministic: the backward's grid is a fixed function of the rows (not of
// the GPU), each block sums its rows in order into one partial row of the workspace (its groups
// added in group order), and a second kernel adds the partials in block order. No float atomics.
#include "kernels/common.cuh"

namespace cuops::kernels {
namespace detail {
namespace {

// kMaxGroup: a block of at most 512 threads leaves the compiler 128 registers a thread (1024
// capped them at 64: the backward spilled).
// The backward runs a fixed grid of kBwdBlocks blocks of kBwdBlock threads (two an SM on an H100's
// 132), each summing its rows' weight gradient into one partial row: 264 partial rows, which the
// column sums read in 2.1-2.6 us. Blocks of 128 threads (1056 of them, 84 registers a thread: 5
// resident an SM, so two waves) wrote 1056 partial rows, 8.6 MB at D = 2048. The rows a thread holds
// stay in their loaded bytes (a bf16 element in half a register, not a float), so the kernel fits 64
// registers a thread: 41 us for the bf16 backward of 8192 x 2048, 0.78 of copy with L2 flushed.
constexpr int kFwdPer = 4, kBwdPer = 2, kMinBlock = 128, kMaxGroup = 512;
constexpr int kBwdBlock = 512, kBwdBlocks = 264;

// The sum of v over the group of g threads holding a row (g a power of two; lanes of one warp below
// 32, whole warps above): the same value in every thread of the group, added in one fixed order.
// red: blockDim / 32 values of shared memory. Every thread of the block calls.
template <typename A> __device__ __forceinline__ A group_sum(A v, int g, A* red) {
  const int lane = threadIdx.x % 32;
  for (int off = min(g, 32) / 2; off >= 1; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  if (g <= 32) return v;
  const int warp = threadIdx.x / 32, warps = g / 32, first = (threadIdx.x / g) * warps;
  __syncthreads();  // red's previous readers are done
  if (lane == 0) red[warp] = v;
  __syncthreads();
  A total = red[first];
  for (int w = 1; w < warps; ++w) total += red[first + w];
  return total;
}

// E elements of U as loaded: whole 32-bit words (a half-type pair in one), so a row held across the
// backward's reduction costs its bytes in registers, not a float an element.
template <typename U, int E> struct Raw {
  uint32_t w[(E * sizeof(U) + 3) / 4];
};
template <typename U, int E> __device__ __forceinline__ void load_raw(const U* p, Raw<U, E>& r) {
  constexpr int kBytes = E * sizeof(U);
  static_assert(E == 1 || kBytes % 16 == 0 || kBytes == 8, "whole 8- or 16-byte accesses");
  if constexpr (kBytes % 16 == 0) {
#pragma unroll
    for (int c = 0; c < kBytes / 16; ++c) {
      const uint4 v = reinterpret_cast<const uint4*>(p)[c];
      r.w[4 * c] = v.x, r.w[4 * c + 1] = v.y, r.w[4 * c + 2] = v.z, r.w[4 * c + 3] = v.w;
    }
  } else if constexpr (kBytes == 8) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    r.w[0] = v.x, r.w[1] = v.y;
  } else {  // one element (E = 1)
    r.w[0] = 0;
    const U u = p[0];
    __builtin_memcpy(r.w, &u, sizeof(U));
  }
}
template <typename U, int E, typename A>
__device__ __forceinline__ void unpack_raw(const Raw<U, E>& r, A (&f)[E]) {
  if constexpr (is_half_type<U> && E % 2 == 0) {
#pragma unroll
    for (int i = 0; i < E / 2; ++i) {
      const float2 p = unpack_pair(r.w[i], U{});
      f[2 * i] = p.x, f[2 * i + 1] = p.y;
    }
  } else {
    U u[E];
    __builtin_memcpy(u, r.w, sizeof(u));
#pragma unroll
    for (int i = 0; i < E; ++i) f[i] = static_cast<A>(to_acc(u[i]));
  }
}

// f (values of U, as A) into their bytes: the inverse of unpack_raw for values U holds exactly.
template <typename U, int E, typename A>
__device__ __forceinline__ void pack_raw(const A (&f)[E], Raw<U, E>& r) {
  if constexpr (is_half_type<U> && E % 2 == 0) {
#pragma unroll
    for (int i = 0; i < E / 2; ++i)
      r.w[i] = pack_pair(static_cast<float>(f[2 * i]), static_cast<float>(f[2 * i + 1]), U{});
  } else {
    U u[E];
#pragma unroll
    for (int i = 0; i < E; ++i) u[i] = from_acc<U>(static_cast<acc_t<U>>(f[i]));
    r.w[sizeof(r.w) / 4 - 1] = 0;
    __builtin_memcpy(r.w, u, sizeof(u));
  }
}

struct Shape {
  int64_t rows, d;
  int g, per;  // threads a row; vectors a thread (at most the kernel's kPer)
};

// y = s rstd w over rows, s = x (+ residual, rounded to its dtype and stored in sum); rstd kept
// where asked. The row is held as s's bytes (Raw) and, where the weight's vector is one access at
// most (W no wider than x), the weight is loaded beside it, before the reduction: loaded after it,
// each thread waited out an L1/L2 round trip between the reduction and its stores. bf16 8192 x 2048
// on an H100: 27.6 against 31.4 us (0.99 against 0.87 of a copy of the same bytes); 131072 x 128:
// 28.5 against 34.3 us.
// kRes: add_rms_norm (res and sum set), an instance of its own: its x and residual registers
// would otherwise hold rms_norm's occupancy down too (bf16 78 -> 111 registers a thread).
template <typename T, typename S, typename W, typename Y, int E, bool kRes, int kPer = kFwdPer>
__global__ void __launch_bounds__(kMaxGroup)
    rms_norm_fwd(Shape sh, const T* x, int64_t ld_x, const S* res, int64_t ld_res, const W* w,
                 acc_t<T> eps, Y* y, S* sum, acc_t<T>* rstd_out) {
  using A = acc_t<T>;
  constexpr bool kEarlyW = E == 1 || E * sizeof(W) <= 16;
  __shared__ A red[kMaxGroup / 32];
  const int g = sh.g, per = sh.per, rows_a_block = static_cast<int>(blockDim.x) / g;
  const int slot = static_cast<int>(threadIdx.x) / g, lane = static_cast<int>(threadIdx.x) % g;
  const int64_t vecs = sh.d / E;
  for (int64_t base = int64_t{blockIdx.x} * rows_a_block; base < sh.rows;
       base += int64_t{gridDim.x} * rows_a_block) {
    const int64_t row = base + slot;
    const bool live = row < sh.rows;
    Raw<S, E> sr[kPer];
    Raw<W, kEarlyW ? E : 1> wr[kPer];
    Raw<T, E> xr[kRes ? kPer : 1];  // add_rms_norm: x and the residual as loaded
    Raw<S, E> rr[kRes ? kPer : 1];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int64_t j = lane + int64_t{i} * g;
      if (i < per && live && j < vecs) {
        if constexpr (kRes) {
          load_raw<T, E>(x + row * ld_x + j * E, xr[i]);
          load_raw<S, E>(res + row * ld_res + j * E, rr[i]);
        } else {
          load_raw<S, E>(x + row * ld_x + j * E, sr[i]);
        }
        if constexpr (kEarlyW) load_raw<W, E>(w + j * E, wr[i]);
      }
    }
    // The sum, rounded to S as torch's residual + x is, stored once every load is issued: stored
    // between one vector's loads and the next (the compiler cannot move a load above a store that
    // may alias it), it left one vector of x and of the residual in flight a thread.
    if constexpr (kRes) {
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int64_t j = lane + int64_t{i} * g;
        if (i < per && live && j < vecs) {
          A v[E], r[E];
          unpack_raw(xr[i], v);
          unpack_raw(rr[i], r);
#pragma unroll
          for (int e = 0; e < E; ++e) v[e] += r[e];
          store_elems<S, E>(sum + row * sh.d + j * E, v);
          pack_raw(v, sr[i]);
        }
      }
    }
    A ss = 0;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int64_t j = lane + int64_t{i} * g;
      if (i < per && live && j < vecs) {
        A v[E];
        unpack_raw(sr[i], v);
#pragma unroll
        for (int e = 0; e < E; ++e) ss += v[e] * v[e];
      }
    }
    ss = group_sum(ss, g, red);
    const A r = A(1) / sqrt(ss / static_cast<A>(sh.d) + eps);
    if (live && lane == 0 && rstd_out != nullptr) rstd_out[row] = r;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int64_t j = lane + int64_t{i} * g;
      if (i < per && live && j < vecs) {
        A v[E], wv[E];
        unpack_raw(sr[i], v);
        if constexpr (kEarlyW) {
          unpack_raw(wr[i], wv);
        } else {
          load_elems<W, E>(w + j * E, wv);
        }
#pragma unroll
        for (int e = 0; e < E; ++e) v[e] = v[e] * r * wv[e];
        store_elems<Y, E>(y + row * sh.d + j * E, v);
      }
    }
  }
}

// ds = rstd (g - s rstd^2 sum(g s) / d) + dsum, g = dy w, stored where ds is set, and rounded on to
// X in dx where X is another type and dx is set (the bits of ds.to(X), without the cast's pass over
// ds); where partial is set, this block's rows' dy s rstd summed per column into
// partial[blockIdx.x][.] (rows in order; the block's groups added in slot order).
template <typename S, typename W, typename Y, typename X, int E, int kPer = kBwdPer>
__global__ void __launch_bounds__(kBwdBlock, 2)
    rms_norm_bwd(Shape sh, const Y* dy, const S* s, const W* w, const acc_t<S>* rstd, const S* dsum,
                 S* ds, X* dx, acc_t<S>* partial) {
  using A = acc_t<S>;
  extern __shared__ unsigned char smem_raw[];  // the slots' column sums (rows_a_block > 1)
  __shared__ A red[kBwdBlock / 32];
  const int g = sh.g, per = sh.per, rows_a_block = kBwdBlock / g;
  const int slot = static_cast<int>(threadIdx.x) / g, lane = static_cast<int>(threadIdx.x) % g;
  const int64_t vecs = sh.d / E;
  A dw[kPer][E] = {};
  for (int64_t base = int64_t{blockIdx.x} * rows_a_block; base < sh.rows;
       base += int64_t{gridDim.x} * rows_a_block) {
    const int64_t row = base + slot;
    const bool live = row < sh.rows;
    Raw<Y, E> gr[kPer];
    Raw<S, E> sr[kPer];
    A dot = 0;
    const A r = live ? rstd[row] : A(0);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int64_t j = lane + int64_t{i} * g;
      if (i < per && live && j < vecs) {
        load_raw<Y, E>(dy + row * sh.d + j * E, gr[i]);
        load_raw<S, E>(s + row * sh.d + j * E, sr[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int64_t j = lane + int64_t{i} * g;
      if (i < per && live && j < vecs) {
        A gv[E], sv[E], wv[E];
        unpack_raw(gr[i], gv);
        unpack_raw(sr[i], sv);
        load_elems<W, E>(w + j * E, wv);
#pragma unroll
        for (int e = 0; e < E; ++e) {
          if (partial != nullptr) dw[i][e] += gv[e] * sv[e] * r;
          dot += gv[e] * wv[e] * sv[e];
        }
      }
    }
    dot = group_sum(dot, g, red);
    const A c = r * r * dot / static_cast<A>(sh.d);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int64_t j = lane + int64_t{i} * g;
      if (i < per && live && j < vecs) {
        A gv[E], sv[E], wv[E], out[E];
        unpack_raw(gr[i], gv);
        unpack_raw(sr[i], sv);
        load_elems<W, E>(w + j * E, wv);
        if (dsum != nullptr) {
          load_elems<S, E>(dsum + row * sh.d + j * E, out);
        } else {
#pragma unroll
          for (int e = 0; e < E; ++e) out[e] = 0;
        }
#pragma unroll
        for (int e = 0; e < E; ++e) out[e] += r * (gv[e] * wv[e] - sv[e] * c);
        if (ds != nullptr) store_elems<S, E>(ds + row * sh.d + j * E, out);
        if constexpr (!std::is_same_v<X, S>) {
          if (dx != nullptr) {
#pragma unroll
            for (int e = 0; e < E; ++e) out[e] = static_cast<A>(to_acc(from_acc<S>(out[e])));
            store_elems<X, E>(dx + row * sh.d + j * E, out);
          }
        }
      }
    }
  }
  if (partial == nullptr) return;
  // The block's slots (rows_a_block groups over the same columns) added in slot order.
  A* cols = reinterpret_cast<A*>(smem_raw);  // [rows_a_block][vecs * E] when rows_a_block > 1
  if (rows_a_block > 1) {
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int64_t j = lane + int64_t{i} * g;
      if (i < per && j < vecs) {
#pragma unroll
        for (int e = 0; e < E; ++e) cols[slot * sh.d + j * E + e] = dw[i][e];
      }
    }
    __syncthreads();
    for (int64_t c = threadIdx.x; c < sh.d; c += blockDim.x) {
      A total = cols[c];
      for (int q = 1; q < rows_a_block; ++q) total += cols[q * sh.d + c];
      partial[int64_t{blockIdx.x} * sh.d + c] = total;
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int64_t j = lane + int64_t{i} * g;
    if (i < per && j < vecs) {
#pragma unroll
      for (int e = 0; e < E; ++e) partial[int64_t{blockIdx.x} * sh.d + j * E + e] = dw[i][e];
    }
  }
}

// dweight[c] = the blocks' partials of column c added in a fixed order, rounded to W: a block of
// kColSlices x 32 threads takes 32 columns, slice i adds its run of partial rows in order, and the
// slices' totals are added in slice order. (One thread a column over all the partials put 16 blocks
// on the GPU for d = 4096, and 8 slices left a run of 33 loads a thread: a latency-bound tail after
// the row pass.)
constexpr int kColSlices = 32;
template <typename A, typename W> __global__ void __launch_bounds__(32 * kColSlices)
    rms_norm_dweight(const A* partial, int64_t blocks, int64_t d, W* dweight) {
  __shared__ A slice_sum[kColSlices][32];
  const int col = static_cast<int>(threadIdx.x) % 32, slice = static_cast<int>(threadIdx.x) / 32;
  const int64_t c = int64_t{blockIdx.x} * 32 + col;
  const int64_t run = (blocks + kColSlices - 1) / kColSlices;
  const int64_t first = slice * run, last = min(blocks, first + run);
  A total = 0;
  if (c < d)
    for (int64_t b = first; b < last; ++b) total += partial[b * d + c];
  slice_sum[slice][col] = total;
  __syncthreads();
  if (slice != 0 || c >= d) return;
  for (int i = 1; i < kColSlices; ++i) total += slice_sum[i][col];
  dweight[c] = from_acc<W>(static_cast<acc_t<W>>(total));
}

int pow2_at_least(int64_t v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

// The group and vectors a thread for rows of d elements in vectors of e: target vectors a thread
// where the group can grow to hold them, up to max_per; false where d needs more than kMaxGroup x
// max_per vectors.
bool make_shape(Shape& sh, int64_t rows, int64_t d, int e, int max_per, int target) {
  const int64_t vecs = d / e;
  sh.rows = rows, sh.d = d;
  sh.g = pow2_at_least(std::max<int64_t>(1, (vecs + target - 1) / target));
  if (sh.g > kMaxGroup) sh.g = kMaxGroup;
  const int64_t per = (vecs + sh.g - 1) / sh.g;
  if (per > max_per) return false;
  sh.per = static_cast<int>(std::max<int64_t>(per, 1));
  return true;
}

int block_threads(const Shape& sh) { return std::max(sh.g, kMinBlock); }

// The backward's blocks (so its partial rows of the weight gradient): one a block's worth of rows,
// up to kBwdBlocks (a fixed number, not the GPU's: the sums' order, and so their bits, are a function
// of the shape only).
int64_t bwd_blocks(const Shape& sh) {
  const int rows_a_block = kBwdBlock / sh.g;
  return std::clamp<int64_t>((sh.rows + rows_a_block - 1) / rows_a_block, 1, kBwdBlocks);
}

template <typename T, typename S, typename W, typename Y, int E>
cudaError_t fwd_typed(const RmsNormArgs& a, cudaStream_t stream) {
  Shape sh;
  // Vectors a thread: kFwdPer where the sum and the weight are no wider than x; 2 (a group twice as
  // wide) where either is (a half x beside a float32 residual or weight: the thread holds or loads
  // twice x's bytes a vector). On an H100 at 8192 x 2048: bf16 x, float32 sum, weight and y 85.6
  // against 89.5 us; bf16 x, float32 weight and y 44.0 against 46.5 us; one width throughout, 4
  // stays ahead (bf16: 27.7 against 32.2 us). The choice is not y's, so a half y is the float32 y
  // rounded.
  constexpr int kTarget = sizeof(S) > sizeof(T) || sizeof(W) > sizeof(T) ? 2 : kFwdPer;
  if (!make_shape(sh, a.rows, a.d, E, kFwdPer, kTarget)) return cudaErrorInvalidValue;
  const int threads = block_threads(sh);
  // A block for each block's worth of rows, not one wave of resident blocks looping over them: the
  // blocks that come later start as others finish, 2-5 % faster at 8192-131072 rows (float32 rows
  // at 8192 x 4096: 96.4 against 101.1 us). The kernel still loops past gridDim's limit.
  const int64_t grid =
      std::min<int64_t>((a.rows + threads / sh.g - 1) / (threads / sh.g), 0x7fffffff);
  const auto launch = [&](auto kernel) {
    kernel<<<static_cast<unsigned>(grid), threads, 0, stream>>>(
        sh, static_cast<const T*>(a.x), a.ld_x, static_cast<const S*>(a.res), a.ld_res,
        static_cast<const W*>(a.w), static_cast<acc_t<T>>(a.eps), static_cast<Y*>(a.y),
        static_cast<S*>(a.sum), static_cast<acc_t<T>*>(a.rstd));
    return cudaGetLastError();
  };
  // Register arrays sized for kTarget vectors where the row takes no more: a float32 sum held in
  // arrays of kFwdPer took 120-127 registers a thread (bf16 x, float32 residual: autocast's mix).
  if (a.res != nullptr) {
    if constexpr (kTarget < kFwdPer) {
      if (sh.per <= kTarget) return launch(rms_norm_fwd<T, S, W, Y, E, true, kTarget>);
    }
    return launch(rms_norm_fwd<T, S, W, Y, E, true>);
  }
  if constexpr (std::is_same_v<S, T>) {
    if constexpr (kTarget < kFwdPer) {
      if (sh.per <= kTarget) return launch(rms_norm_fwd<T, S, W, Y, E, false, kTarget>);
    }
    return launch(rms_norm_fwd<T, S, W, Y, E, false>);
  }
  return cudaErrorInvalidValue;  // a sum of another type than x's is add_rms_norm's
}

template <typename S, typename W, typename Y, typename X, int E>
cudaError_t bwd_typed(const RmsNormBwdArgs& a, cudaStream_t stream) {
  using A = acc_t<S>;
  Shape sh;
  if (!make_shape(sh, a.rows, a.d, E, kBwdPer, kBwdPer)) return cudaErrorInvalidValue;
  const int rows_a_block = kBwdBlock / sh.g;
  const int64_t grid = bwd_blocks(sh);
  if (a.dweight != nullptr && a.workspace == nullptr) return cudaErrorInvalidValue;
  const size_t smem = a.dweight != nullptr && rows_a_block > 1 ? sizeof(A) * rows_a_block * a.d : 0;
  // make_shape's groups hold at least half a row's vectors: at most 2 g E elements a row, so 1024 E
  // values (32 KB of float at E = 8).
  if (smem > 48 * 1024) return cudaErrorInvalidValue;
  A* partial = a.dweight != nullptr ? static_cast<A*>(a.workspace) : nullptr;
  rms_norm_bwd<S, W, Y, X, E><<<static_cast<unsigned>(grid), kBwdBlock, smem, stream>>>(
      sh, static_cast<const Y*>(a.dy), static_cast<const S*>(a.s), static_cast<const W*>(a.w),
      static_cast<const A*>(a.rstd), static_cast<const S*>(a.dsum), static_cast<S*>(a.ds),
      static_cast<X*>(a.dx), partial);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || a.dweight == nullptr) return err;
  rms_norm_dweight<A, W><<<static_cast<unsigned>((a.d + 31) / 32), 32 * kColSlices, 0, stream>>>(
      partial, grid, a.d, static_cast<W*>(a.dweight));
  return cudaGetLastError();
}

// The dtype mixes a kernel instance exists for (rms_norm_supports): one dtype throughout, or a half
// type beside float32 as autocast mixes them.
template <typename T> constexpr bool kF32 = std::is_same_v<T, float>;
template <typename T, typename U> constexpr bool kSame = std::is_same_v<T, U>;
template <typename T, typename S, typename W, typename Y> constexpr bool fwd_instance() {
  if constexpr (kSame<S, T> && kSame<W, T> && kSame<Y, T>) return true;
  if constexpr (is_half_type<T>)  // a half x: the sum, the weight and y each x's type or float32
    return (kSame<S, T> || kF32<S>) && (kSame<W, T> || kF32<W>) && (kSame<Y, T> || kF32<Y>) &&
           !(kSame<S, T> && kSame<W, T>);
  return kF32<T> && kF32<S> && kF32<W> && is_half_type<Y>;  // float32 rows, a half y
}
// X: dx's type where the kernel writes one beside ds; S where it does not.
template <typename S, typename W, typename Y, typename X> constexpr bool bwd_instance() {
  if constexpr (!kSame<X, S>)  // add_rms_norm's half x beside a float32 residual (autocast's)
    return is_half_type<X> && kF32<S> && kF32<W> && (kF32<Y> || kSame<Y, X>);
  if constexpr (kSame<S, W> && kSame<S, Y>) return true;
  if constexpr (is_half_type<S>)  // a half sum with a float32 weight; dy float32 or the half type
    return kF32<W> && (kF32<Y> || kSame<Y, S>);
  return kF32<S> && kF32<W> && is_half_type<Y>;
}

int size_of(DType t) { return t == DType::Float64 ? 8 : t == DType::Float32 ? 4 : 2; }

// The instance's vector: 16 bytes of x's type (the sum's, backward) where vec, else one element (one
// dtype throughout only). Not the narrowest operand's: the group's shape, and so the order the sum of
// squares is added in, is then the same whatever y's type, so a half y is the float32 y rounded.
int vector_elems(DType base, bool vec) { return vec ? 16 / size_of(base) : 1; }

template <typename T, typename S, typename W, typename Y>
cudaError_t fwd_pick(const RmsNormArgs& a, bool vec, cudaStream_t stream) {
  if constexpr (!fwd_instance<T, S, W, Y>()) {
    return cudaErrorInvalidValue;
  } else {
    if (vec) return fwd_typed<T, S, W, Y, 16 / sizeof(T)>(a, stream);
    if constexpr (kSame<S, T> && kSame<W, T> && kSame<Y, T>)
      return fwd_typed<T, S, W, Y, 1>(a, stream);
    return cudaErrorInvalidValue;
  }
}

template <typename S, typename W, typename Y, typename X>
cudaError_t bwd_pick(const RmsNormBwdArgs& a, bool vec, cudaStream_t stream) {
  if constexpr (!bwd_instance<S, W, Y, X>()) {
    return cudaErrorInvalidValue;
  } else {
    if (vec) return bwd_typed<S, W, Y, X, 16 / sizeof(S)>(a, stream);
    if constexpr (kSame<S, W> && kSame<S, Y> && kSame<X, S>)
      return bwd_typed<S, W, Y, X, 1>(a, stream);
    return cudaErrorInvalidValue;
  }
}

}  // namespace
}  // namespace detail

bool rms_norm_supports(const RmsNormTypes& t, bool vec) {
  const bool same = t.x == t.s && t.x == t.w && t.x == t.y;
  const cudaError_t found = detail::dispatch_dtype(t.x, [&](auto x) {
    return detail::dispatch_dtype(t.s, [&](auto s) {
      return detail::dispatch_dtype(t.w, [&](auto w) {
        return detail::dispatch_dtype(t.y, [&](auto y) {
          return detail::fwd_instance<decltype(x), decltype(s), decltype(w), decltype(y)>()
                     ? cudaSuccess
                     : cudaErrorInvalidValue;
        });
      });
    });
  });
  return found == cudaSuccess && (vec || same);
}

bool rms_norm_bwd_supports(const RmsNormTypes& t, bool vec) {
  const bool same = t.s == t.w && t.s == t.y && t.x == t.s;
  const cudaError_t found = detail::dispatch_dtype(t.s, [&](auto s) {
    return detail::dispatch_dtype(t.w, [&](auto w) {
      return detail::dispatch_dtype(t.y, [&](auto y) {
        return detail::dispatch_dtype(t.x, [&](auto x) {
          return detail::bwd_instance<decltype(s), decltype(w), decltype(y), decltype(x)>()
                     ? cudaSuccess
                     : cudaErrorInvalidValue;
        });
      });
    });
  });
  return found == cudaSuccess && (vec || same);
}

int rms_norm_vector_elems(const RmsNormTypes& t, bool vec) {
  return detail::vector_elems(t.x, vec);
}

int64_t rms_norm_bwd_workspace_bytes(const RmsNormTypes& t, int64_t rows, int64_t d, bool vec) {
  detail::Shape sh;
  if (!detail::make_shape(sh, rows, d, detail::vector_elems(t.s, vec), detail::kBwdPer,
                          detail::kBwdPer))
    return 0;
  return detail::bwd_blocks(sh) * d * (t.s == DType::Float64 ? 8 : 4);
}

bool rms_norm_fits(int64_t d, int vector_elems, bool backward) {
  detail::Shape sh;
  const int max_per = backward ? detail::kBwdPer : detail::kFwdPer;
  return detail::make_shape(sh, 1, d, vector_elems, max_per, max_per);
}

cudaError_t launch_rms_norm_fwd(const RmsNormArgs& a, bool vec, cudaStream_t stream) {
  if (a.rows == 0 || a.d == 0) return cudaSuccess;
  return detail::dispatch_dtype(a.types.x, [&](auto x) {
    return detail::dispatch_dtype(a.types.s, [&](auto s) {
      return detail::dispatch_dtype(a.types.w, [&](auto w) {
        return detail::dispatch_dtype(a.types.y, [&](auto y) {
          return detail::fwd_pick<decltype(x), decltype(s), decltype(w), decltype(y)>(a, vec,
                                                                                      stream);
        });
      });
    });
  });
}

cudaError_t launch_rms_norm_bwd(const RmsNormBwdArgs& a, bool vec, cudaStream_t stream) {
  if (a.rows == 0 || a.d == 0) return cudaSuccess;
  if ((a.dx != nullptr) != (a.types.x != a.types.s)) return cudaErrorInvalidValue;
  return detail::dispatch_dtype(a.types.s, [&](auto s) {
    return detail::dispatch_dtype(a.types.w, [&](auto w) {
      return detail::dispatch_dtype(a.types.y, [&](auto y) {
        return detail::dispatch_dtype(a.types.x, [&](auto x) {
          return detail::bwd_pick<decltype(s), decltype(w), decltype(y), decltype(x)>(a, vec,
                                                                                      stream);
        });
      });
    });
  });
}

}  // namespace cuops::kernels
