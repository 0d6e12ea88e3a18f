// add / scale / square: one pass, 16-byte vector loads and stores, several vectors in flight per
// thread. A run of up to V-1 leading elements (pointers share a misalignment) and the trailing
// elements are done one by one by block 0, so every alignment and size takes the vector body.
#include "kernels/common.cuh"

namespace cuops::kernels {
namespace {
using namespace detail;

constexpr int kThreads = 256;
// One 16-byte vector per input per thread, a block a 4 KB span: at full occupancy that is 4.3 MB in
// flight over 132 SMs, more than HBM3e's bandwidth x latency. Larger spans lost on the H200 (2 GiB
// float32 scale: 4 vectors a thread 0.976 of copy, 1 vector 1.010; spans <= 4 KB 1.005-1.021, 8-16 KB
// 0.973-0.984), and on the H100 1-8 vectors were within 0.5 % (docs/performance.md, "Memory-bound ops").
constexpr int kUnroll = 1;

// The ops work on accumulation-type values (float for the half types); map_vec converts.
// kSkippable: whether the op may find on the device that it has nothing to do (skippable()), and
// every thread returns at once.
struct AddOp {
  static constexpr bool kSkippable = false;
  template <typename A> __device__ __forceinline__ A operator()(A a, A b) const { return a + b; }
};
template <typename T> struct ScaleOp {
  static constexpr bool kSkippable = false;
  acc_t<T> alpha;
  __device__ __forceinline__ acc_t<T> operator()(acc_t<T> x, acc_t<T>) const { return alpha * x; }
};
// alpha read on the device (a gradient's scale, never on the host: no sync); one read-only load a
// thread's element, from L1 after the first. In place with alpha 1 (a loss's usual gradient) there
// is nothing to write: the pass is skipped, not run at the bus's rate.
template <typename T> struct ScaleByOp {
  static constexpr bool kSkippable = true;
  const acc_t<T>* alpha;
  bool in_place;
  __device__ __forceinline__ bool skippable() const { return in_place && __ldg(alpha) == 1; }
  __device__ __forceinline__ acc_t<T> operator()(acc_t<T> x, acc_t<T>) const {
    return __ldg(alpha) * x;
  }
};
struct SquareOp {
  static constexpr bool kSkippable = false;
  template <typename A> __device__ __forceinline__ A operator()(A x, A) const { return x * x; }
};

template <typename T, typename Op>
__device__ __forceinline__ T apply_scalar(const Op& op, T x, T y) {
  return from_acc<T>(op(to_acc(x), to_acc(y)));
}

// kUnroll vectors per thread, kThreads apart, starting at vector `first`: all loads, then all stores.
template <bool kGuarded, int NIN, typename VecT, typename Op>
__device__ __forceinline__ void tile(VecT* o, const VecT* a, const VecT* b, int64_t first,
                                     int64_t n_vec, const Op& op) {
  VecT x[kUnroll], y[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t i = first + static_cast<int64_t>(u) * kThreads;
    if (!kGuarded || i < n_vec) {
      x[u] = a[i];
      y[u] = NIN == 2 ? b[i] : x[u];
    }
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t i = first + static_cast<int64_t>(u) * kThreads;
    if (!kGuarded || i < n_vec) o[i] = map_vec(x[u], y[u], op);
  }
}

// out, in0, in1: [n] (in1 unused when NIN == 1). Elements [head, head + n_vec * V) form the vector
// body, 16-byte aligned when V > 1.
template <typename T, int V, int NIN, typename Op> __global__ void __launch_bounds__(kThreads)
    elementwise_kernel(T* out, const T* in0, const T* in1, int64_t head, int64_t n_vec, int64_t n,
                       Op op) {
  using VecT = Vec<T, V>;
  if constexpr (Op::kSkippable) {
    if (op.skippable()) return;
  }
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads * kUnroll + threadIdx.x;
  const VecT* a = reinterpret_cast<const VecT*>(in0 + head);
  const VecT* b = reinterpret_cast<const VecT*>(in1 + head);
  VecT* o = reinterpret_cast<VecT*>(out + head);

  // Every block but the last has a full tile: its loads and stores need no guards (fewer live
  // predicates and registers; the guarded form is kept for the one partial tile).
  if (static_cast<int64_t>(blockIdx.x + 1) * kThreads * kUnroll <= n_vec) {
    tile<false, NIN>(o, a, b, first, n_vec, op);
  } else {
    tile<true, NIN>(o, a, b, first, n_vec, op);
  }

  if (blockIdx.x == 0) {
    for (int64_t j = threadIdx.x; j < head; j += kThreads)
      out[j] = apply_scalar(op, in0[j], NIN == 2 ? in1[j] : in0[j]);
    for (int64_t j = head + n_vec * V + threadIdx.x; j < n; j += kThreads)
      out[j] = apply_scalar(op, in0[j], NIN == 2 ? in1[j] : in0[j]);
  }
}

template <typename T, int NIN, typename Op>
cudaError_t launch_elementwise(T* out, const T* in0, const T* in1, int64_t n, Op op,
                               cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  constexpr int V = 16 / sizeof(T);
  const bool vectorizable = aligned_like(out, in0, 16) &&
                            (NIN == 1 || aligned_like(out, in1, 16)) &&
                            reinterpret_cast<uintptr_t>(out) % sizeof(T) == 0;
  if (vectorizable) {
    const uintptr_t mis = reinterpret_cast<uintptr_t>(out) % 16;
    const int64_t head = mis == 0 ? 0 : std::min<int64_t>(n, (16 - mis) / sizeof(T));
    const int64_t n_vec = (n - head) / V;
    const unsigned int blocks = std::max(1u, blocks_for(n_vec, int64_t{kThreads} * kUnroll));
    elementwise_kernel<T, V, NIN>
        <<<blocks, kThreads, 0, stream>>>(out, in0, in1, head, n_vec, n, op);
  } else {
    const unsigned int blocks = std::max(1u, blocks_for(n, int64_t{kThreads} * kUnroll));
    elementwise_kernel<T, 1, NIN><<<blocks, kThreads, 0, stream>>>(out, in0, in1, 0, n, n, op);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_add(DType dtype, void* out, const void* a, const void* b, int64_t n,
                       cudaStream_t stream) {
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    return launch_elementwise<T, 2>(static_cast<T*>(out), static_cast<const T*>(a),
                                    static_cast<const T*>(b), n, AddOp{}, stream);
  });
}

cudaError_t launch_scale(DType dtype, void* out, const void* x, double alpha, int64_t n,
                         cudaStream_t stream) {
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    return launch_elementwise<T, 1>(static_cast<T*>(out), static_cast<const T*>(x),
                                    static_cast<const T*>(x), n,
                                    ScaleOp<T>{static_cast<acc_t<T>>(alpha)}, stream);
  });
}

cudaError_t launch_scale_by(DType dtype, void* out, const void* x, const void* alpha, int64_t n,
                            cudaStream_t stream) {
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    return launch_elementwise<T, 1>(
        static_cast<T*>(out), static_cast<const T*>(x), static_cast<const T*>(x), n,
        ScaleByOp<T>{static_cast<const acc_t<T>*>(alpha), out == x}, stream);
  });
}

cudaError_t launch_square(DType dtype, void* out, const void* x, int64_t n, cudaStream_t stream) {
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    return launch_elementwise<T, 1>(static_cast<T*>(out), static_cast<const T*>(x),
                                    static_cast<const T*>(x), n, SquareOp{}, stream);
  });
}

}  // namespace cuops::kernels
