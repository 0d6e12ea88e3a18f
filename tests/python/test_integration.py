"""cuops ops inside TorchScript and torch.compile (smoke level; the full matrix is in test_pt2.py)."""
import pytest
import torch

from conftest import DEVICES


class Model(torch.nn.Module):
    def forward(self, a, b, w):
        c = torch.empty_like(a)
        torch.ops.cuops.add2(c, a, b)
        h = torch.ops.cuops.mm(torch.ops.cuops.square(c), w)
        out = torch.empty(h.shape[0], w.shape[1], dtype=h.dtype, device=h.device)
        torch.ops.cuops.gemm(out, torch.ops.cuops.scale(h, 0.5), torch.ops.cuops.vector_add(w, w).t().contiguous().t())
        return out, torch.ops.cuops.two_norm(out, torch.zeros_like(out))


def inputs(device):
    return (torch.randn(6, 4, device=device), torch.randn(6, 4, device=device), torch.randn(4, 4, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_torchscript(device):
    args = inputs(device)
    eager = Model()(*args)
    scripted = torch.jit.script(Model())
    got = scripted(*args)
    torch.testing.assert_close(got, eager)
    assert "cuops::mm" in str(scripted.graph)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    torch._dynamo.reset()
    args = inputs(device)
    eager = Model()(*args)
    compiled = torch.compile(Model(), fullgraph=True)
    torch.testing.assert_close(compiled(*args), eager, rtol=1e-5, atol=1e-5)
