// The GEMM planner (gemm_plan.h). Each rule, in the order plan_gemm applies them, and why. Figures
// are H100 measurements; docs/performance.md has them with the commands that reproduce them.
//
// | problem                                        | plan                                    | why |
// |------------------------------------------------|-----------------------------------------|-----|
// | m or n is 0                                    | nothing                                 | no element of c to write |
// | float64 without FP64 tensor cores (before      | general                                 | DMMA is sm_80's; the general kernel is correct on |
// |   sm_80, GemmDevice::dmma)                     |                                         |   every GPU |
// | c neither row- nor column-major                | general                                 | the fast epilogues write pairs along c's rows |
// | c column-major                                 | the product c^T = b^T a^T               | one storage order for the fast kernels |
// | an operand not readable in place: no unit      | copy it into 16-byte padded rows when   | copying b costs ~500 / m of the product's time (a: |
// |   stride, rows not 16-byte multiples, or a     |   the other side has >= 256 rows; else  |   500 / n); the fallback is >= 4x slower (portable |
// |   base not 16-byte aligned                     |   general                               |   TF32) to ~50x (general) |
// | c's short side <= 16 (tokens) and that side's  | small-M kernel (gemm_skinny.cu), all     | bound by the weight's bytes: the tiled kernels' 128-row |
// |   operand k-contiguous; bf16/fp16/float32     |   float types (TF32 computed in FP32;    |   tiles ran 1 x 4096 x 14336 bf16 at 0.43 of copy |
// |   (TF32 too), operands readable in place      |   float64: the streaming form only)     |   against 0.81                              |
// |   (float64: below)                             |                                         |                                                    |
// | small-M split of k                             | four warps of a block, then CTAs of a   | ~16 warps per SM keep the bus busy; 4 warps split  |
// |                                                |   cluster (<= 4 for 16-bit, <= 8 float32)|   over outputs or 8 CTAs of 16-bit measured slower |
// | small-M, sm_90 (GemmDevice::skinny_tma), TMA   | streaming form: TMA ring of 4 stages of | per-lane loads held ~32 KB per SM in flight (0.63  |
// |   describes the weight and x                   |   64 outputs x 128 k (16-bit), a        |   of copy at 4096 x 14336); the ring ~72-160 KB:   |
// |                                                |   producer warp, 4 warps: mma.sync      |   0.87-1.00 of copy, level with cuBLAS or ahead;   |
// |                                                |   (bf16/fp16/TF32) or FP32 FMAs, 8      |   float32 "highest" 0.52-0.67 of copy at M >= 8 in |
// |                                                |   outputs x 8 tokens a thread (float32  |   the per-lane forms, 0.75-1.02 streamed           |
// |                                                |   "highest")                            |                                                    |
// | float32 "highest", <= 4 tokens, k-contiguous   | no stream: the per-lane form            | 3-5 % faster there (0.99 of copy against 0.95 at   |
// |   weight, groups of 64 outputs > SMs / 2       |                                         |   1 x 4096 x 28672): 8-token FMA tiles mostly pad  |
// | streaming, groups of 64 outputs <= SMs / 2     | stages of 256 k (one CTA per SM); k     | bytes in flight set the pace, not CTAs; clusters   |
// |   (FP32 FMAs: <= SMs)                          |   split over a cluster up to SMs / 2    |   cost (4 CTAs slower everywhere); short slices    |
// |                                                |   CTAs (FMAs: all SMs), >= 8 stages each|   only fill the ring; FP32 FMAs at 16 tokens bind  |
// |                                                |                                         |   the SM: 0.55-0.65 of copy on half, 0.75-0.99 all |
// | float64 small-M (sm_90 and the stream only:    | DMMA on the ring; deep stages always,   | its weight is 2-4x the bytes: one CTA an SM ran    |
// |   no per-lane form; the tiled kernel's 16-row  |   except <= 16 groups of outputs: half  |   2-9 % faster than two; 12 deep CTAs left gpt-2's |
// |   tile elsewhere)                              |   the k a stage, k split over 8 CTAs    |   768-output products at 0.60-0.96x cuBLAS, split  |
// |                                                |   (>= 3 stages each)                    |   8 ran 0.90-1.31x                                 |
// | TF32 on wgmma, c row-major, a m-major and b    | copy the smaller of a and b (>= 256 as  | TF32 wgmma reads B only k-major and this layout has |
// |   n-major                                      |   above), k-major                       |   no transposed form that avoids it |
// | bf16/fp16, or TF32, on a wgmma device; sizes   | wgmma (TF32 with b n-major: the         | TMA + wgmma ~3x the mma.sync kernels: 1.02x cuBLAS |
// |   < 2^31; operands TMA can describe            |   transposed problem, B^T from registers)|   at 8192^3 (bf16, fp16), 0.95-0.99x TF32 |
// | wgmma tile                                     | of 128 x 256 (pairs along m when >= 2   | one model for every shape: a partial last wave of  |
// |                                                |   tile rows), 128 x 128, 128 x 64: the  |   wide tiles cost 1024 x 6144 x 4096 0.82x where   |
// |                                                |   least (bn + col) x (waves x k         |   128 x 128 ran 0.97x, and 128 tiles of 128 x 256  |
// |                                                |   + fixed); pairs multicast B           |   ran 0.99x where 128 x 128 ran 0.81x. 16-bit: col |
// |                                                |                                         |   and fixed fitted to every width on the bf16 suite|
// |                                                |                                         |   (performance.md)                                 |
// | wgmma, 16-bit, one wave of 192 x 128 tiles     | 192 x 128 (three consumer warpgroups),  | cuBLAS's tile for the c_attn weight gradient |
// |   costs less than the 128-row plans            |   single CTAs                           |   3072 x 1024 x 8192: 0.85x -> 0.99-1.23x; gpt-2  |
// |                                                |                                         |   dW over 1-4k tokens 0.73 -> 0.90x               |
// | wgmma, a partial last wave over a long k        | the full waves, then the last wave's    | the idle SMs take the rest of k: gpt-2 768-wide    |
// |                                                |   tiles each cut into runs of k over the|   weight gradients 0.69x -> 0.94x, falcon          |
// |                                                |   SMs it leaves idle (single CTAs of a  |   1024 x 4544 x 18176 0.76x -> 1.00x; a fixed cost |
// |                                                |   width; partials added in run order)   |   (memset, wait) loses on short k                  |
// | wgmma grid                                     | fewest clusters finishing in as many    | every wave full: under the power cap the idle SMs' |
// |                                                |   waves as the most that fit            |   share goes to the others' clock (0-1 %) |
// | wgmma, 16-bit c, beta = 0, TMA describes c     | output by TMA store                     | direct stores cost 10-13 % at 4096^3-8192^3 |
// | bf16/fp16 elsewhere                            | mma.sync 128 x 128 from 264 tiles, else | two blocks per SM: about two waves from 264 |
// |                                                |   64 x 128                              | |
// | TF32 elsewhere                                 | mma.sync 128 x 128 from 512 tiles, else | 64 x 128 keeps two blocks per SM in 128 registers |
// |                                                |   64 x 128                              | |
// | float32 "highest"                              | SIMT 128 x 128 or 64 x 64, k split into | the cluster split packed clusters of 4 two to an SM|
// |                                                |   1-16 CTAs writing partial planes      |   and fit 30 of 8: M = 128 rows at 0.56-0.61x where|
// |                                                |   (summed in order by a second kernel): |   an even spread ran 0.74-0.78x; cost              |
// |                                                |   least busiest-SM time (plan_simt)     |   fitted to the sweep (0.996x the best pick)       |
// | SIMT, m-major a of leading stride 0, k > 1     | general                                 | the SIMT loop counts its slices by A's pointer |
// | float64 (operands readable as above, or        | DMMA (gemm_f64.cu): 128 x 128, 128 x 64,| the FP64 pipe sets the pace: the time, the busiest |
// |   copied)                                      |   64 x 64, 32 x 64, 32 x 32 (<= 128     |   SM's waves of CTAs, each its slice of k at the   |
// |                                                |   rows) or 16 x 128 tiles, k unsplit or |   tile's rate (all blocks of the SM busy, or alone)|
// |                                                |   split into 2-4, 6 or 8 CTAs (16 x 128:|   plus a fill and epilogue, and a split's planes   |
// |                                                |   2-16) writing partial planes (as      |   summed. Fit to the sweep of every tile x split   |
// |                                                |   SIMT), whichever leaves the busiest SM|   (performance.md)                                 |
// |                                                |   the least work (plan_f64)             |                                                    |
#include "gemm_plan.h"

