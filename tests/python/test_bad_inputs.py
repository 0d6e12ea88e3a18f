"""The bad-input matrix (SPEC §1): every op x every rule, each case asserting the exact error (and that
outputs stay untouched) or the exact result (NaN/Inf propagation, 0-size). The case count is printed
in pytest's summary."""
import math

import pytest
import torch

from conftest import DEVICES, REPORT, ops

# Each op: its tensor arguments in schema order, shapes for a valid call, and how to call it.
SIGNATURES = {
    "add2": (("c", "a", "b"), ((4, 3), (4, 3), (4, 3)), lambda t, **kw: ops.add2(*t)),
    "vector_add": (("a", "b"), ((4, 3), (4, 3)), lambda t, **kw: ops.vector_add(*t)),
    "scale": (("x",), ((4, 3),), lambda t, alpha=2.0: ops.scale(t[0], alpha)),
    "square": (("x",), ((4, 3),), lambda t, **kw: ops.square(*t)),
    "two_norm": (("a", "b"), ((4, 3), (4, 3)), lambda t, **kw: ops.two_norm(*t)),
    "gemm": (("c", "a", "b"), ((4, 2), (4, 3), (3, 2)), lambda t, alpha=1.0, beta=0.0: ops.gemm(*t, alpha, beta)),
    "mm": (("a", "b"), ((4, 3), (3, 2)), lambda t, **kw: ops.mm(*t)),
}
OUTPUTS = {"add2": "c", "gemm": "c"}  # ops that write an argument
DTYPE_NAMES = {torch.int64: "int64", torch.int32: "int32", torch.int16: "int16", torch.int8: "int8",
               torch.uint8: "uint8", torch.bool: "bool", torch.complex64: "complex64",
               torch.complex128: "complex128"}
FLOATS = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def esc(s):
    return s.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(").replace(")", r"\)")


class Case:
    """build(device) -> (list of tensors, kwargs); expect: a regex (RuntimeError) or a checker."""

    def __init__(self, op, rule, build, error=None, check=None):
        self.op, self.rule, self.build, self.error, self.check = op, rule, build, error, check
        self.id = f"{op}-{rule}"


def valid_tensors(op, device, dtype=torch.float32):
    names, shapes, _ = SIGNATURES[op]
    return [torch.randn(s, device=device, dtype=torch.float64).to(dtype) for s in shapes]


