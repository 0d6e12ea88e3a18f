// Hopper GEMM (sm_90a): operands brought in by the bulk tensor copy engine (TMA) into 128-byte
// swizzled shared memory over a multi-stage mbarrier ring, multiplied by wgmma with float32
// accumulators. Warp-specialised: warpgroup 0 is the producer (one thread issues the copies; the
// group gives its registers to the others with setmaxnreg), warpgroups 1 and 2 each compute 64 rows
// of the 128 x BN block tile. Persistent: one block per SM walks the tiles in grouped order, so the
// producer already fills the ring for the next tile while the consumers run the epilogue.
// bfloat16 / float16 take all four layouts (wgmma transposes m-major A and n-major B itself); float32
// runs as TF32 (torch's "high" precision), which wgmma reads k-major only, so it takes row-major a
// with transposed b. The epilogue applies alpha/beta and rounds once to the output type.
// Built only for compute_90a (CMake defines CUOPS_WGMMA_BUILD there); elsewhere the launcher
// reports cudaErrorNotSupported and the dispatcher uses the portable kernels.
#include "gemm.cuh"

#if CUOPS_WGMMA_BUILD
#include <cudaTypedefs.h>

#include <atomic>

#include "wgmma.cuh"
#endif

namespace cuops::kernels::detail {

#if !CUOPS_WGMMA_BUILD

cudaError_t launch_gemm_wgmma(DType, const GemmProblem&, bool, bool, cudaStream_t) { return cudaErrorNotSupported; }
}  // namespace cuops::kernels::detail
namespace cuops::kernels {
bool gemm_tf32_wants_kmajor() { return false; }
}  // namespace cuops::kernels
namespace cuops::kernels::detail {

#else

namespace {

constexpr int kWgThreads = 384, kWgBM = 128;
constexpr int kProducerRegs = 40, kConsumerRegs = 232;  // 128 * 40 + 256 * 232 <= 65536

// Geometry of one ring stage: A 128 x BK and B BN x BK, BK = one 128-byte swizzle row of k. Each
// operand is a set of boxes of 64 rows (or its whole k-major extent) that TMA writes with the
// 128-byte swizzle wgmma's descriptors name; every box starts 1024-byte aligned.
template <typename T, int BN> struct WgCfg {
  static constexpr int kBK = 128 / static_cast<int>(sizeof(T));
  static constexpr int kABytes = kWgBM * 128, kBBytes = BN * 128;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kStages = (200 * 1024) / kStageBytes;  // 4 stages of 48 KiB, 6 of 32 KiB
  static constexpr int kSmem = kStages * kStageBytes + 1024 + 2 * kStages * 8;  // + alignment, barriers
};

template <typename T, int BN, bool AK, bool BNM>
__global__ void __launch_bounds__(kWgThreads, 1)
    gemm_wgmma(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
               const GemmProblem p) {
  using Cfg = WgCfg<T, BN>;
  constexpr int kStages = Cfg::kStages, kBK = Cfg::kBK;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* base =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  uint64_t* full = reinterpret_cast<uint64_t*>(base + kStages * Cfg::kStageBytes);
  uint64_t* empty = full + kStages;
  const int64_t tiles_m = (p.m + kWgBM - 1) / kWgBM, tiles_n = (p.n + BN - 1) / BN;
  const int64_t tiles = tiles_m * tiles_n;
  const int ktiles = static_cast<int>((p.k + kBK - 1) / kBK);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      wg::mbar_init(&full[s], 1);   // the producer's expect_tx arrival, plus the bytes
      wg::mbar_init(&empty[s], 2);  // one arrival per consumer warpgroup
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (threadIdx.x < 128) {
    wg::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0) {
      uint32_t it = 0;  // k-tiles issued so far, over all of this block's tiles: the ring position
      for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        int64_t tm, tn;
        tile_coords<8>(tile, tiles_m, tiles_n, tm, tn);
        const int row0 = static_cast<int>(tm * kWgBM), col0 = static_cast<int>(tn * BN);
        for (int kt = 0; kt < ktiles; ++kt, ++it) {
          const int s = static_cast<int>(it % kStages);
          if (it >= kStages) wg::mbar_wait(&empty[s], ((it / kStages) - 1) & 1);
          unsigned char* sa = base + s * Cfg::kStageBytes;
          unsigned char* sb = sa + Cfg::kABytes;
          wg::mbar_expect_tx(&full[s], Cfg::kStageBytes);
          const int k0 = kt * kBK;
          if constexpr (AK) {
            wg::tma_load(sa, &map_a, k0, row0, &full[s]);
          } else {  // boxes of 64 m x 64 k, one per consumer
            wg::tma_load(sa, &map_a, row0, k0, &full[s]);
            wg::tma_load(sa + 8192, &map_a, row0 + 64, k0, &full[s]);
          }
          if constexpr (BNM) {  // boxes of 64 n x 64 k, 8 KiB apart
#pragma unroll
            for (int i = 0; i < BN / 64; ++i) wg::tma_load(sb + i * 8192, &map_b, col0 + 64 * i, k0, &full[s]);
          } else {
            wg::tma_load(sb, &map_b, k0, col0, &full[s]);
          }
        }
      }
    }
  } else {
    wg::setmaxnreg_inc<kConsumerRegs>();
    const int cw = threadIdx.x / 128 - 1;  // this consumer's 64 rows of the block tile
    const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    uint32_t it = 0;
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      int64_t tm, tn;
      tile_coords<8>(tile, tiles_m, tiles_n, tm, tn);
      float d[BN / 2];
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) d[i] = 0.f;
      for (int kt = 0; kt < ktiles; ++kt, ++it) {
        const int s = static_cast<int>(it % kStages);
        wg::mbar_wait(&full[s], (it / kStages) & 1);
        const unsigned char* sa = base + s * Cfg::kStageBytes + cw * 8192;
        const unsigned char* sb = base + s * Cfg::kStageBytes + Cfg::kABytes;
        wg::fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          // One instruction k-step is 32 bytes of k: 32 bytes along a k-major row (the swizzle is
          // applied by the hardware on the address), 16 rows of 128 bytes in an m/n-major box.
          // m/n-major: 64-element core-matrix columns 8 KiB apart (the boxes), 8-row groups 1 KiB.
          const uint64_t da = AK ? wg::make_desc(sa + kk * 32, 16, 1024) : wg::make_desc(sa + kk * 2048, 8192, 1024);
          const uint64_t db = BNM ? wg::make_desc(sb + kk * 2048, 8192, 1024) : wg::make_desc(sb + kk * 32, 16, 1024);
          wg::mma<T, BN, AK ? 0 : 1, BNM ? 1 : 0>(d, da, db);
        }
        wg::commit();
        // The group before this one is done: its stage goes back to the producer. One group stays
        // in flight so the tensor cores never wait on this thread.
        wg::wait<1>();
        if (kt > 0 && tid == 0) wg::mbar_arrive(&empty[(it - 1) % kStages]);
      }
      wg::wait<0>();
      if (ktiles > 0 && tid == 0) wg::mbar_arrive(&empty[(it - 1) % kStages]);

      // Accumulator fragment of m64nN: warp w holds rows 16w .. 16w + 15; registers 4j, 4j + 1 are
      // (row lane / 4, columns 8j + 2 (lane % 4) + {0, 1}), 4j + 2, 4j + 3 the same 8 rows lower.
      const int64_t r = tm * kWgBM + cw * 64 + warp * 16 + lane / 4;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        const int64_t c = tn * BN + j * 8 + 2 * (lane % 4);
        store_pair_t<T>(p, r, c, d[4 * j], d[4 * j + 1]);
        store_pair_t<T>(p, r + 8, c, d[4 * j + 2], d[4 * j + 3]);
      }
    }
  }
}

