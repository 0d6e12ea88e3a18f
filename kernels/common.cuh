// Shared device helpers: dtype traits, conversions, dtype dispatch with an erroring default.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <type_traits>

#include "kernels.h"

namespace cuops::kernels::detail {

// Accumulation type: half types compute in float, float in float, double in double.
template <typename T> struct AccType {
  using type = float;
};
template <> struct AccType<double> {
  using type = double;
};
template <typename T> using acc_t = typename AccType<T>::type;

// Conversions through the intrinsics, not the types' conversion operators: torch's JIT extension
// build (cpp_extension.load) compiles with -D__CUDA_NO_HALF_CONVERSIONS__ and friends, which remove them.
template <typename T> __device__ __forceinline__ acc_t<T> to_acc(T x) {
  return static_cast<acc_t<T>>(x);
}
template <> __device__ __forceinline__ float to_acc<__half>(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_acc<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <typename T> __device__ __forceinline__ T from_acc(acc_t<T> x) {
  return static_cast<T>(x);
}
template <> __device__ __forceinline__ __half from_acc<__half>(float x) {
  return __float2half_rn(x);
}
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

template <typename T> inline constexpr bool is_half_type =
    std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

// 16 bytes of T, the widest single global load/store. The half types are held as four 32-bit words
// of packed pairs: held as eight 16-bit elements, a guarded load (`if (i < n) x = p[i]`) made the
// compiler merge 16-bit halves with PRMTs and spill them to local memory in the unrolled loops
// (measured: the bf16 norm ran at half the bus rate, bf16 add 3.5 % behind torch.add).
template <typename T, int V> struct alignas(sizeof(T) * V) Vec {
  T v[V];
};
template <> struct alignas(16) Vec<__half, 8> {
  uint32_t w[4];
};
template <> struct alignas(16) Vec<__nv_bfloat16, 8> {
  uint32_t w[4];
};

// A packed pair of half-type values (element 2i in the low 16 bits) to two floats and back. The
// bf16 -> float widening is exact (a shift); float -> half type rounds to nearest even, as from_acc.
__device__ __forceinline__ float2 unpack_pair(uint32_t w, __nv_bfloat16) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
__device__ __forceinline__ float2 unpack_pair(uint32_t w, __half) {
  __half2 h;
  __builtin_memcpy(&h, &w, sizeof(h));
  return __half22float2(h);
}
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi, __nv_bfloat16) {
  const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
  uint32_t w;
  __builtin_memcpy(&w, &p, sizeof(w));
  return w;
}
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi, __half) {
  const __half2 p = __floats2half2_rn(lo, hi);
  uint32_t w;
  __builtin_memcpy(&w, &p, sizeof(w));
  return w;
}

// Applies f (acc_t<T> x, acc_t<T> y) -> acc_t<T> to each element of two vectors. The half types go
// two at a time through the packed conversions; the rounding is the same correctly-rounded
// float -> half conversion as the scalar path.
template <typename T, int V, typename F>
__device__ __forceinline__ Vec<T, V> map_vec(const Vec<T, V>& x, const Vec<T, V>& y, F f) {
  Vec<T, V> r;
  if constexpr (is_half_type<T> && V == 8) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 a = unpack_pair(x.w[i], T{}), b = unpack_pair(y.w[i], T{});
      r.w[i] = pack_pair(f(a.x, b.x), f(a.y, b.y), T{});
    }
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) r.v[i] = from_acc<T>(f(to_acc(x.v[i]), to_acc(y.v[i])));
  }
  return r;
}

// Sum over the elements of two vectors of g(x, y), in acc_t<T> (one 16-byte vector's worth only,
// so float loses nothing measurable), returned as A for the caller's longer running sum.
template <typename A, typename T, int V, typename G>
__device__ __forceinline__ A sum_vec(const Vec<T, V>& x, const Vec<T, V>& y, G g) {
  acc_t<T> s = 0;
  if constexpr (is_half_type<T> && V == 8) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 a = unpack_pair(x.w[i], T{}), b = unpack_pair(y.w[i], T{});
      s += g(a.x, b.x) + g(a.y, b.y);
    }
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) s += g(to_acc(x.v[i]), to_acc(y.v[i]));
  }
  return static_cast<A>(s);
}

// E elements of U at p into f (as A, a float type): 16-byte accesses, or one of E * sizeof(U) bytes
// where that is less (8: four half-type elements beside float32 operands), or one element.
template <typename U, int E, typename A>
__device__ __forceinline__ void load_elems(const U* p, A (&f)[E]) {
  constexpr int kBytes = E * sizeof(U) < 16 ? E * sizeof(U) : 16;  // an access's bytes
  constexpr int kChunk = kBytes / sizeof(U);                       // elements an access holds
  static_assert(E == 1 || (E % kChunk == 0 && (kBytes == 16 || kBytes == 8)),
                "a vector is whole 8- or 16-byte accesses of each operand");
  if constexpr (E == 1) {
    f[0] = static_cast<A>(to_acc(p[0]));
  } else if constexpr (kBytes == 8) {
    const uint2 raw = *reinterpret_cast<const uint2*>(p);
    U u[E];
    __builtin_memcpy(u, &raw, 8);
#pragma unroll
    for (int i = 0; i < E; ++i) f[i] = static_cast<A>(to_acc(u[i]));
  } else {
#pragma unroll
    for (int c = 0; c < E / kChunk; ++c) {
      const uint4 raw = *reinterpret_cast<const uint4*>(p + c * kChunk);
      U u[kChunk];
      __builtin_memcpy(u, &raw, 16);
#pragma unroll
      for (int i = 0; i < kChunk; ++i) f[c * kChunk + i] = static_cast<A>(to_acc(u[i]));
    }
  }
}

