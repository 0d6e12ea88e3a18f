// Design sweep for the memory-bound kernels (not part of the library or the tests): times variants of
// the add and sum-of-squared-differences loops side by side with cudaMemcpyAsync D2D, so one device
// call tells which knobs (vectors in flight, cache hints, grid shape, bf16 math) move the figure.
//   nvcc -O3 -std=c++17 -arch=sm_90 bench/sweep/membound_sweep.cu -o sweep && ./sweep
// Prints GB/s and the fraction of the copy figure at the same byte count (bytes read + written).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <vector>

#include "sweep_util.cuh"

// Load/store policies. 0 plain, 1 .cs (evict-first streaming), 2 .nc + L1::no_allocate,
// 3 .nc + L1::no_allocate + L2::256B prefetch.
template <int P> __device__ __forceinline__ uint4 ld16(const void* p) {
  uint4 r;
  if constexpr (P == 0) {
    asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  } else if constexpr (P == 1) {
    asm volatile("ld.global.cs.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  } else if constexpr (P == 2) {
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  } else {
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  }
  return r;
}
template <int P> __device__ __forceinline__ void st16(void* p, uint4 v) {
  if constexpr (P == 1) {
    asm volatile("st.global.cs.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
  } else {
    asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
  }
}

template <typename T> struct Math;
template <> struct Math<float> {
  static __device__ __forceinline__ uint4 add(uint4 a, uint4 b, bool) {
    uint4 r;
    r.x = __float_as_uint(__uint_as_float(a.x) + __uint_as_float(b.x));
    r.y = __float_as_uint(__uint_as_float(a.y) + __uint_as_float(b.y));
    r.z = __float_as_uint(__uint_as_float(a.z) + __uint_as_float(b.z));
    r.w = __float_as_uint(__uint_as_float(a.w) + __uint_as_float(b.w));
    return r;
  }
  static __device__ __forceinline__ float sqd(uint4 a, uint4 b) {
    float s = 0;
    const float* x = reinterpret_cast<const float*>(&a);
    const float* y = reinterpret_cast<const float*>(&b);
#pragma unroll
    for (int i = 0; i < 4; ++i) { float d = x[i] - y[i]; s += d * d; }
    return s;
  }
};
template <> struct Math<__nv_bfloat16> {
  static __device__ __forceinline__ uint4 add(uint4 a, uint4 b, bool native) {
    uint4 r;
    const __nv_bfloat162* x = reinterpret_cast<const __nv_bfloat162*>(&a);
    const __nv_bfloat162* y = reinterpret_cast<const __nv_bfloat162*>(&b);
    __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(&r);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (native) {
        o[i] = __hadd2(x[i], y[i]);
      } else {
        float2 fx = __bfloat1622float2(x[i]), fy = __bfloat1622float2(y[i]);
        o[i] = __floats2bfloat162_rn(fx.x + fy.x, fx.y + fy.y);
      }
    }
    return r;
  }
  static __device__ __forceinline__ float sqd(uint4 a, uint4 b) {
    float s = 0;
    const __nv_bfloat162* x = reinterpret_cast<const __nv_bfloat162*>(&a);
    const __nv_bfloat162* y = reinterpret_cast<const __nv_bfloat162*>(&b);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 fx = __bfloat1622float2(x[i]), fy = __bfloat1622float2(y[i]);
      float d0 = fx.x - fy.x, d1 = fx.y - fy.y;
      s += d0 * d0 + d1 * d1;
    }
    return s;
  }
};

// One tile per block: block b handles vectors [b*TH*U, (b+1)*TH*U).
template <typename T, int TH, int U, int LP, int SP, bool NATIVE>
__global__ void __launch_bounds__(TH) add_tile(uint4* o, const uint4* a, const uint4* b, int64_t nv) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * TH * U + threadIdx.x;
  uint4 x[U], y[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    int64_t i = first + int64_t(u) * TH;
    if (i < nv) { x[u] = ld16<LP>(a + i); y[u] = ld16<LP>(b + i); }
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    int64_t i = first + int64_t(u) * TH;
    if (i < nv) st16<SP>(o + i, Math<T>::add(x[u], y[u], NATIVE));
  }
}

