// Shared by the two_norm sweeps (norm_bulk_sweep.cu, norm_tail_sweep.cu): the mbarrier and bulk-copy
// helpers, the per-vector squared differences and a block sum. The library has its own (kernels/).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* b, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(b)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* b, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nW:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra W;\n}\n" ::"r"(smem_addr(b)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

__device__ __forceinline__ float sq4(float4 x, float4 y) {
  const float a = x.x - y.x, b = x.y - y.y, c = x.z - y.z, d = x.w - y.w;
  return a * a + b * b + c * c + d * d;
}
__device__ __forceinline__ float sq4(uint4 x, uint4 y) {  // 8 bfloat16
  float s = 0.f;
  const uint32_t xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&xs[i]));
    const float2 q = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&ys[i]));
    s += (p.x - q.x) * (p.x - q.x) + (p.y - q.y) * (p.y - q.y);
  }
  return s;
}

template <int kThreads> __device__ float block_sum(float v) {
  __shared__ float ws[32];
  for (int o = 16; o; o >>= 1) v += __shfl_down_sync(~0u, v, o);
  if (threadIdx.x % 32 == 0) ws[threadIdx.x / 32] = v;
  __syncthreads();
  v = threadIdx.x < kThreads / 32 ? ws[threadIdx.x] : 0.f;
  if (threadIdx.x < 32)
    for (int o = 16; o; o >>= 1) v += __shfl_down_sync(~0u, v, o);
  return v;
}

__global__ void fill(float* p, int64_t n, uint32_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
    p[i] = (h & 0xffffff) / float(1 << 24) - 0.5f;
  }
}

}  // namespace
