// The GEMM epilogue: what becomes of the accumulators once a tile's products are summed. One home,
// so that a fused op (a bias, an activation, a second accumulator, a loss) is one new type here
// instead of edits to every kernel's stores.
//
// Kernels hand it their accumulators as pairs (two adjacent columns c, c + 1 of one row r of C, as
// every mma fragment, SIMT tile and split-plane sum holds them; float, or double for float64) or
// as single elements (the small-M kernel, a thread per output). An epilogue type has
//   1. the per-element step: alpha * acc + beta * old c (LinearCombination); a bias column and an
//      activation (BiasActivation); two accumulators combined (Gated, SwiGLU's dual GEMM);
//   2. loads: the old c, only where beta != 0 (c may be NaN or unwritten); the bias;
//   3. stores: to c directly, to c transposed (TF32's C^T = B^T A^T) or packed into shared memory
//      for a staged TMA store; the fused ones also to the auxiliary tensors the backward keeps;
//   4. reductions across a tile: none yet. linear_cross_entropy's row statistics (running max and
//      sum of exponentials, the target's logit) run in their own pass over each chunk of logits
//      (kernels/loss/cross_entropy.cu); here, combined in a fixed order with no float atomics, they
//      would save that pass one read of the chunk.
// The fused epilogues run on the wgmma kernel (kernels/gemm/gemm_wgmma.cuh, store_unit_fused).
// Members are static and __forceinline__, take the accumulators by value and keep the operation
// order the kernels had inline (moving them here left every kernel's SASS as it was:
// tools/sass_digest.py --diff). A pair member checks r < m and col < n itself (col even; col + 1
// may lie past n); the staged pair has no bounds (the TMA store skips what lies past the edges).
#pragma once

#include "activation.cuh"
#include "kernels/common.cuh"
#include "gemm_problem.h"

