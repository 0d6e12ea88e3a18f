// The small-M GEMM: out[t][o] = alpha * sum_k x[t][k] w(o, k) + beta * out[t][o] for at most
// kSkinnyMaxTokens tokens t (a decode step's x @ W.t() and g @ W, gemm_plan.h). Such a product is
// bound by reading the weight once, so everything here serves the stream. Two families:
//   - the streaming form (every dtype on sm_90, gemm_skinny_tma.cu): a producer warp keeps a ring
//     of TMA stages (64 outputs x 128 k of the weight, and x's tokens at the same k) full, four warps
//     multiply them, on the tensor cores (bf16/fp16/TF32; float64 by DMMA with float64 sums, its only
//     form) or by FP32 FMAs (float32 "highest");
//     ~72 KB in flight per CTA, within 2-5 % of a TMA read that does nothing else
//     (bench/sweep/probe/stream_probe.cu, at commit 4588424);
//   - the per-lane forms (GPUs before sm_90, operands TMA cannot describe; gemm_skinny_lanes.cu):
//     each lane loads its own 16-byte vectors (16-bit: into registers, two chunks ahead; float32: a
//     per-warp cp.async ring).
// Both:
//   - k is split where the outputs alone cannot fill the SMs: over the warps of a block (per-lane
//     forms), then over the CTAs of a cluster (sm_90), and the partial sums meet in shared memory
//     (the cluster's distributed shared memory) in a fixed order, so the bits are the same on every
//     run and nothing is written to global memory but the result (no workspace, no counters:
//     CUDA-graph replays just work);
//   - bf16/fp16 multiply on the tensor cores (mma.sync m16n8k16, float32 accumulation, the swapped
//     product out^T = W x^T so the weight is the 16-row operand and the tokens the 8-wide one). In the
//     per-lane forms a product's sum over k may take its terms in any order as long as both operands
//     agree, so each lane's 16-byte vectors go into the fragments as they are (the k-contiguous
//     weight), or after a byte permute (the o-contiguous one): no shared memory, no ldmatrix;
//   - float32 in the per-lane forms (both "highest" and TF32, which may compute in true FP32 and there
//     does) runs FP32 FMAs.
//
// This header: the kernels' view of the product (Skinny), what both families share (the warp
// reduction, the output's stores over a cluster; the tensor-core product is gemm.cuh's mma16816), and
// their launchers, which gemm_skinny.cu's launch_gemm_skinny calls.
#pragma once

#include "gemm.cuh"

namespace cuops::kernels::detail {

// The kernel's view of the product: tokens x rows k-contiguous (x[t][k] at t * ldx + k); the weight
// k-contiguous (w(o, k) at o * ldw + k) or o-contiguous (at k * ldw + o); out[t][o] at
// t * ldo_t + o * ldo_n. k of slice s: [s * slice, (s + 1) * slice) within [0, k).
struct Skinny {
  int64_t tokens, outputs, k;
  const void* x;
  int64_t ldx;
  const void* w;
  int64_t ldw;
  void* out;
  int64_t ldo_t, ldo_n;
  float alpha, beta;
  double alpha64, beta64;  // the same scalars unrounded, for float64
  int64_t slice;
  int rw, kw;
};

// A fused epilogue's operands (plan.fused: 16-bit, the streaming form, the weight k-contiguous; the
// kernel's E names which), apart from Skinny so the plain kernels' parameters stay as they were:
// bias [outputs] or null and act (BiasActivation); w2, the second weight (Gated: ldw as w; a
// CTA's 64 rows are 32 outputs of each weight); aux / aux2 the kept products [tokens, ld_aux] or null.
struct SkinnyFusion {
  const void* bias;
  Activation act;
  const void* w2;
  void* aux;
  void* aux2;
  int64_t ld_aux;
};

// The plan's form for its dtype: the per-lane forms (gemm_skinny_lanes.cu) and the streaming form
// (gemm_skinny_tma.cu, which also runs the fused plans, f their operands). cudaErrorInvalidValue for
// a plan neither instance takes.
cudaError_t launch_skinny_lanes(const GemmPlan& plan, const Skinny& s, cudaStream_t stream);
cudaError_t launch_skinny_tma(const GemmPlan& plan, const Skinny& s, const SkinnyFusion& f,
                              cudaStream_t stream);

namespace {

// Sums v[] (kN values per lane) over the warp's 32 lanes, halving the values each lane keeps at
// every exchange: afterwards a lane holds max(1, kN / 32) sums, of the values at index
// lane * kN / 32 + i (kN >= 32) or lane / (32 / kN) (kN < 32). Each sum is taken in one fixed order.
// With kHi / kLo, over the lanes that differ only in the bits from kHi down to kLo (powers of two):
// the same with `lane` read as those bits' number and 32 as the lanes in such a group.
template <int kN, int kHi = 16, int kLo = 1>
__device__ __forceinline__ void warp_reduce_scatter(float (&v)[kN], int lane) {
  int len = kN;
#pragma unroll
  for (int off = kHi; off >= kLo; off >>= 1) {
    if (len > 1) {
      const int half = len / 2;
      const bool upper = lane & off;
#pragma unroll
      for (int i = 0; i < kN / 2; ++i) {
        if (i < half) {
          const float keep = upper ? v[i + half] : v[i], send = upper ? v[i] : v[i + half];
          v[i] = keep + __shfl_xor_sync(0xffffffffu, send, off);
        }
      }
      len = half;
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], off);
    }
  }
}

