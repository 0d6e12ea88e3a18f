// The canonical GEMM problem the fast kernels see (kernels/gemm/gemm.cuh) and their epilogue stores
// into (kernels/gemm/epilogue.cuh): its own header so both include it.
#pragma once

#include <cstdint>

#include "kernels/kernels.h"

namespace cuops::kernels::detail {

// The fast kernels see C row-major (unit column stride; a column-major C is handled by computing
// C^T = B^T A^T). Each operand is one of two layouts, a template parameter so every address is a
// compile-time form: A [m, k] "k-major" (row-major, a[i][k] at i*lda + k) or "m-major" (a.t() of a
// row-major tensor, a[i][k] at k*lda + i); B [k, n] "n-major" (row-major) or "k-major" (b.t()).
// Every operand's base is 16-byte aligned and its leading stride a multiple of 16 bytes, so every
// 16-byte chunk along the contiguous axis is an aligned load (the planner checks).
struct GemmProblem {
  int64_t m, n, k;
  const void* a;
  int64_t lda;
  const void* b;
  int64_t ldb;
  void* c;
  int64_t ldc;
  float alpha, beta;
  double alpha64, beta64;  // the same scalars unrounded, for the float64 kernel
  void* workspace;         // GemmPlan::workspace_bytes of device memory (the split tail), or null
};

// What a fused epilogue (epilogue.cuh's BiasActivation, Gated) reads besides the accumulators:
// the bias ([n] in c's type, or null), the activation, and whether it keeps what the backward
// needs (the pre-activation; the dual GEMM's two products) in the auxiliary outputs.
struct FusedArgs {
  const void* bias;
  Activation act;
  bool keep;
};

}  // namespace cuops::kernels::detail