namespace cuops::kernels::detail {

// The mm / gemm epilogue: c = alpha * acc + beta * c, rounded once to c's type; beta == 0 never
// reads c.
struct LinearCombination {
  // c[r][col], c[r][col + 1] <- alpha * (v0, v1) + beta * old, for the pair's elements in bounds.
  // One access where the pair is aligned for it (float: 8 bytes; bfloat16 / float16: 4 bytes, the
  // packed pair; double, with alpha64 / beta64: 16 bytes), else one per element (an odd ldc leaves
  // every other row's pairs unaligned).
  template <typename T> static __device__ __forceinline__ void pair(const GemmProblem& p, int64_t r,
                                                                    int64_t col, acc_t<T> v0,
                                                                    acc_t<T> v1) {
    if (r >= p.m || col >= p.n) return;
    T* dst = static_cast<T*>(p.c) + r * p.ldc + col;
    if constexpr (std::is_same_v<T, float>) {
      if (col + 1 < p.n) {
        put_pair(p, dst, v0, v1);
      } else {
        put_one(p, dst, v0);
      }
    } else if constexpr (std::is_same_v<T, double>) {
      v0 *= p.alpha64;
      v1 *= p.alpha64;
      if (col + 1 < p.n && (reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
        if (p.beta64 != 0.0) {
          const double2 old = *reinterpret_cast<const double2*>(dst);
          v0 = fma(p.beta64, old.x, v0);
          v1 = fma(p.beta64, old.y, v1);
        }
        *reinterpret_cast<double2*>(dst) = make_double2(v0, v1);
        return;
      }
      if (p.beta64 != 0.0) v0 = fma(p.beta64, dst[0], v0);
      dst[0] = v0;
      if (col + 1 < p.n) {
        if (p.beta64 != 0.0) v1 = fma(p.beta64, dst[1], v1);
        dst[1] = v1;
      }
    } else {
      v0 *= p.alpha;
      v1 *= p.alpha;
      if (col + 1 < p.n && (reinterpret_cast<uintptr_t>(dst) & 3) == 0) {
        if (p.beta != 0.f) {
          const float2 old = unpack_pair(*reinterpret_cast<const uint32_t*>(dst), T{});
          v0 = fmaf(p.beta, old.x, v0);
          v1 = fmaf(p.beta, old.y, v1);
        }
        *reinterpret_cast<uint32_t*>(dst) = pack_pair(v0, v1, T{});
        return;
      }
      if (p.beta != 0.f) v0 = fmaf(p.beta, to_acc(dst[0]), v0);
      dst[0] = from_acc<T>(v0);
      if (col + 1 < p.n) {
        if (p.beta != 0.f) v1 = fmaf(p.beta, to_acc(dst[1]), v1);
        dst[1] = from_acc<T>(v1);
      }
    }
  }

  // The same pair of a transposed float problem (c^T = b^T a^T computed, c stored): elements
  // (r, col) and (r, col + 1) of c^T are c[col][r] and c[col + 1][r], ldc apart, so two 4-byte
  // accesses.
  static __device__ __forceinline__ void pair_transposed(const GemmProblem& p, int64_t r,
                                                         int64_t col, float v0, float v1) {
    if (r >= p.m || col >= p.n) return;
    float* dst = static_cast<float*>(p.c) + col * p.ldc + r;
    put_one(p, dst, v0);
    if (col + 1 < p.n) put_one(p, dst + p.ldc, v1);
  }

  // Rows r, r + 1 and columns col, col + 1 of c^T (vRC: row R, column C) into c, whose rows col and
  // col + 1 then each take a pair (r even: 8-byte accesses where ldc and c allow).
  static __device__ __forceinline__ void quad_transposed(const GemmProblem& p, int64_t r,
                                                         int64_t col, float v00, float v01,
                                                         float v10, float v11) {
    if (r + 1 >= p.m) {
      pair_transposed(p, r, col, v00, v01);
      return;
    }
    if (col >= p.n) return;
    float* dst = static_cast<float*>(p.c) + col * p.ldc + r;
    put_pair(p, dst, v00, v10);
    if (col + 1 < p.n) put_pair(p, dst + p.ldc, v01, v11);
  }

  // alpha * (v0, v1) rounded to T (bfloat16 / float16) and packed, for a staged TMA store: over c
  // (beta == 0), or added to c by TMA's reduce-add (beta == 1: c + the rounded pair, rounded again
  // in L2); the plan stages no other beta.
  template <typename T>
  static __device__ __forceinline__ uint32_t staged(float alpha, float v0, float v1) {
    return pack_pair(alpha * v0, alpha * v1, T{});
  }

  // One element (the small-M kernel): *dst <- alpha * acc + beta * *dst, rounded once to T; float64
  // takes the unrounded alpha64 / beta64.
  template <typename T>
  static __device__ __forceinline__ void one(acc_t<T> alpha, acc_t<T> beta, T* dst, acc_t<T> acc) {
    if constexpr (std::is_same_v<T, double>) {
      double r = alpha * acc;
      if (beta != 0.0) r = fma(beta, *dst, r);  // beta == 0 never reads out
      *dst = r;
    } else {
      float r = alpha * acc;
      if (beta != 0.f) r = fmaf(beta, to_acc(*dst), r);
      *dst = from_acc<T>(r);
    }
  }

 private:
  // dst[0], dst[1] <- alpha * (v0, v1) + beta * old: one 8-byte access where dst is 8-byte aligned,
  // else two 4-byte ones.
  static __device__ __forceinline__ void put_pair(const GemmProblem& p, float* dst, float v0,
                                                  float v1) {
    v0 *= p.alpha;
    v1 *= p.alpha;
    if ((reinterpret_cast<uintptr_t>(dst) & 7) == 0) {
      if (p.beta != 0.f) {
        const float2 old = *reinterpret_cast<const float2*>(dst);
        v0 = fmaf(p.beta, old.x, v0);
        v1 = fmaf(p.beta, old.y, v1);
      }
      *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
    } else {
      if (p.beta != 0.f) {
        v0 = fmaf(p.beta, dst[0], v0);
        v1 = fmaf(p.beta, dst[1], v1);
      }
      dst[0] = v0;
      dst[1] = v1;
    }
  }
  static __device__ __forceinline__ void put_one(const GemmProblem& p, float* dst, float v) {
    v *= p.alpha;
    if (p.beta != 0.f) v = fmaf(p.beta, dst[0], v);
    dst[0] = v;
  }
};

// The epilogue of mm / gemm, named once.
using Epilogue = LinearCombination;

// linear's epilogue (the wgmma kernel's GemmEpilogue::BiasActivation; the kernel adds the bias):
// the activation over a consumer's accumulators, chosen once per tile (the activation is uniform),
// so each case is a straight run of its math.
struct BiasActivation {
  // One element (the small-M kernel, 16-bit T): z = alpha * acc + bias, kept in *aux where aux is
  // set, act(z) into *dst, each rounded once.
  template <typename T> static __device__ __forceinline__ void one(Activation act, float alpha,
                                                                   const T* bias, T* dst, T* aux,
                                                                   float acc) {
    const float z = bias != nullptr ? fmaf(alpha, acc, to_acc(*bias)) : alpha * acc;
    if (aux != nullptr) *aux = from_acc<T>(z);
    *dst = from_acc<T>(act_forward_fast(act, z));
  }