def error_cases():
    cases = []
    for op, (names, shapes, _) in SIGNATURES.items():
        first = names[0]
        # Wrong dtype: integer, bool and complex, in each argument position.
        for pos, name in enumerate(names):
            for bad, bad_name in DTYPE_NAMES.items():
                def build(device, op=op, pos=pos, bad=bad):
                    t = valid_tensors(op, device)
                    t[pos] = t[pos].to(bad)
                    return t, {}
                cases.append(Case(op, f"dtype-{name}-{bad_name}", build,
                                  f"cuops::{op}: expected {name} to have dtype float32, float64, float16 or "
                                  f"bfloat16, got {bad_name}"))
        # Mixed floating dtypes: each later argument differs from the first.
        for pos, name in list(enumerate(names))[1:]:
            for other in (torch.float64, torch.float16, torch.bfloat16):
                def build(device, op=op, pos=pos, other=other):
                    t = valid_tensors(op, device)
                    t[pos] = t[pos].to(other)
                    return t, {}
                cases.append(Case(op, f"mixed-{name}-{FLOATS[other]}", build,
                                  esc(f"cuops::{op}: expected {name} to have the dtype of {first} (float32), "
                                      f"got {FLOATS[other]}")))
        # Mixed devices: CPU with meta (on every machine); CPU/CUDA mixes: test_cpu_cuda_mix_rejected.
        for pos, name in list(enumerate(names))[1:]:
            def build(device, op=op, pos=pos):
                t = valid_tensors(op, "cpu")
                t[pos] = t[pos].to("meta")
                return t, {}
            cases.append(Case(op, f"device-{name}-meta", build,
                              esc(f"cuops::{op}: expected {name} on the device of {first} (cpu), got meta")))
    # Wrong rank.
    for op in ("gemm", "mm"):
        names, shapes, _ = SIGNATURES[op]
        for pos, name in enumerate(names):
            for rank_shape in ((12,), (2, 2, 3), ()):
                def build(device, op=op, pos=pos, rank_shape=rank_shape):
                    t = valid_tensors(op, device)
                    t[pos] = torch.randn(rank_shape, device=device)
                    return t, {}
                got = f"{len(rank_shape)}-D tensor of shape [{', '.join(map(str, rank_shape))}]"
                cases.append(Case(op, f"rank-{name}-{len(rank_shape)}d", build,
                                  esc(f"cuops::{op}: expected {name} to be 2-D, got {got}")))
    for op in ("add2", "vector_add", "two_norm"):
        names = SIGNATURES[op][0]
        # (3,) and (1, 3) would broadcast to [4, 3] in torch: cuops does not broadcast.
        for bad_shape in ((4, 3, 1), (12,), (3,), (1, 3), (3, 4), (4, 4), (0, 3)):
            def build(device, op=op, bad_shape=bad_shape):
                t = valid_tensors(op, device)
                t[-1] = torch.randn(bad_shape, device=device)
                return t, {}
            cases.append(Case(op, f"shape-{names[-1]}-{'x'.join(map(str, bad_shape))}", build,
                              esc(f"cuops::{op}: expected {names[-1]} to have the shape of {names[0]} [4, 3], "
                                  f"got [{', '.join(map(str, bad_shape))}]")))
    # Inner dimension and output size of gemm / mm.
    for op in ("gemm", "mm"):
        def build(device, op=op):
            t = valid_tensors(op, device)
            t[-1] = torch.randn(5, 2, device=device)
            return t, {}
        cases.append(Case(op, "inner-dim", build, esc(
            f"cuops::{op}: expected a and b to share the inner dimension, got a [4, 3] and b [5, 2]")))
    for c_shape in ((4, 3), (5, 2), (2, 4), (8, 1)):
        def build(device, c_shape=c_shape):
            t = valid_tensors("gemm", device)
            t[0] = torch.full(c_shape, 7.0, device=device)
            return t, {}
        cases.append(Case("gemm", f"out-size-{c_shape[0]}x{c_shape[1]}", build, esc(
            f"cuops::gemm: expected c of shape [4, 2] (rows of a, columns of b), got [{c_shape[0]}, {c_shape[1]}]")))
    for c_shape in ((5, 3), (12,), (4, 4)):
        def build(device, c_shape=c_shape):
            t = valid_tensors("add2", device)
            t[0] = torch.full(c_shape, 7.0, device=device)
            return t, {}
        cases.append(Case("add2", f"out-size-{'x'.join(map(str, c_shape))}", build, esc(
            f"cuops::add2: expected a to have the shape of c [{', '.join(map(str, c_shape))}], got [4, 3]")))
    # Output partially overlapping an input (add2 allows exactly a or b; gemm allows neither).
    for name, pos in (("a", 1), ("b", 2)):
        def build(device, pos=pos):
            buf = torch.randn(20, device=device)
            t = [buf[0:12].view(4, 3), torch.randn(4, 3, device=device), torch.randn(4, 3, device=device)]
            t[pos] = buf[1:13].view(4, 3)
            return t, {}
        cases.append(Case("add2", f"overlap-partial-{name}", build,
                          f"cuops::add2: expected c to be exactly {name} or not to overlap it, got c .* "
                          f"partially overlapping {name}"))
        def build_t(device, pos=pos):
            sq = torch.randn(3, 3, device=device)
            t = [sq, torch.randn(3, 3, device=device), torch.randn(3, 3, device=device)]
            t[pos] = sq.t()
            return t, {}
        cases.append(Case("add2", f"overlap-transposed-{name}", build_t,
                          f"cuops::add2: expected c to be exactly {name} or not to overlap it"))
    for name, pos in (("a", 1), ("b", 2)):
        def build(device, pos=pos):
            buf = torch.randn(64, device=device)
            t = [buf[0:16].view(4, 4), torch.randn(4, 4, device=device), torch.randn(4, 4, device=device)]
            t[pos] = buf[8:24].view(4, 4)
            return t, {}
        cases.append(Case("gemm", f"overlap-partial-{name}", build,
                          f"cuops::gemm: expected c not to overlap {name}, got c .* partially overlapping {name}"))
        def build_same(device, pos=pos):
            sq = torch.randn(4, 4, device=device)
            t = [sq, torch.randn(4, 4, device=device), torch.randn(4, 4, device=device)]
            t[pos] = sq
            return t, {}
        cases.append(Case("gemm", f"overlap-same-{name}", build_same,
                          f"cuops::gemm: expected c not to overlap {name}, got c .* equal to {name}"))
    # Self-overlapping (expanded, as_strided) outputs.
    for op in ("add2", "gemm"):
        for kind in ("expand-rows", "expand-cols", "as_strided"):
            def build(device, op=op, kind=kind):
                t = valid_tensors(op, device)
                shape = t[0].shape
                if kind == "expand-rows":
                    t[0] = torch.zeros(1, shape[1], device=device).expand(shape)
                elif kind == "expand-cols":
                    t[0] = torch.zeros(shape[0], 1, device=device).expand(shape)
                else:
                    t[0] = torch.zeros(64, device=device).as_strided(shape, (1, 1))  # beyond has_internal_overlap
                return t, {}
            cases.append(Case(op, f"self-overlap-{kind}", build,
                              f"cuops::{op}: expected c to have no overlapping elements"))
    # Inputs that require grad into the in-place ops (functional alternatives named).
    for op, alt in (("add2", "vector_add"), ("gemm", "mm")):
        for pos, name in enumerate(SIGNATURES[op][0]):
            def build(device, op=op, pos=pos):
                t = valid_tensors(op, device)
                t[pos].requires_grad_(True)
                return t, {}
            cases.append(Case(op, f"requires-grad-{name}", build,
                              f"cuops::{op}: {name} requires grad, but {op} writes its output in place .* "
                              f"use cuops::{alt}"))
    return cases


