// The GEMM planner's rules (kernels/gemm_plan.cpp's table), one test per row, on the CPU: the planner
// is a plain function of the problem and the device, so no GPU is needed to check what it picks.
#include <gtest/gtest.h>

#include <cstdint>

#include "kernels/gemm_plan.h"

namespace {

using cuops::kernels::DType;
using cuops::kernels::GemmDevice;
using cuops::kernels::GemmKernel;
using cuops::kernels::GemmPlan;
using cuops::kernels::GemmRequest;
using cuops::kernels::OperandCopy;
using cuops::kernels::plan_gemm;

const GemmDevice kH100{132, true, 66};
const GemmDevice kA100{108, false, 0};

void* address(uintptr_t a) { return reinterpret_cast<void*>(a); }

// c = a @ b with a [m, k], b [k, n], c [m, n] all row-major and contiguous, 16-byte aligned bases.
GemmRequest row_major(DType t, int64_t m, int64_t n, int64_t k) {
  return {t, m, n, k, {address(0x100000), k, 1}, {address(0x200000), n, 1}, address(0x300000), n, 1, 1.0, 0.0, false};
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

TEST(GemmPlan, EmptyOutputRunsNothing) {
  EXPECT_EQ(plan_gemm(row_major(DType::BFloat16, 0, 5, 7), kH100).kernel, GemmKernel::None);
  EXPECT_EQ(plan_gemm(row_major(DType::Float32, 5, 0, 7), kH100).kernel, GemmKernel::None);
}

TEST(GemmPlan, Float64RunsTheGeneralKernel) {
  EXPECT_EQ(plan_gemm(row_major(DType::Float64, 4096, 4096, 4096), kH100).kernel, GemmKernel::General);
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
  // Fewer pairs fit (60): 1024 units take 18 waves, of 57 pairs.
  EXPECT_EQ(plan_gemm(row_major(DType::BFloat16, 8192, 8192, 8192), GemmDevice{132, true, 60}).grid, 114);
}

TEST(GemmPlan, OneTileRowOfWideTilesRunsSingleCtas) {
  const GemmPlan p = plan_gemm(row_major(DType::BFloat16, 128, 256 * 132, 256), kH100);
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
  // 2048^3: 256 tiles of 128 x 128 (2 waves: 320) against 512 of 128 x 64 (4 waves: 384).
  EXPECT_EQ(plan_gemm(row_major(DType::BFloat16, 2048, 2048, 2048), kH100).bn, 128);
  // One row of output (decode): 16 tiles of 128 x 256 are too few, 64 of 128 x 64 one wave.
  const GemmPlan v = plan_gemm(row_major(DType::BFloat16, 1, 4096, 4096), kH100);
  EXPECT_EQ(v.bn, 64);
  EXPECT_EQ(v.grid, 64);
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
  const GemmPlan q = plan_gemm(transposed_b(transposed_a(tf32(row_major(DType::Float32, 300, 200, 64)))), kH100);
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

TEST(GemmPlan, OperandsTmaCannotDescribeRunTheMmaKernel) {
  // A column of a broadcast along k (strides (1, 0)): readable m-major with leading stride 0, which
  // TMA refuses (rows would overlap).
  GemmRequest r = row_major(DType::BFloat16, 512, 512, 512);
  r.a.stride0 = 1, r.a.stride1 = 0;
  const GemmPlan p = plan_gemm(r, kH100);
  EXPECT_EQ(p.kernel, GemmKernel::MmaHalf);
  EXPECT_EQ(p.lda, 0);
  // Sizes past TMA's 32-bit coordinates.
  r = row_major(DType::BFloat16, 16, 16, int64_t{1} << 31);
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
  p = plan_gemm(row_major(DType::Float32, 1024, 1024, 1024), kH100);
  EXPECT_EQ(p.bm, 64);
  EXPECT_EQ(p.bk, 16);
  EXPECT_EQ(p.grid, 16 * 16);
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
  EXPECT_EQ(p.kernel, GemmKernel::Wgmma);
  EXPECT_EQ(p.lda, 0);
  EXPECT_EQ(p.ldc, 0);
}

}  // namespace
