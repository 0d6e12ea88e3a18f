// The GEMM planner: which kernel runs a product, with which tile and grid, and which operand copies
// pay. A plain function of the problem and the device (host code, no CUDA calls), so the rules are
// written once, unit-tested on the CPU (tests/cpp/test_gemm_plan.cpp), and obeyed by everyone:
// ops/gemm.cpp makes the copies a plan asks for, launch_gemm runs the kernel it names, and the
// sweeps in bench/sweep override a plan's tile or grid to time other choices (gemm_plan_hooks.h).
// Why each rule is what it is: the table at the top of kernels/gemm/gemm_plan.cpp.
#pragma once

#include <cstdint>
#include <variant>

#include "kernels/kernels.h"

namespace cuops::kernels {

// A strided 2-D matrix: element (i, j) at ptr[i * stride0 + j * stride1] (strides in elements).
struct GemmOperand {
  const void* ptr;
  int64_t stride0, stride1;
};

// A fused epilogue: what the product becomes before it is stored (kernels/gemm/epilogue.cuh).
// BiasActivation: c = act(alpha * a @ b + bias), the pre-activation kept in aux where it is set.
// Gated (the gated MLP's dual GEMM): c = act(a @ b) * (a @ b2), act silu (SwiGLU) or gelu_tanh
// (GeGLU), b2 [k, n] strided as b; the two products kept in aux and aux2 where they are set.
// aux, aux2: [m, n] row-major, ld_aux apart.
enum class GemmEpilogue : int { Plain, BiasActivation, Gated };
struct GemmFusion {
  GemmEpilogue kind = GemmEpilogue::Plain;
  const void* bias = nullptr;
  Activation act = Activation::None;
  const void* b2 = nullptr;
  void* aux = nullptr;
  void* aux2 = nullptr;
  int64_t ld_aux = 0;
};

// c = alpha * a @ b + beta * c with a [m, k], b [k, n], c [m, n] (c must not overlap a, b or
// itself; the ops check that). beta == 0 never reads c. allow_tf32 (float32 only): torch's
// "high"/"medium" float32 matmul precision. `fusion`: the epilogue (Plain: alpha and beta only).
struct GemmRequest {
  DType dtype;
  int64_t m, n, k;
  GemmOperand a, b;
  void* c;
  int64_t c_stride0, c_stride1;
  double alpha, beta;
  bool allow_tf32;
  GemmFusion fusion = {};
};

// What the planner needs to know of the GPU: its SM count; whether this library's sm_90a wgmma
// kernel runs there (compute capability 9.0, the image loads, the driver has the tensor-map
// encoder, CUOPS_DISABLE_WGMMA unset); and how many clusters of two of it fit at once (a pair needs
// two free SMs of one GPC, so this can be below sms / 2).
struct GemmDevice {
  int sms = 0;
  bool wgmma = false;
  int pair_clusters = 0;
  // Whether the small-M kernel can split k over a cluster of CTAs that reduce through distributed
  // shared memory (compute capability 9.0 and up, and this build's code for it compiled for sm_90).
  bool clusters = false;
  // Whether the small-M kernel's streaming form runs: the sm_90 code above and the driver's
  // tensor-map encoder (the weight and x arrive by TMA).
  bool skinny_tma = false;
  // Whether the float64 kernel runs: FP64 tensor cores (DMMA, compute capability 8.0 and up) and
  // this build's code for them.
  bool dmma = false;
  // Whether its 128 x 128 tile's 216 KB ring fits a block's shared memory (H100; an A100's 163 KB
  // runs the 64 x 64 and 16 x 128 tiles).
  bool dmma_wide = false;
};

enum class GemmKernel : int {
  None,     // m or n is 0: nothing to write
  General,  // gemm.cu: any strides, any dtype, no tensor cores
  Simt,     // gemm_simt.cu: float32, true FP32
  MmaTf32,  // gemm_tf32.cu: float32 as TF32, mma.sync
  MmaHalf,  // gemm_half.cu: bfloat16 / float16, mma.sync
  Wgmma,    // gemm_wgmma.cu: sm_90a TMA + wgmma, bfloat16 / float16 and TF32
  Skinny,   // gemm_skinny*.cu: <= kSkinnyMaxTokens rows (tokens) against a streamed weight
  MmaF64,   // gemm_f64.cu: float64 on the FP64 tensor cores, mma.sync
};

// The small-M kernel (gemm_skinny.cuh) computes out[t][o] = sum_k x[t][k] w(o, k) for up to
// kSkinnyMaxTokens tokens t. Its blocks are kSkinnyWarps warps; each warp owns `outputs`
// consecutive outputs o over a slice of k, walked `chunk` at a time: the geometry of each of its
// four forms (bf16/fp16 on tensor cores, float32 on FP32 cores; the weight k-contiguous or
// o-contiguous).
constexpr int kSkinnyMaxTokens = 16;
constexpr int kSkinnyWarps = 4;
struct SkinnyGeometry {
  int outputs, chunk;
};
constexpr SkinnyGeometry kSkinnyHalfK{16, 32}, kSkinnyHalfN{64, 16}, kSkinnyFloatK{4, 128},
    kSkinnyFloatN{128, 4};
// Its streaming form (every float type on sm_90; float64's only form): a producer warp beside the
// kSkinnyWarps brings the weight's [outputs x chunk] tile and x's [tokens x chunk] by TMA into a
// ring of kSkinnyTmaStages stages per CTA; each of the other warps multiplies 16 of the CTA's
// outputs. A stage holds kSkinnyTma.chunk k where the outputs' groups of 64 fill more than half the
// SMs (two CTAs fit per SM), kSkinnyTmaDeepChunk where fewer (one CTA per SM, twice the bytes in
// flight each); counts of 16-bit elements, float32 and float64 stages hold the same bytes.
constexpr SkinnyGeometry kSkinnyTma{64, 128};
constexpr int kSkinnyTmaStages = 4, kSkinnyTmaDeepChunk = 256;
const char* kernel_name(GemmKernel k);

// A copy the caller makes before launching: the operand's values in a fresh buffer of `rows` rows
// of `cols` elements, `ld` apart (a whole number of 16 bytes), read row-major, or column-major (the
// buffer holds the operand's transpose). `via`: the caller's strided copy, or, where the source's
// contiguous axis is the copy's strided one in float32, cuops' transpose kernel (torch's
// transposing copy ran at ~0.9 TB/s on the H100, a third of the bus).
enum class CopyLayout : int { None, RowMajor, ColumnMajor };
enum class CopyVia : int { Strided, Transpose };
struct OperandCopy {
  CopyLayout layout = CopyLayout::None;
  CopyVia via = CopyVia::Strided;
  int64_t rows = 0, cols = 0, ld = 0;
};

// The parameters of each kernel family, the plan's `params`.
// The tiled kernels (general, SIMT, mma.sync, float64): block tile bm x bn (bk: the SIMT kernel's
// k-slice), a grid of one CTA per tile; k split into split_k CTAs (SIMT, float64: grid y), each
// writing its partial tile to a plane of the workspace (split_planes_bytes), a second kernel adding
// the planes in order.
struct TiledParams {
  int bm = 0, bn = 0, bk = 0;
  int split_k = 1;
};
// The sm_90a wgmma kernel: block tile bm x bn, clusters of cluster_m CTAs along m (B multicast);
// c_trans: TF32 with a row-major B computes C^T = B^T A^T and stores it transposed; tma_store: the
// 16-bit outputs leave by TMA store; pdl: launched as a programmatic dependent. The split tail
// (cluster_m 1): the last tail_units tiles of the persistent walk (a partial last wave) are each
// cut into tail_split runs of k-tiles, one CTA each, every CTA resident at once (grid <= SMs). A
// tile's later runs leave their partial sums in the workspace (tail_workspace_bytes: zeroed flags,
// then one bm x bn float tile per CTA); its first run waits for them and adds them in run order
// (the same bits on every run) before its epilogue.
struct WgmmaParams {
  int bm = 0, bn = 0, cluster_m = 1;
  bool c_trans = false, tma_store = false, pdl = true;
  int64_t tail_units = 0;
  int tail_split = 1;
};
// The small-M kernel: whether the tokens are C's rows (x = A, the weight B) or its columns (x =
// B^T, the weight A^T); whether the weight is k-contiguous; the token tile (4, 8 or 16); a block's
// warps along the outputs (rw) and along k (kw); CTAs per cluster along k (split, the grid's y);
// the k each warp reduces (slice, a multiple of the geometry's chunk). The streaming form (tma; rw
// = kSkinnyWarps, kw = 1: its warps split the outputs, not k): ring stages and the k of one stage
// (chunk, a multiple of 64: 128-byte swizzled boxes); pdl: launched as a programmatic dependent
// (its prologue overlaps the previous kernel's tail). bm x bn: the outputs a block covers, for
// logs.
struct SkinnyParams {
  bool tokens_m = true, w_kmajor = true;
  int mt = 0, rw = 0, kw = 0, split = 1;
  int64_t slice = 0;
  bool tma = false, pdl = false;
  int stages = 0, chunk = 0;
  int bm = 0, bn = 0;
};

struct GemmPlan {
  GemmRequest req;
  GemmKernel kernel = GemmKernel::General;
  // The copies the caller makes first (planned in the same pass: the rest of the plan is made for
  // the copied layouts), and the operands the kernel reads: the request's, or the copies (whose
  // pointers the caller sets once it has made them: launch_gemm refuses a copy without one).
  OperandCopy copy_a, copy_b;
  GemmOperand a, b;
  // The problem the fast kernels compute (gemm_problem.h's GemmProblem): C row-major, so a
  // column-major c is the transposed product c^T = b^T a^T (swap_ab); A k-major or m-major, B
  // n-major or k-major.
  bool swap_ab = false;
  bool a_kmajor = false, b_nmajor = false;
  int64_t m = 0, n = 0, lda = 0, ldb = 0, ldc = 0;
  // The grid in blocks (a persistent kernel's is below its tile count), and the device memory the
  // launch needs beside its output (a k split's planes, the split tail's partial tiles).
  int64_t grid = 0;
  int64_t workspace_bytes = 0;
  std::variant<std::monostate, TiledParams, WgmmaParams, SkinnyParams> params;
  // The row of the table at the top of gemm_plan.cpp that chose the kernel (its name there: the
  // planner's tests and the sweeps' logs cite it).
  const char* rule = "";
  // A fused request (req.fusion not Plain): whether its epilogue runs in the kernel. Where it does
  // not (FusedEpilogueApart), launch_gemm refuses the plan and the op runs the product and the
  // epilogue apart.
  bool fused = false;