# ---- results: NaN / Inf propagate as in torch; 0-size works ------------------------------------

def poisoned(t):
    """Special values at fixed places: NaN, +Inf, -Inf, and a +Inf facing a -Inf."""
    t = t.clone()
    flat = t.view(-1)
    flat[0], flat[1], flat[2] = math.nan, math.inf, -math.inf
    return t


def same_specials_and_close(got, ref, rtol, scale=None):
    """Equal NaN / +-Inf positions exactly; the finite rest within rtol (0: bit-equal to torch's op)."""
    got, ref = got.double().cpu(), ref.double().cpu()
    assert torch.equal(torch.isnan(got), torch.isnan(ref)), (got, ref)
    assert torch.equal(torch.isposinf(got), torch.isposinf(ref)), (got, ref)
    assert torch.equal(torch.isneginf(got), torch.isneginf(ref)), (got, ref)
    fin = torch.isfinite(ref)
    if scale is None:
        torch.testing.assert_close(got[fin], ref[fin], rtol=rtol, atol=0)
    else:  # products: error relative to |a| @ |b|, which cancellation cannot shrink
        assert ((got[fin] - ref[fin]).abs() <= rtol * scale.double().cpu()[fin]).all(), (got, ref)


def result_cases():
    cases = []

    def add_case(op, rule, fn):
        cases.append(Case(op, rule, None, check=fn))

    for op in ("add2", "vector_add"):
        def check(device, op=op):
            a, b = poisoned(torch.randn(5, 4, device=device)), torch.randn(5, 4, device=device)
            b.view(-1)[2] = math.inf  # -inf + inf = nan
            c = torch.full_like(a, 7.0)
            out = ops.vector_add(a, b) if op == "vector_add" else (ops.add2(c, a, b), c)[1]
            same_specials_and_close(out, torch.add(a, b), 0)
        add_case(op, "nan-inf", check)
    def check_scale(device):
        x = poisoned(torch.randn(5, 4, device=device))
        same_specials_and_close(ops.scale(x, -3.0), torch.mul(x, -3.0), 0)
        same_specials_and_close(ops.scale(x, 0.0), torch.mul(x, 0.0), 0)  # 0 * inf = nan
    add_case("scale", "nan-inf", check_scale)
    def check_square(device):
        x = poisoned(torch.randn(5, 4, device=device))
        same_specials_and_close(ops.square(x), torch.mul(x, x), 0)
    add_case("square", "nan-inf", check_square)
    for which, value, expect in (("nan", math.nan, "nan"), ("inf", math.inf, "inf"),
                                 ("inf-minus-inf", math.inf, "nan")):
        def check(device, which=which, value=value, expect=expect):
            a, b = torch.randn(1000, device=device), torch.randn(1000, device=device)
            a[617] = value
            if which == "inf-minus-inf":
                b[617] = value
            got = ops.two_norm(a, b).item()
            assert (math.isnan(got) if expect == "nan" else got == math.inf), got
            ref = torch.linalg.vector_norm(a.double() - b.double()).item()
            assert (math.isnan(ref) if expect == "nan" else ref == math.inf)
        add_case("two_norm", f"{which}", check)
    for op in ("gemm", "mm"):
        def check(device, op=op):
            a, b = torch.randn(6, 5, device=device), torch.randn(5, 7, device=device)
            a[1, 2], a[3, 0], b[4, 5] = math.nan, math.inf, -math.inf
            ref = a.double() @ b.double()
            if op == "mm":
                got = ops.mm(a, b)
            else:
                got = torch.full((6, 7), 7.0, device=device)
                ops.gemm(got, a, b, 1.0, 0.0)
            same_specials_and_close(got, ref, 1e-5, a.abs().double() @ b.abs().double())
        add_case(op, "nan-inf", check)
    def check_beta0(device):
        a, b = torch.randn(6, 5, device=device), torch.randn(5, 7, device=device)
        c = torch.full((6, 7), math.nan, device=device)
        ops.gemm(c, a, b, 2.0, 0.0)
        same_specials_and_close(c, 2.0 * (a.double() @ b.double()), 1e-5, 2.0 * (a.abs().double() @ b.abs().double()))
    add_case("gemm", "beta0-ignores-nan-c", check_beta0)
    def check_beta1(device):
        a, b = torch.randn(6, 5, device=device), torch.randn(5, 7, device=device)
        c = torch.zeros(6, 7, device=device)
        c[2, 3] = math.nan
        ref = a.double() @ b.double() + c.double()
        ops.gemm(c, a, b, 1.0, 1.0)
        same_specials_and_close(c, ref, 1e-5, a.abs().double() @ b.abs().double() + 1)
    add_case("gemm", "beta1-propagates-nan-c", check_beta1)

    # 0-size: empty results of the right shape; two_norm of nothing is 0; K = 0 products are 0.
    for shape in ((0,), (3, 0), (0, 5, 2)):
        label = "x".join(map(str, shape))
        def check(device, shape=shape):
            a, b = torch.randn(shape, device=device), torch.randn(shape, device=device)
            c = torch.empty(shape, device=device)
            ops.add2(c, a, b)
            for out in (ops.vector_add(a, b), ops.scale(a, 3.0), ops.square(a)):
                assert out.shape == shape and out.device == a.device
            norm = ops.two_norm(a, b)
            assert norm.shape == () and norm.item() == 0.0
        add_case("elementwise", f"zero-size-{label}", check)
    for m, k, n in ((0, 3, 4), (3, 0, 4), (3, 4, 0), (0, 0, 0)):
        def check(device, m=m, k=k, n=n):
            a, b = torch.randn(m, k, device=device), torch.randn(k, n, device=device)
            out = ops.mm(a, b)
            assert out.shape == (m, n)
            assert torch.equal(out.cpu(), torch.zeros(m, n))
            c = torch.full((m, n), 2.0, device=device)
            ops.gemm(c, a, b, 1.0, 0.5)
            assert torch.equal(c.cpu(), torch.full((m, n), 1.0))  # beta * c with an empty sum
        add_case("gemm", f"zero-size-{m}x{k}x{n}", check)
    return cases


