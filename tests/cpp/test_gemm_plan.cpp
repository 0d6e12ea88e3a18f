// The GEMM planner's rules (kernels/gemm_plan.cpp's table), one test per row, on the CPU: the planner
// is a plain function of the problem and the device, so no GPU is needed to check what it picks. Also
// the tiled kernels' tile order (kernels/tile_order.h), host and device code alike.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "kernels/gemm_plan_hooks.h"
#include "kernels/tile_order.h"

namespace {

using cuops::kernels::DType;
using cuops::kernels::GemmDevice;
using cuops::kernels::GemmKernel;
using cuops::kernels::GemmOperand;
using cuops::kernels::GemmPlan;
using cuops::kernels::GemmRequest;
using cuops::kernels::kernel_name;
using cuops::kernels::OperandCopy;
using cuops::kernels::plan_gemm;
using cuops::kernels::tail_workspace_bytes;
using cuops::kernels::with_tail_split;
using cuops::kernels::with_tile;

const GemmDevice kH100{132, true, 66, true, true, true, true};
// Hopper without the small-M kernel's streaming form (no tensor-map encoder): its per-lane form.
const GemmDevice kH100Lanes{132, true, 66, true, false, true, true};
const GemmDevice kA100{108, false, 0, false, false, true};
// A GPU without FP64 tensor cores (before sm_80), or a build without code for them.
const GemmDevice kNoDmma{80, false, 0, false, false, false};
// Hopper with the wgmma kernel switched off (CUOPS_DISABLE_WGMMA): the mma.sync kernels' plans there.
const GemmDevice kH100NoWgmma{132, false, 66, true, true, true, true};

void* address(uintptr_t a) { return reinterpret_cast<void*>(a); }

// c = a @ b with a [m, k], b [k, n], c [m, n] all row-major and contiguous, 16-byte aligned bases.
GemmRequest row_major(DType t, int64_t m, int64_t n, int64_t k) {
  return {
      t, m,   n,   k,    {address(0x100000), k, 1}, {address(0x200000), n, 1}, address(0x300000), n,
      1, 1.0, 0.0, false};
}
GemmRequest tf32(GemmRequest r) {
  r.allow_tf32 = true;
  return r;
}
// a given as a.t() of a row-major [k, m] tensor (m-major), b as b.t() of a row-major [n, k] (k-major).
GemmRequest transposed_a(GemmRequest r) {
  r.a.stride0 = 1, r.a.stride1 = r.m;
  return r;
}
GemmRequest transposed_b(GemmRequest r) {
  r.b.stride0 = 1, r.b.stride1 = r.k;
  return r;
}

// The request ops/gemm.cpp plans again after making the copies `p` asks for (its copied()): each copied
// operand in fresh rows padded to a whole number of 16 bytes, row-major, or column-major (the padded
// row-major copy of its transpose, viewed transposed).
GemmRequest with_copies(GemmRequest r, const GemmPlan& p) {
  const int64_t unit = r.dtype == DType::Float64 ? 2 : r.dtype == DType::Float32 ? 4 : 8;
  const auto pad = [unit](int64_t n) { return (n + unit - 1) / unit * unit; };
  if (p.copy_a == OperandCopy::RowMajor) r.a = {address(0x400000), pad(r.k), 1};
  if (p.copy_a == OperandCopy::ColumnMajor) r.a = {address(0x400000), 1, pad(r.m)};
  if (p.copy_b == OperandCopy::RowMajor) r.b = {address(0x500000), pad(r.n), 1};
  if (p.copy_b == OperandCopy::ColumnMajor) r.b = {address(0x500000), 1, pad(r.k)};
  return r;
}

// The plan a product runs on (ops/gemm.cpp's run_gemm): the first, or where that asks for copies, the
// plan of the copies, which asks for none.
GemmPlan plan_after_copies(const GemmRequest& r, const GemmDevice& dev) {
  const GemmPlan first = plan_gemm(r, dev);
  if (first.copy_a == OperandCopy::None && first.copy_b == OperandCopy::None) return first;
  const GemmPlan second = plan_gemm(with_copies(r, first), dev);
  EXPECT_EQ(second.copy_a, OperandCopy::None);
  EXPECT_EQ(second.copy_b, OperandCopy::None);
  return second;
}

// The fast paths by dtype and float32 matmul precision: the kernel on Hopper, and without wgmma (an A100,
// or Hopper with CUOPS_DISABLE_WGMMA).
struct FastPath {
  DType t;
  bool allow_tf32;
  GemmKernel hopper, portable;
};
const FastPath kFastPaths[] = {{DType::BFloat16, false, GemmKernel::Wgmma, GemmKernel::MmaHalf},
                               {DType::Float16, false, GemmKernel::Wgmma, GemmKernel::MmaHalf},
                               {DType::Float32, true, GemmKernel::Wgmma, GemmKernel::MmaTf32},
                               {DType::Float32, false, GemmKernel::Simt, GemmKernel::Simt}};

TEST(GemmPlan, EmptyOutputRunsNothing) {
  EXPECT_EQ(plan_gemm(row_major(DType::BFloat16, 0, 5, 7), kH100).kernel, GemmKernel::None);
  EXPECT_EQ(plan_gemm(row_major(DType::Float32, 5, 0, 7), kH100).kernel, GemmKernel::None);
}

TEST(GemmPlan, Float64RunsOnTheFp64TensorCoresWhereTheyExist) {
  EXPECT_EQ(plan_gemm(row_major(DType::Float64, 4096, 4096, 4096), kNoDmma).kernel,
            GemmKernel::General);
  for (const GemmDevice& dev : {kH100, kA100}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        GemmRequest r = row_major(DType::Float64, 4096, 4096, 4096);
        if (ta) r = transposed_a(r);
        if (tb) r = transposed_b(r);
        const GemmPlan p = plan_gemm(r, dev);
        EXPECT_EQ(p.kernel, GemmKernel::MmaF64);
        EXPECT_EQ(p.a_kmajor, !ta);
        EXPECT_EQ(p.b_nmajor, !tb);
        // 1024 tiles of 128 x 128 fill every SM for several waves: the wide tile, k whole, where its
        // 216 KB ring fits (not an A100: a smaller tile there).
        if (dev.dmma_wide) {
          EXPECT_EQ(p.bm, 128);
          EXPECT_EQ(p.bn, 128);
          EXPECT_EQ(p.split_k, 1);
        } else {
          EXPECT_LT(p.bm * p.bn, 128 * 128);
        }
        EXPECT_EQ(p.grid, (4096 / p.bm) * (4096 / p.bn));
      }
    }
  }
}

