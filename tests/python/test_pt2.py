"""Native-op behaviour: opcheck, gradcheck, torch.compile (fullgraph, dynamic, reduce-overhead),
autocast, side streams and CUDA graphs."""
import re

import pytest
import torch
import torch._dynamo.testing

from conftest import DEVICES, DEVICES_CPU_IN_CI, DTYPES, make, ops, requires_cuda


def samples(device, dtype):
    """(op, args) pairs per op: regular, 0-size and non-contiguous; differentiable ops also with grad."""
    def t(shape, layout="contiguous", grad=False):
        x = make(shape, dtype, device, layout)
        return x.requires_grad_() if grad else x

    out = []
    for shape, layout in [((5, 7), "contiguous"), ((0, 3), "contiguous"), ((6, 9), "transposed"), ((4, 8), "sliced")]:
        out.append((ops.add2, (torch.empty(shape, dtype=dtype, device=device), t(shape, layout), t(shape))))
        for grad in (False, True):
            out.append((ops.vector_add, (t(shape, layout, grad), t(shape, "contiguous", grad))))
            out.append((ops.scale, (t(shape, layout, grad), 0.75)))
            out.append((ops.square, (t(shape, layout, grad),)))
            out.append((ops.two_norm, (t(shape, layout, grad), t(shape, "contiguous", grad))))
    for (m, k, n), la in [((5, 7, 3), "contiguous"), ((0, 4, 2), "contiguous"), ((6, 5, 4), "transposed"),
                          ((3, 0, 2), "contiguous")]:
        out.append((ops.gemm, (torch.empty(m, n, dtype=dtype, device=device), t((m, k), la), t((k, n), "transposed"))))
        out.append((ops.gemm, (make((m, n), dtype, device), t((m, k), la), t((k, n)), 0.5, 2.0)))
        for grad in (False, True):
            out.append((ops.mm, (t((m, k), la, grad), t((k, n), "transposed", grad))))
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_opcheck_every_op(device, dtype):
    checked = set()
    for op, args in samples(device, dtype):
        torch.library.opcheck(op, args)  # all four: schema, autograd registration, fake tensor, aot dispatch
        checked.add(op._qualified_op_name)
    # build_info returns a str, which opcheck's aot_dispatch comparison cannot compare (torch 2.11
    # raises "No comparison pair ... str"); the other three tests run.
    torch.library.opcheck(ops.build_info, (), test_utils=("test_schema", "test_autograd_registration",
                                                          "test_faketensor"))
    assert checked == {f"cuops::{n}" for n in ["add2", "vector_add", "scale", "square", "two_norm", "gemm", "mm"]}


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_float64(device):
    def t(*shape):
        return torch.randn(*shape, dtype=torch.float64, device=device, requires_grad=True)

    cases = [(ops.vector_add, (t(4, 5), t(4, 5))), (lambda x: ops.scale(x, -1.5), (t(3, 6),)),
             (ops.square, (t(7),)), (ops.two_norm, (t(3, 4), t(3, 4))), (ops.mm, (t(5, 3), t(3, 4))),
             (ops.mm, (t(3, 5).t(), t(4, 3).t()))]
    for fn, args in cases:
        assert torch.autograd.gradcheck(fn, args)
        assert torch.autograd.gradgradcheck(fn, args)  # double backward works (backward is itself differentiable)


@pytest.mark.parametrize("device", DEVICES)
def test_two_norm_gradient_is_zero_at_zero(device):
    a = torch.randn(5, dtype=torch.float64, device=device, requires_grad=True)
    b = a.detach().clone().requires_grad_()
    ops.two_norm(a, b).backward()
    assert torch.equal(a.grad, torch.zeros_like(a)) and torch.equal(b.grad, torch.zeros_like(b))


class EveryOp(torch.nn.Module):
    def forward(self, a, b, w):
        c = torch.empty_like(a)
        ops.add2(c, a, b)
        h = ops.mm(ops.square(ops.vector_add(c, b)), w)
        g = torch.empty(h.shape[0], w.shape[1], dtype=h.dtype, device=h.device)
        ops.gemm(g, ops.scale(h, 0.25), w, 1.0, 0.0)
        return g, ops.two_norm(g, h)


def every_op_inputs(device, n=8):
    return torch.randn(n, 4, device=device), torch.randn(n, 4, device=device), torch.randn(4, 4, device=device)


@pytest.mark.parametrize("device", DEVICES_CPU_IN_CI)
def test_compile_fullgraph_no_graph_breaks(device):
    torch._dynamo.reset()
    args = every_op_inputs(device)
    explanation = torch._dynamo.explain(EveryOp())(*args)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    eager = EveryOp()(*args)
    got = torch.compile(EveryOp(), fullgraph=True)(*args)
    torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES_CPU_IN_CI)
def test_compile_dynamic_at_most_one_recompile(device):
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    compiled = torch.compile(EveryOp(), backend=counter, dynamic=True, fullgraph=True)
    for n in (8, 13, 31):
        args = every_op_inputs(device, n)
        torch.testing.assert_close(compiled(*args), EveryOp()(*args), rtol=1e-5, atol=1e-5)
    assert counter.frame_count <= 2, f"{counter.frame_count} compilations for three sizes"


