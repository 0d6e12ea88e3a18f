// launch_gemm: runs a plan (gemm_plan.h) on the kernel it names. Also the general kernel, which takes
// what no fast kernel does (any strides, misaligned slices, float64 before sm_80): shared-memory tiling (64x64
// block tile, 16-deep k slices, 4x4 register blocking) reading operands through their strides, so it
// needs no copy and is correct for every shape.
#include "gemm.cuh"
#include "kernels/switches.h"

namespace cuops::kernels {
using namespace detail;
namespace {

constexpr int kBM = 64, kBN = 64, kBK = 16;
constexpr int kTM = 4, kTN = 4;
constexpr int kThreads = (kBM / kTM) * (kBN / kTN);  // 256

// a: [m, k], b: [k, n], c: [m, n], all strided. Block tiles are enumerated in gridDim.x (up to
// 2^31-1 of them) rather than in x/y, whose 65535 limit would cap m.
template <typename T> __global__ void __launch_bounds__(kThreads)
    gemm_tiled(int64_t m, int64_t n, int64_t k, acc_t<T> alpha, const T* a, int64_t sa0,
               int64_t sa1, const T* b, int64_t sb0, int64_t sb1, acc_t<T> beta, T* c, int64_t sc0,
               int64_t sc1) {
  using A = acc_t<T>;
  // +1 column of padding keeps the transposed stores of the A tile off one bank.
  __shared__ A as[kBK][kBM + 1];
  __shared__ A bs[kBK][kBN + 1];

  const int64_t tiles_n = (n + kBN - 1) / kBN;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) / tiles_n) * kBM;
  const int64_t col0 = (static_cast<int64_t>(blockIdx.x) % tiles_n) * kBN;
  const int tx = threadIdx.x % (kBN / kTN), ty = threadIdx.x / (kBN / kTN);

  A acc[kTM][kTN] = {};
  for (int64_t k0 = 0; k0 < k; k0 += kBK) {
#pragma unroll
    for (int r = 0; r < kBM * kBK / kThreads; ++r) {
      const int l = threadIdx.x + r * kThreads;
      const int kk = l % kBK, mm = l / kBK;
      const int64_t gi = row0 + mm, gk = k0 + kk;
      as[kk][mm] = (gi < m && gk < k) ? to_acc(a[gi * sa0 + gk * sa1]) : A(0);
    }
#pragma unroll
    for (int r = 0; r < kBN * kBK / kThreads; ++r) {
      const int l = threadIdx.x + r * kThreads;
      const int nn = l % kBN, kk = l / kBN;
      const int64_t gk = k0 + kk, gj = col0 + nn;
      bs[kk][nn] = (gk < k && gj < n) ? to_acc(b[gk * sb0 + gj * sb1]) : A(0);
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      A af[kTM], bf[kTN];
#pragma unroll
      for (int i = 0; i < kTM; ++i) af[i] = as[kk][ty * kTM + i];
#pragma unroll
      for (int j = 0; j < kTN; ++j) bf[j] = bs[kk][tx * kTN + j];
#pragma unroll
      for (int i = 0; i < kTM; ++i)
#pragma unroll
        for (int j = 0; j < kTN; ++j) acc[i][j] = fma(af[i], bf[j], acc[i][j]);
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < kTM; ++i) {
    const int64_t gi = row0 + ty * kTM + i;
    if (gi >= m) continue;
#pragma unroll
    for (int j = 0; j < kTN; ++j) {
      const int64_t gj = col0 + tx * kTN + j;
      if (gj >= n) continue;
      T* dst = c + gi * sc0 + gj * sc1;
      A v = alpha * acc[i][j];
      // beta == 0 must not read c: its old contents may be NaN or uninitialised.
      if (beta != A(0)) v = fma(beta, to_acc(*dst), v);
      *dst = from_acc<T>(v);
    }
  }
}

// 32 x 32 tiles through shared memory, so both the reads of src rows and the writes of dst rows are
// whole 128-byte lines; the padding column keeps the transposed reads off one bank. Tiles are
// enumerated in gridDim.x, as gemm_tiled's are.
constexpr int kTile = 32, kTileRows = 8;
__global__ void __launch_bounds__(kTile* kTileRows)
    transpose_f32(const float* src, int64_t rows, int64_t cols, int64_t ld, float* dst,
                  int64_t ld_dst) {
  __shared__ float t[kTile][kTile + 1];
  const int64_t tiles_c = (cols + kTile - 1) / kTile;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) / tiles_c * kTile;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) % tiles_c * kTile;
  const int x = threadIdx.x % kTile, y = threadIdx.x / kTile;
#pragma unroll
  for (int j = y; j < kTile; j += kTileRows) {
    if (r0 + j < rows && c0 + x < cols) t[j][x] = src[(r0 + j) * ld + c0 + x];
  }
  __syncthreads();
#pragma unroll
  for (int j = y; j < kTile; j += kTileRows) {
    if (c0 + j < cols && r0 + x < rows) dst[(c0 + j) * ld_dst + r0 + x] = t[x][j];
  }
}

}  // namespace