TEST(GemmPlan, Float64SplitsKWhereTilesLeaveSmsIdle) {
  // A weight gradient, 1024 x 1024 over k = 8192: 64 tiles of 128 x 128 on 132 SMs, k split in two
  // into independent CTAs whose partial planes (split x m x n doubles of workspace) are summed after.
  GemmPlan p = plan_gemm(row_major(DType::Float64, 1024, 1024, 8192), kH100);
  EXPECT_EQ(p.kernel, GemmKernel::MmaF64);
  EXPECT_EQ(p.bm, 128);
  EXPECT_EQ(p.bn, 128);
  EXPECT_EQ(p.grid, 64);
  EXPECT_EQ(p.split_k, 2);
  EXPECT_EQ(p.workspace_bytes, cuops::kernels::split_planes_bytes(1024, 1024, 2, 8));
  // 1024^3: one wave of 4-warp tiles (128 x 64 alone on its SM, or 64 x 64 two an SM: 1.00x and
  // 1.04x cuBLAS in the float64 sweep) beats 128 x 128 in halves of k (0.70x).
  p = plan_gemm(row_major(DType::Float64, 1024, 1024, 1024), kH100);
  EXPECT_LT(p.bm * p.bn, 128 * 128);
  EXPECT_EQ(p.split_k, 1);
  EXPECT_EQ(p.workspace_bytes, 0);
  // No cluster needed: an A100 splits too.
  EXPECT_GT(plan_gemm(row_major(DType::Float64, 1024, 1024, 8192), kA100).split_k, 1);
  // k too short to split: slices would be under kF64MinSlice.
  p = plan_gemm(row_major(DType::Float64, 1024, 1024, 100), kH100);
  EXPECT_EQ(p.split_k, 1);
  // 16 tokens against a 4096 x 14336 weight (decode) where the small-M kernel cannot stream: the
  // 16-row tile, 32 of them, k split 4 ways: 128 CTAs, each alone on its SM.
  p = plan_gemm(transposed_b(row_major(DType::Float64, 16, 4096, 14336)), kH100Lanes);
  EXPECT_EQ(p.kernel, GemmKernel::MmaF64);
  EXPECT_EQ(p.bm, 16);
  EXPECT_EQ(p.bn, 128);
  EXPECT_EQ(p.split_k, 4);
  // 128 rows, 48 tiles of 128 x 128 over k = 4096: k split (the sweep's 128 x 128 split 5 0.81x
  // cuBLAS, 128 x 64 split 4 0.89x, unsplit 0.44-0.69x).
  p = plan_gemm(row_major(DType::Float64, 128, 6144, 4096), kH100);
  EXPECT_GT(p.split_k, 1);
  // k = 16 (a weight gradient over 16 tokens): not the 128 x 128 tile, whose one partial stage takes
  // its spilling checked copy (0.78x cuBLAS; 64 x 64 1.10x).
  p = plan_gemm(row_major(DType::Float64, 6144, 4096, 16), kH100);
  EXPECT_LT(p.bm * p.bn, 128 * 128);
  // k = 128 (a weight gradient over 128 tokens, a m-major): not 128 x 128 either (0.78-0.80x cuBLAS,
  // 128 x 64 0.91-0.93x; with the loads overlapped 0.78-0.81x against 64 x 64's 0.89-0.92x).
  for (const int64_t m : {int64_t{4096}, int64_t{6144}}) {
    GemmRequest w = row_major(DType::Float64, m, 4096, 128);
    w.a = {w.a.ptr, 1, m};
    EXPECT_LT(plan_gemm(w, kH100).bm * plan_gemm(w, kH100).bn, 128 * 128) << m;
  }
  // Outside decode, only the splits swept (1-4, 6, 8): gpt-2's 128 x 768 x 3072 took 128 x 64 split 11,
  // never swept, at 0.85x cuBLAS where 32 x 64 split 8 had run 0.99x.
  for (const auto& [m, n, k] :
       {std::array<int64_t, 3>{128, 768, 3072}, {128, 4544, 18176}, {768, 768, 4096}}) {
    const int split = plan_gemm(row_major(DType::Float64, m, n, k), kH100).split_k;
    EXPECT_TRUE(split <= 4 || split == 6 || split == 8)
        << m << " x " << n << " x " << k << ": split " << split;
  }
  // gpt-2's 768-wide products at 128 tokens: 32 x 32 tiles, twice 32 x 64's CTAs (48 of those over
  // k = 768 ran 0.72x cuBLAS), not split (a split's planes cost a second kernel).
  for (GemmRequest r : {row_major(DType::Float64, 128, 768, 768),
                        transposed_b(row_major(DType::Float64, 128, 768, 768))}) {
    p = plan_gemm(r, kH100);
    EXPECT_EQ(p.bm, 32);
    EXPECT_EQ(p.bn, 32);
    EXPECT_EQ(p.split_k, 1);
  }
  // Edge tiles along n (4544 = 35.5 x 128): not the 128 x 128 tile.
  p = plan_gemm(row_major(DType::Float64, 1024, 4544, 18176), kH100);
  EXPECT_LT(p.bm * p.bn, 128 * 128);
  // 512 rows: the 16-row tile would read the weight 32 times over from L2.
  EXPECT_NE(plan_gemm(row_major(DType::Float64, 512, 4096, 4096), kH100).bm, 16);
}

// The products the GPU suite's float64 kernel check ran (all operands row-major): the DMMA kernel on any
// GPU with FP64 tensor cores, its k split on a 132-SM H100 only where the tiles leave SMs idle over a
// long k (the split instance and the planes' sum; tests/python/test_gemm_f64.py checks the products of
// both, this which one each shape takes).
TEST(GemmPlan, Float64SplitsOnlyWhereTheTilesLeaveSmsIdle) {
  struct Case {
    int64_t m, n, k;
    bool split;
  };
  for (const Case& c : {Case{4096, 4096, 512, false}, Case{1024, 1024, 8192, true},
                        Case{17, 4096, 14336, true}, Case{512, 512, 100, false}}) {
    SCOPED_TRACE(testing::Message() << c.m << " x " << c.n << " x " << c.k);
    const GemmRequest r = row_major(DType::Float64, c.m, c.n, c.k);
    const GemmPlan p = plan_gemm(r, kH100);
    EXPECT_EQ(p.kernel, GemmKernel::MmaF64);
    EXPECT_EQ(p.split_k > 1, c.split) << p.split_k;
    EXPECT_EQ(p.workspace_bytes > 0, c.split);
    EXPECT_EQ(plan_gemm(r, kA100).kernel, GemmKernel::MmaF64);
  }
}

TEST(GemmPlan, Float64OperandRowsNotWholeSixteenBytesAreCopiedOrRunGeneral) {
  GemmRequest r = row_major(DType::Float64, 1000, 1000, 333);  // a's rows 333 doubles apart
  GemmPlan p = plan_gemm(r, kH100);
  EXPECT_EQ(p.copy_a, OperandCopy::RowMajor);
  r = row_major(DType::Float64, 1000, 100, 333);  // too narrow a product to pay for the copy
  p = plan_gemm(r, kH100);
  EXPECT_EQ(p.kernel, GemmKernel::General);
}

TEST(GemmPlan, OutputNeitherRowNorColumnMajorRunsTheGeneralKernelWithoutCopies) {
  GemmRequest r = row_major(DType::BFloat16, 512, 512, 512);
  r.c_stride0 = 2 * 512, r.c_stride1 = 2;
  const GemmPlan p = plan_gemm(r, kH100);
  EXPECT_EQ(p.kernel, GemmKernel::General);
  EXPECT_EQ(p.copy_a, OperandCopy::None);
  EXPECT_EQ(p.copy_b, OperandCopy::None);
  EXPECT_EQ(p.grid, 8 * 8);
}

TEST(GemmPlan, ColumnMajorOutputIsTheTransposedProduct) {
  GemmRequest r = row_major(DType::BFloat16, 300, 200, 64);
  r.c_stride0 = 1, r.c_stride1 = 300;
  const GemmPlan p = plan_gemm(r, kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Wgmma);
  EXPECT_TRUE(p.swap_ab);
  EXPECT_EQ(p.m, 200);
  EXPECT_EQ(p.n, 300);
  EXPECT_EQ(p.ldc, 300);
  // A = b^T: b row-major [k, n] read as [n, k], unit stride along n: m-major. B = a^T: k-major.
  EXPECT_FALSE(p.a_kmajor);
  EXPECT_FALSE(p.b_nmajor);
}

TEST(GemmPlan, HalfTypesOnHopperTakeWgmmaPairsFromOneTilePerSm) {
  for (DType t : {DType::BFloat16, DType::Float16}) {
    const GemmPlan p = plan_gemm(row_major(t, 8192, 8192, 8192), kH100);
    EXPECT_EQ(p.kernel, GemmKernel::Wgmma);
    EXPECT_EQ(p.bm, 128);
    EXPECT_EQ(p.bn, 256);
    EXPECT_EQ(p.cluster_m, 2);
    // 32 x 32 = 1024 pair units on at most 66 pairs: 16 waves, so 64 pairs fill every wave.
    EXPECT_EQ(p.grid, 128);
    EXPECT_TRUE(p.tma_store);
    EXPECT_TRUE(p.a_kmajor);
    EXPECT_TRUE(p.b_nmajor);
  }
  // 256 units: 4 waves of 66 pairs, or of 64.
  EXPECT_EQ(plan_gemm(row_major(DType::BFloat16, 4096, 4096, 4096), kH100).grid, 128);
  // Fewer pairs fit (62): 1024 units take 17 waves, of 61 pairs.
  EXPECT_EQ(plan_gemm(row_major(DType::BFloat16, 8192, 8192, 8192), GemmDevice{132, true, 62}).grid,
            122);
}

