// GoogleTest suite of the public C++ API: every op against ATen (float64 reference) on CPU and,
// when a GPU is present, CUDA; registrations; error messages; C++ autograd.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuops/cuops.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

const std::vector<at::ScalarType> kDtypes = {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16};

// tests/tolerances.txt, the table the Python suite reads too: "<dtype> <bound>" lines, # comments.
double tolerance(at::ScalarType t) {
  static const std::map<std::string, double> table = [] {
    std::map<std::string, double> m;
    std::ifstream in(CUOPS_TOLERANCES);
    for (std::string line; std::getline(in, line);) {
      std::istringstream fields(line);
      std::string name;
      double bound = 0;
      if (line.empty() || line[0] == '#' || !(fields >> name >> bound)) continue;
      m[name] = bound;
    }
    return m;
  }();
  const char* name = t == at::kDouble  ? "float64"
                     : t == at::kFloat ? "float32"
                     : t == at::kHalf  ? "float16"
                                       : "bfloat16";
  const auto it = table.find(name);
  if (it == table.end())
    throw std::runtime_error(std::string("no ") + name + " bound in " + CUOPS_TOLERANCES);
  return it->second;
}

// max |got - want| / max(|want|, floor), both in float64.
double rel_err(const at::Tensor& got, const at::Tensor& want, double floor = 1e-30) {
  const at::Tensor g = got.to(at::kDouble).cpu(), w = want.to(at::kDouble).cpu();
  if (w.numel() == 0) return 0.0;
  const double denom = std::max(w.abs().max().item<double>(), floor);
  return (g - w).abs().max().item<double>() / denom;
}

// The smallest normal number of t: below it a dtype keeps absolute precision only (float16: steps
// of 2^-24), so results there are measured against it. A float16 square of |a| < 0.003 lands there
// (one randn draw in ~480).
double smallest_normal(at::ScalarType t) {
  switch (t) {
    case at::kHalf:
      return std::numeric_limits<c10::Half>::min();
    case at::kBFloat16:
      return std::numeric_limits<c10::BFloat16>::min();
    case at::kFloat:
      return std::numeric_limits<float>::min();
    default:
      return std::numeric_limits<double>::min();
  }
}

// Message of the RuntimeError f throws, or "" if it throws none.
template <typename F> std::string error_of(F&& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

class Ops : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "cuda" && !torch::cuda::is_available())
      GTEST_SKIP() << "no CUDA GPU on this machine";
    device_ = torch::Device(GetParam());
  }
  at::Tensor rand(at::IntArrayRef shape, at::ScalarType t) {
    return torch::randn(shape, torch::TensorOptions().dtype(t).device(device_));
  }
  at::Tensor poison(at::IntArrayRef shape, at::ScalarType t) {
    return torch::full(shape, NAN, torch::TensorOptions().dtype(t).device(device_));
  }
  torch::Device device_{torch::kCPU};
};

TEST_P(Ops, ElementwiseMatchFloat64Reference) {
  for (auto t : kDtypes) {
    const double tiny = smallest_normal(t);
    // -1 stands for one fixed element, 0.002, whose square is subnormal in float16.
    for (int64_t n : {0, 1, 1000, 4097, -1}) {
      SCOPED_TRACE(std::string(c10::toString(t)) + " n=" + std::to_string(n));
      auto a = n < 0 ? torch::full({1}, 0.002, torch::TensorOptions().dtype(t).device(device_))
                     : rand({n}, t);
      auto b = rand(a.sizes(), t);
      auto ad = a.to(at::kDouble), bd = b.to(at::kDouble);
      auto c = poison(a.sizes(), t);
      cuops::add2(c, a, b);
      EXPECT_LE(rel_err(c, ad + bd, tiny), tolerance(t));
      EXPECT_LE(rel_err(cuops::vector_add(a, b), ad + bd, tiny), tolerance(t));
      EXPECT_LE(rel_err(cuops::scale(a, -1.5), ad * -1.5, tiny), tolerance(t));
      EXPECT_LE(rel_err(cuops::scale(a), ad * 2.0, tiny), tolerance(t));
      EXPECT_LE(rel_err(cuops::square(a), ad * ad, tiny), tolerance(t));
    }
  }
}

