// The GEMM planner (gemm_plan.h). Each rule, in the order plan_gemm applies them, and why; the rule
// names the planner's CPU tests (tests/cpp/test_gemm_plan.cpp: TEST(GemmRule, <rule>)) and a plan's
// `rule`. Figures are H100 measurements; docs/performance.md has them with the commands that
// reproduce them.
//
// | rule                      | when, and the plan                | why (H100)                    |
// |---------------------------|-----------------------------------|-------------------------------|
// | EmptyOutput               | m or n is 0: nothing runs         | no element of c to write      |
// | Float64WithoutDmma        | float64 without FP64 tensor cores | DMMA is sm_80's; the general  |
// |                           |   (before sm_80;                  |   kernel is correct on every  |
// |                           |   GemmDevice::dmma): general      |   GPU                         |
// | OutputNotRowOrColumnMajor | c neither row- nor column-major:  | the fast epilogues write      |
// |                           |   general                         |   pairs along c's rows        |
// | OutputMisaligned          | c's base not a multiple of its    | the fast epilogues store      |
// |                           |   element size (a byte offset     |   pairs and 16-byte boxes at  |
// |                           |   into storage): general          |   their alignment; the        |
// |                           |                                   |   general kernel one element  |
// |                           |                                   |   at a time                   |
// | CopyOperand               | an operand not readable in place  | copying b costs ~500 / m of   |
// |                           |   (no unit stride, rows not a     |   the product's time (a: 500  |
// |                           |   whole number of 16 bytes apart, |   / n); the fallback is >= 4x |
// |                           |   or its base not 16-byte         |   slower (portable TF32) to   |
// |                           |   aligned) and c's other side >=  |   ~50x (general); torch's     |
// |                           |   256: copy it into padded rows   |   transposing copy ran at 0.9 |
// |                           |   (float32 with the contiguous    |   TB/s                        |
// |                           |   axis across: cuops' transpose   |                               |
// |                           |   kernel)                         |                               |
// | CopyForTf32Wgmma          | TF32 on a wgmma device, c         | TF32 wgmma reads B only       |
// |                           |   row-major, a m-major and b      |   k-major and this layout has |
// |                           |   n-major: copy the smaller of a  |   no transposed form that     |
// |                           |   and b k-major (>= 256 on the    |   avoids it                   |
// |                           |   other side, as above)           |                               |
// | ColumnMajorOutput         | c column-major: the product c^T = | one storage order for the     |
// |                           |   b^T a^T                         |   fast kernels                |
// | OperandNotReadable        | an operand still not readable in  | the general kernel reads any  |
// |                           |   place (too small a product to   |   strides                     |
// |                           |   pay its copy): general          |                               |
// | FusedEpilogueApart        | a fused request (bias and         | the fused epilogues ride the  |
// |                           |   activation; the dual GEMM) not  |   wgmma kernel's TMA stores   |
// |                           |   16-bit on a wgmma device, x not |   or the small-M streaming    |
// |                           |   k-major or a weight not [n, k]  |   form's, and read            |
// |                           |   row-major in place, beta != 0,  |   nn.Linear's layout          |
// |                           |   aux / b2 not 16-byte aligned    |                               |
// |                           |   (> 16 rows), or <= 16 rows the  |                               |
// |                           |   streaming form does not take:   |                               |
// |                           |   no plan; the op runs the        |                               |
// |                           |   product and the epilogue apart  |                               |
// | SmallMFused               | a fused request of <= 16 rows:    | one launch where the product  |
// |                           |   the small-M streaming form      |   and a pass made two; the    |
// |                           |   (SmallMStream's rows; the dual  |   weights' stream sets the    |
// |                           |   GEMM as the 2n-wide product,    |   time, the epilogue is a few |
// |                           |   32 outputs of each weight a     |   hundred elements a CTA      |
// |                           |   CTA), the epilogue in its       |                               |
// |                           |   stores                          |                               |
// | FusedEpilogue             | a fused request elsewhere: the    | the epilogue costs the        |
// |                           |   wgmma plan of its product (the  |   product's time where it is  |
// |                           |   rows below; the dual GEMM's as  |   done (docs/performance.md,  |
// |                           |   the 2n-wide product, tiles >=   |   "fused epilogues"), so the  |
// |                           |   128 wide hold bn / 2 outputs of |   product's tile choice holds |
// |                           |   each weight), with TMA stores   |                               |
// | SmallM                    | c's short side <= 16 (tokens),    | bound by the weight's bytes:  |
// |                           |   that side's operand             |   128-row tiles ran 1 x 4096  |
// |                           |   k-contiguous: the small-M       |   x 14336 bf16 at 0.43 of     |
// |                           |   kernel (gemm_skinny*.cu), k     |   copy against 0.81; ~16      |
// |                           |   split over a block's 4 warps,   |   warps an SM keep the bus    |
// |                           |   then a cluster's CTAs (<= 4     |   busy; 4 warps over outputs  |
// |                           |   16-bit, <= 8 float32)           |   or 8 CTAs of 16-bit ran     |
// |                           |                                   |   slower                      |
// | SmallMStream              | sm_90 (GemmDevice::skinny_tma),   | per-lane loads held ~32 KB an |
// |                           |   TMA describes the weight and x: |   SM in flight (0.63 of copy  |
// |                           |   the streaming form, a TMA ring  |   at 4096 x 14336); the ring  |
// |                           |   of 4 stages of 64 outputs x 128 |   72-160 KB: 0.87-1.00 of     |
// |                           |   k (16-bit), a producer warp, 4  |   copy, level with cuBLAS or  |
// |                           |   warps of mma.sync               |   ahead; float32 'highest' at |
// |                           |   (bf16/fp16/TF32) or FP32 FMAs;  |   M >= 8: 0.52-0.67 per lane, |
// |                           |   a programmatic dependent launch |   0.75-1.02 streamed          |
// | SmallMFloat32Lanes        | float32 'highest', <= 4 tokens,   | 3-5 % faster there (0.99 of   |
// |                           |   k-contiguous weight, groups of  |   copy against 0.95 at 1 x    |
// |                           |   64 outputs > SMs / 2: the       |   4096 x 28672): 8-token FMA  |
// |                           |   per-lane form                   |   tiles mostly pad            |
// | SmallMStreamDeep          | streaming, groups of 64 outputs   | bytes in flight set the pace, |
// |                           |   <= SMs / 2 (FP32 FMAs: <= SMs): |   not CTAs; clusters cost (4  |
// |                           |   stages of 256 k (one CTA an     |   CTAs slower everywhere);    |
// |                           |   SM), k split over a cluster up  |   short slices only fill the  |
// |                           |   to SMs / 2 CTAs (FMAs: all      |   ring; FP32 FMAs at 16       |
// |                           |   SMs), >= 8 stages each          |   tokens bind the SM:         |
// |                           |                                   |   0.55-0.65 of copy on half,  |
// |                           |                                   |   0.75-0.99 on all            |
// | SmallMFloat64             | float64 small-M (the stream only: | its weight is 2-4x the bytes: |
// |                           |   no per-lane form; elsewhere the |   one CTA an SM ran 2-9 %     |
// |                           |   tiled kernel's 16-row tile):    |   faster than two; 12 deep    |
// |                           |   deep stages, except <= 16       |   CTAs left gpt-2's           |
// |                           |   groups of outputs: half the k a |   768-output products at      |
// |                           |   stage, k split over 8 CTAs (>=  |   0.60-0.96x cuBLAS, split 8  |
// |                           |   3 stages each)                  |   ran 0.90-1.31x              |
// | Float64Tiles              | float64 elsewhere: DMMA tiles 128 | the FP64 pipe sets the pace:  |
// |                           |   x 128, 128 x 64, 64 x 64, 32 x  |   the busiest SM's waves of   |
// |                           |   64, 32 x 32 (<= 128 rows) or 16 |   CTAs, each its slice of k   |
// |                           |   x 128, k whole or split into    |   at the tile's rate, plus    |
// |                           |   2-4, 6 or 8 CTAs (16 x 128:     |   fill and epilogue and a     |
// |                           |   2-16) whose planes are summed   |   split's sum; fitted to a    |
// |                           |   in order: the least busiest-SM  |   sweep of every tile x split |
// |                           |   work (plan_f64)                 |   (performance.md)            |
// | Wgmma                     | bf16/fp16, or TF32, on a wgmma    | TMA + wgmma ~3x the mma.sync  |
// |                           |   device; sizes < 2^31; TMA       |   kernels: 1.02x cuBLAS at    |
// |                           |   describes the operands: wgmma   |   8192^3 (bf16, fp16),        |
// |                           |   (TF32 with b n-major: the       |   0.95-0.99x TF32             |
// |                           |   transposed problem, B^T from    |                               |
// |                           |   registers)                      |                               |
// | WgmmaTile                 | 128 x 256 (pairs along m when >=  | one model for every shape: a  |
// |                           |   2 tile rows; pairs multicast    |   partial last wave of wide   |
// |                           |   B), 128 x 128 or 128 x 64: the  |   tiles cost 1024 x 6144 x    |
// |                           |   least (bn + col) x (waves x k + |   4096 0.82x where 128 x 128  |
// |                           |   fixed)                          |   ran 0.97x; col and fixed    |
// |                           |                                   |   fitted on the bf16 suite    |
// |                           |                                   |   (performance.md)            |
// | WgmmaTall                 | 16-bit, one wave of 192 x 128     | cuBLAS's tile for the c_attn  |
// |                           |   tiles costs less than the       |   weight gradient 3072 x 1024 |
// |                           |   128-row plans: 192 x 128 (three |   x 8192: 0.85x ->            |
// |                           |   consumer warpgroups), single    |   0.99-1.23x; gpt-2 dW over   |
// |                           |   CTAs                            |   1-4k tokens 0.73 -> 0.90x   |
// | WgmmaTailSplit            | a partial last wave over a long   | gpt-2 768-wide weight         |
// |                           |   k: the full waves, then the     |   gradients 0.69x -> 0.94x,   |
// |                           |   last wave's tiles each cut into |   falcon 1024 x 4544 x 18176  |
// |                           |   runs of k over the SMs it       |   0.76x -> 1.00x; a fixed     |
// |                           |   leaves idle (single CTAs;       |   cost (memset, wait) loses   |
// |                           |   partials added in run order)    |   on short k                  |
// | WgmmaGrid                 | the fewest CTAs (clusters) that   | every wave full: under the    |
// |                           |   finish in as many waves as the  |   power cap the idle SMs'     |
// |                           |   most that fit                   |   share goes to the others'   |
// |                           |                                   |   clock (0-1 %)               |
// | WgmmaTmaStore             | 16-bit c, beta = 0, TMA describes | direct stores cost 10-13 % at |
// |                           |   c: the output by TMA store;     |   4096^3-8192^3; beta = 1's   |
// |                           |   beta = 1: by TMA's reduce-add   |   loads of c, 0.65x the       |
// |                           |   (in L2: c + the rounded         |   product's time at 128256 x  |
// |                           |   product, rounded)               |   2048 x 1920 (a weight       |
// |                           |                                   |   gradient summed over chunks |
// |                           |                                   |   of tokens)                  |
// | WgmmaDependentLaunch      | a programmatic dependent launch,  | the prologue overlaps the     |
// |                           |   except after the split tail's   |   previous kernel's tail; the |
// |                           |   memset                          |   tail's flags must be zero   |
// |                           |                                   |   before a run arrives        |
// | MmaHalf                   | bf16/fp16 elsewhere: mma.sync 128 | two blocks an SM: about two   |
// |                           |   x 128 from 264 tiles, else 64 x |   waves from 264              |
// |                           |   128                             |                               |
// | MmaTf32                   | TF32 elsewhere: mma.sync 128 x    | 64 x 128 keeps two blocks an  |
// |                           |   128 from 512 tiles, else 64 x   |   SM in 128 registers         |
// |                           |   128                             |                               |
// | SimtLeadingStrideZero     | float32 'highest', a m-major of   | the SIMT loop counts its      |
// |                           |   leading stride 0, k > 1:        |   slices by A's pointer       |
// |                           |   general                         |                               |
// | Simt                      | float32 'highest': SIMT 128 x 128 | a cluster split packed        |
// |                           |   or 64 x 64, k split into 1-16   |   clusters of 4 two to an SM: |
// |                           |   CTAs writing partial planes     |   128 rows at 0.56-0.61x      |
// |                           |   (summed in order): the least    |   where an even spread ran    |
// |                           |   busiest-SM time (plan_simt)     |   0.74-0.78x; cost fitted to  |
// |                           |                                   |   the sweep (0.996x the best  |
// |                           |                                   |   pick)                       |
//
// plan_grouped's rules (the grouped GEMM over ops/moe.cpp's row layout or torch's packed
// groups), in its order:
//
// | rule                      | when, and the plan                | why                           |
// |---------------------------|-----------------------------------|-------------------------------|
// | GroupedGeneral            | not 16-bit, no wgmma device, an   | the grouped wgmma kernel      |
// |                           |   operand not TMA-readable (rows  |   reads by TMA and stores     |
// |                           |   or matrices not whole 16 bytes  |   whole 128-row tiles, so a   |
// |                           |   apart, bases not 16-byte        |   weight gradient's group     |
// |                           |   aligned), or along k with m not |   must fill its c tiles       |
// |                           |   a multiple of 128:              |                               |
// |                           |   grouped_simt.cu                 |                               |
// | GroupedWgmma              | elsewhere: gemm_wgmma_grouped.cu, | the dense kernel's widest     |
// |                           |   128 x 256 for the dual GEMM     |   single-CTA tile where a     |
// |                           |   (128 outputs of each weight)    |   product is at least that    |
// |                           |   and n >= 256, else 128 x 128    |   wide; on the H200 486-643   |
// |                           |                                   |   TFLOPS over the MoE bench's |
// |                           |                                   |   30 products, 1.011x torch.  |
// |                           |                                   |   _grouped_mm (tile not swept)|