TEST(GemmPlan, OneTileRowOfWideTilesRunsSingleCtas) {
  // k long enough for one wave of 128 x 256 to beat two of 128 x 128 despite its fixed cost.
  const GemmPlan p = plan_gemm(row_major(DType::BFloat16, 128, 256 * 132, 65536), kH100);
  EXPECT_EQ(p.bn, 256);
  EXPECT_EQ(p.cluster_m, 1);
  EXPECT_EQ(p.grid, 132);
}

TEST(GemmPlan, FewTilesPickTheWidthThatFinishesFirst) {
  // 1024^3: 64 tiles of 128 x 128 (one wave, 160 column-units) against 128 of 128 x 64 (one wave, 96).
  const GemmPlan p = plan_gemm(row_major(DType::BFloat16, 1024, 1024, 1024), kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Wgmma);
  EXPECT_EQ(p.bn, 64);
  EXPECT_EQ(p.cluster_m, 1);
  EXPECT_EQ(p.grid, 128);
  // 2048^3: 256 tiles of 128 x 128 (2 waves: 160 x (2 x 2048 + 512)) against one wave of 128 tiles of
  // 128 x 256 (256 x (2048 + 2048)): 1.00x cuBLAS against 0.96x, three runs.
  EXPECT_EQ(plan_gemm(row_major(DType::BFloat16, 2048, 2048, 2048), kH100).bn, 128);
  // gpt-2's c_fc weight gradient over 512 tokens (a m-major, b n-major): 128 x 64 (0.85x), not one wave
  // of 128 x 256 pairs (0.66x).
  GemmRequest w = row_major(DType::BFloat16, 3072, 768, 512);
  w.a = {w.a.ptr, 1, 3072};
  EXPECT_EQ(plan_gemm(w, kH100).bn, 64);
  // More than a wave of wide tiles, but a partial last one: 1024 x 6144 x 4096 is 192 tiles of
  // 128 x 256 (2 waves of pairs: 576) or 384 of 128 x 128 (3 waves: 480), which ran 0.97x cuBLAS
  // against 0.82x.
  const GemmPlan q = plan_gemm(row_major(DType::BFloat16, 1024, 6144, 4096), kH100);
  EXPECT_EQ(q.bn, 128);
  EXPECT_EQ(q.split_k, 1);
  // Fewer wide tiles than SMs that still finish first: 1024 x 4096 x 28672, 128 tiles of 128 x 256
  // (0.99x) against 256 of 128 x 128 (0.81x).
  EXPECT_EQ(plan_gemm(row_major(DType::BFloat16, 1024, 4096, 28672), kH100).bn, 256);
  // One row of output (decode): 16 tiles of 128 x 256 are too few, 64 of 128 x 64 one wave.
  const GemmPlan v = plan_gemm(row_major(DType::BFloat16, 1, 4096, 4096), kH100);
  EXPECT_EQ(v.bn, 64);
  EXPECT_EQ(v.grid, 64);
}

TEST(GemmPlan, OneWaveOfTallTilesWhereNarrowerOnesLeaveAPartialOne) {
  // A GPT-style c_attn weight gradient, 3072 x 1024 over k = 8192 (a m-major): 128 tiles of 192 x 128,
  // one wave on 132 SMs (cuBLAS's tile there), where 128 x 128 makes 192 (1.45 waves; its split tail
  // ran 1.09x cuBLAS, the tall tiles 1.09-1.23x).
  GemmRequest w = row_major(DType::BFloat16, 3072, 1024, 8192);
  w.a = {w.a.ptr, 1, 3072};
  GemmPlan p = plan_gemm(w, kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Wgmma);
  EXPECT_EQ(p.bm, 192);
  EXPECT_EQ(p.bn, 128);
  EXPECT_EQ(p.cluster_m, 1);
  EXPECT_EQ(p.grid, 128);
  EXPECT_EQ(p.tail_units, 0);
  EXPECT_EQ(p.workspace_bytes, 0);
  // gpt-2's c_fc weight gradient over 4096 tokens: 96 tall tiles (0.90x) against 144 of 128 x 128 and
  // their tail (0.73x).
  w = row_major(DType::Float16, 768, 3072, 4096);
  w.a = {w.a.ptr, 1, 768};
  EXPECT_EQ(plan_gemm(w, kH100).bm, 192);
  // Not where 128-row tiles fill their waves as well: big squares keep their pairs, the forwards at
  // 8192 tokens 128 x 128 (1536 tiles, 11.6 waves, against 1032 tall in 7.8); TF32 has no tall tile.
  for (const GemmRequest& r :
       {row_major(DType::BFloat16, 4096, 4096, 4096), row_major(DType::BFloat16, 8192, 8192, 8192),
        row_major(DType::BFloat16, 8192, 3072, 1024), row_major(DType::BFloat16, 1024, 6144, 4096),
        tf32(row_major(DType::Float32, 3072, 1024, 8192))}) {
    EXPECT_EQ(plan_gemm(r, kH100).bm, 128) << r.m << " x " << r.n << " x " << r.k;
  }
  // Both 16-bit types alike, on the GPU suite's tall-tile products (tests/python/test_gemm_split_k.py's
  // wgmma products; a m-major over the long k, k-major otherwise): the ragged 3000 x 1000 x 8200 too.
  for (DType t : {DType::BFloat16, DType::Float16}) {
    for (const GemmRequest& r : {transposed_a(row_major(t, 3072, 1024, 8192)),
                                 transposed_a(row_major(t, 3000, 1000, 8200))}) {
      const GemmPlan q = plan_gemm(r, kH100);
      EXPECT_EQ(q.bm, 192) << static_cast<int>(t) << ": " << r.m << " x " << r.n << " x " << r.k;
      EXPECT_EQ(q.bn, 128);
    }
    for (const GemmRequest& r : {row_major(t, 4096, 4096, 4096), row_major(t, 8192, 8192, 8192),
                                 row_major(t, 1024, 6144, 4096)}) {
      EXPECT_EQ(plan_gemm(r, kH100).bm, 128)
          << static_cast<int>(t) << ": " << r.m << " x " << r.n << " x " << r.k;
    }
  }
  // The sweep's override takes the tall tile too, and only 128 or 192 rows.
  const GemmPlan t = with_tile(plan_gemm(row_major(DType::BFloat16, 4096, 4096, 4096), kH100), 192,
                               128, 0, 1, kH100);
  EXPECT_EQ(t.bm, 192);
  EXPECT_EQ(t.grid, 118);  // 22 x 32 tiles: 6 waves of 118
}

