// two_norm: sqrt(sum (a - b)^2), deterministic (the same bits on every run), nothing written but
// scratch and the 0-dim result. Two forms:
// - 16-byte loads (small inputs, float64, GPUs before sm_90): a fixed grid (its size a function of n
//   and the SM count alone) writes one partial sum per block; a second launch reduces the partials
//   in a fixed order.
// - sm_90 and up, large inputs: one launch that streams a and b through shared memory by bulk copies
//   (a few 16 KiB requests per SM in flight instead of thousands of 16-byte loads), hands chunks out
//   by an integer ticket, sums them exactly in fixed point, and finishes in the last block
//   No float atomics in either.
#include <type_traits>

#include "kernels/common.cuh"
#include "kernels/switches.h"

namespace cuops::kernels {
namespace {
using namespace detail;

// 1024-thread blocks, two per SM in the grid (at ~60 registers a thread one is resident per SM, so
// two equal waves). Measured on the H100: this shape streams 1.042x the copy
// figure at 1 GiB per input, against 1.033x for the earlier 1024 blocks of 256 threads.
constexpr int kThreads = 1024;
constexpr int kBlocksPerSm = 2;
constexpr int kUnroll = 4;
constexpr int kFinalThreads = 1024;

// Running sums of squares: double for float32/float64 (cheap while memory-bound: one conversion per
// 16-byte vector, whose 4 float32 terms are summed in float first; and exact enough that large n
// loses nothing), float for the half types as the spec asks.
template <typename T> struct NormAcc {
  using type = double;
};
template <> struct NormAcc<__half> {
  using type = float;
};
template <> struct NormAcc<__nv_bfloat16> {
  using type = float;
};

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
template <typename T, int V, typename A> __global__ void __launch_bounds__(kThreads)
    sum_sq_diff_partials(const T* a, const T* b, int64_t head, int64_t n_vec, int64_t n,
                         A* partials) {
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
    for (int64_t j = head + n_vec * V + threadIdx.x; j < n; j += kThreads)
      s += sq_diff<T, A>(a[j], b[j]);
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// The bulk-copy pass: one block per SM, warp 0's lane 0 keeps kBulkStages stages of kBulkChunk bytes
// of a and of b in flight, the kBulkWarps other warps reduce each stage and hand it back. Chunks are
// handed out by an integer ticket, so SMs that the memory system serves faster take more of them
// (with a fixed chunk-to-block map ~10 % of the blocks finished a quarter early and idled). The result must not depend on who took which chunk, so each chunk's sum (a fixed
// tree inside the chunk) is added to its block's fixed-point accumulator, where addition is exact
// and so order-free; the last block to finish (a second integer counter) adds the accumulators and
// writes the norm. Both counters are zeroed by the host (cudaMemsetAsync) before the launch.
constexpr int kBulkChunk = 16384, kBulkStages = 4, kBulkWarps = 8;
constexpr int kBulkThreads = 32 * (kBulkWarps + 1);
constexpr int kBulkSmem = 2 * kBulkStages * kBulkChunk + 2 * kBulkStages * 8 + kBulkStages * 8;

// Fixed-point sum of non-negative chunk sums: kFxDigits 32-bit digits (each held in 64 bits so that
// carries can wait until the end), the lowest worth 2^kFxLow, then a count of infinite and of NaN
// chunk sums. Every chunk sum is a sum of float32 squares, hence a multiple of 2^-149 below 2^141,
// so 2^-160 .. 2^224 holds each one exactly.
constexpr int kFxDigits = 12, kFxWords = kFxDigits + 2, kFxLow = -160;

template <typename A> __device__ __forceinline__ void fx_add(unsigned long long* fx, A v) {
  if (!isfinite(v)) {
    fx[isnan(v) ? kFxDigits + 1 : kFxDigits] += 1;
    return;
  }
  if (v == A(0)) return;
  int e;
  const double m = frexp(static_cast<double>(v), &e);  // v = m * 2^e, m in [0.5, 1): exact
  const int p = e - 53 - kFxLow;                       // v = mant * 2^(p + kFxLow)
  unsigned long long mant = static_cast<unsigned long long>(ldexp(m, 53));
  int pos = p;
  if (pos < 0)
    mant >>= (-pos < 64 ? -pos : 63), pos = 0;  // only zero bits, for sums of float squares
  const int k = pos / 32, r = pos % 32;
  // mant << r spans up to 85 bits: three digits.
  fx[k] += (mant << r) & 0xffffffffull;
  fx[k + 1] += (r ? (mant >> (32 - r)) : (mant >> 32)) & 0xffffffffull;
  fx[k + 2] += r ? (mant >> (64 - r)) : 0ull;
}

#if __CUDA_ARCH__ >= 900
// The bulk pass's producer (one thread): draws chunks by ticket and brings each chunk of a and of b
// into a ring stage by bulk copy; `which` names the stage's chunk, -1 once none are left.
__device__ __forceinline__ void bulk_produce(const unsigned char* body_a,
                                             const unsigned char* body_b, int64_t nchunks,
                                             unsigned int* counters, unsigned char* ring,
                                             uint64_t* full, uint64_t* empty, int64_t* which) {
  for (int64_t j = 0;; ++j) {
    const int64_t c = atomicAdd(&counters[0], 1u);  // drawn before the wait: its latency overlaps
    const int st = static_cast<int>(j % kBulkStages);
    if (j >= kBulkStages) mbar_wait(&empty[st], static_cast<uint32_t>((j / kBulkStages - 1) & 1));
    if (c >= nchunks) {
      which[st] = -1;
      mbar_arrive(&full[st]);  // no bytes: the consumers read -1 and stop
      break;
    }
    which[st] = c;
    const int64_t off = c * int64_t{kBulkChunk};
    unsigned char* dst = ring + st * 2 * kBulkChunk;
    mbar_expect_tx(&full[st], 2 * kBulkChunk);
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
        "[%3];\n"
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%4], [%5], %2, "
        "[%3];\n" ::"r"(smem_addr(dst)),
        "l"(body_a + off), "r"(kBulkChunk), "r"(smem_addr(&full[st])),
        "r"(smem_addr(dst + kBulkChunk)), "l"(body_b + off)
        : "memory");
  }
}

// The bulk pass's consumers (kBulkWarps warps, thread t): block 0's head and tail, then each chunk
// the ring hands over, each summed by a fixed tree into the block's fixed-point accumulator fx.
template <typename T, typename A>
__device__ __forceinline__ void bulk_consume(const T* a, const T* b, int64_t head, int64_t nchunks,
                                             int64_t n, const unsigned char* ring, uint64_t* full,
                                             uint64_t* empty, const int64_t* which,
                                             A (*red)[kBulkWarps], unsigned long long* fx) {
  const auto sq = [](auto p, auto q) { return (p - q) * (p - q); };
  using VecT = Vec<T, 16 / sizeof(T)>;
  constexpr int kPer = kBulkChunk / 16 / (32 * kBulkWarps);  // vectors of each input per thread
  const int t = threadIdx.x - 32, w = t / 32;
  int par = 0;
  // One chunk's (or block 0's head and tail's) sum: a fixed tree over the consumer threads, then
  // into the accumulator. Two buffers of warp sums, so one barrier per chunk is enough.
  const auto settle = [&](A v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    if (t % 32 == 0) red[par][w] = v;
    asm volatile("bar.sync 1, %0;\n" ::"n"(32 * kBulkWarps) : "memory");
    if (t == 0) {
      A total = 0;
      for (int i = 0; i < kBulkWarps; ++i) total += red[par][i];
      fx_add(fx, total);
    }
    par ^= 1;
  };
  if (blockIdx.x == 0) {
    A s = 0;
    for (int64_t i = t; i < head; i += 32 * kBulkWarps) s += sq_diff<T, A>(a[i], b[i]);
    const int64_t rest = head + nchunks * (kBulkChunk / static_cast<int64_t>(sizeof(T)));
    for (int64_t i = rest + t; i < n; i += 32 * kBulkWarps) s += sq_diff<T, A>(a[i], b[i]);
    settle(s);
  }
  for (int64_t j = 0;; ++j) {
    const int st = static_cast<int>(j % kBulkStages);
    mbar_wait(&full[st], static_cast<uint32_t>((j / kBulkStages) & 1));
    if (which[st] < 0) break;
    const VecT* x = reinterpret_cast<const VecT*>(ring + st * 2 * kBulkChunk);
    const VecT* y = reinterpret_cast<const VecT*>(ring + st * 2 * kBulkChunk + kBulkChunk);
    VecT xv[kPer], yv[kPer];
#pragma unroll
    for (int u = 0; u < kPer; ++u)
      xv[u] = x[t + u * 32 * kBulkWarps], yv[u] = y[t + u * 32 * kBulkWarps];
    __syncwarp();
    if (threadIdx.x % 32 == 0) mbar_arrive(&empty[st]);
    A s = 0;
#pragma unroll
    for (int u = 0; u < kPer; ++u) s += sum_vec<A>(xv[u], yv[u], sq);
    settle(s);
  }
}

// The block's accumulator to its column of slots ([word][block]), then the finish by the last block
// (counters[1]): integer sums, so the order in which blocks arrive does not matter.
template <typename T>
__device__ __forceinline__ void bulk_finish(const unsigned long long* fx, unsigned int* counters,
                                            unsigned long long* slots,
                                            unsigned long long (*totals)[kFxWords], bool& last,
                                            T* out) {
  __syncthreads();
  const int grid = static_cast<int>(gridDim.x);
  if (threadIdx.x < kFxWords) {
    slots[threadIdx.x * grid + blockIdx.x] = fx[threadIdx.x];
    __threadfence();
  }
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&counters[1], 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  unsigned long long sums[kFxWords] = {};
  for (int blk = threadIdx.x; blk < grid; blk += kBulkThreads) {
#pragma unroll
    for (int k = 0; k < kFxWords; ++k) sums[k] += __ldcg(slots + k * grid + blk);
  }
#pragma unroll
  for (int k = 0; k < kFxWords; ++k) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sums[k] += __shfl_down_sync(0xffffffffu, sums[k], off);
    if (threadIdx.x % 32 == 0) totals[threadIdx.x / 32][k] = sums[k];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long digit[kFxWords] = {};
    for (int wi = 0; wi <= kBulkWarps; ++wi)
      for (int k = 0; k < kFxWords; ++k) digit[k] += totals[wi][k];
    double v;
    if (digit[kFxDigits + 1] != 0) {
      v = __longlong_as_double(0x7ff8000000000000ll);
    } else if (digit[kFxDigits] != 0) {
      v = __longlong_as_double(0x7ff0000000000000ll);
    } else {
      unsigned long long carry = 0;
      for (int k = 0; k < kFxDigits; ++k) {
        const unsigned long long d = digit[k] + carry;
        digit[k] = d & 0xffffffffull;
        carry = d >> 32;
      }
      v = static_cast<double>(carry);
      for (int k = kFxDigits - 1; k >= 0; --k) v = v * 4294967296.0 + static_cast<double>(digit[k]);
      v = sqrt(ldexp(v, kFxLow));
    }
    out[0] = from_acc<T>(static_cast<acc_t<T>>(v));
  }
}
#endif

