// linear_cross_entropy's pass over a chunk of logits (ops/cross_entropy.cpp makes them, a GEMM per
// chunk of tokens): each row's log-sum-exp and loss, and the gradient of the logits written over
// them in place, g = scale * (softmax - one-hot), for the dx and dweight products to read.
//
// One block of kThreads threads takes a row at a time. The statistics pass reads the row once (a running
// max and sum of exponentials per thread, a max per group of kUnroll vectors so the rescale costs
// one exponential a group, not one an element), combines the threads' pairs by a fixed tree (the
// same bits on every run), and the gradient pass reads the row again and writes it. One block an SM:
// the rows in flight (132 x 256 KB at V = 128256 in bf16) stay within L2 (50 MB on the H100), so
// the second read of a row finds it there: one trip through memory each way, not two reads and a
// write.
#include <algorithm>
#include <cfloat>

#include "kernels/common.cuh"

namespace cuops::kernels {
using namespace detail;
namespace {

// 512 threads of up to 128 registers (one block an SM: the bias's vectors beside the row's, no
// spills), each with kUnroll 16-byte loads in flight: 64 KB an SM.
constexpr int kThreads = 512, kUnroll = 8, kWarps = kThreads / 32;

// e^(v - m) for v <= m (m: the running max, or the lowest finite value before any; v may be
// -inf, which gives 0). Half types and float32: the SFU's exp2 (relative error ~2^-22, below
// float32's own rounding of the logits it reads); float64: exp.
__device__ __forceinline__ float exp_from(float v, float m) {
  return exp2f((v - m) * 1.4426950408889634f);
}
__device__ __forceinline__ double exp_from(double v, double m) { return exp(v - m); }
template <typename A> __device__ __forceinline__ A lowest() {
  return sizeof(A) == 4 ? A(-FLT_MAX) : A(-DBL_MAX);
}

// A row's running (max, sum of e^(v - max)); two pairs combine in the order given.
template <typename A> struct MaxSum {
  A m, s;
};
template <typename A> __device__ __forceinline__ MaxSum<A> combine(MaxSum<A> a, MaxSum<A> b) {
  const A m = a.m > b.m ? a.m : b.m;
  return {m, a.s * exp_from(a.m, m) + b.s * exp_from(b.m, m)};
}

// The block's pairs combined by a fixed tree (lanes by shuffles, then warps in order), returned
// to every thread. Ends with the block synchronised, so `scratch` may be reused after.
template <typename A> __device__ MaxSum<A> block_combine(MaxSum<A> p, MaxSum<A>* scratch) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const MaxSum<A> o{__shfl_down_sync(0xffffffffu, p.m, off),
                      __shfl_down_sync(0xffffffffu, p.s, off)};
    p = combine(p, o);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) scratch[warp] = p;
  __syncthreads();
  if (warp == 0) {
    p = lane < kWarps ? scratch[lane] : MaxSum<A>{lowest<A>(), A(0)};
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const MaxSum<A> o{__shfl_down_sync(0xffffffffu, p.m, off),
                        __shfl_down_sync(0xffffffffu, p.s, off)};
      p = combine(p, o);
    }
    if (lane == 0) scratch[kWarps] = p;
  }
  __syncthreads();
  p = scratch[kWarps];
  __syncthreads();
  return p;
}

// The elements of a 16-byte vector of T in the accumulation type, and back.
template <typename T, int V>
__device__ __forceinline__ void widen(const Vec<T, V>& x, acc_t<T>* a) {
  if constexpr (is_half_type<T>) {
#pragma unroll
    for (int i = 0; i < V / 2; ++i) {
      const float2 p = unpack_pair(x.w[i], T{});
      a[2 * i] = p.x, a[2 * i + 1] = p.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) a[i] = x.v[i];
  }
}
template <typename T, int V> __device__ __forceinline__ Vec<T, V> narrow(const acc_t<T>* a) {
  Vec<T, V> x;
  if constexpr (is_half_type<T>) {
#pragma unroll
    for (int i = 0; i < V / 2; ++i) x.w[i] = pack_pair(a[2 * i], a[2 * i + 1], T{});
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) x.v[i] = a[i];
  }
  return x;
}

template <typename T> struct RowsArgs {
  T* logits;
  int64_t rows, vocab, ld;
  const T* bias;
  const int64_t* target;
  int64_t ignore_index;
  acc_t<T>*lse, *loss;
  const acc_t<T>* scale;
  int64_t scale_stride;
  bool stats, grad;
  acc_t<T> softcap;  // c > 0 where the logits are capped (kCap), c tanh(z / c)
};

