"""cuops under DTensor (python/cuops/_sharding.py): the sharded result of every op with a rule equals
the single-process one, for each placement the rule accepts, on CPU processes joined by gloo (CI has
no GPU); and an MLP of cuops Linears under ColwiseParallel / RowwiseParallel trains as the unsharded
one does. 1-D meshes of 2 processes and a 2 x 2 mesh of 4; the in-place ops and the transformer block
are the rest of issue 25."""
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import ops

dist_ok = dist.is_available() and dist.is_gloo_available()
pytestmark = pytest.mark.skipif(not dist_ok, reason="torch.distributed with gloo is not available here")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def teardown():
    """Every rank past its last collective before any tears gloo down: a rank closing its pairs while
    another still used them aborted that process once in CI ("terminate called without an active
    exception", SIGABRT) on CI's 2 loaded cores."""
    try:
        dist.barrier()
    finally:
        dist.destroy_process_group()


def check_ops(rank, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        import cuops  # noqa: F401  (registers the rules)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

        mesh = init_device_mesh("cpu", (world,))
        gen = torch.Generator().manual_seed(1234)  # the same full tensors on every rank
        a = torch.randn(6, 10, generator=gen, dtype=torch.float64)
        b = torch.randn(10, 4, generator=gen, dtype=torch.float64)
        x = torch.randn(6, 4, generator=gen, dtype=torch.float64)
        y = torch.randn(6, 4, generator=gen, dtype=torch.float64)

        def dt(t, p):
            return distribute_tensor(t, mesh, [p])

        # mm: rows of a, columns of b, k on both (a Partial result), everything replicated.
        want = ops.mm(a, b)
        for pa, pb, out in ((Shard(0), Replicate(), Shard(0)), (Replicate(), Shard(1), Shard(1)),
                            (Shard(1), Shard(0), Partial()), (Replicate(), Replicate(), Replicate())):
            got = ops.mm(dt(a, pa), dt(b, pb))
            assert got.placements == (out,), (pa, pb, got.placements)
            torch.testing.assert_close(got.full_tensor(), want, rtol=1e-12, atol=1e-12)
        # Pointwise ops keep their inputs' sharding; the linear ones keep partial sums too.
        for p in (Shard(0), Shard(1), Replicate()):
            got = ops.vector_add(dt(x, p), dt(y, p))
            assert got.placements == (p,)
            torch.testing.assert_close(got.full_tensor(), ops.vector_add(x, y), rtol=0, atol=0)
            got = ops.scale(dt(x, p), 3.0)
            assert got.placements == (p,)
            torch.testing.assert_close(got.full_tensor(), ops.scale(x, 3.0), rtol=0, atol=0)
            got = ops.square(dt(x, p))
            assert got.placements == (p,)
            torch.testing.assert_close(got.full_tensor(), ops.square(x), rtol=0, atol=0)
        # two_norm of sharded inputs: each process's norm of its shards, combined as a 2-norm (the
        # inputs never gathered); replicated inputs, a replicated norm.
        for p in (Shard(0), Shard(1), Replicate()):
            got = ops.two_norm(dt(x, p), dt(y, p))
            assert isinstance(got.placements[0], Replicate) == isinstance(p, Replicate), got.placements
            assert got.to_local().shape == ()
            torch.testing.assert_close(got.full_tensor(), ops.two_norm(x, y), rtol=1e-12, atol=0)
        # A partial sum (k-split mm) scaled stays partial and reduces to the scaled product.
        part = ops.mm(dt(a, Shard(1)), dt(b, Shard(0)))
        got = ops.scale(part, 0.5)
        assert got.placements == (Partial(),)
        torch.testing.assert_close(got.full_tensor(), ops.scale(want, 0.5), rtol=1e-12, atol=1e-12)
    finally:
        teardown()


def check_ops_2d(rank, world, port):
    """The rules on a 2 x 2 mesh: each mesh dimension takes its own placement of the rule's."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        import cuops  # noqa: F401  (registers the rules)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

        mesh = init_device_mesh("cpu", (2, 2))
        gen = torch.Generator().manual_seed(99)
        a = torch.randn(8, 12, generator=gen, dtype=torch.float64)
        b = torch.randn(12, 6, generator=gen, dtype=torch.float64)
        x = torch.randn(8, 6, generator=gen, dtype=torch.float64)
        y = torch.randn(8, 6, generator=gen, dtype=torch.float64)

        def dt(t, *p):
            return distribute_tensor(t, mesh, list(p))

        want = ops.mm(a, b)
        cases = (((Shard(0), Replicate()), (Replicate(), Shard(1)), (Shard(0), Shard(1))),
                 ((Shard(0), Shard(1)), (Replicate(), Shard(0)), (Shard(0), Partial())),
                 ((Shard(1), Shard(0)), (Shard(0), Replicate()), (Partial(), Shard(0))))
        for pa, pb, out in cases:
            got = ops.mm(dt(a, *pa), dt(b, *pb))
            assert got.placements == out, (pa, pb, got.placements)
            torch.testing.assert_close(got.full_tensor(), want, rtol=1e-12, atol=1e-12)
        p = (Shard(0), Shard(1))
        got = ops.vector_add(dt(x, *p), dt(y, *p))
        assert got.placements == p
        torch.testing.assert_close(got.full_tensor(), ops.vector_add(x, y), rtol=0, atol=0)
        got = ops.square(ops.scale(dt(x, *p), -1.5))
        assert got.placements == p
        torch.testing.assert_close(got.full_tensor(), ops.square(ops.scale(x, -1.5)), rtol=0, atol=0)
        got = ops.two_norm(dt(x, *p), dt(y, *p))
        assert not any(isinstance(q, Replicate) for q in got.placements), got.placements
        torch.testing.assert_close(got.full_tensor(), ops.two_norm(x, y), rtol=1e-12, atol=0)
    finally:
        teardown()


class CuopsLinear(torch.nn.Linear):
    """nn.Linear on cuops.mm (a subclass, so parallelize_module's Colwise/RowwiseParallel take it)."""

    def forward(self, x):
        y = ops.mm(x.reshape(-1, x.shape[-1]), self.weight.t())
        return (y + self.bias if self.bias is not None else y).reshape(*x.shape[:-1], -1)


def check_mlp(rank, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        import cuops  # noqa: F401  (registers the rules)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh("cpu", (world,))
        torch.manual_seed(7)  # the same model and batch on every rank
        ref = torch.nn.Sequential(CuopsLinear(16, 32), torch.nn.ReLU(), CuopsLinear(32, 12))
        tp = torch.nn.Sequential(CuopsLinear(16, 32), torch.nn.ReLU(), CuopsLinear(32, 12))
        tp.load_state_dict(ref.state_dict())
        parallelize_module(tp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        x = torch.randn(4, 5, 16)
        want, got = ref(x), tp(x)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        want.square().sum().backward()
        got.square().sum().backward()
        for (name, p_ref), (_, p_tp) in zip(ref.named_parameters(), tp.named_parameters()):
            torch.testing.assert_close(p_tp.grad.full_tensor(), p_ref.grad, rtol=1e-5, atol=1e-6, msg=name)
    finally:
        teardown()


def test_sharded_ops_equal_the_unsharded_ones_on_two_processes():
    mp.spawn(check_ops, args=(2, free_port()), nprocs=2, join=True)


def test_sharded_ops_equal_the_unsharded_ones_on_a_two_by_two_mesh():
    mp.spawn(check_ops_2d, args=(4, free_port()), nprocs=4, join=True)


def test_colwise_rowwise_mlp_of_cuops_linears_trains_as_unsharded():
    """Forward and backward of Linear(16 -> 32) colwise, ReLU, Linear(32 -> 12) rowwise, float32."""
    mp.spawn(check_mlp, args=(2, free_port()), nprocs=2, join=True)
