// The bulk tensor copy (TMA) as two kernels use it: the Hopper GEMM (gemm_wgmma.cuh) and the small-M
// GEMM's streaming form (gemm_skinny_tma.cu). Host side: the driver's tensor-map encoder and the one map
// layout both read (row-major 2-D, 128-byte swizzle); device side: the 2-D load into shared memory.
// The load is sm_90 PTX: call it only from code compiled for sm_90 and up (like common.cuh's
// mbarrier expect_tx and try_wait forms).
#pragma once

#include <cudaTypedefs.h>

#include "kernels/common.cuh"

namespace cuops::kernels::detail {

using EncodeTiled = PFN_cuTensorMapEncodeTiled_v12000;

// The driver's tensor-map encoder, through the runtime (no link against libcuda); null if absent.
inline EncodeTiled tma_encoder() {
  static const EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      f = nullptr;
    }
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

// Makes sure the calling thread has a current context before a driver call. The runtime binds the
// current device's primary context to a thread lazily, at its first runtime call that needs one; the
// driver's entry points (the encoder above) find none on a thread whose first CUDA work is a TMA
// product, and the encoder then answers CUDA_ERROR_INVALID_CONTEXT. Such a thread is common: the
// autograd engine runs a backward on a worker thread of its own, so a backward whose first op is a
// product (gradcheck's, or y.backward(g) with g made elsewhere) failed while the same product in
// any thread that had launched a kernel before passed. cudaSetDevice binds the primary context (CUDA
// 12 and later) and is legal during graph capture; it runs once per such thread.
inline bool bind_current_context() {
  using GetCurrent = PFN_cuCtxGetCurrent_v4000;
  static const GetCurrent get_current = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &f, 4000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      f = nullptr;
    }
    return reinterpret_cast<GetCurrent>(f);
  }();
  CUcontext ctx = nullptr;
  if (get_current != nullptr && get_current(&ctx) == CUDA_SUCCESS && ctx != nullptr) return true;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaSetDevice(dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return true;
}

template <typename T> constexpr CUtensorMapDataType tma_dtype() {
  if constexpr (std::is_same_v<T, double>) return CU_TENSOR_MAP_DATA_TYPE_FLOAT64;
  if constexpr (std::is_same_v<T, float>) return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
}

// Tensor map of a row-major [outer, inner] operand with leading stride ld (elements), read in boxes
// of [box_outer, box_inner] with the 128-byte swizzle: 16-byte unit u of a box's row r lands at unit
// u ^ (r % 8) of that row's 128 bytes (boxes start 1024-byte aligned). Parts of a box outside the
// tensor arrive as zeros. false where TMA cannot describe the operand (a stride of 0 on an expanded
// view, sizes past its 32-bit coordinates: gemm_plan.cpp's tma_describes, which the planner asks
// first) or the encoder is missing.
template <typename T> bool make_map(CUtensorMap& map, const void* ptr, int64_t inner, int64_t outer,
                                    int64_t ld, uint32_t box_inner, uint32_t box_outer) {
  constexpr int64_t kElem = sizeof(T);
  if (outer == 1)
    ld = (inner * kElem + 15) / 16 * 16 / kElem;  // never used; TMA wants a valid stride
  if (ld < inner || inner > INT32_MAX || outer > INT32_MAX || tma_encoder() == nullptr ||
      !bind_current_context()) {
    return false;
  }
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(outer)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld * kElem)};
  const cuuint32_t box[2] = {box_inner, box_outer};
  const cuuint32_t elem_strides[2] = {1, 1};
  return tma_encoder()(&map, tma_dtype<T>(), 2, const_cast<void*>(ptr), dims, strides, box,
                       elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                       CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                       CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Tensor map of `depth` row-major [outer, inner] matrices depth_stride elements apart (a grouped
// GEMM's per-expert weights, [E, outer, inner]), read in boxes of [1, box_outer, box_inner] with the
// 128-byte swizzle: each matrix's own bounds give the zeros past its edges (no box reads the next
// one's rows). false as make_map's.
template <typename T> bool make_map3(CUtensorMap& map, const void* ptr, int64_t inner,
                                     int64_t outer, int64_t depth, int64_t ld, int64_t depth_stride,
                                     uint32_t box_inner, uint32_t box_outer) {
  constexpr int64_t kElem = sizeof(T);
  if (ld < inner || depth_stride < ld * outer || inner > INT32_MAX || outer > INT32_MAX ||
      depth > INT32_MAX || (ld * kElem) % 16 != 0 || (depth_stride * kElem) % 16 != 0 ||
      tma_encoder() == nullptr || !bind_current_context()) {
    return false;
  }
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(outer),
                              static_cast<cuuint64_t>(depth)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(ld * kElem),
                                 static_cast<cuuint64_t>(depth_stride * kElem)};
  const cuuint32_t box[3] = {box_inner, box_outer, 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  return tma_encoder()(&map, tma_dtype<T>(), 3, const_cast<void*>(ptr), dims, strides, box,
                       elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                       CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                       CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// 3-D TMA load of the box at (c0 innermost, c1, c2: the matrix); as tma_load.
__device__ __forceinline__ void tma_load3(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                          int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

// 2-D TMA load of the box whose first element is (c0 innermost, c1); completion counts on `bar`.
// Parts of the box outside the tensor arrive as zeros (and still count their bytes).
// dst, bar: shared-memory addresses.
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                         uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

// Brings a tensor map (a __grid_constant__ kernel parameter) into the SM's descriptor cache ahead of
// its first copy, which would otherwise wait for the fetch on the kernel's critical path.
__device__ __forceinline__ void prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

}  // namespace cuops::kernels::detail
