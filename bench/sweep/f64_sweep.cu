// The float64 kernel (kernels/gemm_f64.cu) over its tiles and k splits, against cublasDgemm on the same
// inputs: which tile and split the planner's cost model (kernels/gemm_plan.cpp, plan_f64) should pick.
// Per shape: cuBLAS, the planner's pick, then every tile x split the library compiles (splits only
// where clusters run). Each checked against cuBLAS (max relative error) before it is timed; medians of
// event-timed calls on the same operands (L2-warm, as a sweep: the bench's rows are the reference).
// Built by CMake as <build>/bench/sweep/f64_sweep; not part of the tests.
//   SWEEP_SHAPES="m,n,k;m,n,k" replaces the shape list; SWEEP_ALL=0 prints only cuBLAS and the pick.
#include <cublas_v2.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "sweep_gemm_util.cuh"

using namespace cuops::kernels;

struct Shape {
  int64_t m, n, k;
};

int main() {
  cublasHandle_t h;
  CB(cublasCreate(&h));
  const GemmDevice dev = current_gemm_device();
  // Squares, issue 27's rows (mid, decode, weight gradient), a GPT-style training step's products.
  std::vector<Shape> shapes{{1024, 1024, 1024}, {4096, 4096, 4096}, {8192, 8192, 8192}, {1024, 6144, 4096},
                            {16, 4096, 14336},  {1, 4096, 4096},    {6144, 4096, 16},   {3072, 1024, 8192},
                            {1024, 1024, 8192}, {8192, 3072, 1024}, {512, 4096, 4096},  {128, 6144, 4096}};
  if (const char* e = getenv("SWEEP_SHAPES")) {
    shapes.clear();
    std::string s(e);
    for (size_t at = 0; at < s.size();) {
      const size_t end = std::min(s.find(';', at), s.size());
      Shape x{};
      if (sscanf(s.substr(at, end - at).c_str(), "%ld,%ld,%ld", &x.m, &x.n, &x.k) == 3) shapes.push_back(x);
      at = end + 1;
    }
  }
  const bool all = !getenv("SWEEP_ALL") || atoi(getenv("SWEEP_ALL")) != 0;
  int failures = 0;
  for (const Shape& s : shapes) {
    double *A, *B, *C, *R;
    CK(cudaMalloc(&A, s.m * s.k * 8));
    CK(cudaMalloc(&B, s.k * s.n * 8));
    CK(cudaMalloc(&C, s.m * s.n * 8));
    CK(cudaMalloc(&R, s.m * s.n * 8));
    fill_uniform<<<1024, 256>>>(A, s.m * s.k, 1);
    fill_uniform<<<1024, 256>>>(B, s.k * s.n, 2);
    const double flops = 2.0 * s.m * s.n * s.k, one = 1, zero = 0;
    const int reps = flops > 5e11 ? 10 : 30;
    // Row-major c = a @ b as cuBLAS's column-major c^T = b^T a^T.
    auto cublas = [&] { CB(cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, s.n, s.m, s.k, &one, B, s.n, A, s.k, &zero, R, s.n)); };
    const float tb = median_ms(cublas, reps);
    printf("\n== %ld x %ld x %ld float64: cuBLAS %.3f ms, %.1f TFLOP/s\n", s.m, s.n, s.k, tb, flops / tb / 1e9);
    const GemmPlan plan = plan_gemm(sweep_request(DType::Float64, s.m, s.n, s.k, A, true, B, true, C, 1.f, 0.f, false), dev);
    auto report = [&](const std::string& name, const GemmPlan& p) {
      CK(cudaMemset(C, 0xff, s.m * s.n * 8));
      const cudaError_t err0 = launch_gemm(p, nullptr);
      if (err0 != cudaSuccess) {
        printf("%-30s not run: %s\n", name.c_str(), cudaGetErrorString(err0));
        (void)cudaGetLastError();
        return;
      }
      CK(cudaDeviceSynchronize());
      const double err = rel_err(C, R, s.m * s.n);
      failures += !(err < 1e-12);
      const float t = median_ms([&] { launch_gemm(p, nullptr); }, reps);
      printf("%-30s %8.3f ms %6.1f TFLOP/s %6.3fx cuBLAS  max rel err %.1e\n", name.c_str(), t, flops / t / 1e9, tb / t, err);
    };
    char label[96];
    snprintf(label, sizeof label, "pick: %s %dx%d split %d", kernel_name(plan.kernel), plan.bm, plan.bn, plan.split_k);
    report(label, plan);
    for (const auto [bm, bn] : {std::pair{128, 64}, std::pair{128, 128}, std::pair{64, 64}, std::pair{16, 128}}) {
      for (int split : {1, 2, 3, 4, 8}) {
        if (plan.kernel != GemmKernel::MmaF64 || !all || (split > 1 && !dev.clusters)) break;
        GemmPlan q = with_tile(plan, bm, bn, 16, 1, dev);
        q.split_k = split;
        snprintf(label, sizeof label, "%dx%d split %d", bm, bn, split);
        report(label, q);
      }
    }
    for (double* p : {A, B, C, R}) cudaFree(p);
  }
  printf("\n%s\n", failures ? "SOME RESULTS WRONG" : "all results within 1e-12 of cuBLAS");
  return failures ? 1 : 0;
}
