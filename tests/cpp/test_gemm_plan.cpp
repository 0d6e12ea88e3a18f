// The GEMM planner on the CPU: it is a plain function of the problem and the device, so no GPU is
// needed to check what it picks. One TEST(GemmRule, <row>) per row of the table at the top of
// kernels/gemm/gemm_plan.cpp, in the table's order: the row's condition (with a case just outside it
// where that means something) and the plan it makes. Then the checks across rows (every operand
// layout, the GPU suite's products, which rule names each plan), and the tiled kernels' tile order
// (kernels/gemm/tile_order.h), host and device code alike.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/gemm/gemm_plan_hooks.h"
#include "kernels/gemm/tile_order.h"

namespace {

using cuops::kernels::Activation;
using cuops::kernels::CopyLayout;
using cuops::kernels::CopyVia;
using cuops::kernels::describe;
using cuops::kernels::DType;
using cuops::kernels::GemmDevice;
using cuops::kernels::GemmEpilogue;
using cuops::kernels::GemmKernel;
using cuops::kernels::GemmOperand;
using cuops::kernels::GemmPlan;
using cuops::kernels::GemmRequest;
using cuops::kernels::GroupedPlan;
using cuops::kernels::GroupedRequest;
using cuops::kernels::kernel_name;
using cuops::kernels::kSkinnyMaxTokens;
using cuops::kernels::kSkinnyTma;
using cuops::kernels::kSkinnyTmaDeepChunk;
using cuops::kernels::kSkinnyTmaStages;
using cuops::kernels::kSkinnyWarps;
using cuops::kernels::OperandCopy;
using cuops::kernels::plan_gemm;
using cuops::kernels::plan_grouped;
using cuops::kernels::split_planes_bytes;
using cuops::kernels::tail_workspace_bytes;
using cuops::kernels::with_split;
using cuops::kernels::with_split_k;
using cuops::kernels::with_stream;
using cuops::kernels::with_tail_split;
using cuops::kernels::with_tile;

const GemmDevice kH100{132, true, 66, true, true, true, true};
// Hopper without the small-M kernel's streaming form (no tensor-map encoder): its per-lane form.
const GemmDevice kH100Lanes{132, true, 66, true, false, true, true};
const GemmDevice kA100{108, false, 0, false, false, true};
// A GPU without FP64 tensor cores (before sm_80), or a build without code for them.
const GemmDevice kNoDmma{80, false, 0, false, false, false};
// Hopper with the wgmma kernel switched off (CUOPS_DISABLE_WGMMA): the mma.sync kernels' plans.
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
// a given as a.t() of a row-major [k, m] tensor (m-major), b as b.t() of a row-major [n, k]
// (k-major).
GemmRequest transposed_a(GemmRequest r) {
  r.a.stride0 = 1, r.a.stride1 = r.m;
  return r;
}
GemmRequest transposed_b(GemmRequest r) {
  r.b.stride0 = 1, r.b.stride1 = r.k;
  return r;
}
// x @ W.t() as nn.Linear runs it: x [m, k] row-major, W [n, k] row-major read as b = W.t()
// (k-major).
GemmRequest linear_forward(DType t, int64_t m, int64_t n, int64_t k) {
  return transposed_b(row_major(t, m, n, k));
}

// Whether a plan is the small-M kernel's streaming form (false for any other kernel).
bool streams(const GemmPlan& p) { return p.kernel == GemmKernel::Skinny && p.skinny().tma; }

const char* layout_name(CopyLayout l) {
  return l == CopyLayout::None ? "none" : l == CopyLayout::RowMajor ? "row-major" : "column-major";
}

// Whether `c` is the copy described: its layout, how it is made, its shape and its padded rows.
testing::AssertionResult is_copy(const OperandCopy& c, CopyLayout layout, CopyVia via, int64_t rows,
                                 int64_t cols, int64_t ld) {
  if (c.layout == layout && c.via == via && c.rows == rows && c.cols == cols && c.ld == ld)
    return testing::AssertionSuccess();
  return testing::AssertionFailure() << "copy " << layout_name(c.layout) << " via "
                                     << (c.via == CopyVia::Transpose ? "transpose" : "strided")
                                     << ", " << c.rows << " x " << c.cols << " ld " << c.ld;
}

// The request ops/gemm.cpp's kernel reads once it has made the copies `p` asks for: each copied
// operand in a fresh buffer (256-byte aligned) of rows ld elements apart, read row-major, or
// column-major (the buffer holds the operand's transpose).
GemmRequest copied(GemmRequest r, const GemmPlan& p) {
  const auto view = [](const OperandCopy& c, uintptr_t at, const GemmOperand& source) {
    if (c.layout == CopyLayout::RowMajor) return GemmOperand{address(at), c.ld, 1};
    if (c.layout == CopyLayout::ColumnMajor) return GemmOperand{address(at), 1, c.ld};
    return source;
  };
  r.a = view(p.copy_a, 0x400000, r.a);
  r.b = view(p.copy_b, 0x500000, r.b);
  return r;
}

// The one pass plans the rest for the copies: the plan is the one the copied operands get (which
// asks for no further copy), and where it copies, the kernel reads the copy (pointer unset).
testing::AssertionResult planned_for_copies(const GemmRequest& r, const GemmDevice& dev) {
  const GemmPlan p = plan_gemm(r, dev), q = plan_gemm(copied(r, p), dev);
  const auto reads_copy = [](const OperandCopy& c, const GemmOperand& o) {
    return c.layout == CopyLayout::None ||
           (o.ptr == nullptr &&
            (c.layout == CopyLayout::RowMajor ? o.stride0 == c.ld : o.stride1 == c.ld));
  };
  if (q.copy_a.layout == CopyLayout::None && q.copy_b.layout == CopyLayout::None &&
      describe(p) == describe(q) && std::strcmp(p.rule, q.rule) == 0 && p.swap_ab == q.swap_ab &&
      p.a_kmajor == q.a_kmajor && p.b_nmajor == q.b_nmajor && p.m == q.m && p.n == q.n &&
      p.lda == q.lda && p.ldb == q.ldb && p.ldc == q.ldc &&
      p.workspace_bytes == q.workspace_bytes && reads_copy(p.copy_a, p.a) &&
      reads_copy(p.copy_b, p.b))
    return testing::AssertionSuccess();
  return testing::AssertionFailure()
         << "one pass: " << describe(p) << " [" << p.rule << "] lda " << p.lda << " ldb " << p.ldb
         << "; on the copies: " << describe(q) << " [" << q.rule << "] lda " << q.lda << " ldb "
         << q.ldb << ", copies " << layout_name(q.copy_a.layout) << " / "
         << layout_name(q.copy_b.layout);
}

// The fast paths by dtype and float32 matmul precision: the kernel on Hopper, and without wgmma
// (an A100, or Hopper with CUOPS_DISABLE_WGMMA).
struct FastPath {
  DType t;
  bool allow_tf32;
  GemmKernel hopper, portable;
};
const FastPath kFastPaths[] = {{DType::BFloat16, false, GemmKernel::Wgmma, GemmKernel::MmaHalf},
                               {DType::Float16, false, GemmKernel::Wgmma, GemmKernel::MmaHalf},
                               {DType::Float32, true, GemmKernel::Wgmma, GemmKernel::MmaTf32},
                               {DType::Float32, false, GemmKernel::Simt, GemmKernel::Simt}};

// The table's rows in its order (kernels/gemm/gemm_plan.cpp).
const char* const kRules[] = {"EmptyOutput",
                              "Float64WithoutDmma",
                              "OutputNotRowOrColumnMajor",
                              "OutputMisaligned",
                              "CopyOperand",
                              "CopyForTf32Wgmma",
                              "ColumnMajorOutput",
                              "OperandNotReadable",
                              "SmallM",
                              "SmallMStream",
                              "SmallMFloat32Lanes",
                              "SmallMStreamDeep",
                              "SmallMFloat64",
                              "Float64Tiles",
                              "Wgmma",
                              "WgmmaTile",
                              "WgmmaTall",
                              "WgmmaTailSplit",
                              "WgmmaGrid",
                              "WgmmaTmaStore",
                              "WgmmaDependentLaunch",
                              "MmaHalf",
                              "MmaTf32",
                              "SimtLeadingStrideZero",
                              "Simt"};

// ---- The table's rows, in its order ----

// m or n is 0: no element of c to write, no kernel, whatever the rest of the request.
TEST(GemmRule, EmptyOutput) {
  for (const GemmRequest& r :
       {row_major(DType::BFloat16, 0, 5, 7), row_major(DType::Float32, 5, 0, 7),
        row_major(DType::Float64, 0, 0, 0)}) {
    const GemmPlan p = plan_gemm(r, kH100);
    EXPECT_EQ(p.kernel, GemmKernel::None) << describe(p);
    EXPECT_STREQ(p.rule, "EmptyOutput");
    EXPECT_EQ(p.grid, 0);
  }
  // Before the float64 rule: nothing to run there either.
  EXPECT_STREQ(plan_gemm(row_major(DType::Float64, 0, 5, 7), kNoDmma).rule, "EmptyOutput");
  // k = 0 is not empty: c is still written (beta c).
  EXPECT_NE(plan_gemm(row_major(DType::BFloat16, 5, 5, 0), kH100).kernel, GemmKernel::None);
}

// float64 without FP64 tensor cores (before sm_80, or a build without their code): the general
// kernel, which reads every layout as it is (nothing copied).
TEST(GemmRule, Float64WithoutDmma) {
  GemmPlan p = plan_gemm(row_major(DType::Float64, 4096, 4096, 4096), kNoDmma);
  EXPECT_EQ(p.kernel, GemmKernel::General) << describe(p);
  EXPECT_STREQ(p.rule, "Float64WithoutDmma");
  EXPECT_EQ(p.grid, 64 * 64);
  // a's rows 333 doubles apart, which the DMMA kernel's plan copies (CopyOperand): read in place.
  p = plan_gemm(row_major(DType::Float64, 1000, 1000, 333), kNoDmma);
  EXPECT_EQ(p.kernel, GemmKernel::General);
  EXPECT_EQ(p.copy_a.layout, CopyLayout::None);
  // With DMMA (an A100 too) the float64 kernel; the device's other types are not concerned.
  EXPECT_EQ(plan_gemm(row_major(DType::Float64, 4096, 4096, 4096), kA100).kernel,
            GemmKernel::MmaF64);
  EXPECT_EQ(plan_gemm(row_major(DType::Float32, 4096, 4096, 4096), kNoDmma).kernel,
            GemmKernel::Simt);
}

// c neither row- nor column-major: the general kernel, without copies (it reads any strides).
TEST(GemmRule, OutputNotRowOrColumnMajor) {
  GemmRequest r = row_major(DType::BFloat16, 512, 512, 512);
  r.c_stride0 = 2 * 512, r.c_stride1 = 2;  // every other element of c's rows
  GemmPlan p = plan_gemm(r, kH100);
  EXPECT_EQ(p.kernel, GemmKernel::General) << describe(p);
  EXPECT_STREQ(p.rule, "OutputNotRowOrColumnMajor");
  EXPECT_EQ(p.copy_a.layout, CopyLayout::None);
  EXPECT_EQ(p.copy_b.layout, CopyLayout::None);
  EXPECT_EQ(p.grid, 8 * 8);
  // An operand a fast kernel would copy (a's rows 513 elements apart) is read as it is.
  r.a.stride0 = 513;
  p = plan_gemm(r, kH100);
  EXPECT_EQ(p.kernel, GemmKernel::General);
  EXPECT_EQ(p.copy_a.layout, CopyLayout::None);
  EXPECT_EQ(p.a.ptr, r.a.ptr);
  EXPECT_EQ(p.a.stride0, 513);
  // Just outside: c's rows, or its columns, padded (a slice of a wider tensor): a fast kernel.
  r = row_major(DType::BFloat16, 512, 512, 512);
  r.c_stride0 = 520;
  EXPECT_EQ(plan_gemm(r, kH100).kernel, GemmKernel::Wgmma);
  r.c_stride0 = 1, r.c_stride1 = 520;
  EXPECT_EQ(plan_gemm(r, kH100).kernel, GemmKernel::Wgmma);
}

// c's base not a multiple of its element size (a byte offset into its storage): the fast
// epilogues store pairs and 16-byte boxes at their alignment, the general kernel one element at a
// time. Aligned to its element but not to 16 bytes, a fast kernel still runs (no TMA store).
TEST(GemmRule, OutputMisaligned) {
  GemmRequest r = row_major(DType::BFloat16, 4096, 4096, 4096);
  r.c = address(0x300001);
  GemmPlan p = plan_gemm(r, kH100);
  EXPECT_EQ(p.kernel, GemmKernel::General) << describe(p);
  EXPECT_STREQ(p.rule, "OutputMisaligned");
  EXPECT_EQ(p.grid, 64 * 64);
  // Before the copies: an operand the fast kernels would copy (rows 4097 apart) is read as it is.
  r.a.stride0 = 4097;
  p = plan_gemm(r, kH100);
  EXPECT_STREQ(p.rule, "OutputMisaligned");
  EXPECT_EQ(p.copy_a.layout, CopyLayout::None);
  // Just outside, per type: bf16 at 2 bytes, float32 at 4, float64 at 8.
  r = row_major(DType::BFloat16, 4096, 4096, 4096);
  r.c = address(0x300002);
  p = plan_gemm(r, kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Wgmma) << describe(p);
  EXPECT_FALSE(p.wgmma().tma_store);
  r = row_major(DType::Float32, 4096, 4096, 4096);
  r.c = address(0x300002);
  EXPECT_STREQ(plan_gemm(r, kH100).rule, "OutputMisaligned");
  r.c = address(0x300004);
  EXPECT_EQ(plan_gemm(r, kH100).kernel, GemmKernel::Simt);
  r = row_major(DType::Float64, 512, 512, 512);
  r.c = address(0x300004);
  EXPECT_STREQ(plan_gemm(r, kH100).rule, "OutputMisaligned");
  r.c = address(0x300008);
  EXPECT_EQ(plan_gemm(r, kH100).kernel, GemmKernel::MmaF64);
}

// An operand the fast kernels cannot read in place (rows not a whole number of 16 bytes apart, no
// unit stride, or a base not 16-byte aligned) with >= 256 on c's other side: copied into rows of
// ld elements (its contiguous length rounded up to 16 bytes), by cuops' transpose kernel where a
// float32 source's contiguous axis is the copy's strided one, else by a strided copy. The rest of
// the plan is made for the copy, which the kernel reads (its pointer set by the caller).
TEST(GemmRule, CopyOperand) {
  // 4097^3 float32: rows 16388 bytes apart. Both copied row-major into rows of 4100 floats (their
  // contiguous axis is the copies': strided copies); the SIMT kernel reads the copies.
  GemmRequest r = row_major(DType::Float32, 4097, 4097, 4097);
  GemmPlan p = plan_gemm(r, kH100);
  EXPECT_TRUE(is_copy(p.copy_a, CopyLayout::RowMajor, CopyVia::Strided, 4097, 4097, 4100));
  EXPECT_TRUE(is_copy(p.copy_b, CopyLayout::RowMajor, CopyVia::Strided, 4097, 4097, 4100));
  EXPECT_EQ(p.kernel, GemmKernel::Simt) << describe(p);
  EXPECT_EQ(p.tiled().bm, 128);
  EXPECT_EQ(p.a.ptr, nullptr);
  EXPECT_EQ(p.a.stride0, 4100);
  EXPECT_EQ(p.a.stride1, 1);
  EXPECT_EQ(p.b.ptr, nullptr);
  EXPECT_EQ(p.lda, 4100);
  EXPECT_EQ(p.ldb, 4100);
  EXPECT_TRUE(planned_for_copies(r, kH100));
  // A float32 a given as [m, k] with strides (1, m), m = 301 (rows of a.t() 1204 bytes apart): its
  // contiguous axis is the row-major copy's strided one, so the transpose kernel makes the copy
  // (torch's transposing copy ran at ~0.9 TB/s); bf16 in that layout: the strided copy.
  r = transposed_a(row_major(DType::Float32, 301, 512, 512));
  p = plan_gemm(r, kH100);
  EXPECT_TRUE(is_copy(p.copy_a, CopyLayout::RowMajor, CopyVia::Transpose, 301, 512, 512));
  EXPECT_EQ(p.copy_b.layout, CopyLayout::None);
  EXPECT_TRUE(planned_for_copies(r, kH100));
  r = transposed_a(row_major(DType::BFloat16, 301, 512, 512));
  p = plan_gemm(r, kH100);
  EXPECT_TRUE(is_copy(p.copy_a, CopyLayout::RowMajor, CopyVia::Strided, 301, 512, 512));
  EXPECT_EQ(p.kernel, GemmKernel::Wgmma);
  EXPECT_TRUE(planned_for_copies(r, kH100));
  // b given as [k, n] with strides (1, k), k = 301: transposed into rows of n = 512; a [512, 301]
  // row-major, rows padded to 304 floats.
  r = transposed_b(row_major(DType::Float32, 512, 512, 301));
  p = plan_gemm(r, kH100);
  EXPECT_TRUE(is_copy(p.copy_a, CopyLayout::RowMajor, CopyVia::Strided, 512, 301, 304));
  EXPECT_TRUE(is_copy(p.copy_b, CopyLayout::RowMajor, CopyVia::Transpose, 301, 512, 512));
  EXPECT_TRUE(planned_for_copies(r, kH100));
  // Contiguous along m but its columns overlapping (strides (1, 2)): no transpose, a strided copy.
  r = row_major(DType::Float32, 300, 512, 512);
  r.a = {r.a.ptr, 1, 2};
  EXPECT_TRUE(
      is_copy(plan_gemm(r, kH100).copy_a, CopyLayout::RowMajor, CopyVia::Strided, 300, 512, 512));
  // Rows of 333 rounded up to 16 bytes: 336 bf16, 334 doubles.
  EXPECT_TRUE(is_copy(plan_gemm(row_major(DType::BFloat16, 1000, 1000, 333), kH100).copy_a,
                      CopyLayout::RowMajor, CopyVia::Strided, 1000, 333, 336));
  r = row_major(DType::Float64, 1000, 1000, 333);
  p = plan_gemm(r, kH100);
  EXPECT_TRUE(is_copy(p.copy_a, CopyLayout::RowMajor, CopyVia::Strided, 1000, 333, 334));
  EXPECT_EQ(p.kernel, GemmKernel::MmaF64);
  EXPECT_TRUE(planned_for_copies(r, kH100));
  // a is copied for >= 256 columns of c; b [4097, 300] has rows of 1200 bytes, readable as it is.
  p = plan_gemm(row_major(DType::Float32, 100, 300, 4097), kH100);
  EXPECT_EQ(p.copy_a.layout, CopyLayout::RowMajor);
  EXPECT_EQ(p.copy_b.layout, CopyLayout::None);
  // Just outside: 255 columns of c do not pay a's copy (OperandNotReadable), nor 255 rows b's
  // (the other operand readable: b's rows 256 floats apart, a's 100).
  r = row_major(DType::Float32, 100, 256, 4097);
  EXPECT_EQ(plan_gemm(r, kH100).copy_a.layout, CopyLayout::RowMajor);
  r.n = 255;
  p = plan_gemm(r, kH100);
  EXPECT_EQ(p.copy_a.layout, CopyLayout::None);
  EXPECT_STREQ(p.rule, "OperandNotReadable");
  EXPECT_EQ(plan_gemm(row_major(DType::Float32, 256, 4097, 100), kH100).copy_b.layout,
            CopyLayout::RowMajor);
  EXPECT_EQ(plan_gemm(row_major(DType::Float32, 255, 4097, 100), kH100).copy_b.layout,
            CopyLayout::None);
  // A base not 16-byte aligned (a view one element into its storage) is unreadable too.
  r = row_major(DType::BFloat16, 512, 512, 512);
  r.a.ptr = address(0x100002);
  p = plan_gemm(r, kH100);
  EXPECT_TRUE(is_copy(p.copy_a, CopyLayout::RowMajor, CopyVia::Strided, 512, 512, 512));
  EXPECT_EQ(p.kernel, GemmKernel::Wgmma);
  EXPECT_TRUE(planned_for_copies(r, kH100));
}

// TF32 on a wgmma device with c row-major, a m-major and b n-major (a.t() @ b): TF32 wgmma reads B
// k-major only and the transposed problem would need A k-major, so the smaller of a and b is
// copied k-major (>= 256 on the other side, as above): a row-major, or b column-major, each by the
// transpose kernel (the source's contiguous axis is the copy's strided one).
TEST(GemmRule, CopyForTf32Wgmma) {
  // 296 x 300 over k = 333, every operand readable in place (rows 296 and 300 floats apart): a, the
  // smaller, into rows of 336 floats; then wgmma on the transposed problem (b n-major).
  GemmRequest r = transposed_a(tf32(row_major(DType::Float32, 296, 300, 333)));
  GemmPlan p = plan_gemm(r, kH100);
  EXPECT_TRUE(is_copy(p.copy_a, CopyLayout::RowMajor, CopyVia::Transpose, 296, 333, 336));
  EXPECT_EQ(p.copy_b.layout, CopyLayout::None);
  EXPECT_EQ(p.kernel, GemmKernel::Wgmma) << describe(p);
  EXPECT_TRUE(p.wgmma().c_trans);
  EXPECT_TRUE(planned_for_copies(r, kH100));
  // 300 x 296: b, the smaller, column-major (b^T in rows of 336 floats): B k-major, read as it is.
  r = transposed_a(tf32(row_major(DType::Float32, 300, 296, 333)));
  p = plan_gemm(r, kH100);
  EXPECT_EQ(p.copy_a.layout, CopyLayout::None);
  EXPECT_TRUE(is_copy(p.copy_b, CopyLayout::ColumnMajor, CopyVia::Transpose, 296, 333, 336));
  EXPECT_EQ(p.kernel, GemmKernel::Wgmma) << describe(p);
  EXPECT_FALSE(p.wgmma().c_trans);
  EXPECT_FALSE(p.b_nmajor);
  EXPECT_EQ(p.b.ptr, nullptr);
  EXPECT_EQ(p.b.stride0, 1);
  EXPECT_EQ(p.b.stride1, 336);
  EXPECT_EQ(p.ldb, 336);
  EXPECT_TRUE(planned_for_copies(r, kH100));
  // 290 x 300 and 300 x 290: the 290-wide operand's rows (1160 bytes apart) are unreadable too
  // (CopyOperand's row): it is the smaller, and its copy the same.
  p = plan_gemm(transposed_a(tf32(row_major(DType::Float32, 290, 300, 333))), kH100);
  EXPECT_EQ(p.copy_a.layout, CopyLayout::RowMajor);
  EXPECT_EQ(p.copy_b.layout, CopyLayout::None);
  p = plan_gemm(transposed_a(tf32(row_major(DType::Float32, 300, 290, 333))), kH100);
  EXPECT_EQ(p.copy_a.layout, CopyLayout::None);
  EXPECT_EQ(p.copy_b.layout, CopyLayout::ColumnMajor);
  // After the copy (a row-major, rows padded to 336 floats) the plan asks for nothing more.
  GemmRequest after = tf32(row_major(DType::Float32, 290, 300, 333));
  after.a.stride0 = 336;
  p = plan_gemm(after, kH100);
  EXPECT_EQ(p.copy_a.layout, CopyLayout::None);
  EXPECT_EQ(p.copy_b.layout, CopyLayout::None);
  EXPECT_EQ(p.kernel, GemmKernel::Wgmma);
  // Just outside: too small a product to pay for the copy (200 columns): the portable TF32 kernel
  // reads the layout as it is; without wgmma every layout is copy-free.
  p = plan_gemm(transposed_a(tf32(row_major(DType::Float32, 100, 200, 64))), kH100);
  EXPECT_EQ(p.copy_a.layout, CopyLayout::None);
  EXPECT_EQ(p.kernel, GemmKernel::MmaTf32);
  p = plan_gemm(transposed_a(tf32(row_major(DType::Float32, 512, 512, 512))), kA100);
  EXPECT_EQ(p.copy_a.layout, CopyLayout::None);
  EXPECT_EQ(p.kernel, GemmKernel::MmaTf32);
  // Nor for float32 'highest' (the SIMT kernel reads the layout) or a 16-bit type (wgmma reads B
  // n-major).
  p = plan_gemm(transposed_a(row_major(DType::Float32, 296, 300, 333)), kH100);
  EXPECT_EQ(p.copy_a.layout, CopyLayout::None);
  EXPECT_EQ(p.kernel, GemmKernel::Simt);
  p = plan_gemm(transposed_a(row_major(DType::BFloat16, 296, 300, 333)), kH100);
  EXPECT_EQ(p.copy_a.layout, CopyLayout::None);
  EXPECT_EQ(p.kernel, GemmKernel::Wgmma);
}

// c column-major: the product c^T = b^T a^T, so the fast kernels have one storage order (C
// row-major).
TEST(GemmRule, ColumnMajorOutput) {
  GemmRequest r = row_major(DType::BFloat16, 300, 200, 64);
  r.c_stride0 = 1, r.c_stride1 = 300;
  GemmPlan p = plan_gemm(r, kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Wgmma) << describe(p);
  EXPECT_TRUE(p.swap_ab);
  EXPECT_EQ(p.m, 200);
  EXPECT_EQ(p.n, 300);
  EXPECT_EQ(p.ldc, 300);
  // A = b^T: b row-major [k, n] read as [n, k], unit stride along n: m-major. B = a^T: k-major.
  EXPECT_FALSE(p.a_kmajor);
  EXPECT_FALSE(p.b_nmajor);
  EXPECT_EQ(p.lda, 200);
  EXPECT_EQ(p.ldb, 64);
  // c's columns 304 apart (a slice of a wider tensor).
  r.c_stride1 = 304;
  p = plan_gemm(r, kH100);
  EXPECT_TRUE(p.swap_ab);
  EXPECT_EQ(p.ldc, 304);
  // The other fast kernels take the transposed product too.
  r = row_major(DType::Float32, 300, 200, 64);
  r.c_stride0 = 1, r.c_stride1 = 300;
  p = plan_gemm(r, kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Simt);
  EXPECT_TRUE(p.swap_ab);
  EXPECT_EQ(p.m, 200);
  // Just outside: c row-major, the product as it is.
  p = plan_gemm(row_major(DType::BFloat16, 300, 200, 64), kH100);
  EXPECT_FALSE(p.swap_ab);
  EXPECT_EQ(p.m, 300);
  EXPECT_EQ(p.n, 200);
  EXPECT_TRUE(p.a_kmajor);
  EXPECT_TRUE(p.b_nmajor);
}

// An operand still not readable in place (too small a product to pay for its copy): the general
// kernel, which reads any strides, on the request's operands.
TEST(GemmRule, OperandNotReadable) {
  // 100 x 101 over k = 4097 float32: a's rows 16388 bytes apart and b's 404, and neither side of
  // c (100 rows, 101 columns) pays a copy.
  GemmRequest r = row_major(DType::Float32, 100, 101, 4097);
  GemmPlan p = plan_gemm(r, kH100);
  EXPECT_EQ(p.kernel, GemmKernel::General) << describe(p);
  EXPECT_STREQ(p.rule, "OperandNotReadable");
  EXPECT_EQ(p.copy_a.layout, CopyLayout::None);
  EXPECT_EQ(p.a.ptr, r.a.ptr);
  EXPECT_EQ(p.a.stride0, 4097);
  // float64 rows 333 doubles apart under 100 columns of c.
  p = plan_gemm(row_major(DType::Float64, 1000, 100, 333), kH100);
  EXPECT_EQ(p.kernel, GemmKernel::General);
  EXPECT_STREQ(p.rule, "OperandNotReadable");
  // A base not 16-byte aligned under 64 columns of c.
  r = row_major(DType::BFloat16, 512, 512, 512);
  r.a.ptr = address(0x100002);
  r.n = 64, r.b.stride0 = 64, r.c_stride0 = 64;
  p = plan_gemm(r, kH100);
  EXPECT_EQ(p.kernel, GemmKernel::General);
  EXPECT_STREQ(p.rule, "OperandNotReadable");
  EXPECT_EQ(p.copy_a.layout, CopyLayout::None);
  // Both operands unreadable, one of them on too short a side: neither is copied (b alone would
  // leave a unreadable).
  p = plan_gemm(row_major(DType::Float32, 300, 101, 4097), kH100);
  EXPECT_EQ(p.kernel, GemmKernel::General);
  EXPECT_EQ(p.copy_a.layout, CopyLayout::None);
  EXPECT_EQ(p.copy_b.layout, CopyLayout::None);
  // Just outside: 256 columns pay a's copy (CopyOperand), a fast kernel then.
  p = plan_gemm(row_major(DType::Float32, 100, 256, 4097), kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Simt);
}

// A fused request (linear's bias and activation; swiglu's dual GEMM) as the ops make it: x [m, k]
// row-major, nn.Linear's weight [n, k] read as b = W.t(), c and the kept products [m, n]
// contiguous.
GemmRequest fused(GemmEpilogue kind, DType t, int64_t m, int64_t n, int64_t k, bool keep) {
  GemmRequest r = linear_forward(t, m, n, k);
  r.fusion.kind = kind;
  r.fusion.act = kind == GemmEpilogue::Gated ? Activation::GeluTanh : Activation::Gelu;
  r.fusion.bias = kind == GemmEpilogue::BiasActivation ? address(0x600002) : nullptr;
  r.fusion.b2 = kind == GemmEpilogue::Gated ? address(0x700000) : nullptr;
  if (keep) {
    r.fusion.aux = address(0x800000);
    r.fusion.aux2 = kind == GemmEpilogue::Gated ? address(0x900000) : nullptr;
    r.fusion.ld_aux = n;
  }
  return r;
}

// Where the fused kernels do not run, no plan fuses: the op runs the product and the epilogue
// apart (and launch_gemm refuses to run the request on an unfused plan).
TEST(GemmRule, FusedEpilogueApart) {
  const auto apart = [](const GemmRequest& r, const GemmDevice& dev) {
    const GemmPlan p = plan_gemm(r, dev);
    if (p.fused) return testing::AssertionFailure() << describe(p);
    return testing::AssertionSuccess();
  };
  for (GemmEpilogue kind : {GemmEpilogue::BiasActivation, GemmEpilogue::Gated}) {
    SCOPED_TRACE(static_cast<int>(kind));
    const GemmRequest good = fused(kind, DType::BFloat16, 4096, 4096, 4096, true);
    ASSERT_TRUE(plan_gemm(good, kH100).fused);
    EXPECT_TRUE(apart(good, kH100NoWgmma));
    EXPECT_TRUE(apart(good, kA100));
    for (DType t : {DType::Float32, DType::Float64}) {
      GemmRequest r = fused(kind, t, 4096, 4096, 4096, true);
      r.allow_tf32 = true;
      EXPECT_TRUE(apart(r, kH100));
    }
    // Decode sizes fuse only on the small-M streaming form.
    const GemmRequest decode = fused(kind, DType::BFloat16, kSkinnyMaxTokens, 4096, 4096, false);
    ASSERT_TRUE(plan_gemm(decode, kH100).fused);
    EXPECT_TRUE(apart(decode, kH100Lanes));
    EXPECT_TRUE(
        plan_gemm(fused(kind, DType::BFloat16, kSkinnyMaxTokens + 1, 4096, 4096, false), kH100)
            .fused);
    // c's rows not a whole number of 16 bytes apart (no TMA store); x m-major; a weight given
    // n-major (b row-major); beta != 0.
    EXPECT_TRUE(apart(fused(kind, DType::BFloat16, 1000, 300, 200, false), kH100));
    EXPECT_TRUE(apart(transposed_a(good), kH100));
    GemmRequest r = good;
    r.b.stride0 = r.n, r.b.stride1 = 1;
    EXPECT_TRUE(apart(r, kH100));
    r = good;
    r.beta = 1.0;
    EXPECT_TRUE(apart(r, kH100));
    // The kept products or the second weight not 16-byte aligned, or rows of the kept products
    // not a whole number of 16 bytes apart.
    r = good;
    r.fusion.aux = address(0x800002);
    EXPECT_TRUE(apart(r, kH100));
    r = good;
    r.fusion.ld_aux = r.n + 1;
    EXPECT_TRUE(apart(r, kH100));
    if (kind == GemmEpilogue::Gated) {
      r = good;
      r.fusion.b2 = address(0x700008);
      EXPECT_TRUE(apart(r, kH100));
      r = good;
      r.fusion.aux2 = nullptr;
      EXPECT_TRUE(apart(r, kH100));
      // A gate the dual epilogue has no case for (epilogue.cuh's Gated: silu, gelu_tanh).
      for (Activation act : {Activation::None, Activation::Relu, Activation::Gelu}) {
        r = good;
        r.fusion.act = act;
        EXPECT_TRUE(apart(r, kH100));
        r = decode;
        r.fusion.act = act;
        EXPECT_TRUE(apart(r, kH100));
      }
      r = good;
      r.fusion.act = Activation::Silu;
      EXPECT_TRUE(plan_gemm(r, kH100).fused);
    }
    // An operand the planner would copy: the fused kernel reads operands in place only.
    r = fused(kind, DType::BFloat16, 4096, 4096, 4097, false);
    EXPECT_TRUE(apart(r, kH100));
    EXPECT_STREQ(plan_gemm(r, kH100).rule, "FusedEpilogueApart");
  }
}

// Decode sizes (SmallMFused): the plain product's streaming plan, the dual GEMM's made for the
// 2n-wide product (a CTA holds 32 outputs of each weight); its stores need no alignment beyond an
// element's; a weight given n-major stays apart.
TEST(GemmRule, SmallMFused) {
  for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 14336, 4096},
                                {8, 3072, 768},
                                {16, 5632, 2048},
                                {5, 1000, 264}}) {
    SCOPED_TRACE(testing::Message() << m << " x " << n << " x " << k);
    for (DType t : {DType::BFloat16, DType::Float16}) {
      for (GemmEpilogue kind : {GemmEpilogue::BiasActivation, GemmEpilogue::Gated}) {
        const bool dual = kind == GemmEpilogue::Gated;
        GemmRequest r = fused(kind, t, m, n, k, true);
        r.fusion.aux = address(0x800002);
        const GemmPlan p = plan_gemm(r, kH100);
        ASSERT_TRUE(p.fused) << describe(p);
        EXPECT_STREQ(p.rule, "SmallMFused");
        ASSERT_EQ(p.kernel, GemmKernel::Skinny);
        EXPECT_TRUE(p.skinny().tma && p.skinny().tokens_m && p.skinny().w_kmajor);
        EXPECT_EQ(p.n, n);
        GemmRequest plain = linear_forward(t, m, dual ? 2 * n : n, k);
        const GemmPlan q = plan_gemm(plain, kH100);
        ASSERT_EQ(q.kernel, GemmKernel::Skinny);
        EXPECT_EQ(p.grid, q.grid);
        EXPECT_EQ(p.grid, (n + (dual ? 31 : 63)) / (dual ? 32 : 64));
        EXPECT_EQ(p.skinny().stages, q.skinny().stages);
        EXPECT_EQ(p.skinny().chunk, q.skinny().chunk);
        EXPECT_EQ(p.skinny().split, q.skinny().split);
        EXPECT_EQ(p.skinny().mt, q.skinny().mt);
        r.b.stride0 = r.n, r.b.stride1 = 1;
        EXPECT_FALSE(plan_gemm(r, kH100).fused);
      }
    }
  }
}

