"""Meta kernels: output shapes, dtypes and the same argument checks, with no data."""
import pytest
import torch

from conftest import DTYPES, ops


@pytest.mark.parametrize("dtype", DTYPES)
def test_meta_shapes(dtype):
    a = torch.empty(7, 5, device="meta", dtype=dtype)
    b = torch.empty(5, 3, device="meta", dtype=dtype)
    for out, shape in [(ops.vector_add(a, a), (7, 5)), (ops.scale(a, 3.0), (7, 5)), (ops.square(a), (7, 5)),
                       (ops.two_norm(a, a), ()), (ops.mm(a, b), (7, 3))]:
        assert out.device.type == "meta" and out.dtype == dtype and tuple(out.shape) == shape
    assert ops.add2(a, a, a) is None
    assert ops.gemm(torch.empty(7, 3, device="meta", dtype=dtype), a, b) is None


def test_meta_checks():
    a = torch.empty(7, 5, device="meta")
    with pytest.raises(RuntimeError, match=r"cuops::mm: expected a and b to share the inner dimension"):
        ops.mm(a, a)
    with pytest.raises(RuntimeError, match=r"cuops::vector_add: expected b to have the shape of a \[7, 5\], got \[5, 7\]"):
        ops.vector_add(a, torch.empty(5, 7, device="meta"))
    with pytest.raises(RuntimeError, match=r"cuops::square: expected x to have dtype .* got int64"):
        ops.square(torch.empty(3, device="meta", dtype=torch.int64))
    with pytest.raises(RuntimeError, match=r"cuops::gemm: expected c of shape \[7, 3\]"):
        ops.gemm(torch.empty(7, 4, device="meta"), a, torch.empty(5, 3, device="meta"))