#include <algorithm>
#include <climits>

#include "gemm_plan_hooks.h"

namespace cuops::kernels {
namespace {

constexpr int64_t kWgmmaBM = 128;  // kernels/gemm_wgmma.cu's block rows: two consumers of 64
// Its tall tile, 192 x 128 (three consumers; 16-bit types): the work a tile does per k in the units of
// plan_wgmma's cost (128 x bn tiles: bn + col), and its fixed cost in k. 240: 128 x 128's rate per
// output (160 for 16384), which fits the bf16 suite swept with the tile (every product, all widths, L2
// flushed; docs/performance.md, "wgmma tile choice"): 0.957 -> 0.964x cuBLAS for the best
// pick, the gain all in weight gradients that one wave of tall tiles covers (gpt-2 768 x 3072 over
// 1024-4096 tokens 0.73-0.79 -> 0.90x). 208 (the rate its operand rows a output predicted) sent
// 1024-k products there too, where 128 x 128 ran 5-10 % faster. Its fixed cost is 128 x 128's (512 k).
constexpr int64_t kWgTallBM = 192, kWgTallBN = 128, kWgTallWork = 240, kWgTallFixedK = 512;
// No k split over a cluster: an instance that split a tile's k over 2-8 CTAs and summed their partial
// tiles over DSMEM lost to the best unsplit tile on every shape tried, by 3-30 % (each CTA ~10 us more
// than its k; only 30 clusters of 4 fit), and was removed (docs/performance.md, "What was tried and
// lost"). The split tail below covers the shapes it was for.
// The split tail (GemmPlan::tail_units): what it costs beyond a run's k, in 16-bit k (TF32 counts half
// as many, each of its k taking twice the time): the workspace's flags zeroed (a memset before the
// kernel, which also waits for the kernel before it) and the wait, and per run past the first a
// 128 x bn float partial written to L2 and read back by the tile's first run. Fitted to every width's
// tail on the 121 bf16 and 67 TF32 suite products (docs/performance.md, "split tail"): the picks run 0.961x cuBLAS (bf16, geomean) and 1.021x (TF32), where the
// data-parallel tiles alone picked 0.944x and 0.969x; the best of every plan measured 0.967x and 1.034x.
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

GemmPlan& general(GemmPlan& p, const char* why) {
  p.kernel = GemmKernel::General;
  p.bm = p.bn = 64;
  p.grid = cdiv(p.req.m, 64) * cdiv(p.req.n, 64);
  p.why = why;
  return p;
}

// The copies of ops/gemm.cpp's concern: an operand the fast kernels cannot read, and TF32 wgmma's
// one layout without a copy-free form, when the product is large enough to pay for the copy.
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
  if (copy_a) p.copy_a = OperandCopy::RowMajor;
  if (copy_b) p.copy_b = wgmma_tf32 ? OperandCopy::ColumnMajor : OperandCopy::RowMajor;
}

// The fewest blocks (or clusters) of a persistent grid that finish `units` in as many waves as
// `most` would: 1024 units on 66 clusters take 16 waves, the last half full; on 64, 16 full ones.
int64_t balanced(int64_t units, int64_t most) {
  const int64_t waves = cdiv(units, most);
  return cdiv(units, waves);
}

// A wgmma tile of bm x bn in clusters of cm along m, on a persistent grid.
void wgmma_tile(GemmPlan& p, int bm, int bn, int cm, const GemmDevice& dev) {
  p.bm = bm, p.bn = bn, p.bk = 0, p.cluster_m = cm;
  const int64_t units = cdiv(p.m, int64_t{bm} * cm) * cdiv(p.n, bn);
  const int64_t most =
      cm == 1 ? dev.sms : (dev.pair_clusters > 0 ? dev.pair_clusters : dev.sms / 2);
  p.grid = balanced(units, std::max<int64_t>(most, 1)) * cm;
}

// The split tail on a grid of `grid` CTAs (one per SM) of `units` tiles of `ktiles` k-tiles: the
// tiles past the last full wave, each cut into as many runs as the idle SMs hold (at most `most`, at
// least one k-tile a run); 0 where the waves are whole or fewer than two runs fit.
int tail_split(int64_t units, int64_t ktiles, int64_t grid, int64_t most) {
  const int64_t rest = units % grid;
  if (grid < 2 || rest == 0) return 0;
  const int64_t split = std::min({grid / rest, ktiles, most});
  return split >= 2 ? static_cast<int>(split) : 0;
}

void set_tail(GemmPlan& p, int bn, int64_t grid, int64_t units, int split) {
  p.bm = kWgmmaBM, p.bn = bn, p.bk = 0, p.cluster_m = 1;
  p.grid = grid;
  p.split_k = 1;
  p.tail_units = units % grid;
  p.tail_split = split;
  p.workspace_bytes = tail_workspace_bytes(grid, kWgmmaBM, bn);
}

// 16-bit outputs leave by TMA store where beta is 0 and TMA describes c.
void wgmma_tma_store(GemmPlan& p) {
  const GemmRequest& r = p.req;
  p.tma_store = r.dtype != DType::Float32 && static_cast<float>(r.beta) == 0.f &&
                aligned(r.c, 16) && (p.ldc * 2) % 16 == 0 && tma_describes(p.n, p.m, p.ldc);
}

bool plan_wgmma(GemmPlan& p, const GemmDevice& dev) {
  const GemmRequest& r = p.req;
  if (p.m > INT32_MAX || p.n > INT32_MAX || r.k > INT32_MAX) return false;
  const bool tf32 = r.dtype == DType::Float32;
  if (tf32 && p.b_nmajor) {
    // TF32 wgmma reads B k-major only: an n-major B with a k-major A is the transposed problem
    // C^T = B^T A^T, whose A (B^T, m-major) comes from registers and whose B (A^T) is k-major.
    if (!p.a_kmajor) return false;
    std::swap(p.m, p.n);
    std::swap(p.lda, p.ldb);
    p.a_kmajor = p.b_nmajor = false;
    p.c_trans = true;
  }
  const bool maps =
      (p.a_kmajor ? tma_describes(r.k, p.m, p.lda) : tma_describes(p.m, r.k, p.lda)) &&
      (p.b_nmajor ? tma_describes(p.n, r.k, p.ldb) : tma_describes(r.k, p.n, p.ldb));
  if (!maps) return false;
  p.kernel = GemmKernel::Wgmma;
  // One cost for every choice: the busiest SM's work, (bn + col) x (its waves of tiles (or split CTAs)
  // x each one's k + fixed), col and fixed per width. Waves count what runs at once:
  // 128 x 256 tiles go in pairs along m (B multicast) when there are two tile rows, and a cluster of
  // s split CTAs needs s free SMs of one GPC (pairs as the device counts them, at most SMs / s of the
  // larger ones; a split of 3 or 5-7 would strand SMs). Ties go to the wider tile.
  // 16-bit types: col and fixed fitted to every width measured on the 121 bf16 products of the shape
  // suite (each after an L2 flush; docs/performance.md, "wgmma tile choice"): col 48 / 32 / 0
  // (the narrow tiles re-read more per FLOP; pairs multicast B), fixed 512 / 512 / 2048 k a CTA (a
  // pair's cluster and its 64 KB epilogue, which one wave overlaps with nothing). Its picks run those
  // products at 0.939x cuBLAS (geomean) where the earlier cost, (bn + 32) x waves x k, picked 0.919x
  // (gpt-2's 768-wide weight gradients over <= 1024 tokens: 128 x 256 pairs 0.65x, 128 x 64 0.85x), and
  // it keeps the seven widths measured elsewhere (2048^3 and 8192 x 2304 x 768 on 128 x 128; 4096^3,
  // 8192^3 and 1024 x 4096 x 28672 on pairs). TF32 keeps the earlier
  // cost until its widths are swept.
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
    if (cost(w) < best) best = cost(w), bn = w;
  }
  // The tall tile (16-bit types), single CTAs: where a third more rows a tile turn a partial last wave
  // into a full one (cuBLAS's choice for the c_attn weight gradient 3072 x 1024 x 8192: 128 tiles,
  // where 128 x 128 makes 192 on 132 SMs).
  bool tall = false;
  if (!tf32) {
    const int64_t tiles = cdiv(p.m, kWgTallBM) * cdiv(p.n, kWgTallBN);
    const int64_t c = kWgTallWork * (cdiv(tiles, dev.sms) * r.k + kWgTallFixedK);
    if (c < best) best = c, tall = true;
  }
  // The split tail on single CTAs of each width, one per SM: the full waves, then the partial last
  // wave's tiles cut along k over the SMs it leaves idle. It wins where that wave is short over a long
  // k (the 768-wide weight gradients: 144 tiles on 132 SMs ran 0.68-0.70x cuBLAS in every width,
  // 0.94x split; 1024 x 4544 x 18176: 0.76x, 1.00x on single 128 x 256 CTAs, whose full waves then
  // run without the pairs' multicast), and loses to its fixed cost on short k (gpt-2's 768-wide
  // products: 0.4-0.7x where the data-parallel tiles ran 0.8-0.9x).
  const int64_t bk = tf32 ? 32 : 64, ktiles = cdiv(r.k, bk);
  const int64_t tail_fix = tf32 ? kWgTailFixK / 2 : kWgTailFixK,
                per_run = tf32 ? kWgTailPerRunK / 2 : kWgTailPerRunK;
  int64_t tail_bn = 0;
  int tail_runs = 0;
  for (const int64_t w : {int64_t{256}, int64_t{128}, int64_t{64}}) {
    const int64_t units = tiles_m * cdiv(p.n, w);
    const int s = tail_split(units, ktiles, dev.sms, kWgMaxTailSplit);
    if (s == 0) continue;
    const int64_t col = tf32 ? 32 : (w == 64 ? 48 : w == 128 ? 32 : 0);
    const int64_t fixed = tf32 ? 0 : (w == 256 ? 2048 : 512);
    const int64_t c = (w + col) * ((units / dev.sms) * r.k + cdiv(ktiles, s) * bk + tail_fix +
                                   (s - 1) * per_run + fixed);
    if (c < best) best = c, tail_bn = w, tail_runs = s;
  }
  if (tail_bn > 0) {
    set_tail(p, static_cast<int>(tail_bn), dev.sms, tiles_m * cdiv(p.n, tail_bn), tail_runs);
    p.why = "wgmma: the partial last wave split along k";
  } else if (tall) {
    wgmma_tile(p, kWgTallBM, kWgTallBN, 1, dev);
    p.why = "wgmma: 192 x 128 tiles, fewer waves";
  } else {
    wgmma_tile(p, kWgmmaBM, static_cast<int>(bn), bn == 256 && tiles_m >= 2 ? 2 : 1, dev);
    p.why = bn == 256 ? "wgmma: 128 x 256 tiles" : "wgmma: narrower tiles, fewer waves";
  }
  wgmma_tma_store(p);
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
  const SkinnyGeometry g = skinny_geometry(p.req.dtype, p.sk_w_kmajor);
  const int64_t outputs = p.sk_tokens_m ? p.n : p.m;
  p.sk_rw = rw, p.sk_kw = kw, p.sk_split = split;
  p.sk_slice =
      std::max<int64_t>(g.chunk, cdiv(cdiv(p.req.k, int64_t{kw} * split), g.chunk) * g.chunk);
  p.grid = cdiv(cdiv(outputs, g.outputs), rw);
  p.bm = p.sk_tokens_m ? p.sk_mt : g.outputs * rw;
  p.bn = p.sk_tokens_m ? g.outputs * rw : p.sk_mt;
}