// Persistent grid-stride version.
template <typename T, int TH, int U, int LP, int SP>
__global__ void __launch_bounds__(TH) add_gs(uint4* o, const uint4* a, const uint4* b, int64_t nv) {
  const int64_t stride = int64_t(gridDim.x) * TH * U;
  for (int64_t base = int64_t(blockIdx.x) * TH * U + threadIdx.x; base < nv; base += stride) {
    uint4 x[U], y[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      int64_t i = base + int64_t(u) * TH;
      if (i < nv) { x[u] = ld16<LP>(a + i); y[u] = ld16<LP>(b + i); }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      int64_t i = base + int64_t(u) * TH;
      if (i < nv) st16<SP>(o + i, Math<T>::add(x[u], y[u], false));
    }
  }
}

template <int TH> __device__ __forceinline__ float block_sum(float v) {
  __shared__ float ws[32];
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  if (threadIdx.x % 32 == 0) ws[threadIdx.x / 32] = v;
  __syncthreads();
  v = threadIdx.x < TH / 32 ? ws[threadIdx.x] : 0.f;
  if (threadIdx.x < 32)
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  return v;
}

// Grid-stride sum of squared differences; MODE 0: blocks interleave (stride = grid*TH per u);
// MODE 1: block-contiguous chunks (each block walks its own slice).
template <typename T, int TH, int U, int LP, int MODE>
__global__ void __launch_bounds__(TH) sqd_partials(const uint4* a, const uint4* b, int64_t nv, float* part) {
  float acc[U] = {};
  if constexpr (MODE == 0) {
    const int64_t stride = int64_t(gridDim.x) * TH;
    for (int64_t base = int64_t(blockIdx.x) * TH + threadIdx.x; base < nv; base += stride * U) {
      uint4 x[U], y[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        int64_t i = base + u * stride;
        if (i < nv) { x[u] = ld16<LP>(a + i); y[u] = ld16<LP>(b + i); }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        int64_t i = base + u * stride;
        if (i < nv) acc[u] += Math<T>::sqd(x[u], y[u]);
      }
    }
  } else {
    const int64_t per = (nv + gridDim.x - 1) / gridDim.x;
    const int64_t lo = int64_t(blockIdx.x) * per, hi = lo + per < nv ? lo + per : nv;
    for (int64_t base = lo + threadIdx.x; base < hi; base += TH * U) {
      uint4 x[U], y[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        int64_t i = base + u * TH;
        if (i < hi) { x[u] = ld16<LP>(a + i); y[u] = ld16<LP>(b + i); }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        int64_t i = base + u * TH;
        if (i < hi) acc[u] += Math<T>::sqd(x[u], y[u]);
      }
    }
  }
  float s = 0;
#pragma unroll
  for (int u = 0; u < U; ++u) s += acc[u];
  s = block_sum<TH>(s);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void finish(const float* part, int n, float* out) {
  float s = 0;
  for (int i = threadIdx.x; i < n; i += 1024) s += part[i];
  s = block_sum<1024>(s);
  if (threadIdx.x == 0) out[0] = sqrtf(s);
}

__global__ void fill(uint32_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    // Keep values finite for both float and bf16 reinterpretations: exponent bits near 1.0.
    p[i] = (h & 0x007f007fu) | 0x3f003f00u;
  }
}

int main() {
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int64_t max_bytes = int64_t(1) << 32;  // 4 GiB per buffer (2^30 fp32)
  uint4 *A, *B, *C;
  float* part;
  CK(cudaMalloc(&A, max_bytes));
  CK(cudaMalloc(&B, max_bytes));
  CK(cudaMalloc(&C, max_bytes));
  CK(cudaMalloc(&part, 1 << 20));
  fill<<<4096, 256>>>(reinterpret_cast<uint32_t*>(A), max_bytes / 4, 1);
  fill<<<4096, 256>>>(reinterpret_cast<uint32_t*>(B), max_bytes / 4, 2);
  CK(cudaDeviceSynchronize());

  for (int64_t bytes_per_buf : {int64_t(1) << 29, int64_t(1) << 30, int64_t(1) << 32}) {
    const int64_t nv = bytes_per_buf / 16;
    float tc = median_ms([&] { CK(cudaMemcpyAsync(C, A, bytes_per_buf, cudaMemcpyDeviceToDevice)); });
    const double copy = 2.0 * bytes_per_buf / tc / 1e6;
    printf("\n== buffer %lld MiB: memcpy D2D %.0f GB/s (%.3f ms)\n", (long long)(bytes_per_buf >> 20), copy, tc);
    auto rep = [&](const char* name, double bytes, float ms) {
      printf("%-44s %8.3f ms %7.0f GB/s %6.3fx copy\n", name, ms, bytes / ms / 1e6, bytes / ms / 1e6 / copy);
    };
    const double add_bytes = 3.0 * bytes_per_buf, nrm_bytes = 2.0 * bytes_per_buf;
#define ADD_TILE(T, TH, U, LP, SP, NAT)                                                                  \
  rep("add " #T " tile TH=" #TH " U=" #U " ld" #LP " st" #SP " nat" #NAT, add_bytes, median_ms([&] {    \
        add_tile<T, TH, U, LP, SP, NAT><<<(nv + TH * U - 1) / (TH * U), TH>>>(C, A, B, nv);              \
      }))
