// The small-M kernel (kernels/gemm/gemm_skinny.cu) on Llama-3-8B's decode products, forward (x @ W.t())
// and input gradient (g @ W), over the k splits the planner can choose (with_split), each checked
// against cuBLAS and timed beside it. Calls cycle over copies of the weight larger than L2 together,
// back to back (what a decode step sees); "of copy" is weight bytes / time over the device-to-device
// copy rate measured here. Built by CMake as <build>/bench/sweep/skinny_sweep; not part of the tests.
//   SWEEP_M=1,16 (tokens), SWEEP_F32=0 leaves out float32 ("highest"), SWEEP_BF16=0 bf16, SWEEP_F64=1 adds
//   float64 (with the tiled kernel's plan, gemm_f64.cu, beside the stream's); SWEEP_LINEARS=768x3072,...
//   (in x out features) replaces Llama's four.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "sweep_gemm_util.cuh"

using namespace cuops::kernels;

namespace {

constexpr double kPoolBytes = 400e6;

double copy_gbps() {
  const size_t bytes = size_t{1} << 30;
  void *a, *b;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  const float ms = median_ms([&] { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); }, 10);
  CK(cudaFree(a));
  CK(cudaFree(b));
  return 2.0 * bytes / ms / 1e6;
}

// The streaming form's shared memory per CTA (kernels/gemm/gemm_skinny_tma.cu's tma_smem), to skip rings that do
// not fit.
int tma_smem_bytes(int64_t m, int stages, int chunk, int elem) {
  const int mt = m <= 8 ? 8 : 16;
  return stages * (kSkinnyTma.outputs + mt) * chunk * elem + mt * kSkinnyTma.outputs * (elem == 8 ? 8 : 4) +
         16 * stages + 1024;
}

struct Case {
  int64_t m, n, k;
  bool igrad;  // g @ W (weight n-major) rather than x @ W.t() (weight k-major)
  DType dt;
};

const char* dtype_name(DType t) { return t == DType::Float64 ? "fp64" : t == DType::Float32 ? "fp32" : "bf16"; }

template <typename T> void fill_case(void* w, void* x, const Case& c, int i) {
  fill_uniform<<<1024, 256>>>(static_cast<T*>(w), c.n * c.k, 7 + i);
  fill_uniform<<<256, 256>>>(static_cast<T*>(x), c.m * c.k, 99 + i);
}

