// The grouped GEMM on the Hopper kernel (kernels/gemm/gemm_wgmma.cuh, WgGroup): groups of rows in the
// row layout of ops/moe.cpp (each group from a multiple of 128 rows), one weight matrix a group read
// through a 3-D tensor map, the plain epilogue or the dual GEMM's SwiGLU; and the weight gradients,
// groups along k over the same layout. The same two forms packed (torch._grouped_mm's groups, which
// start anywhere: cuops.grouped_mm), after grouped_prep has read the ends. bfloat16 and float16.
// Compiled for compute_90a only (CUOPS_WGMMA_BUILD); elsewhere launch_grouped_wgmma answers
// cudaErrorNotSupported.
#include "kernels/kernels.h"

#if CUOPS_WGMMA_BUILD
#include "gemm_wgmma.cuh"

namespace cuops::kernels {
namespace detail {
namespace {

// The packed forms' ends as grouped_simt.cu's load_ends takes them (end(e) = min(extent,
// max(offs[0..e], 0)), so bad ends read nothing out of bounds) into ws[0 .. E) and ws[E] = extent;
// with tiles, ws[E + 1 + e] = the BM-row tiles of groups 0 .. e (group E: the rows from the last end
// on). One block, each thread a run of consecutive groups, two block scans (max, then sum).
constexpr int kPrepThreads = 1024;
template <typename Op> __device__ int prep_scan(int v, Op op, int* warp_sums) {  // inclusive
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  for (int o = 1; o < 32; o <<= 1) {
    const int u = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v = op(u, v);
  }
  if (lane == 31) warp_sums[w] = v;
  __syncthreads();
  if (w == 0) {
    int s = warp_sums[lane];
    for (int o = 1; o < 32; o <<= 1) {
      const int u = __shfl_up_sync(0xffffffffu, s, o);
      if (lane >= o) s = op(u, s);
    }
    warp_sums[lane] = s;
  }
  __syncthreads();
  if (w > 0) v = op(warp_sums[w - 1], v);
  __syncthreads();  // warp_sums free again
  return v;
}

template <int BM> __global__ void __launch_bounds__(kPrepThreads)
    grouped_prep(const int32_t* offs, int groups, int extent, bool tiles, int32_t* ws) {
  __shared__ int warp_sums[kPrepThreads / 32];
  __shared__ int before[kPrepThreads];
  const int per = (groups + kPrepThreads) / kPrepThreads;  // over groups + 1 entries
  const int e0 = threadIdx.x * per, e1 = min(e0 + per, groups);
  int run = 0;
  for (int e = e0; e < e1; ++e) run = max(run, min(offs[e], extent));
  const int upto = prep_scan(run, [](int a, int b) { return max(a, b); }, warp_sums);
  before[threadIdx.x] = upto;
  __syncthreads();
  run = threadIdx.x == 0 ? 0 : before[threadIdx.x - 1];
  for (int e = e0; e < e1; ++e) ws[e] = run = max(run, min(offs[e], extent));
  if (threadIdx.x == 0) ws[groups] = extent;
  if (!tiles) return;
  __syncthreads();  // the ends in ws, seen by the whole block
  const int t1 = min(e0 + per, groups + 1);
  int count = 0;
  for (int e = e0; e < t1; ++e) count += (ws[e] - (e == 0 ? 0 : ws[e - 1]) + BM - 1) / BM;
  const int through = prep_scan(count, [](int a, int b) { return a + b; }, warp_sums);
  int sum = through - count;
  for (int e = e0; e < t1; ++e) {
    sum += (ws[e] - (e == 0 ? 0 : ws[e - 1]) + BM - 1) / BM;
    ws[groups + 1 + e] = sum;
  }
}

template <int BM> cudaError_t launch_prep(const GroupedGemm& g, bool tiles, cudaStream_t stream) {
  if (g.workspace == nullptr) return cudaErrorInvalidValue;
  grouped_prep<BM><<<1, kPrepThreads, 0, stream>>>(g.ends, static_cast<int>(g.groups),
                                                   static_cast<int>(g.rows), tiles, g.workspace);
  return cudaGetLastError();
}

// The launch every form shares: the kernel's shared memory, at most one CTA an SM over `units`, no
// cluster; the packed forms after grouped_prep (G Packed with the tiles' count).
template <typename T, int BN, WgGroup G, typename Kernel>
cudaError_t launch_units(Kernel kernel, const GroupedGemm& g, int64_t units, int sms,
                         cudaStream_t stream, const CUtensorMap (&m)[6], const GemmProblem& p,
                         const FusedArgs& f, WgGroups groups) {
  constexpr int BM = 128;
  using Cfg = WgCfg<T, BM, BN>;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmem);
  if (err != cudaSuccess) return err;
  if constexpr (G == WgGroup::Packed || G == WgGroup::PackedK) {
    err = launch_prep<BM>(g, G == WgGroup::Packed, stream);
    if (err != cudaSuccess) return err;
    groups.ends = g.workspace;
    if constexpr (G == WgGroup::Packed) groups.tile_ends = g.workspace + g.groups + 1;
  }
  const int64_t grid = std::min<int64_t>(units, sms);
  if (grid <= 0) return cudaSuccess;
  const ClusterLaunch launch(dim3(static_cast<unsigned>(grid)), dim3(1), WgShape<BM>::kThreads,
                             Cfg::kSmem, stream, false);
  return cudaLaunchKernelEx(&launch.cfg, kernel, m[0], m[1], m[2], m[3], m[4], m[5], p, f, groups);
}

// Groups of rows (G Rows: the layout's, every group from a multiple of 128 rows; Packed: torch's,
// a unit a 128-row tile of one group, at most rows / 128 + groups + 1 of them: the host's bound,
// the kernel walking the count grouped_prep left). The tile: 128 rows by the plan's columns.
template <typename T, int BN, bool BNM, GemmEpilogue E, WgGroup G>
cudaError_t launch_grouped(const GroupedGemm& g, int sms, cudaStream_t stream) {
  constexpr int BM = 128;
  using Cfg = WgCfg<T, BM, BN>;
  constexpr bool kDual = E == GemmEpilogue::Gated;
  constexpr int kOutBN = kDual ? BN / 2 : BN;
  const bool keep = g.aux != nullptr;
  CUtensorMap m[6]{};  // a, b, c, b2, aux, aux2
  const bool maps =
      make_map<T>(m[0], g.a, g.k, g.rows, g.lda, Cfg::kBK, BM) &&
      (BNM ? make_map3<T>(m[1], g.b, g.n, g.k, g.groups, g.ldb, g.b_group_stride, 64, Cfg::kBK)
           : make_map3<T>(m[1], g.b, g.k, g.n, g.groups, g.ldb, g.b_group_stride, Cfg::kBK,
                          kOutBN)) &&
      make_map<T>(m[2], g.c, g.n, g.rows, g.ldc, 64, 64) &&
      (!kDual ||
       make_map3<T>(m[3], g.b2, g.k, g.n, g.groups, g.ldb, g.b_group_stride, Cfg::kBK, kOutBN)) &&
      (!keep || (make_map<T>(m[4], g.aux, g.n, g.rows, g.ld_aux, 64, 64) &&
                 make_map<T>(m[5], g.aux2, g.n, g.rows, g.ld_aux, 64, 64)));
  if (!maps) return cudaErrorInvalidValue;
  if (!kDual) m[3] = m[1];
  if (!keep) m[4] = m[5] = m[2];
  const int64_t tiles =
      G == WgGroup::Packed ? (g.rows + (BM - 1) * (g.groups + 1)) / BM : (g.rows + BM - 1) / BM;
  const GemmProblem p{g.rows, g.n,   g.k, g.a, g.lda, g.b, g.ldb,
                      g.c,    g.ldc, 1.f, 0.f, 1.0,   0.0, nullptr};
  return launch_units<T, BN, G>(
      gemm_wgmma_grouped<T, BM, BN, true, BNM, E, G>, g, tiles * ((g.n + kOutBN - 1) / kOutBN), sms,
      stream, m, p, FusedArgs{nullptr, Activation::Silu, keep},  // the experts' gate: silu
      WgGroups{g.ends, static_cast<int>(g.groups), 0});
}

// Along k (a weight gradient): c [groups m, n], group e's rows of c the product of a's and b's rows
// of group e (a [rows, m] read m-major: its transpose; b [rows, n] n-major). m a multiple of 128, so
// no c tile straddles two groups. G K: the layout's groups (whole 64-row k-tiles); PackedK: torch's,
// each group's k rows from wherever the one before ended.
template <typename T, int BN, WgGroup G>
cudaError_t launch_grouped_k(const GroupedGemm& g, int sms, cudaStream_t stream) {
  constexpr int BM = 128;
  using Cfg = WgCfg<T, BM, BN>;
  if (g.m % BM != 0 || g.rows <= 0) return cudaErrorInvalidValue;
  CUtensorMap m[6]{};
  const bool maps = make_map<T>(m[0], g.a, g.m, g.rows, g.lda, 64, Cfg::kBK) &&
                    make_map<T>(m[1], g.b, g.n, g.rows, g.ldb, 64, Cfg::kBK) &&
                    make_map<T>(m[2], g.c, g.n, g.groups * g.m, g.ldc, 64, 64);
  if (!maps) return cudaErrorInvalidValue;
  m[3] = m[1];
  m[4] = m[5] = m[2];
  const GemmProblem p{g.groups * g.m, g.n, g.rows, g.a, g.lda, g.b,    g.ldb, g.c,
                      g.ldc,          1.f, 0.f,    1.0, 0.0,   nullptr};
  return launch_units<T, BN, G>(
      gemm_wgmma_grouped<T, BM, BN, false, true, GemmEpilogue::Plain, G>, g,
      g.groups * (g.m / BM) * ((g.n + BN - 1) / BN), sms, stream, m, p,
      FusedArgs{nullptr, Activation::None, false},
      WgGroups{g.ends, static_cast<int>(g.groups), static_cast<int>(g.m / BM)});
}

template <typename T>
cudaError_t launch_grouped_typed(const GroupedGemm& g, int sms, cudaStream_t stream) {
  if (g.bn != 128 && g.bn != 256) return cudaErrorInvalidValue;
  const bool wide = g.bn == 256;
  constexpr auto kPlain = GemmEpilogue::Plain;
  if (g.packed) {
    constexpr WgGroup P = WgGroup::Packed;
    if (g.b2 != nullptr || g.aux != nullptr) return cudaErrorInvalidValue;
    if (g.along_k)
      return wide ? launch_grouped_k<T, 256, WgGroup::PackedK>(g, sms, stream)
                  : launch_grouped_k<T, 128, WgGroup::PackedK>(g, sms, stream);
    if (g.b_nmajor)
      return wide ? launch_grouped<T, 256, true, kPlain, P>(g, sms, stream)
                  : launch_grouped<T, 128, true, kPlain, P>(g, sms, stream);
    return wide ? launch_grouped<T, 256, false, kPlain, P>(g, sms, stream)
                : launch_grouped<T, 128, false, kPlain, P>(g, sms, stream);
  }
  constexpr WgGroup R = WgGroup::Rows;
  if (g.along_k)
    return wide ? launch_grouped_k<T, 256, WgGroup::K>(g, sms, stream)
                : launch_grouped_k<T, 128, WgGroup::K>(g, sms, stream);
  if (g.b2 != nullptr) {
    if (g.b_nmajor || !wide) return cudaErrorInvalidValue;  // nn.Linear-like rows, 128 outputs
    return launch_grouped<T, 256, false, GemmEpilogue::Gated, R>(g, sms, stream);
  }
  if (g.b_nmajor)
    return wide ? launch_grouped<T, 256, true, kPlain, R>(g, sms, stream)
                : launch_grouped<T, 128, true, kPlain, R>(g, sms, stream);
  return wide ? launch_grouped<T, 256, false, kPlain, R>(g, sms, stream)
              : launch_grouped<T, 128, false, kPlain, R>(g, sms, stream);
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
