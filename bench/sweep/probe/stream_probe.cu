// Probe (not a product kernel): how fast TMA streams a bf16 weight into a per-CTA ring with no
// compute, by box shape, ring depth and grid, against a plain contiguous read. Built by hand:
//   nvcc -std=c++17 -O3 -arch=sm_90 -I. -Ikernels bench/sweep/probe/stream_probe.cu -o probe
#include <cuda_bf16.h>

#include <cstdio>

#include "bench/sweep/sweep_util.cuh"
#include "kernels/gemm/tma.cuh"

using namespace cuops::kernels::detail;

// k-major: the weight [rows_total, k] row-major, a stage = `rows` rows x `chunk` k (boxes of rows x 64).
// o-major: the weight [k, rows_total], a stage = `chunk` k-rows x `rows` outputs (boxes of chunk x 64).
template <bool KM>
__global__ void __launch_bounds__(160) probe(const __grid_constant__ CUtensorMap map, int rows, int chunk, int stages,
                                             int64_t k, int64_t slice, int* sink) {
  extern __shared__ unsigned char raw[];
  const uint32_t base = (smem_addr(raw) + 1023) & ~1023u;
  const int stage_bytes = rows * chunk * 2;
  uint64_t* bars = reinterpret_cast<uint64_t*>(raw + (base - smem_addr(raw)) + stages * stage_bytes);
  const uint32_t full = smem_addr(bars), empty = full + 8 * stages;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int i = 0; i < stages; ++i) {
      mbar_init(bars + i, 1);
      mbar_init(bars + stages + i, 4);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const int row0 = blockIdx.x * rows;
  const int64_t kb = min(k, int64_t{blockIdx.y} * slice), ke = min(k, kb + slice);
  const int n = static_cast<int>((ke - kb + chunk - 1) / chunk);
  if (warp == 4) {
    if (lane == 0) {
      for (int i = 0; i < n; ++i) {
        const int slot = i % stages;
        if (i >= stages) mbar_wait(empty + 8 * slot, (i / stages - 1) & 1);
        const uint32_t bar = full + 8 * slot, dst = base + slot * stage_bytes;
        mbar_expect_tx(bar, stage_bytes);
        const int kk = static_cast<int>(kb + int64_t{i} * chunk);
        if (KM) {
          for (int b = 0; b < chunk / 64; ++b) tma_load(dst + b * rows * 128, &map, kk + 64 * b, row0, bar);
        } else {
          for (int b = 0; b < rows / 64; ++b) tma_load(dst + b * chunk * 128, &map, row0 + 64 * b, kk, bar);
        }
      }
    }
  } else {
    int acc = 0;
    for (int i = 0; i < n; ++i) {
      const int slot = i % stages;
      mbar_wait(full + 8 * slot, (i / stages) & 1);
      acc += *reinterpret_cast<volatile int*>(raw + (base - smem_addr(raw)) + slot * stage_bytes + lane * 4);
      __syncwarp();
      if (lane == 0) mbar_arrive(empty + 8 * slot);
    }
    if (acc == 0x7fffffff) *sink = acc;
  }
}

__global__ void plain_read(const uint4* p, int64_t n, int* sink) {
  uint32_t acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p + i));
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678) *sink = acc;
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t gib = size_t{1} << 30;
  void *a, *b;
  CK(cudaMalloc(&a, gib));
  CK(cudaMalloc(&b, gib));
  const double copy = 2.0 * gib / median_ms([&] { CK(cudaMemcpyAsync(b, a, gib, cudaMemcpyDeviceToDevice)); }, 10) / 1e6;
  CK(cudaFree(b));
  int* sink;
  CK(cudaMalloc(&sink, 4));
  printf("copy %.0f GB/s, %d SMs\n", copy, sms);
  // The weights: [outputs, k] (k-major) or [k, outputs] (o-major), 2 copies cycled from one buffer.
  const int64_t shapes[][2] = {{28672, 4096}, {4096, 14336}, {4096, 4096}};
  for (const auto& sh : shapes) {
    const int64_t outs = sh[0], k = sh[1];
    const size_t bytes = size_t(outs) * k * 2;
    const int copies = int(std::max<size_t>(2, 400000000 / bytes + 1));
    std::vector<char*> w(copies);
    for (int i = 0; i < copies; ++i) w[i] = static_cast<char*>(a) + 0 + size_t(i) * ((bytes + 4095) / 4096 * 4096) % (gib - bytes);
    // plain read
    {
      auto f = [&] {
        for (int i = 0; i < copies; ++i) plain_read<<<sms * 8, 512>>>(reinterpret_cast<const uint4*>(w[i]), bytes / 16, sink);
      };
      const double ms = median_ms(f, 15) / copies;
      printf("\n== outputs %lld k %lld (%.0f MB): plain read %.1f us, %.3f of copy\n", (long long)outs, (long long)k,
             bytes / 1e6, ms * 1e3, bytes / 1e6 / ms / copy);
    }
    for (bool km : {true, false}) {
      const int geo[][2] = {{16, 512}, {16, 1024}, {32, 256}, {32, 512}, {64, 128}, {64, 256}, {128, 64}, {128, 128}};
      for (const auto& g : geo) {
        const int rows = km ? g[0] : std::max(64, g[0]), chunk = km ? g[1] : g[1];
        if (!km && (g[0] < 64 || chunk > 256)) continue;
        for (int ring_kb : {64, 96}) {
          const int stage = rows * chunk * 2, stages = ring_kb * 1024 / stage;
          if (stages < 2) continue;
          const int smem = stages * stage + 16 * stages + 1024;
          const int groups = int((outs + rows - 1) / rows);
          for (int split : {1, 2, 4}) {
            const int64_t chunks = (k + chunk - 1) / chunk;
            const int64_t slice = (chunks + split - 1) / split * chunk;
            std::vector<CUtensorMap> maps(copies);
            bool ok = true;
            for (int i = 0; i < copies; ++i)
              ok &= km ? make_map<__nv_bfloat16>(maps[i], w[i], k, outs, k, 64, rows)
                       : make_map<__nv_bfloat16>(maps[i], w[i], outs, k, outs, 64, chunk);
            if (!ok) { printf("map failed\n"); continue; }
            auto kern = km ? probe<true> : probe<false>;
            CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
            auto f = [&] {
              for (int i = 0; i < copies; ++i)
                kern<<<dim3(groups, split), 160, smem>>>(maps[i], rows, chunk, stages, k, slice, sink);
            };
            const double ms = median_ms(f, 15) / copies;
            int occ = 0;
            CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, 160, smem));
            printf("  %s rows %3d chunk %4d stages %2d (ring %2d KB, %d/SM) split %d grid %5d: %6.1f us %.3f of copy\n",
                   km ? "k-major" : "o-major", rows, chunk, stages, ring_kb, occ, split, groups * split, ms * 1e3,
                   bytes / 1e6 / ms / copy);
          }
        }
      }
    }
  }
  return 0;
}
