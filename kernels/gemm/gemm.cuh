// Shared by the GEMM translation units: the block-tile order, operand staging by cp.async, the split
// planes' sum, and the per-family launchers that kernels/gemm/gemm.cu's launch_gemm calls as the plan
// (gemm_plan.h) says. The canonical problem the fast kernels see is gemm_problem.h's GemmProblem,
// the epilogue that stores their results epilogue.cuh's Epilogue.
#pragma once

#include "kernels/common.cuh"
#include "epilogue.cuh"
#include "gemm_plan.h"
#include "gemm_problem.h"
#include "tile_order.h"

namespace cuops::kernels::detail {

// tile_coords (tile_order.h) of this block's linear id.
template <int kGroup> __device__ __forceinline__ void tile_coords(int64_t tiles_m, int64_t tiles_n,
                                                                  int64_t& tm, int64_t& tn) {
  tile_coords<kGroup>(blockIdx.x, tiles_m, tiles_n, tm, tn);
}

// 16-byte asynchronous global -> shared copy (`bytes` 16; see copy_chunk for why never less).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(bytes));
}
// One 16-byte chunk of elements of size kElem into shared memory, `valid` (0 .. 16 / kElem) of them
// read from gmem and the rest zero: a whole chunk by cp.async; a partial or empty one (only at the
// edges) by plain loads and one shared store. cp.async's own zero-fill (source size < 16) is not
// used: compute-sanitizer counts it as a 16-byte read, out of bounds on a 2-byte tensor.
template <int kElem>
__device__ __forceinline__ void copy_chunk(void* smem, const void* gmem, int valid) {
  constexpr int kPer = 16 / kElem;
  if (valid == kPer) {
    cp_async16(smem, gmem, 16);
    return;
  }
  using R =
      std::conditional_t<kElem == 8, uint64_t, std::conditional_t<kElem == 4, uint32_t, uint16_t>>;
  R e[kPer];
  const R* src = static_cast<const R*>(gmem);
#pragma unroll
  for (int i = 0; i < kPer; ++i) e[i] = i < valid ? src[i] : R(0);
  uint4 v;
  __builtin_memcpy(&v, e, 16);
  *static_cast<uint4*>(smem) = v;
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// The mma.sync kernels' cp.async ring over `ktiles` k-slices of STAGES stages: load(stage, kt) stages
// slice kt, compute(kt) multiplies slice kt (in stage kt % STAGES). The slice everyone finished with at the
// last trip (the barrier) is refilled while this one is multiplied; an empty group is still committed
// so the wait count stays exact.
template <int STAGES, typename Load, typename Compute>
__device__ __forceinline__ void cp_async_ring(int64_t ktiles, Load&& load, Compute&& compute) {
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ktiles) load(s, s);
    cp_async_commit();
  }
  for (int64_t kt = 0; kt < ktiles; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    if (kt + STAGES - 1 < ktiles)
      load(static_cast<int>((kt + STAGES - 1) % STAGES), kt + STAGES - 1);
    cp_async_commit();
    compute(kt);
  }
  cp_async_wait<0>();
}

// Elements of a 16-byte chunk that lie before an edge `left` elements away (0 .. kPer).
template <int kPer> __device__ __forceinline__ int chunk_valid(int64_t left) {
  return static_cast<int>(max(int64_t{0}, min(int64_t{kPer}, left)));
}

// One k-slice of both operands of the mma.sync kernels into shared memory, each stored as it lies in
// global memory, by 16-byte chunks (copy_chunk: zeros past an edge): A's BM x BK rows (AK: k-major)
// or BK x BM (m-major) at AS, rows ALD elements apart; B's BK x BN (BNM: n-major) or BN x BK at BS,
// rows BLD apart. P: the GemmProblem; A, B its typed operand pointers; ROW0, COL0, K0: the slice's
// corner; thread TID of THREADS takes chunks TID, TID + THREADS, ... ASWZ / BSWZ (float64's swizzled
// operands, kernels/gemm/gemm_f64.cu): element (r, c) of a stored row sits at column c ^ 4 (r % 4).
// A macro, expanded inside each kernel's own load lambda: as a __forceinline__ function (tried per
// slice, per chunk, with the row pitch a constant or not) the same statements compiled to other
// address arithmetic, up to 11 % more instructions in a bf16 loop and 2.5 % slower on the H100 (with
// CUOPS_DISABLE_WGMMA).
#define CUOPS_STAGE_CHUNK(T, DST, LD, SWZ, SRC, G_LD, ROW_CHUNKS, IDX, OUTER0, OUTER_N, INNER0, \
                          INNER_N)                                                              \
  do {                                                                                          \
    constexpr int kPer_ = 16 / static_cast<int>(sizeof(T));                                     \
    const int r_ = (IDX) / (ROW_CHUNKS), c_ = ((IDX) % (ROW_CHUNKS)) * kPer_;                   \
    const int64_t go_ = (OUTER0) + r_, gi_ = (INNER0) + c_;                                     \
    copy_chunk<sizeof(T)>((DST) + r_ * (LD) + ((SWZ) ? c_ ^ ((r_ & 3) << 2) : c_),              \
                          (SRC) + go_ * (G_LD) + gi_,                                           \
                          go_ < (OUTER_N) ? chunk_valid<kPer_>((INNER_N) - gi_) : 0);           \
  } while (0)