// Whether a small-M plan can take the streaming form: every dtype it has (bf16/fp16 and TF32 on the
// tensor cores, float32 "highest" by FP32 FMAs), with the weight and x read by
// TMA, so both describable (and not empty).
bool skinny_streams(const GemmPlan& p) {
  const int64_t k = p.req.k, tokens = p.sk_tokens_m ? p.m : p.n,
                outputs = p.sk_tokens_m ? p.n : p.m;
  const int64_t ldx = p.sk_tokens_m ? p.lda : p.ldb, ldw = p.sk_tokens_m ? p.ldb : p.lda;
  return k > 0 && tma_describes(k, tokens, ldx) &&
         (p.sk_w_kmajor ? tma_describes(k, outputs, ldw) : tma_describes(outputs, k, ldw));
}

// The least number of ring stages of k a streaming CTA walks: fewer and its ring never fills.
constexpr int64_t kSkinnyMinStages = 8;
// float64's weight is 2-4x the bytes of the same product in the other types, so a CTA's share is
// long and where its groups of 64 outputs are few (at most kSkinnyF64FewGroups, 1024 outputs) those
// few SMs' own read rate sets the time: gpt-2's 768-output products ran 0.60-0.96x cuBLAS on 12 deep
// CTAs, 0.90-1.31x with k split over 8 (stages of half the k; 3 stages a CTA are enough,
// kSkinnyF64FewMinStages). Elsewhere it always takes deep stages: above half the SMs' groups one CTA
// an SM with twice the bytes in flight ran 2-9 % faster than two (71-284 groups), and fewer larger
// CTAs leave a last wave no emptier (docs/performance.md, "small-M streaming form").
constexpr int64_t kSkinnyF64FewGroups = 16, kSkinnyF64FewMinStages = 3;