@pytest.mark.parametrize("device", DEVICES_CPU_IN_CI)
def test_compile_backward_through_cuops(device):
    torch._dynamo.reset()

    def loss(a, w):
        return ops.two_norm(ops.mm(ops.square(a), w), torch.zeros(a.shape[0], w.shape[1], device=a.device, dtype=a.dtype))

    a = torch.randn(6, 5, device=device, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 3, device=device, dtype=torch.float64, requires_grad=True)
    ga, gw = torch.autograd.grad(torch.compile(loss, fullgraph=True)(a, w), (a, w))
    ea, ew = torch.autograd.grad(loss(a, w), (a, w))
    torch.testing.assert_close((ga, gw), (ea, ew))


@pytest.mark.parametrize("device", DEVICES_CPU_IN_CI)
def test_compile_one_buffer_for_a_value_two_gemms_read(device):
    # A Linear's backward in one: the cast of g feeds mm(g, W) and, transposed, mm(g^T, x) and gemm.
    # gemm and mm read any strides (flexible_layout), so Inductor writes the cast once and hands the
    # transposed readers a view of it; with the custom-op default (exact eager strides) it wrote the
    # transposed copy to a second buffer, a whole extra pass over g each step.
    from torch._inductor.utils import run_and_get_code
    torch._dynamo.reset()

    def step(g32, w, x, c):
        g = (g32 * 2).to(torch.bfloat16)
        ops.gemm(c, g.t(), x, 0.5, 1.0)
        return ops.mm(g, w), ops.mm(g.t(), x)

    g32 = torch.randn(64, 40, device=device)
    w, x = (torch.randn(s, device=device).to(torch.bfloat16) for s in ((40, 24), (64, 16)))
    c = torch.randn(40, 16, device=device).to(torch.bfloat16)
    c_eager = c.clone()
    with torch._inductor.config.patch(force_disable_caches=True):  # a cached graph's code predates the tags
        got, codes = run_and_get_code(torch.compile(step, fullgraph=True), g32, w, x, c)
    eager = step(g32, w, x, c_eager)
    torch.testing.assert_close((got, c), (eager, c_eager), rtol=0, atol=0)
    assert all(torch.Tag.flexible_layout in op.default.tags for op in (torch.ops.cuops.mm, torch.ops.cuops.gemm))
    code = "\n".join(codes)
    g_buffers = re.findall(r"empty_strided_\w+\(\((?:64, 40|40, 64)\)", code)
    assert len(g_buffers) == 1, f"the cast of g written to {len(g_buffers)} buffers:\n{code}"


@requires_cuda
def test_compile_reduce_overhead_matches_eager():
    torch._dynamo.reset()
    compiled = torch.compile(EveryOp(), mode="reduce-overhead", fullgraph=True)
    for _ in range(4):  # the later calls replay the CUDA graph
        args = every_op_inputs("cuda")
        torch.testing.assert_close(compiled(*args), EveryOp()(*args), rtol=1e-5, atol=1e-5)


@requires_cuda
def test_autocast_mm_in_autocast_dtype_two_norm_in_float32():
    a, b = torch.randn(8, 16, device="cuda"), torch.randn(16, 4, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = ops.mm(a, b)
        norm = ops.two_norm(out, torch.zeros_like(out))
        assert out.dtype == torch.mm(a, b).dtype == torch.bfloat16
        assert norm.dtype == torch.float32
    torch.testing.assert_close(out, (a.bfloat16().double() @ b.bfloat16().double()).bfloat16(), rtol=1e-2, atol=1e-2)


def test_autocast_is_cuda_only_on_cpu():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert ops.mm(a, b).dtype == torch.float32  # no CPU autocast registration: runs as given


def run_every_op(a, b, w, c, g):
    """Every op once, writing into preallocated outputs where it can (graph-capture friendly)."""
    ops.add2(c, a, b)
    ops.gemm(g, c, w, 0.5, 0.0)
    return (c, g, ops.vector_add(a, b), ops.scale(a, 3.0), ops.square(b), ops.two_norm(a, b), ops.mm(c, w))


@requires_cuda
def test_cuda_graph_replay_matches_eager():
    """Every op captured in one CUDA graph (capture runs on a side stream: a launch on the legacy default
    stream would fail it) and replayed 100 times gives eager's bits. Side streams without a graph:
    test_reliability.py's eight-thread test."""
    a, b, w = torch.randn(512, 256, device="cuda"), torch.randn(512, 256, device="cuda"), torch.randn(256, 64, device="cuda")
    c, g = torch.empty_like(a), torch.empty(512, 64, device="cuda")
    expected = [t.clone() for t in run_every_op(a, b, w, c, g)]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run_every_op(a, b, w, c, g)
    for _ in range(100):
        for x in captured + (c, g):
            x.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for x, y in zip(captured, expected):
            assert torch.equal(x, y)
