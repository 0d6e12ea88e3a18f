// Design sweep for the float32 / TF32 GEMM of issue 7 (not part of the library or the tests): candidate
// kernels, each checked against cuBLAS on the same inputs and timed beside it, so one device call
// says which shapes to build into kernels/gemm.cu. Row-major C[M,N] = A[M,K] @ B[K,N].
//   nvcc -O3 -std=c++17 -arch=sm_90 bench/sweep/gemm_sweep.cu -lcublas -o gemm_sweep && ./gemm_sweep
// Status: written without a GPU at hand (session 2 had spent its device time); compiled, not yet run.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <vector>

#include "sweep_gemm_util.cuh"

namespace cuops::sweep {

// ---- SIMT float32: BM x BN x 8 tiles, 256 threads, each an (BM/16) x (BN/16) register block split in
// two halves BM/2 apart (rows) and BN/2 apart (columns), so a warp's float4 shared-memory reads are
// contiguous (no bank conflicts). A is stored transposed in shared memory (As[k][m]). Two buffers:
// the next tile is fetched into registers while the current one is multiplied.
template <int BM, int BN>
__global__ void __launch_bounds__(256) sgemm_simt(int M, int N, int K, const float* __restrict__ A,
                                                  const float* __restrict__ B, float* __restrict__ C) {
  constexpr int BK = 8, TM = BM / 16, TN = BN / 16;
  __shared__ __align__(16) float As[2][BK][BM];
  __shared__ __align__(16) float Bs[2][BK][BN];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int64_t row0 = int64_t(blockIdx.y) * BM, col0 = int64_t(blockIdx.x) * BN;
  // Global -> shared assignment: A tile BM x 8 (float4 along k), B tile 8 x BN (float4 along n).
  constexpr int A_LOADS = BM * BK / 4 / 256, B_LOADS = BN * BK / 4 / 256;
  float4 ra[A_LOADS], rb[B_LOADS];
  auto fetch = [&](int k0) {
#pragma unroll
    for (int i = 0; i < A_LOADS; ++i) {
      const int idx = tid + i * 256, r = idx / 2, c = (idx % 2) * 4;
      ra[i] = *reinterpret_cast<const float4*>(A + (row0 + r) * K + k0 + c);
    }
#pragma unroll
    for (int i = 0; i < B_LOADS; ++i) {
      const int idx = tid + i * 256, r = idx / (BN / 4), c = (idx % (BN / 4)) * 4;
      rb[i] = *reinterpret_cast<const float4*>(B + int64_t(k0 + r) * N + col0 + c);
    }
  };
  auto stash = [&](int buf) {
#pragma unroll
    for (int i = 0; i < A_LOADS; ++i) {
      const int idx = tid + i * 256, r = idx / 2, c = (idx % 2) * 4;
      As[buf][c + 0][r] = ra[i].x;
      As[buf][c + 1][r] = ra[i].y;
      As[buf][c + 2][r] = ra[i].z;
      As[buf][c + 3][r] = ra[i].w;
    }
#pragma unroll
    for (int i = 0; i < B_LOADS; ++i) {
      const int idx = tid + i * 256, r = idx / (BN / 4), c = (idx % (BN / 4)) * 4;
      *reinterpret_cast<float4*>(&Bs[buf][r][c]) = rb[i];
    }
  };
  float acc[TM][TN] = {};
  fetch(0);
  stash(0);
  __syncthreads();
  int buf = 0;
  for (int k0 = 0; k0 < K; k0 += BK) {
    const bool more = k0 + BK < K;
    if (more) fetch(k0 + BK);
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      float a[TM], b[TN];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int q = 0; q < TM / 2; q += 4)
          *reinterpret_cast<float4*>(&a[h * TM / 2 + q]) =
              *reinterpret_cast<const float4*>(&As[buf][k][h * BM / 2 + ty * TM / 2 + q]);
#pragma unroll
        for (int q = 0; q < TN / 2; q += 4)
          *reinterpret_cast<float4*>(&b[h * TN / 2 + q]) =
              *reinterpret_cast<const float4*>(&Bs[buf][k][h * BN / 2 + tx * TN / 2 + q]);
      }
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    if (more) {
      stash(buf ^ 1);
      __syncthreads();
      buf ^= 1;
    }
  }
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int64_t r = row0 + (i / (TM / 2)) * (BM / 2) + ty * (TM / 2) + i % (TM / 2);
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int q = 0; q < TN / 2; q += 4) {
        const int64_t c = col0 + h * BN / 2 + tx * TN / 2 + q;
        *reinterpret_cast<float4*>(C + r * N + c) =
            make_float4(acc[i][h * TN / 2 + q], acc[i][h * TN / 2 + q + 1], acc[i][h * TN / 2 + q + 2],
                        acc[i][h * TN / 2 + q + 3]);
      }
  }
}

