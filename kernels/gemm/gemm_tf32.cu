// float32 GEMM on tensor cores in TF32 (torch's "high"/"medium" matmul precision): mma.sync
// m16n8k8 with float32 accumulation. Block tile BM x BN x 32, 8 warps (2 x 4), each a
// (BM/2) x (BN/4) warp tile. Operands come in by cp.async over a multi-stage shared-memory ring,
// each laid out in shared memory as it is in global memory (so every layout is a straight 16-byte
// copy) with rows padded so that the fragment reads of a warp hit 32 distinct banks in all four
// layouts. Inputs are rounded to TF32 (cvt.rna) as they leave shared memory, as cuBLAS does.
#include "gemm.cuh"

namespace cuops::kernels::detail {
namespace {

constexpr int kTf32Threads = 256, kBK = 32;

__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

// Shared-memory geometry of one stage. Padding: 4 floats on rows of 32 (k), 4 on rows of BM (m)
// and 8 on rows of BN (n) make the (g, t) fragment pattern of m16n8k8 land on distinct banks.
template <int BM, int BN, bool AK, bool BNM> struct Tf32Smem {
  static constexpr int kALd = AK ? kBK + 4 : BM + 4;   // AK: [BM][kALd] (k inner); else [BK][kALd]
  static constexpr int kBLd = BNM ? BN + 8 : kBK + 4;  // BNM: [BK][kBLd] (n inner); else [BN][kBLd]
  static constexpr int kAFloats = AK ? BM * kALd : kBK * kALd;
  static constexpr int kBFloats = BNM ? kBK * kBLd : BN * kBLd;
  static constexpr int kStageFloats = kAFloats + kBFloats;
  __device__ static float a(const float* as, int m, int k) {
    return AK ? as[m * kALd + k] : as[k * kALd + m];
  }
  __device__ static float b(const float* bs, int k, int n) {
    return BNM ? bs[k * kBLd + n] : bs[n * kBLd + k];
  }
};

template <int BM, int BN, int STAGES, bool AK, bool BNM>
// Two blocks per SM fit the 64 x 128 tile in 128 registers; the 128 x 128 tile spills there, so it runs one.
__global__ void __launch_bounds__(kTf32Threads, BM* BN > 64 * 128 ? 1 : 2)
    sgemm_tf32(GemmProblem p) {
  using S = Tf32Smem<BM, BN, AK, BNM>;
  constexpr int MI = BM / 32, NI = BN / 32;  // m16 and n8 tiles per warp
  extern __shared__ __align__(16) float smem[];
  const float* A = static_cast<const float*>(p.a);
  const float* B = static_cast<const float*>(p.b);
  int64_t tm, tn;
  tile_coords<8>((p.m + BM - 1) / BM, (p.n + BN - 1) / BN, tm, tn);
  const int64_t row0 = tm * BM, col0 = tn * BN;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / 4, wn = warp % 4, g = lane / 4, t = lane % 4;
  const int64_t ktiles = (p.k + kBK - 1) / kBK;

  auto load_stage = [&](int stage, int64_t kt) {
    const int64_t k0 = kt * kBK;
    float* as = smem + stage * S::kStageFloats;
    float* bs = as + S::kAFloats;
    CUOPS_STAGE_OPERANDS(float, BM, BN, kBK, kTf32Threads, AK, BNM, p, A, B, as, S::kALd, bs,
                         S::kBLd, row0, col0, k0, tid, false, false);
  };

  float acc[MI][NI][4] = {};
  cp_async_ring<STAGES>(ktiles, load_stage, [&](int64_t kt) {
    const float* as = smem + (kt % STAGES) * S::kStageFloats;
    const float* bs = as + S::kAFloats;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 8) {
      uint32_t af[MI][4], bf[NI][2];
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        const int m = wm * (BM / 2) + mi * 16 + g;
        af[mi][0] = to_tf32(S::a(as, m, kk + t));
        af[mi][1] = to_tf32(S::a(as, m + 8, kk + t));
        af[mi][2] = to_tf32(S::a(as, m, kk + t + 4));
        af[mi][3] = to_tf32(S::a(as, m + 8, kk + t + 4));
      }
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        const int n = wn * (BN / 4) + ni * 8 + g;
        bf[ni][0] = to_tf32(S::b(bs, kk + t, n));
        bf[ni][1] = to_tf32(S::b(bs, kk + t + 4, n));
      }
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
          float* d = acc[mi][ni];
          asm volatile(
              "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
              "{%8,%9}, "
              "{%0,%1,%2,%3};\n"
              : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
              : "r"(af[mi][0]), "r"(af[mi][1]), "r"(af[mi][2]), "r"(af[mi][3]), "r"(bf[ni][0]),
                "r"(bf[ni][1]));
        }
    }
  });
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni) {
      const int64_t r = row0 + wm * (BM / 2) + mi * 16 + g,
                    c = col0 + wn * (BN / 4) + ni * 8 + t * 2;
      Epilogue::pair<float>(p, r, c, acc[mi][ni][0], acc[mi][ni][1]);
      Epilogue::pair<float>(p, r + 8, c, acc[mi][ni][2], acc[mi][ni][3]);
    }
}

template <int BM, int BN, int STAGES, bool AK, bool BNM>
cudaError_t launch_tf32(const GemmPlan& plan, const GemmProblem& p, cudaStream_t stream) {
  constexpr int smem = STAGES * Tf32Smem<BM, BN, AK, BNM>::kStageFloats * 4;
  return launch_blocks(sgemm_tf32<BM, BN, STAGES, AK, BNM>, plan.grid, kTf32Threads, smem, stream,
                       p);
}

}  // namespace

cudaError_t launch_gemm_mma_tf32(const GemmPlan& plan, const GemmProblem& p, cudaStream_t stream) {
  return with_layouts(plan.a_kmajor, plan.b_nmajor, [&](auto ak, auto bn) {
    constexpr bool AK = decltype(ak)::value, BNM = decltype(bn)::value;
    if (plan.tiled().bm == 128 && plan.tiled().bn == 128)
      return launch_tf32<128, 128, 3, AK, BNM>(plan, p, stream);
    if (plan.tiled().bm == 64 && plan.tiled().bn == 128)
      return launch_tf32<64, 128, 3, AK, BNM>(plan, p, stream);
    return cudaErrorInvalidValue;
  });
}

}  // namespace cuops::kernels::detail
