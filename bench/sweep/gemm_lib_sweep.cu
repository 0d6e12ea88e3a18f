// Sweep of the library's own float32 GEMM kernels (kernels/gemm_simt.cu, kernels/gemm_tf32.cu,
// compiled into this program) over tile configurations and the four operand layouts, each checked
// against cuBLAS on the same inputs and timed beside it: which configuration launch_sgemm_* should
// pick, and what the layouts cost. Not part of the library or the tests.
//   nvcc -O3 -std=c++17 -arch=sm_90 -Iinclude -Ikernels bench/sweep/gemm_lib_sweep.cu -lcublas -o s && ./s
// SWEEP_SIZE=4096 runs one size; SWEEP_NO_TF32=1 leaves out the TF32 kernels.
#include <cublas_v2.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../../kernels/gemm_simt.cu"
#include "../../kernels/gemm_tf32.cu"
#include "sweep_gemm_util.cuh"

using namespace cuops::kernels::detail;


int main() {
  cublasHandle_t h;
  CB(cublasCreate(&h));
  std::vector<int> sizes{1024, 2048, 4096, 8192};
  if (const char* e = getenv("SWEEP_SIZE")) sizes = {atoi(e)};
  for (int S : sizes) {
    const int64_t M = S, N = S, K = S;
    const SquareF32 sq(S);
    float *A = sq.A, *B = sq.B, *C = sq.C, *R = sq.R;
    const double flops = 2.0 * M * N * K;
    const int reps = S >= 8192 ? 10 : 30;
    const float one = 1, zero = 0;
    for (bool tf32 : {false, true}) {
      if (tf32 && getenv("SWEEP_NO_TF32")) continue;
      CB(cublasSetMathMode(h, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
      for (int layout = 0; layout < 4; ++layout) {
        const bool ak = !(layout & 1), bn = !(layout & 2);
        if (layout != 0 && S != 4096) continue;
        if (tf32 && S != 4096) continue;  // measured once already (NOTES.md); only the layouts again
        GemmProblem p{M, N, K, A, ak ? K : M, B, bn ? N : K, C, N, 1.f, 0.f};
        auto cublas = [&] {
          CB(cublasSgemm(h, bn ? CUBLAS_OP_N : CUBLAS_OP_T, ak ? CUBLAS_OP_N : CUBLAS_OP_T, N, M, K, &one, B,
                         bn ? N : K, A, ak ? K : M, &zero, R, N));
        };
        const float tb = median_ms(cublas, reps);
        printf("\n== %d^3 %s A %s B %s: cuBLAS %.3f ms, %.1f TFLOP/s\n", S, tf32 ? "TF32" : "FP32",
               ak ? "k-major" : "m-major", bn ? "n-major" : "k-major", tb, flops / tb / 1e9);
        auto report = [&](const char* name, const std::function<cudaError_t()>& f) {
          const auto [err, t] = sq.check_and_time(f, reps);
          printf("%-34s %8.3f ms %6.1f TFLOP/s %6.3fx cuBLAS  max rel err vs cuBLAS %.2e\n", name, t,
                 flops / t / 1e9, tb / t, err);
        };
        if (!tf32) {
          report("simt (library pick)", [&] { return launch_sgemm_simt(p, ak, bn, 0); });
          if (layout != 0) {
            report("simt 256x128x8", [&] { return launch_simt_tile<256, 128, 8>(p, ak, bn, 0); });
            continue;
          }
          report("simt 64x64x16", [&] { return launch_simt_tile<64, 64, 16>(p, ak, bn, 0); });
          report("simt 128x128x8", [&] { return launch_simt_tile<128, 128, 8>(p, ak, bn, 0); });
          report("simt 128x128x16", [&] { return launch_simt_tile<128, 128, 16>(p, ak, bn, 0); });
          report("simt 256x128x8", [&] { return launch_simt_tile<256, 128, 8>(p, ak, bn, 0); });
        } else {
          report("tf32 (library pick)", [&] { return launch_sgemm_tf32(p, ak, bn, 0); });
          if (layout != 0) continue;
          report("tf32 64x128 3 stages", [&] { return launch_tf32_tile<64, 128, 3>(p, ak, bn, 0); });
          report("tf32 64x128 4 stages", [&] { return launch_tf32_tile<64, 128, 4>(p, ak, bn, 0); });
          report("tf32 128x128 3 stages", [&] { return launch_tf32_tile<128, 128, 3>(p, ak, bn, 0); });
          report("tf32 128x128 4 stages", [&] { return launch_tf32_tile<128, 128, 4>(p, ak, bn, 0); });
        }
      }
    }
  }
  CB(cublasDestroy(h));
  return 0;
}