void run_case(cublasHandle_t h, cudaStream_t stream, const GemmDevice& dev, const Case& c, double copy,
              int& failures) {
  const size_t es = c.dt == DType::Float64 ? 8 : c.dt == DType::Float32 ? 4 : 2;
  const size_t wbytes = size_t(c.n) * c.k * es;
  const int copies = std::max<int>(2, int(kPoolBytes / wbytes + 1));
  std::vector<void*> ws(copies), xs(copies), cs(copies), rs(copies);
  for (int i = 0; i < copies; ++i) {
    CK(cudaMalloc(&ws[i], wbytes));
    CK(cudaMalloc(&xs[i], c.m * c.k * es));
    CK(cudaMalloc(&cs[i], c.m * c.n * es));
    CK(cudaMalloc(&rs[i], c.m * c.n * es));
    if (c.dt == DType::Float64) fill_case<double>(ws[i], xs[i], c, i);
    else if (c.dt == DType::Float32) fill_case<float>(ws[i], xs[i], c, i);
    else fill_case<__nv_bfloat16>(ws[i], xs[i], c, i);
  }
  const float one = 1, zero = 0;
  const double one64 = 1, zero64 = 0;
  const bool f64 = c.dt == DType::Float64;
  const cudaDataType_t t = f64 ? CUDA_R_64F : c.dt == DType::Float32 ? CUDA_R_32F : CUDA_R_16BF;
  // Pedantic only for float32 (true FP32, as "highest"); float64 as torch.mm runs it (DMMA).
  CB(cublasSetMathMode(h, c.dt == DType::Float32 ? CUBLAS_PEDANTIC_MATH : CUBLAS_DEFAULT_MATH));
  auto cublas = [&](int i) {
    // Row-major C [m, n] is column-major C^T [n, m] = B^T X^T.
    CB(cublasGemmEx(h, c.igrad ? CUBLAS_OP_N : CUBLAS_OP_T, CUBLAS_OP_N, c.n, c.m, c.k, f64 ? (const void*)&one64 : &one,
                    ws[i], t, c.igrad ? c.n : c.k, xs[i], t, c.k, f64 ? (const void*)&zero64 : &zero, rs[i], t, c.n,
                    f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  // tiled: the plan without the streaming form (float64: gemm_f64.cu's tiles, what ran before it).
  auto plan_for = [&](int i, bool tiled = false) {
    GemmDevice d = dev;
    if (tiled) d.skinny_tma = false;
    return plan_gemm(sweep_request(c.dt, c.m, c.n, c.k, xs[i], true, ws[i], c.igrad, cs[i], 1.f, 0.f, false), d);
  };
  // The cycle captured in one CUDA graph and replayed (what a decode step under graphs sees): the
  // GPU's time alone, no host launch cost (the streaming form encodes two tensor maps per call).
  auto cycle_ms = [&](const std::function<void(int)>& f) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < copies; ++i) f(i);
    CK(cudaStreamEndCapture(stream, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    const double ms = median_ms([&] { CK(cudaGraphLaunch(exec, stream)); }, 15, {}, stream) / copies;
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    return ms;
  };
  const double tb = cycle_ms(cublas);
  const double gb = double(wbytes) / 1e6;
  printf("\n== %s %s M %lld N %lld K %lld (%.1f MB, %d copies): cuBLAS %.1f us, %.2f of copy\n",
         dtype_name(c.dt), c.igrad ? "g @ W" : "x @ W.t()", (long long)c.m, (long long)c.n, (long long)c.k,
         gb, copies, tb * 1e3, gb / tb / copy);
  const GemmPlan base = plan_for(0);
  // rw == 0: the planner's pick; rw < 0: the streaming form with `stages` of `chunk` k (kw: the split);
  // kw < 0: the plan without the streaming form (float64's tiled kernel, its k split in planes).
  struct Split {
    int rw, kw, split;
    bool pdl = true;
  };
  std::vector<Split> splits{{0, 0, 0}};
  if (f64) splits.push_back({0, -1, 0});
  if (dev.skinny_tma) {
    // Chunks in elements: stages of the same bytes as bf16's 128 and 256 k hold fewer wider elements.
    for (int stages : {3, 4, 6, 8})
      for (int chunk : {128, 256})
        for (int split : f64 ? std::vector<int>{1, 2, 4, 8} : std::vector<int>{1, 2, 4})
          if (tma_smem_bytes(c.m, stages, chunk / int(es / 2), int(es)) <= 227 * 1024)
            splits.push_back({-stages, chunk / int(es / 2), split});
    const GemmPlan pick = plan_for(0);
    if (pick.kernel == GemmKernel::Skinny && pick.skinny().tma)
      splits.push_back({-pick.skinny().stages, pick.skinny().chunk, pick.skinny().split, false});
  }
  if (!f64)
    for (Split sp : std::vector<Split>{{1, 4, 1}, {1, 4, 2}, {1, 4, 4}}) splits.push_back(sp);
  for (const Split& sp : splits) {
    if (sp.rw > 0 && sp.split > 1 && !dev.clusters) continue;
    auto plan_i = [&](int i) {
      GemmPlan p = plan_for(i, sp.kw < 0);
      if (sp.rw < 0) return with_stream(p, -sp.rw, sp.kw, sp.split, sp.pdl);
      return sp.rw == 0 ? p : with_split(p, sp.rw, sp.kw, sp.split);
    };
    const GemmPlan p0 = plan_i(0);
    if (p0.kernel != GemmKernel::Skinny && !(f64 && p0.kernel == GemmKernel::MmaF64)) {
      printf("  planner chose %s (%s)\n", kernel_name(p0.kernel), p0.rule);
      break;
    }
    // The tiled float64 plan's k split writes planes into a workspace.
    void* workspace = nullptr;
    if (p0.workspace_bytes > 0) CK(cudaMalloc(&workspace, p0.workspace_bytes));
    CK(cudaMemset(cs[0], 0xff, c.m * c.n * es));
    cublas(0);
    CK(launch_gemm(p0, nullptr, workspace));
    CK(cudaDeviceSynchronize());
    double err = 0;
    if (f64) err = rel_err(static_cast<double*>(cs[0]), static_cast<double*>(rs[0]), c.m * c.n);
    else if (c.dt == DType::Float32) err = rel_err(static_cast<float*>(cs[0]), static_cast<float*>(rs[0]), c.m * c.n);
    else err = rel_err(static_cast<__nv_bfloat16*>(cs[0]), static_cast<__nv_bfloat16*>(rs[0]), c.m * c.n);
    const bool ok = err < (f64 ? 1e-12 : c.dt == DType::Float32 ? 1e-5 : 1e-2);
    failures += !ok;
    std::vector<GemmPlan> plans;
    for (int i = 0; i < copies; ++i) plans.push_back(plan_i(i));
    const double tc = cycle_ms([&](int i) { CK(launch_gemm(plans[i], stream, workspace)); });
    CK(cudaGetLastError());
    char name[200];
    snprintf(name, sizeof name, "%s %s", sp.rw == 0 ? "pick" : "    ", describe(p0).c_str());
    printf("  %-40s %7.1f us %5.2f of copy %6.3fx cuBLAS  err %.1e%s\n", name, tc * 1e3, gb / tc / copy, tb / tc, err,
           ok ? "" : "  FAIL");
    if (workspace) CK(cudaFree(workspace));
  }
  (void)base;
  for (int i = 0; i < copies; ++i) {
    CK(cudaFree(ws[i]));
    CK(cudaFree(xs[i]));
    CK(cudaFree(cs[i]));
    CK(cudaFree(rs[i]));
  }
}

}  // namespace

int main() {
  cublasHandle_t h;
  CB(cublasCreate(&h));
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CB(cublasSetStream(h, stream));
  const GemmDevice dev = current_gemm_device();
  const double copy = copy_gbps();
  printf("device: %d SMs, clusters %d, streaming form %d; copy %.0f GB/s\n", dev.sms, int(dev.clusters), int(dev.skinny_tma), copy);
  std::vector<int64_t> ms{1, 16};
  if (const char* e = getenv("SWEEP_M")) {
    ms.clear();
    for (const char* p = e; *p;) {
      ms.push_back(strtoll(p, const_cast<char**>(&p), 10));
      if (*p == ',') ++p;
    }
  }
  const bool f32 = !(getenv("SWEEP_F32") && strcmp(getenv("SWEEP_F32"), "0") == 0);
  const bool bf16 = !(getenv("SWEEP_BF16") && strcmp(getenv("SWEEP_BF16"), "0") == 0);
  const bool f64 = getenv("SWEEP_F64") && strcmp(getenv("SWEEP_F64"), "1") == 0;
  // Llama-3-8B: qkv (4096 -> 6144), o (4096 -> 4096), gate_up (4096 -> 28672), down (14336 -> 4096).
  std::vector<std::array<int64_t, 2>> linears{{4096, 6144}, {4096, 4096}, {4096, 28672}, {14336, 4096}};
  if (const char* e = getenv("SWEEP_LINEARS")) {
    linears.clear();
    for (const char* p = e; *p;) {
      const int64_t in = strtoll(p, const_cast<char**>(&p), 10);
      if (*p == 'x') ++p;
      linears.push_back({in, strtoll(p, const_cast<char**>(&p), 10)});
      if (*p == ',') ++p;
    }
  }
  int failures = 0;
  for (DType dt : {DType::BFloat16, DType::Float32, DType::Float64}) {
    if (dt == DType::BFloat16 ? !bf16 : dt == DType::Float32 ? !f32 : !f64) continue;
    for (int64_t m : ms)
      for (const auto& L : linears) {
        run_case(h, stream, dev, Case{m, L[1], L[0], false, dt}, copy, failures);  // x @ W.t(): n = out, k = in
        run_case(h, stream, dev, Case{m, L[0], L[1], true, dt}, copy, failures);   // g @ W: n = in, k = out
      }
  }
  CB(cublasDestroy(h));
  printf("\n%d failures\n", failures);
  return failures != 0;
}