template <typename T, typename A> __global__ void __launch_bounds__(kBulkThreads)
    sum_sq_diff_bulk(const T* a, const T* b, int64_t head, int64_t nchunks, int64_t n,
                     unsigned int* counters, unsigned long long* slots, T* out) {
#if __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char ring[];
  uint64_t* full = reinterpret_cast<uint64_t*>(ring + 2 * kBulkStages * kBulkChunk);
  uint64_t* empty = full + kBulkStages;
  int64_t* which =
      reinterpret_cast<int64_t*>(empty + kBulkStages);  // each stage's chunk; -1: no more
  __shared__ A red[2][kBulkWarps];
  __shared__ unsigned long long fx[kFxWords];
  __shared__ unsigned long long totals[kBulkWarps + 1][kFxWords];
  __shared__ bool last;
  if (threadIdx.x == 0) {
    for (int i = 0; i < kBulkStages; ++i) mbar_init(&full[i], 1), mbar_init(&empty[i], kBulkWarps);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  if (threadIdx.x < kFxWords) fx[threadIdx.x] = 0;
  __syncthreads();
  if (threadIdx.x < 32) {
    if (threadIdx.x == 0) {
      bulk_produce(reinterpret_cast<const unsigned char*>(a + head),
                   reinterpret_cast<const unsigned char*>(b + head), nchunks, counters, ring, full,
                   empty, which);
    }
  } else {
    bulk_consume<T, A>(a, b, head, nchunks, n, ring, full, empty, which, red, fx);
  }
  bulk_finish<T>(fx, counters, slots, totals, last, out);
#else
  __trap();  // never launched: the host runs this pass only where the sm_90 image is the one loaded
#endif
}

// Whether the bulk pass's sm_90 code is what runs on the current device (compute capability 9.0 or
// newer and an sm_90+ image in this build), asked once per device. The switch CUOPS_DISABLE_BULK_NORM
// selects the load pass everywhere: compute-sanitizer's racecheck does not see the mbarrier that
// orders the bulk copies' shared-memory writes before the reads, and reports every read.
template <typename T, typename A> bool bulk_pass_runs_here() {
  if (switch_on(Switch::DisableBulkNorm)) return false;
  static PerDevice<bool> cache;
  return cache.get(
      [](int) {
        cudaFuncAttributes attr{};
        // ptxVersion, not binaryVersion: code JIT-compiled from older PTX (a build without sm_90)
        // reports the GPU's binary version but holds the trapping body.
        const bool ok = cudaFuncGetAttributes(&attr, sum_sq_diff_bulk<T, A>) == cudaSuccess &&
                        attr.ptxVersion >= 90 &&
                        cudaFuncSetAttribute(sum_sq_diff_bulk<T, A>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             kBulkSmem) == cudaSuccess;
        (void)cudaGetLastError();
        return ok;
      },
      false);
}

template <typename T, typename A> __global__ void __launch_bounds__(kFinalThreads)
    finish_norm(const A* partials, int64_t count, T* out) {
  A s = 0;
  for (int64_t i = threadIdx.x; i < count; i += kFinalThreads) s += partials[i];
  s = block_sum(s);
  if (threadIdx.x == 0) out[0] = from_acc<T>(static_cast<acc_t<T>>(sqrt(s)));
}

}  // namespace