// ---- TF32 tensor cores: mma.sync m16n8k8, 128 x 128 x 32 block tiles, 8 warps of 64 x 32, operands
// brought in by cp.async over STAGES shared-memory stages. Shared rows are padded (A: 36 floats,
// B: 136) so the fragment reads of a warp hit 32 different banks.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(smem)), "l"(gmem));
}
__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

template <int STAGES>
__global__ void __launch_bounds__(256) tf32_mma(int M, int N, int K, const float* __restrict__ A,
                                                const float* __restrict__ B, float* __restrict__ C) {
  constexpr int BM = 128, BN = 128, BK = 32, AP = BK + 4, BP = BN + 8;
  extern __shared__ __align__(16) float smem[];
  float* As = smem;                        // [STAGES][BM][AP]
  float* Bs = smem + STAGES * BM * AP;     // [STAGES][BK][BP]
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / 4, wn = warp % 4;  // warp tile: rows wm*64, cols wn*32
  const int g = lane / 4, t = lane % 4;
  const int64_t row0 = int64_t(blockIdx.y) * BM, col0 = int64_t(blockIdx.x) * BN;
  const int ktiles = K / BK;

  auto load_stage = [&](int stage, int kt) {
    const int k0 = kt * BK;
    float* as = As + stage * BM * AP;
    float* bs = Bs + stage * BK * BP;
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // A: 128 rows x 8 float4
      const int idx = tid + i * 256, r = idx / 8, c = (idx % 8) * 4;
      cp_async16(as + r * AP + c, A + (row0 + r) * K + k0 + c);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // B: 32 rows x 32 float4
      const int idx = tid + i * 256, r = idx / 32, c = (idx % 32) * 4;
      cp_async16(bs + r * BP + c, B + int64_t(k0 + r) * N + col0 + c);
    }
  };

  float acc[4][4][4] = {};  // [m16 tile][n8 tile][fragment]
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ktiles) load_stage(s, s);
    asm volatile("cp.async.commit_group;\n" ::);
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2));
    __syncthreads();
    // Refill the stage freed last iteration while this one is multiplied.
    if (kt + STAGES - 1 < ktiles) load_stage((kt + STAGES - 1) % STAGES, kt + STAGES - 1);
    asm volatile("cp.async.commit_group;\n" ::);
    const float* as = As + (kt % STAGES) * BM * AP;
    const float* bs = Bs + (kt % STAGES) * BK * BP;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 8) {
      uint32_t af[4][4], bf[4][2];
#pragma unroll
      for (int mi = 0; mi < 4; ++mi) {
        const float* p = as + (wm * 64 + mi * 16 + g) * AP + kk + t;
        af[mi][0] = to_tf32(p[0]);
        af[mi][1] = to_tf32(p[8 * AP]);
        af[mi][2] = to_tf32(p[4]);
        af[mi][3] = to_tf32(p[8 * AP + 4]);
      }
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
        const float* p = bs + (kk + t) * BP + wn * 32 + ni * 8 + g;
        bf[ni][0] = to_tf32(p[0]);
        bf[ni][1] = to_tf32(p[4 * BP]);
      }
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
          float* d = acc[mi][ni];
          asm volatile(
              "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
              "{%0,%1,%2,%3};\n"
              : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
              : "r"(af[mi][0]), "r"(af[mi][1]), "r"(af[mi][2]), "r"(af[mi][3]), "r"(bf[ni][0]), "r"(bf[ni][1]));
        }
    }
  }
  asm volatile("cp.async.wait_group 0;\n" ::);
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
      const int64_t r = row0 + wm * 64 + mi * 16 + g, c = col0 + wn * 32 + ni * 8 + t * 2;
      *reinterpret_cast<float2*>(C + r * N + c) = make_float2(acc[mi][ni][0], acc[mi][ni][1]);
      *reinterpret_cast<float2*>(C + (r + 8) * N + c) = make_float2(acc[mi][ni][2], acc[mi][ni][3]);
    }
}

}  // namespace cuops::sweep