// Elsewhere: the wgmma plan of the product with TMA stores, the dual GEMM's made for the 2n-wide
// product (its tiles hold bn / 2 outputs of each weight) and never narrower than 128.
TEST(GemmRule, FusedEpilogue) {
  for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{8192, 5632, 2048},
                                {4096, 14336, 4096},
                                {512, 768, 3072},
                                {1000, 328, 200},
                                {17, 4096, 4096},
                                {16384, 2048, 5632}}) {
    SCOPED_TRACE(testing::Message() << m << " x " << n << " x " << k);
    for (DType t : {DType::BFloat16, DType::Float16}) {
      // Bias and activation: the plain product's plan, fused.
      const GemmRequest lin = fused(GemmEpilogue::BiasActivation, t, m, n, k, true);
      GemmPlan p = plan_gemm(lin, kH100);
      GemmRequest plain = lin;
      plain.fusion = {};
      GemmPlan q = plan_gemm(plain, kH100);
      ASSERT_TRUE(p.fused) << describe(p);
      ASSERT_EQ(p.kernel, GemmKernel::Wgmma);
      EXPECT_TRUE(p.wgmma().tma_store);
      EXPECT_EQ(p.n, n);
      if (q.kernel == GemmKernel::Wgmma) {
        EXPECT_EQ(p.wgmma().bm, q.wgmma().bm);
        EXPECT_EQ(p.wgmma().bn, q.wgmma().bn);
        EXPECT_EQ(p.wgmma().cluster_m, q.wgmma().cluster_m);
        EXPECT_EQ(p.grid, q.grid);
        EXPECT_STREQ(p.rule, q.rule);
      }
      // The dual GEMM: planned as the plain 2n-wide product, tiles at least 128 wide; the output
      // is n wide.
      const GemmRequest dual = fused(GemmEpilogue::Gated, t, m, n, k, true);
      p = plan_gemm(dual, kH100);
      ASSERT_TRUE(p.fused) << describe(p);
      EXPECT_TRUE(p.wgmma().tma_store);
      EXPECT_GE(p.wgmma().bn, 128);
      EXPECT_EQ(p.n, n);
      const int64_t units =
          (m + p.wgmma().bm - 1) / p.wgmma().bm * ((n + p.wgmma().bn / 2 - 1) / (p.wgmma().bn / 2));
      EXPECT_LE(p.wgmma().tail_units, units);
      EXPECT_LE(p.grid, std::max<int64_t>(units, 1) * p.wgmma().cluster_m);
      plain.n = 2 * n, plain.b.stride1 = k, plain.c_stride0 = 2 * n;
      q = plan_gemm(plain, kH100);
      if (q.kernel == GemmKernel::Wgmma && q.wgmma().bn >= 128) {
        EXPECT_EQ(p.wgmma().bn, q.wgmma().bn);
        EXPECT_EQ(p.wgmma().bm, q.wgmma().bm);
        EXPECT_EQ(p.grid, q.grid);
      }
    }
  }
}