void skinny_stream(GemmPlan& p, int stages, int chunk, int split, bool pdl) {
  const int64_t outputs = p.sk_tokens_m ? p.n : p.m;
  p.sk_tma = true, p.sk_pdl = pdl;
  p.sk_stages = stages, p.sk_chunk = chunk;
  p.sk_rw = kSkinnyWarps, p.sk_kw = 1, p.sk_split = split;
  p.sk_slice = std::max<int64_t>(1, cdiv(cdiv(p.req.k, chunk), split)) * chunk;
  p.grid = cdiv(outputs, kSkinnyTma.outputs);
  p.bm = p.sk_tokens_m ? p.sk_mt : kSkinnyTma.outputs;
  p.bn = p.sk_tokens_m ? kSkinnyTma.outputs : p.sk_mt;
}

// The small-M kernel, where c's short side holds at most kSkinnyMaxTokens and that side's operand
// has k contiguous (the copy-free forms of x @ W.t() and g @ W, and their transposes).
bool plan_skinny(GemmPlan& p, const GemmDevice& dev) {
  const GemmRequest& r = p.req;
  if (p.m <= kSkinnyMaxTokens && p.m <= p.n && p.a_kmajor) {
    p.sk_tokens_m = true;
    p.sk_w_kmajor = !p.b_nmajor;
  } else if (p.n <= kSkinnyMaxTokens && !p.b_nmajor) {
    p.sk_tokens_m = false;
    p.sk_w_kmajor = p.a_kmajor;
  } else {
    return false;
  }
  // float64 has the streaming form only (DMMA; the tiled kernel's 16-row tile elsewhere).
  if (r.dtype == DType::Float64 && !(dev.skinny_tma && skinny_streams(p))) return false;
  const bool half = r.dtype != DType::Float32;
  const int64_t tokens = p.sk_tokens_m ? p.m : p.n, outputs = p.sk_tokens_m ? p.n : p.m;
  p.kernel = GemmKernel::Skinny;
  p.sk_mt = tokens <= 4 && !half ? 4 : tokens <= 8 ? 8 : 16;
  const SkinnyGeometry g = skinny_geometry(r.dtype, p.sk_w_kmajor);
  // Four warps of a block split k (each reads whole rows' stretches; splitting the block's warps over
  // outputs measured slower in every form), then CTAs of a cluster, to about kSkinnyWarpsPerSm warps
  // per SM; at most 4 CTAs for the 16-bit forms (8 measured slower) and 8 for float32 (whose
  // o-contiguous form owns 128 outputs per warp, so few groups).
  const int64_t groups = cdiv(outputs, g.outputs);
  const int64_t slices = std::max<int64_t>(1, r.k / (int64_t{g.chunk} * kSkinnyMinChunks));
  const int kw = slices >= 4 ? 4 : slices >= 2 ? 2 : 1;
  int64_t split = 1;
  if (dev.clusters && kw == 4) {
    const int64_t cap = std::min<int64_t>(half ? 4 : kSkinnyMaxCluster, slices / 4);
    split = std::clamp<int64_t>(dev.sms * kSkinnyWarpsPerSm / (groups * 4), 1, cap);
  }
  skinny_split(p, kSkinnyWarps / kw, kw, static_cast<int>(split));
  p.why = split > 1 ? "small m: k split over four warps and a cluster's CTAs"
                    : "small m: k split over a block's warps";
  // float32 "highest" at <= 4 tokens with the weight k-contiguous and its groups of 64 outputs more
  // than half the SMs: the per-lane form reads it 3-5 % faster than the FMA stream (1 x 4096 x 28672:
  // 0.99 of copy against 0.95), whose 8-token tiles are mostly padding there.
  const bool fma = r.dtype == DType::Float32 && !r.allow_tf32;
  const bool lanes_faster =
      fma && tokens <= 4 && p.sk_w_kmajor && cdiv(outputs, kSkinnyTma.outputs) > dev.sms / 2;
  if (dev.skinny_tma && skinny_streams(p) && !lanes_faster) {
    // Bytes in flight set the pace, not CTAs: 64 CTAs with rings of 4 x 36 KB read as fast as 128
    // with half that, and clusters cost (4 CTAs measured slower everywhere). So where
    // the groups of outputs fill at most half the SMs, deep stages and k split over a cluster only
    // up to half the SMs, every CTA at least kSkinnyMinStages stages; elsewhere two CTAs per SM.
    // float32 "highest" multiplies by FP32 FMAs, which at 16 tokens keep an SM busy: it wants every SM
    // (deep CTAs up to one per SM, k split to fill them; at 16 tokens 0.55-0.65 of copy on half the
    // SMs, 0.75-0.99 on all), where the tensor-core forms are bound by the stream alone.
    const int64_t sms_wanted = fma ? dev.sms : dev.sms / 2;
    const int64_t tma_groups = cdiv(outputs, kSkinnyTma.outputs);
    const bool f64 = r.dtype == DType::Float64, few = f64 && tma_groups <= kSkinnyF64FewGroups;
    const bool deep = f64 ? !few : tma_groups <= sms_wanted;
    // The chunks are 16-bit elements' counts; float32 and float64 stages hold the same bytes.
    const int chunk = (deep ? kSkinnyTmaDeepChunk : kSkinnyTma.chunk) * 2 /
                      static_cast<int>(element_size(r.dtype));
    const int64_t min_stages = few ? kSkinnyF64FewMinStages : kSkinnyMinStages;
    const int64_t cap = std::clamp<int64_t>(cdiv(r.k, chunk) / min_stages, 1, kSkinnyMaxCluster);
    const int64_t split_tma = few ? std::clamp<int64_t>(dev.sms / tma_groups, 1, cap)
                              : deep && tma_groups <= sms_wanted
                                  ? std::clamp<int64_t>(sms_wanted / tma_groups, 1, cap)
                                  : 1;
    p.sk_mt = std::max(p.sk_mt, 8);  // its token tiles are the mma's 8 columns
    skinny_stream(p, kSkinnyTmaStages, chunk, static_cast<int>(split_tma), true);
    p.why = split_tma > 1 ? "small m, streamed by TMA: k split over a cluster's CTAs"
                          : "small m, streamed by TMA";
  }
  return true;
}

