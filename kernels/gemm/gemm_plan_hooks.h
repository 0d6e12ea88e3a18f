// The planner's hooks for experiments: plans with a tile, split or stream set by hand, for the
// sweeps in bench/sweep (which time choices the planner did not make) and the planner's tests. Not
// part of the library's planner interface (gemm_plan.h); launch_gemm runs what they return when a
// kernel instance takes it, else answers cudaErrorInvalidValue.
#pragma once

#include <string>

#include "gemm_plan.h"

namespace cuops::kernels {

// The plan's kernel and its family's parameters in one line, for logs and test messages.
std::string describe(const GemmPlan& plan);

// `plan` with another tile (block rows and columns, the SIMT kernel's k-slice, CTAs per cluster
// along m), k unsplit, and the grid the planner would give that tile.
GemmPlan with_tile(GemmPlan plan, int bm, int bn, int bk, int cluster_m, const GemmDevice& dev);

// A small-M plan with another split (warps along the outputs and along k, CTAs per
// cluster along k; sk_rw * sk_kw == kSkinnyWarps), its slice and grid recomputed.
GemmPlan with_split(GemmPlan plan, int rw, int kw, int split);

// A small-M plan on the streaming form with `stages` ring stages of `chunk` k and
// `split` CTAs per cluster along k, its slice and grid recomputed, launched as a programmatic
// dependent or not (a plan that cannot stream stays as it was, its rule saying so).
GemmPlan with_stream(GemmPlan plan, int stages, int chunk, int split, bool pdl = true);

// A SIMT or float64 plan with its k cut into `split` CTAs (workspace_bytes set to the
// planes'); other plans unchanged.
GemmPlan with_split_k(GemmPlan plan, int split);

// A wgmma plan on tile 128 x bn (cluster_m 1, one CTA per SM) whose partial last wave is split
// along k `split` ways (0: as many as the idle SMs allow), or the plan unchanged with its rule
// saying why not (whole waves, or a split the SMs or the k-tiles cannot hold).
GemmPlan with_tail_split(GemmPlan plan, int bn, int split, const GemmDevice& dev);

}  // namespace cuops::kernels
