"""cuops: hand-written CUDA kernels registered as PyTorch operators (torch.ops.cuops.*).

    import torch, cuops
    y = cuops.mm(a, b)            # a typed function over torch.ops.cuops.mm(a, b)
    help(cuops.mm)                # dtypes, shapes, layouts, autograd, errors
    cuops.build_info()            # dict: cuops, torch and CUDA versions, archs, compiler, build type

Every function here calls torch.ops.cuops.<op>, so torch.compile, torch.export and TorchScript see the
registered operator; `cuops.ops` is torch.ops.cuops itself.

Importing loads libcuops.so into torch.ops.cuops; `cuops.library_path` names the file.
- Installed (pip install .): the library inside this package. libcuops is C++ built against one torch
  release, so that version is compared with the running torch first, and a mismatch raises ImportError
  naming both (instead of the dynamic loader's "undefined symbol").
- Source checkout (<repo>/python on sys.path, e.g. PYTHONPATH=python): the build tree's library,
  $CUOPS_LIBRARY if set, else $CUOPS_BUILD_DIR/libcuops.so if set, else <repo>/build/libcuops.so.

Shared by all tensor ops: dtypes float32, float64, float16 and bfloat16 (half types accumulate in
float32), every tensor argument of one dtype and on one device; any strides in (transposed, sliced,
expanded), contiguous outputs; 0-size tensors work; bad input raises RuntimeError whose message starts
with "cuops::<op>:" and names the argument, what was expected and what came.

The full reference for every op (semantics, layouts, aliasing, autograd, autocast, determinism,
errors, DTensor sharding, what runs where on CUDA) is docs/ops.md in the cuops source tree.
"""
import contextlib
import json
from collections.abc import Iterator
from typing import Any, Optional

import torch

from ._library import load as _load

library_path, __version__, TORCH_VERSION, CUDA_ARCHITECTURES = _load()
ops = torch.ops.cuops


def register_sharding() -> bool:
    """Registers the DTensor sharding rules of the cuops ops (python/cuops/_sharding.py) once; `import
    cuops` calls it. A program that loads libcuops itself (torch.ops.load_library) and wants tensor
    parallelism calls it after the load. False where this torch has no DTensor."""
    from . import _sharding

    return _sharding.register()


register_sharding()

__all__ = [
    "add2",
    "vector_add",
    "scale",
    "square",
    "two_norm",
    "gemm",
    "mm",
    "linear",
    "swiglu",
    "lora_linear",
    "lora_swiglu",
    "linear_cross_entropy",
    "rms_norm",
    "add_rms_norm",
    "rotary",
    "grouped_mm",
    "moe_topk_softmax",
    "moe_experts",
    "patch",
    "patch_report",
    "build_info",
    "set_switch",
    "switch",
    "register_sharding",
    "ops",
    "library_path",
    "__version__",
    "TORCH_VERSION",
    "CUDA_ARCHITECTURES",
]


