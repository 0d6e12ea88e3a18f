// The small-M GEMM (gemm_skinny.cuh): the plan's problem in the kernels' terms (tokens, outputs and
// the output's strides), handed to the form the plan names.
#include "gemm_skinny.cuh"

namespace cuops::kernels::detail {

cudaError_t launch_gemm_skinny(const GemmPlan& plan, const GemmProblem& p, cudaStream_t stream) {
  if (plan.skinny().rw * plan.skinny().kw != kSkinnyWarps || plan.skinny().slice < 1)
    return cudaErrorInvalidValue;
  Skinny s{};
  s.k = p.k;
  s.out = p.c;
  s.alpha = p.alpha, s.beta = p.beta;
  s.alpha64 = p.alpha64, s.beta64 = p.beta64;
  s.slice = plan.skinny().slice;
  s.rw = plan.skinny().rw, s.kw = plan.skinny().kw;
  if (plan.skinny().tokens_m) {  // x = A (k-major), the weight B: out[t][o] = C[t][o]
    s.tokens = p.m, s.outputs = p.n;
    s.x = p.a, s.ldx = p.lda, s.w = p.b, s.ldw = p.ldb;
    s.ldo_t = p.ldc, s.ldo_n = 1;
  } else {  // x = B^T (B k-major), the weight A^T: out[t][o] = C[o][t]
    s.tokens = p.n, s.outputs = p.m;
    s.x = p.b, s.ldx = p.ldb, s.w = p.a, s.ldw = p.lda;
    s.ldo_t = 1, s.ldo_n = p.ldc;
  }
  SkinnyFusion f{};
  if (plan.fused) {  // the streaming form's (gemm_plan.cpp, SmallMFused)
    const GemmFusion& e = plan.req.fusion;
    if (!plan.skinny().tma || !plan.skinny().tokens_m) return cudaErrorInvalidValue;
    f = SkinnyFusion{e.bias, e.act, e.b2, e.aux, e.aux2, e.ld_aux};
  }
  return plan.skinny().tma ? launch_skinny_tma(plan, s, f, stream)
                           : launch_skinny_lanes(plan, s, stream);
}

}  // namespace cuops::kernels::detail
