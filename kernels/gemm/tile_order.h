// The order in which the tiled GEMM kernels walk their output tiles, for host and device: the kernels
// call it through gemm.cuh, tests/cpp/test_gemm_plan.cpp checks it on the CPU.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define CUOPS_TILE_ORDER_FN __host__ __device__ __forceinline__
#else
#define CUOPS_TILE_ORDER_FN inline
#endif

namespace cuops::kernels::detail {

// Linear tile id -> (tile row, tile column), in groups of kGroup tile rows that walk down the columns
// together: consecutive blocks then share A rows and B columns in L2 (at 8192^3 the row-by-row order
// re-reads all of B per tile row). `id` < tiles_m x tiles_n: a block's linear id, or a persistent
// block's current work item.
template <typename I, int kGroup>
CUOPS_TILE_ORDER_FN void tile_coords_in(I id, I tiles_m, I tiles_n, int64_t& tm, int64_t& tn) {
  const I per_group = I{kGroup} * tiles_n;
  const I first_m = (id / per_group) * kGroup;
  const I left = tiles_m - first_m;
  const I rows = left < I{kGroup} ? left : I{kGroup};
  const I in_group = id % per_group;
  tm = static_cast<int64_t>(first_m + in_group % rows);
  tn = static_cast<int64_t>(in_group / rows);
}

// In 32 bits wherever the values fit ((tiles_m + kGroup) x tiles_n < 2^32: every product short of
// ~2^32 tiles), the same mapping (test_gemm_plan.cpp): a 64-bit division is a ~70-instruction routine
// on the way to a CTA's first load. The gain was not measurable (the wgmma producer's ~0.3 us from its
// unit to its first TMA stayed); the shorter form stays.
template <int kGroup> CUOPS_TILE_ORDER_FN void tile_coords(int64_t id, int64_t tiles_m,
                                                           int64_t tiles_n, int64_t& tm,
                                                           int64_t& tn) {
  if ((tiles_m + kGroup) * tiles_n < (int64_t{1} << 32)) {
    tile_coords_in<uint32_t, kGroup>(static_cast<uint32_t>(id), static_cast<uint32_t>(tiles_m),
                                     static_cast<uint32_t>(tiles_n), tm, tn);
  } else {
    tile_coords_in<int64_t, kGroup>(id, tiles_m, tiles_n, tm, tn);
  }
}

}  // namespace cuops::kernels::detail

#undef CUOPS_TILE_ORDER_FN