void tiles(GemmPlan& p, int bm, int bn, int bk) {
  p.bm = bm, p.bn = bn, p.bk = bk, p.cluster_m = 1;
  p.grid = cdiv(p.m, bm) * cdiv(p.n, bn);
}

// The most workspace a k split on independent CTAs (SIMT, float64) may take beside its output: the
// few-% balance gains of splitting grids of several waves (4096^3 float32 on 108 SMs: 2 ways, 128 MiB)
// are not worth a model's memory.
constexpr int64_t kMaxSplitWorkspace = int64_t{64} << 20;

// The float64 kernel's tiles and the cost model that picks one and a k split, fitted to the H100
// sweeps (tiles x splits on the shape suite's products; docs/performance.md, "float64 tiles and splits"). A CTA's work is bm x bn x (its slice of k plus kF64CtaK: the
// ring's fill and the epilogue's bm x bn stores, which decide products of short k). Tiles of several
// blocks per SM run at `rate` (percent of one 128 x 128 block's) when all of an SM's blocks are busy and
// at `rate1` when a block has its SM alone; the busiest SM's waves set the time. A
// warp loads the next stage's first fragments under a stage's last DMMAs (gemm_f64.cu), so a block
// alone on its SM runs nearly as fast as one of a full SM (rate1 ~ rate; before, 128 x 64 alone ran
// at 65 % and 64 x 64 at 60 %). The 128 x 128 tile's checked (edge) copy spills: where m or n leaves
// edge tiles, or k is at most kF64WideMinK, it counts 1.5 times (128 x 4544 x 18176 ran it at 0.56x
// cuBLAS, 128 x 64 at 0.82x; with k <= 512 one block an SM hides none of its fill and epilogue behind
// a second, and the 128-token weight gradients ran it 5-10 % slower than 64 x 64). Rates, kF64CtaK and
// kF64WideMinK fitted to a sweep of every tile x split (1-8; 1, 2, 4 for weight gradients)
// on the suite's products of up to 1024 tokens in its three layouts
// (85 products): the picks run at 0.988x
// cuBLAS (geomean), the best of each product at 0.999x, the previous constants' picks at 0.952x;
// fitted on two layouts, the third's picks gain 3-4 % (kk, mn) or lose 0.5 % (kn). The 16-row tile's
// pairs share an SM's L2 bandwidth (rate 25 in pairs, 60 alone). Row ranges: the 16-row tile serves
// decode (swept there) and nothing past 32 rows, where its B panels would be read once per 16 rows; the
// 32-row tiles were swept from 128 rows up only, so decode keeps the 16-row one. 32 x 32:
// twice 32 x 64's CTAs for the products whose tiles fill few SMs, such as gpt-2's 128 x 768 x 768
// (48 CTAs of 32 x 64 over k = 768 ran 0.72x cuBLAS flushed, every tile x split of 32 x 64 and 64 x 64
// 0.57-0.89x warm). Its rates are not a sweep's fit: 70 a guess below 32 x 64's 82, rate1 58 from
// 128 x 768 x 3072 (32 x 32 unsplit against 32 x 64's 48 CTAs), which
// keeps 128 x 768 x 2304 on 32 x 64 split 8 (at 62 it took 32 x 32: 0.969 -> 0.808x). So up to 128
// rows only until swept.
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
// every one up to kF64MaxSplit for a tile swept so (the 16-row one, in decode). The rates are fitted to
// measured configurations and say nothing of the others: 128 x 64 split 11, never swept, ran gpt-2's
// 128 x 768 x 3072 at 0.85x cuBLAS where 32 x 64 split 8 had run 0.99x.
bool f64_split_swept(const CostTile& t, int64_t split) {
  return t.every_split || split <= 4 || split == 6 || split == 8;
}

