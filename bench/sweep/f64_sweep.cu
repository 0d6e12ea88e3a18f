// The float64 kernel (kernels/gemm/gemm_f64.cu), or with SWEEP_DTYPE=float32 the float32 "highest" SIMT
// kernel (kernels/gemm/gemm_simt.cu), over its tiles and k splits, against cublasDgemm / cublasSgemm on the
// same inputs: which tile and split the planner (kernels/gemm/gemm_plan.cpp: plan_f64, plan_simt) should
// pick. Per shape: cuBLAS, the planner's pick, then every tile x split the library compiles. Each
// checked against cuBLAS (max relative error) before it is timed; medians of event-timed calls on the
// same operands (L2-warm, as a sweep: the bench's rows are the reference).
// Built by CMake as <build>/bench/sweep/f64_sweep; not part of the tests.
//   SWEEP_SHAPES="m,n,k;m,n,k" replaces the shape list; SWEEP_ALL=0 prints only cuBLAS and the pick;
//   SWEEP_DTYPE=float32 sweeps the SIMT kernel (splits 1-16) in place of the float64 one; SWEEP_LAYOUT
//   (kn, kk, mn: a's and b's majors) the operands' layout; SWEEP_TILES="64x64,32x64" and
//   SWEEP_SPLITS="1,2,4" narrow the tiles and splits tried.
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

// One element type's sweep: its cuBLAS call, the library's tiles and splits, its error bound.
template <typename T> struct Sweep;
template <> struct Sweep<double> {
  static constexpr DType kType = DType::Float64;
  static constexpr const char* kName = "float64";
  static constexpr double kTol = 1e-12;
  static constexpr int kBk = 16;
  static constexpr std::pair<int, int> kTiles[] = {{128, 64}, {128, 128}, {64, 64}, {32, 64}, {32, 32}, {16, 128}};
  static constexpr int kSplits[] = {1, 2, 3, 4, 5, 6, 8, 12, 16};
  static cublasStatus_t gemm(cublasHandle_t h, int m, int n, int k, const double* a, bool ak, const double* b, bool bn,
                             double* c) {
    const double one = 1, zero = 0;
    return cublasDgemm(h, bn ? CUBLAS_OP_N : CUBLAS_OP_T, ak ? CUBLAS_OP_N : CUBLAS_OP_T, n, m, k, &one, b, bn ? n : k, a,
                       ak ? k : m, &zero, c, n);
  }
};
template <> struct Sweep<float> {
  static constexpr DType kType = DType::Float32;
  static constexpr const char* kName = "float32";
  static constexpr double kTol = 1e-5;
  static constexpr int kBk = 0;  // the tile's own: 8 for 128 x 128, 16 for 64 x 64
  static constexpr std::pair<int, int> kTiles[] = {{128, 128}, {64, 64}};
  static constexpr int kSplits[] = {1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16};
  static cublasStatus_t gemm(cublasHandle_t h, int m, int n, int k, const float* a, bool ak, const float* b, bool bn,
                             float* c) {
    const float one = 1, zero = 0;
    return cublasSgemm(h, bn ? CUBLAS_OP_N : CUBLAS_OP_T, ak ? CUBLAS_OP_N : CUBLAS_OP_T, n, m, k, &one, b, bn ? n : k, a,
                       ak ? k : m, &zero, c, n);
  }
};

// Whether `item` is in the comma-separated list in environment variable `var` (all when unset).
bool listed(const char* var, const std::string& item) {
  const char* e = getenv(var);
  return !e || ("," + std::string(e) + ",").find("," + item + ",") != std::string::npos;
}

