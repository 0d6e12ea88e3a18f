// Host cost of one call from C++: cuops::add2 against at::add_out on 16 float32 elements on the GPU.
// At 16 elements the kernel is trivial, so the figure is the dispatcher, checks and launch path: what a
// hot loop of small ops pays per call. Same method as bench/run.py's Python figure: 10000 calls per
// batch between two device synchronisations, host wall time, median of 5 batches (cuops and ATen
// batches interleaved so drift hits both alike).
// Prints exactly one JSON line on stdout: {"cuops_us": x, "aten_us": y}; bench/run.py parses it.
#include <cuops/cuops.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <vector>

namespace {

constexpr int kCalls = 10000;
constexpr int kBatches = 5;
constexpr int kWarmupCalls = 1000;

// Microseconds per call over one batch. Synchronising before starts from an idle queue; after, counts
// any launches still queued, so a call that only enqueues is not credited as free.
template <typename Call>
double batch_us(Call&& call, int calls) {
  torch::cuda::synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) call();
  torch::cuda::synchronize();
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / calls;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main() {
  try {
    if (!torch::cuda::is_available()) {
      std::printf("{\"cuops_us\": null, \"aten_us\": null, \"error\": \"no CUDA device\"}\n");
      return 1;
    }
    torch::manual_seed(0);
    const auto opts = torch::TensorOptions().dtype(torch::kFloat).device(torch::kCUDA, 0);
    const at::Tensor a = torch::randn({16}, opts), b = torch::randn({16}, opts);
    at::Tensor c = torch::empty({16}, opts);

    auto cuops_call = [&] { cuops::add2(c, a, b); };
    auto aten_call = [&] { at::add_out(c, a, b); };
    // Warm-up: the first calls resolve the cuops operator handle, load the kernels' modules and fill
    // the caching allocator; none of that is per-call cost.
    batch_us(cuops_call, kWarmupCalls);
    batch_us(aten_call, kWarmupCalls);

    std::vector<double> cuops_us, aten_us;
    for (int i = 0; i < kBatches; ++i) {
      cuops_us.push_back(batch_us(cuops_call, kCalls));
      aten_us.push_back(batch_us(aten_call, kCalls));
    }
    std::printf("{\"cuops_us\": %.4f, \"aten_us\": %.4f}\n", median(cuops_us), median(aten_us));
    return 0;
  } catch (const std::exception& e) {
    // Still one JSON line, so the harness records the reason rather than a parse failure. The message
    // goes to stderr in full; the JSON gets a fixed string (it may hold quotes or newlines).
    std::fprintf(stderr, "cuops_overhead: %s\n", e.what());
    std::printf("{\"cuops_us\": null, \"aten_us\": null, \"error\": \"exception, see stderr\"}\n");
    return 1;
  }
}