// c's short side at most 16 (tokens) with that side's operand k-contiguous: the small-M kernel,
// bound by the weight's bytes. Its per-lane form (where the streaming form does not run): k split
// over a block's 4 warps, then over a cluster's CTAs to ~16 warps an SM (<= 4 CTAs for the 16-bit
// forms, where 8 ran slower; <= 8 for float32).
TEST(GemmRule, SmallM) {
  for (DType t : {DType::BFloat16, DType::Float16, DType::Float32}) {
    for (bool allow_tf32 : {false, true}) {
      for (int64_t m :
           {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{15}, int64_t{kSkinnyMaxTokens}}) {
        SCOPED_TRACE(testing::Message()
                     << static_cast<int>(t) << (allow_tf32 ? " tf32" : "") << ", m " << m);
        GemmRequest fwd = linear_forward(t, m, 4096, 4096), grad = row_major(t, m, 4096, 4096);
        fwd.allow_tf32 = grad.allow_tf32 = allow_tf32;
        GemmPlan p = plan_gemm(fwd, kH100);
        EXPECT_EQ(p.kernel, GemmKernel::Skinny) << describe(p);
        EXPECT_TRUE(p.skinny().tokens_m);
        EXPECT_TRUE(p.skinny().w_kmajor);
        p = plan_gemm(grad, kA100);  // g @ W: the weight row-major (n-major), on any GPU
        EXPECT_EQ(p.kernel, GemmKernel::Skinny) << describe(p);
        EXPECT_STREQ(p.rule, "SmallM");
        EXPECT_FALSE(p.skinny().w_kmajor);
        EXPECT_FALSE(p.skinny().tma);
        const bool half = t != DType::Float32;
        EXPECT_EQ(p.skinny().mt, m <= 4 && !half ? 4 : m <= 8 ? 8 : 16);
        EXPECT_EQ(p.skinny().rw * p.skinny().kw, kSkinnyWarps);
      }
      // One past the boundary: the tiled kernels.
      GemmRequest r = linear_forward(t, kSkinnyMaxTokens + 1, 4096, 4096);
      r.allow_tf32 = allow_tf32;
      EXPECT_NE(plan_gemm(r, kH100).kernel, GemmKernel::Skinny);
    }
  }
  // The tokens may be c's columns: W [n_out, k] @ x.t() with x [4, k], c [n_out, 4] (b = x.t()
  // k-major).
  GemmRequest r = transposed_b(row_major(DType::BFloat16, 4096, 4, 1024));
  GemmPlan p = plan_gemm(r, kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Skinny);
  EXPECT_FALSE(p.skinny().tokens_m);
  EXPECT_TRUE(p.skinny().w_kmajor);
  // The same with W given as W'.t() (m-major a): the weight's outputs contiguous.
  p = plan_gemm(transposed_a(r), kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Skinny);
  EXPECT_FALSE(p.skinny().w_kmajor);
  // Just outside: tokens whose k is not contiguous (x.t() as a: m-major): wgmma.
  p = plan_gemm(transposed_a(linear_forward(DType::BFloat16, 8, 4096, 4096)), kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Wgmma);
  // 4096 x 14336 (Llama down_proj): 256 groups of 16 outputs, 8 slices of k to reach 16 warps per
  // SM: 4 warps of a block by a cluster of 2 on Hopper's per-lane form, one block's 4 elsewhere.
  p = plan_gemm(linear_forward(DType::BFloat16, 1, 4096, 14336), kH100Lanes);
  EXPECT_STREQ(p.rule, "SmallM");
  EXPECT_EQ(p.skinny().kw, 4);
  EXPECT_EQ(p.skinny().split, 2);
  EXPECT_EQ(p.skinny().slice, 14336 / 8);
  EXPECT_EQ(p.grid, 256);
  p = plan_gemm(linear_forward(DType::BFloat16, 1, 4096, 14336), kA100);
  EXPECT_EQ(p.skinny().kw, 4);
  EXPECT_EQ(p.skinny().split, 1);
  // 28672 outputs (gate_up): enough groups for the SMs, no cluster.
  p = plan_gemm(linear_forward(DType::BFloat16, 1, 28672, 4096), kH100Lanes);
  EXPECT_EQ(p.skinny().rw, 1);
  EXPECT_EQ(p.skinny().kw, 4);
  EXPECT_EQ(p.skinny().split, 1);
  EXPECT_EQ(p.grid, 28672 / 16);
  // g @ W with 4096 outputs (64 groups of 64): clusters of 4 for bf16 (8 measured slower);
  // float32's 32 groups of 128 take 8.
  EXPECT_EQ(plan_gemm(row_major(DType::BFloat16, 1, 4096, 14336), kH100Lanes).skinny().split, 4);
  EXPECT_EQ(plan_gemm(row_major(DType::Float32, 1, 4096, 14336), kH100Lanes).skinny().split, 8);
  // A short k: slices of at least four chunks, a chunk at the least.
  p = plan_gemm(linear_forward(DType::BFloat16, 1, 64, 96), kH100Lanes);
  EXPECT_EQ(p.skinny().kw, 1);
  EXPECT_EQ(p.skinny().slice, 96);
  p = plan_gemm(linear_forward(DType::Float32, 1, 64, 0), kH100Lanes);
  EXPECT_EQ(p.kernel, GemmKernel::Skinny);
  EXPECT_EQ(p.skinny().slice, 128);
  // The experiments' override recomputes the slice and the grid.
  p = with_split(plan_gemm(linear_forward(DType::BFloat16, 1, 4096, 14336), kH100Lanes), 1, 4, 8);
  EXPECT_EQ(p.skinny().slice, 448);
  EXPECT_EQ(p.grid, 256);
  EXPECT_STREQ(p.rule, "with_split");
}

