// Torch-free launchers for the cuops CUDA kernels: raw device pointers, int64 sizes, a stream.
// Private to the library (ops/ calls them); the GEMM's are in gemm_plan.h.
// Every launcher enqueues on `stream`, never synchronises, allocates nothing, and returns the launch
// status (cudaGetLastError) for the caller to check.
#pragma once

#include <cstdint>
#include <cuda_runtime_api.h>

namespace cuops::kernels {

enum class DType : int { Float32, Float64, Float16, BFloat16 };

// out[i] = a[i] + b[i], i < n. out may equal a or b (in place); no other overlap.
cudaError_t launch_add(DType dtype, void* out, const void* a, const void* b, int64_t n,
                       cudaStream_t stream);

// out[i] = alpha * x[i]. out may equal x.
cudaError_t launch_scale(DType dtype, void* out, const void* x, double alpha, int64_t n,
                         cudaStream_t stream);

// out[i] = alpha[0] * x[i], alpha a device pointer to one value of the accumulation type (float
// for the half types), computed in it and rounded once. out may equal x (in place with alpha 1
// nothing is written).
cudaError_t launch_scale_by(DType dtype, void* out, const void* x, const void* alpha, int64_t n,
                            cudaStream_t stream);

// out[i] = x[i] * x[i]. out may equal x.
cudaError_t launch_square(DType dtype, void* out, const void* x, int64_t n, cudaStream_t stream);

// Bytes of caller-owned scratch launch_two_norm needs for n elements on a GPU with
// `multiprocessors` SMs (a few KiB). How the sum is split depends on n and the GPU model only, so the
// result bits are the same on every run on that model.
int64_t two_norm_scratch_bytes(int64_t n, int multiprocessors);

// out[0] = sqrt(sum_i (a[i] - b[i])^2) in dtype; `scratch` holds at least two_norm_scratch_bytes
// bytes, 16-byte aligned, with any contents (the launch zeroes what it needs on `stream`). n == 0
// writes 0.
cudaError_t launch_two_norm(DType dtype, void* out, const void* a, const void* b, int64_t n,
                            void* scratch, int64_t scratch_bytes, int multiprocessors,
                            cudaStream_t stream);

// dst[j * ld_dst + i] = src[i * ld + j] for a float32 src [rows, cols] with leading stride ld: dst is
// the [cols, rows] transpose with rows ld_dst >= rows apart. The GEMM's operand copies of float32
// (gemm_plan.h's OperandCopy) where the source's contiguous axis is the copy's strided one.
cudaError_t launch_transpose_f32(const float* src, int64_t rows, int64_t cols, int64_t ld,
                                 float* dst, int64_t ld_dst, cudaStream_t stream);

// RMSNorm over rows of d elements (kernels/norm/rms_norm.cu), float32 math (float64 for float64):
// s = x (+ res, rounded to s's dtype and stored in sum), y = s / sqrt(mean(s^2) + eps) * w, and
// rstd = 1 / sqrt(mean(s^2) + eps) [rows] in the accumulation type where rstd is set. The dtypes
// (RmsNormTypes): x's; s's (res's too: the sum's); w's; y's. rms_norm_supports says which mixes have a
// kernel: one dtype throughout, or a half x with s, w and y each x's type or float32 (s or w float32),
// or float32 x, s and w with a half y (a norm handing the next GEMM its autocast dtype). x, res rows
// ld_x, ld_res apart (unit element stride); y, sum [rows, d] contiguous; w [d].
struct RmsNormTypes {
  DType x, s, w, y;
};
struct RmsNormArgs {
  RmsNormTypes types;
  int64_t rows, d;
  const void* x;
  int64_t ld_x;
  const void* res;  // null: no residual (rms_norm)
  int64_t ld_res;
  const void* w;
  double eps;
  void* y;
  void* sum;
  void* rstd;
};
// The backward: ds = rstd (dy w - s rstd^2 mean(dy w s)) (+ dsum where set) [rows, d] in s's dtype
// where ds is set; the same values rounded on to types.x in dx where dx is set (types.x differs from
// types.s exactly where dx is set: add_rms_norm's x narrower than its sum); and, where dweight is
// set, dweight = the column sums of dy s rstd in w's dtype, added in a fixed order through
// `workspace` (rms_norm_bwd_workspace_bytes, 16-byte aligned). dy [rows, d] in y's dtype, s, dsum,
// ds, dx [rows, d] contiguous. The mixes: one dtype, a half s with a float32 w and a float32 or half
// dy, float32 s and w with a half dy, or float32 s and w with a half dx and dy in dx's type or
// float32 (rms_norm_bwd_supports).
struct RmsNormBwdArgs {
  RmsNormTypes types;
  int64_t rows, d;
  const void* dy;
  const void* s;
  const void* w;
  const void* rstd;
  const void* dsum;
  void* ds;
  void* dx;
  void* dweight;
  void* workspace;
};
// vec: every row (x, res, y, sum; w) 16-byte aligned with d a whole number of
// rms_norm_vector_elems(types, true) elements (16 bytes of x's dtype; the sum's, backward), so rows
// go in vectors of that many elements; otherwise one element at a time (one dtype throughout only). rms_norm_fits: whether rows of d take
// the forward (backward) kernel at all: up to 512 x 4 (512 x 2) vectors, 16384 (8192) bf16 elements.
bool rms_norm_supports(const RmsNormTypes& types, bool vec);
bool rms_norm_bwd_supports(const RmsNormTypes& types, bool vec);
int rms_norm_vector_elems(const RmsNormTypes& types, bool vec);
bool rms_norm_fits(int64_t d, int vector_elems, bool backward);
int64_t rms_norm_bwd_workspace_bytes(const RmsNormTypes& types, int64_t rows, int64_t d, bool vec);
cudaError_t launch_rms_norm_fwd(const RmsNormArgs& args, bool vec, cudaStream_t stream);
cudaError_t launch_rms_norm_bwd(const RmsNormBwdArgs& args, bool vec, cudaStream_t stream);

// Hugging Face's rotary embedding (kernels/elementwise/rotary.cu) over q [B, Hq, T, D] and k [B, Hk, T, D] into
// oq, ok of the same shapes (any strides sb, sh, st of B, H, T; unit element stride; D even), with
// cos and sin [B or 1, T, D] (contiguous rows, trig_sb apart: 0 for one batch row shared):
// forward  o[:D/2] = x[:D/2] c[:D/2] - x[D/2:] s[:D/2],  o[D/2:] = x[D/2:] c[D/2:] + x[:D/2] s[D/2:];
// backward o[:D/2] = x[:D/2] c[:D/2] + x[D/2:] s[D/2:],  o[D/2:] = x[D/2:] c[D/2:] - x[:D/2] s[:D/2],
// in float32 (float64 for float64), rounded once. x: q's and k's dtype (the forward's) or their
// gradients' (the backward's); trig: cos and sin's; out: the outputs'. All one dtype, or float32 cos and
// sin beside one half type: x half with out float32 (the forward under autocast), x float32 with out
// half (its backward, giving q's dtype), or x and out half (either way with the op's dtype set to q's
// half type); rotary_supports says which (each with and without vec). vec: every pointer and stride
// 16-byte aligned and D/2 a multiple of rotary_vector_elems, so elements go 16 bytes at a time.
struct RotaryTensor {
  void* p;
  int64_t sb, sh, st;
};
struct RotaryArgs {
  DType x, trig, out;
  bool backward;
  int64_t batch, heads_q, heads_k, seq, d;
  RotaryTensor q, k, oq, ok;
  const void* cos;
  const void* sin;
  int64_t trig_sb;
};
bool rotary_supports(DType x, DType trig, DType out);
int rotary_vector_elems(DType x, DType trig, DType out);
cudaError_t launch_rotary(const RotaryArgs& args, bool vec, cudaStream_t stream);

// The fused linear ops' activations (kernels/gemm/activation.cuh holds their math).
enum class Activation : int { None, Relu, Gelu, GeluTanh, Silu };

// Bytes of workspace launch_act_bwd needs for dy [rows, n]: a partial column sum per chunk of rows.
int64_t act_bwd_workspace_bytes(DType dtype, int64_t rows, int64_t n);

// The activation's backward and the bias gradient in one pass over dy (row-major [rows, n], leading
// strides ld_dy, ld_pre >= n): dz = dy * act'(pre) into dz (contiguous [rows, n]), computed in the
// accumulation type and rounded once; dbias[c] = sum over rows of dz[:, c] before rounding, in a
// fixed order (deterministic). `workspace`: act_bwd_workspace_bytes bytes, 16-byte aligned.
cudaError_t launch_act_bwd(DType dtype, Activation act, const void* dy, int64_t ld_dy,
                           const void* pre, int64_t ld_pre, int64_t rows, int64_t n, void* dz,
                           void* dbias, void* workspace, cudaStream_t stream);

// The gated MLP's backward in one pass over dy, g, u (row-major [rows, n], leading strides ld_* >= n):
// dg = dy * u * act'(g) and du = dy * act(g), act silu or gelu_tanh (else cudaErrorInvalidValue),
// computed in the accumulation type and rounded once, into dg and du (contiguous [rows, n]).
cudaError_t launch_swiglu_bwd(DType dtype, Activation act, const void* dy, int64_t ld_dy,
                              const void* g, int64_t ld_g, const void* u, int64_t ld_u,
                              int64_t rows, int64_t n, void* dg, void* du, cudaStream_t stream);

// linear_cross_entropy's pass over a chunk of logits [rows, vocab] (row-major, ld apart; 16-byte
// aligned rows), of which the row's target (int64 [rows]) picks one; bias (16-byte aligned, [vocab])
// or null is added to every row. stats: lse[r] = log sum_j e^(logit[r][j]) and, where loss is not
// null, loss[r] = lse[r] - logit[r][target[r]], 0 where target is ignore_index and NaN where it is
// outside [0, vocab). grad: the logits are overwritten by scale_r * (softmax - one-hot) from lse
// (this pass's, or the one given when !stats), scale_r = scale[r * scale_stride], 0 for an ignored
// row, NaN for an out-of-range one. lse, loss, scale: the accumulation type (float for the half types).
// softcap c > 0: each logit z (bias added) is read as c tanh(z / c), its gradient times the cap's
// derivative; 0: none. The same bits on every run; `multiprocessors` sizes the grid.
cudaError_t launch_ce_rows(DType dtype, void* logits, int64_t rows, int64_t vocab, int64_t ld,
                           const void* bias, const int64_t* target, int64_t ignore_index, void* lse,
                           void* loss, const void* scale, int64_t scale_stride, bool stats,
                           bool grad, double softcap, int multiprocessors, cudaStream_t stream);

// The grouped GEMM's general kernels (kernels/gemm/grouped_simt.cu). offs: int32 [groups] end
// offsets on the device, taken as end(e) = min(extent, max(offs[0..e])) (non-decreasing whatever
// they hold: a caller cannot check them without a host sync); group e spans [end(e-1), end(e)),
// end(-1) = 0. groups <= kGroupedMaxGroups; out contiguous; each output sums its group's terms in
// k order (the same bits every run).
constexpr int64_t kGroupedMaxGroups = 8192;

// Groups of rows: out [rows, n] = a[r, :] @ b[e] for the rows r of group e, zeros past the last
// group; a [rows, k] (strides sa0, sa1), b [groups, k, n] (strides sb0, sb1, sb2).
cudaError_t launch_grouped_mm_rows(DType dtype, const void* a, int64_t sa0, int64_t sa1,
                                   const void* b, int64_t sb0, int64_t sb1, int64_t sb2,
                                   const int32_t* offs, int64_t groups, int64_t rows, int64_t k,
                                   int64_t n, void* out, cudaStream_t stream);

// Groups along k: out [groups, m, n], out[e] = a[:, ks] @ b[ks, :] over group e's k range ks (zeros
// for an empty group); a [m, k] (strides sa0, sa1), b [k, n] (strides sb0, sb1).
cudaError_t launch_grouped_mm_k(DType dtype, const void* a, int64_t sa0, int64_t sa1, const void* b,
                                int64_t sb0, int64_t sb1, const int32_t* offs, int64_t groups,
                                int64_t m, int64_t k, int64_t n, void* out, cudaStream_t stream);

// The grouped GEMM on the Hopper kernel (kernels/gemm/gemm_wgmma_grouped.cu, sm_90a; elsewhere
// cudaErrorNotSupported): c [rows, n] (ldc apart) = a [rows, k] (row-major, lda) times group e's
// matrix for the rows of group e, every group starting at a multiple of 128 rows (ends: int32
// [groups] on the device, non-decreasing, within rows); rows from ends[groups - 1] on are zeros.
// b: group e's matrix at b + e * b_group_stride, k-major ([n, k], rows ldb apart: nn.Linear's
// layout) or n-major (b_nmajor: [k, n], rows ldb apart); parts past its n or k read as zeros. b2
// (k-major as b, or null): the dual GEMM, c = silu(a b) * (a b2), and where aux is set a b into aux
// and a b2 into aux2 ([rows, n], ld_aux apart). bfloat16 / float16; pointers 16-byte aligned,
// strides whole 16 bytes (the tensor maps' terms; cudaErrorInvalidValue where they fail).
// along_k (a weight gradient): c [groups m, n] (ldc apart), group e's m rows = a[ks, :]^T b[ks, :]
// over group e's rows ks of a [rows, m] (lda) and b [rows, n] (ldb), zeros for an empty group; m a
// multiple of 128; k, b2 and aux unused.
// packed: torch._grouped_mm's groups, starting anywhere, ends taken as grouped_simt's
// (min(extent, running max)); rows past the last group zeros; no b2 or aux. workspace: int32
// [2 (groups + 1)] on the device, written by the launch (the ends as taken, the tiles' count).
struct GroupedGemm {
  DType dtype;
  int64_t rows, n, k;
  const void* a;
  int64_t lda;
  const void* b;
  int64_t ldb, b_group_stride;
  bool b_nmajor;
  const void* b2;
  void* c;
  int64_t ldc;
  void* aux;
  void* aux2;
  int64_t ld_aux;
  const int32_t* ends;
  int64_t groups;
  bool along_k = false;
  int64_t m = 0;
  int bn = 256;  // the tile's columns (plan_grouped's: 128 or 256; the dual GEMM 256)
  bool packed = false;
  int32_t* workspace = nullptr;
};
cudaError_t launch_grouped_wgmma(const GroupedGemm& g, int sms, cudaStream_t stream);

// The MoE decode products on the small-M streaming kernel (kernels/gemm/gemm_skinny_tma.cu; sm_90
// with GemmDevice::skinny_tma, else cudaErrorInvalidValue): for each slot a < slots_n whose expert
// e = slots[a] (int32 on the device) is not -1, out's rows [a mt, (a + 1) mt) = x's same rows times
// w[e]^T, w [experts, n, k] k-contiguous (rows ldw apart, matrices w_group_stride apart: nn.Linear's
// layout, Hugging Face's down_proj); w2 (same layout) or null: the dual product, out = silu(x w^T) *
// (x w2^T), x w^T into aux and x w2^T into aux2 where set (ld_aux apart). A slot of no expert leaves
// its rows unwritten. mt 8 or 16; bfloat16 / float16; TMA's terms as GroupedGemm's.
struct GroupedSkinny {
  DType dtype;
  int mt;
  int64_t slots_n, n, k, experts;
  const int32_t* slots;
  const void* x;
  int64_t ldx;
  const void* w;
  const void* w2;
  int64_t ldw, w_group_stride;
  void* out;
  int64_t ldo;
  void* aux;
  void* aux2;
  int64_t ld_aux;
};
cudaError_t launch_grouped_skinny(const GroupedSkinny& g, int sms, cudaStream_t stream);

// A mixture of experts' weighted sum back to token order (kernels/moe/combine.cu): out [tokens, h]
// (contiguous) row t = sum over j < k, in order, of w[t k + j] * y[rows[t k + j]] (y's rows ldy
// apart; rows [tokens k], int64 where rows64, else int32, each within y or negative: no term), in
// the accumulation type (float, double for float64), rounded once to y's dtype; w in the
// accumulation type where w_acc, else in y's dtype; null: ones.
cudaError_t launch_moe_combine(DType dtype, const void* y, int64_t ldy, const void* rows,
                               bool rows64, const void* w, bool w_acc, int64_t tokens, int64_t k,
                               int64_t h, void* out, cudaStream_t stream);
// The MoE decode step's routing (kernels/moe/decode_route.cu says how): tokens x k pairs (idx int64
// where idx64, else int32; at most kDecodeMaxPairs) into slots of mt (8 or 16) rows: slots int32
// [slots_n] (slots_n >= min(E, pairs) + pairs / mt covers any indices), rows int32 [pairs] (an
// expert outside [0, E): -1, no row), xg
// [slots_n mt, h] (rows h apart) x's rows gathered, zeros elsewhere. x [tokens, h] rows ldx apart;
// h and ldx whole 16 bytes, x and xg 16-byte aligned.
constexpr int64_t kDecodeMaxPairs = 256;

cudaError_t launch_moe_decode_route(const void* idx, bool idx64, int64_t tokens, int64_t k,
                                    int64_t experts, const void* x, int64_t ldx, int64_t h,
                                    int64_t elem, int mt, int64_t slots_n, int32_t* slots,
                                    int32_t* rows, void* xg, int sms, cudaStream_t stream);

// The MoE experts' backward between its products (kernels/moe/gated_bwd.cu), a block a row of the
// layout: gu [rows, 2i] = [g | u] (contiguous), dh1 [rows, i] (h's gradient before the row's routing
// weight; null: dgu and dwr are not wanted), wr [rows] the routing weights (accumulation type). With
// a = act(g) (silu or gelu_tanh) and h = a u rounded to the dtype (as the forward stored it):
// dgu = [dh1 wr u act'(g) | dh1 wr a], hw = h wr (the down weight's gradient's operand), dwr[r] =
// sum over columns of dh1 h (the routing weight's gradient; a fixed order), each output skipped
// where null. Computed in the accumulation type, each rounded once.
cudaError_t launch_moe_gated_bwd(DType dtype, Activation act, const void* gu, const void* dh1,
                                 const void* wr, int64_t rows, int64_t inter, void* dgu, void* hw,
                                 void* dwr, cudaStream_t stream);

}  // namespace cuops::kernels