TEST_P(Ops, TwoNormMatchesFloat64Reference) {
  for (auto t : kDtypes) {
    for (int64_t n : {0, 1, 1000, 4097, 1 << 20}) {
      SCOPED_TRACE(std::string(c10::toString(t)) + " n=" + std::to_string(n));
      auto a = rand({n}, t), b = rand({n}, t);
      auto got = cuops::two_norm(a, b);
      EXPECT_EQ(got.dim(), 0);
      EXPECT_EQ(got.scalar_type(), t);
      auto want = (a.to(at::kDouble) - b.to(at::kDouble)).norm();
      EXPECT_LE(rel_err(got, want), n == 0 ? 0.0 : tolerance(t));
    }
  }
}

TEST_P(Ops, GemmAndMmMatchFloat64Reference) {
  for (auto t : kDtypes) {
    for (auto [m, k, n] : std::vector<std::array<int64_t, 3>>{
             {1, 1, 1}, {7, 1000, 5}, {65, 33, 129}, {0, 4, 3}, {3, 0, 4}}) {
      SCOPED_TRACE(std::string(c10::toString(t)) + " " + std::to_string(m) + "x" +
                   std::to_string(k) + "x" + std::to_string(n));
      auto a = rand({m, k}, t), b = rand({k, n}, t);
      auto ref = torch::mm(a.to(at::kDouble), b.to(at::kDouble));
      const double tol = tolerance(t) * (t == at::kFloat ? 10 : 1);
      EXPECT_LE(rel_err(cuops::mm(a, b), ref), tol);
      auto c = poison({m, n}, t);
      cuops::gemm(c, a, b);  // beta = 0: the NaNs in c must not leak
      EXPECT_LE(rel_err(c, ref), tol);
      auto c0 = rand({m, n}, t);
      auto c1 = c0.clone();
      cuops::gemm(c1, a, b, 0.5, -2.0);
      EXPECT_LE(rel_err(c1, ref * 0.5 - 2.0 * c0.to(at::kDouble)), 4 * tol);
      // Transposed operands are read through their strides.
      auto at_ = rand({k, m}, t).t(), bt = rand({n, k}, t).t();
      EXPECT_LE(rel_err(cuops::mm(at_, bt), torch::mm(at_.to(at::kDouble), bt.to(at::kDouble))),
                tol);
    }
  }
}

TEST_P(Ops, MmAutogradMatchesATen) {
  auto a = rand({17, 9}, at::kDouble).requires_grad_(),
       b = rand({9, 5}, at::kDouble).requires_grad_();
  auto g = rand({17, 5}, at::kDouble);
  cuops::mm(a, b).backward(g);
  auto a2 = a.detach().clone().requires_grad_(), b2 = b.detach().clone().requires_grad_();
  torch::mm(a2, b2).backward(g);
  EXPECT_LE(rel_err(a.grad(), a2.grad()), 1e-12);
  EXPECT_LE(rel_err(b.grad(), b2.grad()), 1e-12);
}

TEST_P(Ops, TwoNormAutogradMatchesATenAndIsZeroAtZero) {
  auto a = rand({6, 7}, at::kDouble).requires_grad_(),
       b = rand({6, 7}, at::kDouble).requires_grad_();
  cuops::two_norm(a, b).backward();
  auto a2 = a.detach().clone().requires_grad_(), b2 = b.detach().clone().requires_grad_();
  torch::linalg_vector_norm(a2 - b2).backward();
  EXPECT_LE(rel_err(a.grad(), a2.grad()), 1e-12);
  EXPECT_LE(rel_err(b.grad(), b2.grad()), 1e-12);

  auto z = rand({4}, at::kDouble).requires_grad_();
  cuops::two_norm(z, z.detach()).backward();
  EXPECT_TRUE(torch::equal(z.grad(), torch::zeros_like(z)));
}