// A logit as the loss reads it: z, or c tanh(z / c) under a softcap (Gemma 2 / 3's final logits),
// in the accumulation type with torch's tanh (the SFU's tanh.approx, 5e-4 absolute, times c = 30
// would move a logit by 0.015). Its derivative, 1 - tanh^2, is 1 - (capped / c)^2.
template <bool kCap, typename A> __device__ __forceinline__ A capped(A z, A c) {
  if constexpr (kCap) {
    return c * tanh(z / c);
  } else {
    return z;
  }
}

// 16 bytes by the streaming forms (ld.global.cs, st.global.cs: evict first). The gradient pass's
// reads are the row's last and its writes are not read again here: marked so, they leave L2 to the
// rows whose second read is still to come.
template <typename VecT> __device__ __forceinline__ VecT load_last(const VecT* p) {
  static_assert(sizeof(VecT) == 16, "16-byte vectors");
  const int4 w = __ldcs(reinterpret_cast<const int4*>(p));
  VecT v;
  __builtin_memcpy(&v, &w, 16);
  return v;
}
template <typename VecT> __device__ __forceinline__ void store_streaming(VecT* p, const VecT& v) {
  int4 w;
  __builtin_memcpy(&w, &v, 16);
  __stcs(reinterpret_cast<int4*>(p), w);
}

// Row r's logits v[j] (+ bias[j]) for j in [0, vocab): V-element vectors, then a scalar tail.
// kLast: the row's last read.
template <typename T, int V, bool kLast = false>
__device__ __forceinline__ void load_group(const RowsArgs<T>& a, const Vec<T, V>* row, int64_t i,
                                           int64_t step, acc_t<T> (*v)[V]) {
  using VecT = Vec<T, V>;
  VecT x[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
    x[u] = kLast ? load_last(row + i + u * step) : row[i + u * step];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) widen<T, V>(x[u], v[u]);
  if (a.bias != nullptr) {
    const VecT* b = reinterpret_cast<const VecT*>(a.bias);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      acc_t<T> bv[V];
      widen<T, V>(b[i + u * step], bv);
#pragma unroll
      for (int e = 0; e < V; ++e) v[u][e] += bv[e];
    }
  }
}

template <typename T>
__device__ __forceinline__ acc_t<T> logit(const RowsArgs<T>& a, const T* row, int64_t j) {
  return to_acc(row[j]) + (a.bias != nullptr ? to_acc(a.bias[j]) : acc_t<T>(0));
}

template <typename T, int V, bool kCap>
__device__ MaxSum<acc_t<T>> row_stats(const RowsArgs<T>& a, const T* row) {
  using A = acc_t<T>;
  const Vec<T, V>* vrow = reinterpret_cast<const Vec<T, V>*>(row);
  const int64_t nvec = a.vocab / V;
  MaxSum<A> p{lowest<A>(), A(0)};
  int64_t i = threadIdx.x;
  for (; i + (kUnroll - 1) * kThreads < nvec; i += kUnroll * kThreads) {
    A v[kUnroll][V];
    load_group<T, V>(a, vrow, i, kThreads, v);
    if constexpr (kCap) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int e = 0; e < V; ++e) v[u][e] = capped<kCap>(v[u][e], a.softcap);
    }
    A gm = p.m;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int e = 0; e < V; ++e) gm = v[u][e] > gm ? v[u][e] : gm;
    p.s *= exp_from(p.m, gm);
    p.m = gm;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int e = 0; e < V; ++e) p.s += exp_from(v[u][e], gm);
  }
  for (; i < nvec; i += kThreads) {
    A v[V];
    widen<T, V>(vrow[i], v);
    for (int e = 0; e < V; ++e) {
      if (a.bias != nullptr) v[e] += to_acc(a.bias[i * V + e]);
      p = combine(p, MaxSum<A>{capped<kCap>(v[e], a.softcap), A(1)});
    }
  }
  for (int64_t j = nvec * V + threadIdx.x; j < a.vocab; j += kThreads)
    p = combine(p, MaxSum<A>{capped<kCap>(logit(a, row, j), a.softcap), A(1)});
  return p;
}

