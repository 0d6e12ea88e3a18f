// Hopper (sm_90a) primitives of kernels/gemm/gemm_wgmma.cu: mbarriers, the bulk tensor copy (TMA),
// shared-memory matrix descriptors, wgmma and setmaxnreg. Only that file includes this, and only
// when it is compiled for compute_90a (CMake's cuops_kernels_sm90a; the sweeps link its object).
#pragma once

#include <cuda.h>

#include "gemm.cuh"
#include "tma.cuh"

namespace cuops::kernels::detail::wg {

// The mbarrier primitives are common.cuh's (shared with the two_norm bulk pass).
using detail::mbar_arrive;
using detail::mbar_expect_tx;
using detail::mbar_init;
using detail::mbar_wait;
// So is the 2-D TMA load (tma.cuh, shared with the small-M GEMM).
using detail::tma_load;
using detail::tma_load3;
// So are the cluster primitives (shared with the small-M GEMM's split-k reduction).
using detail::cluster_rank;
using detail::cluster_sync;
using detail::map_cluster;
using detail::mbar_arrive_cluster;

// The same load, multicast: the box lands at the same shared-memory offset in every CTA of the
// cluster named in `mask`, each completing its bytes on its own barrier at `bar`'s offset.
__device__ __forceinline__ void tma_load_multicast(uint32_t dst, const CUtensorMap* map, int c0,
                                                   int c1, uint32_t bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::"
      "cluster [%0], [%1, {%2, "
      "%3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "h"(mask)
      : "memory");
}

// 2-D TMA store of the box at (c0 innermost, c1) from shared memory; parts outside the tensor are
// not written. Tracked in this thread's bulk async-group (commit / wait below).
// src: a shared-memory address.
__device__ __forceinline__ void tma_store(const CUtensorMap* map, uint32_t src, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(c0), "r"(c1), "r"(src)
      : "memory");
}
// The same box added to what the tensor holds (TMA's reduce-add, done in L2 in the tensor map's
// element type): c += box, each element once, in the order the stores are issued.
__device__ __forceinline__ void tma_store_add(const CUtensorMap* map, uint32_t src, int c0,
                                              int c1) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2}], "
      "[%3];\n" ::"l"(reinterpret_cast<uint64_t>(map)),
      "r"(c0), "r"(c1), "r"(src)
      : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Until this thread's committed stores have read their shared memory (it may be written again).
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
// Ordinary shared-memory writes made visible to the async proxy (TMA) before a barrier.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Barrier `id` among `threads` threads (one warpgroup: 128), leaving the other warpgroups running.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Shared-memory matrix descriptor for a 128-byte-swizzled tile (layout type 1, bits 62-63). Tiles
// start 1024-byte aligned, so the base-offset field stays 0. lbo/sbo: byte distance between core
// matrices along the leading / strided dimension (lbo unused for k-major swizzled operands).
// The address field (bits 0-13, address / 16) never carries into lbo: shared memory ends below 256 KiB,
// so a descriptor may be advanced by adding (bytes / 16) to it.
__device__ __forceinline__ uint64_t make_desc(uint32_t smem, uint32_t lbo, uint32_t sbo) {
  const uint64_t a = smem;
  return ((a & 0x3FFFF) >> 4) | (uint64_t((lbo & 0x3FFFF) >> 4) << 16) |
         (uint64_t((sbo & 0x3FFFF) >> 4) << 32) | (uint64_t{1} << 62);
}
__device__ __forceinline__ uint64_t make_desc(const void* smem, uint32_t lbo, uint32_t sbo) {
  return make_desc(smem_addr(smem), lbo, sbo);
}

// A 4-byte shared-memory load by address (the generic pointers of the aligned dynamic buffer would
// otherwise compile to generic loads).
__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}
// The matching 4-byte store (generic pointers there compile to generic stores with 64-bit addresses).
__device__ __forceinline__ void sts32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void sts128_zero(uint32_t addr) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0) : "memory");
}
// Registers a wgmma reads from must stay live (not reused) until its group has been waited for; this
// empty statement after the wait is their last use, so the compiler neither reuses them earlier nor
// serialises the wgmma to protect them.
template <int R> __device__ __forceinline__ void keep(uint32_t (&r)[R][4]) {
#pragma unroll
  for (int i = 0; i < R; ++i)
    asm volatile("" : "+r"(r[i][0]), "+r"(r[i][1]), "+r"(r[i][2]), "+r"(r[i][3]));
}