TEST_P(Ops, ErrorsNameOpArgumentExpectedAndGot) {
  auto f = rand({4}, at::kFloat);
  EXPECT_NE(error_of([&] {
              cuops::vector_add(f, rand({4}, at::kDouble));
            }).find("cuops::vector_add: expected b to have the dtype of a (float32), got float64"),
            std::string::npos);
  auto i = torch::ones({4}, torch::TensorOptions().dtype(at::kLong).device(device_));
  EXPECT_NE(error_of([&] { cuops::square(i); })
                .find("cuops::square: expected x to have dtype float32, float64, float16 or "
                      "bfloat16, got int64"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              cuops::two_norm(f, rand({5}, at::kFloat));
            }).find("cuops::two_norm: expected b to have the shape of a [4], got [5]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { cuops::mm(rand({64, 32}, at::kFloat), rand({31, 16}, at::kFloat)); })
                .find("cuops::mm: expected a and b to share the inner dimension, got a [64, 32] "
                      "and b [31, 16]"),
            std::string::npos);
  auto big = rand({8}, at::kFloat);
  EXPECT_NE(error_of([&] {
              cuops::add2(big.narrow(0, 1, 4), big.narrow(0, 0, 4), rand({4}, at::kFloat));
            }).find("cuops::add2: expected c to be exactly a or not to overlap it"),
            std::string::npos);
}

// 8 host threads, each on its own stream (CUDA) calling every op 1000 times (250 on the CPU, where the
// path is ATen's), must get the bits a single call gets: no shared state, no stream mix-ups.
TEST_P(Ops, EightThreadsOnTheirOwnStreamsGetTheSingleThreadedBits) {
  constexpr int kThreads = 8;
  const int calls = device_.is_cuda() ? 1000 : 250;
  struct Inputs {
    at::Tensor a, b, c, am, bm, cm;
  };
  auto run_all = [](Inputs& in) {
    cuops::add2(in.c, in.a, in.b);
    cuops::gemm(in.cm, in.am, in.bm);
    return std::vector<at::Tensor>{in.c,
                                   in.cm,
                                   cuops::vector_add(in.a, in.b),
                                   cuops::scale(in.a, 1.5),
                                   cuops::square(in.b),
                                   cuops::two_norm(in.a, in.b),
                                   cuops::mm(in.am, in.bm)};
  };
  std::vector<Inputs> inputs;
  std::vector<std::vector<at::Tensor>> expected;
  for (int i = 0; i < kThreads; ++i) {
    inputs.push_back({rand({1000 + i}, at::kFloat), rand({1000 + i}, at::kFloat),
                      rand({1000 + i}, at::kFloat), rand({33, 17}, at::kFloat),
                      rand({17, 9 + i}, at::kFloat), rand({33, 9 + i}, at::kFloat)});
    std::vector<at::Tensor> e;
    for (const auto& t : run_all(inputs.back())) e.push_back(t.clone());
    expected.push_back(std::move(e));
  }
  if (device_.is_cuda()) torch::cuda::synchronize();
  std::vector<int64_t> mismatches(kThreads, -1);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      try {
        std::optional<c10::cuda::CUDAStreamGuard> on_stream;
        if (device_.is_cuda())
          on_stream.emplace(c10::cuda::getStreamFromPool(false, device_.index()));
        at::Tensor bad = torch::zeros({}, torch::TensorOptions().dtype(at::kLong).device(device_));
        for (int call = 0; call < calls; ++call) {
          const auto got = run_all(inputs[i]);
          for (size_t k = 0; k < got.size(); ++k) bad += got[k].ne(expected[i][k]).sum();
        }
        mismatches[i] = bad.item<int64_t>();  // syncs this thread's stream
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) {
    EXPECT_EQ(errors[i], "") << "thread " << i;
    EXPECT_EQ(mismatches[i], 0) << "thread " << i;
  }
}

