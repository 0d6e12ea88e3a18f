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
// outputs, float32 master weights): the base type T is x's; the sum s (x + residual) is float32
// where the residual is (kSF32), else T; the weight is float32 (kWF32) or T; y is float32 where s or
// the weight is, else T. The sum is rounded to its dtype before it is normalised, as torch's
// `residual + x` is before the norm reads it.
//
// The backward: ds = rstd (g - s rstd^2 mean(g s)) with g = dy w, plus the gradient reaching the
// sum directly (add_rms_norm's second output); dweight = the column sums of dy s rstd over the rows.
// Those column sums are deterministic: the backward's grid is a fixed function of the rows (not of
// the GPU), each block sums its rows in order into one partial row of the workspace (its groups
// added in group order), and a second kernel adds the partials in block order. No float atomics.
#include "common.cuh"

namespace cuops::kernels {
namespace detail {
namespace {

// kMaxGroup: a block of at most 512 threads leaves the compiler 128 registers a thread (1024
// capped them at 64: the backward spilled).
constexpr int kFwdPer = 4, kBwdPer = 2, kMinBlock = 128, kMaxGroup = 512, kBwdBlocks = 264;

template <bool kF32, typename T> using Either = std::conditional_t<kF32, acc_t<T>, T>;

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

struct Shape {
  int64_t rows, d;
  int g, per;  // threads a row; vectors a thread (at most the kernel's kPer)
};

// y = s rstd w over rows, s = x (+ residual, rounded to its dtype and stored in sum); rstd kept
// where asked.
template <typename T, bool kSF32, bool kWF32, int E, int kPer = kFwdPer>
__global__ void __launch_bounds__(kMaxGroup)
    rms_norm_fwd(Shape sh, const T* x, int64_t ld_x, const Either<kSF32, T>* res, int64_t ld_res,
                 const Either<kWF32, T>* w, acc_t<T> eps, Either<kSF32 || kWF32, T>* y,
                 Either<kSF32, T>* sum, acc_t<T>* rstd_out) {
  using A = acc_t<T>;
  using S = Either<kSF32, T>;
  __shared__ A red[kMaxGroup / 32];
  const int g = sh.g, per = sh.per, rows_a_block = static_cast<int>(blockDim.x) / g;
  const int slot = static_cast<int>(threadIdx.x) / g, lane = static_cast<int>(threadIdx.x) % g;
  const int64_t vecs = sh.d / E;
  for (int64_t base = int64_t{blockIdx.x} * rows_a_block; base < sh.rows;
       base += int64_t{gridDim.x} * rows_a_block) {
    const int64_t row = base + slot;
    const bool live = row < sh.rows;
    A v[kPer][E];
    A ss = 0;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int64_t j = lane + int64_t{i} * g;
      if (i < per && live && j < vecs) {
        load_elems<T, E>(x + row * ld_x + j * E, v[i]);
        if (res != nullptr) {
          A r[E];
          load_elems<S, E>(res + row * ld_res + j * E, r);
#pragma unroll
          for (int e = 0; e < E; ++e) v[i][e] = static_cast<A>(to_acc(from_acc<S>(v[i][e] + r[e])));
          store_elems<S, E>(sum + row * sh.d + j * E, v[i]);
        }
#pragma unroll
        for (int e = 0; e < E; ++e) ss += v[i][e] * v[i][e];
      }
    }
    ss = group_sum(ss, g, red);
    const A r = A(1) / sqrt(ss / static_cast<A>(sh.d) + eps);
    if (live && lane == 0 && rstd_out != nullptr) rstd_out[row] = r;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int64_t j = lane + int64_t{i} * g;
      if (i < per && live && j < vecs) {
        A wv[E];
        load_elems<Either<kWF32, T>, E>(w + j * E, wv);
#pragma unroll
        for (int e = 0; e < E; ++e) v[i][e] = v[i][e] * r * wv[e];
        store_elems<Either<kSF32 || kWF32, T>, E>(y + row * sh.d + j * E, v[i]);
      }
    }
  }
}

// ds = rstd (g - s rstd^2 sum(g s) / d) + dsum, g = dy w; where partial is set, this block's rows'
// dy s rstd summed per column into partial[blockIdx.x][.] (rows in order; the block's groups added
// in slot order).
template <typename T, bool kSF32, bool kWF32, int E, int kPer = kBwdPer>
__global__ void __launch_bounds__(kMaxGroup)
    rms_norm_bwd(Shape sh, const Either<kSF32 || kWF32, T>* dy, const Either<kSF32, T>* s,
                 const Either<kWF32, T>* w, const acc_t<T>* rstd, const Either<kSF32, T>* dsum,
                 Either<kSF32, T>* ds, acc_t<T>* partial) {
  using A = acc_t<T>;
  using S = Either<kSF32, T>;
  using Y = Either<kSF32 || kWF32, T>;
  extern __shared__ unsigned char smem_raw[];  // the slots' column sums (rows_a_block > 1)
  __shared__ A red[kMaxGroup / 32];
  const int g = sh.g, per = sh.per, rows_a_block = static_cast<int>(blockDim.x) / g;
  const int slot = static_cast<int>(threadIdx.x) / g, lane = static_cast<int>(threadIdx.x) % g;
  const int64_t vecs = sh.d / E;
  A dw[kPer][E] = {};
  for (int64_t base = int64_t{blockIdx.x} * rows_a_block; base < sh.rows;
       base += int64_t{gridDim.x} * rows_a_block) {
    const int64_t row = base + slot;
    const bool live = row < sh.rows;
    A gv[kPer][E], sv[kPer][E];
    A dot = 0;
    const A r = live ? rstd[row] : A(0);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int64_t j = lane + int64_t{i} * g;
      if (i < per && live && j < vecs) {
        A wv[E];
        load_elems<Y, E>(dy + row * sh.d + j * E, gv[i]);
        load_elems<S, E>(s + row * sh.d + j * E, sv[i]);
        load_elems<Either<kWF32, T>, E>(w + j * E, wv);
#pragma unroll
        for (int e = 0; e < E; ++e) {
          if (partial != nullptr) dw[i][e] += gv[i][e] * sv[i][e] * r;
          gv[i][e] *= wv[e];
          dot += gv[i][e] * sv[i][e];
        }
      }
    }
    dot = group_sum(dot, g, red);
    const A c = r * r * dot / static_cast<A>(sh.d);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int64_t j = lane + int64_t{i} * g;
      if (i < per && live && j < vecs) {
        A out[E];
        if (dsum != nullptr) {
          load_elems<S, E>(dsum + row * sh.d + j * E, out);
        } else {
#pragma unroll
          for (int e = 0; e < E; ++e) out[e] = 0;
        }
#pragma unroll
        for (int e = 0; e < E; ++e) out[e] += r * (gv[i][e] - sv[i][e] * c);
        store_elems<S, E>(ds + row * sh.d + j * E, out);
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
// slices' totals are added in slice order. (One thread a column over all 264 partials put 16 blocks on
// the GPU for d = 4096: a latency-bound tail after the row pass.)
constexpr int kColSlices = 8;
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

// The group and vectors a thread (at most max_per) for rows of d elements in vectors of e; false
// where d needs more than kMaxGroup x max_per vectors.
bool make_shape(Shape& sh, int64_t rows, int64_t d, int e, int max_per) {
  const int64_t vecs = d / e;
  sh.rows = rows, sh.d = d;
  sh.g = pow2_at_least(std::max<int64_t>(1, (vecs + max_per - 1) / max_per));
  if (sh.g > kMaxGroup) sh.g = kMaxGroup;
  const int64_t per = (vecs + sh.g - 1) / sh.g;
  if (per > max_per) return false;
  sh.per = static_cast<int>(std::max<int64_t>(per, 1));
  return true;
}

int block_threads(const Shape& sh) { return std::max(sh.g, kMinBlock); }

template <typename T, bool kSF32, bool kWF32, int E>
cudaError_t fwd_typed(const RmsNormArgs& a, int sms, cudaStream_t stream) {
  using S = Either<kSF32, T>;
  using W = Either<kWF32, T>;
  using Y = Either<kSF32 || kWF32, T>;
  Shape sh;
  if (!make_shape(sh, a.rows, a.d, E, kFwdPer)) return cudaErrorInvalidValue;
  const int threads = block_threads(sh);
  const int64_t blocks_needed = (a.rows + threads / sh.g - 1) / (threads / sh.g);
  const int64_t grid = std::clamp<int64_t>(blocks_needed, 1, int64_t{sms} * (2048 / threads));
  rms_norm_fwd<T, kSF32, kWF32, E><<<static_cast<unsigned>(grid), threads, 0, stream>>>(
      sh, static_cast<const T*>(a.x), a.ld_x, static_cast<const S*>(a.res), a.ld_res,
      static_cast<const W*>(a.w), static_cast<acc_t<T>>(a.eps), static_cast<Y*>(a.y),
      static_cast<S*>(a.sum), static_cast<acc_t<T>*>(a.rstd));
  return cudaGetLastError();
}

template <typename T, bool kSF32, bool kWF32, int E>
cudaError_t bwd_typed(const RmsNormBwdArgs& a, cudaStream_t stream) {
  using A = acc_t<T>;
  using S = Either<kSF32, T>;
  using W = Either<kWF32, T>;
  using Y = Either<kSF32 || kWF32, T>;
  Shape sh;
  if (!make_shape(sh, a.rows, a.d, E, kBwdPer)) return cudaErrorInvalidValue;
  const int threads = block_threads(sh), rows_a_block = threads / sh.g;
  const int64_t grid = rms_norm_bwd_blocks(a.rows, a.d);
  if (a.dweight != nullptr && a.workspace == nullptr) return cudaErrorInvalidValue;
  const size_t smem = a.dweight != nullptr && rows_a_block > 1 ? sizeof(A) * rows_a_block * a.d : 0;
  if (smem > 48 * 1024) return cudaErrorInvalidValue;  // make_shape keeps short rows short
  A* partial = a.dweight != nullptr ? static_cast<A*>(a.workspace) : nullptr;
  rms_norm_bwd<T, kSF32, kWF32, E><<<static_cast<unsigned>(grid), threads, smem, stream>>>(
      sh, static_cast<const Y*>(a.dy), static_cast<const S*>(a.s), static_cast<const W*>(a.w),
      static_cast<const A*>(a.rstd), static_cast<const S*>(a.dsum), static_cast<S*>(a.ds), partial);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || a.dweight == nullptr) return err;
  rms_norm_dweight<A, W><<<static_cast<unsigned>((a.d + 31) / 32), 32 * kColSlices, 0, stream>>>(
      partial, grid, a.d, static_cast<W*>(a.dweight));
  return cudaGetLastError();
}

// The instance for the dtypes and alignment: E = 16 bytes of T where every row (and the weight)
// is, else single elements (same-dtype inputs only: the op casts mixes of such rows first).
template <typename Args, typename F> cudaError_t dispatch(const Args& a, bool vec, F&& run) {
  auto pick = [&](auto t) -> cudaError_t {
    using T = decltype(t);
    constexpr int E = 16 / sizeof(T);
    if constexpr (is_half_type<T>) {
      if (!vec) {
        if (a.s_f32 || a.w_f32) return cudaErrorInvalidValue;
        return run(T{}, std::false_type{}, std::false_type{}, std::integral_constant<int, 1>{});
      }
      auto e = std::integral_constant<int, E>{};
      if (a.s_f32 && a.w_f32) return run(T{}, std::true_type{}, std::true_type{}, e);
      if (a.s_f32) return run(T{}, std::true_type{}, std::false_type{}, e);
      if (a.w_f32) return run(T{}, std::false_type{}, std::true_type{}, e);
      return run(T{}, std::false_type{}, std::false_type{}, e);
    } else {
      if (a.s_f32 || a.w_f32) return cudaErrorInvalidValue;
      if (!vec)
        return run(T{}, std::false_type{}, std::false_type{}, std::integral_constant<int, 1>{});
      return run(T{}, std::false_type{}, std::false_type{}, std::integral_constant<int, E>{});
    }
  };
  switch (a.dtype) {
    case DType::BFloat16:
      return pick(__nv_bfloat16{});
    case DType::Float16:
      return pick(__half{});
    case DType::Float32:
      return pick(float{});
    case DType::Float64:
      return pick(double{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace
}  // namespace detail

int64_t rms_norm_bwd_blocks(int64_t rows, int64_t d) {
  (void)d;
  return std::clamp<int64_t>(rows, 1, detail::kBwdBlocks);
}

int64_t rms_norm_bwd_workspace_bytes(DType dtype, int64_t rows, int64_t d) {
  const int64_t acc = dtype == DType::Float64 ? 8 : 4;
  return rms_norm_bwd_blocks(rows, d) * d * acc;
}

bool rms_norm_fits(DType dtype, int64_t d, bool vec, bool backward) {
  const int64_t size = dtype == DType::Float64 ? 8 : dtype == DType::Float32 ? 4 : 2;
  detail::Shape sh;
  return detail::make_shape(sh, 1, d, vec ? static_cast<int>(16 / size) : 1,
                            backward ? detail::kBwdPer : detail::kFwdPer);
}

cudaError_t launch_rms_norm_fwd(const RmsNormArgs& a, bool vec, int sms, cudaStream_t stream) {
  if (a.rows == 0 || a.d == 0) return cudaSuccess;
  return detail::dispatch(a, vec, [&](auto t, auto sf, auto wf, auto e) {
    return detail::fwd_typed<decltype(t), decltype(sf)::value, decltype(wf)::value,
                             decltype(e)::value>(a, sms, stream);
  });
}

cudaError_t launch_rms_norm_bwd(const RmsNormBwdArgs& a, bool vec, cudaStream_t stream) {
  if (a.rows == 0 || a.d == 0) return cudaSuccess;
  return detail::dispatch(a, vec, [&](auto t, auto sf, auto wf, auto e) {
    return detail::bwd_typed<decltype(t), decltype(sf)::value, decltype(wf)::value,
                             decltype(e)::value>(a, stream);
  });
}

}  // namespace cuops::kernels