// On sm_90 with the tensor-map encoder (GemmDevice::skinny_tma), where TMA describes the weight and
// x: the streaming form, a TMA ring of 4 stages of 64 outputs x 128 k (16-bit; float32 stages hold
// the same bytes) per CTA, two CTAs an SM, a programmatic dependent launch. Per-lane loads held
// ~32 KB an SM in flight (0.63 of copy at 4096 x 14336), the ring 0.87-1.00.
TEST(GemmRule, SmallMStream) {
  // 28672 outputs (gate_up): 448 groups of 64, more than half the SMs: stages of 128 k.
  GemmPlan p = plan_gemm(linear_forward(DType::BFloat16, 1, 28672, 4096), kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Skinny) << describe(p);
  EXPECT_STREQ(p.rule, "SmallMStream");
  EXPECT_TRUE(p.skinny().tma);
  EXPECT_TRUE(p.skinny().pdl);
  EXPECT_EQ(p.skinny().stages, kSkinnyTmaStages);
  EXPECT_EQ(p.skinny().chunk, kSkinnyTma.chunk);
  EXPECT_EQ(p.skinny().rw, kSkinnyWarps);
  EXPECT_EQ(p.skinny().kw, 1);
  EXPECT_EQ(p.skinny().mt, 8);  // token tiles of the mma's 8 columns at the least
  EXPECT_EQ(p.grid, 448);
  EXPECT_EQ(p.skinny().split, 1);
  EXPECT_EQ(p.skinny().slice, 4096);
  // TF32 (m16n8k8) and float32 'highest' (FP32 FMAs, which want every SM: above 132 groups) in
  // stages of the same bytes, 64 k.
  p = plan_gemm(tf32(linear_forward(DType::Float32, 2, 28672, 4096)), kH100);
  EXPECT_STREQ(p.rule, "SmallMStream");
  EXPECT_EQ(p.skinny().chunk, 64);
  p = plan_gemm(linear_forward(DType::Float32, 16, 28672, 4096), kH100);
  EXPECT_STREQ(p.rule, "SmallMStream");
  EXPECT_EQ(p.skinny().chunk, 64);
  EXPECT_EQ(p.skinny().split, 1);
  // Just outside: k = 0 (nothing for TMA to describe), no encoder, no sm_90: the per-lane form.
  p = plan_gemm(linear_forward(DType::BFloat16, 1, 64, 0), kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Skinny);
  EXPECT_FALSE(p.skinny().tma);
  EXPECT_STREQ(p.rule, "SmallM");
  EXPECT_FALSE(streams(plan_gemm(linear_forward(DType::BFloat16, 1, 4096, 4096), kH100Lanes)));
  EXPECT_FALSE(streams(plan_gemm(linear_forward(DType::BFloat16, 1, 4096, 4096), kA100)));
  // The experiments' overrides: another ring, or back to the per-lane form.
  p = with_stream(plan_gemm(linear_forward(DType::BFloat16, 1, 4096, 14336), kH100), 6, 256, 2);
  EXPECT_STREQ(p.rule, "with_stream");
  EXPECT_EQ(p.skinny().stages, 6);
  EXPECT_EQ(p.skinny().chunk, 256);
  EXPECT_EQ(p.skinny().slice, 28 * 256);
  EXPECT_FALSE(with_stream(p, 6, 256, 2, false).skinny().pdl);
  EXPECT_EQ(
      with_stream(plan_gemm(tf32(linear_forward(DType::Float32, 2, 4096, 4096)), kH100), 4, 64, 1)
          .skinny()
          .chunk,
      64);
  p = with_split(p, 1, 4, 2);
  EXPECT_FALSE(p.skinny().tma);
  EXPECT_FALSE(p.skinny().pdl);
  EXPECT_EQ(p.skinny().kw, 4);
  p = with_stream(plan_gemm(linear_forward(DType::BFloat16, 1, 64, 0), kH100), 4, 128, 1);
  EXPECT_FALSE(p.skinny().tma);
  EXPECT_NE(std::string(p.rule).find("cannot stream"), std::string::npos) << p.rule;
}

// float32 'highest' at <= 4 tokens with the weight k-contiguous and more groups of 64 outputs than
// half the SMs: the per-lane form, 3-5 % faster there than the FMA stream (0.99 of copy against
// 0.95 at 1 x 4096 x 28672), whose 8-token tiles would be mostly padding.
TEST(GemmRule, SmallMFloat32Lanes) {
  for (const GemmRequest& r : {linear_forward(DType::Float32, 4, 28672, 4096),
                               linear_forward(DType::Float32, 1, 6144, 4096),
                               linear_forward(DType::Float32, 4, 67 * 64, 4096)}) {
    const GemmPlan p = plan_gemm(r, kH100);
    EXPECT_EQ(p.kernel, GemmKernel::Skinny) << describe(p);
    EXPECT_STREQ(p.rule, "SmallMFloat32Lanes");
    EXPECT_FALSE(p.skinny().tma);
    EXPECT_EQ(p.skinny().mt, 4);
  }
  // Just outside, each condition in turn: 5 tokens, 66 groups (half the SMs), the weight
  // o-contiguous (g @ W), TF32: streamed.
  EXPECT_TRUE(streams(plan_gemm(linear_forward(DType::Float32, 5, 28672, 4096), kH100)));
  EXPECT_TRUE(streams(plan_gemm(linear_forward(DType::Float32, 4, 66 * 64, 4096), kH100)));
  EXPECT_TRUE(streams(plan_gemm(linear_forward(DType::Float32, 1, 4096, 4096), kH100)));
  EXPECT_TRUE(streams(plan_gemm(row_major(DType::Float32, 1, 28672, 4096), kH100)));
  EXPECT_TRUE(streams(plan_gemm(tf32(linear_forward(DType::Float32, 1, 6144, 4096)), kH100)));
}

// Streaming where the groups of 64 outputs fill at most half the SMs (FP32 FMAs: at most all of
// them): deep stages (256 k, one CTA an SM: bytes in flight set the pace, not CTAs), k split over
// a cluster up to half the SMs (FMAs: all), each CTA >= 8 stages.
TEST(GemmRule, SmallMStreamDeep) {
  // 4096 x 14336 (down_proj): 64 groups, no cluster (64 CTAs already half the SMs), 56 stages each.
  GemmPlan p = plan_gemm(linear_forward(DType::BFloat16, 1, 4096, 14336), kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Skinny) << describe(p);
  EXPECT_STREQ(p.rule, "SmallMStreamDeep");
  EXPECT_TRUE(p.skinny().tma);
  EXPECT_TRUE(p.skinny().pdl);
  EXPECT_EQ(p.skinny().stages, kSkinnyTmaStages);
  EXPECT_EQ(p.skinny().chunk, kSkinnyTmaDeepChunk);
  EXPECT_EQ(p.skinny().rw, kSkinnyWarps);
  EXPECT_EQ(p.skinny().kw, 1);
  EXPECT_EQ(p.grid, 64);
  EXPECT_EQ(p.skinny().split, 1);
  EXPECT_EQ(p.skinny().slice, 14336);
  // g @ W (the weight o-contiguous), fp16, 16 tokens: the same.
  p = plan_gemm(row_major(DType::Float16, 16, 4096, 14336), kH100);
  EXPECT_STREQ(p.rule, "SmallMStreamDeep");
  EXPECT_FALSE(p.skinny().w_kmajor);
  EXPECT_EQ(p.skinny().mt, 16);
  EXPECT_EQ(p.skinny().split, 1);
  // 1000 outputs over a k of 4104: 16 groups, k split toward 64 CTAs but each >= 8 stages: 2.
  p = plan_gemm(linear_forward(DType::BFloat16, 1, 1000, 4104), kH100);
  EXPECT_EQ(p.skinny().split, 2);
  EXPECT_EQ(p.skinny().slice, 9 * 256);
  // 3 outputs over a k of 20000: one group, a cluster of 8.
  EXPECT_EQ(plan_gemm(linear_forward(DType::BFloat16, 1, 3, 20000), kH100).skinny().split, 8);
  // A short k: one stage, no split; the slice a whole stage past k (TMA's zeros fill it).
  p = plan_gemm(linear_forward(DType::BFloat16, 1, 64, 96), kH100);
  EXPECT_TRUE(p.skinny().tma);
  EXPECT_EQ(p.skinny().split, 1);
  EXPECT_EQ(p.skinny().slice, 256);
  // TF32 streams too (m16n8k8), deep stages of the same bytes: 128 k; token tiles of 8 at least.
  p = plan_gemm(tf32(linear_forward(DType::Float32, 2, 4096, 4096)), kH100);
  EXPECT_STREQ(p.rule, "SmallMStreamDeep");
  EXPECT_EQ(p.skinny().chunk, 128);
  EXPECT_EQ(p.skinny().mt, 8);
  // float32 'highest' (FP32 FMAs) on every SM: 64 groups, k split over 2 (132 SMs); 96 groups
  // still deep, one CTA an SM.
  p = plan_gemm(linear_forward(DType::Float32, 16, 4096, 4096), kH100);
  EXPECT_STREQ(p.rule, "SmallMStreamDeep");
  EXPECT_EQ(p.skinny().mt, 16);
  EXPECT_EQ(p.skinny().chunk, 128);
  EXPECT_EQ(p.skinny().split, 2);
  p = plan_gemm(row_major(DType::Float32, 1, 4096, 14336), kH100);  // g @ W: o-contiguous
  EXPECT_TRUE(p.skinny().tma);
  EXPECT_FALSE(p.skinny().w_kmajor);
  EXPECT_EQ(p.skinny().mt, 8);
  EXPECT_EQ(p.skinny().split, 2);
  p = plan_gemm(linear_forward(DType::Float32, 16, 6144, 4096), kH100);
  EXPECT_EQ(p.grid, 96);
  EXPECT_EQ(p.skinny().chunk, 128);
  EXPECT_EQ(p.skinny().split, 1);
  // The edge: 66 groups deep, 67 not (bf16); 132 and 133 for the FMAs.
  EXPECT_STREQ(plan_gemm(linear_forward(DType::BFloat16, 1, 66 * 64, 4096), kH100).rule,
               "SmallMStreamDeep");
  EXPECT_STREQ(plan_gemm(linear_forward(DType::BFloat16, 1, 67 * 64, 4096), kH100).rule,
               "SmallMStream");
  EXPECT_STREQ(plan_gemm(linear_forward(DType::Float32, 16, 132 * 64, 4096), kH100).rule,
               "SmallMStreamDeep");
  EXPECT_STREQ(plan_gemm(linear_forward(DType::Float32, 16, 133 * 64, 4096), kH100).rule,
               "SmallMStream");
}