#define CUOPS_STAGE_OPERANDS(T, BM, BN, BK, THREADS, AK, BNM, P, A, B, AS, ALD, BS, BLD, ROW0,     \
                             COL0, K0, TID, ASWZ, BSWZ)                                            \
  do {                                                                                             \
    constexpr int kPerS_ = 16 / static_cast<int>(sizeof(T));                                       \
    constexpr int kAChunks_ =                                                                      \
        (BM) * (BK) / kPerS_; /* fewer than THREADS in float64's 16-row tile */                    \
    _Pragma("unroll") for (int i_ = 0; i_ < (kAChunks_ + (THREADS) - 1) / (THREADS); ++i_) {       \
      if (kAChunks_ % (THREADS) != 0 && (TID) + i_ * (THREADS) >= kAChunks_) break;                \
      if constexpr (AK) {                                                                          \
        CUOPS_STAGE_CHUNK(T, AS, ALD, ASWZ, A, (P).lda, (BK) / kPerS_, (TID) + i_ * (THREADS),     \
                          ROW0, (P).m, K0, (P).k);                                                 \
      } else {                                                                                     \
        CUOPS_STAGE_CHUNK(T, AS, ALD, ASWZ, A, (P).lda, (BM) / kPerS_, (TID) + i_ * (THREADS), K0, \
                          (P).k, ROW0, (P).m);                                                     \
      }                                                                                            \
    }                                                                                              \
    _Pragma("unroll") for (int i_ = 0; i_ < (BN) * (BK) / kPerS_ / (THREADS); ++i_) {              \
      if constexpr (BNM) {                                                                         \
        CUOPS_STAGE_CHUNK(T, BS, BLD, BSWZ, B, (P).ldb, (BN) / kPerS_, (TID) + i_ * (THREADS), K0, \
                          (P).k, COL0, (P).n);                                                     \
      } else {                                                                                     \
        CUOPS_STAGE_CHUNK(T, BS, BLD, BSWZ, B, (P).ldb, (BK) / kPerS_, (TID) + i_ * (THREADS),     \
                          COL0, (P).n, K0, (P).k);                                                 \
      }                                                                                            \
    }                                                                                              \
  } while (0)

// Calls f(std::bool_constant<a_kmajor>, std::bool_constant<b_nmajor>): the four operand layouts as
// compile-time arguments, so every kernel instance has its addressing fixed.
template <typename F> cudaError_t with_layouts(bool a_kmajor, bool b_nmajor, F&& f) {
  if (a_kmajor)
    return b_nmajor ? f(std::true_type{}, std::true_type{})
                    : f(std::true_type{}, std::false_type{});
  return b_nmajor ? f(std::false_type{}, std::true_type{})
                  : f(std::false_type{}, std::false_type{});
}

// `blocks` blocks of `threads` on `stream` with `smem` bytes of dynamic shared memory (a kernel
// above 48 KiB must opt in: cheap, and set on every launch because the attribute is per device).
template <typename K, typename... Args>
cudaError_t launch_blocks(K kernel, int64_t blocks, int threads, int smem, cudaStream_t stream,
                          const Args&... args) {
  if (!grid_fits(blocks)) return cudaErrorInvalidConfiguration;
  if (smem > 0) {
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
  }
  kernel<<<static_cast<unsigned int>(blocks), threads, smem, stream>>>(args...);
  return cudaGetLastError();
}

