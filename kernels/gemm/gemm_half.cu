// bfloat16 / float16 GEMM on tensor cores with mma.sync (sm_80+): m16n8k16, float32 accumulation,
// the result rounded once to the output dtype. Block tile BM x BN x 32, 8 warps (2 x 4) of
// (BM/2) x (BN/4). Operands arrive in 16-byte chunks by cp.async (chunks cut by an edge by plain
// loads, zero-filled: copy_chunk) over a multi-stage ring, each stored as it lies in global memory;
// ldmatrix (.trans where the stored orientation is the fragment's transpose) builds the fragments,
// so all four layouts cost the same.
// Rows are padded by 16 bytes: the 8 row addresses of every ldmatrix land in 8 different bank groups.
// The portable tensor-core path: GPUs without this library's sm_90a wgmma kernel (gemm_wgmma.cu), and
// operands TMA cannot describe.
#include "gemm.cuh"

namespace cuops::kernels::detail {
namespace {

constexpr int kHalfThreads = 256, kHBK = 32, kPad = 8;  // kPad elements = 16 bytes

template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(smem)));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(smem)));
  }
}

template <typename T, int BM, int BN, bool AK, bool BNM> struct HalfSmem {
  static constexpr int kALd = (AK ? kHBK : BM) + kPad;  // AK: [BM][kALd] (k inner); else [BK][kALd]
  static constexpr int kBLd =
      (BNM ? BN : kHBK) + kPad;  // BNM: [BK][kBLd] (n inner); else [BN][kBLd]
  static constexpr int kAElems = AK ? BM * kALd : kHBK * kALd;
  static constexpr int kBElems = BNM ? kHBK * kBLd : BN * kBLd;
  static constexpr int kStageElems = kAElems + kBElems;
};

template <typename T, int BM, int BN, int STAGES, bool AK, bool BNM>
__global__ void __launch_bounds__(kHalfThreads, 2) hgemm_mma(GemmProblem p) {
  using S = HalfSmem<T, BM, BN, AK, BNM>;
  constexpr int MI = BM / 32, NI = BN / 32;  // m16 and n8 tiles per warp
  static_assert(NI % 2 == 0, "B fragments load two n8 tiles per ldmatrix.x4");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);
  const T* A = static_cast<const T*>(p.a);
  const T* B = static_cast<const T*>(p.b);
  int64_t tm, tn;
  tile_coords<8>((p.m + BM - 1) / BM, (p.n + BN - 1) / BN, tm, tn);
  const int64_t row0 = tm * BM, col0 = tn * BN;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / 4, wn = warp % 4, g = lane / 4, t = lane % 4;
  const int64_t ktiles = (p.k + kHBK - 1) / kHBK;

  auto load_stage = [&](int stage, int64_t kt) {
    const int64_t k0 = kt * kHBK;
    T* as = smem + stage * S::kStageElems;
    T* bs = as + S::kAElems;
    CUOPS_STAGE_OPERANDS(T, BM, BN, kHBK, kHalfThreads, AK, BNM, p, A, B, as, S::kALd, bs, S::kBLd,
                         row0, col0, k0, tid, false, false);
  };

  float acc[MI][NI][4] = {};
  // ldmatrix row addresses: lane i feeds row i % 8 of matrix i / 8.
  const int lrow = lane % 8, lmat = lane / 8;
  cp_async_ring<STAGES>(ktiles, load_stage, [&](int64_t kt) {
    const T* as = smem + (kt % STAGES) * S::kStageElems;
    const T* bs = as + S::kAElems;
#pragma unroll
    for (int kk = 0; kk < kHBK; kk += 16) {
      uint32_t af[MI][4], bf[NI][2];
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        const int m0 = wm * (BM / 2) + mi * 16;
        // Matrices: (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15) = a0..a3.
        const int m = m0 + lrow + 8 * (lmat % 2), k = kk + 8 * (lmat / 2);
        if constexpr (AK) {
          ldmatrix_x4<false>(af[mi], as + m * S::kALd + k);
        } else {  // stored [k][m]: row = k, 8 m per row, transposed on the way out
          const int km = kk + lrow + 8 * (lmat / 2), mm = m0 + 8 * (lmat % 2);
          ldmatrix_x4<true>(af[mi], as + km * S::kALd + mm);
        }
      }
#pragma unroll
      for (int ni = 0; ni < NI; ni += 2) {
        const int n0 = wn * (BN / 4) + ni * 8;
        // Matrices: (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15)
        //         = b0, b1 of tile ni, b0, b1 of tile ni + 1.
        uint32_t r[4];
        if constexpr (BNM) {  // stored [k][n]: transposed on the way out
          const int k = kk + lrow + 8 * (lmat % 2), n = n0 + 8 * (lmat / 2);
          ldmatrix_x4<true>(r, bs + k * S::kBLd + n);
        } else {  // stored [n][k]
          const int n = n0 + lrow + 8 * (lmat / 2), k = kk + 8 * (lmat % 2);
          ldmatrix_x4<false>(r, bs + n * S::kBLd + k);
        }
        bf[ni][0] = r[0], bf[ni][1] = r[1], bf[ni + 1][0] = r[2], bf[ni + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni)
          mma16816<T>(acc[mi][ni], af[mi][0], af[mi][1], af[mi][2], af[mi][3], bf[ni][0],
                      bf[ni][1]);
    }
  });
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni) {
      const int64_t r = row0 + wm * (BM / 2) + mi * 16 + g,
                    c = col0 + wn * (BN / 4) + ni * 8 + t * 2;
      Epilogue::pair<T>(p, r, c, acc[mi][ni][0], acc[mi][ni][1]);
      Epilogue::pair<T>(p, r + 8, c, acc[mi][ni][2], acc[mi][ni][3]);
    }
}

template <typename T, int BM, int BN, int STAGES, bool AK, bool BNM>
cudaError_t launch_half(const GemmPlan& plan, const GemmProblem& p, cudaStream_t stream) {
  constexpr int smem = STAGES * HalfSmem<T, BM, BN, AK, BNM>::kStageElems * 2;
  return launch_blocks(hgemm_mma<T, BM, BN, STAGES, AK, BNM>, plan.grid, kHalfThreads, smem, stream,
                       p);
}

}  // namespace

cudaError_t launch_gemm_mma_half(const GemmPlan& plan, const GemmProblem& p, cudaStream_t stream) {
  auto typed = [&](auto tag) {
    using T = decltype(tag);
    return with_layouts(plan.a_kmajor, plan.b_nmajor, [&](auto ak, auto bn) {
      constexpr bool AK = decltype(ak)::value, BNM = decltype(bn)::value;
      if (plan.tiled().bm == 128 && plan.tiled().bn == 128)
        return launch_half<T, 128, 128, 4, AK, BNM>(plan, p, stream);
      if (plan.tiled().bm == 64 && plan.tiled().bn == 128)
        return launch_half<T, 64, 128, 4, AK, BNM>(plan, p, stream);
      return cudaErrorInvalidValue;
    });
  };
  if (plan.req.dtype == DType::BFloat16) return typed(__nv_bfloat16{});
  if (plan.req.dtype == DType::Float16) return typed(__half{});
  return cudaErrorInvalidValue;
}

}  // namespace cuops::kernels::detail
