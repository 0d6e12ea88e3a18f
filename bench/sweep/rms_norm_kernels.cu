// The norm kernels (kernels/norm/rms_norm.cu, compiled into this program from the library's own source, so
// a change to them that breaks the sweep breaks the build) over their launch shapes, against a copy of
// the same bytes, in one process with the variants alternating over rounds and L2 flushed before each
// timed call: which group width and block size the forward should take, and what the backward's
// weight gradient costs (the pass without it, with its partial rows, the column sums alone).
// docs/performance.md, "rms_norm, add_rms_norm, rotary", cites what it found.
// Built by CMake as <build>/bench/sweep/rms_norm_kernels; not part of the tests.
#include "kernels/norm/rms_norm.cu"

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "sweep_util.cuh"

using namespace cuops::kernels::detail;
using bf16 = __nv_bfloat16;

namespace {

void* flush_buf;
constexpr size_t kFlushBytes = size_t{256} << 20;  // over the H100's 50 MiB and the H200's 60 MiB L2

struct Variant {
  std::string name;
  std::function<void()> run;
};

// Median microseconds of each variant, the variants taken in turn (reversed every other round), each
// call event-timed after an L2 flush; printed as the rate of `bytes` and against the first variant.
void race(const std::string& title, double bytes, std::vector<Variant> vs) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (auto& v : vs)
    for (int i = 0; i < 5; ++i) v.run();
  std::vector<std::vector<float>> t(vs.size());
  for (int r = 0; r < 60; ++r)
    for (size_t i = 0; i < vs.size(); ++i) {
      const size_t k = r % 2 ? vs.size() - 1 - i : i;
      CK(cudaMemsetAsync(flush_buf, 0, kFlushBytes));
      CK(cudaEventRecord(a));
      vs[k].run();
      CK(cudaEventRecord(b));
      CK(cudaEventSynchronize(b));
      float ms;
      CK(cudaEventElapsedTime(&ms, a, b));
      t[k].push_back(ms * 1000.f);
    }
  CK(cudaGetLastError());
  printf("== %s (%.1f MB moved)\n", title.c_str(), bytes / 1e6);
  float first = 0;
  for (size_t i = 0; i < vs.size(); ++i) {
    std::sort(t[i].begin(), t[i].end());
    const float med = t[i][t[i].size() / 2];
    if (i == 0) first = med;
    printf("  %-40s %8.2f us  %6.3f TB/s  %.3fx of the first\n", vs[i].name.c_str(), med, bytes / med / 1e6,
           first / med);
  }
}

