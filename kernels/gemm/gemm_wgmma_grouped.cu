// The grouped GEMM on the Hopper kernel (kernels/gemm/gemm_wgmma.cuh, WgGroup): groups of rows in the
// row layout of ops/moe.cpp (each group from a multiple of 128 rows), one weight matrix a group read
// through a 3-D tensor map, the plain epilogue or the dual GEMM's SwiGLU; and the weight gradients,
// groups along k over the same layout. bfloat16 and float16.
// Compiled for compute_90a only (CUOPS_WGMMA_BUILD); elsewhere launch_grouped_wgmma answers
// cudaErrorNotSupported.
#include "kernels/kernels.h"

#if CUOPS_WGMMA_BUILD
#include "gemm_wgmma.cuh"

namespace cuops::kernels {
namespace detail {
namespace {

// The tile: 128 rows (the layout's alignment) by the plan's columns (plan_grouped).
template <typename T, int BN, bool BNM, GemmEpilogue E>
cudaError_t launch_grouped(const GroupedGemm& g, int sms, cudaStream_t stream) {
  constexpr int BM = 128;
  using Cfg = WgCfg<T, BM, BN>;
  constexpr bool kDual = E == GemmEpilogue::GatedSilu;
  constexpr int kOutBN = kDual ? BN / 2 : BN;
  const bool keep = g.aux != nullptr;
  CUtensorMap ma, mb, mc, mb2{}, maux{}, maux2{};
  const bool maps =
      make_map<T>(ma, g.a, g.k, g.rows, g.lda, Cfg::kBK, BM) &&
      (BNM ? make_map3<T>(mb, g.b, g.n, g.k, g.groups, g.ldb, g.b_group_stride, 64, Cfg::kBK)
           : make_map3<T>(mb, g.b, g.k, g.n, g.groups, g.ldb, g.b_group_stride, Cfg::kBK,
                          kOutBN)) &&
      make_map<T>(mc, g.c, g.n, g.rows, g.ldc, 64, 64) &&
      (!kDual ||
       make_map3<T>(mb2, g.b2, g.k, g.n, g.groups, g.ldb, g.b_group_stride, Cfg::kBK, kOutBN)) &&
      (!keep || (make_map<T>(maux, g.aux, g.n, g.rows, g.ld_aux, 64, 64) &&
                 make_map<T>(maux2, g.aux2, g.n, g.rows, g.ld_aux, 64, 64)));
  if (!maps) return cudaErrorInvalidValue;
  if (!kDual) mb2 = mb;
  if (!keep) maux = maux2 = mc;
  constexpr auto kernel = gemm_wgmma_grouped<T, BM, BN, true, BNM, E, WgGroup::Rows>;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmem);
  if (err != cudaSuccess) return err;
  const int64_t units = (g.rows + BM - 1) / BM * ((g.n + kOutBN - 1) / kOutBN);
  const int64_t grid = std::min<int64_t>(units, sms);
  if (grid <= 0) return cudaSuccess;
  const GemmProblem p{g.rows, g.n,   g.k, g.a, g.lda, g.b, g.ldb,
                      g.c,    g.ldc, 1.f, 0.f, 1.0,   0.0, nullptr};
  const FusedArgs f{nullptr, Activation::None, keep};
  const WgGroups groups{g.ends, static_cast<int>(g.groups), 0};
  const ClusterLaunch launch(dim3(static_cast<unsigned>(grid)), dim3(1), WgShape<BM>::kThreads,
                             Cfg::kSmem, stream, false);
  return cudaLaunchKernelEx(&launch.cfg, kernel, ma, mb, mc, mb2, maux, maux2, p, f, groups);
}

// Along k (a weight gradient): c [groups m, n], group e's rows of c the product of a's and b's rows
// of group e (a [rows, m] read m-major: its transpose; b [rows, n] n-major). m a multiple of 128, so
// no c tile straddles two groups.
template <typename T, int BN>
cudaError_t launch_grouped_k(const GroupedGemm& g, int sms, cudaStream_t stream) {
  constexpr int BM = 128;
  using Cfg = WgCfg<T, BM, BN>;
  if (g.m % BM != 0) return cudaErrorInvalidValue;
  CUtensorMap ma, mb, mc;
  const bool maps = make_map<T>(ma, g.a, g.m, g.rows, g.lda, 64, Cfg::kBK) &&
                    make_map<T>(mb, g.b, g.n, g.rows, g.ldb, 64, Cfg::kBK) &&
                    make_map<T>(mc, g.c, g.n, g.groups * g.m, g.ldc, 64, 64);
  if (!maps) return cudaErrorInvalidValue;
  constexpr auto kernel =
      gemm_wgmma_grouped<T, BM, BN, false, true, GemmEpilogue::Plain, WgGroup::K>;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmem);
  if (err != cudaSuccess) return err;
  const int64_t units = g.groups * (g.m / BM) * ((g.n + BN - 1) / BN);
  const int64_t grid = std::min<int64_t>(units, sms);
  const GemmProblem p{g.groups * g.m, g.n, g.rows, g.a, g.lda, g.b,    g.ldb, g.c,
                      g.ldc,          1.f, 0.f,    1.0, 0.0,   nullptr};
  const FusedArgs f{nullptr, Activation::None, false};
  const WgGroups groups{g.ends, static_cast<int>(g.groups), static_cast<int>(g.m / BM)};
  const ClusterLaunch launch(dim3(static_cast<unsigned>(grid)), dim3(1), WgShape<BM>::kThreads,
                             Cfg::kSmem, stream, false);
  return cudaLaunchKernelEx(&launch.cfg, kernel, ma, mb, mc, mb, mc, mc, p, f, groups);
}

template <typename T>
cudaError_t launch_grouped_typed(const GroupedGemm& g, int sms, cudaStream_t stream) {
  if (g.bn != 128 && g.bn != 256) return cudaErrorInvalidValue;
  const bool wide = g.bn == 256;
  if (g.along_k)
    return wide ? launch_grouped_k<T, 256>(g, sms, stream)
                : launch_grouped_k<T, 128>(g, sms, stream);
  if (g.b2 != nullptr) {
    if (g.b_nmajor || !wide) return cudaErrorInvalidValue;  // nn.Linear-like rows, 128 outputs
    return launch_grouped<T, 256, false, GemmEpilogue::GatedSilu>(g, sms, stream);
  }
  if (g.b_nmajor)
    return wide ? launch_grouped<T, 256, true, GemmEpilogue::Plain>(g, sms, stream)
                : launch_grouped<T, 128, true, GemmEpilogue::Plain>(g, sms, stream);
  return wide ? launch_grouped<T, 256, false, GemmEpilogue::Plain>(g, sms, stream)
              : launch_grouped<T, 128, false, GemmEpilogue::Plain>(g, sms, stream);
}

}  // namespace
}  // namespace detail

cudaError_t launch_grouped_wgmma(const GroupedGemm& g, int sms, cudaStream_t stream) {
  if (g.rows < 0 || g.n <= 0 || g.groups <= 0 || g.groups > kGroupedMaxGroups || sms <= 0 ||
      (g.along_k ? g.m <= 0 : g.k <= 0))
    return cudaErrorInvalidValue;
  if (g.rows == 0 && !g.along_k) return cudaSuccess;
  switch (g.dtype) {
    case DType::BFloat16:
      return detail::launch_grouped_typed<__nv_bfloat16>(g, sms, stream);
    case DType::Float16:
      return detail::launch_grouped_typed<__half>(g, sms, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace cuops::kernels
#else
namespace cuops::kernels {
cudaError_t launch_grouped_wgmma(const GroupedGemm&, int, cudaStream_t) {
  return cudaErrorNotSupported;
}
}  // namespace cuops::kernels
#endif  // CUOPS_WGMMA_BUILD