// row[j] <- scale * (e^(v[j] - lse) - [j == target]), v the logit as the loss reads it; under a
// softcap times its derivative, 1 - (v / c)^2.
template <typename T, int V, bool kCap> __device__ void row_grad(const RowsArgs<T>& a, T* row,
                                                                 acc_t<T> lse, int64_t target,
                                                                 acc_t<T> scale) {
  using A = acc_t<T>;
  using VecT = Vec<T, V>;
  VecT* vrow = reinterpret_cast<VecT*>(row);
  const int64_t nvec = a.vocab / V;
  const auto grad = [&](A z, int64_t j) {
    const A v = capped<kCap>(z, a.softcap);
    const A d = scale * (exp_from(v, lse) - (j == target ? A(1) : A(0)));
    if constexpr (kCap) {
      const A t = v / a.softcap;
      return d * (A(1) - t * t);
    } else {
      return d;
    }
  };
  int64_t i = threadIdx.x;
  for (; i + (kUnroll - 1) * kThreads < nvec; i += kUnroll * kThreads) {
    A v[kUnroll][V];
    load_group<T, V, true>(a, vrow, i, kThreads, v);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int e = 0; e < V; ++e) v[u][e] = grad(v[u][e], (i + u * kThreads) * V + e);
      store_streaming(vrow + i + u * kThreads, narrow<T, V>(v[u]));
    }
  }
  for (; i < nvec; i += kThreads) {
    A v[V];
    widen<T, V>(load_last(vrow + i), v);
    for (int e = 0; e < V; ++e)
      v[e] = grad(v[e] + (a.bias != nullptr ? to_acc(a.bias[i * V + e]) : A(0)), i * V + e);
    store_streaming(vrow + i, narrow<T, V>(v));
  }
  for (int64_t j = nvec * V + threadIdx.x; j < a.vocab; j += kThreads)
    row[j] = from_acc<T>(grad(logit(a, row, j), j));
}

template <typename T, int V, bool kCap> __global__ void __launch_bounds__(kThreads, 1)
    ce_rows(const RowsArgs<T> a) {
  using A = acc_t<T>;
  __shared__ MaxSum<A> scratch[kWarps + 1];
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    T* row = a.logits + r * a.ld;
    const int64_t target = a.target[r];
    const bool ignored = target == a.ignore_index;
    const bool in_range = target >= 0 && target < a.vocab;
    A lse;
    if (a.stats) {
      // The target's logit is read before the block meets in block_combine: after it, the
      // gradient pass may overwrite the row.
      const A picked =
          threadIdx.x == 0 && in_range ? capped<kCap>(logit(a, row, target), a.softcap) : A(0);
      const MaxSum<A> p = block_combine(row_stats<T, V, kCap>(a, row), scratch);
      lse = p.m + log(p.s);
      if (threadIdx.x == 0) {
        a.lse[r] = lse;
        if (a.loss != nullptr) a.loss[r] = ignored ? A(0) : in_range ? lse - picked : A(NAN);
      }
    } else {
      lse = a.lse[r];
    }
    if (a.grad) {
      const A scale = ignored ? A(0) : in_range ? a.scale[r * a.scale_stride] : A(NAN);
      row_grad<T, V, kCap>(a, row, lse, target, scale);
    }
  }
}

}  // namespace

cudaError_t launch_ce_rows(DType dtype, void* logits, int64_t rows, int64_t vocab, int64_t ld,
                           const void* bias, const int64_t* target, int64_t ignore_index, void* lse,
                           void* loss, const void* scale, int64_t scale_stride, bool stats,
                           bool grad, double softcap, int multiprocessors, cudaStream_t stream) {
  if (rows < 0 || vocab < 1 || ld < vocab || multiprocessors < 1 || !(softcap >= 0.0))
    return cudaErrorInvalidValue;
  if (rows == 0 || !(stats || grad)) return cudaSuccess;
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    constexpr int V = 16 / static_cast<int>(sizeof(T));
    const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    if (!aligned(logits) || ld % V != 0 || (bias != nullptr && !aligned(bias)))
      return cudaErrorInvalidValue;
    const RowsArgs<T> a{static_cast<T*>(logits),
                        rows,
                        vocab,
                        ld,
                        static_cast<const T*>(bias),
                        target,
                        ignore_index,
                        static_cast<A*>(lse),
                        static_cast<A*>(loss),
                        static_cast<const A*>(scale),
                        scale_stride,
                        stats,
                        grad,
                        static_cast<A>(softcap)};
    const auto grid = static_cast<unsigned>(std::min<int64_t>(rows, multiprocessors));
    if (softcap > 0.0) {
      ce_rows<T, V, true><<<grid, kThreads, 0, stream>>>(a);
    } else {
      ce_rows<T, V, false><<<grid, kThreads, 0, stream>>>(a);
    }
    return cudaGetLastError();
  });
}

}  // namespace cuops::kernels
