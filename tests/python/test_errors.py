"""One test per error rule of SPEC section 1: each bad input raises RuntimeError('cuops::<op>: ...')
naming the argument, what was expected and what came; nothing is written out of bounds."""
import re

import pytest
import torch

from conftest import DEVICES, HAS_CUDA, NO_GPU_REASON, ops

F32 = torch.float32
ELEMENTWISE_CALLS = {
    "add2": lambda a, b: ops.add2(torch.empty_like(a), a, b),
    "vector_add": lambda a, b: ops.vector_add(a, b),
    "two_norm": lambda a, b: ops.two_norm(a, b),
}


def raises(match):
    return pytest.raises(RuntimeError, match=match)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad", [torch.int64, torch.int32, torch.bool, torch.uint8, torch.complex64])
def test_non_floating_dtypes_rejected(device, bad):
    x = torch.ones(4, device=device).to(bad)
    name = {torch.int64: "int64", torch.int32: "int32", torch.bool: "bool", torch.uint8: "uint8",
            torch.complex64: "complex64"}[bad]
    expected = f"expected x to have dtype float32, float64, float16 or bfloat16, got {name}"
    with raises(f"cuops::square: {expected}"):
        ops.square(x)
    with raises(f"cuops::scale: {expected}"):
        ops.scale(x, 3.0)
    with raises(f"cuops::vector_add: expected a to have dtype .*, got {name}"):
        ops.vector_add(x, x)
    with raises(f"cuops::two_norm: expected a to have dtype .*, got {name}"):
        ops.two_norm(x, x)
    with raises(f"cuops::mm: expected a to have dtype .*, got {name}"):
        ops.mm(x.view(2, 2), x.view(2, 2))
    with raises(f"cuops::gemm: expected c to have dtype .*, got {name}"):
        ops.gemm(x.view(2, 2), x.view(2, 2), x.view(2, 2))
    with raises(f"cuops::add2: expected c to have dtype .*, got {name}"):
        ops.add2(x, x, x)


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_dtypes_rejected(device):
    a, b = torch.randn(4, device=device), torch.randn(4, device=device, dtype=torch.float64)
    with raises(r"cuops::vector_add: expected b to have the dtype of a \(float32\), got float64"):
        ops.vector_add(a, b)
    with raises(r"cuops::add2: expected b to have the dtype of c \(float32\), got float64"):
        ops.add2(torch.empty(4, device=device), a, b)
    with raises(r"cuops::two_norm: expected b to have the dtype of a \(float32\), got float64"):
        ops.two_norm(a, b)
    with raises(r"cuops::mm: expected b to have the dtype of a \(float32\), got bfloat16"):
        ops.mm(a.view(2, 2), a.view(2, 2).bfloat16())
    c16 = torch.empty(2, 2, device=device, dtype=torch.float16)
    with raises(r"cuops::gemm: expected a to have the dtype of c \(float16\), got float32"):
        ops.gemm(c16, a.view(2, 2), a.view(2, 2))


def test_mixed_devices_rejected_cpu_and_meta():
    a, b = torch.randn(4), torch.randn(4, device="meta")
    with raises(r"cuops::vector_add: expected b on the device of a \(cpu\), got meta"):
        ops.vector_add(a, b)


@pytest.mark.skipif(not HAS_CUDA, reason=NO_GPU_REASON)
def test_mixed_devices_rejected_cpu_and_cuda():
    a, b = torch.randn(4), torch.randn(4, device="cuda")
    with raises(r"cuops::vector_add: expected b on the device of a \(cpu\), got cuda:0"):
        ops.vector_add(a, b)
    with raises(r"cuops::add2: expected a on the device of c \(cuda:0\), got cpu"):
        ops.add2(torch.empty(4, device="cuda"), a, b)
    with raises(r"cuops::mm: expected b on the device of a \(cpu\), got cuda:0"):
        ops.mm(a.view(2, 2), b.view(2, 2))
    with raises(r"cuops::gemm: expected a on the device of c \(cuda:0\), got cpu"):
        ops.gemm(torch.empty(2, 2, device="cuda"), a.view(2, 2), b.view(2, 2))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", sorted(ELEMENTWISE_CALLS))