// ---- host side

using EncodeTiled = PFN_cuTensorMapEncodeTiled_v12000;

// The driver's tensor-map encoder, through the runtime (no link against libcuda); null if absent.
EncodeTiled encoder() {
  static const EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      f = nullptr;
    }
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

template <typename T> constexpr CUtensorMapDataType tma_dtype() {
  if constexpr (std::is_same_v<T, float>) return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
}

// Tensor map of a row-major [outer, inner] operand with leading stride ld (elements), read in boxes
// of [box_outer, box_inner] with the 128-byte swizzle. false where TMA cannot describe it (a stride
// of 0 on an expanded view, sizes past its 32-bit coordinates).
template <typename T>
bool make_map(CUtensorMap& map, const void* ptr, int64_t inner, int64_t outer, int64_t ld, uint32_t box_inner,
              uint32_t box_outer) {
  constexpr int64_t kElem = sizeof(T);
  if (outer == 1) ld = (inner * kElem + 15) / 16 * 16 / kElem;  // never used; TMA wants a valid stride
  if (ld < inner || inner > INT32_MAX || outer > INT32_MAX) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(outer)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld * kElem)};
  const cuuint32_t box[2] = {box_inner, box_outer};
  const cuuint32_t elem_strides[2] = {1, 1};
  return encoder()(&map, tma_dtype<T>(), 2, const_cast<void*>(ptr), dims, strides, box, elem_strides,
                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Per device: whether this library's sm_90a code runs there (compute capability exactly 9.0, the
// kernel image loads, the driver has the encoder), and its SM count. Settled on first use.
struct DeviceInfo {
  std::atomic<int> state{0};  // 0 unknown, 1 yes, -1 no
  std::atomic<int> sms{0};
};
constexpr int kMaxDevices = 64;
DeviceInfo g_devices[kMaxDevices];

template <typename T, int BN, bool AK, bool BNM> cudaError_t set_smem() {
  return cudaFuncSetAttribute(gemm_wgmma<T, BN, AK, BNM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              WgCfg<T, BN>::kSmem);
}

bool device_takes_wgmma(int& sms) {
  // Read once: lets a test (or a user chasing a numerics question) run the portable kernels on Hopper.
  static const bool disabled = std::getenv("CUOPS_DISABLE_WGMMA") != nullptr;
  if (disabled) return false;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) {
    (void)cudaGetLastError();
    return false;
  }
  DeviceInfo& info = g_devices[dev];
  int state = info.state.load(std::memory_order_acquire);
  if (state == 0) {
    int major = 0, minor = 0, count = 0;
    bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
              cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
              cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && major == 9 &&
              minor == 0 && encoder() != nullptr;
    cudaFuncAttributes attr{};
    ok = ok && cudaFuncGetAttributes(&attr, gemm_wgmma<__nv_bfloat16, 128, true, true>) == cudaSuccess;
    (void)cudaGetLastError();  // a missing image is an answer here, not an error for the next launch
    info.sms.store(count, std::memory_order_relaxed);
    state = ok ? 1 : -1;
    info.state.store(state, std::memory_order_release);
  }
  sms = info.sms.load(std::memory_order_relaxed);
  return state == 1;
}