TEST_P(Ops, TwoNormIsBitwiseIdenticalOver100Runs) {
  for (auto t : {at::kFloat, at::kBFloat16}) {
    auto a = rand({(1 << 20) + 4097}, t), b = rand({(1 << 20) + 4097}, t);
    const auto first = cuops::two_norm(a, b);
    for (int i = 0; i < 100; ++i)
      ASSERT_TRUE(torch::equal(cuops::two_norm(a, b), first)) << "run " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, Ops, ::testing::Values("cpu", "cuda"),
                         [](const auto& info) { return info.param; });

// rms_norm and add_rms_norm through the C++ API, with autograd: the values and gradients of torch's
// own composite in float64 (the sum's gradient and the norm's meeting in one backward).
TEST_P(Ops, RmsNormAutogradMatchesATen) {
  auto x = rand({5, 3, 40}, at::kDouble).requires_grad_(), r = rand({5, 3, 40}, at::kDouble);
  auto w = rand({40}, at::kDouble).requires_grad_();
  r.requires_grad_();
  auto [y, s] = cuops::add_rms_norm(x, r, w, 1e-5);
  (y.sin().sum() + (s * s).sum()).backward();
  auto x2 = x.detach().clone().requires_grad_(), r2 = r.detach().clone().requires_grad_();
  auto w2 = w.detach().clone().requires_grad_();
  auto s2 = x2 + r2;
  auto y2 = s2 * torch::rsqrt(s2.pow(2).mean(-1, true) + 1e-5) * w2;
  (y2.sin().sum() + (s2 * s2).sum()).backward();
  EXPECT_TRUE(torch::allclose(y, y2, 1e-12, 1e-12));
  EXPECT_TRUE(torch::equal(s, s2));
  EXPECT_TRUE(torch::allclose(x.grad(), x2.grad(), 1e-10, 1e-10));
  EXPECT_TRUE(torch::allclose(r.grad(), r2.grad(), 1e-10, 1e-10));
  EXPECT_TRUE(torch::allclose(w.grad(), w2.grad(), 1e-10, 1e-10));
  const auto n = cuops::rms_norm(x.detach(), w.detach(), 1e-5);
  const auto xd = x.detach();
  EXPECT_TRUE(torch::allclose(n, xd * torch::rsqrt(xd.pow(2).mean(-1, true) + 1e-5) * w.detach(),
                              1e-12, 1e-12));
}

// lora_linear and lora_swiglu (both gates) through the C++ API, with autograd, a frozen base weight:
// the values and the gradients of x, A and B of torch's composite in float64; the base gets none. Weights of scale 0.2
// keep the products O(1): at scale 1 silu(z)·z reaches ~400 and sin() of it turns float64's last bit
// into 1e-10 of gradient, which torch's own BLAS moves from run to run (it failed 2 % of runs).
TEST_P(Ops, LoraAutogradMatchesATen) {
  auto x = rand({4, 3, 24}, at::kDouble).requires_grad_(), w = rand({20, 24}, at::kDouble) * 0.2;
  auto a = (rand({5, 24}, at::kDouble) * 0.2).requires_grad_(),
       b = (rand({20, 5}, at::kDouble) * 0.2).requires_grad_();
  auto y = cuops::lora_linear(x, w, a, b, std::nullopt, "gelu") +
           cuops::lora_swiglu(x, w, w, a, b, b) +
           cuops::lora_swiglu(x, w, w, a, b, b, std::nullopt, "gelu_tanh");
  y.sin().sum().backward();
  auto x2 = x.detach().clone().requires_grad_(), a2 = a.detach().clone().requires_grad_();
  auto b2 = b.detach().clone().requires_grad_();
  auto z = torch::matmul(x2, w.t()) + torch::matmul(torch::matmul(x2, a2.t()), b2.t());
  auto y2 = torch::gelu(z) + torch::silu(z) * z + torch::gelu(z, "tanh") * z;
  y2.sin().sum().backward();
  EXPECT_TRUE(torch::allclose(y, y2, 1e-12, 1e-12));
  EXPECT_FALSE(w.grad().defined());
  EXPECT_TRUE(torch::allclose(x.grad(), x2.grad(), 1e-10, 1e-10));
  EXPECT_TRUE(torch::allclose(a.grad(), a2.grad(), 1e-10, 1e-10));
  EXPECT_TRUE(torch::allclose(b.grad(), b2.grad(), 1e-10, 1e-10));
}

// linear_cross_entropy with a softcap through the C++ API, with autograd: the loss and the gradients
// of x and the head of torch's cross_entropy of c tanh(z / c) in float64.
TEST_P(Ops, LinearCrossEntropySoftcapMatchesATen) {
  auto x = rand({6, 8}, at::kDouble).requires_grad_(),
       w = (rand({11, 8}, at::kDouble) * 2).requires_grad_();
  const auto t =
      torch::tensor({0, 10, -100, 3, 3, 7}, at::TensorOptions(at::kLong).device(x.device()));
  auto loss = cuops::linear_cross_entropy(x, w, t, std::nullopt, -100, "mean", 1.5);
  loss.backward();
  auto x2 = x.detach().clone().requires_grad_(), w2 = w.detach().clone().requires_grad_();
  auto want =
      torch::nn::functional::cross_entropy(torch::tanh(torch::matmul(x2, w2.t()) / 1.5) * 1.5, t);
  want.backward();
  EXPECT_TRUE(torch::allclose(loss, want, 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(x.grad(), x2.grad(), 1e-10, 1e-10));
  EXPECT_TRUE(torch::allclose(w.grad(), w2.grad(), 1e-10, 1e-10));
}

// moe_experts through the C++ API, with autograd, routed by moe_topk_softmax: the values and the
// gradients of x, the router's logits and both expert weights of torch's per-slot composite in float64.
TEST_P(Ops, MoeExpertsAutogradMatchesATen) {
  const int64_t tokens = 11, hidden = 8, inter = 6, experts = 4, k = 2;
  auto x = rand({tokens, hidden}, at::kDouble).requires_grad_();
  auto logits = rand({tokens, experts}, at::kDouble).requires_grad_();
  auto gate_up = (rand({experts, 2 * inter, hidden}, at::kDouble) * 0.3).requires_grad_();
  auto down = (rand({experts, hidden, inter}, at::kDouble) * 0.3).requires_grad_();
  auto [w, idx] = cuops::moe_topk_softmax(logits, k, true);
  auto y = cuops::moe_experts(x, idx, w, gate_up, down);
  y.sin().sum().backward();
  std::vector<at::Tensor> leaves = {x, logits, gate_up, down}, copies;
  for (const auto& t : leaves) copies.push_back(t.detach().clone().requires_grad_());
  auto p = torch::softmax(copies[1], -1).gather(-1, idx);
  p = p / p.sum(-1, true);
  auto y2 = torch::zeros_like(copies[0]);
  for (int64_t j = 0; j < k; ++j) {
    const auto e = idx.select(1, j);
    auto gu = torch::einsum("th,tih->ti", {copies[0], copies[2].index_select(0, e)});
    auto h = torch::silu(gu.narrow(1, 0, inter)) * gu.narrow(1, inter, inter);
    y2 = y2 + p.narrow(1, j, 1) * torch::einsum("ti,thi->th", {h, copies[3].index_select(0, e)});
  }
  y2.sin().sum().backward();
  EXPECT_TRUE(torch::allclose(y, y2, 1e-12, 1e-12));
  for (size_t i = 0; i < leaves.size(); ++i)
    EXPECT_TRUE(torch::allclose(leaves[i].grad(), copies[i].grad(), 1e-10, 1e-10)) << i;
}

TEST(Registration, EveryOpHasCpuCudaMetaAndAutogradKernels) {
  for (const char* name : {"add2", "vector_add", "scale", "square", "two_norm", "gemm", "mm",
                           "linear", "swiglu", "linear_cross_entropy", "rms_norm", "add_rms_norm",
                           "rotary", "grouped_mm", "moe_topk_softmax", "moe_experts"}) {
    SCOPED_TRACE(name);
    auto op = c10::Dispatcher::singleton().findSchema({std::string("cuops::") + name, ""});
    ASSERT_TRUE(op.has_value());
    for (auto key : {c10::DispatchKey::CPU, c10::DispatchKey::CUDA, c10::DispatchKey::Meta,
                     c10::DispatchKey::Autograd})
      EXPECT_TRUE(op->hasKernelForDispatchKey(key)) << c10::toString(key);
    EXPECT_TRUE(op->hasTag(at::Tag::pt2_compliant_tag));
  }
  // The LoRA ops: one forward for every device (CompositeExplicitAutograd, composed of the ops above),
  // their own Autograd and AutocastCUDA kernels.
  for (const char* name : {"lora_linear", "lora_swiglu"}) {
    SCOPED_TRACE(name);
    auto op = c10::Dispatcher::singleton().findSchema({std::string("cuops::") + name, ""});
    ASSERT_TRUE(op.has_value());
    EXPECT_TRUE(op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd));
    for (auto key : {c10::DispatchKey::CPU, c10::DispatchKey::CUDA, c10::DispatchKey::Meta})
      EXPECT_TRUE(op->hasComputedKernelForDispatchKey(key)) << c10::toString(key);
    EXPECT_TRUE(op->hasKernelForDispatchKey(c10::DispatchKey::AutogradCPU) ||
                op->hasComputedKernelForDispatchKey(c10::DispatchKey::AutogradCPU));
    EXPECT_TRUE(op->hasKernelForDispatchKey(c10::DispatchKey::AutocastCUDA));
    EXPECT_TRUE(op->hasTag(at::Tag::pt2_compliant_tag));
  }
  auto info = c10::Dispatcher::singleton().findSchema({"cuops::build_info", ""});
  ASSERT_TRUE(info.has_value());
  EXPECT_TRUE(info->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd));
}

