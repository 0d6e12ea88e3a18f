// cuops C++ demo: a plain libtorch program that links libcuops and calls every op through the typed
// C++ API, on the GPU when there is one, checking each against ATen.
#include <cuops/cuops.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace {

struct Row {
  std::string op, shape;
  double max_rel_err;
  bool ok;
};

double rel_err(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.to(at::kDouble).cpu(), w = want.to(at::kDouble).cpu();
  const double denom = std::max(w.abs().max().item<double>(), 1e-30);
  return (g - w).abs().max().item<double>() / denom;
}

}  // namespace

// With an artifact directory (tests/scripts/make_artifacts.py), also runs the module scripted in
// Python (TorchScript) and the AOTInductor package exported in Python, against Python's outputs.
int main(int argc, char** argv) {
  const bool cuda = torch::cuda::is_available();
  const torch::Device dev = cuda ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  const auto opts = torch::TensorOptions().dtype(torch::kFloat).device(dev);
  torch::manual_seed(0);
  std::printf("cuops C++ demo on %s\nbuild_info: %s\n\n", cuda ? "cuda:0" : "cpu (no GPU found)",
              cuops::build_info().c_str());

  std::vector<Row> rows;
  auto check = [&](const std::string& op, const std::string& shape, const at::Tensor& got, const at::Tensor& want,
                   double tol) {
    const double e = rel_err(got, want);
    rows.push_back({op, shape, e, e <= tol});
  };

  {
    auto a = torch::randn({1024, 1024}, opts), b = torch::randn({1024, 1024}, opts);
    auto c = torch::full({1024, 1024}, NAN, opts);
    cuops::add2(c, a, b);
    check("add2", "1024x1024", c, a + b, 0);
    check("vector_add", "1024x1024", cuops::vector_add(a, b), a + b, 0);
    check("scale(3.5)", "1024x1024", cuops::scale(a, 3.5), a * 3.5, 0);
    check("square", "1024x1024", cuops::square(a), a * a, 0);
  }
  {
    auto a = torch::randn({4096, 4096}, opts), b = torch::randn({4096, 4096}, opts);
    check("two_norm", "4096x4096", cuops::two_norm(a, b), (a.to(torch::kDouble) - b.to(torch::kDouble)).norm(), 1e-6);
  }
  {
    auto a = torch::randn({640, 640}, opts), b = torch::randn({640, 640}, opts);
    auto c = torch::full({640, 640}, NAN, opts);
    cuops::gemm(c, a, b);
    const auto ref = torch::mm(a.to(torch::kDouble), b.to(torch::kDouble));
    check("gemm", "640x640x640", c, ref, 1e-5);
    check("mm", "640x640x640", cuops::mm(a, b), ref, 1e-5);
    auto ga = a.clone().requires_grad_(), gb = b.clone().requires_grad_();
    cuops::mm(ga, gb).sum().backward();
    check("mm backward (grad a)", "640x640x640", ga.grad(), torch::ones({640, 640}, opts).mm(b.t()), 1e-5);
  }

  const std::string dir = argc > 1 ? argv[1] : "";
  const std::string dev_name = cuda ? "cuda" : "cpu";
  if (!dir.empty() && std::filesystem::exists(dir + "/io_" + dev_name + ".pt")) {
    torch::jit::Module io = torch::jit::load(dir + "/io_" + dev_name + ".pt");
    auto in = [&](const char* n) { return io.attr(n).toTensor(); };
    auto ts = torch::jit::load(dir + "/model.pt").forward({in("a"), in("b"), in("w")}).toTuple();
    check("TorchScript (from Python)", "16x8 model", ts->elements()[0].toTensor(), in("g"), 1e-5);
    torch::inductor::AOTIModelPackageLoader loader(dir + "/model_" + dev_name + ".pt2");
    auto aoti = loader.run({in("a"), in("b"), in("w")});
    check("AOTInductor .pt2", "16x8 model", aoti[0], in("g"), 1e-5);
    check("AOTInductor .pt2 norm", "16x8 model", aoti[1], in("norm"), 1e-5);
    // A transformers Llama decoder layer after cuops.patch, exported in Python (bf16 on CUDA).
    const std::string layer_io = dir + "/io_decoder_" + dev_name + ".pt";
    if (std::filesystem::exists(layer_io)) {
      torch::jit::Module lio = torch::jit::load(layer_io);
      auto lin = [&](const char* n) { return lio.attr(n).toTensor(); };
      torch::inductor::AOTIModelPackageLoader layer(dir + "/decoder_" + dev_name + ".pt2");
      auto y = layer.run({lin("h"), lin("cos"), lin("sin")});
      check("AOTI patched Llama layer", "2x24x128", y[0], lin("y"), 1e-5);
    }
  } else if (!dir.empty()) {
    std::printf("(no Python artifacts in %s: run tests/scripts/make_artifacts.py)\n", dir.c_str());
  }

  bool all_ok = true;
  std::printf("%-26s %-14s %-14s %s\n", "op", "shape", "max rel err", "result");
  for (const Row& r : rows) {
    std::printf("%-26s %-14s %-14.3e %s\n", r.op.c_str(), r.shape.c_str(), r.max_rel_err, r.ok ? "ok" : "MISMATCH");
    all_ok = all_ok && r.ok;
  }
  std::printf("\n%s\n", all_ok ? "all ops match ATen" : "SOME OPS DO NOT MATCH ATen");
  return all_ok ? 0 : 1;
}
