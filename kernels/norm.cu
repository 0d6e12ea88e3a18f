// two_norm: sqrt(sum (a - b)^2) in two deterministic launches. Stage 1: a grid of 1024-thread blocks
// (its size a function of n and the SM count alone), each a grid-stride pass with 16-byte loads and
// a fixed shuffle tree, writes one partial sum. Stage 2: one block reduces the partials in a fixed
// order and writes the 0-dim result. No atomics, so the bits never change between runs; nothing but partials is written.
#include "common.cuh"

namespace cuops::kernels {
namespace {
using namespace detail;

// 1024-thread blocks, two per SM in the grid (at ~60 registers a thread one is resident per SM, so
// two equal waves). Measured on the H100 (bench/sweep, NOTES.md): this shape streams 1.042x the copy
// figure at 1 GiB per input, against 1.033x for the earlier 1024 blocks of 256 threads.
constexpr int kThreads = 1024;
constexpr int kBlocksPerSm = 2;
constexpr int kUnroll = 4;
constexpr int kFinalThreads = 1024;

// Running sums of squares: double for float32/float64 (cheap while memory-bound: one conversion per
// 16-byte vector, whose 4 float32 terms are summed in float first; and exact enough that large n
// loses nothing), float for the half types as the spec asks.
template <typename T> struct NormAcc { using type = double; };
template <> struct NormAcc<__half> { using type = float; };
template <> struct NormAcc<__nv_bfloat16> { using type = float; };

template <typename A> __device__ __forceinline__ A block_sum(A v) {
  __shared__ A warp_sums[32];
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  const int nwarps = blockDim.x / 32;
  v = (threadIdx.x < nwarps) ? warp_sums[threadIdx.x] : A(0);
  if (warp == 0) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  }
  return v;  // valid in thread 0
}

template <typename T, typename A> __device__ __forceinline__ A sq_diff(T x, T y) {
  const A d = static_cast<A>(to_acc(x)) - static_cast<A>(to_acc(y));
  return d * d;
}

// a, b: [n]; elements [head, head + n_vec * V) are the 16-byte aligned vector body.
template <typename T, int V, typename A>
__global__ void __launch_bounds__(kThreads)
    sum_sq_diff_partials(const T* a, const T* b, int64_t head, int64_t n_vec, int64_t n, A* partials) {
  using VecT = Vec<T, V>;
  const VecT* va = reinterpret_cast<const VecT*>(a + head);
  const VecT* vb = reinterpret_cast<const VecT*>(b + head);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const auto sq = [](auto p, auto q) { return (p - q) * (p - q); };
  A acc[kUnroll] = {};
  int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  // Main loop: all kUnroll vectors in bounds, so no per-load guards (fewer live registers under the
  // 64-per-thread cap of a 1024-thread block: the guarded form spilled); then at most kUnroll - 1 more.
  for (; i + (kUnroll - 1) * stride < n_vec; i += kUnroll * stride) {
    VecT x[kUnroll], y[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      x[u] = va[i + u * stride];
      y[u] = vb[i + u * stride];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc[u] += sum_vec<A>(x[u], y[u], sq);
  }
  for (; i < n_vec; i += stride) acc[0] += sum_vec<A>(va[i], vb[i], sq);
  A s = 0;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) s += acc[u];
  if (blockIdx.x == 0) {
    for (int64_t j = threadIdx.x; j < head; j += kThreads) s += sq_diff<T, A>(a[j], b[j]);
    for (int64_t j = head + n_vec * V + threadIdx.x; j < n; j += kThreads) s += sq_diff<T, A>(a[j], b[j]);
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

template <typename T, typename A>
__global__ void __launch_bounds__(kFinalThreads) finish_norm(const A* partials, int64_t count, T* out) {
  A s = 0;
  for (int64_t i = threadIdx.x; i < count; i += kFinalThreads) s += partials[i];
  s = block_sum(s);
  if (threadIdx.x == 0) out[0] = from_acc<T>(static_cast<acc_t<T>>(sqrt(s)));
}

}  // namespace

int64_t two_norm_num_partials(int64_t n, int multiprocessors) {
  // At least one 16-byte vector per thread of each block (in the widest dtype), at least one block,
  // and never more than kBlocksPerSm per SM (nor than finish_norm's one partial per thread).
  const int64_t per_block = int64_t{kThreads} * 2;
  const int64_t full = std::clamp<int64_t>(int64_t{multiprocessors} * kBlocksPerSm, 1, kFinalThreads);
  return std::max<int64_t>(1, std::min(full, (n + per_block - 1) / per_block));
}

bool two_norm_partials_are_double(DType dtype) { return dtype == DType::Float32 || dtype == DType::Float64; }

cudaError_t launch_two_norm(DType dtype, void* out, const void* a, const void* b, int64_t n, void* partials,
                            int64_t num_partials, cudaStream_t stream) {
  if (num_partials < 1 || num_partials > kFinalThreads) return cudaErrorInvalidValue;
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    using A = typename NormAcc<T>::type;
    constexpr int V = 16 / sizeof(T);
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    A* part = static_cast<A*>(partials);
    const int64_t blocks = num_partials;
    if (aligned_like(pa, pb, 16) && reinterpret_cast<uintptr_t>(pa) % sizeof(T) == 0) {
      const uintptr_t mis = reinterpret_cast<uintptr_t>(pa) % 16;
      const int64_t head = mis == 0 ? 0 : std::min<int64_t>(n, (16 - mis) / sizeof(T));
      sum_sq_diff_partials<T, V, A><<<blocks, kThreads, 0, stream>>>(pa, pb, head, (n - head) / V, n, part);
    } else {
      sum_sq_diff_partials<T, 1, A><<<blocks, kThreads, 0, stream>>>(pa, pb, 0, n, n, part);
    }
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    finish_norm<T, A><<<1, kFinalThreads, 0, stream>>>(part, blocks, static_cast<T*>(out));
    return cudaGetLastError();
  });
}

}  // namespace cuops::kernels
