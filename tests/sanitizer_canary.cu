// One deliberate bug per compute-sanitizer tool, in kernels named like ours (namespace cuops), so
// tools/sanitize.sh can show that each tool, with the same --kernel-name filter it applies to the
// test suites, reports a bug: a clean report on the suites then means something.
//   sanitizer_canary memcheck|racecheck|initcheck|synccheck
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

namespace cuops::canary {

__global__ void write_one_past_the_end(float* p, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= n) p[i] = 1.0f;  // i == n is out of bounds
}

__global__ void shared_memory_race(float* out) {
  __shared__ float s[64];
  s[threadIdx.x] = threadIdx.x;
  // No __syncthreads(): reads a neighbour's slot that another warp may not have written yet.
  out[threadIdx.x] = s[(threadIdx.x + 32) % 64];
}

__global__ void read_uninitialised(const float* in, float* out) { out[threadIdx.x] = in[threadIdx.x] * 2.0f; }

__global__ void divergent_barrier(float* out) {
  __shared__ float s[64];
  if (threadIdx.x < 16) {  // half a warp reaches the barrier, the rest never does
    s[threadIdx.x] = 1.0f;
    __syncthreads();
  }
  out[threadIdx.x] = s[threadIdx.x % 16];
}

}  // namespace cuops::canary

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s memcheck|racecheck|initcheck|synccheck\n", argv[0]);
    return 2;
  }
  float *a = nullptr, *b = nullptr;
  const int n = 64;
  cudaMalloc(&a, n * sizeof(float));
  cudaMalloc(&b, n * sizeof(float));
  if (!std::strcmp(argv[1], "memcheck")) {
    cuops::canary::write_one_past_the_end<<<1, n + 1>>>(a, n);
  } else if (!std::strcmp(argv[1], "racecheck")) {
    cuops::canary::shared_memory_race<<<1, n>>>(a);
  } else if (!std::strcmp(argv[1], "initcheck")) {
    cuops::canary::read_uninitialised<<<1, n>>>(b, a);
  } else if (!std::strcmp(argv[1], "synccheck")) {
    cuops::canary::divergent_barrier<<<1, n>>>(a);
  } else {
    return 2;
  }
  cudaDeviceSynchronize();
  cudaFree(a);
  cudaFree(b);
  return 0;
}