TEST(GemmPlan, APartialLastWaveOverALongKIsSplitAlongK) {
  // gpt-2's c_fc weight gradient over 16384 tokens: 144 tiles, the last 12 in 11 runs (0.94x; 0.69x
  // without; 96 tall tiles, one wave, 0.89x).
  GemmRequest w = row_major(DType::BFloat16, 768, 3072, 16384);
  w.a = {w.a.ptr, 1, 768};
  GemmPlan p = plan_gemm(w, kH100);
  EXPECT_EQ(p.bm, 128);
  EXPECT_EQ(p.bn, 128);
  EXPECT_EQ(p.grid, 132);
  EXPECT_EQ(p.workspace_bytes, tail_workspace_bytes(132, 128, 128));
  EXPECT_EQ(p.tail_units, 12);
  EXPECT_EQ(p.tail_split, 11);
  // TF32 too, in its transposed problem: 1024 x 4544 x 18176 (0.75x data-parallel, 1.05x split).
  p = plan_gemm(tf32(row_major(DType::Float32, 1024, 4544, 18176)), kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Wgmma);
  EXPECT_GT(p.tail_units, 0);
  EXPECT_GT(p.workspace_bytes, 0);
  // Not where the waves are whole or nearly so, or the k is short: big squares keep their pairs,
  // gpt-2's short-k products their data-parallel tiles (the tail's fixed cost lost 0.3-0.5x there).
  for (const GemmRequest& r :
       {row_major(DType::BFloat16, 4096, 4096, 4096), row_major(DType::BFloat16, 8192, 8192, 8192),
        row_major(DType::BFloat16, 1024, 6144, 4096), row_major(DType::Float16, 128, 4096, 4096),
        row_major(DType::BFloat16, 128, 4096, 4096), row_major(DType::BFloat16, 512, 768, 768),
        row_major(DType::BFloat16, 1024, 1024, 1024)}) {
    const GemmPlan q = plan_gemm(r, kH100);
    EXPECT_EQ(q.tail_units, 0) << r.m << " x " << r.n << " x " << r.k;
    EXPECT_EQ(q.workspace_bytes, 0);
  }
  // wgmma never splits k over a cluster (that instance lost to the best unsplit tile everywhere and
  // is gone): not on a long k, nor on the GPU suite's bf16 products (tests/python/test_gemm_split_k.py).
  EXPECT_EQ(plan_gemm(tf32(row_major(DType::Float32, 512, 512, 8192)), kH100).split_k, 1);
  for (const GemmRequest& r :
       {row_major(DType::BFloat16, 3072, 1024, 8192), row_major(DType::BFloat16, 128, 4096, 4096),
        row_major(DType::BFloat16, 4096, 4096, 4096),
        row_major(DType::BFloat16, 1024, 1024, 1024)}) {
    const GemmPlan q = plan_gemm(r, kH100);
    EXPECT_EQ(q.kernel, GemmKernel::Wgmma) << r.m << " x " << r.n << " x " << r.k;
    EXPECT_EQ(q.split_k, 1) << r.m << " x " << r.n << " x " << r.k;
  }
  // A sweep's tile override is data-parallel and unsplit; its tail override cuts as asked, within
  // the idle SMs (60 tiles of 128 x 128 at 3072 x 1024: at most 2 runs) and the k-tiles.
  const GemmPlan t = with_tile(p, 128, 128, 0, 1, kH100);
  EXPECT_EQ(t.split_k, 1);
  EXPECT_EQ(t.tail_units, 0);
  EXPECT_EQ(t.workspace_bytes, 0);
  const GemmPlan base = plan_gemm(row_major(DType::BFloat16, 3072, 1024, 8192), kH100);
  const GemmPlan two = with_tail_split(base, 128, 2, kH100);
  EXPECT_EQ(two.bm, 128);
  EXPECT_EQ(two.tail_units, 60);
  EXPECT_EQ(two.tail_split, 2);
  EXPECT_EQ(two.workspace_bytes, tail_workspace_bytes(132, 128, 128));
  EXPECT_EQ(with_tail_split(two, 128, 3, kH100).tail_units, two.tail_units);  // refused: unchanged
  EXPECT_EQ(
      with_tail_split(plan_gemm(row_major(DType::BFloat16, 4096, 4096, 4096), kH100), 256, 0, kH100)
          .tail_units,
      0);  // 512 tiles of 128 x 256 on 132 SMs: 116 left, room for one run each
}

TEST(GemmPlan, BetaOrAnUnalignedOutputKeepsTheDirectEpilogue) {
  GemmRequest r = row_major(DType::BFloat16, 4096, 4096, 4096);
  r.beta = 0.5;
  EXPECT_FALSE(plan_gemm(r, kH100).tma_store);
  r = row_major(DType::BFloat16, 4096, 4096, 4096);
  r.c_stride0 = 4100;  // rows of c 8200 bytes apart: stored pair by pair
  EXPECT_EQ(plan_gemm(r, kH100).kernel, GemmKernel::Wgmma);
  EXPECT_FALSE(plan_gemm(r, kH100).tma_store);
  // A beta that rounds to 0 in float is 0 for the kernel, which then never reads c.
  r = row_major(DType::BFloat16, 4096, 4096, 4096);
  r.beta = 1e-60;
  EXPECT_TRUE(plan_gemm(r, kH100).tma_store);
}

TEST(GemmPlan, Tf32WithRowMajorBIsTheTransposedProblem) {
  const GemmPlan p = plan_gemm(tf32(row_major(DType::Float32, 300, 200, 64)), kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Wgmma);
  EXPECT_TRUE(p.c_trans);
  EXPECT_FALSE(p.swap_ab);
  EXPECT_EQ(p.m, 200);
  EXPECT_EQ(p.n, 300);
  EXPECT_FALSE(p.a_kmajor);
  EXPECT_FALSE(p.b_nmajor);
  EXPECT_FALSE(p.tma_store);  // float32 outputs are stored directly
  // a.t() @ b.t(): A m-major from registers, B k-major: no transposition needed.
  const GemmPlan q =
      plan_gemm(transposed_b(transposed_a(tf32(row_major(DType::Float32, 300, 200, 64)))), kH100);
  EXPECT_EQ(q.kernel, GemmKernel::Wgmma);
  EXPECT_FALSE(q.c_trans);
}

TEST(GemmPlan, Tf32TransposedATimesRowMajorBCopiesTheSmallerOperand) {
  GemmPlan p = plan_gemm(transposed_a(tf32(row_major(DType::Float32, 290, 300, 333))), kH100);
  EXPECT_EQ(p.copy_a, OperandCopy::RowMajor);
  EXPECT_EQ(p.copy_b, OperandCopy::None);
  p = plan_gemm(transposed_a(tf32(row_major(DType::Float32, 300, 290, 333))), kH100);
  EXPECT_EQ(p.copy_a, OperandCopy::None);
  EXPECT_EQ(p.copy_b, OperandCopy::ColumnMajor);
  // After the copy (a row-major, rows padded to 336 floats) the second plan asks for nothing more.
  GemmRequest copied = tf32(row_major(DType::Float32, 290, 300, 333));
  copied.a.stride0 = 336;
  const GemmPlan after = plan_gemm(copied, kH100);
  EXPECT_EQ(after.copy_a, OperandCopy::None);
  EXPECT_EQ(after.copy_b, OperandCopy::None);
  EXPECT_EQ(after.kernel, GemmKernel::Wgmma);
  // Too small a product to pay for the copy: the portable TF32 kernel reads the layout as it is.
  p = plan_gemm(transposed_a(tf32(row_major(DType::Float32, 100, 200, 64))), kH100);
  EXPECT_EQ(p.copy_a, OperandCopy::None);
  EXPECT_EQ(p.kernel, GemmKernel::MmaTf32);
  // Without wgmma every layout is copy-free.
  p = plan_gemm(transposed_a(tf32(row_major(DType::Float32, 512, 512, 512))), kA100);
  EXPECT_EQ(p.copy_a, OperandCopy::None);
  EXPECT_EQ(p.kernel, GemmKernel::MmaTf32);
}

TEST(GemmPlan, UnreadableOperandsAreCopiedWhenTheProductPays) {
  // 4097^3 float32: rows 16388 bytes apart, not a whole number of 16 bytes.
  GemmPlan p = plan_gemm(row_major(DType::Float32, 4097, 4097, 4097), kH100);
  EXPECT_EQ(p.copy_a, OperandCopy::RowMajor);
  EXPECT_EQ(p.copy_b, OperandCopy::RowMajor);
  // The copies' rows padded to 4100 floats: the SIMT kernel.
  GemmRequest r = row_major(DType::Float32, 4097, 4097, 4097);
  r.a.stride0 = r.b.stride0 = 4100;
  p = plan_gemm(r, kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Simt);
  EXPECT_EQ(p.bm, 128);
  // a is copied for >= 256 columns of c; b [4097, 300] has rows of 1200 bytes, readable as it is.
  p = plan_gemm(row_major(DType::Float32, 100, 300, 4097), kH100);
  EXPECT_EQ(p.copy_a, OperandCopy::RowMajor);
  EXPECT_EQ(p.copy_b, OperandCopy::None);
  // Below 256 rows on the other side, the general kernel reads them as they are.
  p = plan_gemm(row_major(DType::Float32, 100, 101, 4097), kH100);
  EXPECT_EQ(p.copy_a, OperandCopy::None);
  EXPECT_EQ(p.kernel, GemmKernel::General);
  // A base that is not 16-byte aligned (a view one element into its storage) is unreadable too.
  r = row_major(DType::BFloat16, 512, 512, 512);
  r.a.ptr = address(0x100002);
  EXPECT_EQ(plan_gemm(r, kH100).copy_a, OperandCopy::RowMajor);
  r.n = 64, r.b.stride0 = 64, r.c_stride0 = 64;
  p = plan_gemm(r, kH100);
  EXPECT_EQ(p.kernel, GemmKernel::General);
  EXPECT_EQ(p.copy_a, OperandCopy::None);
}