#include "gemm_plan.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <string>

#include "gemm_plan_hooks.h"

namespace cuops::kernels {
namespace {

constexpr int64_t kWgmmaBM = 128;  // kernels/gemm/gemm_wgmma.cu's block rows: two consumers of 64
// Its tall tile, 192 x 128 (three consumers; 16-bit types): the work a tile does per k in the units
// of plan_wgmma's cost (128 x bn tiles: bn + col), and its fixed cost in k. 240: 128 x 128's rate
// per output (160 for 16384), which fits the bf16 suite swept with the tile (every product, all
// widths, L2 flushed; docs/performance.md, "wgmma tile choice"): 0.957 -> 0.964x cuBLAS for the
// best pick, the gain all in weight gradients that one wave of tall tiles covers (gpt-2 768 x 3072
// over 1024-4096 tokens 0.73-0.79 -> 0.90x). 208 (the rate its operand rows a output predicted)
// sent 1024-k products there too, where 128 x 128 ran 5-10 % faster. Its fixed cost is 128 x 128's
// (512 k).
constexpr int64_t kWgTallBM = 192, kWgTallBN = 128, kWgTallWork = 240, kWgTallFixedK = 512;
// No k split over a cluster: an instance that split a tile's k over 2-8 CTAs and summed their
// partial tiles over DSMEM lost to the best unsplit tile on every shape tried, by 3-30 % (each CTA
// ~10 us more than its k; only 30 clusters of 4 fit), and was removed (docs/performance.md, "What
// was tried and lost"). The split tail below covers the shapes it was for. The split tail
// (GemmPlan::tail_units): what it costs beyond a run's k, in 16-bit k (TF32 counts half as many,
// each of its k taking twice the time): the workspace's flags zeroed (a memset before the kernel,
// which also waits for the kernel before it) and the wait, and per run past the first a 128 x bn
// float partial written to L2 and read back by the tile's first run. Fitted to every width's tail
// on the 121 bf16 and 67 TF32 suite products (docs/performance.md, "split tail"): the picks run
// 0.961x cuBLAS (bf16, geomean) and 1.021x (TF32), where the data-parallel tiles alone picked
// 0.944x and 0.969x; the best of every plan measured 0.967x and 1.034x.
constexpr int64_t kWgTailFixK = 2048, kWgTailPerRunK = 128, kWgMaxTailSplit = 16;

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t element_size(DType t) { return t == DType::Float64 ? 8 : t == DType::Float32 ? 4 : 2; }

bool aligned(const void* p, uintptr_t to) { return reinterpret_cast<uintptr_t>(p) % to == 0; }

// A [rows, cols] view read as row-major (element (i, j) at i * ld + j, ld a multiple of `unit`):
// unit column stride, or at most one column; a view of at most one row has no leading stride (0).
bool row_major(int64_t rows, int64_t cols, int64_t s0, int64_t s1, int64_t unit, int64_t& ld) {
  if (s1 != 1 && cols > 1) return false;
  ld = rows <= 1 ? 0 : s0;
  return ld % unit == 0;
}

// What the fast kernels read in place: row-major with rows a whole number of 16 bytes apart, from a
// 16-byte aligned base (every 16-byte chunk along the contiguous axis is then an aligned load).
bool readable(int64_t rows, int64_t cols, int64_t s0, int64_t s1, const void* ptr, int64_t unit) {
  int64_t ld = 0;
  return row_major(rows, cols, s0, s1, unit, ld) && aligned(ptr, 16);
}

// Whether TMA can describe a row-major [outer, inner] operand with leading stride ld (what
// gemm_wgmma.cu's make_map checks before asking the driver): a one-row view gets a valid stride
// there; otherwise rows must not overlap (an expanded view's stride 0 is refused) and its 32-bit
// coordinates must reach every element.
bool tma_describes(int64_t inner, int64_t outer, int64_t ld) {
  return (outer == 1 || ld >= inner) && inner <= INT32_MAX && outer <= INT32_MAX;
}

// The general kernel reads the request's operands through their strides (never a copy).
GemmPlan& general(GemmPlan& p, const char* rule) {
  p.kernel = GemmKernel::General;
  p.copy_a = p.copy_b = OperandCopy{};
  p.a = p.req.a, p.b = p.req.b;
  p.params = TiledParams{64, 64, 0, 1};
  p.grid = cdiv(p.req.m, 64) * cdiv(p.req.n, 64);
  p.workspace_bytes = 0;
  p.rule = rule;
  return p;
}

// The copy of a [rows, cols] operand as `layout` asks, and the operand the kernel then reads (its
// pointer set by the caller once the copy is made). Row-major: [rows, cols] in padded rows;
// column-major: the row-major copy of the transpose, read transposed. Through cuops' transpose
// kernel where the source's contiguous axis is the copy's strided one (float32; CopyOperand's row).
OperandCopy copy_of(const GemmOperand& t, int64_t rows, int64_t cols, CopyLayout layout,
                    DType dtype, GemmOperand& read) {
  const int64_t unit = 16 / element_size(dtype);
  const bool col = layout == CopyLayout::ColumnMajor;
  // The source as the copy's rows see it: t, or t^T.
  const int64_t src_rows = col ? cols : rows, src_cols = col ? rows : cols;
  const int64_t s0 = col ? t.stride1 : t.stride0, s1 = col ? t.stride0 : t.stride1;
  OperandCopy c;
  c.layout = layout;
  c.rows = src_rows, c.cols = src_cols, c.ld = cdiv(src_cols, unit) * unit;
  c.via =
      dtype == DType::Float32 && s0 == 1 && s1 >= src_rows ? CopyVia::Transpose : CopyVia::Strided;
  read = col ? GemmOperand{nullptr, 1, c.ld} : GemmOperand{nullptr, c.ld, 1};
  return c;
}

// The copies (CopyOperand, CopyForTf32Wgmma): an operand the fast kernels cannot read, and TF32
// wgmma's one layout without a copy-free form, when the product is large enough to pay for the
// copy. The rest of the plan is made for the copies.
void plan_copies(GemmPlan& p, bool c_row_major, const GemmDevice& dev) {
  const GemmRequest& r = p.req;
  const int64_t unit = 16 / element_size(r.dtype);
  const bool a_k = readable(r.m, r.k, r.a.stride0, r.a.stride1, r.a.ptr, unit);
  const bool a_m = readable(r.k, r.m, r.a.stride1, r.a.stride0, r.a.ptr, unit);
  const bool b_n = readable(r.k, r.n, r.b.stride0, r.b.stride1, r.b.ptr, unit);
  const bool b_k = readable(r.n, r.k, r.b.stride1, r.b.stride0, r.b.ptr, unit);
  const bool wgmma_tf32 = r.dtype == DType::Float32 && r.allow_tf32 && c_row_major && dev.wgmma;
  bool copy_a = !a_k && !a_m, copy_b = !b_k && !b_n;
  if (wgmma_tf32 && !a_k && a_m && !b_k && b_n) (r.m <= r.n ? copy_a : copy_b) = true;
  if ((copy_a && r.n < 256) || (copy_b && r.m < 256)) return;
  if (copy_a) p.copy_a = copy_of(r.a, r.m, r.k, CopyLayout::RowMajor, r.dtype, p.a);
  if (copy_b)
    p.copy_b = copy_of(r.b, r.k, r.n, wgmma_tf32 ? CopyLayout::ColumnMajor : CopyLayout::RowMajor,
                       r.dtype, p.b);
}

// The fewest blocks (or clusters) of a persistent grid that finish `units` in as many waves as
// `most` would: 1024 units on 66 clusters take 16 waves, the last half full; on 64, 16 full ones.
int64_t balanced(int64_t units, int64_t most) {
  const int64_t waves = cdiv(units, most);
  return cdiv(units, waves);
}

// A wgmma tile of bm x bn in clusters of cm along m, on a persistent grid (WgmmaGrid).
void wgmma_tile(GemmPlan& p, int bm, int bn, int cm, const GemmDevice& dev) {
  WgmmaParams& w = p.wgmma();
  w.bm = bm, w.bn = bn, w.cluster_m = cm;
  w.tail_units = 0, w.tail_split = 1;
  p.workspace_bytes = 0;
  const int64_t units = cdiv(p.m, int64_t{bm} * cm) * cdiv(p.n, bn);
  const int64_t most =
      cm == 1 ? dev.sms : (dev.pair_clusters > 0 ? dev.pair_clusters : dev.sms / 2);
  p.grid = balanced(units, std::max<int64_t>(most, 1)) * cm;
}

// The split tail on a grid of `grid` CTAs (one per SM) of `units` tiles of `ktiles` k-tiles: the
// tiles past the last full wave, each cut into as many runs as the idle SMs hold (at most `most`,
// at least one k-tile a run); 0 where the waves are whole or fewer than two runs fit.
int tail_split(int64_t units, int64_t ktiles, int64_t grid, int64_t most) {
  const int64_t rest = units % grid;
  if (grid < 2 || rest == 0) return 0;
  const int64_t split = std::min({grid / rest, ktiles, most});
  return split >= 2 ? static_cast<int>(split) : 0;
}

void set_tail(GemmPlan& p, int bn, int64_t grid, int64_t units, int split) {
  WgmmaParams& w = p.wgmma();
  w.bm = kWgmmaBM, w.bn = bn, w.cluster_m = 1;
  p.grid = grid;
  w.tail_units = units % grid;
  w.tail_split = split;
  p.workspace_bytes = tail_workspace_bytes(grid, kWgmmaBM, bn);
}

// The launch choices made once the tile is: 16-bit outputs leave by TMA store where beta is 0 (or
// 1: TMA's reduce-add) and TMA describes c (WgmmaTmaStore); a programmatic dependent launch except
// after the split tail's memset (WgmmaDependentLaunch).
void wgmma_launch(GemmPlan& p) {
  const GemmRequest& r = p.req;
  WgmmaParams& w = p.wgmma();
  const float beta = static_cast<float>(r.beta);
  w.tma_store = r.dtype != DType::Float32 && (beta == 0.f || beta == 1.f) && aligned(r.c, 16) &&
                (p.ldc * 2) % 16 == 0 && tma_describes(p.n, p.m, p.ldc);
  w.pdl = w.tail_units == 0;
}

// narrowest: the narrowest tile width that may run (the dual GEMM's tiles hold bn / 2 outputs of
// each weight, at least one 64-wide store box).
bool plan_wgmma(GemmPlan& p, const GemmDevice& dev, int64_t narrowest = 64) {
  const GemmRequest& r = p.req;
  if (p.m > INT32_MAX || p.n > INT32_MAX || r.k > INT32_MAX) return false;
  const bool tf32 = r.dtype == DType::Float32;
  WgmmaParams w;
  if (tf32 && p.b_nmajor) {
    // TF32 wgmma reads B k-major only: an n-major B with a k-major A is the transposed problem
    // C^T = B^T A^T, whose A (B^T, m-major) comes from registers and whose B (A^T) is k-major.
    if (!p.a_kmajor) return false;
    std::swap(p.m, p.n);
    std::swap(p.lda, p.ldb);
    p.a_kmajor = p.b_nmajor = false;
    w.c_trans = true;
  }
  const bool maps =
      (p.a_kmajor ? tma_describes(r.k, p.m, p.lda) : tma_describes(p.m, r.k, p.lda)) &&
      (p.b_nmajor ? tma_describes(p.n, r.k, p.ldb) : tma_describes(r.k, p.n, p.ldb));
  if (!maps) return false;
  p.kernel = GemmKernel::Wgmma;
  p.params = w;
  // One cost for every choice: the busiest SM's work, (bn + col) x (its waves of tiles (or split
  // CTAs) x each one's k + fixed), col and fixed per width. Waves count what runs at once: 128 x
  // 256 tiles go in pairs along m (B multicast) when there are two tile rows, and a cluster of s
  // split CTAs needs s free SMs of one GPC (pairs as the device counts them, at most SMs / s of the
  // larger ones; a split of 3 or 5-7 would strand SMs). Ties go to the wider tile. 16-bit types:
  // col and fixed fitted to every width measured on the 121 bf16 products of the shape suite (each
  // after an L2 flush; docs/performance.md, "wgmma tile choice"): col 48 / 32 / 0 (the narrow tiles
  // re-read more per FLOP; pairs multicast B), fixed 512 / 512 / 2048 k a CTA (a pair's cluster and
  // its 64 KB epilogue, which one wave overlaps with nothing). Its picks run those products at
  // 0.939x cuBLAS (geomean) where the earlier cost, (bn + 32) x waves x k, picked 0.919x (gpt-2's
  // 768-wide weight gradients over <= 1024 tokens: 128 x 256 pairs 0.65x, 128 x 64 0.85x), and it
  // keeps the seven widths measured elsewhere (2048^3 and 8192 x 2304 x 768 on 128 x 128; 4096^3,
  // 8192^3 and 1024 x 4096 x 28672 on pairs). TF32 keeps the earlier cost until its widths are
  // swept.
  const int64_t tiles_m = cdiv(p.m, kWgmmaBM);
  const int64_t pairs = dev.pair_clusters > 0 ? dev.pair_clusters : dev.sms / 2;
  auto cost = [&](int64_t bn) {
    const int64_t tiles = tiles_m * cdiv(p.n, bn);
    int64_t at_once = dev.sms;  // CTAs
    if (bn == 256 && tiles_m >= 2) at_once = 2 * pairs;
    const int64_t col = tf32 ? 32 : (bn == 64 ? 48 : bn == 128 ? 32 : 0);
    const int64_t fixed = tf32 ? 0 : (bn == 256 ? 2048 : 512);
    return (bn + col) * (cdiv(tiles, std::max<int64_t>(at_once, 1)) * r.k + fixed);
  };
  int64_t bn = 256, best = cost(256);
  for (const int64_t w : {int64_t{128}, int64_t{64}}) {
    if (w >= narrowest && cost(w) < best) best = cost(w), bn = w;
  }
  // The tall tile (16-bit types), single CTAs: where a third more rows a tile turn a partial last
  // wave into a full one (cuBLAS's choice for the c_attn weight gradient 3072 x 1024 x 8192: 128
  // tiles, where 128 x 128 makes 192 on 132 SMs).
  bool tall = false;
  if (!tf32) {
    const int64_t tiles = cdiv(p.m, kWgTallBM) * cdiv(p.n, kWgTallBN);
    const int64_t c = kWgTallWork * (cdiv(tiles, dev.sms) * r.k + kWgTallFixedK);
    if (c < best) best = c, tall = true;
  }
  // The split tail on single CTAs of each width, one per SM: the full waves, then the partial last
  // wave's tiles cut along k over the SMs it leaves idle. It wins where that wave is short over a
  // long k (the 768-wide weight gradients: 144 tiles on 132 SMs ran 0.68-0.70x cuBLAS in every
  // width, 0.94x split; 1024 x 4544 x 18176: 0.76x, 1.00x on single 128 x 256 CTAs, whose full
  // waves then run without the pairs' multicast), and loses to its fixed cost on short k (gpt-2's
  // 768-wide products: 0.4-0.7x where the data-parallel tiles ran 0.8-0.9x).
  const int64_t bk = tf32 ? 32 : 64, ktiles = cdiv(r.k, bk);
  const int64_t tail_fix = tf32 ? kWgTailFixK / 2 : kWgTailFixK,
                per_run = tf32 ? kWgTailPerRunK / 2 : kWgTailPerRunK;
  int64_t tail_bn = 0;
  int tail_runs = 0;
  for (const int64_t w : {int64_t{256}, int64_t{128}, int64_t{64}}) {
    const int64_t units = tiles_m * cdiv(p.n, w);
    const int s = tail_split(units, ktiles, dev.sms, kWgMaxTailSplit);
    if (s == 0 || w < narrowest) continue;
    const int64_t col = tf32 ? 32 : (w == 64 ? 48 : w == 128 ? 32 : 0);
    const int64_t fixed = tf32 ? 0 : (w == 256 ? 2048 : 512);
    const int64_t c = (w + col) * ((units / dev.sms) * r.k + cdiv(ktiles, s) * bk + tail_fix +
                                   (s - 1) * per_run + fixed);
    if (c < best) best = c, tail_bn = w, tail_runs = s;
  }
  if (tail_bn > 0) {
    set_tail(p, static_cast<int>(tail_bn), dev.sms, tiles_m * cdiv(p.n, tail_bn), tail_runs);
    p.rule = "WgmmaTailSplit";
  } else if (tall) {
    wgmma_tile(p, kWgTallBM, kWgTallBN, 1, dev);
    p.rule = "WgmmaTall";
  } else {
    wgmma_tile(p, kWgmmaBM, static_cast<int>(bn), bn == 256 && tiles_m >= 2 ? 2 : 1, dev);
    p.rule = "WgmmaTile";
  }
  wgmma_launch(p);
  return true;
}

SkinnyGeometry skinny_geometry(DType dtype, bool w_kmajor) {
  if (dtype == DType::Float32) return w_kmajor ? kSkinnyFloatK : kSkinnyFloatN;
  return w_kmajor ? kSkinnyHalfK : kSkinnyHalfN;
}

// Warps per SM the small-M grid aims at (four blocks of four), and the fewest chunks a warp's slice
// of k holds: the loads a warp keeps in flight come from 2-4 chunks at a time, and a shorter slice
// spends more of its time in the reduction than in the stream.
constexpr int64_t kSkinnyWarpsPerSm = 16, kSkinnyMinChunks = 4, kSkinnyMaxCluster = 8;

void skinny_split(GemmPlan& p, int rw, int kw, int split) {
  SkinnyParams& k = p.skinny();
  const SkinnyGeometry g = skinny_geometry(p.req.dtype, k.w_kmajor);
  const int64_t outputs = k.tokens_m ? p.n : p.m;
  k.rw = rw, k.kw = kw, k.split = split;
  k.slice = std::max<int64_t>(g.chunk, cdiv(cdiv(p.req.k, int64_t{kw} * split), g.chunk) * g.chunk);
  p.grid = cdiv(cdiv(outputs, g.outputs), rw);
  k.bm = k.tokens_m ? k.mt : g.outputs * rw;
  k.bn = k.tokens_m ? g.outputs * rw : k.mt;
}

// Whether a small-M plan can take the streaming form: every dtype it has (bf16/fp16 and TF32 on the
// tensor cores, float32 "highest" by FP32 FMAs), with the weight and x read by
// TMA, so both describable (and not empty).
bool skinny_streams(const GemmPlan& p) {
  const SkinnyParams& k = p.skinny();
  const int64_t depth = p.req.k, tokens = k.tokens_m ? p.m : p.n, outputs = k.tokens_m ? p.n : p.m;
  const int64_t ldx = k.tokens_m ? p.lda : p.ldb, ldw = k.tokens_m ? p.ldb : p.lda;
  return depth > 0 && tma_describes(depth, tokens, ldx) &&
         (k.w_kmajor ? tma_describes(depth, outputs, ldw) : tma_describes(outputs, depth, ldw));
}

// The least number of ring stages of k a streaming CTA walks: fewer and its ring never fills.
constexpr int64_t kSkinnyMinStages = 8;
// float64's weight is 2-4x the bytes of the same product in the other types, so a CTA's share is
// long and where its groups of 64 outputs are few (at most kSkinnyF64FewGroups, 1024 outputs) those
// few SMs' own read rate sets the time: gpt-2's 768-output products ran 0.60-0.96x cuBLAS on 12
// deep CTAs, 0.90-1.31x with k split over 8 (stages of half the k; 3 stages a CTA are enough,
// kSkinnyF64FewMinStages). Elsewhere it always takes deep stages: above half the SMs' groups one
// CTA an SM with twice the bytes in flight ran 2-9 % faster than two (71-284 groups), and fewer
// larger CTAs leave a last wave no emptier (docs/performance.md, "small-M streaming form").
constexpr int64_t kSkinnyF64FewGroups = 16, kSkinnyF64FewMinStages = 3;

void skinny_stream(GemmPlan& p, int stages, int chunk, int split, bool pdl) {
  SkinnyParams& k = p.skinny();
  const int64_t outputs = k.tokens_m ? p.n : p.m;
  k.tma = true, k.pdl = pdl;
  k.stages = stages, k.chunk = chunk;
  k.rw = kSkinnyWarps, k.kw = 1, k.split = split;
  k.slice = std::max<int64_t>(1, cdiv(cdiv(p.req.k, chunk), split)) * chunk;
  p.grid = cdiv(outputs, kSkinnyTma.outputs);
  k.bm = k.tokens_m ? k.mt : kSkinnyTma.outputs;
  k.bn = k.tokens_m ? kSkinnyTma.outputs : k.mt;
}

// The small-M kernel's side (SmallM): c's short side holds at most kSkinnyMaxTokens and that side's
// operand has k contiguous (the copy-free forms of x @ W.t() and g @ W, and their transposes).
bool skinny_side(const GemmPlan& p, SkinnyParams& k) {
  if (p.m <= kSkinnyMaxTokens && p.m <= p.n && p.a_kmajor) {
    k.tokens_m = true;
    k.w_kmajor = !p.b_nmajor;
  } else if (p.n <= kSkinnyMaxTokens && !p.b_nmajor) {
    k.tokens_m = false;
    k.w_kmajor = p.a_kmajor;
  } else {
    return false;
  }
  return true;
}

// The per-lane form's split (SmallM): four warps of a block split k (each reads whole rows'
// stretches; splitting the block's warps over outputs measured slower in every form), then CTAs of
// a cluster, to about kSkinnyWarpsPerSm warps per SM; at most 4 CTAs for the 16-bit forms (8
// measured slower) and 8 for float32 (whose o-contiguous form owns 128 outputs per warp, so few
// groups).
void skinny_lanes(GemmPlan& p, const GemmDevice& dev) {
  const GemmRequest& r = p.req;
  const SkinnyParams& k = p.skinny();
  const bool half = r.dtype != DType::Float32;
  const SkinnyGeometry g = skinny_geometry(r.dtype, k.w_kmajor);
  const int64_t groups = cdiv(k.tokens_m ? p.n : p.m, g.outputs);
  const int64_t slices = std::max<int64_t>(1, r.k / (int64_t{g.chunk} * kSkinnyMinChunks));
  const int kw = slices >= 4 ? 4 : slices >= 2 ? 2 : 1;
  int64_t split = 1;
  if (dev.clusters && kw == 4) {
    const int64_t cap = std::min<int64_t>(half ? 4 : kSkinnyMaxCluster, slices / 4);
    split = std::clamp<int64_t>(dev.sms * kSkinnyWarpsPerSm / (groups * 4), 1, cap);
  }
  skinny_split(p, kSkinnyWarps / kw, kw, static_cast<int>(split));
  p.rule = "SmallM";
}

// The streaming form's stages and split (SmallMStream, SmallMStreamDeep, SmallMFloat64). Bytes in
// flight set the pace, not CTAs: 64 CTAs with rings of 4 x 36 KB read as fast as 128 with half
// that, and clusters cost (4 CTAs measured slower everywhere). So where the groups of outputs fill
// at most half the SMs, deep stages and k split over a cluster only up to half the SMs, every CTA
// at least kSkinnyMinStages stages; elsewhere two CTAs per SM. float32 "highest" multiplies by FP32
// FMAs, which at 16 tokens keep an SM busy: it wants every SM (deep CTAs up to one per SM, k split
// to fill them; at 16 tokens 0.55-0.65 of copy on half the SMs, 0.75-0.99 on all), where the
// tensor-core forms are bound by the stream alone.
void skinny_streamed(GemmPlan& p, const GemmDevice& dev) {
  const GemmRequest& r = p.req;
  SkinnyParams& k = p.skinny();
  const bool fma = r.dtype == DType::Float32 && !r.allow_tf32;
  const int64_t sms_wanted = fma ? dev.sms : dev.sms / 2;
  const int64_t tma_groups = cdiv(k.tokens_m ? p.n : p.m, kSkinnyTma.outputs);
  const bool f64 = r.dtype == DType::Float64, few = f64 && tma_groups <= kSkinnyF64FewGroups;
  const bool deep = f64 ? !few : tma_groups <= sms_wanted;
  // The chunks are 16-bit elements' counts; float32 and float64 stages hold the same bytes.
  const int chunk =
      (deep ? kSkinnyTmaDeepChunk : kSkinnyTma.chunk) * 2 / static_cast<int>(element_size(r.dtype));
  const int64_t min_stages = few ? kSkinnyF64FewMinStages : kSkinnyMinStages;
  const int64_t cap = std::clamp<int64_t>(cdiv(r.k, chunk) / min_stages, 1, kSkinnyMaxCluster);
  const int64_t split = few ? std::clamp<int64_t>(dev.sms / tma_groups, 1, cap)
                        : deep && tma_groups <= sms_wanted
                            ? std::clamp<int64_t>(sms_wanted / tma_groups, 1, cap)
                            : 1;
  k.mt = std::max(k.mt, 8);  // its token tiles are the mma's 8 columns
  skinny_stream(p, kSkinnyTmaStages, chunk, static_cast<int>(split), true);
  p.rule = f64 ? "SmallMFloat64" : deep ? "SmallMStreamDeep" : "SmallMStream";
}

// The small-M kernel (SmallM and the rows after it), or false where the product is not small-M or
// (float64) cannot stream: float64 has the streaming form only (DMMA; elsewhere the tiled kernel's
// 16-row tile).
bool plan_skinny(GemmPlan& p, const GemmDevice& dev) {
  const GemmRequest& r = p.req;
  SkinnyParams k;
  if (!skinny_side(p, k)) return false;
  const GemmPlan before = p;
  p.params = k;
  if (r.dtype == DType::Float64 && !(dev.skinny_tma && skinny_streams(p))) {
    p = before;
    return false;
  }
  const int64_t tokens = k.tokens_m ? p.m : p.n, outputs = k.tokens_m ? p.n : p.m;
  p.kernel = GemmKernel::Skinny;
  p.skinny().mt = tokens <= 4 && r.dtype == DType::Float32 ? 4 : tokens <= 8 ? 8 : 16;
  skinny_lanes(p, dev);
  // float32 "highest" at <= 4 tokens with the weight k-contiguous and its groups of 64 outputs more
  // than half the SMs: the per-lane form reads it 3-5 % faster than the FMA stream (1 x 4096 x
  // 28672: 0.99 of copy against 0.95), whose 8-token tiles are mostly padding there
  // (SmallMFloat32Lanes).
  const bool fma = r.dtype == DType::Float32 && !r.allow_tf32;
  const bool lanes_faster =
      fma && tokens <= 4 && k.w_kmajor && cdiv(outputs, kSkinnyTma.outputs) > dev.sms / 2;
  if (!dev.skinny_tma || !skinny_streams(p)) return true;
  if (lanes_faster) {
    p.rule = "SmallMFloat32Lanes";
    return true;
  }
  skinny_streamed(p, dev);
  return true;
}

// A fused request (FusedEpilogueApart, FusedEpilogue): the wgmma plan of its product, with TMA
// stores, where the fused kernels take it; false where the op must run the product and the
// epilogue apart.
bool plan_fused(GemmPlan& p, const GemmDevice& dev) {
  const GemmRequest& r = p.req;
  const GemmFusion& f = r.fusion;
  const bool dual = f.kind == GemmEpilogue::Gated;
  const bool half = r.dtype == DType::BFloat16 || r.dtype == DType::Float16;
  const bool copies = p.copy_a.layout != CopyLayout::None || p.copy_b.layout != CopyLayout::None;
  // The dual epilogue's gates (epilogue.cuh's Gated): silu and gelu_tanh.
  const bool gate = f.act == Activation::Silu || f.act == Activation::GeluTanh;
  if (!half || !dev.wgmma || p.swap_ab || !p.a_kmajor || p.b_nmajor || copies || r.beta != 0.0 ||
      (dual && (!aligned(f.b2, 16) || !gate))) {
    return false;
  }
  // The dual GEMM's work is the 2n-wide product's (either kernel reads both weights' rows in one
  // tile), so it is planned as that product.
  GemmPlan w = p;
  if (dual) w.n = 2 * r.n;
  if (r.m <= kSkinnyMaxTokens) {
    // SmallMFused: the small-M kernel's streaming form, the epilogue in its stores (element by
    // element, so the kept products need only their element's alignment).
    const bool aux = f.aux == nullptr || (f.ld_aux >= r.n && (!dual || f.aux2 != nullptr));
    if (!aux || !plan_skinny(w, dev) || !w.skinny().tma || !w.skinny().tokens_m ||
        !w.skinny().w_kmajor) {
      return false;
    }
    w.n = r.n;
    w.fused = true;
    w.rule = "SmallMFused";
    p = w;
    return true;
  }
  const bool aux =
      f.aux == nullptr || (aligned(f.aux, 16) && f.ld_aux >= r.n && (f.ld_aux * 2) % 16 == 0 &&
                           (!dual || (f.aux2 != nullptr && aligned(f.aux2, 16))));
  if (!aux) return false;
  // Its tiles of bn hold bn / 2 outputs of each weight: cdiv(2n, bn) == cdiv(n, bn / 2) per row.
  if (!plan_wgmma(w, dev, dual ? 128 : 64)) return false;
  w.n = r.n;
  wgmma_launch(w);
  if (!w.wgmma().tma_store) return false;
  w.fused = true;
  p = w;
  return true;
}

// A tiled kernel's tile, k whole, one CTA a tile.
void tiles(GemmPlan& p, GemmKernel kernel, int bm, int bn, int bk) {
  p.kernel = kernel;
  p.params = TiledParams{bm, bn, bk, 1};
  p.grid = cdiv(p.m, bm) * cdiv(p.n, bn);
  p.workspace_bytes = 0;
}

// The most workspace a k split on independent CTAs (SIMT, float64) may take beside its output: the
// few-% balance gains of splitting grids of several waves (4096^3 float32 on 108 SMs: 2 ways, 128
// MiB) are not worth a model's memory.
constexpr int64_t kMaxSplitWorkspace = int64_t{64} << 20;

// The float64 kernel's tiles and the cost model that picks one and a k split, fitted to the H100
// sweeps (tiles x splits on the shape suite's products; docs/performance.md, "float64 tiles and
// splits"). A CTA's work is bm x bn x (its slice of k plus kF64CtaK: the ring's fill and the
// epilogue's bm x bn stores, which decide products of short k). Tiles of several blocks per SM run
// at `rate` (percent of one 128 x 128 block's) when all of an SM's blocks are busy and at `rate1`
// when a block has its SM alone; the busiest SM's waves set the time. A warp loads the next stage's
// first fragments under a stage's last DMMAs (gemm_f64.cu), so a block alone on its SM runs nearly
// as fast as one of a full SM (rate1 ~ rate; before, 128 x 64 alone ran at 65 % and 64 x 64 at 60
// %). The 128 x 128 tile's checked (edge) copy spills: where m or n leaves edge tiles, or k is at
// most kF64WideMinK, it counts 1.5 times (128 x 4544 x 18176 ran it at 0.56x cuBLAS, 128 x 64 at
// 0.82x; with k <= 512 one block an SM hides none of its fill and epilogue behind a second, and the
// 128-token weight gradients ran it 5-10 % slower than 64 x 64). Rates, kF64CtaK and kF64WideMinK
// fitted to a sweep of every tile x split (1-8; 1, 2, 4 for weight gradients) on the suite's
// products of up to 1024 tokens in its three layouts (85 products): the picks run at 0.988x cuBLAS
// (geomean), the best of each product at 0.999x, the previous constants' picks at 0.952x; fitted on
// two layouts, the third's picks gain 3-4 % (kk, mn) or lose 0.5 % (kn). The 16-row tile's pairs
// share an SM's L2 bandwidth (rate 25 in pairs, 60 alone). Row ranges: the 16-row tile serves
// decode (swept there) and nothing past 32 rows, where its B panels would be read once per 16 rows;
// the 32-row tiles were swept from 128 rows up only, so decode keeps the 16-row one. 32 x 32: twice
// 32 x 64's CTAs for the products whose tiles fill few SMs, such as gpt-2's 128 x 768 x 768 (48
// CTAs of 32 x 64 over k = 768 ran 0.72x cuBLAS flushed, every tile x split of 32 x 64 and 64 x 64
// 0.57-0.89x warm). Its rates are not a sweep's fit: 70 a guess below 32 x 64's 82, rate1 58 from
// 128 x 768 x 3072 (32 x 32 unsplit against 32 x 64's 48 CTAs), which keeps 128 x 768 x 2304 on 32
// x 64 split 8 (at 62 it took 32 x 32: 0.969 -> 0.808x). So up to 128 rows only until swept.
struct CostTile {
  int bm, bn, blocks;
  int64_t rate, rate1;
  int64_t min_m = 0, max_m = INT64_MAX;  // the problem rows (after any swap) the tile may take
  bool every_split =
      false;  // float64: any k split up to the maximum, not only the swept ones (f64_split_swept)
};
constexpr CostTile kF64Tiles[] = {{128, 128, 1, 100, 100},      {128, 64, 2, 95, 96},
                                  {64, 64, 3, 95, 91},          {32, 64, 3, 82, 70, 17},
                                  {32, 32, 3, 70, 58, 17, 128}, {16, 128, 2, 25, 60, 0, 32, true}};
constexpr int64_t kF64CtaK = 32, kF64MinSlice = 64, kF64MaxSplit = 16, kF64WideMinK = 512;
// A split's planes summed (sum_planes): ~6 us and the planes' bytes at ~4 TB/s, in units of one
// 128 x 128 block's FMA (~4.4 ps at the H100's DMMA rate). The L2-warm sweep fits 2 us; the bench
// (cold L2) ran gpt-2's 768-wide products 5-8 us slower split into planes than over a cluster
// (1024 x 768 x 768: 0.77 -> 0.63x), so the fixed cost carries that margin (sweep picks 0.991 ->
// 0.986x the best).
constexpr int64_t kF64SumFixed = 6000 * 225, kF64SumBytesPerUnit = 26;

// The k splits a tile may take: those swept for it, 1-4, 6 and 8 (f64_sweep on the shape suite), or
// every one up to kF64MaxSplit for a tile swept so (the 16-row one, in decode). The rates are
// fitted to measured configurations and say nothing of the others: 128 x 64 split 11, never swept,
// ran gpt-2's 128 x 768 x 3072 at 0.85x cuBLAS where 32 x 64 split 8 had run 0.99x.
bool f64_split_swept(const CostTile& t, int64_t split) {
  return t.every_split || split <= 4 || split == 6 || split == 8;
}

// The busiest SM's time for `ctas` CTAs of `work` each, in units of work at the 128 x 128 rate. A
// last wave that leaves the busiest SM c of its `blocks` blocks runs them at a rate between rate1
// (alone) and rate (all blocks busy), in proportion.
int64_t busiest_sm_time(const CostTile& t, int64_t ctas, int64_t slots, int64_t work) {
  const int64_t full = ctas / (slots * t.blocks), rest = ctas % (slots * t.blocks);
  int64_t time = full * t.blocks * work * 100 / t.rate;
  if (rest > 0) {
    const int64_t c = (rest + slots - 1) / slots;
    const int64_t rate =
        t.blocks == 1 ? t.rate : t.rate1 + (t.rate - t.rate1) * (c - 1) / (t.blocks - 1);
    time += c * work * 100 / rate;
  }
  return time;
}

void plan_f64(GemmPlan& p, const GemmDevice& dev) {
  const int64_t k = p.req.k;
  int64_t best = -1;
  int split_k = 1;
  for (const CostTile& t : kF64Tiles) {
    if (t.bm == 128 && t.bn == 128 && !dev.dmma_wide) continue;
    if (p.m < t.min_m || p.m > t.max_m) continue;
    const int64_t n_tiles = cdiv(p.m, t.bm) * cdiv(p.n, t.bn);
    for (int64_t split = 1; split <= kF64MaxSplit; ++split) {
      if (split > 1 && (cdiv(k, split) < kF64MinSlice ||
                        split_planes_bytes(p.m, p.n, split, 8) > kMaxSplitWorkspace))
        break;
      if (!f64_split_swept(t, split)) continue;
      int64_t cost =
          busiest_sm_time(t, n_tiles * split, dev.sms, t.bm * t.bn * (cdiv(k, split) + kF64CtaK));
      if (t.bn == 128 && t.bm == 128 && (p.m % 128 != 0 || p.n % 128 != 0 || k <= kF64WideMinK))
        cost = cost * 3 / 2;
      if (split > 1) cost += kF64SumFixed + (split + 1) * p.m * p.n * 8 / kF64SumBytesPerUnit;
      if (best >= 0 && cost >= best) continue;
      best = cost;
      tiles(p, GemmKernel::MmaF64, t.bm, t.bn, 16);
      split_k = static_cast<int>(split);
    }
  }
  p.tiled().split_k = split_k;
  p.workspace_bytes = split_planes_bytes(p.m, p.n, split_k, 8);
  p.rule = "Float64Tiles";
}

// The SIMT kernel's tiles and k split (float32 "highest"), by the float64 kernel's cost: the
// busiest SM's waves of CTAs, two blocks an SM, each CTA its slice of k plus kSimtCtaK (the
// pipeline's fill and the epilogue); a split adds the sum of its planes (sum_partials: the planes
// read, c written) at kSimtSumBytesPerUnit and a fixed ~2 us (its launch and tail). Units: one FMA
// of a block of a pair sharing an SM (~5.2 ps on the H100: a pair of 128 x 128 blocks takes ~171 ns
// a k). Rates and constants fitted to the H100 sweeps of every tile x split 1-16 on 41 products
// (docs/performance.md, "SIMT k split"): a 128 x 128 block alone on its SM runs at 92 (99 ns a k),
// 64 x 64 blocks at 66 in pairs and 60 alone. The picks run at 0.996x the best of each product
// (geomean; worst 256^3, 0.87x of a 10-way split's).
constexpr CostTile kSimtTiles[] = {{128, 128, 2, 100, 92}, {64, 64, 2, 66, 60}};
constexpr int64_t kSimtCtaK = 64, kSimtMinSlice = 128, kSimtMaxSplit = 16;
constexpr int64_t kSimtSumFixed = 2000 * 192, kSimtSumBytesPerUnit = 32;  // 2 us; ~6 TB/s (L2)

void plan_simt(GemmPlan& p, const GemmDevice& dev) {
  const int64_t k = p.req.k;
  int64_t best = -1;
  int split_k = 1;
  for (const CostTile& t : kSimtTiles) {
    const int64_t n_tiles = cdiv(p.m, t.bm) * cdiv(p.n, t.bn);
    for (int64_t split = 1; split <= kSimtMaxSplit; ++split) {
      if (split > 1 && (cdiv(k, split) < kSimtMinSlice ||
                        split_planes_bytes(p.m, p.n, split, 4) > kMaxSplitWorkspace))
        break;
      int64_t cost =
          busiest_sm_time(t, n_tiles * split, dev.sms, t.bm * t.bn * (cdiv(k, split) + kSimtCtaK));
      if (split > 1) cost += kSimtSumFixed + (split + 1) * p.m * p.n * 4 / kSimtSumBytesPerUnit;
      if (best >= 0 && cost >= best) continue;
      best = cost;
      tiles(p, GemmKernel::Simt, t.bm, t.bn, t.bm == 128 ? 8 : 16);
      split_k = static_cast<int>(split);
    }
  }
  p.tiled().split_k = split_k;
  p.workspace_bytes = split_planes_bytes(p.m, p.n, split_k, 4);
  p.rule = "Simt";
}

// The canonical problem (ColumnMajorOutput): C row-major; a column-major c computes c^T = b^T a^T.
// False where an operand is still not readable in place (OperandNotReadable).
bool canonical(GemmPlan& p, bool c_row, int64_t ldc) {
  const GemmRequest& r = p.req;
  const int64_t unit = 16 / element_size(r.dtype);
  p.swap_ab = !c_row;
  p.m = c_row ? r.m : r.n;
  p.n = c_row ? r.n : r.m;
  p.ldc = ldc;
  const GemmOperand A = c_row ? p.a : GemmOperand{p.b.ptr, p.b.stride1, p.b.stride0};
  const GemmOperand B = c_row ? p.b : GemmOperand{p.a.ptr, p.a.stride1, p.a.stride0};
  p.a_kmajor = row_major(p.m, r.k, A.stride0, A.stride1, unit, p.lda);
  if (!p.a_kmajor && !row_major(r.k, p.m, A.stride1, A.stride0, unit, p.lda)) return false;
  p.b_nmajor = row_major(r.k, p.n, B.stride0, B.stride1, unit, p.ldb);
  if (!p.b_nmajor && !row_major(p.n, r.k, B.stride1, B.stride0, unit, p.ldb)) return false;
  return aligned(A.ptr, 16) && aligned(B.ptr, 16);
}

// The mma.sync kernels where wgmma does not run (MmaHalf, MmaTf32): 128 x 128 where the tiles make
// about two waves of two blocks an SM, else 64 x 128.
void plan_mma(GemmPlan& p, bool tf32) {
  const int64_t big = tf32 ? 512 : 264;
  const GemmKernel kernel = tf32 ? GemmKernel::MmaTf32 : GemmKernel::MmaHalf;
  tiles(p, kernel, cdiv(p.m, 128) * cdiv(p.n, 128) >= big ? 128 : 64, 128, 32);
  p.rule = tf32 ? "MmaTf32" : "MmaHalf";
}

}  // namespace

const char* kernel_name(GemmKernel k) {
  switch (k) {
    case GemmKernel::None:
      return "none";
    case GemmKernel::General:
      return "general";
    case GemmKernel::Simt:
      return "simt";
    case GemmKernel::MmaTf32:
      return "mma_tf32";
    case GemmKernel::MmaHalf:
      return "mma_half";
    case GemmKernel::Wgmma:
      return "wgmma";
    case GemmKernel::Skinny:
      return "skinny";
    case GemmKernel::MmaF64:
      return "mma_f64";
  }
  return "?";
}

// The table's rows in its order.
GemmPlan plan_gemm(const GemmRequest& r, const GemmDevice& device) {
  GemmDevice dev = device;
  dev.sms = std::max(dev.sms, 1);
  GemmPlan p;
  p.req = r;
  p.a = r.a, p.b = r.b;
  if (r.m == 0 || r.n == 0) {
    p.kernel = GemmKernel::None;
    p.rule = "EmptyOutput";
    return p;
  }
  if (r.dtype == DType::Float64 && !dev.dmma) return general(p, "Float64WithoutDmma");
  int64_t ldc = 0;
  const bool c_row = row_major(r.m, r.n, r.c_stride0, r.c_stride1, 1, ldc);
  if (!c_row && !row_major(r.n, r.m, r.c_stride1, r.c_stride0, 1, ldc))
    return general(p, "OutputNotRowOrColumnMajor");
  if (!aligned(r.c, element_size(r.dtype))) return general(p, "OutputMisaligned");
  plan_copies(p, c_row, dev);
  if (!canonical(p, c_row, ldc)) return general(p, "OperandNotReadable");
  if (r.fusion.kind != GemmEpilogue::Plain) {
    if (!plan_fused(p, dev)) general(p, "FusedEpilogueApart");
    return p;
  }
  if (plan_skinny(p, dev)) return p;
  if (r.dtype == DType::Float64) {
    plan_f64(p, dev);
    return p;
  }
  const bool tf32 = r.dtype == DType::Float32 && r.allow_tf32;
  if ((r.dtype != DType::Float32 || tf32) && dev.wgmma) {
    GemmPlan w = p;
    if (plan_wgmma(w, dev)) return w;
  }
  if (r.dtype != DType::Float32 || tf32) {
    plan_mma(p, tf32);
    return p;
  }
  if (!p.a_kmajor && p.lda == 0 && r.k > 1) return general(p, "SimtLeadingStrideZero");
  plan_simt(p, dev);
  return p;
}

std::string describe(const GemmPlan& p) {
  char text[160];
  const char* name = kernel_name(p.kernel);
  const long long grid = p.grid;
  if (const auto* t = std::get_if<TiledParams>(&p.params)) {
    snprintf(text, sizeof text, "%s %dx%d bk %d split %d grid %lld", name, t->bm, t->bn, t->bk,
             t->split_k, grid);
  } else if (const auto* w = std::get_if<WgmmaParams>(&p.params)) {
    snprintf(text, sizeof text, "%s %dx%d cm %d grid %lld tail %lld / %d%s%s%s", name, w->bm, w->bn,
             w->cluster_m, grid, static_cast<long long>(w->tail_units), w->tail_split,
             w->tma_store ? " tma-store" : "", w->c_trans ? " c-trans" : "",
             w->pdl ? "" : " no-pdl");
  } else if (const auto* k = std::get_if<SkinnyParams>(&p.params)) {
    if (k->tma)
      snprintf(text, sizeof text, "%s tma mt %d stages %d chunk %d split %d grid %lld%s", name,
               k->mt, k->stages, k->chunk, k->split, grid, k->pdl ? "" : " no-pdl");
    else
      snprintf(text, sizeof text, "%s mt %d rw %d kw %d split %d grid %lld", name, k->mt, k->rw,
               k->kw, k->split, grid);
  } else {
    snprintf(text, sizeof text, "%s", name);
  }
  return text;
}

GemmPlan with_split(GemmPlan plan, int rw, int kw, int split) {
  if (plan.kernel != GemmKernel::Skinny) return plan;
  plan.skinny().tma = plan.skinny().pdl = false;
  skinny_split(plan, rw, kw, split);
  plan.rule = "with_split";
  return plan;
}

GemmPlan with_tail_split(GemmPlan plan, int bn, int split, const GemmDevice& dev) {
  if (plan.kernel != GemmKernel::Wgmma) {
    plan.rule = "with_tail_split: not a wgmma plan";
    return plan;
  }
  const int64_t units = cdiv(plan.m, kWgmmaBM) * cdiv(plan.n, bn);
  const int64_t ktiles = cdiv(plan.req.k, plan.req.dtype == DType::Float32 ? 32 : 64);
  const int most = tail_split(units, ktiles, dev.sms, kWgMaxTailSplit);
  if (most == 0 || split > most || split == 1) {
    plan.rule = "with_tail_split: whole waves, or a split the idle SMs or the k-tiles cannot hold";
    return plan;
  }
  set_tail(plan, bn, dev.sms, units, split > 0 ? split : most);
  wgmma_launch(plan);
  plan.rule = "with_tail_split";
  return plan;
}

GemmPlan with_stream(GemmPlan plan, int stages, int chunk, int split, bool pdl) {
  if (plan.kernel != GemmKernel::Skinny || !skinny_streams(plan)) {
    plan.rule = "with_stream: this plan cannot stream";
    return plan;
  }
  skinny_stream(plan, stages, chunk, split, pdl);
  plan.rule = "with_stream";
  return plan;
}

GemmPlan with_tile(GemmPlan plan, int bm, int bn, int bk, int cluster_m, const GemmDevice& dev) {
  if (plan.kernel == GemmKernel::Wgmma) {
    wgmma_tile(plan, bm == kWgTallBM ? kWgTallBM : kWgmmaBM, bn, cluster_m, dev);
    wgmma_launch(plan);
    // A block-row count the kernel does not take stays visible to the launcher's check.
    plan.wgmma().bm = bm;
  } else if (std::holds_alternative<TiledParams>(plan.params)) {
    tiles(plan, plan.kernel, bm, bn, bk);
  } else {
    plan.rule = "with_tile: not a tiled plan";
    return plan;
  }
  plan.rule = "with_tile";
  return plan;
}

GemmPlan with_split_k(GemmPlan plan, int split) {
  if (plan.kernel != GemmKernel::Simt && plan.kernel != GemmKernel::MmaF64) return plan;
  plan.tiled().split_k = split;
  plan.workspace_bytes =
      split_planes_bytes(plan.m, plan.n, split, plan.kernel == GemmKernel::Simt ? 4 : 8);
  plan.rule = "with_split_k";
  return plan;
}

GroupedPlan plan_grouped(const GroupedRequest& r, const GemmDevice& d) {
  GroupedPlan p;
  const bool half = r.dtype == DType::BFloat16 || r.dtype == DType::Float16;
  if (!half || !d.wgmma || !r.aligned || (r.along_k && r.m % kWgmmaBM != 0)) {
    p.rule = "GroupedGeneral";
    return p;
  }
  p.wgmma = true;
  p.bn = r.dual || r.n >= 256 ? 256 : 128;
  p.rule = "GroupedWgmma";
  return p;
}

}  // namespace cuops::kernels