// A launch through cudaLaunchKernelEx (for the occupancy query, and the launch itself): `grid` blocks
// of `threads` with `smem` bytes of dynamic shared memory on `stream`, in clusters of `cluster` blocks
// where one of its sides is above 1, and, with `pdl`, as a programmatic dependent of the kernel
// before it on the stream (the kernel's griddepcontrol.wait holds its global accesses back until
// that one completes, so its launch and prologue overlap that kernel's last wave). Not copyable: cfg
// points at the member attributes.
struct ClusterLaunch {
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attrs[2]{};
  ClusterLaunch(dim3 grid, dim3 cluster, int threads, int smem, cudaStream_t stream,
                bool pdl = false) {
    cfg.gridDim = grid;
    cfg.blockDim = dim3(static_cast<unsigned>(threads));
    cfg.dynamicSmemBytes = static_cast<size_t>(smem);
    cfg.stream = stream;
    cfg.attrs = attrs;
    if (cluster.x * cluster.y * cluster.z > 1) {
      cudaLaunchAttribute& a = attrs[cfg.numAttrs++];
      a.id = cudaLaunchAttributeClusterDimension;
      a.val.clusterDim.x = cluster.x, a.val.clusterDim.y = cluster.y,
      a.val.clusterDim.z = cluster.z;
    }
    if (pdl) {
      cudaLaunchAttribute& a = attrs[cfg.numAttrs++];
      a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      a.val.programmaticStreamSerializationAllowed = 1;
    }
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// A kernel launched with ClusterLaunch's `pdl` may start while the kernel before it is still
// finishing. Called once its prologue (shared memory, the parameters, prefetch_map) is done and
// before any global access: waits for that kernel to complete and its writes to be visible (a no-op
// when not launched so, and below sm_90), then lets the next such kernel start its own prologue.
__device__ __forceinline__ void end_dependent_prologue() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// The k split on independent CTAs (gemm_simt.cu, gemm_f64.cu): CTA (x, y) writes its partial tile,
// unscaled, to plane y of the workspace (split planes of m x n T, rows n apart: planes_problem), and
// sum_planes adds the planes in plane order (the same bits on every run) into c with alpha and beta.
// Clusters placed their CTAs unevenly on the H100 (two to an SM for clusters of 4, 30 clusters of 8 at
// once), which cost the cluster split 25-45 % on few-tile products.
// CTA y's share of the k split: whole BK slices, the last CTA's possibly shorter (or empty); k cut
// to it, a and b moved to its start.
template <typename T, int BK, bool AK, bool BNM>
__device__ __forceinline__ void take_k_slice(GemmProblem& p) {
  const int split = static_cast<int>(gridDim.y);
  const int64_t slice = (p.k + split * int64_t{BK} - 1) / (split * int64_t{BK}) * BK;
  const int64_t kb = min(p.k, int64_t{blockIdx.y} * slice);
  p.k = min(p.k, kb + slice) - kb;
  p.a = static_cast<const T*>(p.a) + kb * (AK ? 1 : p.lda);
  p.b = static_cast<const T*>(p.b) + kb * (BNM ? p.ldb : 1);
}
template <typename T>
__device__ __forceinline__ GemmProblem planes_problem(const GemmProblem& whole) {
  GemmProblem out = whole;
  out.c = static_cast<T*>(whole.workspace) + int64_t{blockIdx.y} * whole.m * whole.n;
  out.ldc = whole.n;
  out.alpha = 1.f, out.beta = 0.f, out.alpha64 = 1.0, out.beta64 = 0.0;
  return out;
}

template <typename T> __global__ void sum_planes(const GemmProblem p, int split) {
  using T2 = std::conditional_t<std::is_same_v<T, double>, double2, float2>;
  const T* ws = static_cast<const T*>(p.workspace);
  const int64_t plane = p.m * p.n, pairs = (p.n + 1) / 2;
  // Every pair of a plane is aligned for one access when n is even and the planes start aligned.
  const bool even = p.n % 2 == 0 && (reinterpret_cast<uintptr_t>(ws) % sizeof(T2)) == 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < p.m * pairs;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / pairs, col = (i % pairs) * 2;
    const T* src = ws + r * p.n + col;
    const bool two = col + 1 < p.n;
    T v0, v1 = 0;
    if (even) {
      const T2 v = *reinterpret_cast<const T2*>(src);
      v0 = v.x, v1 = v.y;
      for (int s = 1; s < split; ++s) {
        const T2 w = *reinterpret_cast<const T2*>(src + s * plane);
        v0 += w.x, v1 += w.y;
      }
    } else {
      v0 = src[0];
      if (two) v1 = src[1];
      for (int s = 1; s < split; ++s) {
        v0 += src[s * plane];
        if (two) v1 += src[s * plane + 1];
      }
    }
    Epilogue::pair<T>(p, r, col, v0, v1);
  }
}

// `blocks` x `split` blocks (the split instances, y: the k slice) and then the planes' sum into c.
template <typename T, typename K>
cudaError_t launch_split_planes(K kernel, int64_t blocks, int split, int threads, int smem,
                                cudaStream_t stream, const GemmProblem& p) {
  if (!grid_fits(blocks) || split < 2 || split > 65535) return cudaErrorInvalidConfiguration;
  if (smem > 0) {
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
  }
  kernel<<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(split)), threads, smem,
           stream>>>(p);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const int64_t pairs = p.m * ((p.n + 1) / 2);
  return launch_blocks(sum_planes<T>, std::min<int64_t>((pairs + 255) / 256, 4096), 256, 0, stream,
                       p, split);
}

