// The bf16 instances of the Hopper GEMM (kernels/gemm/gemm_wgmma.cuh), and the device query (it names the
// bf16 pair kernel). Compiled for compute_90a only (CUOPS_WGMMA_BUILD); elsewhere, e.g. in the JIT
// build, an empty translation unit.
#if CUOPS_WGMMA_BUILD
#include "gemm_wgmma.cuh"

namespace cuops::kernels::detail {

cudaError_t launch_wgmma_bf16(const GemmPlan& plan, const GemmProblem& p, cudaStream_t stream) {
  return launch_wg_typed<__nv_bfloat16>(plan, p, stream);
}

// Whether this library's sm_90a code runs on `dev` (compute capability exactly 9.0, the kernel image
// loads, the driver has the encoder), and how many pairs fit at once there. (The switch
// CUOPS_DISABLE_WGMMA applies on top: current_gemm_device.)
bool wgmma_runs_on(int dev, int& pair_clusters) {
  pair_clusters = 0;
  int major = 0, minor = 0, sms = 0;
  constexpr auto pair = gemm_wgmma<__nv_bfloat16, 128, 256, true, true, 2>;
  cudaFuncAttributes attr{};
  const bool ok =
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
      major == 9 && minor == 0 && tma_encoder() != nullptr &&
      cudaFuncGetAttributes(&attr, pair) == cudaSuccess;
  (void)cudaGetLastError();  // a missing image is an answer here, not an error for the next launch
  if (!ok) return false;
  // Every pair instance runs one CTA per SM (384 threads at 232 registers), so how many pairs fit is
  // the GPC layout's answer, the same for all of them: asked once, of the bf16 one.
  using Cfg = WgCfg<__nv_bfloat16, 128, 256>;
  if (cudaFuncSetAttribute(pair, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmem) ==
      cudaSuccess) {
    const ClusterLaunch launch(dim3(static_cast<unsigned>(2 * (sms / 2))), dim3(2),
                               WgShape<128>::kThreads, Cfg::kSmem, nullptr);
    if (cudaOccupancyMaxActiveClusters(&pair_clusters, pair, &launch.cfg) != cudaSuccess)
      pair_clusters = 0;
  }
  (void)cudaGetLastError();
  if (pair_clusters <= 0) pair_clusters = sms / 2;
  return true;
}

}  // namespace cuops::kernels::detail
#endif  // CUOPS_WGMMA_BUILD
