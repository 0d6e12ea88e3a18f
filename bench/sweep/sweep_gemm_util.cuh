// Shared by the GEMM sweep programs: cuBLAS error check, the library's GEMM request for a sweep's
// operands, a deterministic uniform fill, and the max-abs error against a reference relative to the
// reference's largest magnitude.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/gemm/gemm_plan_hooks.h"
#include "sweep_util.cuh"

#define CB(x)                                                            \
  do {                                                                   \
    cublasStatus_t s_ = (x);                                             \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                   \
      printf("cuBLAS error %d at %s:%d\n", (int)s_, __FILE__, __LINE__); \
      exit(1);                                                           \
    }                                                                    \
  } while (0)

// c [m, n] row-major <- alpha a @ b + beta c, a k-major (rows of k) or m-major (stored [k, m]), b
// n-major (rows of n) or k-major (stored [n, k]): what the library's planner takes for these operands.
inline cuops::kernels::GemmRequest sweep_request(cuops::kernels::DType t, int64_t m, int64_t n, int64_t k,
                                                 const void* a, bool ak, const void* b, bool bn, void* c, float alpha,
                                                 float beta, bool tf32) {
  const int64_t lda = std::max<int64_t>(1, ak ? k : m), ldb = std::max<int64_t>(1, bn ? n : k);
  return {t, m, n, k, {a, ak ? lda : 1, ak ? 1 : lda}, {b, bn ? ldb : 1, bn ? 1 : ldb}, c, n, 1, alpha, beta, tf32};
}

inline __host__ __device__ float sweep_to_float(float x) { return x; }
inline __host__ __device__ double sweep_to_float(double x) { return x; }  // float64 sweeps keep their digits
inline __host__ __device__ float sweep_to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// Uniform in [-0.5, 0.5) from a hash of the index: the same inputs on every run.
template <typename T> __global__ void fill_uniform(T* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = T((h & 0xffffff) / float(0x1000000) - 0.5f);
  }
}

// max |x - ref| / max |ref| over n device elements; a NaN in x (an unwritten element) counts as huge.
template <typename T> double rel_err(const T* x, const T* ref, int64_t n) {
  std::vector<T> hx(n), hr(n);
  CK(cudaMemcpy(hx.data(), x, n * sizeof(T), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hr.data(), ref, n * sizeof(T), cudaMemcpyDeviceToHost));
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double a = sweep_to_float(hx[i]), b = sweep_to_float(hr[i]);
    num = std::max(num, std::isnan(a) ? 1e30 : std::fabs(a - b));
    den = std::max(den, std::fabs(b));
  }
  return num / (den > 0 ? den : 1);
}

// A square float32 problem of the FP32 sweeps: A and B filled, C (the kernel's) and R (cuBLAS's)
// left for the calls to write. Freed with the object.
struct SquareF32 {
  int64_t S;
  float *A = nullptr, *B = nullptr, *C = nullptr, *R = nullptr;
  explicit SquareF32(int64_t s) : S(s) {
    for (float** p : {&A, &B, &C, &R}) CK(cudaMalloc(p, S * S * 4));
    fill_uniform<<<1024, 256>>>(A, S * S, 1);
    fill_uniform<<<1024, 256>>>(B, S * S, 2);
  }
  ~SquareF32() {
    for (float* p : {A, B, C, R}) cudaFree(p);
  }
  struct Run {
    double err;  // max relative error of C against R (cuBLAS's result, computed first)
    float ms;    // median time of `reps` calls
  };
  // One kernel under test: C poisoned, one checked call, then timed calls.
  Run check_and_time(const std::function<cudaError_t()>& f, int reps) const {
    CK(cudaMemset(C, 0xff, S * S * 4));
    CK(f());
    CK(cudaDeviceSynchronize());
    const double err = rel_err(C, R, S * S);
    return {err, median_ms([&] { f(); }, reps)};
  }
  SquareF32(const SquareF32&) = delete;
  SquareF32& operator=(const SquareF32&) = delete;
};