#if __CUDA_ARCH__ >= 900
// The sum at `local` (this CTA's shared memory) in the shared memory of cluster CTA `rank`.
__device__ __forceinline__ float ld_cluster(const float* local, int rank) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n"
               : "=f"(v)
               : "r"(map_cluster(smem_addr(local), rank)));
  return v;
}
__device__ __forceinline__ double ld_cluster(const double* local, int rank) {
  double v;
  asm volatile("ld.shared::cluster.f64 %0, [%1];\n"
               : "=d"(v)
               : "r"(map_cluster(smem_addr(local), rank)));
  return v;
}
#endif

// Writes the block's outputs for every token from the sums that sum_at(t, o) points to in this CTA's
// shared memory (all of them written before the call), o < outs: with E Plain, outputs
// [blockIdx.x * outs, + outs), alpha times the sum plus beta times out; with a fused E, the
// epilogue's (epilogue.cuh's `one` members; Gated: outputs [blockIdx.x * outs / 2, + outs / 2),
// the gate's sum at o and the up product's at o + outs / 2). With a cluster along k (gridDim.y
// CTAs), each CTA stores a share and every output's sum is taken over the cluster in rank order,
// whichever CTA finishes it. All threads of the block call. block: the block of outputs (-1:
// blockIdx.x; the grouped kernel's block within its slot).
template <typename T, int MT, GemmEpilogue E = GemmEpilogue::Plain, typename SumAt>
__device__ __forceinline__ void store_outputs(const Skinny& s, int outs, SumAt&& sum_at,
                                              const SkinnyFusion* f = nullptr, int64_t block = -1) {
  const int split = static_cast<int>(gridDim.y);
  int rank = 0;
#if __CUDA_ARCH__ >= 900
  if (split > 1) {
    cluster_sync();
    rank = static_cast<int>(cluster_rank());
  }
#else
  if (split > 1)
    __trap();  // the planner splits over clusters only where they exist (GemmDevice::clusters)
#endif
  __syncthreads();
  // Output element e: token e / stored, output e % stored (consecutive threads along o).
  const int threads = static_cast<int>(blockDim.x);
  const int stored = E == GemmEpilogue::Gated ? outs / 2 : outs;
  for (int e = static_cast<int>(threadIdx.x) + rank * threads; e < MT * stored;
       e += threads * split) {
    const int t = e / stored, o = e % stored;
    const int64_t og = (block < 0 ? int64_t{blockIdx.x} : block) * stored + o;
    if (t >= s.tokens || og >= s.outputs) continue;
    auto total = [&](int oo) {
      const acc_t<T>* sum = sum_at(t, oo);
      acc_t<T> v = *sum;
#if __CUDA_ARCH__ >= 900
      if (split > 1) {
        v = ld_cluster(sum, 0);
        for (int c = 1; c < split; ++c) v += ld_cluster(sum, c);
      }
#endif
      return v;
    };
    if constexpr (E == GemmEpilogue::Plain) {
      const acc_t<T> v = total(o);
      T* dst = static_cast<T*>(s.out) + t * s.ldo_t + og * s.ldo_n;
      if constexpr (std::is_same_v<T, double>) {
        Epilogue::one(s.alpha64, s.beta64, dst, v);
      } else {
        Epilogue::one(s.alpha, s.beta, dst, v);
      }
      continue;
    }
    T* dst = static_cast<T*>(s.out) + t * s.ldo_t + og * s.ldo_n;
    if constexpr (E == GemmEpilogue::BiasActivation) {
      T* aux = f->aux != nullptr ? static_cast<T*>(f->aux) + t * f->ld_aux + og : nullptr;
      const T* bias = f->bias != nullptr ? static_cast<const T*>(f->bias) + og : nullptr;
      BiasActivation::one(f->act, s.alpha, bias, dst, aux, total(o));
    } else if constexpr (E == GemmEpilogue::Gated) {
      const int64_t at = t * f->ld_aux + og;
      T* aux = f->aux != nullptr ? static_cast<T*>(f->aux) + at : nullptr;
      T* aux2 = f->aux2 != nullptr ? static_cast<T*>(f->aux2) + at : nullptr;
      Gated::one(f->act, s.alpha, dst, aux, aux2, total(o), total(o + stored));
    }
  }
#if __CUDA_ARCH__ >= 900
  if (split > 1) cluster_sync();  // no CTA leaves while another may still read its shared memory
#endif
}

}  // namespace
}  // namespace cuops::kernels::detail