// The busiest SM's time for `ctas` CTAs of `work` each, in units of work at the 128 x 128 rate. A last
// wave that leaves the busiest SM c of its `blocks` blocks runs them at a rate between rate1 (alone)
// and rate (all blocks busy), in proportion.
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
  p.kernel = GemmKernel::MmaF64;
  int64_t best = -1;
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
      tiles(p, t.bm, t.bn, 16);
      p.split_k = static_cast<int>(split);
    }
  }
  p.workspace_bytes = split_planes_bytes(p.m, p.n, p.split_k, 8);
  p.why = p.split_k > 1 ? "float64 on FP64 tensor cores, k split (planes summed in order)"
                        : "float64 on FP64 tensor cores";
}

// The SIMT kernel's tiles and k split (float32 "highest"), by the float64 kernel's cost: the busiest
// SM's waves of CTAs, two blocks an SM, each CTA its slice of k plus kSimtCtaK (the pipeline's fill and
// the epilogue); a split adds the sum of its planes (sum_partials: the planes read, c written) at
// kSimtSumBytesPerUnit and a fixed ~2 us (its launch and tail). Units: one FMA of a block of a pair
// sharing an SM (~5.2 ps on the H100: a pair of 128 x 128 blocks takes ~171 ns a k). Rates and
// constants fitted to the H100 sweeps of every tile x split 1-16 on 41 products
// (docs/performance.md, "SIMT k split"): a 128 x 128 block alone on its SM runs at 92
// (99 ns a k), 64 x 64 blocks at 66 in pairs and 60 alone. The picks run at 0.996x the best of each
// product (geomean; worst 256^3, 0.87x of a 10-way split's).
constexpr CostTile kSimtTiles[] = {{128, 128, 2, 100, 92}, {64, 64, 2, 66, 60}};
constexpr int64_t kSimtCtaK = 64, kSimtMinSlice = 128, kSimtMaxSplit = 16;
constexpr int64_t kSimtSumFixed = 2000 * 192, kSimtSumBytesPerUnit = 32;  // 2 us; ~6 TB/s (L2)

