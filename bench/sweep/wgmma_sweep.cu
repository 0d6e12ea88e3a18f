// Draft for issue 8 (bf16 GEMM on Hopper): a TMA + wgmma kernel, checked against cuBLAS and timed
// beside it. Not part of the library or the tests.
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Iinclude bench/sweep/wgmma_sweep.cu -lcublas -o wg && ./wg
// Status (session 3): written after the session's device time was spent; compiles, NEVER RUN. The
// run answers three questions before any of it moves into kernels/: (1) is it correct for an n-major
// B (row-major b, the common case), and which leading/stride byte-offset assignment of the
// descriptor is the right one there (both are tried; the PTX ISA's "matrix descriptor" section
// decides, and the check against cuBLAS says which the hardware agrees with); (2) is it correct for
// a k-major B (b.t()); (3) how fast is this first shape (no warp-specialised register split, no
// persistent scheduler, no cluster multicast, one wgmma group in flight) against cuBLAS.
//
// Shape: block tile 128 x 128 x 64, 4-stage ring of TMA loads (128-byte swizzle) guarded by
// full/empty mbarriers; warpgroup 0 produces (one thread issues the copies), warpgroups 1 and 2 each
// compute 64 rows with wgmma m64n128k16 (float32 accumulators) and release each stage after use.
#include <cublas_v2.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "../../kernels/wgmma.cuh"
#include "sweep_gemm_util.cuh"


namespace {

constexpr int BM = 128, BN = 128, BK = 64, STAGES = 4, THREADS = 384;
constexpr int A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2;

// The primitives (mbarriers, TMA, descriptors, wgmma) are the library's own (kernels/wgmma.cuh).
using namespace cuops::kernels::detail::wg;
template <int kTransB> __device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t da, uint64_t db) {
  mma<__nv_bfloat16, 128, 0, kTransB>(d, da, db);
}

// C[M, N] (row-major bf16) = A[M, K] (row-major) @ B, B n-major (row-major [K, N]) or k-major
// ([N, K] row-major, i.e. b.t()). M, N multiples of 128 here (the sweep's sizes); K tails come back
// zero-filled from TMA. lbo/sbo: the n-major B descriptor's byte offsets (the draft tries both).
template <bool kBNMajor>
__global__ void __launch_bounds__(THREADS) wgmma_gemm(const __grid_constant__ CUtensorMap map_a,
                                                      const __grid_constant__ CUtensorMap map_b, __nv_bfloat16* C,
                                                      int M, int N, int K, uint32_t lbo, uint32_t sbo) {
  extern __shared__ unsigned char raw[];
  unsigned char* base = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  unsigned char* sA = base;
  unsigned char* sB = base + STAGES * A_BYTES;
  uint64_t* full = reinterpret_cast<uint64_t*>(sB + STAGES * B_BYTES);
  uint64_t* empty = full + STAGES;
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  const int tiles_n = N / BN;
  const int row0 = (blockIdx.x / tiles_n) * BM, col0 = (blockIdx.x % tiles_n) * BN;
  const int ktiles = (K + BK - 1) / BK;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 2);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    if (tid == 0) {
      for (int kt = 0; kt < ktiles; ++kt) {
        const int s = kt % STAGES;
        if (kt >= STAGES) mbar_wait(&empty[s], ((kt / STAGES) - 1) & 1);
        mbar_expect_tx(&full[s], A_BYTES + B_BYTES);
        tma_load(sA + s * A_BYTES, &map_a, kt * BK, row0, &full[s]);
        if constexpr (kBNMajor) {
          // Two 64(n) x 64(k) boxes, 8 KiB apart: each row of the box is 64 n of one k (128 bytes).
          tma_load(sB + s * B_BYTES, &map_b, col0, kt * BK, &full[s]);
          tma_load(sB + s * B_BYTES + B_BYTES / 2, &map_b, col0 + 64, kt * BK, &full[s]);
        } else {
          tma_load(sB + s * B_BYTES, &map_b, kt * BK, col0, &full[s]);
        }
      }
    }
    return;
  }

  float d[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) d[i] = 0.f;
  const int m_off = (wg - 1) * 64;
  for (int kt = 0; kt < ktiles; ++kt) {
    const int s = kt % STAGES;
    mbar_wait(&full[s], (kt / STAGES) & 1);
    fence();
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      // A k-major: rows of 128 bytes, 8-row swizzle atoms 1024 bytes apart; k16 step = 32 bytes.
      const uint64_t da = make_desc(sA + s * A_BYTES + m_off * 128 + kk * 32, 16, 1024);
      if constexpr (kBNMajor) {
        // n-major: k16 step = 16 rows of 128 bytes; 64-n atoms 8 KiB apart, 8-k atoms 1 KiB apart.
        const uint64_t db = make_desc(sB + s * B_BYTES + kk * 2048, lbo, sbo);
        wgmma_m64n128k16<1>(d, da, db);
      } else {
        const uint64_t db = make_desc(sB + s * B_BYTES + kk * 32, 16, 1024);
        wgmma_m64n128k16<0>(d, da, db);
      }
    }
    commit();
    wait<0>();
    if (tid == 0) mbar_arrive(&empty[s]);
  }

  // Accumulator fragment of m64nN: warp w of the group holds rows 16w..16w+15; register 4j+{0,1} is
  // (row lane/4, columns 8j + 2(lane%4) + {0,1}), 4j+{2,3} the same 8 rows further down.
  const int warp = tid / 32, lane = tid % 32;
  const int r = row0 + m_off + warp * 16 + lane / 4;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int c = col0 + j * 8 + 2 * (lane % 4);
    *reinterpret_cast<__nv_bfloat162*>(C + int64_t(r) * N + c) = __floats2bfloat162_rn(d[4 * j], d[4 * j + 1]);
    *reinterpret_cast<__nv_bfloat162*>(C + int64_t(r + 8) * N + c) =
        __floats2bfloat162_rn(d[4 * j + 2], d[4 * j + 3]);
  }
}

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
  if (!fn || q != cudaDriverEntryPointSuccess) {
    printf("cuTensorMapEncodeTiled not found\n");
    exit(1);
  }
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
}