def test_mismatched_shapes_rejected(device, op):
    a, b = torch.randn(4, 3, device=device), torch.randn(3, 4, device=device)
    with raises(rf"cuops::{op}: expected b to have the shape of (a|c) \[4, 3\], got \[3, 4\]"):
        ELEMENTWISE_CALLS[op](a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_no_broadcasting(device):
    with raises(r"cuops::vector_add: expected b to have the shape of a \[4, 3\], got \[3\]"):
        ops.vector_add(torch.randn(4, 3, device=device), torch.randn(3, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_add2_wrong_output_size(device):
    a, b = torch.randn(8, device=device), torch.randn(8, device=device)
    c = torch.full((9,), 7.0, device=device)
    with raises(r"cuops::add2: expected a to have the shape of c \[9\], got \[8\]"):
        ops.add2(c, a, b)
    assert (c == 7.0).all()  # untouched


@pytest.mark.parametrize("device", DEVICES)
def test_gemm_and_mm_shape_rules(device):
    a, b = torch.randn(64, 32, device=device), torch.randn(31, 16, device=device)
    with raises(r"cuops::mm: expected a and b to share the inner dimension, got a \[64, 32\] and b \[31, 16\]"):
        ops.mm(a, b)
    with raises(r"cuops::gemm: expected a and b to share the inner dimension, got a \[64, 32\] and b \[31, 16\]"):
        ops.gemm(torch.empty(64, 16, device=device), a, b)
    with raises(r"cuops::mm: expected a to be 2-D, got 3-D tensor of shape \[2, 3, 4\]"):
        ops.mm(torch.randn(2, 3, 4, device=device), b)
    with raises(r"cuops::mm: expected b to be 2-D, got 1-D tensor of shape \[32\]"):
        ops.mm(a, torch.randn(32, device=device))
    with raises(r"cuops::gemm: expected c to be 2-D, got 1-D tensor of shape \[1024\]"):
        ops.gemm(torch.empty(1024, device=device), a, torch.randn(32, 16, device=device))
    c = torch.full((64, 15), 7.0, device=device)
    with raises(r"cuops::gemm: expected c of shape \[64, 16\] \(rows of a, columns of b\), got \[64, 15\]"):
        ops.gemm(c, a, torch.randn(32, 16, device=device))
    assert (c == 7.0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_add2_partial_overlap_rejected(device):
    buf = torch.randn(16, device=device)
    before = buf.clone()
    with raises(r"cuops::add2: expected c to be exactly a or not to overlap it, got c .* partially overlapping a"):
        ops.add2(buf[1:9], buf[0:8], torch.randn(8, device=device))
    with raises(r"cuops::add2: expected c to be exactly b or not to overlap it, got c .* partially overlapping b"):
        ops.add2(buf[0:8], torch.randn(8, device=device), buf[4:12])
    # same memory, different view (transposed square) is not "exactly a"
    sq = torch.randn(4, 4, device=device)
    with raises(r"cuops::add2: expected c to be exactly a or not to overlap it"):
        ops.add2(sq, sq.t(), torch.randn(4, 4, device=device))
    assert torch.equal(buf, before)


@pytest.mark.parametrize("device", DEVICES)
def test_gemm_output_overlapping_input_rejected(device):
    a = torch.randn(8, 8, device=device)
    with raises(r"cuops::gemm: expected c not to overlap a, got c .* equal to a"):
        ops.gemm(a, a, torch.randn(8, 8, device=device))
    big = torch.randn(16, 8, device=device)
    with raises(r"cuops::gemm: expected c not to overlap b, got c .* partially overlapping b"):
        ops.gemm(big[4:12], torch.randn(8, 8, device=device), big[0:8])


@pytest.mark.parametrize("device", DEVICES)
def test_expanded_output_rejected(device):
    c = torch.zeros(1, 8, device=device).expand(4, 8)
    with raises(r"cuops::add2: expected c to have no overlapping elements \(e.g. not an expanded view\)"):
        ops.add2(c, torch.randn(4, 8, device=device), torch.randn(4, 8, device=device))
    c2 = torch.zeros(4, 1, device=device).expand(4, 4)
    with raises(r"cuops::gemm: expected c to have no overlapping elements"):
        ops.gemm(c2, torch.randn(4, 3, device=device), torch.randn(3, 4, device=device))
    # an as_strided view overlapping itself in a way has_internal_overlap cannot see
    base = torch.zeros(16, device=device)
    weird = base.as_strided((3, 3), (2, 1))
    with raises(r"cuops::add2: expected c to have no overlapping elements"):
        ops.add2(weird, torch.randn(3, 3, device=device), torch.randn(3, 3, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_in_place_ops_reject_requires_grad(device):
    a = torch.randn(4, device=device, requires_grad=True)
    with raises(r"cuops::add2: a requires grad, but add2 writes its output in place .* use cuops::vector_add"):
        ops.add2(torch.empty(4, device=device), a, torch.randn(4, device=device))
    m = torch.randn(3, 3, device=device, requires_grad=True)
    with raises(r"cuops::gemm: b requires grad, but gemm writes its output in place .* use cuops::mm"):
        ops.gemm(torch.empty(3, 3, device=device), torch.randn(3, 3, device=device), m)
    with torch.no_grad():
        c = torch.empty(4, device=device)
        ops.add2(c, a, a)
        assert torch.equal(c, a.detach() * 2)


def test_error_messages_start_with_op_name():
    """Every rejection above begins with 'cuops::<op>:' (checked here once across ops)."""
    calls = [lambda: ops.square(torch.ones(2, dtype=torch.int64)), lambda: ops.mm(torch.ones(2), torch.ones(2)),
             lambda: ops.two_norm(torch.ones(2), torch.ones(3)), lambda: ops.scale(torch.ones(2, dtype=torch.bool))]
    for call in calls:
        with pytest.raises(RuntimeError) as info:
            call()
        assert re.match(r"cuops::(square|mm|two_norm|scale): ", str(info.value))