TEST(BuildInfo, IsJsonWithVersions) {
  const std::string s = cuops::build_info();
  for (const char* key : {"\"cuops_version\"", "\"torch_version\"", "\"cuda_version\"",
                          "\"cuda_archs\"", "\"cxx_compiler\"", "\"build_type\""})
    EXPECT_NE(s.find(key), std::string::npos) << s;
  EXPECT_EQ(s.front(), '{');
  EXPECT_EQ(s.back(), '}');
}

TEST(Switches, SetAndReadInProcess) {
  // Each switch: set, read back, restored; the planner asks them at every plan (kernels/switches.h).
  for (const char* name :
       {"CUOPS_DISABLE_WGMMA", "CUOPS_DISABLE_SKINNY_TMA", "CUOPS_DISABLE_BULK_NORM"}) {
    SCOPED_TRACE(name);
    const bool was = cuops::set_switch(name);
    EXPECT_EQ(cuops::set_switch(name, !was), was);
    EXPECT_EQ(cuops::set_switch(name), !was);
    EXPECT_EQ(cuops::set_switch(name, was), !was);
    EXPECT_EQ(cuops::set_switch(name), was);
  }
  const std::string err = error_of([] { cuops::set_switch("CUOPS_DISABLE_EVERYTHING", true); });
  EXPECT_NE(
      err.find("cuops::set_switch: expected name to be one of CUOPS_DISABLE_WGMMA, "
               "CUOPS_DISABLE_SKINNY_TMA, CUOPS_DISABLE_BULK_NORM, got 'CUOPS_DISABLE_EVERYTHING'"),
      std::string::npos)
      << err;
}

TEST(Autograd, InPlaceOpsRejectInputsThatRequireGrad) {
  auto a = torch::randn({3}).requires_grad_(), b = torch::randn({3}), c = torch::empty({3});
  EXPECT_NE(error_of([&] { cuops::add2(c, a, b); }).find("cuops::add2: a requires grad"),
            std::string::npos);
  auto m = torch::randn({3, 3}).requires_grad_();
  EXPECT_NE(error_of([&] {
              cuops::gemm(torch::empty({3, 3}), m, torch::randn({3, 3}));
            }).find("cuops::mm"),
            std::string::npos);
  torch::NoGradGuard no_grad;
  cuops::add2(c, a, b);
  EXPECT_TRUE(torch::equal(c, a + b));
}

}  // namespace