// float64 small-M: the streaming form only (no per-lane form; elsewhere the float64 kernel's
// 16-row tile). Deep stages however many groups of 64 outputs (71-284 groups: one CTA an SM ran
// 2-9 % faster than two), except at most 16 groups, whose few SMs' own read rate bound gpt-2's
// 768-output products: half the k a stage and k split over 8 CTAs (0.60-0.96x -> 0.90-1.31x).
TEST(GemmRule, SmallMFloat64) {
  for (int64_t m : {int64_t{1}, int64_t{9}, int64_t{kSkinnyMaxTokens}}) {
    SCOPED_TRACE(testing::Message() << "m " << m);
    GemmPlan p = plan_gemm(linear_forward(DType::Float64, m, 4096, 4096), kH100);
    EXPECT_EQ(p.kernel, GemmKernel::Skinny) << describe(p);
    EXPECT_STREQ(p.rule, "SmallMFloat64");
    EXPECT_TRUE(p.skinny().tma);
    EXPECT_EQ(p.skinny().mt, m <= 8 ? 8 : 16);
    p = plan_gemm(row_major(DType::Float64, m, 4096, 4096), kH100);  // g @ W
    EXPECT_EQ(p.kernel, GemmKernel::Skinny) << describe(p);
    EXPECT_FALSE(p.skinny().w_kmajor);
    // Just outside: no streaming form, the float64 kernel.
    for (const GemmDevice& dev : {kH100Lanes, kA100}) {
      p = plan_gemm(linear_forward(DType::Float64, m, 4096, 4096), dev);
      EXPECT_EQ(p.kernel, GemmKernel::MmaF64) << describe(p);
      EXPECT_STREQ(p.rule, "Float64Tiles");
    }
  }
  EXPECT_EQ(
      plan_gemm(linear_forward(DType::Float64, kSkinnyMaxTokens + 1, 4096, 4096), kH100).kernel,
      GemmKernel::MmaF64);
  for (int64_t n : {int64_t{2304}, int64_t{14336}, int64_t{28672}}) {
    const GemmPlan p = plan_gemm(linear_forward(DType::Float64, 1, n, 4096), kH100);
    EXPECT_EQ(p.skinny().chunk, kSkinnyTmaDeepChunk / 4) << n;
  }
  for (int64_t k : {int64_t{768}, int64_t{3072}}) {
    const GemmPlan p = plan_gemm(linear_forward(DType::Float64, 1, 768, k), kH100);
    EXPECT_EQ(p.skinny().chunk, kSkinnyTma.chunk / 4) << k;
    EXPECT_EQ(p.skinny().split, 8) << k;
  }
  // The edge: 16 groups (1024 outputs) few, 17 deep.
  EXPECT_EQ(plan_gemm(linear_forward(DType::Float64, 1, 1024, 4096), kH100).skinny().chunk,
            kSkinnyTma.chunk / 4);
  EXPECT_EQ(plan_gemm(linear_forward(DType::Float64, 1, 1088, 4096), kH100).skinny().chunk,
            kSkinnyTmaDeepChunk / 4);
}

// float64 elsewhere: the DMMA kernel's tiles (128 x 128 where its 216 KB ring fits, 128 x 64,
// 64 x 64, 32 x 64, 32 x 32 up to 128 rows, 16 x 128 up to 32 rows), k whole or split into
// independent CTAs whose planes are summed in order: the least busiest-SM work (plan_f64).
TEST(GemmRule, Float64Tiles) {
  for (const GemmDevice& dev : {kH100, kA100}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        SCOPED_TRACE(testing::Message() << dev.sms << " SMs, a " << (ta ? "m" : "k") << "-major, b "
                                        << (tb ? "k" : "n") << "-major");
        GemmRequest r = row_major(DType::Float64, 4096, 4096, 4096);
        if (ta) r = transposed_a(r);
        if (tb) r = transposed_b(r);
        const GemmPlan p = plan_gemm(r, dev);
        EXPECT_EQ(p.kernel, GemmKernel::MmaF64) << describe(p);
        EXPECT_STREQ(p.rule, "Float64Tiles");
        EXPECT_EQ(p.a_kmajor, !ta);
        EXPECT_EQ(p.b_nmajor, !tb);
        // 1024 tiles of 128 x 128 fill every SM for several waves: the wide tile, k whole, where
        // its 216 KB ring fits (not an A100: a smaller tile there).
        if (dev.dmma_wide) {
          EXPECT_EQ(p.tiled().bm, 128);
          EXPECT_EQ(p.tiled().bn, 128);
          EXPECT_EQ(p.tiled().split_k, 1);
        } else {
          EXPECT_LT(p.tiled().bm * p.tiled().bn, 128 * 128);
        }
        EXPECT_EQ(p.grid, (4096 / p.tiled().bm) * (4096 / p.tiled().bn));
      }
    }
  }
  // A weight gradient, 1024 x 1024 over k = 8192: 64 tiles of 128 x 128 on 132 SMs, k split in two
  // into independent CTAs whose partial planes (split x m x n doubles of workspace) are summed.
  GemmPlan p = plan_gemm(row_major(DType::Float64, 1024, 1024, 8192), kH100);
  EXPECT_EQ(p.kernel, GemmKernel::MmaF64);
  EXPECT_EQ(p.tiled().bm, 128);
  EXPECT_EQ(p.tiled().bn, 128);
  EXPECT_EQ(p.grid, 64);
  EXPECT_EQ(p.tiled().split_k, 2);
  EXPECT_EQ(p.workspace_bytes, split_planes_bytes(1024, 1024, 2, 8));
  // 1024^3: one wave of 4-warp tiles (128 x 64 alone on its SM, or 64 x 64 two an SM: 1.00x and
  // 1.04x cuBLAS in the float64 sweep) beats 128 x 128 in halves of k (0.70x).
  p = plan_gemm(row_major(DType::Float64, 1024, 1024, 1024), kH100);
  EXPECT_LT(p.tiled().bm * p.tiled().bn, 128 * 128);
  EXPECT_EQ(p.tiled().split_k, 1);
  EXPECT_EQ(p.workspace_bytes, 0);
  // No cluster needed: an A100 splits too.
  EXPECT_GT(plan_gemm(row_major(DType::Float64, 1024, 1024, 8192), kA100).tiled().split_k, 1);
  // k too short to split: slices would be under kF64MinSlice.
  EXPECT_EQ(plan_gemm(row_major(DType::Float64, 1024, 1024, 100), kH100).tiled().split_k, 1);
  // 16 tokens against a 4096 x 14336 weight (decode) where the small-M kernel cannot stream: the
  // 16-row tile, 32 of them, k split 4 ways: 128 CTAs, each alone on its SM.
  p = plan_gemm(transposed_b(row_major(DType::Float64, 16, 4096, 14336)), kH100Lanes);
  EXPECT_EQ(p.kernel, GemmKernel::MmaF64);
  EXPECT_EQ(p.tiled().bm, 16);
  EXPECT_EQ(p.tiled().bn, 128);
  EXPECT_EQ(p.tiled().split_k, 4);
  // 128 rows, 48 tiles of 128 x 128 over k = 4096: k split (the sweep's 128 x 128 split 5 0.81x
  // cuBLAS, 128 x 64 split 4 0.89x, unsplit 0.44-0.69x).
  EXPECT_GT(plan_gemm(row_major(DType::Float64, 128, 6144, 4096), kH100).tiled().split_k, 1);
  // k = 16 (a weight gradient over 16 tokens): not the 128 x 128 tile, whose one partial stage
  // takes its spilling checked copy (0.78x cuBLAS; 64 x 64 1.10x).
  p = plan_gemm(row_major(DType::Float64, 6144, 4096, 16), kH100);
  EXPECT_LT(p.tiled().bm * p.tiled().bn, 128 * 128);
  // k = 128 (a weight gradient over 128 tokens, a m-major): not 128 x 128 either (0.78-0.80x
  // cuBLAS, 128 x 64 0.91-0.93x; with the loads overlapped 0.78-0.81x against 64 x 64's
  // 0.89-0.92x).
  for (const int64_t m : {int64_t{4096}, int64_t{6144}}) {
    GemmRequest w = row_major(DType::Float64, m, 4096, 128);
    w.a = {w.a.ptr, 1, m};
    p = plan_gemm(w, kH100);
    EXPECT_LT(p.tiled().bm * p.tiled().bn, 128 * 128) << m << ": " << describe(p);
  }
  // Outside decode, only the splits swept (1-4, 6, 8): gpt-2's 128 x 768 x 3072 took 128 x 64
  // split 11, never swept, at 0.85x cuBLAS where 32 x 64 split 8 had run 0.99x.
  for (const auto& [m, n, k] :
       {std::array<int64_t, 3>{128, 768, 3072}, {128, 4544, 18176}, {768, 768, 4096}}) {
    const int split = plan_gemm(row_major(DType::Float64, m, n, k), kH100).tiled().split_k;
    EXPECT_TRUE(split <= 4 || split == 6 || split == 8)
        << m << " x " << n << " x " << k << ": split " << split;
  }
  // gpt-2's 768-wide products at 128 tokens: 32 x 32 tiles, twice 32 x 64's CTAs (48 of those
  // over k = 768 ran 0.72x cuBLAS), not split (a split's planes cost a second kernel).
  for (GemmRequest r : {row_major(DType::Float64, 128, 768, 768),
                        transposed_b(row_major(DType::Float64, 128, 768, 768))}) {
    p = plan_gemm(r, kH100);
    EXPECT_EQ(p.tiled().bm, 32) << describe(p);
    EXPECT_EQ(p.tiled().bn, 32);
    EXPECT_EQ(p.tiled().split_k, 1);
  }
  // Edge tiles along n (4544 = 35.5 x 128): not the 128 x 128 tile.
  p = plan_gemm(row_major(DType::Float64, 1024, 4544, 18176), kH100);
  EXPECT_LT(p.tiled().bm * p.tiled().bn, 128 * 128);
  // 512 rows: the 16-row tile would read the weight 32 times over from L2.
  EXPECT_NE(plan_gemm(row_major(DType::Float64, 512, 4096, 4096), kH100).tiled().bm, 16);
  // The products the GPU suite's float64 kernel check ran (tests/python/test_gemm_f64.py checks
  // the products of both forms, this which one each shape takes): the DMMA kernel on any GPU with
  // FP64 tensor cores, k split on a 132-SM H100 only where the tiles leave SMs idle over a long k.
  struct Case {
    int64_t m, n, k;
    bool split;
  };
  for (const Case& c : {Case{4096, 4096, 512, false}, Case{1024, 1024, 8192, true},
                        Case{17, 4096, 14336, true}, Case{512, 512, 100, false}}) {
    SCOPED_TRACE(testing::Message() << c.m << " x " << c.n << " x " << c.k);
    const GemmRequest r = row_major(DType::Float64, c.m, c.n, c.k);
    p = plan_gemm(r, kH100);
    EXPECT_EQ(p.kernel, GemmKernel::MmaF64) << describe(p);
    EXPECT_EQ(p.tiled().split_k > 1, c.split) << describe(p);
    EXPECT_EQ(p.workspace_bytes > 0, c.split);
    EXPECT_EQ(plan_gemm(r, kA100).kernel, GemmKernel::MmaF64);
  }
  // The experiments' override of the split sizes its planes.
  p = with_split_k(plan_gemm(row_major(DType::Float64, 1024, 1024, 8192), kH100), 4);
  EXPECT_STREQ(p.rule, "with_split_k");
  EXPECT_EQ(p.tiled().split_k, 4);
  EXPECT_EQ(p.workspace_bytes, split_planes_bytes(1024, 1024, 4, 8));
}

// bf16/fp16, or TF32, on a wgmma device, sizes < 2^31 and operands TMA describes: the sm_90a wgmma
// kernel (~3x the mma.sync kernels). It reads A k- or m-major and B n- or k-major; TF32 reads B
// k-major only, so a n-major b is the transposed problem C^T = B^T A^T (B^T from registers).
TEST(GemmRule, Wgmma) {
  for (DType t : {DType::BFloat16, DType::Float16}) {
    const GemmPlan p = plan_gemm(row_major(t, 8192, 8192, 8192), kH100);
    EXPECT_EQ(p.kernel, GemmKernel::Wgmma) << describe(p);
    EXPECT_EQ(std::string(p.rule).rfind("Wgmma", 0), 0u) << p.rule;  // its tile's row
    EXPECT_TRUE(p.a_kmajor);
    EXPECT_TRUE(p.b_nmajor);
  }
  // TF32 with a row-major b: the transposed problem, its A (b^T) m-major, its B (a^T) k-major.
  GemmPlan p = plan_gemm(tf32(row_major(DType::Float32, 300, 200, 64)), kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Wgmma) << describe(p);
  EXPECT_TRUE(p.wgmma().c_trans);
  EXPECT_FALSE(p.swap_ab);
  EXPECT_EQ(p.m, 200);
  EXPECT_EQ(p.n, 300);
  EXPECT_FALSE(p.a_kmajor);
  EXPECT_FALSE(p.b_nmajor);
  // a.t() @ b.t(): A m-major from registers, B k-major: no transposition needed.
  p = plan_gemm(transposed_b(transposed_a(tf32(row_major(DType::Float32, 300, 200, 64)))), kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Wgmma);
  EXPECT_FALSE(p.wgmma().c_trans);
  // wgmma never splits k over a cluster (that instance lost to the best unsplit tile everywhere
  // and is gone: WgmmaParams has no such split): the GPU suite's bf16 products
  // (tests/python/test_gemm_split_k.py) run every tile's whole k in one CTA, no workspace.
  for (const GemmRequest& r :
       {row_major(DType::BFloat16, 3072, 1024, 8192), row_major(DType::BFloat16, 128, 4096, 4096),
        row_major(DType::BFloat16, 4096, 4096, 4096),
        row_major(DType::BFloat16, 1024, 1024, 1024)}) {
    const GemmPlan q = plan_gemm(r, kH100);
    EXPECT_EQ(q.kernel, GemmKernel::Wgmma) << r.m << " x " << r.n << " x " << r.k;
    EXPECT_EQ(q.wgmma().tail_units, 0) << describe(q);
    EXPECT_EQ(q.workspace_bytes, 0);
  }
  // Just outside: a column of a broadcast along k (strides (1, 0)), readable m-major with leading
  // stride 0, which TMA refuses (rows would overlap); sizes past TMA's 32-bit coordinates (m above
  // the small-M kernel's tokens): the mma.sync kernel.
  GemmRequest r = row_major(DType::BFloat16, 512, 512, 512);
  r.a.stride0 = 1, r.a.stride1 = 0;
  p = plan_gemm(r, kH100);
  EXPECT_EQ(p.kernel, GemmKernel::MmaHalf) << describe(p);
  EXPECT_STREQ(p.rule, "MmaHalf");
  EXPECT_EQ(p.lda, 0);
  r = row_major(DType::BFloat16, 32, 16, int64_t{1} << 31);
  EXPECT_EQ(plan_gemm(r, kH100).kernel, GemmKernel::MmaHalf);
  // float32 'highest', or wgmma switched off.
  EXPECT_EQ(plan_gemm(row_major(DType::Float32, 4096, 4096, 4096), kH100).kernel, GemmKernel::Simt);
  EXPECT_EQ(plan_gemm(row_major(DType::BFloat16, 4096, 4096, 4096), kH100NoWgmma).kernel,
            GemmKernel::MmaHalf);
}