def add2(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """Writes a + b into c, elementwise: c <- a + b (docs/ops.md#add2).

    Args:
        c: the output, written in place; the shape, dtype and device of a. It may be a or b itself;
            any other overlap with a or b, or an output that overlaps itself (an expanded view), is an
            error.
        a: any shape, any strides.
        b: the shape of a (no broadcasting).

    Dtypes: float32, float64, float16, bfloat16 (half types add in float32 and round once).

    Autograd: not differentiable. With grad mode on, c, a or b requiring grad is an error; use
    vector_add, or run under torch.no_grad().

    Raises:
        RuntimeError: "cuops::add2: ..." for another dtype, mixed dtypes or devices, unequal shapes, the
            overlaps above, or an input requiring grad.

    Calls torch.ops.cuops.add2.
    """
    torch.ops.cuops.add2(c, a, b)


def vector_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a + b, elementwise, as a new tensor (docs/ops.md#vector_add).

    Args:
        a: any shape, any strides.
        b: the shape, dtype and device of a (no broadcasting).

    Returns:
        A new contiguous tensor of a's shape and dtype.

    Dtypes: float32, float64, float16, bfloat16 (half types add in float32 and round once).

    Autograd: differentiable; the gradient of each input is the output's gradient g.

    Raises:
        RuntimeError: "cuops::vector_add: ..." for another dtype, mixed dtypes or devices, or unequal
            shapes.

    Calls torch.ops.cuops.vector_add.
    """
    return torch.ops.cuops.vector_add(a, b)


def scale(x: torch.Tensor, alpha: float = 2.0) -> torch.Tensor:
    """alpha * x, elementwise, as a new tensor (docs/ops.md#scale). The default alpha doubles x.

    Args:
        x: any shape, any strides.
        alpha: the factor (a Python float, not a tensor).

    Returns:
        A new contiguous tensor of x's shape and dtype.

    Dtypes: float32, float64, float16, bfloat16 (half types multiply in float32 and round once).

    Autograd: differentiable in x; the gradient is alpha * g.

    Raises:
        RuntimeError: "cuops::scale: ..." for another dtype.

    Calls torch.ops.cuops.scale.
    """
    return torch.ops.cuops.scale(x, alpha)


def square(x: torch.Tensor) -> torch.Tensor:
    """x * x, elementwise, as a new tensor of any shape (docs/ops.md#square).

    Args:
        x: any shape, any strides.

    Returns:
        A new contiguous tensor of x's shape and dtype.

    Dtypes: float32, float64, float16, bfloat16 (half types multiply in float32 and round once).

    Autograd: differentiable; the gradient is 2 * x * g.

    Raises:
        RuntimeError: "cuops::square: ..." for another dtype.

    Calls torch.ops.cuops.square.
    """
    return torch.ops.cuops.square(x)


def two_norm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The Euclidean norm ||a - b||_2 over all elements, as a 0-dim tensor (docs/ops.md#two_norm).

    Args:
        a: any shape, any strides.
        b: the shape, dtype and device of a (no broadcasting).

    Returns:
        A 0-dim tensor of a's dtype; 0 for empty inputs. Deterministic: the reduction order is fixed, so
        the same inputs give the same bits on every run.

    Dtypes: float32, float64, float16, bfloat16 (half types accumulate in float32). Under CUDA autocast
    it runs in float32, like torch's norms.

    Autograd: differentiable; grad_a = g * (a - b) / ||a - b|| and grad_b = -grad_a, both 0 where the
    norm is 0.

    Raises:
        RuntimeError: "cuops::two_norm: ..." for another dtype, mixed dtypes or devices, or unequal
            shapes.

    Calls torch.ops.cuops.two_norm.
    """
    return torch.ops.cuops.two_norm(a, b)


def gemm(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0, beta: float = 0.0) -> None:
    """Writes alpha * (a @ b) + beta * c into c: the in-place, BLAS-style GEMM (docs/ops.md#gemm).

    Args:
        c: the [M, N] output, written in place. With beta = 0 its old contents are ignored, NaN
            included. It must not overlap a or b (not even be one of them), nor itself (an expanded
            view).
        a: the [M, K] left operand.
        b: the [K, N] right operand.
        alpha: scales the product.
        beta: scales c's old contents.

    Dtypes: float32, float64, float16, bfloat16, all three tensors one dtype. Half types run on tensor
    cores on CUDA and accumulate in float32. float32 precision follows
    torch.get_float32_matmul_precision(), like torch.mm: "highest" is true FP32, "high" and "medium"
    may use TF32 tensor cores.

    Layout: any strides; transposed operands (a.t(), b.t()) are read in place on CUDA, with the
    exceptions docs/ops.md#what-runs-where-gemm-and-mm-on-cuda lists (what is copied, and when).

    Autograd: not differentiable. With grad mode on, c, a or b requiring grad is an error; use mm, or
    run under torch.no_grad().

    Raises:
        RuntimeError: "cuops::gemm: ..." for operands that are not 2-D, inner dimensions that differ, a c
            not of shape [M, N], another dtype, mixed dtypes or devices, the overlaps above, or an
            input requiring grad.

    Calls torch.ops.cuops.gemm.
    """
    torch.ops.cuops.gemm(c, a, b, alpha, beta)


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The matrix product a @ b as a new tensor: the functional, differentiable GEMM (docs/ops.md#mm).

    Args:
        a: the [M, K] left operand.
        b: the [K, N] right operand, a's dtype and device.

    Returns:
        A new contiguous [M, N] tensor of a's dtype (K = 0 gives zeros).

    Dtypes: float32, float64, float16, bfloat16. Half types run on tensor cores on CUDA and accumulate
    in float32. float32 precision follows torch.get_float32_matmul_precision(), like torch.mm:
    "highest" is true FP32, "high" and "medium" may use TF32 tensor cores. Under CUDA autocast it runs
    in the autocast dtype, like torch.mm.

    Layout: any strides; transposed operands (a.t(), b.t()) are read in place on CUDA, with the
    exceptions docs/ops.md#what-runs-where-gemm-and-mm-on-cuda lists (what is copied, and when).

    Autograd: differentiable; grad_a = g @ b.T and grad_b = a.T @ g, computed with cuops.mm, so the
    backward is differentiable too.

    Raises:
        RuntimeError: "cuops::mm: ..." for operands that are not 2-D, inner dimensions that differ,
            another dtype, or mixed dtypes or devices.

    Calls torch.ops.cuops.mm.
    """
    return torch.ops.cuops.mm(a, b)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
           activation: str = "none") -> torch.Tensor:
    """act(x @ weight.T + bias): nn.Linear followed by its activation, in one op (docs/ops.md#linear).

    Args:
        x: the [..., K] input (leading dimensions are flattened into rows).
        weight: the [N, K] weight, as nn.Linear keeps it (read in place).
        bias: an optional [N] bias.
        activation: "none", "relu", "gelu" (erf), "gelu_tanh" or "silu".

    Returns:
        A new [..., N] tensor of x's dtype.

    Dtypes: float32, float64, float16, bfloat16, all tensors one dtype; half types accumulate, add
    the bias and apply the activation in float32. Under CUDA autocast every tensor is cast to the
    autocast dtype as F.linear does (a float32 master weight through autocast's cache); outside it a
    float32 weight with a half x is an error naming both dtypes.

    Autograd: differentiable in x, weight and bias; the pre-activation is kept for the backward only
    when there is an activation and a gradient is required.

    Raises:
        RuntimeError: "cuops::linear: ..." for a bad shape, dtype or device, or an activation not in
            the list (the message lists them).

    Calls torch.ops.cuops.linear.
    """
    return torch.ops.cuops.linear(x, weight, bias, activation)


def swiglu(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    """act(x @ w_gate.T) * (x @ w_up.T): a gated MLP's gate and up projections, act silu (SwiGLU:
    Llama, Qwen, Mistral, Phi-3) or gelu_tanh (GeGLU: Gemma) (docs/ops.md#swiglu).

    Args:
        x: the [..., K] input (leading dimensions are flattened into rows).
        w_gate: the [I, K] gate projection's weight, as nn.Linear keeps it (read in place).
        w_up: the [I, K] up projection's weight, the same shape (read in place).
        activation: the gate, "silu" (F.silu) or "gelu_tanh" (F.gelu(approximate="tanh"), HF's
            gelu_pytorch_tanh).

    Returns:
        A new [..., I] tensor of x's dtype.

    Dtypes: float32, float64, float16, bfloat16, all tensors one dtype; half types accumulate both
    products and form act(g) * u in float32. Under CUDA autocast every tensor is cast to the
    autocast dtype as F.linear does (float32 master weights through autocast's cache); outside it a
    float32 weight with a half x is an error naming both dtypes.

    Autograd: differentiable in x, w_gate and w_up; the products g = x @ w_gate.T and u = x @ w_up.T
    are kept for the backward only when a gradient is required.

    Raises:
        RuntimeError: "cuops::swiglu: ..." for a bad shape, dtype or device (w_gate and w_up of
            different shapes, or K not x's last dimension), or another activation.

    Calls torch.ops.cuops.swiglu.
    """
    return torch.ops.cuops.swiglu(x, w_gate, w_up, activation)


def lora_linear(x: torch.Tensor, weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                bias: Optional[torch.Tensor] = None, activation: str = "none",
                lora_x: Optional[torch.Tensor] = None) -> torch.Tensor:
    """act(x @ weight.T + (lora_x @ lora_a.T) @ lora_b.T + bias): a Linear with a LoRA adapter, the
    adapter's rank-R update inside the same GEMM as an extra K chunk (docs/ops.md#lora_linear).

    Args:
        x: the [..., K] input.
        weight: the [N, K] base weight (PEFT's frozen base_layer.weight).
        lora_a: the adapter's [R, K] A (PEFT's lora_A.weight).
        lora_b: the adapter's [N, R] B with its scale folded in (scaling * lora_B.weight).
        bias: an optional [N] bias.
        activation: none, relu, gelu, gelu_tanh or silu, as cuops.linear's.
        lora_x: the adapter's input where it is not x (PEFT's dropout of x), x's shape.

    Returns:
        A new [..., N] tensor of x's dtype.

    Dtypes: float32, float64, float16, bfloat16, all tensors one dtype; half types accumulate in
    float32, lora_x @ lora_a.T rounded to x's dtype first (as PEFT's lora_A output is). Under CUDA
    autocast every tensor is cast to the autocast dtype, as F.linear does.

    Autograd: differentiable in every tensor; what needs no gradient costs no product (a frozen
    weight: none). x's gradient is the base's and the adapter's, lora_x's the adapter's alone.

    Raises:
        RuntimeError: "cuops::lora_linear: ..." for a bad shape, dtype or device.

    Calls torch.ops.cuops.lora_linear.
    """
    return torch.ops.cuops.lora_linear(x, weight, lora_a, lora_b, bias, activation, lora_x)


def lora_swiglu(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, lora_a: torch.Tensor,
                lora_b_gate: torch.Tensor, lora_b_up: torch.Tensor,
                lora_x: Optional[torch.Tensor] = None, activation: str = "silu") -> torch.Tensor:
    """act(x @ w_gate.T + (lora_x @ lora_a.T) @ lora_b_gate.T) * (x @ w_up.T + (lora_x @ lora_a.T) @
    lora_b_up.T): swiglu with LoRA adapters on its gate and up projections, both in the same dual GEMM
    (docs/ops.md#lora_swiglu).

    Args:
        x: the [..., K] input.
        w_gate, w_up: the [I, K] base weights.
        lora_a: the adapters' A stacked, [R, K] (the gate's rows, then the up projection's).
        lora_b_gate, lora_b_up: [I, R] each, the adapter's scaled B in its own columns and zeros in the
            other's (so one [rows, R] product lora_x @ lora_a.T serves both).
        lora_x: the adapters' input where it is not x (PEFT's dropout of x), x's shape.
        activation: the gate, "silu" or "gelu_tanh", as cuops.swiglu's.

    Returns:
        A new [..., I] tensor of x's dtype.

    Dtypes: float32, float64, float16, bfloat16, all tensors one dtype (as cuops.swiglu's); under CUDA
    autocast every tensor is cast to the autocast dtype.

    Autograd: differentiable in every tensor; what needs no gradient costs no product.

    Raises:
        RuntimeError: "cuops::lora_swiglu: ..." for a bad shape, dtype or device.

    Calls torch.ops.cuops.lora_swiglu.
    """
    return torch.ops.cuops.lora_swiglu(x, w_gate, w_up, lora_a, lora_b_gate, lora_b_up, lora_x, activation)


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                         bias: Optional[torch.Tensor] = None, ignore_index: int = -100,
                         reduction: str = "mean", softcap: Optional[float] = None) -> torch.Tensor:
    """F.cross_entropy(F.linear(x, weight, bias).float(), target): a language model's loss without its
    [T, V] logits (docs/ops.md#linear_cross_entropy); with softcap c, of the logits c * tanh(z / c).

    Args:
        x: the [..., K] hidden states (leading dimensions are flattened into tokens).
        weight: the [V, K] output projection (an LM head's weight, as nn.Linear keeps it).
        target: int64 token ids shaped like x's leading dimensions.
        bias: an optional [V] bias.
        ignore_index: a target value whose token adds nothing to the loss or the gradients.
        reduction: "mean" (over the tokens not ignored; NaN when all are, as torch), "sum" or "none"
            (a loss per token, shaped like target).
        softcap: c > 0 reads each logit z (bias added) as c * tanh(z / c), in float32 for half types
            (Gemma 2 / 3's final_logit_softcapping); None: the logits as they are.

    Returns:
        The loss: float32 for float16 / bfloat16 inputs, else x's dtype.

    Dtypes: float32, float64, float16, bfloat16 (x, weight and bias one dtype); the softmax runs in
    float32 for half types. Under CUDA autocast x, weight and bias are cast to the autocast dtype as
    F.linear does (a float32 master weight through autocast's cache). Memory: the logits are made a
    vocabulary chunk at a time and never held whole.

    Autograd: differentiable in x, weight and bias; the backward keeps the inputs and each token's
    log-sum-exp, not the logits.

    Raises:
        RuntimeError: "cuops::linear_cross_entropy: ..." for a bad shape, dtype or device, a
            reduction not in the list, a softcap not > 0, or (on the CPU) a target outside [0, V) that is not
            ignore_index; on CUDA such a token's loss is NaN (no device assert, no host sync).

    Calls torch.ops.cuops.linear_cross_entropy.
    """
    return torch.ops.cuops.linear_cross_entropy(x, weight, target, bias, ignore_index, reduction, softcap)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
             dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """x / sqrt(mean(x**2, -1) + eps) * weight: Hugging Face's RMSNorm (LlamaRMSNorm) in one pass
    (docs/ops.md#rms_norm).

    Args:
        x: the [..., D] input.
        weight: the [D] scale.
        eps: added to the mean square.
        dtype: the result's dtype instead of the default: the half type the next GEMM reads under
            autocast, so no cast pass follows (the values are the default result's cast to it; the
            gradient comes back in it).

    Returns:
        A new [..., D] tensor in torch.promote_types(x.dtype, weight.dtype) (or dtype): x's dtype when
        the weight has it, float32 for a half x with a float32 weight (what `weight *
        normed.to(x.dtype)` returns).

    Dtypes: float32, float64, float16, bfloat16, mixes allowed; the math in float32 (float64 for
    float64), rounded once. Under autocast nothing is cast (as aten::rms_norm).

    Autograd: differentiable in x and weight; the backward keeps x, the weight and 1 / rms per row.

    Raises:
        RuntimeError: "cuops::rms_norm: ..." for a bad shape, dtype or device, or eps < 0.

    Calls torch.ops.cuops.rms_norm.
    """
    return torch.ops.cuops.rms_norm(x, weight, eps, dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float = 1e-6, dtype: Optional[torch.dtype] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual, weight, eps), x + residual): a pre-norm block's residual add and the
    norm after it in one pass (docs/ops.md#add_rms_norm).

    Args:
        x: the [..., D] sublayer output.
        residual: the [..., D] residual stream (x's shape).
        weight: the [D] scale.
        eps: added to the mean square.
        dtype: the norm's dtype instead of the default (the half type the next GEMM reads under
            autocast: the default norm's values cast to it, without the cast's pass).

    Returns:
        (the norm, the sum): the sum in torch.promote_types(x.dtype, residual.dtype), rounded to it
        before the norm reads it (as `residual + x` is); the norm in the promotion of that and the
        weight's dtype, or dtype.

    Dtypes: float32, float64, float16, bfloat16, mixes allowed (a bfloat16 or float16 x beside a
    float32 residual stream and weight, as Hugging Face has under autocast); the math in float32
    (float64 for float64). Under autocast nothing is cast.

    Autograd: differentiable in x, residual and weight through both outputs; the sum's gradient and
    the norm's meet in one backward pass, and x and residual get it in their own dtypes.

    Raises:
        RuntimeError: "cuops::add_rms_norm: ..." for a bad shape, dtype or device, or eps < 0.

    Calls torch.ops.cuops.add_rms_norm.
    """
    return torch.ops.cuops.add_rms_norm(x, residual, weight, eps, dtype)


def rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
           dtype: Optional[torch.dtype] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Hugging Face's apply_rotary_pos_emb: (q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin)
    with cos and sin broadcast over the heads (docs/ops.md#rotary).

    Args:
        q: the [B, Hq, T, D] queries.
        k: the [B, Hk, T, D] keys (Hk may differ from Hq: grouped-query attention).
        cos: the [B or 1, T, D] cosines (LlamaRotaryEmbedding's output).
        sin: the [B or 1, T, D] sines, cos's shape and dtype.
        dtype: the outputs' dtype instead of the default: the half type attention reads under
            autocast, so no cast pass follows (the values are the default result's cast to it; the
            gradients come back in it).

    Returns:
        (q rotated, k rotated) in torch.promote_types(q.dtype, cos.dtype) (or dtype): a bf16 q with
        float32 cos gives float32, as Hugging Face's code does under autocast.

    Dtypes: float32, float64, float16, bfloat16 (q and k one dtype, cos and sin one dtype); the math
    in float32 (float64 for float64), rounded once. Under autocast nothing is cast.

    Autograd: differentiable in q, k, cos and sin; the backward keeps cos and sin (q and k too when
    cos or sin need a gradient).

    Raises:
        RuntimeError: "cuops::rotary: ..." for a bad shape, dtype or device, or an odd D.

    Calls torch.ops.cuops.rotary.
    """
    return torch.ops.cuops.rotary(q, k, cos, sin, dtype)


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """A grouped matrix product with the group sizes on the device, in torch._grouped_mm's two forms
    (docs/ops.md#grouped_mm).

    Args:
        a: [S, K] rows in group order, or [M, S] columns in group order.
        b: [E, K, N], one matrix per group (with a [S, K]), or [S, N] (with a [M, S]).
        offs: int32 or int64 [E] group ends: group e is [offs[e-1], offs[e]), offs[-1] = 0; on a's
            device, never read back to the host (no sync; CUDA-graph capturable).

    Returns:
        [S, N]: row r of group e is a[r] @ b[e], rows past offs[E-1] zeros; or [E, M, N]: group e's
        columns of a times its rows of b (zeros for an empty group). In a's dtype.

    Dtypes: float32, float64, float16, bfloat16 (a and b one dtype), accumulated in float32 (float64
    for float64) and rounded once. Under CUDA autocast a and b are cast as F.linear casts them.
    On CPU offs must be non-decreasing and within [0, S] (a RuntimeError otherwise); on CUDA, where
    checking would need a sync, each end is taken as min(S, the largest of offs[0..e]).

    Autograd: differentiable in a and b (both gradients are grouped products again).

    Raises:
        RuntimeError: "cuops::grouped_mm: ..." for a bad shape, dtype or device (b neither [E, K, N]
            with E offs' length nor [S, N]; offs not int32 or int64), more than 8192 groups, or (CPU)
            ends that decrease or pass S.

    Calls torch.ops.cuops.grouped_mm.
    """
    return torch.ops.cuops.grouped_mm(a, b, offs)


def moe_topk_softmax(logits: torch.Tensor, k: int, renorm: bool = False,
                     weight_dtype: Optional[torch.dtype] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A mixture-of-experts router after its logits: softmax, top-k and the optional renormalisation
    (docs/ops.md#moe_topk_softmax).

    Args:
        logits: the router's [..., E] logits.
        k: how many experts each token takes (1 <= k <= E).
        renorm: divide the k probabilities by their sum (Mixtral; Qwen's norm_topk_prob).
        weight_dtype: the weights' dtype (Qwen and OLMoE cast them to the logits' dtype); default
            the softmax's: float32 (float64 for float64 logits).

    Returns:
        (weights [..., k], indices int64 [..., k]), largest first; equal probabilities go to the
        lower expert index.

    Dtypes: logits float32, float64, float16 or bfloat16; the softmax in float32 (float64 for
    float64), as Hugging Face's routers compute it. Under autocast nothing is cast.

    Autograd: differentiable in logits through the weights (the indices are not differentiable).

    Raises:
        RuntimeError: "cuops::moe_topk_softmax: ..." for k outside [1, E] or a non-floating dtype.

    Calls torch.ops.cuops.moe_topk_softmax.
    """
    return torch.ops.cuops.moe_topk_softmax(logits, k, renorm, weight_dtype)


def moe_experts(x: torch.Tensor, topk_idx: torch.Tensor, topk_w: torch.Tensor, gate_up: torch.Tensor,
                down: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    """A mixture of experts' experts, as Hugging Face's experts modules compute them
    (docs/ops.md#moe_experts): out[t] = sum_j topk_w[t, j] * down[e] @ (act(g) * u) with
    [g | u] = gate_up[e] @ x[t] and e = topk_idx[t, j].

    Args:
        x: the [T, H] tokens.
        topk_idx: int32 or int64 [T, k] expert indices; one outside [0, E) adds nothing (Hugging
            Face's expert-parallel convention).
        topk_w: the [T, k] routing weights (any floating dtype; the sum runs in float32).
        gate_up: [E, 2I, H], each expert's gate rows then its up rows (read in place).
        down: [E, H, I] (read in place).
        activation: "silu" or "gelu_tanh", applied to g.

    Returns:
        A new [T, H] tensor of x's dtype; every shape fixed by the inputs' (no host sync).

    Dtypes: float32, float64, float16, bfloat16 (x, gate_up and down one dtype); products accumulate
    in float32 (float64 for float64); each token's k rows are summed in slot order in float32 and
    rounded once, so the bits repeat. Under CUDA autocast x and both weights are cast as F.linear
    casts them (float32 masters through autocast's cache).

    Autograd: differentiable in x, topk_w, gate_up and down; the backward keeps the gate/up products
    in the routing's row layout ([rows, 2I], each expert's rows from a multiple of 128).

    Raises:
        RuntimeError: "cuops::moe_experts: ..." for a bad shape, dtype or device (gate_up not
            [E, 2I, H] or down not [E, H, I] for x's H; topk_idx not int32/int64 [T, k]; topk_w not
            topk_idx's shape), more than 8192 experts, or another activation.

    Calls torch.ops.cuops.moe_experts.
    """
    return torch.ops.cuops.moe_experts(x, topk_idx, topk_w, gate_up, down, activation)


def patch(model: torch.nn.Module, fused_loss: bool = True) -> torch.nn.Module:
    """Puts a built Hugging Face Llama-family model (Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma, Gemma 2, Gemma 3, OLMo2, Granite: the ForCausalLM or the
    base Model, or a PEFT model around one) on cuops' fused ops, in place, and returns it (docs/patch.md).

    RMSNorm (Qwen3's q/k norms too) -> rms_norm; each decoder layer's attention residual add and
    post-attention norm -> add_rms_norm; the rotary embedding -> rotary; q, k and v in one GEMM in
    training; a silu- or gelu_tanh-gated MLP without biases -> swiglu + linear; the causal LM's training forward with
    labels -> linear_cross_entropy on the hidden states, returning the loss without making the logits
    (their place holds an object that raises, naming fused_loss, on any use; eval, or no labels:
    logits as before; num_items_in_batch and shift_labels honoured).

    One rule decides every path at each call: a fused op stands in for a module only where the module
    would compute exactly what the op does; a module with hooks, a forward set on the instance, a
    weight the op cannot read (DTensor, quantized), a PEFT adapter the ops do not take, or a user's
    subclass with its own forward runs as its own module, and a custom model.loss_function, an
    lm_head that is not a plain nn.Linear or logits_to_keep keep HF's loss. cuops.patch_report(model)
    says which paths run fused and why the others do not. Parameters, buffers, the state_dict, tied
    embeddings and class names are untouched; the patched model trains eager and under torch.compile,
    with gradient checkpointing, DDP and FSDP2, and generate() works. Patching twice changes nothing
    more.

    Args:
        fused_loss: False keeps HF's loss from the logits (training code that reads logits with labels);
            it can be changed later by patching again.

    Imports transformers (an optional dependency: cuops itself does not need it).

    Raises:
        TypeError: "cuops.patch: ..." for a model of another architecture, naming the supported ones.
    """
    from ._hf import patch as _patch
    return _patch(model, fused_loss)


def patch_report(model: torch.nn.Module):
    """Which of a patched model's paths run on fused ops now (in its current train/eval mode) and why
    each other runs as its module (docs/patch.md "The rule"); print() it for a table, .fused() lists
    the paths that are.

    Raises:
        TypeError: as cuops.patch, for a model it does not patch.
    """
    from ._hf import patch_report as _report
    return _report(model)


def build_info() -> dict[str, Any]:
    """What this libcuops was built from and for; paste it into bug reports (docs/ops.md#build_info).

    Returns:
        A dict: cuops_version, torch_version and cuda_version it was built against,
        cuda_compiler_version, cuda_archs (a list: the machine code compiled in), cxx_compiler and
        build_type.

    Calls torch.ops.cuops.build_info, which returns the same as a JSON string.
    """
    return json.loads(torch.ops.cuops.build_info())


def set_switch(name: str, on: bool | None = None) -> bool:
    """Sets one of the library's switches for this process, or only reads it when on is None
    (docs/ops.md#set_switch); returns whether it was on.

    The switches send products or norms to the portable paths where a faster one would run; each is
    also read from its environment variable once per process (README.md, "Switches"):
    CUOPS_DISABLE_WGMMA, CUOPS_DISABLE_SKINNY_TMA, CUOPS_DISABLE_BULK_NORM. Products planned after
    the call follow it; a CUDA graph captured before keeps the kernels it captured.

    Raises:
        RuntimeError: "cuops::set_switch: ..." for an unknown name (the message lists the names).

    Calls torch.ops.cuops.set_switch.
    """
    return torch.ops.cuops.set_switch(name, on)


@contextlib.contextmanager
def switch(name: str, on: bool = True) -> Iterator[None]:
    """The switch `name` set to `on` for the block, restored after (see set_switch):

        with cuops.switch("CUOPS_DISABLE_WGMMA"):
            y = cuops.mm(a, b)        # the mma.sync kernels, on Hopper too
    """
    was = set_switch(name, on)
    try:
        yield
    finally:
        set_switch(name, was)