// The GPU suite's quick product on each fast path in each operand layout (tests/python/test_ops.py's
// test_gemm_fast_paths_every_layout, and its run with the wgmma switch on): 512 x 384 over k = 256, a and
// b row-major or transposed. On Hopper the 16-bit types and TF32 take wgmma (TF32's transposed a times
// row-major b after a column-major copy of b, the smaller), "highest" the SIMT kernel; without wgmma the
// mma.sync kernels, copy-free.
TEST(GemmPlan, FastPathsInEveryOperandLayout) {
  for (const FastPath& f : kFastPaths) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        SCOPED_TRACE(testing::Message() << kernel_name(f.portable) << ", a " << (ta ? "m" : "k")
                                        << "-major, b " << (tb ? "k" : "n") << "-major");
        GemmRequest r = row_major(f.t, 512, 384, 256);
        r.allow_tf32 = f.allow_tf32;
        if (ta) r = transposed_a(r);
        if (tb) r = transposed_b(r);
        const GemmPlan first = plan_gemm(r, kH100);
        EXPECT_EQ(first.copy_a, OperandCopy::None);
        EXPECT_EQ(first.copy_b,
                  f.allow_tf32 && ta && !tb ? OperandCopy::ColumnMajor : OperandCopy::None);
        EXPECT_EQ(plan_after_copies(r, kH100).kernel, f.hopper);
        for (const GemmDevice& dev : {kA100, kH100NoWgmma}) {
          const GemmPlan p = plan_gemm(r, dev);
          EXPECT_EQ(p.copy_a, OperandCopy::None);
          EXPECT_EQ(p.copy_b, OperandCopy::None);
          EXPECT_EQ(p.kernel, f.portable);
        }
      }
    }
  }
}

// TF32 of slices of wider tensors in every operand layout, with the GPU suite's strides
// (tests/python/test_ops.py's test_gemm_tf32_sliced_rows_every_layout: 300 x 290 over k = 333). Rows a
// whole number of 16 bytes apart are read in place, except on Hopper a transposed a times a row-major b:
// the smaller (b) is copied column-major. Rows that are not (leading strides one more) are copied, b
// column-major where TF32 wgmma reads it. Then wgmma on Hopper, the portable TF32 kernel elsewhere.
TEST(GemmPlan, Tf32CopiesOnlyWhatWgmmaCannotRead) {
  const int64_t m = 300, k = 333, n = 290;
  for (const int64_t odd : {int64_t{0}, int64_t{1}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        SCOPED_TRACE(testing::Message()
                     << (odd ? "odd" : "16-byte") << " rows, a " << (ta ? "m" : "k") << "-major, b "
                     << (tb ? "k" : "n") << "-major");
        GemmRequest r = tf32(row_major(DType::Float32, m, n, k));
        // Leading strides 324 or 340 for a, 340 or 332 for b (325, 341, 341, 333 with odd rows).
        r.a = ta ? GemmOperand{r.a.ptr, 1, m + 24 + odd} : GemmOperand{r.a.ptr, k + 7 + odd, 1};
        r.b = tb ? GemmOperand{r.b.ptr, 1, k + 7 + odd} : GemmOperand{r.b.ptr, n + 42 + odd, 1};
        const GemmPlan hopper = plan_gemm(r, kH100);
        EXPECT_EQ(hopper.copy_a, odd ? OperandCopy::RowMajor : OperandCopy::None);
        EXPECT_EQ(hopper.copy_b, odd || (ta && !tb) ? OperandCopy::ColumnMajor : OperandCopy::None);
        EXPECT_EQ(plan_after_copies(r, kH100).kernel, GemmKernel::Wgmma);
        for (const GemmDevice& dev : {kA100, kH100NoWgmma}) {
          const GemmPlan p = plan_gemm(r, dev);
          EXPECT_EQ(p.copy_a, odd ? OperandCopy::RowMajor : OperandCopy::None);
          EXPECT_EQ(p.copy_b, odd ? OperandCopy::RowMajor : OperandCopy::None);
          EXPECT_EQ(plan_after_copies(r, dev).kernel, GemmKernel::MmaTf32);
        }
      }
    }
  }
}

// Contiguous operands and output whose rows are not whole 16 bytes (tests/python/test_ops.py's
// test_gemm_cuda_odd_leading_strides: 257 x 259 over k = 333, c's rows 259 elements apart too, beta 0 or
// not): both operands copied into padded rows (b column-major for TF32 on wgmma), then a fast kernel,
// never the general one (whose float32 results would pass that test's accuracy check too).
TEST(GemmPlan, OddLeadingStridesAreCopiedForAFastKernel) {
  for (const FastPath& f : kFastPaths) {
    for (const double beta : {0.0, -2.0}) {
      SCOPED_TRACE(testing::Message() << kernel_name(f.portable) << ", beta " << beta);
      GemmRequest r = row_major(f.t, 257, 259, 333);
      r.allow_tf32 = f.allow_tf32;
      r.beta = beta;
      const GemmPlan first = plan_gemm(r, kH100);
      EXPECT_EQ(first.copy_a, OperandCopy::RowMajor);
      EXPECT_EQ(first.copy_b, f.allow_tf32 ? OperandCopy::ColumnMajor : OperandCopy::RowMajor);
      EXPECT_EQ(plan_after_copies(r, kH100).kernel, f.hopper);
      for (const GemmDevice& dev : {kA100, kH100NoWgmma}) {
        EXPECT_EQ(plan_gemm(r, dev).copy_b, OperandCopy::RowMajor);
        EXPECT_EQ(plan_after_copies(r, dev).kernel, f.portable);
      }
    }
  }
}

TEST(GemmPlan, OperandsTmaCannotDescribeRunTheMmaKernel) {
  // A column of a broadcast along k (strides (1, 0)): readable m-major with leading stride 0, which
  // TMA refuses (rows would overlap).
  GemmRequest r = row_major(DType::BFloat16, 512, 512, 512);
  r.a.stride0 = 1, r.a.stride1 = 0;
  const GemmPlan p = plan_gemm(r, kH100);
  EXPECT_EQ(p.kernel, GemmKernel::MmaHalf);
  EXPECT_EQ(p.lda, 0);
  // Sizes past TMA's 32-bit coordinates (m above the small-M kernel's tokens).
  r = row_major(DType::BFloat16, 32, 16, int64_t{1} << 31);
  EXPECT_EQ(plan_gemm(r, kH100).kernel, GemmKernel::MmaHalf);
}

TEST(GemmPlan, PortableTensorCoreTiles) {
  GemmPlan p = plan_gemm(row_major(DType::BFloat16, 4096, 4096, 4096), kA100);
  EXPECT_EQ(p.kernel, GemmKernel::MmaHalf);
  EXPECT_EQ(p.bm, 128);
  EXPECT_EQ(p.grid, 32 * 32);
  p = plan_gemm(row_major(DType::Float16, 1024, 1024, 1024), kA100);
  EXPECT_EQ(p.bm, 64);
  EXPECT_EQ(p.bn, 128);
  EXPECT_EQ(p.grid, 16 * 8);
  p = plan_gemm(tf32(row_major(DType::Float32, 4096, 4096, 4096)), kA100);
  EXPECT_EQ(p.kernel, GemmKernel::MmaTf32);
  EXPECT_EQ(p.bm, 128);
  EXPECT_EQ(plan_gemm(tf32(row_major(DType::Float32, 2048, 2048, 2048)), kA100).bm, 64);
}