// The same as a store of f rounded to U. Half types go as packed pairs (Vec's reason: an array of
// 16-bit elements put the rotary backward's bf16 stores through 8 bytes of stack).
template <typename U, int E, typename A>
__device__ __forceinline__ void store_elems(U* p, const A (&f)[E]) {
  if constexpr (is_half_type<U> && E % 4 == 0) {
    uint32_t w[E / 2];
#pragma unroll
    for (int i = 0; i < E / 2; ++i)
      w[i] = pack_pair(static_cast<float>(f[2 * i]), static_cast<float>(f[2 * i + 1]), U{});
    if constexpr (E == 4) {
      *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
    } else {
#pragma unroll
      for (int c = 0; c < E / 8; ++c)
        *reinterpret_cast<uint4*>(p + c * 8) =
            make_uint4(w[4 * c], w[4 * c + 1], w[4 * c + 2], w[4 * c + 3]);
    }
  } else if constexpr (E == 1) {
    p[0] = from_acc<U>(static_cast<acc_t<U>>(f[0]));
  } else {
    constexpr int kChunk = 16 / sizeof(U);
    static_assert(E % kChunk == 0, "a vector is whole 16-byte chunks of each operand");
    U u[E];
#pragma unroll
    for (int i = 0; i < E; ++i) u[i] = from_acc<U>(static_cast<acc_t<U>>(f[i]));
#pragma unroll
    for (int c = 0; c < E / kChunk; ++c) {
      uint4 raw;
      __builtin_memcpy(&raw, u + c * kChunk, 16);
      *reinterpret_cast<uint4*>(p + c * kChunk) = raw;
    }
  }
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// mbarriers for the bulk-copy (TMA) pipelines: kernels/norm/norm.cu's pass and the Hopper GEMM. The
// expect_tx and try_wait forms are sm_90 PTX: call them only from code compiled for sm_90 and up.
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
}
// Arms the barrier's current phase to also wait for `bytes` of bulk-copy data, and arrives once.
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  mbar_expect_tx(smem_addr(bar), bytes);
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) { mbar_arrive(smem_addr(bar)); }
// Returns once the phase of parity `parity` has completed. `bar`: the barrier's shared-memory address
// (loops that wait every trip keep it as such, not as a generic pointer converted on each call).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, "
        "0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  mbar_wait(smem_addr(bar), parity);
}

// Thread-block clusters (sm_90 PTX, like the expect_tx and try_wait forms above): this CTA's rank,
// another CTA's shared memory, the cluster-wide barrier.
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// The shared::cluster address of shared-memory address `addr` in CTA `rank` of the cluster. Addresses
// of one CTA's window are contiguous there too, so an offset may be added to the result.
__device__ __forceinline__ uint32_t map_cluster(uint32_t addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
// Arrives on the barrier at shared::cluster address `bar` (from map_cluster).
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// All threads of all CTAs of the cluster.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
                   : "memory");
}

inline bool aligned_like(const void* p, const void* q, uintptr_t to) {
  return (reinterpret_cast<uintptr_t>(p) % to) == (reinterpret_cast<uintptr_t>(q) % to);
}

// Calls f(T{}) for the C++ element type of dtype; unknown dtypes are an error, never a guess.
template <typename F> cudaError_t dispatch_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::Float32:
      return f(float{});
    case DType::Float64:
      return f(double{});
    case DType::Float16:
      return f(__half{});
    case DType::BFloat16:
      return f(__nv_bfloat16{});
  }
  return cudaErrorInvalidValue;
}

// Facts about a GPU that cost a driver query (SM count, whether a kernel image loads there), asked
// once per device: get() runs query(device) on the first call for the current device, under a
// once-flag, and returns that answer after. Devices past kMaxDevices, or no current device, get
// fallback (never cached).
constexpr int kMaxDevices = 64;
template <typename T> class PerDevice {
 public:
  template <typename Query> T get(Query query, T fallback) {
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) {
      (void)cudaGetLastError();
      return fallback;
    }
    std::call_once(once_[dev], [&] { value_[dev] = query(dev); });
    return value_[dev];
  }

 private:
  std::once_flag once_[kMaxDevices];
  T value_[kMaxDevices]{};
};

// A one-dimensional grid of `blocks`: 2^31 - 1 at most (gridDim.x's limit). Every 1-D launch checks
// here, so a too-large problem is one error (cudaErrorInvalidConfiguration), whichever kernel.
inline bool grid_fits(int64_t blocks) { return blocks >= 0 && blocks <= 0x7fffffff; }

inline unsigned int blocks_for(int64_t work, int64_t per_block) {
  return static_cast<unsigned int>((work + per_block - 1) / per_block);
}

}  // namespace cuops::kernels::detail