void plan_simt(GemmPlan& p, const GemmDevice& dev) {
  const int64_t k = p.req.k;
  int64_t best = -1;
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
      tiles(p, t.bm, t.bn, t.bm == 128 ? 8 : 16);
      p.split_k = static_cast<int>(split);
    }
  }
  p.workspace_bytes = split_planes_bytes(p.m, p.n, p.split_k, 4);
  p.why = p.split_k > 1 ? "float32 'highest' on FP32 cores, k split (planes summed in order)"
                        : "float32 'highest' on FP32 cores";
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

GemmPlan plan_gemm(const GemmRequest& r, const GemmDevice& device) {
  GemmDevice dev = device;
  dev.sms = std::max(dev.sms, 1);
  GemmPlan p;
  p.req = r;
  if (r.m == 0 || r.n == 0) {
    p.kernel = GemmKernel::None;
    p.why = "c is empty";
    return p;
  }
  if (r.dtype == DType::Float64 && !dev.dmma)
    return general(p, "float64 without FP64 tensor cores");
  const int64_t es = element_size(r.dtype), unit = 16 / es;
  int64_t ldc = 0;
  const bool c_row = row_major(r.m, r.n, r.c_stride0, r.c_stride1, 1, ldc);
  if (!c_row && !row_major(r.n, r.m, r.c_stride1, r.c_stride0, 1, ldc)) {
    return general(p, "c neither row- nor column-major");
  }
  if (!aligned(r.c, es)) return general(p, "c not aligned to its element size");
  plan_copies(p, c_row, dev);
  if (p.copy_a != OperandCopy::None || p.copy_b != OperandCopy::None) {
    p.why = "copy an operand first, then plan again";
    return p;
  }
  // The canonical problem: C row-major; a column-major c computes c^T = b^T a^T.
  p.swap_ab = !c_row;
  p.m = c_row ? r.m : r.n;
  p.n = c_row ? r.n : r.m;
  p.ldc = ldc;
  const GemmOperand A = c_row ? r.a : GemmOperand{r.b.ptr, r.b.stride1, r.b.stride0};
  const GemmOperand B = c_row ? r.b : GemmOperand{r.a.ptr, r.a.stride1, r.a.stride0};
  p.a_kmajor = row_major(p.m, r.k, A.stride0, A.stride1, unit, p.lda);
  if (!p.a_kmajor && !row_major(r.k, p.m, A.stride1, A.stride0, unit, p.lda)) {
    return general(p, "a not readable in place, too small a product to copy it");
  }
  p.b_nmajor = row_major(r.k, p.n, B.stride0, B.stride1, unit, p.ldb);
  if (!p.b_nmajor && !row_major(p.n, r.k, B.stride1, B.stride0, unit, p.ldb)) {
    return general(p, "b not readable in place, too small a product to copy it");
  }
  if (!aligned(A.ptr, 16) || !aligned(B.ptr, 16))
    return general(p, "an operand's base not 16-byte aligned");

  if (r.dtype == DType::Float64) {
    GemmPlan s = p;
    if (plan_skinny(s, dev)) return s;
    plan_f64(p, dev);
    return p;
  }
  if (plan_skinny(p, dev)) return p;
  const bool tf32 = r.dtype == DType::Float32 && r.allow_tf32;
  if ((r.dtype != DType::Float32 || tf32) && dev.wgmma) {
    GemmPlan w = p;
    if (plan_wgmma(w, dev)) return w;
  }
  if (r.dtype != DType::Float32) {
    p.kernel = GemmKernel::MmaHalf;
    p.why = "bf16/fp16 on mma.sync";
    if (cdiv(p.m, 128) * cdiv(p.n, 128) >= 264)
      tiles(p, 128, 128, 32);
    else
      tiles(p, 64, 128, 32);
    return p;
  }
  if (tf32) {
    p.kernel = GemmKernel::MmaTf32;
    p.why = "TF32 on mma.sync";
    if (cdiv(p.m, 128) * cdiv(p.n, 128) >= 512)
      tiles(p, 128, 128, 32);
    else
      tiles(p, 64, 128, 32);
    return p;
  }
  if (!p.a_kmajor && p.lda == 0 && r.k > 1)
    return general(p, "SIMT: m-major a of leading stride 0");
  p.kernel = GemmKernel::Simt;
  plan_simt(p, dev);
  return p;
}