__device__ __forceinline__ void fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
template <int R> __device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R> __device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}

// Accumulator operand lists of wgmma m64nN (N/2 float registers per thread).
#define CUOPS_WG_F8(i)                                                                        \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define CUOPS_WG_F64(o)                                                         \
  CUOPS_WG_F8(o), CUOPS_WG_F8(o + 8), CUOPS_WG_F8(o + 16), CUOPS_WG_F8(o + 24), \
      CUOPS_WG_F8(o + 32), CUOPS_WG_F8(o + 40), CUOPS_WG_F8(o + 48), CUOPS_WG_F8(o + 56)
#define CUOPS_WG_D32                                                        \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define CUOPS_WG_D64                                                                 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "          \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define CUOPS_WG_D128                                                                            \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                      \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "             \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "             \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "             \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "             \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "             \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, "   \
  "%127}"
// One instruction for a 16-bit type: A, B the descriptors' operands, then scale-d (always
// accumulate: the caller zeroes d), unit input scales, and the two transpose immediates (1 = m-major
// A / n-major B).
// scale-d is a predicate (no immediate form): set from operand ONE, which the caller passes as 1.
#define CUOPS_WG_HALF(SHAPE, TY, D, A, B, TA, TB, ONE)                                         \
  "{\n.reg .pred p;\nsetp.ne.b32 p, " ONE                                                      \
  ", 0;\n"                                                                                     \
  "wgmma.mma_async.sync.aligned." SHAPE ".f32." TY "." TY " " D ", " A ", " B ", p, 1, 1, " TA \
  ", " TB ";\n}\n"
#define CUOPS_WG_TF32(SHAPE, D, A, B, ONE) \
  "{\n.reg .pred p;\nsetp.ne.b32 p, " ONE  \
  ", 0;\n"                                 \
  "wgmma.mma_async.sync.aligned." SHAPE ".f32.tf32.tf32 " D ", " A ", " B ", p, 1, 1;\n}\n"

// TF32 with A from registers: the four 32-bit words of the m64k8 fragment, then B's descriptor.
#define CUOPS_WG_TF32_RS(SHAPE, D, A0, A1, A2, A3, B, ONE)                                   \
  "{\n.reg .pred p;\nsetp.ne.b32 p, " ONE                                                    \
  ", 0;\n"                                                                                   \
  "wgmma.mma_async.sync.aligned." SHAPE ".f32.tf32.tf32 " D ", {" A0 ", " A1 ", " A2 ", " A3 \
  "}, " B ", p, 1, 1;\n}\n"

// The three tile widths of one 16-bit type (TY: the PTX type name, which must be a literal inside
// the asm string, hence a macro rather than a template parameter).
#define CUOPS_WG_HALF_N(TY)                                                                       \
  if constexpr (N == 64) {                                                                        \
    asm volatile(CUOPS_WG_HALF("m64n64k16", TY, CUOPS_WG_D32, "%32", "%33", "%34", "%35", "%36")  \
                 : CUOPS_WG_F8(0), CUOPS_WG_F8(8), CUOPS_WG_F8(16), CUOPS_WG_F8(24)               \
                 : "l"(da), "l"(db), "n"(kTA), "n"(kTB), "r"(1));                                 \
  } else if constexpr (N == 128) {                                                                \
    asm volatile(CUOPS_WG_HALF("m64n128k16", TY, CUOPS_WG_D64, "%64", "%65", "%66", "%67", "%68") \
                 : CUOPS_WG_F64(0)                                                                \
                 : "l"(da), "l"(db), "n"(kTA), "n"(kTB), "r"(1));                                 \
  } else {                                                                                        \
    asm volatile(                                                                                 \
        CUOPS_WG_HALF("m64n256k16", TY, CUOPS_WG_D128, "%128", "%129", "%130", "%131", "%132")    \
        : CUOPS_WG_F64(0), CUOPS_WG_F64(64)                                                       \
        : "l"(da), "l"(db), "n"(kTA), "n"(kTB), "r"(1));                                          \
  }