// The tile: 128 x 256 (in pairs along m when there are >= 2 tile rows; pairs multicast B),
// 128 x 128 or 128 x 64, the least (bn + col) x (waves x k + fixed): a partial last wave of wide
// tiles cost 1024 x 6144 x 4096 0.82x cuBLAS where 128 x 128 ran 0.97x.
TEST(GemmRule, WgmmaTile) {
  for (DType t : {DType::BFloat16, DType::Float16}) {
    const GemmPlan p = plan_gemm(row_major(t, 8192, 8192, 8192), kH100);
    EXPECT_STREQ(p.rule, "WgmmaTile") << describe(p);
    EXPECT_EQ(p.wgmma().bm, 128);
    EXPECT_EQ(p.wgmma().bn, 256);
    EXPECT_EQ(p.wgmma().cluster_m, 2);
  }
  // One tile row of wide tiles runs single CTAs (k long enough for one wave of 128 x 256 to beat
  // two of 128 x 128 despite its fixed cost).
  GemmPlan p = plan_gemm(row_major(DType::BFloat16, 128, 256 * 132, 65536), kH100);
  EXPECT_STREQ(p.rule, "WgmmaTile") << describe(p);
  EXPECT_EQ(p.wgmma().bn, 256);
  EXPECT_EQ(p.wgmma().cluster_m, 1);
  EXPECT_EQ(p.grid, 132);
  // Few tiles: the width that finishes first. 1024^3: 64 tiles of 128 x 128 (one wave, 160
  // column-units) against 128 of 128 x 64 (one wave, 96).
  p = plan_gemm(row_major(DType::BFloat16, 1024, 1024, 1024), kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Wgmma);
  EXPECT_STREQ(p.rule, "WgmmaTile");
  EXPECT_EQ(p.wgmma().bn, 64);
  EXPECT_EQ(p.wgmma().cluster_m, 1);
  EXPECT_EQ(p.grid, 128);
  // 2048^3: 256 tiles of 128 x 128 (2 waves: 160 x (2 x 2048 + 512)) against one wave of 128
  // tiles of 128 x 256 (256 x (2048 + 2048)): 1.00x cuBLAS against 0.96x, three runs.
  EXPECT_EQ(plan_gemm(row_major(DType::BFloat16, 2048, 2048, 2048), kH100).wgmma().bn, 128);
  // gpt-2's c_fc weight gradient over 512 tokens (a m-major, b n-major): 128 x 64 (0.85x), not
  // one wave of 128 x 256 pairs (0.66x).
  GemmRequest w = row_major(DType::BFloat16, 3072, 768, 512);
  w.a = {w.a.ptr, 1, 3072};
  EXPECT_EQ(plan_gemm(w, kH100).wgmma().bn, 64);
  // More than a wave of wide tiles, but a partial last one: 1024 x 6144 x 4096 is 192 tiles of
  // 128 x 256 (2 waves of pairs: 576) or 384 of 128 x 128 (3 waves: 480), which ran 0.97x cuBLAS
  // against 0.82x; k whole in every CTA.
  p = plan_gemm(row_major(DType::BFloat16, 1024, 6144, 4096), kH100);
  EXPECT_EQ(p.wgmma().bn, 128);
  EXPECT_EQ(p.wgmma().tail_units, 0);
  // Fewer wide tiles than SMs that still finish first: 1024 x 4096 x 28672, 128 tiles of
  // 128 x 256 (0.99x) against 256 of 128 x 128 (0.81x).
  EXPECT_EQ(plan_gemm(row_major(DType::BFloat16, 1024, 4096, 28672), kH100).wgmma().bn, 256);
  // One row of output whose k is not contiguous (the first row of an m-major a, strides (1, 8)),
  // so not the small-M kernel's: 16 tiles of 128 x 256 are too few, 64 of 128 x 64 one wave.
  GemmRequest v = row_major(DType::BFloat16, 1, 4096, 4096);
  v.a = {v.a.ptr, 1, 8};
  p = plan_gemm(v, kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Wgmma) << describe(p);
  EXPECT_EQ(p.wgmma().bn, 64);
  EXPECT_EQ(p.grid, 64);
  // The sweeps' override: a data-parallel tile, rule "with_tile".
  p = with_tile(plan_gemm(row_major(DType::BFloat16, 4096, 4096, 4096), kH100), 128, 128, 0, 1,
                kH100);
  EXPECT_STREQ(p.rule, "with_tile");
  EXPECT_EQ(p.wgmma().bn, 128);
  EXPECT_EQ(p.wgmma().cluster_m, 1);
}

// 16-bit types: 192 x 128 tiles (three consumer warpgroups), single CTAs, where one wave of them
// costs less than the 128-row plans (cuBLAS's tile for the c_attn weight gradient).
TEST(GemmRule, WgmmaTall) {
  // A GPT-style c_attn weight gradient, 3072 x 1024 over k = 8192 (a m-major): 128 tiles of
  // 192 x 128, one wave on 132 SMs, where 128 x 128 makes 192 (1.45 waves; its split tail ran
  // 1.09x cuBLAS, the tall tiles 1.09-1.23x).
  GemmRequest w = row_major(DType::BFloat16, 3072, 1024, 8192);
  w.a = {w.a.ptr, 1, 3072};
  GemmPlan p = plan_gemm(w, kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Wgmma) << describe(p);
  EXPECT_STREQ(p.rule, "WgmmaTall");
  EXPECT_EQ(p.wgmma().bm, 192);
  EXPECT_EQ(p.wgmma().bn, 128);
  EXPECT_EQ(p.wgmma().cluster_m, 1);
  EXPECT_EQ(p.grid, 128);
  EXPECT_EQ(p.wgmma().tail_units, 0);
  EXPECT_EQ(p.workspace_bytes, 0);
  // gpt-2's c_fc weight gradient over 4096 tokens: 96 tall tiles (0.90x) against 144 of
  // 128 x 128 and their tail (0.73x).
  w = row_major(DType::Float16, 768, 3072, 4096);
  w.a = {w.a.ptr, 1, 768};
  EXPECT_EQ(plan_gemm(w, kH100).wgmma().bm, 192);
  // Not where 128-row tiles fill their waves as well: big squares keep their pairs, the forwards
  // at 8192 tokens 128 x 128 (1536 tiles, 11.6 waves, against 1032 tall in 7.8); TF32 has no tall
  // tile.
  for (const GemmRequest& r :
       {row_major(DType::BFloat16, 4096, 4096, 4096), row_major(DType::BFloat16, 8192, 8192, 8192),
        row_major(DType::BFloat16, 8192, 3072, 1024), row_major(DType::BFloat16, 1024, 6144, 4096),
        tf32(row_major(DType::Float32, 3072, 1024, 8192))}) {
    p = plan_gemm(r, kH100);
    EXPECT_EQ(p.wgmma().bm, 128) << r.m << " x " << r.n << " x " << r.k << ": " << describe(p);
    EXPECT_STRNE(p.rule, "WgmmaTall");
  }
  // Both 16-bit types alike, on the GPU suite's tall-tile products
  // (tests/python/test_gemm_split_k.py's wgmma products; a m-major over the long k, k-major
  // otherwise): the ragged 3000 x 1000 x 8200 too.
  for (DType t : {DType::BFloat16, DType::Float16}) {
    for (const GemmRequest& r : {transposed_a(row_major(t, 3072, 1024, 8192)),
                                 transposed_a(row_major(t, 3000, 1000, 8200))}) {
      const GemmPlan q = plan_gemm(r, kH100);
      EXPECT_EQ(q.wgmma().bm, 192) << static_cast<int>(t) << ": " << r.m << " x " << r.n << " x "
                                   << r.k << ": " << describe(q);
      EXPECT_EQ(q.wgmma().bn, 128);
    }
    for (const GemmRequest& r : {row_major(t, 4096, 4096, 4096), row_major(t, 8192, 8192, 8192),
                                 row_major(t, 1024, 6144, 4096)}) {
      EXPECT_EQ(plan_gemm(r, kH100).wgmma().bm, 128)
          << static_cast<int>(t) << ": " << r.m << " x " << r.n << " x " << r.k;
    }
  }
  // The sweep's override takes the tall tile too, and only 128 or 192 rows.
  const GemmPlan t = with_tile(plan_gemm(row_major(DType::BFloat16, 4096, 4096, 4096), kH100), 192,
                               128, 0, 1, kH100);
  EXPECT_EQ(t.wgmma().bm, 192);
  EXPECT_EQ(t.grid, 118);  // 22 x 32 tiles: 6 waves of 118
}

// A partial last wave over a long k: the full waves on single CTAs, one per SM, then the last
// wave's tiles each cut into runs of k over the SMs it leaves idle, partials added in run order
// (a flag and a float partial per CTA of workspace). A fixed cost (memset, wait) loses on short k.
TEST(GemmRule, WgmmaTailSplit) {
  // gpt-2's c_fc weight gradient over 16384 tokens: 144 tiles, the last 12 in 11 runs (0.94x;
  // 0.69x without; 96 tall tiles, one wave, 0.89x).
  GemmRequest w = row_major(DType::BFloat16, 768, 3072, 16384);
  w.a = {w.a.ptr, 1, 768};
  GemmPlan p = plan_gemm(w, kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Wgmma) << describe(p);
  EXPECT_STREQ(p.rule, "WgmmaTailSplit");
  EXPECT_EQ(p.wgmma().bm, 128);
  EXPECT_EQ(p.wgmma().bn, 128);
  EXPECT_EQ(p.wgmma().cluster_m, 1);
  EXPECT_EQ(p.grid, 132);
  EXPECT_EQ(p.workspace_bytes, tail_workspace_bytes(132, 128, 128));
  EXPECT_EQ(p.wgmma().tail_units, 12);
  EXPECT_EQ(p.wgmma().tail_split, 11);
  // TF32 too, in its transposed problem: 1024 x 4544 x 18176 (0.75x data-parallel, 1.05x split).
  p = plan_gemm(tf32(row_major(DType::Float32, 1024, 4544, 18176)), kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Wgmma);
  EXPECT_STREQ(p.rule, "WgmmaTailSplit");
  EXPECT_GT(p.wgmma().tail_units, 0);
  EXPECT_GT(p.workspace_bytes, 0);
  // 512 x 512 over k = 8192 (TF32): 32 tiles of 128 x 64, each cut into 4 runs (132 / 32) on
  // single CTAs (never a cluster's k split).
  p = plan_gemm(tf32(row_major(DType::Float32, 512, 512, 8192)), kH100);
  EXPECT_STREQ(p.rule, "WgmmaTailSplit") << describe(p);
  EXPECT_EQ(p.wgmma().cluster_m, 1);
  EXPECT_EQ(p.wgmma().tail_units, 32);
  EXPECT_EQ(p.wgmma().tail_split, 4);
  // Not where the waves are whole or nearly so, or the k is short: big squares keep their pairs,
  // gpt-2's short-k products their data-parallel tiles (the tail's fixed cost lost 0.3-0.5x there).
  for (const GemmRequest& r :
       {row_major(DType::BFloat16, 4096, 4096, 4096), row_major(DType::BFloat16, 8192, 8192, 8192),
        row_major(DType::BFloat16, 1024, 6144, 4096), row_major(DType::Float16, 128, 4096, 4096),
        row_major(DType::BFloat16, 128, 4096, 4096), row_major(DType::BFloat16, 512, 768, 768),
        row_major(DType::BFloat16, 1024, 1024, 1024)}) {
    const GemmPlan q = plan_gemm(r, kH100);
    EXPECT_EQ(q.wgmma().tail_units, 0)
        << r.m << " x " << r.n << " x " << r.k << ": " << describe(q);
    EXPECT_EQ(q.workspace_bytes, 0);
    EXPECT_STRNE(q.rule, "WgmmaTailSplit");
  }
  // A sweep's tile override is data-parallel; its tail override cuts as asked, within the idle SMs
  // (60 tiles of 128 x 128 at 3072 x 1024: at most 2 runs) and the k-tiles.
  const GemmPlan t = with_tile(p, 128, 128, 0, 1, kH100);
  EXPECT_EQ(t.wgmma().tail_units, 0);
  EXPECT_EQ(t.workspace_bytes, 0);
  const GemmPlan base = plan_gemm(row_major(DType::BFloat16, 3072, 1024, 8192), kH100);
  const GemmPlan two = with_tail_split(base, 128, 2, kH100);
  EXPECT_STREQ(two.rule, "with_tail_split");
  EXPECT_EQ(two.wgmma().bm, 128);
  EXPECT_EQ(two.wgmma().tail_units, 60);
  EXPECT_EQ(two.wgmma().tail_split, 2);
  EXPECT_EQ(two.workspace_bytes, tail_workspace_bytes(132, 128, 128));
  // Refused (3 runs): unchanged, the rule saying why.
  const GemmPlan three = with_tail_split(two, 128, 3, kH100);
  EXPECT_EQ(three.wgmma().tail_units, two.wgmma().tail_units);
  EXPECT_EQ(three.wgmma().tail_split, 2);
  EXPECT_EQ(std::string(three.rule).rfind("with_tail_split: ", 0), 0u) << three.rule;
  // 512 tiles of 128 x 256 on 132 SMs: 116 left, room for one run each.
  EXPECT_EQ(
      with_tail_split(plan_gemm(row_major(DType::BFloat16, 4096, 4096, 4096), kH100), 256, 0, kH100)
          .wgmma()
          .tail_units,
      0);
}