namespace {
int64_t two_norm_num_partials(int64_t n, int multiprocessors) {
  // At least one 16-byte vector per thread of each block (in the widest dtype), at least one block,
  // and never more than kBlocksPerSm per SM (nor than finish_norm's one partial per thread).
  const int64_t per_block = int64_t{kThreads} * 2;
  const int64_t full =
      std::clamp<int64_t>(int64_t{multiprocessors} * kBlocksPerSm, 1, kFinalThreads);
  return std::max<int64_t>(1, std::min(full, (n + per_block - 1) / per_block));
}
constexpr int64_t kCounterBytes = 16;  // the bulk pass's chunk ticket and finished-block count
}  // namespace

int64_t two_norm_scratch_bytes(int64_t n, int multiprocessors) {
  const int64_t blocks = two_norm_num_partials(n, multiprocessors);
  const int64_t bulk_blocks = (blocks + kBlocksPerSm - 1) / kBlocksPerSm;
  return kCounterBytes + std::max<int64_t>(blocks * 8, bulk_blocks * kFxWords * 8);
}

cudaError_t launch_two_norm(DType dtype, void* out, const void* a, const void* b, int64_t n,
                            void* scratch, int64_t scratch_bytes, int multiprocessors,
                            cudaStream_t stream) {
  if (multiprocessors < 1 || scratch_bytes < two_norm_scratch_bytes(n, multiprocessors))
    return cudaErrorInvalidValue;
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    using A = typename NormAcc<T>::type;
    constexpr int V = 16 / sizeof(T);
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    auto* counters = static_cast<unsigned int*>(scratch);
    void* rest = static_cast<unsigned char*>(scratch) + kCounterBytes;
    A* part = static_cast<A*>(rest);
    const int64_t blocks = two_norm_num_partials(n, multiprocessors);
    if (aligned_like(pa, pb, 16) && reinterpret_cast<uintptr_t>(pa) % sizeof(T) == 0) {
      const uintptr_t mis = reinterpret_cast<uintptr_t>(pa) % 16;
      const int64_t head = mis == 0 ? 0 : std::min<int64_t>(n, (16 - mis) / sizeof(T));
      // The bulk pass runs one block per SM (half the register pass's grid of two per SM), and only
      // where each block gets at least 8 chunks: below that the ring never fills. Not for float64:
      // its squares need not be multiples of 2^-149, which the fixed-point finish relies on.
      if constexpr (!std::is_same_v<T, double>) {
        const int64_t bulk_blocks = (blocks + kBlocksPerSm - 1) / kBlocksPerSm;
        const int64_t chunks = (n - head) * static_cast<int64_t>(sizeof(T)) / kBulkChunk;
        if (chunks >= 8 * bulk_blocks && bulk_pass_runs_here<T, A>()) {
          cudaError_t err = cudaMemsetAsync(counters, 0, kCounterBytes, stream);
          if (err != cudaSuccess) return err;
          sum_sq_diff_bulk<T, A><<<bulk_blocks, kBulkThreads, kBulkSmem, stream>>>(
              pa, pb, head, chunks, n, counters, static_cast<unsigned long long*>(rest),
              static_cast<T*>(out));
          return cudaGetLastError();
        }
      }
      sum_sq_diff_partials<T, V, A>
          <<<blocks, kThreads, 0, stream>>>(pa, pb, head, (n - head) / V, n, part);
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