#define ADD_GS(T, TH, U, LP, SP, MUL)                                                                    \
  rep("add " #T " gs TH=" #TH " U=" #U " ld" #LP " st" #SP " x" #MUL, add_bytes, median_ms([&] {        \
        int g = std::min<int64_t>(sms * MUL, (nv + TH * U - 1) / (TH * U));                             \
        add_gs<T, TH, U, LP, SP><<<g, TH>>>(C, A, B, nv);                                               \
      }))
    ADD_TILE(float, 256, 4, 0, 0, false);
    ADD_TILE(float, 256, 4, 1, 1, false);
    ADD_TILE(__nv_bfloat16, 256, 4, 0, 0, false);
    ADD_TILE(__nv_bfloat16, 256, 4, 0, 0, true);
    ADD_TILE(__nv_bfloat16, 256, 4, 1, 1, false);
    ADD_TILE(__nv_bfloat16, 256, 4, 2, 1, false);
    ADD_TILE(__nv_bfloat16, 256, 4, 3, 1, false);
    ADD_TILE(__nv_bfloat16, 256, 4, 0, 1, false);
    ADD_TILE(__nv_bfloat16, 256, 8, 0, 0, false);
    ADD_TILE(__nv_bfloat16, 256, 8, 1, 1, false);
    ADD_TILE(__nv_bfloat16, 128, 4, 0, 0, false);
    ADD_TILE(__nv_bfloat16, 512, 2, 0, 0, false);
    ADD_TILE(__nv_bfloat16, 256, 2, 0, 0, false);
    ADD_TILE(__nv_bfloat16, 256, 1, 0, 0, false);
    ADD_TILE(__nv_bfloat16, 128, 8, 1, 1, false);
    ADD_GS(__nv_bfloat16, 256, 4, 0, 0, 8);
    ADD_GS(__nv_bfloat16, 256, 4, 1, 1, 8);
    ADD_GS(__nv_bfloat16, 256, 2, 0, 0, 8);
    ADD_GS(__nv_bfloat16, 512, 2, 1, 1, 4);
    ADD_GS(__nv_bfloat16, 256, 4, 0, 0, 16);
    ADD_GS(float, 256, 4, 0, 0, 8);
    ADD_GS(float, 256, 4, 1, 1, 8);

#define NRM(T, TH, U, LP, MODE, BLOCKS)                                                                  \
  rep("sqd " #T " TH=" #TH " U=" #U " ld" #LP " mode" #MODE " blocks=" #BLOCKS, nrm_bytes, median_ms([&] { \
        int g = BLOCKS <= 0 ? sms * (-BLOCKS) : BLOCKS;                                                 \
        sqd_partials<T, TH, U, LP, MODE><<<g, TH>>>(A, B, nv, part);                                    \
        finish<<<1, 1024>>>(part, g, part + 65536);                                                     \
      }))
    NRM(float, 256, 4, 0, 0, 1024);
    NRM(float, 256, 4, 2, 0, 1024);
    NRM(float, 256, 4, 1, 0, 1024);
    NRM(float, 256, 8, 0, 0, 1024);
    NRM(float, 256, 8, 2, 0, 1024);
    NRM(float, 256, 4, 0, 0, -8);
    NRM(float, 256, 8, 2, 0, -8);
    NRM(float, 256, 4, 2, 0, -16);
    NRM(float, 512, 4, 2, 0, -4);
    NRM(float, 512, 8, 2, 0, -4);
    NRM(float, 1024, 4, 2, 0, -2);
    NRM(float, 256, 4, 2, 1, -8);
    NRM(float, 256, 8, 2, 1, -8);
    NRM(float, 128, 8, 2, 0, -16);
    NRM(float, 256, 2, 2, 0, -8);
    NRM(__nv_bfloat16, 256, 4, 0, 0, 1024);
    NRM(__nv_bfloat16, 256, 8, 2, 0, -8);
    NRM(__nv_bfloat16, 256, 4, 2, 0, -8);
    NRM(__nv_bfloat16, 512, 8, 2, 0, -4);
    NRM(__nv_bfloat16, 256, 8, 2, 1, -8);
  }
  return 0;
}