// Row-major [rows, cols] bf16 matrix, box [box_rows, box_cols] (cols innermost), 128-byte swizzle.
CUtensorMap make_map(const void* p, uint64_t rows, uint64_t cols, uint32_t box_rows, uint32_t box_cols) {
  CUtensorMap m;
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {cols * 2};
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t estr[2] = {1, 1};
  const CUresult r = encode_fn()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(p), dims, strides, box,
                                 estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    printf("cuTensorMapEncodeTiled failed: %d\n", (int)r);
    exit(1);
  }
  return m;
}

}  // namespace

int main() {
  cublasHandle_t h;
  CB(cublasCreate(&h));
  const int smem = STAGES * (A_BYTES + B_BYTES) + 2 * STAGES * 8 + 1024;
  CK(cudaFuncSetAttribute(wgmma_gemm<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CK(cudaFuncSetAttribute(wgmma_gemm<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  for (int S : {1024, 4096, 8192}) {
    const int M = S, N = S, K = S;
    __nv_bfloat16 *A, *B, *C, *R;
    CK(cudaMalloc(&A, int64_t(M) * K * 2));
    CK(cudaMalloc(&B, int64_t(K) * N * 2));
    CK(cudaMalloc(&C, int64_t(M) * N * 2));
    CK(cudaMalloc(&R, int64_t(M) * N * 2));
    fill_uniform<<<1024, 256>>>(A, int64_t(M) * K, 1);
    fill_uniform<<<1024, 256>>>(B, int64_t(K) * N, 2);
    const double flops = 2.0 * M * N * K;
    const int reps = S >= 8192 ? 10 : 30;
    const float one = 1, zero = 0;
    const CUtensorMap map_a = make_map(A, M, K, BM, BK);
    for (bool b_nmajor : {true, false}) {
      // Same B memory read two ways: row-major [K, N] (n-major) or as b.t() of a row-major [N, K].
      auto cublas = [&] {
        CB(cublasGemmEx(h, b_nmajor ? CUBLAS_OP_N : CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, B, CUDA_R_16BF,
                        b_nmajor ? N : K, A, CUDA_R_16BF, K, &zero, R, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT));
      };
      const float tb = median_ms(cublas, reps);
      printf("\n== %d^3 bf16, B %s: cuBLAS %.3f ms, %.1f TFLOP/s\n", S, b_nmajor ? "n-major" : "k-major", tb,
             flops / tb / 1e9);
      const CUtensorMap map_b = b_nmajor ? make_map(B, K, N, BK, 64) : make_map(B, N, K, BN, BK);
      const int variants = b_nmajor ? 2 : 1;
      for (int v = 0; v < variants; ++v) {
        const uint32_t lbo = v == 0 ? 8192 : 1024, sbo = v == 0 ? 1024 : 8192;
        auto run = [&] {
          if (b_nmajor) wgmma_gemm<true><<<(M / BM) * (N / BN), THREADS, smem>>>(map_a, map_b, C, M, N, K, lbo, sbo);
          else wgmma_gemm<false><<<(M / BM) * (N / BN), THREADS, smem>>>(map_a, map_b, C, M, N, K, lbo, sbo);
        };
        CK(cudaMemset(C, 0xff, int64_t(M) * N * 2));
        run();
        const cudaError_t e = cudaDeviceSynchronize();
        if (e != cudaSuccess) {
          printf("wgmma v%d (lbo %u, sbo %u): %s\n", v, lbo, sbo, cudaGetErrorString(e));
          return 1;
        }
        const double err = rel_err(C, R, int64_t(M) * N);
        const float t = median_ms(run, reps);
        printf("wgmma 128x128x64, 4 stages, lbo %5u sbo %5u %8.3f ms %6.1f TFLOP/s %6.3fx cuBLAS  max rel err %.2e%s\n",
               lbo, sbo, t, flops / t / 1e9, tb / t, err, err < 2e-2 ? "" : "  WRONG");
      }
    }
    CK(cudaFree(A));
    CK(cudaFree(B));
    CK(cudaFree(C));
    CK(cudaFree(R));
  }
  CB(cublasDestroy(h));
  return 0;
}