template <typename T, int BN, bool AK, bool BNM> cudaError_t launch_wg(const GemmProblem& p, int sms, cudaStream_t stream) {
  using Cfg = WgCfg<T, BN>;
  CUtensorMap ma, mb;
  const bool maps = (AK ? make_map<T>(ma, p.a, p.k, p.m, p.lda, Cfg::kBK, kWgBM)
                        : make_map<T>(ma, p.a, p.m, p.k, p.lda, 64, Cfg::kBK)) &&
                    (BNM ? make_map<T>(mb, p.b, p.n, p.k, p.ldb, 64, Cfg::kBK)
                         : make_map<T>(mb, p.b, p.k, p.n, p.ldb, Cfg::kBK, BN));
  if (!maps) return cudaErrorNotSupported;
  cudaError_t err = set_smem<T, BN, AK, BNM>();
  if (err != cudaSuccess) return err;
  const int64_t tiles = ((p.m + kWgBM - 1) / kWgBM) * ((p.n + BN - 1) / BN);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(tiles, sms));
  gemm_wgmma<T, BN, AK, BNM><<<grid, kWgThreads, Cfg::kSmem, stream>>>(ma, mb, p);
  return cudaGetLastError();
}

template <typename T, int BN>
cudaError_t launch_wg_layout(const GemmProblem& p, bool a_kmajor, bool b_nmajor, int sms, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, float>) {
    if (!a_kmajor || b_nmajor) return cudaErrorNotSupported;
    return launch_wg<T, BN, true, false>(p, sms, stream);
  } else {
    if (a_kmajor && b_nmajor) return launch_wg<T, BN, true, true>(p, sms, stream);
    if (a_kmajor) return launch_wg<T, BN, true, false>(p, sms, stream);
    if (b_nmajor) return launch_wg<T, BN, false, true>(p, sms, stream);
    return launch_wg<T, BN, false, false>(p, sms, stream);
  }
}

template <typename T> cudaError_t launch_wg_dtype(const GemmProblem& p, bool a_kmajor, bool b_nmajor, int sms,
                                                  cudaStream_t stream) {
  if (p.m > INT32_MAX || p.n > INT32_MAX || p.k > INT32_MAX) return cudaErrorNotSupported;
  // 128 x 256 tiles where they fill every SM at least once; 128 x 128 below that.
  const int64_t wide_tiles = ((p.m + kWgBM - 1) / kWgBM) * ((p.n + 255) / 256);
  if (wide_tiles >= sms) return launch_wg_layout<T, 256>(p, a_kmajor, b_nmajor, sms, stream);
  return launch_wg_layout<T, 128>(p, a_kmajor, b_nmajor, sms, stream);
}

}  // namespace

// Sweeps (bench/sweep) call the tile sizes directly.
template <typename T, int BN>
cudaError_t launch_gemm_wgmma_tile(const GemmProblem& p, bool a_kmajor, bool b_nmajor, cudaStream_t stream) {
  int sms = 0;
  if (!device_takes_wgmma(sms)) return cudaErrorNotSupported;
  return launch_wg_layout<T, BN>(p, a_kmajor, b_nmajor, sms, stream);
}

cudaError_t launch_gemm_wgmma(DType dtype, const GemmProblem& p, bool a_kmajor, bool b_nmajor, cudaStream_t stream) {
  int sms = 0;
  if (!device_takes_wgmma(sms)) return cudaErrorNotSupported;
  switch (dtype) {
    case DType::BFloat16: return launch_wg_dtype<__nv_bfloat16>(p, a_kmajor, b_nmajor, sms, stream);
    case DType::Float16: return launch_wg_dtype<__half>(p, a_kmajor, b_nmajor, sms, stream);
    case DType::Float32: return launch_wg_dtype<float>(p, a_kmajor, b_nmajor, sms, stream);
    default: return cudaErrorNotSupported;
  }
}

}  // namespace cuops::kernels::detail

namespace cuops::kernels {
bool gemm_tf32_wants_kmajor() {
  int sms = 0;
  return detail::device_takes_wgmma(sms);
}
}  // namespace cuops::kernels

namespace cuops::kernels::detail {
#endif  // CUOPS_WGMMA_BUILD

}  // namespace cuops::kernels::detail
