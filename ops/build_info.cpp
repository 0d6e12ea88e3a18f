// build_info: what this binary was built from and for, as JSON (pasted into bug reports).
#include <cuda_runtime_api.h>
#include <torch/library.h>
#include <torch/version.h>

#include <sstream>
#include <string>

namespace cuops::ops {
namespace {

std::string build_info() {
  std::ostringstream os;
  os << "{\"cuops_version\": \"" << CUOPS_VERSION << "\", \"torch_version\": \"" << TORCH_VERSION
     << "\", \"cuda_version\": \"" << CUDART_VERSION / 1000 << '.' << (CUDART_VERSION % 1000) / 10
     << "\", \"cuda_compiler_version\": \"" << CUOPS_CUDA_COMPILER_VERSION << "\", \"cuda_archs\": [";
  std::istringstream archs(CUOPS_CUDA_ARCHS);
  std::string arch;
  for (bool first = true; std::getline(archs, arch, ','); first = false) os << (first ? "" : ", ") << '"' << arch << '"';
  os << "], \"cxx_compiler\": \"" << CUOPS_CXX_COMPILER << "\", \"build_type\": \"" << CUOPS_BUILD_TYPE << "\"}";
  return os.str();
}

}  // namespace

// No tensor arguments, so no backend key to dispatch on: one kernel serves every backend.
TORCH_LIBRARY_IMPL(cuops, CompositeExplicitAutograd, m) { m.impl("build_info", &build_info); }

}  // namespace cuops::ops