template <typename T>
int sweep(cublasHandle_t h, const GemmDevice& dev, const std::vector<Shape>& shapes, bool all, bool ak, bool bn) {
  using S = Sweep<T>;
  int failures = 0;
  for (const Shape& s : shapes) {
    T *A, *B, *C, *R;
    CK(cudaMalloc(&A, s.m * s.k * sizeof(T)));
    CK(cudaMalloc(&B, s.k * s.n * sizeof(T)));
    CK(cudaMalloc(&C, s.m * s.n * sizeof(T)));
    CK(cudaMalloc(&R, s.m * s.n * sizeof(T)));
    fill_uniform<<<1024, 256>>>(A, s.m * s.k, 1);
    fill_uniform<<<1024, 256>>>(B, s.k * s.n, 2);
    const double flops = 2.0 * s.m * s.n * s.k;
    const int reps = flops > 5e11 ? 10 : 30;
    // Row-major c = a @ b as cuBLAS's column-major c^T = b^T a^T.
    auto cublas = [&] { CB(S::gemm(h, s.m, s.n, s.k, A, ak, B, bn, R)); };
    const float tb = median_ms(cublas, reps);
    printf("\n== %ld x %ld x %ld %s a %s b %s: cuBLAS %.3f ms, %.1f TFLOP/s\n", s.m, s.n, s.k, S::kName, ak ? "k-major" : "m-major",
           bn ? "n-major" : "k-major", tb, flops / tb / 1e9);
    const GemmPlan plan = plan_gemm(sweep_request(S::kType, s.m, s.n, s.k, A, ak, B, bn, C, 1.f, 0.f, false), dev);
    void* ws = nullptr;  // the largest workspace a plan asked for so far
    int64_t ws_bytes = 0;
    auto report = [&](const std::string& name, const GemmPlan& p) {
      if (p.workspace_bytes > ws_bytes) {
        CK(cudaFree(ws));
        CK(cudaMalloc(&ws, p.workspace_bytes));
        ws_bytes = p.workspace_bytes;
      }
      CK(cudaMemset(C, 0xff, s.m * s.n * sizeof(T)));
      const cudaError_t err0 = launch_gemm(p, nullptr, ws);
      if (err0 != cudaSuccess) {
        printf("%-30s not run: %s\n", name.c_str(), cudaGetErrorString(err0));
        (void)cudaGetLastError();
        return;
      }
      CK(cudaDeviceSynchronize());
      const double err = rel_err(C, R, s.m * s.n);
      failures += !(err < S::kTol);
      const float t = median_ms([&] { launch_gemm(p, nullptr, ws); }, reps);
      printf("%-30s %8.3f ms %6.1f TFLOP/s %6.3fx cuBLAS  max rel err %.1e\n", name.c_str(), t, flops / t / 1e9, tb / t, err);
    };
    const bool ours = plan.kernel == (S::kType == DType::Float64 ? GemmKernel::MmaF64 : GemmKernel::Simt);
    report("pick: " + describe(plan), plan);
    char label[96];
    for (const auto [bm, bn] : S::kTiles) {
      for (int split : S::kSplits) {
        if (!ours || !all) break;
        if (!listed("SWEEP_TILES", std::to_string(bm) + "x" + std::to_string(bn)) ||
            !listed("SWEEP_SPLITS", std::to_string(split)))
          continue;
        const GemmPlan q = with_split_k(with_tile(plan, bm, bn, S::kBk ? S::kBk : (bm == 128 ? 8 : 16), 1, dev), split);
        snprintf(label, sizeof label, "%dx%d split %d", bm, bn, split);
        report(label, q);
      }
    }
    for (T* p : {A, B, C, R}) cudaFree(p);
    cudaFree(ws);
  }
  return failures;
}

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
  const bool f32 = getenv("SWEEP_DTYPE") && strcmp(getenv("SWEEP_DTYPE"), "float32") == 0;
  // SWEEP_LAYOUT: a's and b's majors as the shape suite names an nn.Linear's products: "kn" (a k-major,
  // b n-major: the input gradient; the default), "kk" (the forward), "mn" (the weight gradient).
  const std::string layout = getenv("SWEEP_LAYOUT") ? getenv("SWEEP_LAYOUT") : "kn";
  const bool ak = layout[0] == 'k', bn = layout.size() > 1 && layout[1] == 'n';
  const int failures = f32 ? sweep<float>(h, dev, shapes, all, ak, bn) : sweep<double>(h, dev, shapes, all, ak, bn);
  CB(cublasDestroy(h));
  printf("\n%s\n", failures ? "SOME RESULTS WRONG" : (f32 ? "all results within 1e-5 of cuBLAS" : "all results within 1e-12 of cuBLAS"));
  return failures ? 1 : 0;
}
