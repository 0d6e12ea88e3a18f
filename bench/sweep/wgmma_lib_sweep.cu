// The library's Hopper GEMM (kernels/gemm/gemm_wgmma.cu, the library's own objects linked in) against
// cuBLAS: correctness of every layout on odd shapes with alpha/beta, then speed of the tile widths.
// Plans come from the library's planner; variants override the tile with with_tile (and the grid, in
// power mode, with WG_CLUSTERS=n). Built by CMake as <build>/bench/sweep/wgmma_lib_sweep (needs a
// build with arch 90); not part of the tests.
//   wgmma_lib_sweep [quick | tf32 | big | shapes | power [M N K rounds secs]]
#include <cublas_v2.h>

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

#include "sweep_gemm_util.cuh"

using namespace cuops::kernels;

namespace {

template <typename T> cudaDataType cuda_type() {
  if constexpr (std::is_same_v<T, float>) return CUDA_R_32F;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return CUDA_R_16BF;
  return CUDA_R_16F;
}
template <typename T> DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::Float32;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return DType::BFloat16;
  return DType::Float16;
}
template <typename T> const char* name_of() {
  if constexpr (std::is_same_v<T, float>) return "tf32";
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return "bf16";
  return "f16";
}

// C [M, N] row-major; A k-major [M, K] or m-major (stored [K, M]); B n-major [K, N] or k-major ([N, K]).
template <typename T> struct Case {
  int64_t M, N, K;
  bool ak, bn;
  T *A, *B, *C, *R;
  Case(int64_t m, int64_t n, int64_t k, bool a_k, bool b_n) : M(m), N(n), K(k), ak(a_k), bn(b_n) {
    CK(cudaMalloc(&A, M * K * sizeof(T) + 16));
    CK(cudaMalloc(&B, K * N * sizeof(T) + 16));
    CK(cudaMalloc(&C, M * N * sizeof(T) + 16));
    CK(cudaMalloc(&R, M * N * sizeof(T) + 16));
    fill_uniform<<<1024, 256>>>(A, M * K, 1);
    fill_uniform<<<1024, 256>>>(B, K * N, 2);
  }
  ~Case() {
    cudaFree(A);
    cudaFree(B);
    cudaFree(C);
    cudaFree(R);
  }
  int64_t lda() const { return std::max<int64_t>(1, ak ? K : M); }
  int64_t ldb() const { return std::max<int64_t>(1, bn ? N : K); }
  GemmRequest request(float alpha, float beta) const {
    return sweep_request(dtype_of<T>(), M, N, K, A, ak, B, bn, C, alpha, beta, std::is_same_v<T, float>);
  }
  void cublas(cublasHandle_t h, float alpha, float beta) const {
    CB(cublasGemmEx(h, bn ? CUBLAS_OP_N : CUBLAS_OP_T, ak ? CUBLAS_OP_N : CUBLAS_OP_T, int(N), int(M), int(K), &alpha, B,
                    cuda_type<T>(), int(ldb()), A, cuda_type<T>(), int(lda()), &beta, R, cuda_type<T>(), int(N),
                    std::is_same_v<T, float> ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
};

const char* layout_name(bool ak, bool bn) {
  return ak ? (bn ? "a row, b row " : "a row, b.t() ") : (bn ? "a.t(), b row " : "a.t(), b.t() ");
}

int failures = 0;
// Split-tail plans' workspace (GemmPlan::workspace_bytes; at most 17 MB on 132 SMs): one for every launch.
void* g_ws = nullptr;

// The library's plan for c's request, or with the tile of 128 x 256 pairs; nullptr-like (kernel None)
// with the reason printed when the planner would not run wgmma here (or wants an operand copied first).
GemmPlan wgmma_plan(const GemmRequest& r, bool pairs, const char* what) {
  const GemmDevice dev = current_gemm_device();
  GemmPlan plan = plan_gemm(r, dev);
  if (plan.kernel != GemmKernel::Wgmma) {
    printf("%s: not taken (planner: %s, %s)\n", what, kernel_name(plan.kernel), plan.rule);
    plan.kernel = GemmKernel::None;
    return plan;
  }
  return pairs ? with_tile(plan, 128, 256, 0, 2, dev) : plan;
}

// Odd shapes with alpha/beta: c starts as the same random values in ours and cuBLAS's output.
template <typename T>
void check_beta(cublasHandle_t h, int64_t M, int64_t N, int64_t K, bool ak, bool bn, bool pairs, float beta);
template <typename T>
void check(cublasHandle_t h, int64_t M, int64_t N, int64_t K, bool ak, bool bn, bool pairs = false) {
  for (float beta : {-0.5f, 0.f}) check_beta<T>(h, M, N, K, ak, bn, pairs, beta);
}

template <typename T>
void check_beta(cublasHandle_t h, int64_t M, int64_t N, int64_t K, bool ak, bool bn, bool pairs, float beta) {
  Case<T> c(M, N, K, ak, bn);
  fill_uniform<<<1024, 256>>>(c.C, M * N, 3);
  fill_uniform<<<1024, 256>>>(c.R, M * N, 3);
  const float alpha = 1.5f;
  c.cublas(h, alpha, beta);
  char what[96];
  snprintf(what, sizeof(what), "check %-4s %5ld x %5ld x %5ld %s", name_of<T>(), (long)M, (long)N, (long)K,
           layout_name(ak, bn));
  const GemmPlan plan = wgmma_plan(c.request(alpha, beta), pairs, what);
  if (plan.kernel == GemmKernel::None) return;
  const double tol = std::is_same_v<T, float> ? 5e-3 : 2e-2;
  // The plan, then (beside the pairs check) the split tail at each width where it applies, as many
  // runs as fit and two; c starts from the same values each time.
  auto one = [&](const GemmPlan& q, const char* form) {
    fill_uniform<<<1024, 256>>>(c.C, M * N, 3);
    CK(launch_gemm(q, nullptr, g_ws));
    CK(cudaDeviceSynchronize());
    const double err = rel_err(c.C, c.R, M * N);
    const bool bad = !(err < tol);
    failures += bad;
    printf("check %-4s %5ld x %5ld x %5ld %s%s beta %4.1f max rel err %.2e%s\n", name_of<T>(), (long)M, (long)N,
           (long)K, layout_name(ak, bn), form, beta, err, bad ? "  WRONG" : "");
  };
  one(plan, pairs ? " pairs" : plan.wgmma().tail_units > 0 ? " (split tail)" : "");
  if (pairs) return;
  const GemmDevice dev = current_gemm_device();
  if (sizeof(T) == 2 && plan.wgmma().bm != 192) one(with_tile(plan, 192, 128, 0, 1, dev), " 192x128");
  for (int w : {64, 128, 256}) {
    for (int s : {0, 2}) {
      const GemmPlan q = with_tail_split(plan, w, s, dev);
      if (q.wgmma().tail_units == 0) continue;
      char form[64];
      snprintf(form, sizeof form, " tail 128x%d, %ld tiles / %d", w, (long)q.wgmma().tail_units, q.wgmma().tail_split);
      one(q, form);
    }
  }
}

template <typename T> void speed(cublasHandle_t h, int S, bool ak, bool bn, bool variants) {
  Case<T> c(S, S, S, ak, bn);
  const double flops = 2.0 * S * S * S;
  const int reps = S >= 8192 ? 20 : 50;
  const float tb = median_ms([&] { c.cublas(h, 1.f, 0.f); }, reps);
  printf("\n== %d^3 %s %s: cuBLAS %.3f ms, %.1f TFLOP/s\n", S, name_of<T>(), layout_name(ak, bn), tb, flops / tb / 1e9);
  const GemmDevice dev = current_gemm_device();
  auto report = [&](const char* name, const GemmPlan& plan) {
    if (plan.kernel == GemmKernel::None) return;
    const std::function<cudaError_t()> f = [&] { return launch_gemm(plan, nullptr, g_ws); };
    CK(cudaMemset(c.C, 0xff, S * int64_t(S) * sizeof(T)));
    CK(f());
    CK(cudaDeviceSynchronize());
    const double err = rel_err(c.C, c.R, S * int64_t(S));
    const float t = median_ms([&] { f(); }, reps);
    printf("%-28s %8.3f ms %6.1f TFLOP/s %6.3fx cuBLAS  max rel err %.2e%s\n", name, t, flops / t / 1e9, tb / t, err,
           err < 2e-2 ? "" : "  WRONG");
    failures += !(err < 2e-2);
  };
  const GemmPlan plan = wgmma_plan(c.request(1.f, 0.f), false, "speed");
  report("wgmma (library pick)", plan);
  if (!variants || plan.kernel == GemmKernel::None) return;
  if (S < 4096) report("wgmma 128x64", with_tile(plan, 128, 64, 0, 1, dev));
  if (S < 4096) report("wgmma 128x128", with_tile(plan, 128, 128, 0, 1, dev));
  report("wgmma 128x256", with_tile(plan, 128, 256, 0, 1, dev));
  report("wgmma 128x256, pairs", with_tile(plan, 128, 256, 0, 2, dev));
}

// Training and mid shapes: cuBLAS, the library's pick, each tile width and the split tail at each,
// each timed after an L2 flush as bench/run.py's do_bench does. Shapes from
// SWEEP_SHAPES="m,n,k,ak,bn;..." (ak: a k-major, bn: b n-major; F.linear's forward is ak=1 bn=0, its
// input gradient 1 1, its weight gradient 0 1), else the rows that ran under 0.90x.
template <typename T> void shape_speed(cublasHandle_t h, int64_t M, int64_t N, int64_t K, bool ak, bool bn, void* flush) {
  Case<T> c(M, N, K, ak, bn);
  const double flops = 2.0 * M * N * K;
  const int reps = 30;
  // SWEEP_NOFLUSH=1: steady state (operands hot in L2), to tell fixed per-CTA costs from traffic.
  const bool no_flush = getenv("SWEEP_NOFLUSH") && atoi(getenv("SWEEP_NOFLUSH")) != 0;
  const std::function<void()> before = [&] {
    if (!no_flush) CK(cudaMemsetAsync(flush, 0, 256u << 20));
  };
  const float tb = median_ms([&] { c.cublas(h, 1.f, 0.f); }, reps, before);
  printf("\n== %s %ld x %ld x %ld %s: cuBLAS %.1f us, %.1f TFLOP/s\n", name_of<T>(), (long)M, (long)N, (long)K,
         layout_name(ak, bn), 1e3 * tb, flops / tb / 1e9);
  const GemmDevice dev = current_gemm_device();
  auto report = [&](const std::string& name, const GemmPlan& plan) {
    CK(cudaMemset(c.C, 0xff, M * N * sizeof(T)));
    const cudaError_t e = launch_gemm(plan, nullptr, g_ws);
    if (e != cudaSuccess) {
      printf("%-40s not run: %s\n", name.c_str(), cudaGetErrorString(e));
      (void)cudaGetLastError();
      return;
    }
    CK(cudaDeviceSynchronize());
    const double err = rel_err(c.C, c.R, M * N);
    const float t = median_ms([&] { launch_gemm(plan, nullptr, g_ws); }, reps, before);
    printf("%-40s %8.1f us %6.1f TFLOP/s %6.3fx cuBLAS  max rel err %.1e%s\n", name.c_str(), 1e3 * t, flops / t / 1e9,
           tb / t, err, err < 2e-2 ? "" : "  WRONG");
    failures += !(err < 2e-2);
  };
  const GemmPlan plan = plan_gemm(c.request(1.f, 0.f), dev);
  report("pick: " + describe(plan), plan);
  if (plan.kernel != GemmKernel::Wgmma) return;
  char label[128];
  const GemmPlan base = with_tile(plan, 128, 128, 0, 1, dev);
  report("128x64", with_tile(plan, 128, 64, 0, 1, dev));
  report("128x256 pairs", with_tile(plan, 128, 256, 0, 2, dev));
  report("128x128", base);
  if (!std::is_same_v<T, float>) report("192x128", with_tile(plan, 192, 128, 0, 1, dev));
  // The split tail at each width, as many runs as fit.
  for (int w : {64, 128, 256}) {
    const GemmPlan q = with_tail_split(base, w, 0, dev);
    if (q.wgmma().tail_units == 0) continue;
    snprintf(label, sizeof label, "128x%d tail %ld / %d", w, (long)q.wgmma().tail_units, q.wgmma().tail_split);
    report(label, q);
  }
}

// Each product of SWEEP_SHAPES ("m,n,k,ak,bn;...", else `fallback`) to f(m, n, k, ak, bn, flush), with a
// 256 MiB buffer to clear the L2 with before each timed call.
void for_each_shape(const char* fallback, const std::function<void(long, long, long, bool, bool, void*)>& f) {
  const std::string list = getenv("SWEEP_SHAPES") ? getenv("SWEEP_SHAPES") : fallback;
  void* flush = nullptr;
  CK(cudaMalloc(&flush, 256u << 20));
  for (size_t at = 0; at < list.size();) {
    size_t end = list.find(';', at);
    if (end == std::string::npos) end = list.size();
    long m, n, k;
    int ak, bn;
    if (sscanf(list.substr(at, end - at).c_str(), "%ld,%ld,%ld,%d,%d", &m, &n, &k, &ak, &bn) == 5) {
      f(m, n, k, ak != 0, bn != 0, flush);
    }
    at = end + 1;
  }
  CK(cudaFree(flush));
}

void shapes(cublasHandle_t h) {
  const bool tf32 = getenv("SWEEP_TF32") && atoi(getenv("SWEEP_TF32")) != 0;
  for_each_shape("128,4096,4096,1,0;128,6144,4096,1,0;512,6144,4096,1,0;1024,6144,4096,1,0;128,4096,6144,1,1;"
                 "128,14336,4096,1,0;3072,1024,8192,0,1;1024,1024,8192,0,1;1024,4096,28672,1,1",
                 [&](long m, long n, long k, bool ak, bool bn, void* flush) {
                   if (tf32) shape_speed<float>(h, m, n, k, ak, bn, flush);
                   else shape_speed<__nv_bfloat16>(h, m, n, k, ak, bn, flush);
                 });
}

// The board's energy counter (mJ) and SM clock through NVML, opened at run time (the toolkit here
// has no nvml.h): enough to compare kernels by energy per call under the power cap.
struct Nvml {
  using Init = int (*)();
  using Handle = int (*)(unsigned, void**);
  using Energy = int (*)(void*, unsigned long long*);
  using Clock = int (*)(void*, int, unsigned*);
  Energy energy = nullptr;
  Clock clock = nullptr;
  void* dev = nullptr;
  Nvml() {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (lib == nullptr) return;
    auto init = reinterpret_cast<Init>(dlsym(lib, "nvmlInit_v2"));
    auto handle = reinterpret_cast<Handle>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
    energy = reinterpret_cast<Energy>(dlsym(lib, "nvmlDeviceGetTotalEnergyConsumption"));
    clock = reinterpret_cast<Clock>(dlsym(lib, "nvmlDeviceGetClockInfo"));
    if (init == nullptr || handle == nullptr || clock == nullptr || init() != 0 || handle(0, &dev) != 0) energy = nullptr;
  }
  unsigned long long mj() const {
    unsigned long long e = 0;
    if (energy != nullptr) energy(dev, &e);
    return e;
  }
  unsigned sm_mhz() const {
    unsigned c = 0;
    if (energy != nullptr) clock(dev, 1 /* NVML_CLOCK_SM */, &c);
    return c;
  }
};

// One kernel back to back for `secs` (after 1 s of warm-up): time per call (events around batches of
// 10, or around each call when an L2 flush runs before it), energy per call from the board counter,
// mean SM clock. Steady state under the 700 W cap, where a faster kernel must use less energy.
void steady(const Nvml& nv, const char* name, double flops, const std::function<void()>& f, void* flush,
            double secs) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  using clk = std::chrono::steady_clock;
  auto run_for = [&](double s, double* gpu_ms, int* calls, double* mhz) {
    const auto t0 = clk::now();
    int n = 0, samples = 0;
    double ms_sum = 0, mhz_sum = 0;
    while (std::chrono::duration<double>(clk::now() - t0).count() < s) {
      for (int i = 0; i < 10; ++i) {
        if (flush) CK(cudaMemsetAsync(flush, i, 256u << 20));
        if (flush || i == 0) CK(cudaEventRecord(e0));
        f();
        if (flush || i == 9) {
          CK(cudaEventRecord(e1));
          CK(cudaEventSynchronize(e1));
          float ms;
          CK(cudaEventElapsedTime(&ms, e0, e1));
          ms_sum += ms;
        }
      }
      n += 10;
      mhz_sum += nv.sm_mhz();
      ++samples;
    }
    if (gpu_ms) *gpu_ms = ms_sum;
    if (calls) *calls = n;
    if (mhz) *mhz = samples ? mhz_sum / samples : 0;
  };
  run_for(1.0, nullptr, nullptr, nullptr);
  CK(cudaDeviceSynchronize());
  const unsigned long long j0 = nv.mj();
  const auto t0 = clk::now();
  double ms = 0, mhz = 0;
  int calls = 0;
  run_for(secs, &ms, &calls, &mhz);
  CK(cudaDeviceSynchronize());
  const double wall = std::chrono::duration<double>(clk::now() - t0).count();
  const double joules = (nv.mj() - j0) / 1000.0;
  printf("%-26s flush=%d %7.3f ms/call %6.1f TFLOP/s  %5.0f W  %6.1f mJ/call  SM %4.0f MHz  (%d calls)\n", name,
         flush != nullptr, ms / calls, flops / (ms / calls) / 1e9, joules / wall, 1000 * joules / calls, mhz, calls);
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
}

// Steady-state time and energy per call of the library's 128 x 256 pairs beside cuBLAS (bf16, row-major a
// and b; docs/performance.md has the variants tried with it), alternating so that drift in
// temperature falls on both.
void power(cublasHandle_t h, int64_t M, int64_t N, int64_t K, int rounds, double secs) {
  const Nvml nv;
  if (nv.energy == nullptr) printf("NVML energy counter not available: energy columns are 0\n");
  Case<__nv_bfloat16> c(M, N, K, true, true);
  printf("\n== steady state, bf16 %ld x %ld x %ld\n", (long)M, (long)N, (long)K);
  void* flush = nullptr;
  CK(cudaMalloc(&flush, 256u << 20));
  const double flops = 2.0 * M * N * K;
  GemmPlan plan = wgmma_plan(c.request(1.f, 0.f), true, "power");
  if (plan.kernel == GemmKernel::None) return;
  if (const char* n = getenv("WG_CLUSTERS"); n && *n) plan.grid = 2 * atoi(n);  // pairs: two CTAs a cluster
  printf("persistent grid: %ld CTAs\n", (long)plan.grid);
  const std::function<void()> cublas = [&] { c.cublas(h, 1.f, 0.f); };
  const std::function<void()> ours = [&] { CK(launch_gemm(plan, nullptr, g_ws)); };
  cublas();  // the reference, in c.R
  CK(cudaMemset(c.C, 0xff, M * N * 2));
  ours();
  CK(cudaDeviceSynchronize());
  const double err = rel_err(c.C, c.R, M * N);
  printf("check wgmma 128x256 pairs max rel err %.2e%s\n", err, err < 2e-2 ? "" : "  WRONG");
  failures += !(err < 2e-2);
  for (int r = 0; r < rounds; ++r)
    for (void* fl : {static_cast<void*>(nullptr), flush}) {
      steady(nv, "cuBLAS", flops, cublas, fl, secs);
      steady(nv, "wgmma 128x256 pairs", flops, ours, fl, secs);
    }
  CK(cudaFree(flush));
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && !strcmp(argv[1], "quick");
  cublasHandle_t h;
  CB(cublasCreate(&h));
  setvbuf(stdout, nullptr, _IONBF, 0);
  CK(cudaMalloc(&g_ws, 64u << 20));
  if (argc > 1 && !strcmp(argv[1], "tf32")) {  // TF32 layouts: checks, then both k-major forms and row-major b
    for (int l = 0; l < 4; ++l) {
      const bool ak = !(l & 1), bn = !(l & 2);
      check<float>(h, 1024, 1000, 520, ak, bn);
      check<float>(h, 1000, 1000, 1000, ak, bn);
      check<float>(h, 300, 4100, 36, ak, bn);
      check<float>(h, 4100, 300, 36, ak, bn);
      check<float>(h, 1, 8, 4096, ak, bn);
      check<float>(h, 8, 1, 1, ak, bn);
      check<float>(h, 1100, 600, 1000, ak, bn, true);
      check<float>(h, 600, 1100, 1000, ak, bn, true);
    }
    for (int S : {1024, 2048, 4096, 8192}) {
      speed<float>(h, S, true, false, S >= 4096);
      speed<float>(h, S, true, true, S >= 4096);
      speed<float>(h, S, false, false, false);
    }
    printf("\n%d failures\n", failures);
    return failures != 0;
  }
  if (argc > 1 && !strcmp(argv[1], "power")) {  // steady state: time and energy per call
    // power M N K rounds secs
    auto arg = [&](int i, double d) { return argc > i ? atof(argv[i]) : d; };
    power(h, int64_t(arg(2, 8192)), int64_t(arg(3, 8192)), int64_t(arg(4, 8192)), int(arg(5, 2)), arg(6, 2.5));
    printf("\n%d failures\n", failures);
    return failures != 0;
  }
  if (argc > 1 && !strcmp(argv[1], "shapes")) {  // issue 24's rows: the pick and the k splits
    shapes(h);
    printf("\n%d failures\n", failures);
    return failures != 0;
  }
  if (argc > 1 && !strcmp(argv[1], "big")) {  // the two sizes with targets, bf16 row-major
    speed<__nv_bfloat16>(h, 4096, true, true, true);
    speed<__nv_bfloat16>(h, 8192, true, true, true);
    return 0;
  }
  for (int l = 0; l < 4; ++l) {
    const bool ak = !(l & 1), bn = !(l & 2);
    check<__nv_bfloat16>(h, 1000, 1000, 1000, ak, bn);
    check<__half>(h, 136, 4104, 72, ak, bn);
    check<__nv_bfloat16>(h, 4104, 8, 1000, ak, bn);
    check<__nv_bfloat16>(h, 1, 8, 4097 - 1, ak, bn);
    check<__half>(h, 8, 1, 8, ak, bn);
    check<__half>(h, 1024, 1000, 520, ak, bn);  // 128 x 64 tiles
    check<float>(h, 1024, 1000, 520, ak, bn);
    check<__nv_bfloat16>(h, 2048, 2048, 0, ak, bn);
    check<float>(h, 1000, 1000, 1000, ak, bn);
    check<float>(h, 300, 4100, 36, ak, bn);
    check<__nv_bfloat16>(h, 1100, 600, 1000, ak, bn, true);
    check<__half>(h, 136, 4104, 72, ak, bn, true);
    check<float>(h, 1100, 600, 1000, ak, bn, true);
    // The split tail: a partial last wave over a k no k-tile divides, a long k over few tiles (rows whole
    // 16 bytes, so the planner takes the operands in place).
    check<__nv_bfloat16>(h, 768, 3072, 4104, ak, bn);
    check<__half>(h, 100, 136, 65544, ak, bn);
    check<float>(h, 200, 1000, 4100, ak, bn);
  }
  for (int S : {1024, 4096, 8192}) {
    speed<__nv_bfloat16>(h, S, true, true, true);
    if (quick) continue;
    speed<__half>(h, S, true, true, false);
    speed<float>(h, S, true, false, true);
    speed<float>(h, S, true, true, true);  // row-major b: the transposed problem, A from registers
  }
  if (!quick) {
    for (int l = 1; l < 4; ++l) speed<__nv_bfloat16>(h, 4096, !(l & 1), !(l & 2), false);
  }
  CB(cublasDestroy(h));
  printf("\n%d failures\n", failures);
  return failures != 0;
}