TEST(GemmPlan, Float32HighestRunsTheSimtKernel) {
  GemmPlan p = plan_gemm(row_major(DType::Float32, 4096, 4096, 4096), kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Simt);
  EXPECT_EQ(p.bm, 128);
  EXPECT_EQ(p.bk, 8);
  EXPECT_EQ(p.grid, 32 * 32);
  EXPECT_EQ(p.split_k, 1);
  // Fewer tiles than two blocks per SM hold, over a long enough k: k split into independent CTAs whose
  // partial planes (split x m x n floats of workspace) a second kernel adds; any GPU, no cluster.
  p = plan_gemm(row_major(DType::Float32, 1024, 1024, 1024), kH100);
  EXPECT_EQ(p.bm, 128);
  EXPECT_EQ(p.grid, 8 * 8);
  EXPECT_EQ(p.split_k, 2);
  EXPECT_EQ(p.workspace_bytes, 2 * 1024 * 1024 * 4);
  EXPECT_EQ(p.workspace_bytes, cuops::kernels::split_planes_bytes(1024, 1024, 2, 4));
  p = plan_gemm(row_major(DType::Float32, 128, 4096, 4096), kH100);
  EXPECT_EQ(p.grid, 32);
  EXPECT_EQ(p.split_k, 8);  // 256 CTAs: one wave of pairs
  EXPECT_EQ(plan_gemm(row_major(DType::Float32, 128, 14336, 4096), kH100).split_k,
            7);  // 784 CTAs: 3 waves
  // 224 tiles are one wave, but 92 SMs would run two and 40 one: 896 CTAs even them out.
  EXPECT_EQ(plan_gemm(row_major(DType::Float32, 128, 28672, 4096), kH100).split_k, 4);
  // Many waves gain too little for the workspace they would take (2 ways at 4096^3: 128 MiB).
  p = plan_gemm(row_major(DType::Float32, 4096, 4096, 4096), kA100);
  EXPECT_EQ(p.split_k, 1);
  EXPECT_EQ(p.workspace_bytes, 0);
  p = plan_gemm(row_major(DType::Float32, 1024, 1024, 1024), kA100);  // no clusters needed
  EXPECT_EQ(p.bm, 128);
  EXPECT_EQ(p.split_k, 3);
  // 2048^3: 256 tiles of 128 x 128 nearly fill the SMs' 264 block slots: unsplit (the other side of
  // tests/python/test_gemm_split_k.py's split products).
  EXPECT_EQ(plan_gemm(row_major(DType::Float32, 2048, 2048, 2048), kH100).split_k, 1);
  // nn.Linear's x @ W.t() at 128 tokens, 4096 -> 4096 (b k-major) splits as a row-major b does: the split
  // test_gemm_split_k.py's reduce-overhead test replays in CUDA graphs.
  EXPECT_EQ(plan_gemm(transposed_b(row_major(DType::Float32, 128, 4096, 4096)), kH100).split_k, 8);
  // A k too short for two slices of 128: unsplit, 64 x 64 tiles to spread the 32 big ones.
  p = plan_gemm(row_major(DType::Float32, 128, 4096, 200), kH100);
  EXPECT_EQ(p.bm, 64);
  EXPECT_EQ(p.bk, 16);
  EXPECT_EQ(p.split_k, 1);
  EXPECT_EQ(p.workspace_bytes, 0);
  // An m-major a of leading stride 0 never moves the SIMT loop's pointer: the general kernel.
  GemmRequest r = row_major(DType::Float32, 300, 520, 260);
  r.a.stride0 = 1, r.a.stride1 = 0;
  EXPECT_EQ(plan_gemm(r, kH100).kernel, GemmKernel::General);
  r.k = 1;
  EXPECT_EQ(plan_gemm(r, kH100).kernel, GemmKernel::Simt);
}

TEST(GemmPlan, OneRowAndOneColumnViewsHaveNoLeadingStride) {
  // a [1, k] and c [1, n] as slices of wider tensors: their leading strides never matter.
  GemmRequest r = row_major(DType::BFloat16, 1, 4096, 4096);
  r.a.stride0 = 3, r.c_stride0 = 5;
  const GemmPlan p = plan_gemm(r, kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Skinny);
  EXPECT_EQ(p.lda, 0);
  EXPECT_EQ(p.ldc, 0);
}

using cuops::kernels::kSkinnyMaxTokens;
using cuops::kernels::with_split;

// x @ W.t() as nn.Linear runs it: x [m, k] row-major, W [n, k] row-major read as b = W.t() (k-major).
GemmRequest linear_forward(DType t, int64_t m, int64_t n, int64_t k) {
  return transposed_b(row_major(t, m, n, k));
}

TEST(GemmPlan, FewTokensTakeTheSmallMKernelInEveryFloatType) {
  for (DType t : {DType::BFloat16, DType::Float16, DType::Float32}) {
    for (bool allow_tf32 : {false, true}) {
      for (int64_t m :
           {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{15}, int64_t{kSkinnyMaxTokens}}) {
        GemmRequest fwd = linear_forward(t, m, 4096, 4096), grad = row_major(t, m, 4096, 4096);
        fwd.allow_tf32 = grad.allow_tf32 = allow_tf32;
        GemmPlan p = plan_gemm(fwd, kH100);
        EXPECT_EQ(p.kernel, GemmKernel::Skinny) << static_cast<int>(t) << " m " << m;
        EXPECT_TRUE(p.sk_tokens_m);
        EXPECT_TRUE(p.sk_w_kmajor);
        p = plan_gemm(grad, kA100);  // g @ W: the weight row-major (n-major), on any GPU
        EXPECT_EQ(p.kernel, GemmKernel::Skinny);
        EXPECT_FALSE(p.sk_w_kmajor);
        const bool half = t != DType::Float32;
        EXPECT_EQ(p.sk_mt, m <= 4 && !half ? 4 : m <= 8 ? 8 : 16);
        EXPECT_EQ(p.sk_rw * p.sk_kw, cuops::kernels::kSkinnyWarps);
      }
      // One past the boundary: the tiled kernels.
      GemmRequest r = linear_forward(t, kSkinnyMaxTokens + 1, 4096, 4096);
      r.allow_tf32 = allow_tf32;
      EXPECT_NE(plan_gemm(r, kH100).kernel, GemmKernel::Skinny);
    }
  }
  // float64 streams (DMMA on the ring) where the streaming form runs; it has no per-lane form, so
  // elsewhere the tiled float64 kernel's small tiles, k split.
  for (int64_t m : {int64_t{1}, int64_t{9}, int64_t{kSkinnyMaxTokens}}) {
    GemmPlan p = plan_gemm(linear_forward(DType::Float64, m, 4096, 4096), kH100);
    EXPECT_EQ(p.kernel, GemmKernel::Skinny) << m;
    EXPECT_TRUE(p.sk_tma);
    EXPECT_EQ(p.sk_mt, m <= 8 ? 8 : 16);
    p = plan_gemm(row_major(DType::Float64, m, 4096, 4096), kH100);  // g @ W
    EXPECT_EQ(p.kernel, GemmKernel::Skinny) << m;
    EXPECT_FALSE(p.sk_w_kmajor);
    EXPECT_EQ(plan_gemm(linear_forward(DType::Float64, m, 4096, 4096), kH100Lanes).kernel,
              GemmKernel::MmaF64);
    EXPECT_EQ(plan_gemm(linear_forward(DType::Float64, m, 4096, 4096), kA100).kernel,
              GemmKernel::MmaF64);
  }
  EXPECT_EQ(
      plan_gemm(linear_forward(DType::Float64, kSkinnyMaxTokens + 1, 4096, 4096), kH100).kernel,
      GemmKernel::MmaF64);
  // Its stages: deep (one CTA an SM) however many groups of 64 outputs (71-284 groups: 2-9 % faster
  // than two CTAs an SM), except at most 16 groups, whose few SMs' own read rate bound gpt-2's
  // 768-output products: half the k a stage and k split over 8 CTAs (0.60-0.96x -> 0.90-1.31x).
  for (int64_t n : {int64_t{2304}, int64_t{14336}, int64_t{28672}}) {
    const GemmPlan p = plan_gemm(linear_forward(DType::Float64, 1, n, 4096), kH100);
    EXPECT_EQ(p.sk_chunk, cuops::kernels::kSkinnyTmaDeepChunk / 4) << n;
  }
  for (int64_t k : {int64_t{768}, int64_t{3072}}) {
    const GemmPlan p = plan_gemm(linear_forward(DType::Float64, 1, 768, k), kH100);
    EXPECT_EQ(p.sk_chunk, cuops::kernels::kSkinnyTma.chunk / 4) << k;
    EXPECT_EQ(p.sk_split, 8) << k;
  }
}

