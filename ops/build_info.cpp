// The library about itself: build_info (what this binary was built from and for, as JSON, pasted
// into bug reports) and set_switch (kernels/switches.h, the paths it may take).
#include <cuda_runtime_api.h>
#include <torch/library.h>
#include <torch/version.h>

#include <sstream>
#include <string>

#include "kernels/switches.h"

// CMake defines these (CMakeLists.txt). torch.utils.cpp_extension.load builds the same sources
// without them (tests/scripts/jit_load.py): say so instead of failing to compile.
#ifndef CUOPS_VERSION
#define CUOPS_VERSION "unknown (cpp_extension.load build)"
#endif
#ifndef CUOPS_CUDA_ARCHS
#define CUOPS_CUDA_ARCHS "see TORCH_CUDA_ARCH_LIST"
#endif
#ifndef CUOPS_CUDA_COMPILER_VERSION
#define CUOPS_CUDA_COMPILER_VERSION "unknown"
#endif
#ifndef CUOPS_CXX_COMPILER
#define CUOPS_CXX_COMPILER "unknown"
#endif
#ifndef CUOPS_BUILD_TYPE
#define CUOPS_BUILD_TYPE "cpp_extension.load"
#endif

namespace cuops::ops {
namespace {

std::string build_info() {
  std::ostringstream os;
  os << "{\"cuops_version\": \"" << CUOPS_VERSION << "\", \"torch_version\": \"" << TORCH_VERSION
     << "\", \"cuda_version\": \"" << CUDART_VERSION / 1000 << '.' << (CUDART_VERSION % 1000) / 10
     << "\", \"cuda_compiler_version\": \"" << CUOPS_CUDA_COMPILER_VERSION
     << "\", \"cuda_archs\": [";
  std::istringstream archs(CUOPS_CUDA_ARCHS);
  std::string arch;
  for (bool first = true; std::getline(archs, arch, ','); first = false)
    os << (first ? "" : ", ") << '"' << arch << '"';
  os << "], \"cxx_compiler\": \"" << CUOPS_CXX_COMPILER << "\", \"build_type\": \""
     << CUOPS_BUILD_TYPE << "\"}";
  return os.str();
}

bool set_switch(std::string_view name, std::optional<bool> on) {
  const std::string n(name);
  kernels::Switch s{};
  if (!kernels::find_switch(n.c_str(), s)) {
    std::string names;
    for (int i = 0; i < kernels::kSwitchCount; ++i) {
      names += (i ? ", " : "") + std::string(kernels::switch_name(static_cast<kernels::Switch>(i)));
    }
    TORCH_CHECK(false, "cuops::set_switch: expected name to be one of ", names, ", got '", n, "'");
  }
  return on.has_value() ? kernels::set_switch(s, *on) : kernels::switch_on(s);
}

}  // namespace

// No tensor arguments, so no backend key to dispatch on: one kernel serves every backend.
TORCH_LIBRARY_IMPL(cuops, CompositeExplicitAutograd, m) {
  m.impl("build_info", &build_info);
  m.impl("set_switch", &set_switch);
}

}  // namespace cuops::ops