// The persistent grid: the fewest CTAs (for pairs, clusters) that finish the tiles in as many waves
// as the most that fit would; every wave full (under the power cap the idle SMs' share goes to the
// others' clock).
TEST(GemmRule, WgmmaGrid) {
  // 8192^3 bf16: 32 x 32 = 1024 pair units on at most 66 pairs: 16 waves, so 64 pairs (128 CTAs)
  // fill every wave.
  EXPECT_EQ(plan_gemm(row_major(DType::BFloat16, 8192, 8192, 8192), kH100).grid, 128);
  // 4096^3: 256 pair units, 4 waves of 66 pairs, or of 64.
  EXPECT_EQ(plan_gemm(row_major(DType::BFloat16, 4096, 4096, 4096), kH100).grid, 128);
  // Fewer pairs fit (62: a pair needs two free SMs of one GPC): 1024 units take 17 waves, of 61
  // pairs.
  EXPECT_EQ(plan_gemm(row_major(DType::BFloat16, 8192, 8192, 8192), GemmDevice{132, true, 62}).grid,
            122);
  // Single CTAs: 2048^3, 256 tiles of 128 x 128 on 132 SMs, 2 waves: 128 CTAs of 2 tiles each.
  GemmPlan p = plan_gemm(row_major(DType::BFloat16, 2048, 2048, 2048), kH100);
  EXPECT_EQ(p.wgmma().cluster_m, 1) << describe(p);
  EXPECT_EQ(p.grid, 128);
  // Every tile count: 1-64 rows of 7 tiles of 128 x 128 (single CTAs on 132 SMs), and 1-32 rows of
  // pairs of 4 tiles of 128 x 256 (pairs on 66), as the sweeps' override sets the grid: the fewest
  // CTAs that take as many waves as the most would.
  for (int64_t rows = 1; rows <= 64; ++rows) {
    const GemmPlan base = plan_gemm(row_major(DType::BFloat16, 128 * rows, 7 * 128, 4096), kH100);
    for (const int cluster : {1, 2}) {
      const GemmPlan q = with_tile(base, 128, cluster == 1 ? 128 : 256, 0, cluster, kH100);
      const int64_t units = cluster == 1 ? rows * 7 : (rows + 1) / 2 * 4;
      // CTAs, or pairs: the most that fit, and the grid's.
      const int64_t most = cluster == 1 ? 132 : 66, clusters = q.grid / cluster;
      const int64_t waves = (units + most - 1) / most;
      SCOPED_TRACE(testing::Message()
                   << units << " units, clusters of " << cluster << ": " << describe(q));
      EXPECT_EQ(q.grid % cluster, 0);
      EXPECT_LE(clusters, most);
      EXPECT_EQ((units + clusters - 1) / clusters, waves);
      if (clusters > 1) {
        EXPECT_GT((units + clusters - 2) / (clusters - 1), waves);  // one fewer: another wave
      }
    }
  }
  // The split tail's grid is one CTA per SM (every run resident at once), not balanced.
  GemmRequest w = row_major(DType::BFloat16, 768, 3072, 16384);
  w.a = {w.a.ptr, 1, 768};
  EXPECT_EQ(plan_gemm(w, kH100).grid, 132);
}

// 16-bit c, beta 0 (as the kernel sees it: a float) or 1 (TMA's reduce-add) and c TMA describes
// (16-byte aligned base and rows): the output leaves by TMA store (direct stores cost 10-13 % at
// 4096^3-8192^3).
TEST(GemmRule, WgmmaTmaStore) {
  for (DType t : {DType::BFloat16, DType::Float16}) {
    EXPECT_TRUE(plan_gemm(row_major(t, 8192, 8192, 8192), kH100).wgmma().tma_store);
  }
  // c column-major: the transposed product's c is row-major, stored so too.
  GemmRequest r = row_major(DType::BFloat16, 4096, 4096, 4096);
  r.c_stride0 = 1, r.c_stride1 = 4096;
  EXPECT_TRUE(plan_gemm(r, kH100).wgmma().tma_store);
  // A beta that rounds to 0 in float is 0 for the kernel, which then never reads c.
  r = row_major(DType::BFloat16, 4096, 4096, 4096);
  r.beta = 1e-60;
  EXPECT_TRUE(plan_gemm(r, kH100).wgmma().tma_store);
  r.beta = 1.0;
  EXPECT_TRUE(plan_gemm(r, kH100).wgmma().tma_store);
  // Just outside: beta, c's rows 8200 bytes apart (stored pair by pair), its base 2 bytes off 16,
  // float32 outputs (stored directly).
  r.beta = 0.5;
  EXPECT_FALSE(plan_gemm(r, kH100).wgmma().tma_store);
  r = row_major(DType::BFloat16, 4096, 4096, 4096);
  r.c_stride0 = 4100;
  GemmPlan p = plan_gemm(r, kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Wgmma);
  EXPECT_FALSE(p.wgmma().tma_store);
  r = row_major(DType::BFloat16, 4096, 4096, 4096);
  r.c = address(0x300002);
  EXPECT_FALSE(plan_gemm(r, kH100).wgmma().tma_store);
  p = plan_gemm(tf32(row_major(DType::Float32, 300, 200, 64)), kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Wgmma);
  EXPECT_FALSE(p.wgmma().tma_store);
}

// A programmatic dependent launch (the prologue overlaps the previous kernel's tail), except after
// the split tail's memset: its flags must be zero before a run arrives.
TEST(GemmRule, WgmmaDependentLaunch) {
  GemmRequest tall = row_major(DType::BFloat16, 3072, 1024, 8192);
  tall.a = {tall.a.ptr, 1, 3072};
  for (const GemmRequest& r :
       {row_major(DType::BFloat16, 8192, 8192, 8192), row_major(DType::BFloat16, 1024, 1024, 1024),
        tall, tf32(row_major(DType::Float32, 300, 200, 64))}) {
    const GemmPlan p = plan_gemm(r, kH100);
    EXPECT_EQ(p.wgmma().tail_units, 0) << describe(p);
    EXPECT_TRUE(p.wgmma().pdl) << describe(p);
  }
  GemmRequest w = row_major(DType::BFloat16, 768, 3072, 16384);
  w.a = {w.a.ptr, 1, 768};
  for (const GemmRequest& r : {w, tf32(row_major(DType::Float32, 1024, 4544, 18176))}) {
    const GemmPlan p = plan_gemm(r, kH100);
    EXPECT_GT(p.wgmma().tail_units, 0) << describe(p);
    EXPECT_FALSE(p.wgmma().pdl) << describe(p);
  }
  // The overrides follow: a tail set by hand launches after its memset, a tile set by hand as a
  // dependent again.
  const GemmPlan two = with_tail_split(
      plan_gemm(row_major(DType::BFloat16, 3072, 1024, 8192), kH100), 128, 2, kH100);
  EXPECT_GT(two.wgmma().tail_units, 0);
  EXPECT_FALSE(two.wgmma().pdl);
  const GemmPlan tile = with_tile(plan_gemm(w, kH100), 128, 128, 0, 1, kH100);
  EXPECT_EQ(tile.wgmma().tail_units, 0);
  EXPECT_TRUE(tile.wgmma().pdl);
}

// bf16/fp16 where wgmma does not run: mma.sync 128 x 128 from 264 tiles of it (about two waves of
// two blocks an SM), else 64 x 128.
TEST(GemmRule, MmaHalf) {
  GemmPlan p = plan_gemm(row_major(DType::BFloat16, 4096, 4096, 4096), kA100);
  EXPECT_EQ(p.kernel, GemmKernel::MmaHalf) << describe(p);
  EXPECT_STREQ(p.rule, "MmaHalf");
  EXPECT_EQ(p.tiled().bm, 128);
  EXPECT_EQ(p.tiled().bn, 128);
  EXPECT_EQ(p.grid, 32 * 32);
  p = plan_gemm(row_major(DType::Float16, 1024, 1024, 1024), kA100);
  EXPECT_EQ(p.tiled().bm, 64);
  EXPECT_EQ(p.tiled().bn, 128);
  EXPECT_EQ(p.grid, 16 * 8);
  // The edge: 12 x 22 = 264 tiles of 128 x 128, and 12 x 21 = 252.
  EXPECT_EQ(plan_gemm(row_major(DType::BFloat16, 1536, 2816, 1024), kA100).tiled().bm, 128);
  EXPECT_EQ(plan_gemm(row_major(DType::BFloat16, 1536, 2688, 1024), kA100).tiled().bm, 64);
  // Hopper with wgmma switched off plans the same.
  p = plan_gemm(row_major(DType::BFloat16, 4096, 4096, 4096), kH100NoWgmma);
  EXPECT_STREQ(p.rule, "MmaHalf");
  EXPECT_EQ(p.tiled().bm, 128);
}

// TF32 where wgmma does not run: mma.sync 128 x 128 from 512 tiles of it, else 64 x 128 (which
// keeps two blocks an SM in 128 registers).
TEST(GemmRule, MmaTf32) {
  GemmPlan p = plan_gemm(tf32(row_major(DType::Float32, 4096, 4096, 4096)), kA100);
  EXPECT_EQ(p.kernel, GemmKernel::MmaTf32) << describe(p);
  EXPECT_STREQ(p.rule, "MmaTf32");
  EXPECT_EQ(p.tiled().bm, 128);
  EXPECT_EQ(plan_gemm(tf32(row_major(DType::Float32, 2048, 2048, 2048)), kA100).tiled().bm, 64);
  // The edge: 16 x 32 = 512 tiles, and 16 x 31 = 496.
  EXPECT_EQ(plan_gemm(tf32(row_major(DType::Float32, 2048, 4096, 1024)), kA100).tiled().bm, 128);
  p = plan_gemm(tf32(row_major(DType::Float32, 2048, 3968, 1024)), kA100);
  EXPECT_EQ(p.tiled().bm, 64);
  EXPECT_EQ(p.tiled().bn, 128);
  EXPECT_STREQ(plan_gemm(tf32(row_major(DType::Float32, 4096, 4096, 4096)), kH100NoWgmma).rule,
               "MmaTf32");
}

// float32 'highest' with an m-major a of leading stride 0 (a column broadcast along k) and k > 1:
// the SIMT loop counts its slices by A's pointer, so the general kernel.
TEST(GemmRule, SimtLeadingStrideZero) {
  GemmRequest r = row_major(DType::Float32, 300, 520, 260);
  r.a.stride0 = 1, r.a.stride1 = 0;
  GemmPlan p = plan_gemm(r, kH100);
  EXPECT_EQ(p.kernel, GemmKernel::General) << describe(p);
  EXPECT_STREQ(p.rule, "SimtLeadingStrideZero");
  // Just outside: k = 1 (nothing to step over), a row broadcast along m (k-major, leading
  // stride 0), TF32 (another kernel): no such loop.
  r.k = 1;
  EXPECT_EQ(plan_gemm(r, kH100).kernel, GemmKernel::Simt);
  r = row_major(DType::Float32, 300, 520, 260);
  r.a.stride0 = 0, r.a.stride1 = 1;
  EXPECT_EQ(plan_gemm(r, kH100).kernel, GemmKernel::Simt);
  r = tf32(row_major(DType::Float32, 300, 520, 260));
  r.a.stride0 = 1, r.a.stride1 = 0;
  EXPECT_EQ(plan_gemm(r, kA100).kernel, GemmKernel::MmaTf32);
  // With b's rows not whole 16 bytes (521 floats apart) and 300 rows of c to pay its copy: the
  // general kernel all the same.
  r = row_major(DType::Float32, 300, 520, 260);
  r.a.stride0 = 1, r.a.stride1 = 0;
  r.b.stride0 = 521;
  p = plan_gemm(r, kH100);
  EXPECT_EQ(p.kernel, GemmKernel::General) << describe(p);
  EXPECT_STREQ(p.rule, "SimtLeadingStrideZero");
}