ERROR_CASES = error_cases()
RESULT_CASES = result_cases()
REPORT.append(f"bad-input matrix: {len(ERROR_CASES)} error cases + {len(RESULT_CASES)} result cases "
              f"(x {len(DEVICES)} devices) over ops {', '.join(SIGNATURES)}")


# The CPU/meta device mixes build their tensors on the CPU whatever the device: one run each.
DEVICE_CASES = [
    pytest.param(c, d, id=f"{c.id}-{d}") if isinstance(d, str) else
    pytest.param(c, d.values[0], id=f"{c.id}-{d.values[0]}", marks=d.marks)
    for c in ERROR_CASES for d in (["cpu"] if c.rule.startswith("device-") else DEVICES)]


@pytest.mark.parametrize("case,device", DEVICE_CASES)
def test_bad_input_is_rejected(case, device):
    tensors, kwargs = case.build(device)
    out_name = OUTPUTS.get(case.op)
    names = SIGNATURES[case.op][0]
    out = tensors[names.index(out_name)] if out_name else None
    before = out.detach().clone() if out is not None and out.device.type != "meta" and out.dtype.is_floating_point else None
    with pytest.raises(RuntimeError, match=case.error):
        SIGNATURES[case.op][2](tensors, **kwargs)
    if before is not None:
        assert torch.equal(out.detach(), before), "a rejected call wrote its output"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", RESULT_CASES, ids=lambda c: c.id)