  // The kernel family's parameters (std::bad_variant_access where the plan is another family's).
  const TiledParams& tiled() const { return std::get<TiledParams>(params); }
  const WgmmaParams& wgmma() const { return std::get<WgmmaParams>(params); }
  const SkinnyParams& skinny() const { return std::get<SkinnyParams>(params); }
  TiledParams& tiled() { return std::get<TiledParams>(params); }
  WgmmaParams& wgmma() { return std::get<WgmmaParams>(params); }
  SkinnyParams& skinny() { return std::get<SkinnyParams>(params); }
};

// The plan for `req` on `dev`, in one pass: where it copies an operand, the rest is planned for
// the copy.
GemmPlan plan_gemm(const GemmRequest& req, const GemmDevice& dev);

// The split tail's workspace on a grid of `grid` CTAs with tiles of bm x bn: a flag per CTA
// (rounded up to 256 bytes), then a bm x bn float32 partial tile per CTA. One home for the
// planner's size and the launcher's layout.
inline int64_t tail_flag_bytes(int64_t grid) { return (grid * 4 + 255) / 256 * 256; }
inline int64_t tail_workspace_bytes(int64_t grid, int64_t bm, int64_t bn) {
  return tail_flag_bytes(grid) + grid * bm * bn * 4;
}

// The workspace of a k split on independent CTAs (the SIMT and float64 kernels): split_k planes of
// m x n partial sums of `elem` bytes (4: float32, 8: float64).
inline int64_t split_planes_bytes(int64_t m, int64_t n, int64_t split, int64_t elem) {
  return split > 1 ? split * m * n * elem : 0;
}

// The grouped GEMM over ops/moe.cpp's row layout (every group from a multiple of 128 rows) or
// torch._grouped_mm's packed groups (cuops.grouped_mm): which kernel and tile (plan_grouped; the
// rules' rows close the table in gemm_plan.cpp). Rows form:
// c [rows, n] = a [rows, k] times group e's [n, k] (b k-major) or [k, n] matrix, dual: the gate/up
// product with silu; along_k: the weight gradients, c [groups m, n]. aligned: every operand's rows
// and matrices a whole 16 bytes apart and its base 16-byte aligned (TMA's terms).
struct GroupedRequest {
  DType dtype;
  int64_t n, k, m;
  bool along_k, dual, b_nmajor, aligned;
};
struct GroupedPlan {
  bool wgmma = false;  // gemm_wgmma_grouped.cu; else grouped_simt.cu
  int bn = 0;          // the wgmma tile's columns (its rows: 128)
  const char* rule = "";
};
GroupedPlan plan_grouped(const GroupedRequest& r, const GemmDevice& d);

// The current device's GemmDevice (settled once per device).
GemmDevice current_gemm_device();

// Runs a plan whose copies are made (the caller's stream; nothing allocated, no synchronisation). A
// plan with workspace_bytes > 0 needs `workspace`: that many bytes of device memory, 16-byte
// aligned, on the plan's device, not in use by other work on other streams (ops/gemm.cpp takes it
// from torch's allocator on the op's stream); its flags are zeroed here, on `stream`, before the
// kernel. cudaErrorInvalidValue for a plan no kernel instance takes (a tile a sweep asked for that
// is not compiled, a copy without its pointer, a missing workspace).
cudaError_t launch_gemm(const GemmPlan& plan, cudaStream_t stream, void* workspace = nullptr);

}  // namespace cuops::kernels
