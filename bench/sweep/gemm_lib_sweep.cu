// The library's float32 GEMM kernels (true-FP32 SIMT, and TF32 on mma.sync) over the tiles the library
// compiles and the four operand layouts, each checked against cuBLAS on the same inputs and timed
// beside it: which tile the planner should pick, and what the layouts cost. Plans come from the
// library's planner (kernels/gemm/gemm_plan.h), their tiles overridden with with_tile; the kernels are the
// library's own objects, linked in. Built by CMake (bench/sweep/CMakeLists.txt) as
// <build>/bench/sweep/gemm_lib_sweep; not part of the tests.
//   SWEEP_SIZE=4096 runs one size; SWEEP_NO_TF32=1 leaves out the TF32 kernels.
#include <cublas_v2.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "sweep_gemm_util.cuh"

using namespace cuops::kernels;

int main() {
  cublasHandle_t h;
  CB(cublasCreate(&h));
  const GemmDevice dev = current_gemm_device();
  // TF32 planned as on a GPU without the wgmma kernel: the portable mma.sync kernel is what this sweeps.
  const GemmDevice portable{dev.sms, false, 0};
  std::vector<int> sizes{1024, 2048, 4096, 8192};
  if (const char* e = getenv("SWEEP_SIZE")) sizes = {atoi(e)};
  int failures = 0;
  void* ws = nullptr;  // the largest workspace a plan asked for so far
  int64_t ws_bytes = 0;
  for (int S : sizes) {
    const int64_t M = S, N = S, K = S;
    const SquareF32 sq(S);
    const double flops = 2.0 * M * N * K;
    const int reps = S >= 8192 ? 10 : 30;
    const float one = 1, zero = 0;
    for (bool tf32 : {false, true}) {
      if (tf32 && getenv("SWEEP_NO_TF32")) continue;
      CB(cublasSetMathMode(h, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
      for (int layout = 0; layout < 4; ++layout) {
        const bool ak = !(layout & 1), bn = !(layout & 2);
        if (layout != 0 && S != 4096) continue;
        if (tf32 && S != 4096) continue;  // measured once already; only the layouts again
        const GemmPlan plan = plan_gemm(
            sweep_request(DType::Float32, M, N, K, sq.A, ak, sq.B, bn, sq.C, 1.f, 0.f, tf32), tf32 ? portable : dev);
        auto cublas = [&] {
          CB(cublasSgemm(h, bn ? CUBLAS_OP_N : CUBLAS_OP_T, ak ? CUBLAS_OP_N : CUBLAS_OP_T, N, M, K, &one, sq.B,
                         bn ? N : K, sq.A, ak ? K : M, &zero, sq.R, N));
        };
        const float tb = median_ms(cublas, reps);
        printf("\n== %d^3 %s A %s B %s: cuBLAS %.3f ms, %.1f TFLOP/s\n", S, tf32 ? "TF32" : "FP32",
               ak ? "k-major" : "m-major", bn ? "n-major" : "k-major", tb, flops / tb / 1e9);
        auto report = [&](const char* name, const GemmPlan& p) {
          if (p.workspace_bytes > ws_bytes) {  // a k split's planes
            CK(cudaFree(ws));
            CK(cudaMalloc(&ws, p.workspace_bytes));
            ws_bytes = p.workspace_bytes;
          }
          const auto [err, t] = sq.check_and_time([&] { return launch_gemm(p, nullptr, ws); }, reps);
          failures += !(err < (tf32 ? 5e-3 : 1e-5));
          printf("%-34s %8.3f ms %6.1f TFLOP/s %6.3fx cuBLAS  max rel err vs cuBLAS %.2e\n", name, t,
                 flops / t / 1e9, tb / t, err);
        };
        if (!tf32) {
          report("simt (library pick)", plan);
          if (layout != 0) continue;
          report("simt 64x64x16", with_tile(plan, 64, 64, 16, 1, dev));
          report("simt 128x128x8", with_tile(plan, 128, 128, 8, 1, dev));
        } else {
          report("tf32 mma (library pick)", plan);
          if (layout != 0) continue;
          report("tf32 mma 64x128", with_tile(plan, 64, 128, 32, 1, portable));
          report("tf32 mma 128x128", with_tile(plan, 128, 128, 32, 1, portable));
        }
      }
    }
  }
  CB(cublasDestroy(h));
  cudaFree(ws);
  printf("\n%d failures\n", failures);
  return failures != 0;
}