// d[64 x N] += A[64 x K0] B[K0 x N], A and B from shared-memory descriptors, one k-step of the
// instruction (k16 for 16-bit types, k8 for tf32, 32 bytes of k either way). kTA / kTB: A
// m-major / B n-major (16-bit types only: tf32 reads both k-major).
template <typename T, int N, int kTA, int kTB>
__device__ __forceinline__ void mma(float (&d)[N / 2], uint64_t da, uint64_t db) {
  static_assert(N == 64 || N == 128 || N == 256, "tile widths 64, 128 and 256");
  if constexpr (std::is_same_v<T, float>) {
    static_assert(kTA == 0 && kTB == 0, "tf32 wgmma reads both operands k-major");
    if constexpr (N == 64) {
      asm volatile(CUOPS_WG_TF32("m64n64k8", CUOPS_WG_D32, "%32", "%33", "%34")
                   : CUOPS_WG_F8(0), CUOPS_WG_F8(8), CUOPS_WG_F8(16), CUOPS_WG_F8(24)
                   : "l"(da), "l"(db), "r"(1));
    } else if constexpr (N == 128) {
      asm volatile(CUOPS_WG_TF32("m64n128k8", CUOPS_WG_D64, "%64", "%65", "%66")
                   : CUOPS_WG_F64(0)
                   : "l"(da), "l"(db), "r"(1));
    } else {
      asm volatile(CUOPS_WG_TF32("m64n256k8", CUOPS_WG_D128, "%128", "%129", "%130")
                   : CUOPS_WG_F64(0), CUOPS_WG_F64(64)
                   : "l"(da), "l"(db), "r"(1));
    }
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    CUOPS_WG_HALF_N("bf16");
  } else {
    static_assert(std::is_same_v<T, __half>, "bfloat16, float16 or float (tf32)");
    CUOPS_WG_HALF_N("f16");
  }
}

// d[64 x N] += A[64 x 8] B[8 x N] in TF32 with A from registers: a[0..3] hold this warp's rows
// lane / 4 (a[0], a[2]) and lane / 4 + 8 (a[1], a[3]) of its 16, at columns lane % 4 (a[0], a[1]) and
// lane % 4 + 4 (a[2], a[3]) (float32 bits: the tensor cores read them as TF32, as they do the shared
// operand). B k-major from its descriptor. The registers must stay unchanged until the group is waited
// for; a wgmma.fence must separate their writes from this instruction.
template <int N> __device__ __forceinline__ void mma_tf32_rs(float (&d)[N / 2],
                                                             const uint32_t (&a)[4], uint64_t db) {
  static_assert(N == 64 || N == 128 || N == 256, "tile widths 64, 128 and 256");
  if constexpr (N == 64) {
    asm volatile(
        CUOPS_WG_TF32_RS("m64n64k8", CUOPS_WG_D32, "%32", "%33", "%34", "%35", "%36", "%37")
        : CUOPS_WG_F8(0), CUOPS_WG_F8(8), CUOPS_WG_F8(16), CUOPS_WG_F8(24)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
  } else if constexpr (N == 128) {
    asm volatile(
        CUOPS_WG_TF32_RS("m64n128k8", CUOPS_WG_D64, "%64", "%65", "%66", "%67", "%68", "%69")
        : CUOPS_WG_F64(0)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
  } else {
    asm volatile(
        CUOPS_WG_TF32_RS("m64n256k8", CUOPS_WG_D128, "%128", "%129", "%130", "%131", "%132", "%133")
        : CUOPS_WG_F64(0), CUOPS_WG_F64(64)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
  }
}

#undef CUOPS_WG_F8
#undef CUOPS_WG_F64
#undef CUOPS_WG_D32
#undef CUOPS_WG_D64
#undef CUOPS_WG_D128
#undef CUOPS_WG_HALF
#undef CUOPS_WG_HALF_N
#undef CUOPS_WG_TF32
#undef CUOPS_WG_TF32_RS

}  // namespace cuops::kernels::detail::wg
