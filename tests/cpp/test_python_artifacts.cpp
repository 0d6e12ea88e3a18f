// Python -> C++: a module scripted in Python and an AOTInductor package exported in Python, both
// using cuops ops, are loaded here (libcuops linked) and must reproduce the Python outputs.
// tools/test.sh writes the artifacts (tests/scripts/make_artifacts.py) before running ctest.
#include <cuops/cuops.h>
#include <gtest/gtest.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <filesystem>
#include <string>

namespace {

const std::string kDir = CUOPS_ARTIFACT_DIR;

class PythonArtifacts : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "cuda" && !torch::cuda::is_available())
      GTEST_SKIP() << "no CUDA GPU on this machine";
    const std::string io = kDir + "/io_" + GetParam() + ".pt";
    ASSERT_TRUE(std::filesystem::exists(io))
        << io << " missing: run python tests/scripts/make_artifacts.py " << kDir;
    io_ = torch::jit::load(io);
  }
  at::Tensor io(const char* name) { return io_.attr(name).toTensor(); }
  torch::jit::Module io_;
};

TEST_P(PythonArtifacts, TorchScriptModuleReproducesPython) {
  torch::jit::Module model = torch::jit::load(kDir + "/model.pt");
  auto out = model.forward({io("a"), io("b"), io("w")}).toTuple();
  EXPECT_TRUE(torch::allclose(out->elements()[0].toTensor(), io("g"), 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(out->elements()[1].toTensor(), io("norm"), 1e-5, 1e-5));
  EXPECT_EQ(out->elements()[0].toTensor().device().type(), io("a").device().type());
}

TEST_P(PythonArtifacts, AotInductorPackageReproducesPython) {
  torch::inductor::AOTIModelPackageLoader loader(kDir + "/model_" + GetParam() + ".pt2");
  std::vector<at::Tensor> out = loader.run({io("a"), io("b"), io("w")});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(torch::allclose(out[0], io("g"), 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(out[1], io("norm"), 1e-5, 1e-5));
}

// The fused ops (linear with bias and gelu_tanh, then swiglu, then linear_cross_entropy's loss over
// an LM head; bf16 on CUDA) exported to an AOTInductor package: the Python run's values (the same
// kernels on the same inputs).
TEST_P(PythonArtifacts, AotInductorFusedOpsReproducePython) {
  torch::jit::Module io = torch::jit::load(kDir + "/io_fused_" + GetParam() + ".pt");
  std::vector<at::Tensor> args;
  for (int i = 0; i < 7; ++i) args.push_back(io.attr("arg" + std::to_string(i)).toTensor());
  torch::inductor::AOTIModelPackageLoader loader(kDir + "/fused_" + GetParam() + ".pt2");
  std::vector<at::Tensor> out = loader.run(args);
  ASSERT_EQ(out.size(), 2u);
  for (const auto& [got, name] : {std::pair{out[0], "y"}, std::pair{out[1], "loss"}}) {
    SCOPED_TRACE(name);
    const at::Tensor want = io.attr(name).toTensor();
    EXPECT_EQ(got.scalar_type(), want.scalar_type());
    EXPECT_EQ(got.sizes(), want.sizes());
    EXPECT_TRUE(torch::allclose(got.to(at::kFloat), want.to(at::kFloat), 1e-5, 1e-5));
  }
}

// A transformers LlamaDecoderLayer put on cuops by cuops.patch (rms_norm, rotary, add_rms_norm,
// swiglu, linear around the attention), exported in Python: what no Triton kernel library can run
// from C++. The Python run's output, from the same kernels on the same inputs.
TEST_P(PythonArtifacts, AotInductorPatchedDecoderLayerReproducesPython) {
  torch::jit::Module io = torch::jit::load(kDir + "/io_decoder_" + GetParam() + ".pt");
  auto in = [&](const char* n) { return io.attr(n).toTensor(); };
  torch::inductor::AOTIModelPackageLoader loader(kDir + "/decoder_" + GetParam() + ".pt2");
  std::vector<at::Tensor> out = loader.run({in("h"), in("cos"), in("sin")});
  ASSERT_EQ(out.size(), 1u);
  const at::Tensor want = in("y");
  EXPECT_EQ(out[0].scalar_type(), want.scalar_type());
  EXPECT_EQ(out[0].sizes(), want.sizes());
  EXPECT_TRUE(torch::allclose(out[0].to(at::kFloat), want.to(at::kFloat), 1e-5, 1e-5));
}

INSTANTIATE_TEST_SUITE_P(Devices, PythonArtifacts, ::testing::Values("cpu", "cuda"),
                         [](const auto& info) { return info.param; });

}  // namespace