// float32 'highest': SIMT 128 x 128 or 64 x 64, k split into 1-16 CTAs writing partial planes
// summed in order, the least busiest-SM time (plan_simt; 0.996x the sweep's best pick).
TEST(GemmRule, Simt) {
  GemmPlan p = plan_gemm(row_major(DType::Float32, 4096, 4096, 4096), kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Simt) << describe(p);
  EXPECT_STREQ(p.rule, "Simt");
  EXPECT_EQ(p.tiled().bm, 128);
  EXPECT_EQ(p.tiled().bk, 8);
  EXPECT_EQ(p.grid, 32 * 32);
  EXPECT_EQ(p.tiled().split_k, 1);
  // Fewer tiles than two blocks per SM hold, over a long enough k: k split into independent CTAs
  // whose partial planes (split x m x n floats of workspace) a second kernel adds; any GPU, no
  // cluster.
  p = plan_gemm(row_major(DType::Float32, 1024, 1024, 1024), kH100);
  EXPECT_EQ(p.tiled().bm, 128);
  EXPECT_EQ(p.grid, 8 * 8);
  EXPECT_EQ(p.tiled().split_k, 2);
  EXPECT_EQ(p.workspace_bytes, 2 * 1024 * 1024 * 4);
  EXPECT_EQ(p.workspace_bytes, split_planes_bytes(1024, 1024, 2, 4));
  p = plan_gemm(row_major(DType::Float32, 128, 4096, 4096), kH100);
  EXPECT_EQ(p.grid, 32);
  EXPECT_EQ(p.tiled().split_k, 8);  // 256 CTAs: one wave of pairs
  EXPECT_EQ(plan_gemm(row_major(DType::Float32, 128, 14336, 4096), kH100).tiled().split_k,
            7);  // 784 CTAs: 3 waves
  // 224 tiles are one wave, but 92 SMs would run two and 40 one: 896 CTAs even them out.
  EXPECT_EQ(plan_gemm(row_major(DType::Float32, 128, 28672, 4096), kH100).tiled().split_k, 4);
  // Many waves gain too little for the workspace they would take (2 ways at 4096^3: 128 MiB).
  p = plan_gemm(row_major(DType::Float32, 4096, 4096, 4096), kA100);
  EXPECT_EQ(p.tiled().split_k, 1);
  EXPECT_EQ(p.workspace_bytes, 0);
  p = plan_gemm(row_major(DType::Float32, 1024, 1024, 1024), kA100);  // no clusters needed
  EXPECT_EQ(p.tiled().bm, 128);
  EXPECT_EQ(p.tiled().split_k, 3);
  // 2048^3: 256 tiles of 128 x 128 nearly fill the SMs' 264 block slots: unsplit (the other side
  // of tests/python/test_gemm_split_k.py's split products).
  EXPECT_EQ(plan_gemm(row_major(DType::Float32, 2048, 2048, 2048), kH100).tiled().split_k, 1);
  // nn.Linear's x @ W.t() at 128 tokens, 4096 -> 4096 (b k-major) splits as a row-major b does:
  // the split test_gemm_split_k.py's reduce-overhead test replays in CUDA graphs.
  EXPECT_EQ(
      plan_gemm(transposed_b(row_major(DType::Float32, 128, 4096, 4096)), kH100).tiled().split_k,
      8);
  // A k too short for two slices of 128: unsplit, 64 x 64 tiles to spread the 32 big ones.
  p = plan_gemm(row_major(DType::Float32, 128, 4096, 200), kH100);
  EXPECT_EQ(p.tiled().bm, 64);
  EXPECT_EQ(p.tiled().bk, 16);
  EXPECT_EQ(p.tiled().split_k, 1);
  EXPECT_EQ(p.workspace_bytes, 0);
  // The experiments' overrides: a split sizes its planes; a tile is k whole.
  p = with_split_k(plan_gemm(row_major(DType::Float32, 4096, 4096, 4096), kH100), 3);
  EXPECT_STREQ(p.rule, "with_split_k");
  EXPECT_EQ(p.tiled().split_k, 3);
  EXPECT_EQ(p.workspace_bytes, split_planes_bytes(4096, 4096, 3, 4));
  p = with_tile(p, 64, 64, 16, 1, kH100);
  EXPECT_STREQ(p.rule, "with_tile");
  EXPECT_EQ(p.tiled().bm, 64);
  EXPECT_EQ(p.tiled().split_k, 1);
  EXPECT_EQ(p.workspace_bytes, 0);
  EXPECT_EQ(p.grid, 64 * 64);
}

// The grouped GEMM: the general kernel for what the wgmma one cannot read or store whole.
TEST(GemmRule, GroupedGeneral) {
  const GroupedRequest rows{DType::BFloat16, 1536, 2048, 0, false, false, false, true};
  EXPECT_TRUE(plan_grouped(rows, kH100).wgmma);
  for (const auto& [r, dev] : std::vector<std::pair<GroupedRequest, GemmDevice>>{
           {{DType::Float32, 1536, 2048, 0, false, false, false, true}, kH100},
           {rows, kA100},
           {{DType::BFloat16, 1536, 2048, 0, false, false, false, false}, kH100},
           {{DType::Float16, 2048, 0, 1000, true, false, false, true}, kH100}}) {
    const GroupedPlan p = plan_grouped(r, dev);
    EXPECT_FALSE(p.wgmma);
    EXPECT_STREQ(p.rule, "GroupedGeneral");
  }
}

// Elsewhere the wgmma grouped kernel: 128 x 256 for the dual GEMM and products >= 256 wide.
TEST(GemmRule, GroupedWgmma) {
  const GroupedPlan dual =
      plan_grouped({DType::BFloat16, 192, 2048, 0, false, true, false, true}, kH100);
  EXPECT_TRUE(dual.wgmma);
  EXPECT_EQ(dual.bn, 256);
  EXPECT_STREQ(dual.rule, "GroupedWgmma");
  EXPECT_EQ(plan_grouped({DType::Float16, 2048, 768, 0, false, false, true, true}, kH100).bn, 256);
  EXPECT_EQ(plan_grouped({DType::BFloat16, 192, 2048, 0, false, false, false, true}, kH100).bn,
            128);
  const GroupedPlan k =
      plan_grouped({DType::BFloat16, 2048, 0, 1536, true, false, true, true}, kH100);
  EXPECT_TRUE(k.wgmma);
  EXPECT_EQ(k.bn, 256);
}

// ---- Across the rows ----

// The GPU suite's quick product on each fast path in each operand layout
// (tests/python/test_ops.py's test_gemm_fast_paths_every_layout, and its run with the wgmma switch
// on): 512 x 384 over k = 256, a and b row-major or transposed. On Hopper the 16-bit types and
// TF32 take wgmma (TF32's transposed a times row-major b after a column-major copy of b, the
// smaller), "highest" the SIMT kernel; without wgmma the mma.sync kernels, copy-free.
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
        const GemmPlan hopper = plan_gemm(r, kH100);
        EXPECT_EQ(hopper.copy_a.layout, CopyLayout::None);
        if (f.allow_tf32 && ta && !tb) {
          EXPECT_TRUE(
              is_copy(hopper.copy_b, CopyLayout::ColumnMajor, CopyVia::Transpose, 384, 256, 256));
        } else {
          EXPECT_EQ(hopper.copy_b.layout, CopyLayout::None);
        }
        EXPECT_EQ(hopper.kernel, f.hopper) << describe(hopper);
        EXPECT_TRUE(planned_for_copies(r, kH100));
        for (const GemmDevice& dev : {kA100, kH100NoWgmma}) {
          const GemmPlan p = plan_gemm(r, dev);
          EXPECT_EQ(p.copy_a.layout, CopyLayout::None);
          EXPECT_EQ(p.copy_b.layout, CopyLayout::None);
          EXPECT_EQ(p.kernel, f.portable) << describe(p);
        }
      }
    }
  }
}

// TF32 of slices of wider tensors in every operand layout, with the GPU suite's strides
// (tests/python/test_ops.py's test_gemm_tf32_sliced_rows_every_layout: 300 x 290 over k = 333).
// Rows a whole number of 16 bytes apart are read in place, except on Hopper a transposed a times a
// row-major b: the smaller (b) is copied column-major. Rows that are not (leading strides one
// more) are copied, b column-major where TF32 wgmma reads it; by the transpose kernel where the
// source's contiguous axis is the copy's strided one. Then wgmma on Hopper, the portable TF32
// kernel elsewhere.
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
        const CopyVia a_via = ta ? CopyVia::Transpose : CopyVia::Strided;
        const GemmPlan hopper = plan_gemm(r, kH100);
        if (odd) {
          EXPECT_TRUE(is_copy(hopper.copy_a, CopyLayout::RowMajor, a_via, m, k, 336));
        } else {
          EXPECT_EQ(hopper.copy_a.layout, CopyLayout::None);
        }
        if (odd || (ta && !tb)) {
          EXPECT_TRUE(is_copy(hopper.copy_b, CopyLayout::ColumnMajor,
                              tb ? CopyVia::Strided : CopyVia::Transpose, n, k, 336));
        } else {
          EXPECT_EQ(hopper.copy_b.layout, CopyLayout::None);
        }
        EXPECT_EQ(hopper.kernel, GemmKernel::Wgmma) << describe(hopper);
        EXPECT_TRUE(planned_for_copies(r, kH100));
        for (const GemmDevice& dev : {kA100, kH100NoWgmma}) {
          const GemmPlan p = plan_gemm(r, dev);
          if (odd) {
            EXPECT_TRUE(is_copy(p.copy_a, CopyLayout::RowMajor, a_via, m, k, 336));
            EXPECT_TRUE(is_copy(p.copy_b, CopyLayout::RowMajor,
                                tb ? CopyVia::Transpose : CopyVia::Strided, k, n, 292));
          } else {
            EXPECT_EQ(p.copy_a.layout, CopyLayout::None);
            EXPECT_EQ(p.copy_b.layout, CopyLayout::None);
          }
          EXPECT_EQ(p.kernel, GemmKernel::MmaTf32) << describe(p);
          EXPECT_TRUE(planned_for_copies(r, dev));
        }
      }
    }
  }
}

// Contiguous operands and output whose rows are not whole 16 bytes (tests/python/test_ops.py's
// test_gemm_cuda_odd_leading_strides: 257 x 259 over k = 333, c's rows 259 elements apart too,
// beta 0 or not): both operands copied into padded rows (b column-major for TF32 on wgmma), then a
// fast kernel, never the general one (whose float32 results would pass that test's accuracy check
// too).
TEST(GemmPlan, OddLeadingStridesAreCopiedForAFastKernel) {
  for (const FastPath& f : kFastPaths) {
    for (const double beta : {0.0, -2.0}) {
      SCOPED_TRACE(testing::Message() << kernel_name(f.portable) << ", beta " << beta);
      GemmRequest r = row_major(f.t, 257, 259, 333);
      r.allow_tf32 = f.allow_tf32;
      r.beta = beta;
      const int64_t unit = f.t == DType::Float32 ? 4 : 8;  // elements in 16 bytes
      const GemmPlan hopper = plan_gemm(r, kH100);
      EXPECT_TRUE(is_copy(hopper.copy_a, CopyLayout::RowMajor, CopyVia::Strided, 257, 333, 336));
      if (f.allow_tf32) {
        EXPECT_TRUE(
            is_copy(hopper.copy_b, CopyLayout::ColumnMajor, CopyVia::Transpose, 259, 333, 336));
      } else {
        EXPECT_TRUE(is_copy(hopper.copy_b, CopyLayout::RowMajor, CopyVia::Strided, 333, 259,
                            (259 + unit - 1) / unit * unit));
      }
      EXPECT_EQ(hopper.kernel, f.hopper) << describe(hopper);
      EXPECT_TRUE(planned_for_copies(r, kH100));
      for (const GemmDevice& dev : {kA100, kH100NoWgmma}) {
        const GemmPlan p = plan_gemm(r, dev);
        EXPECT_EQ(p.copy_b.layout, CopyLayout::RowMajor);
        EXPECT_EQ(p.kernel, f.portable) << describe(p);
        EXPECT_TRUE(planned_for_copies(r, dev));
      }
    }
  }
}

// Both sides of the small-M boundary as nn.Linear(1024 -> 4096) runs them, with the GPU suite's
// operands (tests/python/test_gemm_small_m.py's products at M = 16 and 17: slices of wider
// tensors, rows a whole number of 16 bytes and 16 bytes more apart), forward x @ W.t() and input
// gradient g @ W, in every float type: M = 16 takes the small-M kernel, streamed on Hopper and per
// lane without the stream (float64, which has no per-lane form: the DMMA kernel), M = 17 the tiled
// kernels.
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
        EXPECT_EQ(hopper.kernel == GemmKernel::Skinny, small) << describe(hopper);
        EXPECT_EQ(streams(hopper), small) << describe(hopper);
        if (f64) {
          EXPECT_EQ(hopper.kernel == GemmKernel::MmaF64, !small) << describe(hopper);
        }
        for (const GemmDevice& dev : {kH100Lanes, kA100}) {
          const GemmPlan p = plan_gemm(r, dev);
          EXPECT_EQ(p.kernel == GemmKernel::Skinny, small && !f64) << describe(p);
          EXPECT_FALSE(streams(p));
          if (f64) {
            EXPECT_EQ(p.kernel, GemmKernel::MmaF64);
          }
        }
      }
    }
  }
}

TEST(GemmPlan, OneRowAndOneColumnViewsHaveNoLeadingStride) {
  // a [1, k] and c [1, n] as slices of wider tensors: their leading strides never matter.
  GemmRequest r = row_major(DType::BFloat16, 1, 4096, 4096);
  r.a.stride0 = 3, r.c_stride0 = 5;
  const GemmPlan p = plan_gemm(r, kH100);
  EXPECT_EQ(p.kernel, GemmKernel::Skinny) << describe(p);
  EXPECT_EQ(p.lda, 0);
  EXPECT_EQ(p.ldc, 0);
}

// Every plan names the table row that chose its kernel: over every float type, shapes on each side
// of the small-M and copy boundaries, operand layouts readable or not, c row- or column-major, and
// each device.
TEST(GemmPlan, EveryPlanNamesItsRule) {
  const auto is_rule = [](const char* rule) {
    for (const char* r : kRules) {
      if (std::strcmp(rule, r) == 0) return true;
    }
    return false;
  };
  for (const FastPath& f : {kFastPaths[0], kFastPaths[2], kFastPaths[3],
                            FastPath{DType::Float64, false, GemmKernel::None, GemmKernel::None}}) {
    for (const int64_t m :
         {int64_t{0}, int64_t{1}, int64_t{16}, int64_t{17}, int64_t{300}, int64_t{4097}}) {
      for (const int64_t n : {int64_t{4}, int64_t{255}, int64_t{4096}}) {
        for (int layout = 0; layout < 8; ++layout) {
          GemmRequest r = row_major(f.t, m, n, 333 + (layout & 1));
          r.allow_tf32 = f.allow_tf32;
          if (layout & 2) r = transposed_a(r);
          if (layout & 4) r.c_stride0 = 1, r.c_stride1 = m;
          for (const GemmDevice& dev : {kH100, kH100Lanes, kA100, kNoDmma}) {
            const GemmPlan p = plan_gemm(r, dev);
            EXPECT_TRUE(is_rule(p.rule))
                << m << " x " << n << " x " << r.k << ", layout " << layout << ", " << dev.sms
                << " SMs: " << describe(p) << " [" << p.rule << "]";
          }
        }
      }
    }
  }
}

// ---- The tiled kernels' tile order ----

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