GemmPlan with_split(GemmPlan plan, int rw, int kw, int split) {
  plan.sk_tma = plan.sk_pdl = false;
  skinny_split(plan, rw, kw, split);
  plan.why = "split set by with_split";
  return plan;
}

GemmPlan with_tail_split(GemmPlan plan, int bn, int split, const GemmDevice& dev) {
  if (plan.kernel != GemmKernel::Wgmma) {
    plan.why = "with_tail_split: not a wgmma plan";
    return plan;
  }
  const int64_t units = cdiv(plan.m, kWgmmaBM) * cdiv(plan.n, bn);
  const int64_t ktiles = cdiv(plan.req.k, plan.req.dtype == DType::Float32 ? 32 : 64);
  const int most = tail_split(units, ktiles, dev.sms, kWgMaxTailSplit);
  if (most == 0 || split > most || split == 1) {
    plan.why = "with_tail_split: whole waves, or a split the idle SMs or the k-tiles cannot hold";
    return plan;
  }
  set_tail(plan, bn, dev.sms, units, split > 0 ? split : most);
  wgmma_tma_store(plan);
  plan.why = "tail split set by with_tail_split";
  return plan;
}

GemmPlan with_stream(GemmPlan plan, int stages, int chunk, int split, bool pdl) {
  if (plan.kernel != GemmKernel::Skinny || !skinny_streams(plan)) {
    plan.why = "with_stream: this plan cannot stream";
    return plan;
  }
  skinny_stream(plan, stages, chunk, split, pdl);
  plan.why = "stream set by with_stream";
  return plan;
}

GemmPlan with_tile(GemmPlan plan, int bm, int bn, int bk, int cluster_m, const GemmDevice& dev) {
  plan.split_k = 1;
  plan.tail_units = plan.workspace_bytes = 0;
  plan.tail_split = 1;
  if (plan.kernel == GemmKernel::Wgmma) {
    wgmma_tile(plan, bm == kWgTallBM ? kWgTallBM : kWgmmaBM, bn, cluster_m, dev);
    wgmma_tma_store(plan);
    plan.bm =
        bm;  // a block-row count the kernel does not take stays visible to launch_gemm's check
  } else {
    tiles(plan, bm, bn, bk);
    plan.cluster_m = cluster_m;
  }
  plan.why = "tile set by with_tile";
  return plan;
}

GemmPlan with_split_k(GemmPlan plan, int split) {
  if (plan.kernel != GemmKernel::Simt && plan.kernel != GemmKernel::MmaF64) return plan;
  plan.split_k = split;
  plan.workspace_bytes =
      split_planes_bytes(plan.m, plan.n, split, plan.kernel == GemmKernel::Simt ? 4 : 8);
  plan.why = "split set by with_split_k";
  return plan;
}

}  // namespace cuops::kernels