cudaError_t launch_transpose_f32(const float* src, int64_t rows, int64_t cols, int64_t ld,
                                 float* dst, int64_t ld_dst, cudaStream_t stream) {
  if (rows < 0 || cols < 0 || ld < cols || ld_dst < rows) return cudaErrorInvalidValue;
  const int64_t tiles = ((rows + kTile - 1) / kTile) * ((cols + kTile - 1) / kTile);
  if (tiles == 0) return cudaSuccess;
  return launch_blocks(transpose_f32, tiles, kTile * kTileRows, 0, stream, src, rows, cols, ld, dst,
                       ld_dst);
}

GemmDevice current_gemm_device() {
  static PerDevice<GemmDevice> cache;
  GemmDevice d = cache.get(
      [](int dev) {
        GemmDevice d;
        if (cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
            d.sms < 1) {
          (void)cudaGetLastError();
          d.sms = 1;
        }
        d.wgmma = wgmma_runs_on(dev, d.pair_clusters);
        d.clusters = skinny_clusters_on(dev);
        d.skinny_tma = d.clusters && skinny_tma_on(dev);
        d.dmma = dmma_runs_on(dev, d.dmma_wide);
        return d;
      },
      GemmDevice{1, false, 0, false, false, false, false});
  // The switches (kernels/switches.h) on top of what the device runs: asked at every plan, so a test
  // may change them in process.
  d.wgmma = d.wgmma && !switch_on(Switch::DisableWgmma);
  d.skinny_tma = d.skinny_tma && !switch_on(Switch::DisableSkinnyTma);
  return d;
}

namespace {

// The problem the fast kernels see (gemm.cuh): operands exchanged where the plan computes a
// transposed product (a column-major c; TF32 wgmma's C^T = B^T A^T), m, n and strides as planned.
GemmProblem fast_problem(const GemmPlan& plan, void* workspace) {
  const GemmRequest& r = plan.req;
  const void* a = plan.swap_ab ? plan.b.ptr : plan.a.ptr;
  const void* b = plan.swap_ab ? plan.a.ptr : plan.b.ptr;
  const auto* w = std::get_if<WgmmaParams>(&plan.params);
  if (w != nullptr && w->c_trans) std::swap(a, b);
  return GemmProblem{plan.m,
                     plan.n,
                     r.k,
                     a,
                     plan.lda,
                     b,
                     plan.ldb,
                     r.c,
                     plan.ldc,
                     static_cast<float>(r.alpha),
                     static_cast<float>(r.beta),
                     r.alpha,
                     r.beta,
                     workspace};
}

cudaError_t launch_general(const GemmPlan& plan, cudaStream_t stream) {
  const GemmRequest& r = plan.req;
  return dispatch_dtype(r.dtype, [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    return launch_blocks(gemm_tiled<T>, plan.grid, kThreads, 0, stream, r.m, r.n, r.k,
                         static_cast<A>(r.alpha), static_cast<const T*>(r.a.ptr), r.a.stride0,
                         r.a.stride1, static_cast<const T*>(r.b.ptr), r.b.stride0, r.b.stride1,
                         static_cast<A>(r.beta), static_cast<T*>(r.c), r.c_stride0, r.c_stride1);
  });
}

// Whether the plan's parameters are its kernel's family's (the launchers read them unchecked).
bool params_fit(const GemmPlan& plan) {
  switch (plan.kernel) {
    case GemmKernel::None:
      return true;
    case GemmKernel::Wgmma:
      return std::holds_alternative<WgmmaParams>(plan.params);
    case GemmKernel::Skinny:
      return std::holds_alternative<SkinnyParams>(plan.params);
    default:
      return std::holds_alternative<TiledParams>(plan.params);
  }
}

}  // namespace

cudaError_t launch_gemm(const GemmPlan& plan, cudaStream_t stream, void* workspace) {
  const bool unmade = (plan.copy_a.layout != CopyLayout::None && plan.a.ptr == nullptr) ||
                      (plan.copy_b.layout != CopyLayout::None && plan.b.ptr == nullptr);
  // A fused request runs only on the plan that fuses it: any other kernel would drop its epilogue.
  const bool unfused =
      plan.req.fusion.kind != GemmEpilogue::Plain && !plan.fused && plan.kernel != GemmKernel::None;
  if (unmade || unfused || !params_fit(plan)) return cudaErrorInvalidValue;
  if (plan.workspace_bytes > 0 &&
      (workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 16 != 0)) {
    return cudaErrorInvalidValue;
  }
  switch (plan.kernel) {
    case GemmKernel::None:
      return cudaSuccess;
    case GemmKernel::General:
      return launch_general(plan, stream);
    case GemmKernel::Simt:
      return launch_gemm_simt(plan, fast_problem(plan, workspace), stream);
    case GemmKernel::MmaTf32:
      return launch_gemm_mma_tf32(plan, fast_problem(plan, workspace), stream);
    case GemmKernel::MmaHalf:
      return launch_gemm_mma_half(plan, fast_problem(plan, workspace), stream);
    case GemmKernel::Wgmma:
      return launch_gemm_wgmma(plan, fast_problem(plan, workspace), stream);
    case GemmKernel::Skinny:
      return launch_gemm_skinny(plan, fast_problem(plan, workspace), stream);
    case GemmKernel::MmaF64:
      return launch_gemm_mma_f64(plan, fast_problem(plan, workspace), stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace cuops::kernels