def test_special_values_and_empty_give_torch_results(case, device):
    case.check(device)


@pytest.mark.parametrize("device", DEVICES)
def test_in_place_ops_take_inputs_that_require_grad_under_no_grad(device):
    """The requires-grad rule of add2 / gemm is about recording a graph: under no_grad they run."""
    a = torch.randn(4, device=device, requires_grad=True)
    m = torch.randn(3, 3, device=device, requires_grad=True)
    with torch.no_grad():
        c = torch.empty(4, device=device)
        ops.add2(c, a, a)
        assert torch.equal(c, a.detach() * 2)
        g = torch.empty(3, 3, device=device)
        ops.gemm(g, m, torch.eye(3, device=device))
        torch.testing.assert_close(g, m.detach())


@pytest.mark.parametrize("device", [d for d in DEVICES if d != "cpu"])
@pytest.mark.parametrize("op", sorted(SIGNATURES))
def test_cpu_cuda_mix_rejected(op, device):
    names = SIGNATURES[op][0]
    for pos, name in list(enumerate(names))[1:]:
        t = valid_tensors(op, "cuda")
        t[pos] = t[pos].cpu()
        with pytest.raises(RuntimeError, match=esc(f"cuops::{op}: expected {name} on the device of {names[0]} "
                                                   f"(cuda:0), got cpu")):
            SIGNATURES[op][2](t)
        t = valid_tensors(op, "cpu")
        t[pos] = t[pos].cuda()
        with pytest.raises(RuntimeError, match=esc(f"cuops::{op}: expected {name} on the device of {names[0]} "
                                                   f"(cpu), got cuda:0")):
            SIGNATURES[op][2](t)
