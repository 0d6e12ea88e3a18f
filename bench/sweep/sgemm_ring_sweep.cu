// True-FP32 GEMM (no tensor cores) fed by a cp.async ring instead of register staging: is the
// library's SIMT kernel (kernels/gemm_simt.cu: registers -> shared each slice, one barrier per 8 k;
// 256x128 when this was written, session 7; 128x128 since session 8) held back by its pipeline? Row-major a and b only (the harness's layout), sizes a multiple of the
// tile, no bounds. The k-contiguous A tile is kept as rows of k (a cp.async cannot transpose); each
// thread's rows are 16 apart (ty + 16 i), so a warp's two row addresses sit in different banks and
// an 8-byte read gives two k of one row. Not part of the library or the tests.
//   nvcc -O3 -std=c++17 -arch=sm_90 -Iinclude -Ikernels bench/sweep/sgemm_ring_sweep.cu -lcublas -o r && ./r
#include <cublas_v2.h>

#include <cstdio>
#include <functional>

#include "../../kernels/gemm_simt.cu"
#include "sweep_gemm_util.cuh"

using namespace cuops::kernels::detail;

namespace ring {

template <int BM, int BN, int BK, int STAGES, int MINB>
__global__ void __launch_bounds__(256, MINB) sgemm_ring(GemmProblem p) {
  constexpr int TM = BM / 16, TN = BN / 16;
  constexpr int A_CP = BM * BK / 4 / 256, B_CP = BK * BN / 4 / 256;
  static_assert(A_CP >= 1 && B_CP >= 1, "whole chunks per thread");
  extern __shared__ __align__(16) float smem[];
  float* As = smem;                          // [STAGES][BM][BK]
  float* Bs = smem + STAGES * BM * BK;       // [STAGES][BK][BN]
  const float* A = static_cast<const float*>(p.a);
  const float* B = static_cast<const float*>(p.b);
  int64_t tm, tn;
  tile_coords<8>(p.m / BM, p.n / BN, tm, tn);
  const int64_t row0 = tm * BM, col0 = tn * BN;
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int ktiles = static_cast<int>(p.k / BK);

  auto load = [&](int s, int64_t k0) {
#pragma unroll
    for (int j = 0; j < A_CP; ++j) {
      const int idx = tid + j * 256, r = idx / (BK / 4), c = (idx % (BK / 4)) * 4;
      cp_async16(As + (s * BM + r) * BK + c, A + (row0 + r) * p.lda + k0 + c, 16);
    }
#pragma unroll
    for (int j = 0; j < B_CP; ++j) {
      const int idx = tid + j * 256, r = idx / (BN / 4), c = (idx % (BN / 4)) * 4;
      cp_async16(Bs + (s * BK + r) * BN + c, B + (k0 + r) * p.ldb + col0 + c, 16);
    }
  };

  float acc[TM][TN] = {};
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ktiles) load(s, int64_t{s} * BK);
    cp_async_commit();
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // slice kt landed for everyone; everyone is done with slice kt - 1's stage
    const int nk = kt + STAGES - 1;
    if (nk < ktiles) load(nk % STAGES, int64_t{nk} * BK);
    cp_async_commit();
    const int s = kt % STAGES;
    const float* as = As + (s * BM + ty) * BK;
    const float* bs = Bs + s * BK * BN + tx * (TN / 2);
#pragma unroll
    for (int kp = 0; kp < BK; kp += 2) {
      float2 a[TM];
      float b0[TN], b1[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i) a[i] = *reinterpret_cast<const float2*>(as + i * 16 * BK + kp);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        copy_frag<TN / 2>(b0 + h * TN / 2, bs + kp * BN + h * BN / 2);
        copy_frag<TN / 2>(b1 + h * TN / 2, bs + (kp + 1) * BN + h * BN / 2);
      }
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i].y, b1[j], fmaf(a[i].x, b0[j], acc[i][j]));
    }
  }
  cp_async_wait<0>();
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int64_t r = row0 + ty + 16 * i;
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int q = 0; q < TN / 2; q += 2)
        store_pair(p, r, col0 + h * BN / 2 + tx * TN / 2 + q, acc[i][h * TN / 2 + q], acc[i][h * TN / 2 + q + 1]);
  }
}

template <int BM, int BN, int BK, int STAGES, int MINB> cudaError_t launch_ring(const GemmProblem& p) {
  constexpr int smem = STAGES * (BM * BK + BK * BN) * 4;
  auto k = sgemm_ring<BM, BN, BK, STAGES, MINB>;
  cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  k<<<static_cast<unsigned>((p.m / BM) * (p.n / BN)), 256, smem>>>(p);
  return cudaGetLastError();
}

}  // namespace ring

int main() {
  cublasHandle_t h;
  CB(cublasCreate(&h));
  setvbuf(stdout, nullptr, _IONBF, 0);
  int failures = 0;
  for (int S : {2048, 4096, 8192}) {
    const int64_t M = S, N = S, K = S;
    const SquareF32 sq(S);
    float *A = sq.A, *B = sq.B, *C = sq.C, *R = sq.R;
    const double flops = 2.0 * M * N * K;
    const int reps = S >= 8192 ? 10 : 30;
    const float one = 1, zero = 0;
    GemmProblem p{M, N, K, A, K, B, N, C, N, 1.f, 0.f};
    auto cublas = [&] { CB(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, B, N, A, K, &zero, R, N)); };
    const float tb = median_ms(cublas, reps);
    printf("\n== %d^3 FP32 a, b row-major: cuBLAS %.3f ms, %.1f TFLOP/s\n", S, tb, flops / tb / 1e9);
    auto report = [&](const char* name, const std::function<cudaError_t()>& f) {
      const auto [err, t] = sq.check_and_time(f, reps);
      const bool bad = !(err < 1e-5);
      failures += bad;
      printf("%-34s %8.3f ms %6.1f TFLOP/s %6.3fx cuBLAS  max rel err %.2e%s\n", name, t, flops / t / 1e9, tb / t,
             err, bad ? "  WRONG" : "");
    };
    report("library pick (simt)", [&] { return launch_sgemm_simt(p, true, true, 0); });
    report("ring 256x128x16 3 stages", [&] { return ring::launch_ring<256, 128, 16, 3, 1>(p); });
    report("ring 256x128x16 4 stages", [&] { return ring::launch_ring<256, 128, 16, 4, 1>(p); });
    report("ring 256x128x8 4 stages", [&] { return ring::launch_ring<256, 128, 8, 4, 1>(p); });
    report("ring 256x128x32 3 stages", [&] { return ring::launch_ring<256, 128, 32, 3, 1>(p); });
    report("ring 128x128x16 3 st, 2/SM", [&] { return ring::launch_ring<128, 128, 16, 3, 2>(p); });
    report("ring 128x128x8 4 st, 2/SM", [&] { return ring::launch_ring<128, 128, 8, 4, 2>(p); });
    report("ring 128x256x16 3 stages", [&] { return ring::launch_ring<128, 256, 16, 3, 1>(p); });
    const float tb2 = median_ms(cublas, reps);  // the spread of one kernel between two timings
    printf("%-34s %8.3f ms %6.1f TFLOP/s %6.3fx cuBLAS\n", "cuBLAS again", tb2, flops / tb2 / 1e9, tb / tb2);
  }
  CB(cublasDestroy(h));
  printf("\n%d failures\n", failures);
  return failures != 0;
}