  template <int N> static __device__ __forceinline__ void activate(Activation act, float (&v)[N]) {
    switch (act) {
      case Activation::None:
        return;
      case Activation::Relu:
        return each<N>(v, [](float z) { return act_forward_fast(Activation::Relu, z); });
      case Activation::Gelu:
        return each<N>(v, [](float z) { return act_forward_fast(Activation::Gelu, z); });
      case Activation::GeluTanh:
        return each<N>(v, [](float z) { return act_forward_fast(Activation::GeluTanh, z); });
      case Activation::Silu:
        return each<N>(v, [](float z) { return act_forward_fast(Activation::Silu, z); });
    }
  }

 private:
  template <int N, typename F> static __device__ __forceinline__ void each(float (&v)[N], F f) {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = f(v[i]);
  }
};

// The gated MLP's epilogue (GemmEpilogue::Gated): the gate and up products of one element combined,
// act(g) * u; act silu (swiglu, the MoE experts) or gelu_tanh (Gemma's GeGLU), the op's, uniform
// over a launch: the switch stands outside the tile's loop, each case its own unrolled loop (as
// BiasActivation::activate), so silu's loop is what it was; the gelu_tanh loop beside it adds
// 390-780 SASS instructions to a dual-GEMM kernel at the same 168 registers, no spill.
struct Gated {
  // d[i] = act(d[i]) * d[H + i], i < H: a lane's gate and up halves of its columns.
  template <int H, int N>
  static __device__ __forceinline__ void combine(Activation act, float (&d)[N]) {
    static_assert(2 * H <= N, "the gate and up halves");
    if (act == Activation::GeluTanh) {
#pragma unroll
      for (int i = 0; i < H; ++i) d[i] = act_forward_fast(Activation::GeluTanh, d[i]) * d[H + i];
    } else {
#pragma unroll
      for (int i = 0; i < H; ++i) d[i] = act_forward_fast(Activation::Silu, d[i]) * d[H + i];
    }
  }
  // One element (the small-M kernel, 16-bit T): g and u scaled by alpha, kept in *aux / *aux2 where
  // set, act(g) * u into *dst, each rounded once.
  template <typename T> static __device__ __forceinline__ void one(Activation act, float alpha,
                                                                   T* dst, T* aux, T* aux2, float g,
                                                                   float u) {
    g *= alpha;
    u *= alpha;
    if (aux != nullptr) *aux = from_acc<T>(g);
    if (aux2 != nullptr) *aux2 = from_acc<T>(u);
    const float a = act == Activation::GeluTanh ? act_forward_fast(Activation::GeluTanh, g)
                                                : act_forward_fast(Activation::Silu, g);
    *dst = from_acc<T>(a * u);
  }
};

}  // namespace cuops::kernels::detail