TEST(GemmPlan, SmallMTokensMayBeTheColumnsOfC) {
  // W [n_out, k] @ x.t() with x [4, k]: c [n_out, 4], its 4 columns the tokens (b = x.t() k-major).
  GemmRequest r = transposed_b(row_major(DType::BFloat16, 4096, 4, 1024));
  GemmPlan p = plan_gemm(r, kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Skinny);
  EXPECT_FALSE(p.sk_tokens_m);
  EXPECT_TRUE(p.sk_w_kmajor);
  // The same with W given as W'.t() (m-major a): the weight's outputs contiguous.
  p = plan_gemm(transposed_a(r), kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Skinny);
  EXPECT_FALSE(p.sk_w_kmajor);
  // Tokens whose k is not contiguous (x.t() as a: m-major) are not the small-M kernel's: wgmma.
  p = plan_gemm(transposed_a(linear_forward(DType::BFloat16, 8, 4096, 4096)), kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Wgmma);
}

// Both sides of the small-M boundary as nn.Linear(1024 -> 4096) runs them, with the GPU suite's operands
// (tests/python/test_gemm_small_m.py's products at M = 16 and 17: slices of wider tensors, rows a whole
// number of 16 bytes and 16 bytes more apart), forward x @ W.t() and input gradient g @ W, in every float
// type: M = 16 takes the small-M kernel, streamed on Hopper and per lane without the stream (float64, which
// has no per-lane form: the DMMA kernel), M = 17 the tiled kernels.
TEST(GemmPlan, SmallMBoundaryAsNnLinearRunsIt) {
  for (const auto& [t, allow_tf32] :
       {std::pair{DType::BFloat16, false}, std::pair{DType::Float16, false},
        std::pair{DType::Float32, false}, std::pair{DType::Float32, true},
        std::pair{DType::Float64, false}}) {
    const int64_t unit = t == DType::Float64 ? 2 : t == DType::Float32 ? 4 : 8;
    const auto ld = [unit](int64_t cols) { return (cols + unit - 1) / unit * unit + unit; };
    const bool f64 = t == DType::Float64;
    for (const bool forward : {true, false}) {
      for (const int64_t m : {int64_t{kSkinnyMaxTokens}, int64_t{kSkinnyMaxTokens} + 1}) {
        SCOPED_TRACE(testing::Message()
                     << static_cast<int>(t) << (allow_tf32 ? " tf32" : "")
                     << (forward ? " forward" : " input gradient") << ", m " << m);
        // Forward: x [m, 1024] @ W.t() (W [4096, 1024]); input gradient: g [m, 4096] @ W.
        GemmRequest r = forward ? row_major(t, m, 4096, 1024) : row_major(t, m, 1024, 4096);
        r.allow_tf32 = allow_tf32;
        r.a.stride0 = ld(r.k);
        r.b = forward ? GemmOperand{r.b.ptr, 1, ld(1024)} : GemmOperand{r.b.ptr, ld(1024), 1};
        const bool small = m <= kSkinnyMaxTokens;
        const GemmPlan hopper = plan_gemm(r, kH100);
        EXPECT_EQ(hopper.kernel == GemmKernel::Skinny, small) << kernel_name(hopper.kernel);
        EXPECT_EQ(hopper.sk_tma, small);
        if (f64) {
          EXPECT_EQ(hopper.kernel == GemmKernel::MmaF64, !small) << kernel_name(hopper.kernel);
        }
        for (const GemmDevice& dev : {kH100Lanes, kA100}) {
          const GemmPlan p = plan_gemm(r, dev);
          EXPECT_EQ(p.kernel == GemmKernel::Skinny, small && !f64) << kernel_name(p.kernel);
          EXPECT_FALSE(p.sk_tma);
          if (f64) {
            EXPECT_EQ(p.kernel, GemmKernel::MmaF64);
          }
        }
      }
    }
  }
}

TEST(GemmPlan, SmallMSplitsKWhereTheOutputsCannotFillTheSms) {
  // 4096 x 14336 (Llama down_proj): 256 groups of 16 outputs, 8 slices of k to reach 16 warps per SM:
  // 4 warps of a block by a cluster of 2 on Hopper (the per-lane form); the warps of one block elsewhere.
  GemmPlan p = plan_gemm(linear_forward(DType::BFloat16, 1, 4096, 14336), kH100Lanes);
  EXPECT_EQ(p.sk_kw, 4);
  EXPECT_EQ(p.sk_split, 2);
  EXPECT_EQ(p.sk_slice, 14336 / 8);
  EXPECT_EQ(p.grid, 256);
  p = plan_gemm(linear_forward(DType::BFloat16, 1, 4096, 14336), kA100);
  EXPECT_EQ(p.sk_kw, 4);
  EXPECT_EQ(p.sk_split, 1);
  // 28672 outputs (gate_up): enough groups for the SMs, no cluster.
  p = plan_gemm(linear_forward(DType::BFloat16, 1, 28672, 4096), kH100Lanes);
  EXPECT_EQ(p.sk_rw, 1);
  EXPECT_EQ(p.sk_kw, 4);
  EXPECT_EQ(p.sk_split, 1);
  EXPECT_EQ(p.grid, 28672 / 16);
  // g @ W with 4096 outputs (64 groups of 64): clusters of 4 for bf16 (8 measured slower); float32's
  // 32 groups of 128 take 8.
  p = plan_gemm(row_major(DType::BFloat16, 1, 4096, 14336), kH100Lanes);
  EXPECT_EQ(p.sk_split, 4);
  p = plan_gemm(row_major(DType::Float32, 1, 4096, 14336), kH100Lanes);
  EXPECT_EQ(p.sk_split, 8);
  // A short k: slices of at least four chunks, a chunk at the least.
  p = plan_gemm(linear_forward(DType::BFloat16, 1, 64, 96), kH100Lanes);
  EXPECT_EQ(p.sk_kw, 1);
  EXPECT_EQ(p.sk_slice, 96);
  p = plan_gemm(linear_forward(DType::Float32, 1, 64, 0), kH100Lanes);
  EXPECT_EQ(p.kernel, GemmKernel::Skinny);
  EXPECT_EQ(p.sk_slice, 128);
  // The experiments' override recomputes the slice and the grid.
  p = with_split(plan_gemm(linear_forward(DType::BFloat16, 1, 4096, 14336), kH100Lanes), 1, 4, 8);
  EXPECT_EQ(p.sk_slice, 448);
  EXPECT_EQ(p.grid, 256);
}

using cuops::kernels::kSkinnyTma;
using cuops::kernels::kSkinnyTmaStages;
using cuops::kernels::with_stream;

