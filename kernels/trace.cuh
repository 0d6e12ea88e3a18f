// Timeline marks for the sweep (bench/sweep/wgmma_lib_sweep trace, built with -DCUOPS_WG_TRACE): each
// CTA records clock64 at the points below and globaltimer at entry and exit, read back after one
// launch (cuops_wg_trace in gemm_wgmma_bf16.cu). They say where a product's microseconds go
// (docs/performance.md, "split tail"); in the library the macros are empty.
#pragma once
#include <cstdint>

namespace cuops::kernels::detail {
// Slots of a CTA's record. Per-unit marks hold the CTA's last unit.
enum WgMark : int {
  kMarkEntryTime = 0,  // globaltimer, ns (thread 0)
  kMarkEntry = 1,      // clock64 at entry; the other clock marks count from it
  kMarkPrologue = 2,   // barriers initialised, programmatic dependency resolved
  kMarkFirstFull = 3,  // the consumer's first k-tile arrived
  kMarkMainEnd = 4,    // the consumer's last wgmma done
  kMarkPut = 5,       // split tail: a Tail's partial and flag out, or the Head's wait for them over
  kMarkAdded = 6,     // split tail: the Head's adds done
  kMarkEpilogue = 7,  // the tile's stores issued
  kMarkExit = 8,      // clock64 as the first consumer leaves
  kMarkExitTime = 9,  // globaltimer then
  kMarkRole = 10,     // 0 whole tile, 1 Head, 2 Tail
  kMarkSm = 11,       // %smid
  kMarkFirstLoad = 12,  // the producer's first TMA issued
  kMarkUnit = 13,       // the producer has its unit (walk_units)
  kMarkRegs = 14,       // the producer past setmaxnreg
  kMarkSlots = 16
};
}  // namespace cuops::kernels::detail

#ifdef CUOPS_WG_TRACE
namespace {
constexpr int kTraceCtas = 1024;
__device__ unsigned long long g_wg_trace[cuops::kernels::detail::kMarkSlots * kTraceCtas];
__device__ __forceinline__ void wg_mark_value(int slot, unsigned long long v) {
  if (blockIdx.x < kTraceCtas)
    g_wg_trace[blockIdx.x * cuops::kernels::detail::kMarkSlots + slot] = v;
}
__device__ __forceinline__ void wg_mark(int slot) {
  unsigned long long c;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(c)::"memory");
  wg_mark_value(slot, c);
}
__device__ __forceinline__ void wg_mark_time(int slot) {
  unsigned long long g;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g)::"memory");
  wg_mark_value(slot, g);
}
}  // namespace
#define WG_MARK(s) wg_mark(s)
#define WG_MARK_TIME(s) wg_mark_time(s)
#define WG_MARK_VALUE(s, v) wg_mark_value(s, v)
#else
#define WG_MARK(s) ((void)0)
#define WG_MARK_TIME(s) ((void)0)
#define WG_MARK_VALUE(s, v) ((void)0)
#endif
