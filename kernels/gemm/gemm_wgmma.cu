// Hopper GEMM (sm_90a, kernels/gemm/gemm_wgmma.cuh): the dispatch to the dtype's translation unit
// (gemm_wgmma_{bf16,f16,tf32}.cu). Built for compute_90a where CMake's arch list has 90
// (CUOPS_WGMMA_BUILD); elsewhere wgmma_runs_on says no, so the planner never picks the kernel.
#include "gemm.cuh"

#if CUOPS_WGMMA_BUILD
#include "gemm_wgmma.cuh"
#endif

namespace cuops::kernels::detail {

#if CUOPS_WGMMA_BUILD
cudaError_t launch_gemm_wgmma(const GemmPlan& plan, const GemmProblem& p, cudaStream_t stream) {
  if (plan.req.fusion.kind != GemmEpilogue::Plain) {
    switch (plan.req.dtype) {
      case DType::BFloat16:
        return launch_wgmma_fused_bf16(plan, p, stream);
      case DType::Float16:
        return launch_wgmma_fused_f16(plan, p, stream);
      default:
        return cudaErrorInvalidValue;
    }
  }
  switch (plan.req.dtype) {
    case DType::BFloat16:
      return launch_wgmma_bf16(plan, p, stream);
    case DType::Float16:
      return launch_wgmma_f16(plan, p, stream);
    case DType::Float32:
      return launch_wgmma_tf32(plan, p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}
#else
bool wgmma_runs_on(int, int& pair_clusters) {
  pair_clusters = 0;
  return false;
}
cudaError_t launch_gemm_wgmma(const GemmPlan&, const GemmProblem&, cudaStream_t) {
  return cudaErrorInvalidValue;
}
#endif

}  // namespace cuops::kernels::detail