template <typename T> T* filled(int64_t n) {
  std::vector<T> h(n);
  for (int64_t i = 0; i < n; ++i) h[i] = static_cast<T>((rand() % 2001) / 1000.f - 1.f);
  T* d;
  CK(cudaMalloc(&d, n * sizeof(T)));
  CK(cudaMemcpy(d, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <typename K> int regs(K kernel) {
  cudaFuncAttributes at;
  CK(cudaFuncGetAttributes(&at, kernel));
  return at.numRegs;
}

// The forward (with a residual where S is given), x's bytes copied first: vectors a thread
// (make_shape's target) x threads a block.
template <typename T, typename S, typename W, typename Y> void forward(int64_t rows, int64_t d, bool residual) {
  constexpr int E = 16 / sizeof(T);
  T* x = filled<T>(rows * d);
  S* res = residual ? filled<S>(rows * d) : nullptr;
  W* w = filled<W>(d);
  Y* y;
  S* sum = nullptr;
  void* copy;
  CK(cudaMalloc(&y, rows * d * sizeof(Y)));
  if (residual) CK(cudaMalloc(&sum, rows * d * sizeof(S)));
  CK(cudaMalloc(&copy, rows * d * sizeof(T)));
  const double bytes = double(rows) * d * (sizeof(T) + sizeof(Y) + (residual ? 2 * sizeof(S) : 0));
  std::vector<Variant> vs;
  vs.push_back({"copy of x", [=] { CK(cudaMemcpyAsync(copy, x, rows * d * sizeof(T), cudaMemcpyDeviceToDevice)); }});
  auto kernel = rms_norm_fwd<T, S, W, Y, E, true>;
  if constexpr (std::is_same_v<S, T>) {
    if (!residual) kernel = rms_norm_fwd<T, S, W, Y, E, false>;
  }
  const int r = regs(kernel);
  for (int target : {4, 2, 1})
    for (int block : {128, 256, 512}) {
      Shape sh;
      if (!make_shape(sh, rows, d, E, kFwdPer, target) || std::max(sh.g, block) != block) continue;
      const int64_t grid = (rows + block / sh.g - 1) / (block / sh.g);
      char name[96];
      snprintf(name, sizeof name, "g=%d per=%d block=%d (%d regs)", sh.g, sh.per, block, r);
      vs.push_back({name, [=] {
                      kernel<<<grid, block>>>(sh, x, d, res, d, w, 1e-6f, y, sum, nullptr);
                    }});
    }
  char title[128];
  snprintf(title, sizeof title, "%s forward, %zu/%zu/%zu/%zu-byte x/sum/w/y, %ld x %ld",
           residual ? "add_rms_norm" : "rms_norm", sizeof(T), sizeof(S), sizeof(W), sizeof(Y), long(rows), long(d));
  race(title, bytes, vs);
  for (void* p : {(void*)x, (void*)res, (void*)w, (void*)y, (void*)sum, copy}) CK(cudaFree(p));
}

// The backward: the whole of it (pass + column sums), the pass writing its partial rows, the column
// sums alone, the pass without the weight's gradient; per vectors a thread (kBwdPer, or 1: a group
// twice as wide).
template <typename S, typename W, typename Y> void backward(int64_t rows, int64_t d) {
  constexpr int E = 16 / sizeof(S);
  using A = acc_t<S>;
  S* s = filled<S>(rows * d);
  Y* dy = filled<Y>(rows * d);
  W* w = filled<W>(d);
  A* rstd = filled<A>(rows);
  S* ds;
  A* partial;
  W* dw;
  CK(cudaMalloc(&ds, rows * d * sizeof(S)));
  CK(cudaMalloc(&partial, int64_t{kBwdBlocks} * d * sizeof(A)));
  CK(cudaMalloc(&dw, d * sizeof(W)));
  const double bytes = double(rows) * d * (2 * sizeof(S) + sizeof(Y));
  std::vector<Variant> vs;
  const auto add = [&](auto kernel, int per) {
    Shape sh;
    if (!make_shape(sh, rows, d, E, per, per)) return;
    const int rows_a_block = kBwdBlock / sh.g;
    const int64_t grid = std::clamp<int64_t>((rows + rows_a_block - 1) / rows_a_block, 1, kBwdBlocks);
    const size_t smem = rows_a_block > 1 ? sizeof(A) * rows_a_block * d : 0;
    const auto pass = [=](A* part) {
      kernel<<<grid, kBwdBlock, part ? smem : 0>>>(sh, dy, s, w, rstd, nullptr, ds, nullptr, part);
    };
    const auto columns = [=] { rms_norm_dweight<A, W><<<(d + 31) / 32, 32 * kColSlices>>>(partial, grid, d, dw); };
    char tag[64];
    snprintf(tag, sizeof tag, "g=%d per=%d (%d regs)", sh.g, sh.per, regs(kernel));
    vs.push_back({std::string("whole ") + tag, [=] {
                    pass(partial);
                    columns();
                  }});
    vs.push_back({std::string("pass with partials ") + tag, [=] { pass(partial); }});
    vs.push_back({std::string("pass without dweight ") + tag, [=] { pass(nullptr); }});
    if (per == kBwdPer) vs.push_back({"column sums alone", columns});
  };
  add(rms_norm_bwd<S, W, Y, S, E, kBwdPer>, kBwdPer);
  add(rms_norm_bwd<S, W, Y, S, E, 1>, 1);
  char title[128];
  snprintf(title, sizeof title, "backward, %zu/%zu/%zu-byte sum/w/dy, %ld x %ld", sizeof(S), sizeof(W), sizeof(Y),
           long(rows), long(d));
  race(title, bytes, vs);
  for (void* p : {(void*)s, (void*)dy, (void*)w, (void*)rstd, (void*)ds, (void*)partial, (void*)dw}) CK(cudaFree(p));
}

}  // namespace

int main() {
  CK(cudaMalloc(&flush_buf, kFlushBytes));
  forward<bf16, bf16, bf16, bf16>(8192, 2048, false);
  forward<bf16, bf16, bf16, bf16>(131072, 128, false);
  forward<bf16, bf16, float, float>(8192, 2048, false);
  forward<float, float, float, bf16>(8192, 2048, false);
  forward<bf16, bf16, bf16, bf16>(8192, 2048, true);
  forward<bf16, bf16, bf16, bf16>(131072, 128, true);
  forward<bf16, float, float, float>(8192, 2048, true);
  forward<bf16, float, float, bf16>(8192, 2048, true);
  backward<bf16, bf16, bf16>(8192, 2048);
  backward<bf16, bf16, bf16>(8192, 4096);
  backward<bf16, bf16, bf16>(131072, 128);
  backward<float, float, bf16>(8192, 2048);
  backward<float, float, float>(8192, 2048);
  return 0;
}