using namespace cuops::sweep;

int main() {
  cublasHandle_t h;
  CB(cublasCreate(&h));
  for (int S : {1024, 4096, 8192}) {
    const int M = S, N = S, K = S;
    float *A, *B, *C, *R;
    CK(cudaMalloc(&A, int64_t(M) * K * 4));
    CK(cudaMalloc(&B, int64_t(K) * N * 4));
    CK(cudaMalloc(&C, int64_t(M) * N * 4));
    CK(cudaMalloc(&R, int64_t(M) * N * 4));
    fill_uniform<<<1024, 256>>>(A, int64_t(M) * K, 1);
    fill_uniform<<<1024, 256>>>(B, int64_t(K) * N, 2);
    const double flops = 2.0 * M * N * K;
    const int reps = S >= 8192 ? 10 : 30;
    const float one = 1, zero = 0;
    auto cublas = [&] { CB(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, B, N, A, K, &zero, R, N)); };
    for (bool tf32 : {false, true}) {
      CB(cublasSetMathMode(h, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
      const float tb = median_ms(cublas, reps);
      printf("\n== %d^3 %s: cuBLAS %.3f ms, %.1f TFLOP/s\n", S, tf32 ? "TF32" : "FP32", tb, flops / tb / 1e9);
      auto report = [&](const char* name, const std::function<void()>& f) {
        CK(cudaMemset(C, 0xff, int64_t(M) * N * 4));  // NaN poison: an unwritten element shows
        f();
        CK(cudaDeviceSynchronize());
        const double err = rel_err(C, R, int64_t(M) * N);
        const float t = median_ms(f, reps);
        printf("%-34s %8.3f ms %6.1f TFLOP/s %6.3fx cuBLAS  max rel err vs cuBLAS %.2e\n", name, t,
               flops / t / 1e9, tb / t, err);
      };
      if (!tf32) {
        report("simt 128x128x8 (8x8/thread)", [&] {
          sgemm_simt<128, 128><<<dim3(N / 128, M / 128), 256>>>(M, N, K, A, B, C);
        });
        report("simt 128x256x8 (8x16/thread)", [&] {
          sgemm_simt<128, 256><<<dim3(N / 256, M / 128), 256>>>(M, N, K, A, B, C);
        });
        report("simt 256x128x8 (16x8/thread)", [&] {
          sgemm_simt<256, 128><<<dim3(N / 128, M / 256), 256>>>(M, N, K, A, B, C);
        });
      } else {
        for (int stages : {3, 4}) {
          const int smem = stages * (128 * 36 + 32 * 136) * 4;
          auto kern = stages == 3 ? tf32_mma<3> : tf32_mma<4>;
          CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
          char name[64];
          snprintf(name, sizeof name, "tf32 mma 128x128x32, %d stages", stages);
          report(name, [&] { kern<<<dim3(N / 128, M / 128), 256, smem>>>(M, N, K, A, B, C); });
        }
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