TEST(GemmPlan, SmallMStreamsTheWeightByTmaOnHopper) {
  // 4096 x 14336 (down_proj): 64 groups of 64 outputs, at most half the SMs: deep stages (256 k, one
  // CTA per SM), no cluster (64 CTAs already half the SMs), 56 stages each.
  GemmPlan p = plan_gemm(linear_forward(DType::BFloat16, 1, 4096, 14336), kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Skinny);
  EXPECT_TRUE(p.sk_tma);
  EXPECT_TRUE(p.sk_pdl);
  EXPECT_EQ(p.sk_stages, kSkinnyTmaStages);
  EXPECT_EQ(p.sk_chunk, cuops::kernels::kSkinnyTmaDeepChunk);
  EXPECT_EQ(p.sk_rw, cuops::kernels::kSkinnyWarps);
  EXPECT_EQ(p.sk_kw, 1);
  EXPECT_EQ(p.grid, 64);
  EXPECT_EQ(p.sk_split, 1);
  EXPECT_EQ(p.sk_slice, 14336);
  // g @ W (the weight o-contiguous), fp16, 16 tokens: the same.
  p = plan_gemm(row_major(DType::Float16, 16, 4096, 14336), kH100);
  EXPECT_TRUE(p.sk_tma);
  EXPECT_FALSE(p.sk_w_kmajor);
  EXPECT_EQ(p.sk_mt, 16);
  EXPECT_EQ(p.sk_split, 1);
  // 1000 outputs over a k of 4104: 16 groups, k split to 64 CTAs but every CTA >= 8 stages: 2.
  p = plan_gemm(linear_forward(DType::BFloat16, 1, 1000, 4104), kH100);
  EXPECT_EQ(p.sk_split, 2);
  EXPECT_EQ(p.sk_slice, 9 * 256);
  // 28672 outputs (gate_up): 448 groups, more than the SMs: stages of 128 k (two CTAs per SM).
  p = plan_gemm(linear_forward(DType::BFloat16, 1, 28672, 4096), kH100);
  EXPECT_EQ(p.grid, 448);
  EXPECT_EQ(p.sk_chunk, kSkinnyTma.chunk);
  EXPECT_EQ(p.sk_split, 1);
  EXPECT_EQ(p.sk_slice, 4096);
  // 3 outputs over a k of 20000: one group, a cluster of 8.
  p = plan_gemm(linear_forward(DType::BFloat16, 1, 3, 20000), kH100);
  EXPECT_EQ(p.sk_split, 8);
  // A short k: one stage, no split; the slice a whole stage past k (TMA's zeros fill it).
  p = plan_gemm(linear_forward(DType::BFloat16, 1, 64, 96), kH100);
  EXPECT_TRUE(p.sk_tma);
  EXPECT_EQ(p.sk_split, 1);
  EXPECT_EQ(p.sk_slice, 256);
  // TF32 streams too (m16n8k8), stages of the same bytes: 128 k; token tiles of 8 at least.
  p = plan_gemm(tf32(linear_forward(DType::Float32, 2, 4096, 4096)), kH100);
  EXPECT_TRUE(p.sk_tma);
  EXPECT_EQ(p.sk_chunk, 128);
  EXPECT_EQ(p.sk_mt, 8);
  EXPECT_EQ(with_stream(p, 4, 64, 1).sk_chunk, 64);
  // float32 "highest" streams too (FP32 FMAs), on every SM: 64 groups deep, k split over 2 (132 SMs);
  // 96 groups deep still (one CTA per SM), 448 in stages of 64 k (two per SM).
  p = plan_gemm(linear_forward(DType::Float32, 16, 4096, 4096), kH100);
  EXPECT_TRUE(p.sk_tma);
  EXPECT_EQ(p.sk_mt, 16);
  EXPECT_EQ(p.sk_chunk, 128);
  EXPECT_EQ(p.sk_split, 2);
  p = plan_gemm(row_major(DType::Float32, 1, 4096, 14336), kH100);  // g @ W: o-contiguous
  EXPECT_TRUE(p.sk_tma);
  EXPECT_FALSE(p.sk_w_kmajor);
  EXPECT_EQ(p.sk_mt, 8);
  EXPECT_EQ(p.sk_split, 2);
  p = plan_gemm(linear_forward(DType::Float32, 16, 6144, 4096), kH100);
  EXPECT_EQ(p.grid, 96);
  EXPECT_EQ(p.sk_chunk, 128);
  EXPECT_EQ(p.sk_split, 1);
  p = plan_gemm(linear_forward(DType::Float32, 16, 28672, 4096), kH100);
  EXPECT_EQ(p.sk_chunk, 64);
  EXPECT_EQ(p.sk_split, 1);
  // ... but at <= 4 tokens with many groups of a k-contiguous weight, the per-lane form.
  EXPECT_FALSE(plan_gemm(linear_forward(DType::Float32, 4, 28672, 4096), kH100).sk_tma);
  EXPECT_FALSE(plan_gemm(linear_forward(DType::Float32, 1, 6144, 4096), kH100).sk_tma);
  EXPECT_TRUE(plan_gemm(linear_forward(DType::Float32, 1, 4096, 4096), kH100).sk_tma);
  EXPECT_TRUE(plan_gemm(row_major(DType::Float32, 1, 28672, 4096), kH100).sk_tma);
  EXPECT_TRUE(plan_gemm(tf32(linear_forward(DType::Float32, 1, 6144, 4096)), kH100).sk_tma);
  // Where it does not stream: k = 0, no encoder, no sm_90.
  p = plan_gemm(linear_forward(DType::BFloat16, 1, 64, 0), kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Skinny);
  EXPECT_FALSE(p.sk_tma);
  EXPECT_FALSE(plan_gemm(linear_forward(DType::BFloat16, 1, 4096, 4096), kH100Lanes).sk_tma);
  EXPECT_FALSE(plan_gemm(linear_forward(DType::BFloat16, 1, 4096, 4096), kA100).sk_tma);
  // The experiments' overrides: another ring, or back to the per-lane form.
  p = with_stream(plan_gemm(linear_forward(DType::BFloat16, 1, 4096, 14336), kH100), 6, 256, 2);
  EXPECT_EQ(p.sk_stages, 6);
  EXPECT_EQ(p.sk_chunk, 256);
  EXPECT_EQ(p.sk_slice, 28 * 256);
  EXPECT_FALSE(with_stream(p, 6, 256, 2, false).sk_pdl);
  p = with_split(p, 1, 4, 2);
  EXPECT_FALSE(p.sk_tma);
  EXPECT_FALSE(p.sk_pdl);
  EXPECT_EQ(p.sk_kw, 4);
  EXPECT_FALSE(
      with_stream(plan_gemm(linear_forward(DType::BFloat16, 1, 64, 0), kH100), 4, 128, 1).sk_tma);
}

// Every tile once, in groups of 8 tile rows walked column by column (the last group short).
TEST(TileOrder, EveryTileOnceInGroupsOfEightRows) {
  for (const auto& [tiles_m, tiles_n] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {1, 37}, {3, 5}, {8, 8}, {9, 4}, {17, 3}, {24, 40}, {100, 7}}) {
    SCOPED_TRACE(testing::Message() << tiles_m << " x " << tiles_n << " tiles");
    std::vector<int> seen(tiles_m * tiles_n, 0);
    for (int64_t id = 0; id < tiles_m * tiles_n; ++id) {
      int64_t tm = -1, tn = -1;
      cuops::kernels::detail::tile_coords<8>(id, tiles_m, tiles_n, tm, tn);
      ASSERT_TRUE(tm >= 0 && tm < tiles_m && tn >= 0 && tn < tiles_n)
          << "id " << id << " -> " << tm << ", " << tn;
      EXPECT_EQ(tm / 8, id / (8 * tiles_n)) << "id " << id;  // the group of rows comes first
      ++seen[tm * tiles_n + tn];
    }
    for (int64_t t = 0; t < tiles_m * tiles_n; ++t) EXPECT_EQ(seen[t], 1) << "tile " << t;
  }
}

// The 32-bit form is the 64-bit one wherever tile_coords takes it, up to the edge of its condition,
// and beyond the edge tile_coords takes the 64-bit form (fresh random ids; the seed is printed).
TEST(TileOrder, ThirtyTwoBitFormIsTheSixtyFourBitOne) {
  using cuops::kernels::detail::tile_coords;
  using cuops::kernels::detail::tile_coords_in;
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  // (tiles_m + 8) x tiles_n just under 2^32, then just over it.
  for (const auto& [tiles_m, tiles_n] : std::vector<std::pair<int64_t, int64_t>>{{65000, 66000},
                                                                                 {8, 268435455},
                                                                                 {536870903, 8},
                                                                                 {1, 477218588},
                                                                                 {65536, 65536},
                                                                                 {70000, 70000},
                                                                                 {3, 1LL << 31}}) {
    const int64_t tiles = tiles_m * tiles_n;
    const bool narrow = (tiles_m + 8) * tiles_n < (int64_t{1} << 32);
    SCOPED_TRACE(testing::Message() << tiles_m << " x " << tiles_n << " tiles");
    std::vector<int64_t> ids = {0, 1, 7, 8, 8 * tiles_n - 1, 8 * tiles_n, tiles - 1};
    for (int i = 0; i < 2000; ++i)
      ids.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(tiles)));
    for (const int64_t id : ids) {
      if (id < 0 || id >= tiles) continue;
      int64_t tm = -1, tn = -1, tm64 = -2, tn64 = -2;
      tile_coords<8>(id, tiles_m, tiles_n, tm, tn);
      tile_coords_in<int64_t, 8>(id, tiles_m, tiles_n, tm64, tn64);
      ASSERT_EQ(tm, tm64) << "id " << id;
      ASSERT_EQ(tn, tn64) << "id " << id;
      if (narrow) {
        int64_t tm32 = -3, tn32 = -3;
        tile_coords_in<uint32_t, 8>(static_cast<uint32_t>(id), static_cast<uint32_t>(tiles_m),
                                    static_cast<uint32_t>(tiles_n), tm32, tn32);
        ASSERT_EQ(tm32, tm64) << "id " << id;
        ASSERT_EQ(tn32, tn64) << "id " << id;
      }
    }
  }
}

}  // namespace
