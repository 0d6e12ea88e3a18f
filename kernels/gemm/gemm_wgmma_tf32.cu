// The tf32 instances of the Hopper GEMM (kernels/gemm/gemm_wgmma.cuh). Compiled for compute_90a
// only (CUOPS_WGMMA_BUILD); elsewhere, e.g. in the JIT build, an empty translation unit.
#if CUOPS_WGMMA_BUILD
#include "gemm_wgmma.cuh"

namespace cuops::kernels::detail {

cudaError_t launch_wgmma_tf32(const GemmPlan& plan, const GemmProblem& p, cudaStream_t stream) {
  return launch_wg_typed<float>(plan, p, stream);
}

}  // namespace cuops::kernels::detail
#endif  // CUOPS_WGMMA_BUILD
