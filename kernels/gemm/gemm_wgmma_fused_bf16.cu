// The bf16 instances of the Hopper GEMM's fused epilogues (kernels/gemm/gemm_wgmma.cuh: linear's bias and
// activation, swiglu's dual GEMM), a translation unit of their own so the build compiles them beside
// the plain instances. Compiled for compute_90a only (CUOPS_WGMMA_BUILD); elsewhere, e.g. in the
// JIT build, an empty translation unit.
#if CUOPS_WGMMA_BUILD
#include "gemm_wgmma.cuh"

namespace cuops::kernels::detail {

cudaError_t launch_wgmma_fused_bf16(const GemmPlan& plan, const GemmProblem& p,
                                    cudaStream_t stream) {
  return launch_wg_fused_typed<__nv_bfloat16>(plan, p, stream);
}

}  // namespace cuops::kernels::detail
#endif  // CUOPS_WGMMA_BUILD
