// two_norm's pass as bulk copies (cp.async.bulk, the TMA engine without a tensor map) into a
// shared-memory ring, against the library's register-load pass and the device copy, at 2^28 and
// 2^30 float32 elements and 2^28 bfloat16. Question: does a read-only stream issued as a few large
// requests per SM get closer to HBM's peak than 16-byte loads (NOTES.md, two_norm v4)?
// Not part of the library or the tests.
//   nvcc -O3 -std=c++17 -arch=sm_90a bench/sweep/norm_bulk_sweep.cu -o nb && ./nb
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "norm_sweep_util.cuh"
#include "sweep_util.cuh"

namespace {

// V: the 16-byte vector type (float4 for float32, uint4 for 8 bfloat16). Register loads, the
// library's shape: 1024 threads, 4 vectors of each input in flight, grid-stride.
template <typename V>
__global__ void __launch_bounds__(1024) pass_regs(const V* a, const V* b, int64_t nv, float* part) {
  const int64_t stride = int64_t(gridDim.x) * 1024;
  float acc[4] = {};
  int64_t i = int64_t(blockIdx.x) * 1024 + threadIdx.x;
  for (; i + 3 * stride < nv; i += 4 * stride) {
    V x[4], y[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) x[u] = a[i + u * stride], y[u] = b[i + u * stride];
#pragma unroll
    for (int u = 0; u < 4; ++u) acc[u] += sq4(x[u], y[u]);
  }
  for (; i < nv; i += stride) acc[0] += sq4(a[i], b[i]);
  const float s = block_sum<1024>(acc[0] + acc[1] + acc[2] + acc[3]);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

// Bulk copies: warp 0's lane 0 fills a ring of kStages stages, each kChunk bytes of a and of b;
// kConsumers warps reduce each stage and hand it back. Chunk c goes to block c % gridDim.x.
template <typename V, int kChunk, int kStages, int kConsumers>
__global__ void __launch_bounds__(32 * (kConsumers + 1)) pass_bulk(const V* a, const V* b, int64_t nchunks, float* part) {
  extern __shared__ __align__(128) unsigned char sm[];
  uint64_t* full = reinterpret_cast<uint64_t*>(sm + 2 * kStages * kChunk);
  uint64_t* empty = full + kStages;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) mbar_init(&full[s], 1), mbar_init(&empty[s], kConsumers);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const int64_t mine = nchunks > blockIdx.x ? (nchunks - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
  float acc = 0.f;
  if (threadIdx.x < 32) {
    if (threadIdx.x == 0) {
      for (int64_t j = 0; j < mine; ++j) {
        const int s = int(j % kStages);
        if (j >= kStages) mbar_wait(&empty[s], uint32_t((j / kStages - 1) & 1));
        const int64_t c = blockIdx.x + j * gridDim.x;
        unsigned char* dst = sm + s * 2 * kChunk;
        mbar_expect_tx(&full[s], 2 * kChunk);
        bulk_load(dst, reinterpret_cast<const unsigned char*>(a) + c * kChunk, kChunk, &full[s]);
        bulk_load(dst + kChunk, reinterpret_cast<const unsigned char*>(b) + c * kChunk, kChunk, &full[s]);
      }
    }
  } else {
    constexpr int kPer = kChunk / 16 / (32 * kConsumers);
    const int t = threadIdx.x - 32;
    for (int64_t j = 0; j < mine; ++j) {
      const int s = int(j % kStages);
      mbar_wait(&full[s], uint32_t((j / kStages) & 1));
      const V* x = reinterpret_cast<const V*>(sm + s * 2 * kChunk);
      const V* y = reinterpret_cast<const V*>(sm + s * 2 * kChunk + kChunk);
      V xv[kPer], yv[kPer];
#pragma unroll
      for (int u = 0; u < kPer; ++u) xv[u] = x[t + u * 32 * kConsumers], yv[u] = y[t + u * 32 * kConsumers];
      __syncwarp();
      if (threadIdx.x % 32 == 0) mbar_arrive(&empty[s]);
#pragma unroll
      for (int u = 0; u < kPer; ++u) acc += sq4(xv[u], yv[u]);
    }
  }
  const float s = block_sum<32 * (kConsumers + 1)>(acc);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void finish(const float* part, int count, float* out) {
  float s = 0.f;
  for (int i = threadIdx.x; i < count; i += 1024) s += part[i];
  s = block_sum<1024>(s);
  if (threadIdx.x == 0) *out = sqrtf(s);
}

__global__ void copy_kernel(const float4* a, float4* c, int64_t nv) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < nv; i += int64_t(gridDim.x) * blockDim.x)
    c[i] = a[i];
}

int sms = 0;
float *part, *out;

// Inputs of 1 GiB and more: far past L2, so no call finds the previous one's lines there.
template <typename V, typename F> void report(const char* name, double bytes, double copy_ms, F f, float* ref) {
  const float t = median_ms(f, 20);
  float got;
  CK(cudaMemcpy(&got, out, 4, cudaMemcpyDeviceToHost));
  printf("  %-34s %8.3f ms %6.3f TB/s %6.3fx copy  result %.6g (ref %.6g)\n", name, t, bytes / t / 1e9, copy_ms / t,
         got, *ref);
  if (*ref == 0.f) *ref = got;
}

template <typename V> void run(const char* dname, int64_t n, int esize) {
  const int64_t bytes = n * esize;  // per input
  float *a, *b, *c;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  CK(cudaMalloc(&c, bytes));
  fill<<<1024, 256>>>(a, bytes / 4, 1);
  fill<<<1024, 256>>>(b, bytes / 4, 2);
  if (esize == 2) {  // random float bits are not all finite as bfloat16: constant inputs instead
    CK(cudaMemset(a, 0x3c, bytes));
    CK(cudaMemset(b, 0x3d, bytes));
  }
  CK(cudaDeviceSynchronize());
  const int64_t nv = bytes / 16;
  const float memcpy_ms = median_ms([&] { CK(cudaMemcpyAsync(c, a, bytes, cudaMemcpyDeviceToDevice)); }, 20);
  const float kcopy_ms = median_ms([&] { copy_kernel<<<sms * 4, 512>>>((const float4*)a, (float4*)c, nv); }, 20);
  printf("\n== %s n = 2^%d: memcpy %.3f ms (%.3f TB/s r+w), copy kernel %.3f ms (%.3f TB/s)\n", dname,
         int(std::log2(double(n))), memcpy_ms, 2.0 * bytes / memcpy_ms / 1e9, kcopy_ms, 2.0 * bytes / kcopy_ms / 1e9);
  const double nb = 2.0 * bytes;
  const float copy_ms = memcpy_ms;
  float ref = 0.f;
  const V* va = reinterpret_cast<const V*>(a);
  const V* vb = reinterpret_cast<const V*>(b);
  report<V>("regs 1024 x 2/SM (library shape)", nb, copy_ms, [&] {
    pass_regs<V><<<2 * sms, 1024>>>(va, vb, nv, part);
    finish<<<1, 1024>>>(part, 2 * sms, out);
  }, &ref);
  auto bulk = [&](auto kernel, const char* name, int chunk, int stages, int consumers, int per_sm) {
    const int smem = 2 * stages * chunk + 2 * stages * 8;
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const int64_t nchunks = bytes / chunk;
    report<V>(name, nb, copy_ms, [&] {
      kernel<<<per_sm * sms, 32 * (consumers + 1), smem>>>(va, vb, nchunks, part);
      finish<<<1, 1024>>>(part, per_sm * sms, out);
    }, &ref);
  };
  bulk(pass_bulk<V, 16384, 6, 8>, "bulk 16K x 6 stages, 8 warps, 1/SM", 16384, 6, 8, 1);
  bulk(pass_bulk<V, 16384, 4, 8>, "bulk 16K x 4 stages, 8 warps, 1/SM", 16384, 4, 8, 1);
  bulk(pass_bulk<V, 8192, 6, 8>, "bulk 8K x 6 stages, 8 warps, 2/SM", 8192, 6, 8, 2);
  bulk(pass_bulk<V, 32768, 3, 16>, "bulk 32K x 3 stages, 16 warps, 1/SM", 32768, 3, 16, 1);
  bulk(pass_bulk<V, 8192, 12, 8>, "bulk 8K x 12 stages, 8 warps, 1/SM", 8192, 12, 8, 1);
  bulk(pass_bulk<V, 4096, 12, 4>, "bulk 4K x 12 stages, 4 warps, 2/SM", 4096, 12, 4, 2);
  // The register pass again last: the clock after the bulk runs, for a same-conditions comparison.
  report<V>("regs again", nb, copy_ms, [&] {
    pass_regs<V><<<2 * sms, 1024>>>(va, vb, nv, part);
    finish<<<1, 1024>>>(part, 2 * sms, out);
  }, &ref);
  CK(cudaFree(a));
  CK(cudaFree(b));
  CK(cudaFree(c));
}

}  // namespace

int main() {
  setvbuf(stdout, nullptr, _IONBF, 0);
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaMalloc(&part, 4096 * 4));
  CK(cudaMalloc(&out, 4));
  run<float4>("float32", int64_t{1} << 28, 4);
  run<float4>("float32", int64_t{1} << 30, 4);
  run<uint4>("bfloat16", int64_t{1} << 28, 2);
  run<uint4>("bfloat16", int64_t{1} << 29, 2);
  return 0;
}