// d += a b for one 16 x 8 x 16 block of bfloat16 / float16 (T), float32 accumulation: the mma.sync
// kernel's tiles (kernels/gemm/gemm_half.cu, fragments from ldmatrix) and the small-M kernel's swapped
// products (kernels/gemm/gemm_skinny_*.cu, fragments from its lanes' own vectors).
template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// The FP64 tensor-core products both float64 kernels multiply with (kernels/gemm/gemm_f64.cu, and the
// small-M streaming form in kernels/gemm/gemm_skinny_tma.cu).
// d += a b for one 16 x 8 x 4 block. Fragments (lane = 4 g + t): a0 = A[g][t], a1 = A[g + 8][t],
// b = B[t][g], d[2 h + j] = D[g + 8 h][2 t + j]. m8n8k4 holds A[g][t], B[t][g] and D[g][2 t + j] of an
// 8 x 8 x 4 block, so the sm_80-89 form (no m16n8k4 there) is the same product in two halves.
__device__ __forceinline__ void mma_f64_k4(double (&d)[4], double a0, double a1, double b) {
#if __CUDA_ARCH__ >= 900
  asm volatile(
      "mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
      "{%0,%1,%2,%3};\n"
      : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
      : "d"(a0), "d"(a1), "d"(b));
#elif __CUDA_ARCH__ >= 800
  asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1};\n"
               : "+d"(d[0]), "+d"(d[1])
               : "d"(a0), "d"(b));
  asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1};\n"
               : "+d"(d[2]), "+d"(d[3])
               : "d"(a1), "d"(b));
#else
  __trap();  // the planner runs DMMA only where dmma_runs_on (or skinny_tma_on) says the image has it
#endif
}

// d += a b for one 16 x 8 x 8 block: a = {A[g][t], A[g + 8][t], A[g][t + 4], A[g + 8][t + 4]},
// b = {B[t][g], B[t + 4][g]} (CUTLASS's SM90_16x8x8_F64F64F64F64_TN layouts), i.e. two m16n8k4 blocks,
// k 0-3 and 4-7, in one instruction on sm_90. One DMMA.16x8x8 is 32 cycles of the pipe where the
// 16x8x4 is 16: a warp issues half as many, with the fixed wait ptxas puts between a warp's DMMAs (a
// NOP each) now under more pipe time. cuBLAS's sm90 DGEMM runs this shape.
__device__ __forceinline__ void mma_f64_k8(double (&d)[4], const double (&a)[4],
                                           const double (&b)[2]) {
#if __CUDA_ARCH__ >= 900
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
      : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(b[0]), "d"(b[1]));
#else
  mma_f64_k4(d, a[0], a[1], b[0]);
  mma_f64_k4(d, a[2], a[3], b[1]);
#endif
}

// The fast kernels' launchers: the instance the plan names (its tile, layouts and grid), or
// cudaErrorInvalidValue when no such instance is compiled.
cudaError_t launch_gemm_simt(const GemmPlan& plan, const GemmProblem& p, cudaStream_t stream);
cudaError_t launch_gemm_mma_tf32(const GemmPlan& plan, const GemmProblem& p, cudaStream_t stream);
cudaError_t launch_gemm_mma_half(const GemmPlan& plan, const GemmProblem& p, cudaStream_t stream);
cudaError_t launch_gemm_wgmma(const GemmPlan& plan, const GemmProblem& p, cudaStream_t stream);
cudaError_t launch_gemm_skinny(const GemmPlan& plan, const GemmProblem& p, cudaStream_t stream);
cudaError_t launch_gemm_mma_f64(const GemmPlan& plan, const GemmProblem& p, cudaStream_t stream);
// Whether the float64 tensor-core kernel runs on device `dev`: compute capability 8.0 and up, and the
// image the runtime picks there holds DMMA code (kernels/gemm/gemm_f64.cu).
bool dmma_runs_on(int dev, bool& wide);
// Whether the small-M kernel can split k over clusters on device `dev` (kernels/gemm/gemm_skinny_lanes.cu).
bool skinny_clusters_on(int dev);
// Whether its streaming form (TMA) runs on device `dev`: the above, and the driver's tensor-map encoder.
bool skinny_tma_on(int dev);
// Whether this library's sm_90a wgmma kernel runs on device `dev` and how many clusters of two of it
// fit there (kernels/gemm/gemm_wgmma.cu; a build without sm_90a answers no).
bool wgmma_runs_on(int dev, int& pair_clusters);

}  // namespace cuops::kernels::detail
