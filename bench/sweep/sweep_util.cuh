// Shared by the standalone sweep programs in this folder: a CUDA error check and the event timer.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#define CK(x)                                                                                   \
  do {                                                                                          \
    cudaError_t e_ = (x);                                                                       \
    if (e_ != cudaSuccess) {                                                                    \
      printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);           \
      exit(1);                                                                                  \
    }                                                                                           \
  } while (0)

// Median of `reps` single-call event timings after 3 warm-up calls; `before` (if any) runs ahead of
// each timed call, outside the timer (an L2 flush, say), else an untimed call of f does. The events
// are recorded on `stream`.
// The first call in a process first keeps the GPU busy with f for 300 ms: the SM clock starts at its
// idle value and takes that long to rise, and without it the first rows of a sweep read low (the
// float64 pick at 1024^3 0.73x cuBLAS, the same plan 0.95x a few rows later).
inline float median_ms(const std::function<void()>& f, int reps = 30, const std::function<void()>& before = {},
                       cudaStream_t stream = nullptr) {
  static bool clocked_up = false;
  if (!clocked_up) {
    clocked_up = true;
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(300)) {
      for (int i = 0; i < 10; ++i) f();
      CK(cudaStreamSynchronize(stream));
    }
  }
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    // Something runs on the GPU while the host launches the timed call, so the interval holds the
    // GPU's time and not the launch's: `before`, or else an untimed call of f. Without that, the idle
    // GPU waited for each launch inside the interval (float64 1024^3: cuBLAS 64 us against its
    // kernel's 41 us in the profiler).
    if (before) {
      before();
    } else {
      f();
    }
    CK(cudaEventRecord(e0, stream));
    f();
    CK(cudaEventRecord(e1, stream));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms);
  }
  CK(cudaGetLastError());
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
