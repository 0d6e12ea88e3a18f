"""cuops under DTensor (python/cuops/_sharding.py): the sharded result of every op with a rule equals
the single-process one, for each placement the rule accepts, on CPU processes joined by gloo (CI has
no GPU); add2 and gemm write into c for every placement of c, a and b, c keeping its own, and refuse a
placement they cannot write; an MLP of cuops Linears under ColwiseParallel / RowwiseParallel trains as
the unsharded one does, and so does a transformer block (attention heads and MLP split over 2
processes). 1-D meshes of 2 processes and a 2 x 2 mesh of 4."""
import itertools
import math
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
    """The rules on a 2 x 2 mesh: each mesh dimension takes its own placement of the rule's (add2 and
    gemm: c's placement on each, a and b moved to match)."""
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
        # add2 and gemm: c keeps its placement on each mesh dimension, a and b move to match it.
        R, S0, S1, P, Pavg = Replicate(), Shard(0), Shard(1), Partial(), Partial("avg")
        for pc, pa, pb in (((S0, S1), (S0, S1), (S1, S0)), ((S0, P), (S0, P), (R, R)),
                           ((Pavg, S1), (R, S0), (Pavg, S1)), ((P, Pavg), (S1, R), (P, S0))):
            in_place_case(mesh, gen, ops.add2, pc, (pa, pb), ((8, 6),) * 3)
        for pc, pa, pb in (((S0, S1), (S0, R), (R, S1)),       # rows and columns, nothing moves
                           ((S0, P), (S0, S1), (R, S0)),       # rows, and k split on mesh dim 1
                           ((P, S1), (S1, R), (S0, S1)),       # k split on mesh dim 0, columns
                           ((P, P), (S1, S1), (S0, S0)),       # k split on both
                           ((Pavg, S0), (Pavg, S0), (R, R)),   # an averaged a times b, rows
                           ((R, P), (S0, S1), (S1, R)),        # a and b moved on both dimensions
                           ((S1, S0), (R, R), (R, R))):        # a and b split locally
            in_place_case(mesh, gen, ops.gemm, pc, (pa, pb), ((8, 6), (8, 12), (12, 6)), (0.5, -2.0))
    finally:
        teardown()


def make(mesh, shape, placements, gen, fill=None):
    """A float64 DTensor of `placements` on `mesh` and its full value. Each Partial mesh dimension holds a
    different random piece on each of its coordinates (the value their sum, or mean for "avg", or max),
    not one value and zeros, so a piece counted twice or dropped shows. Same calls on every rank give
    the same pieces (gen is seeded alike)."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, distribute_tensor

    partial = [i for i, p in enumerate(placements) if isinstance(p, Partial)]
    grid = list(itertools.product(*(range(mesh.size(i)) for i in partial)))
    pieces = {g: torch.randn(shape, generator=gen, dtype=torch.float64) if fill is None
              else torch.full(shape, fill, dtype=torch.float64) for g in grid}
    coord = mesh.get_coordinate()
    mine = pieces[tuple(coord[i] for i in partial)]
    local = distribute_tensor(mine, mesh, [Replicate() if isinstance(p, Partial) else p for p in placements],
                              src_data_rank=None).to_local()
    full = torch.stack(list(pieces.values()))
    ops_ = {placements[i].reduce_op for i in partial}
    if ops_ == {"max"}:
        full = full.amax(0)
    else:  # sums and averages commute (each linear)
        assert ops_ <= {"sum", "avg"}, ops_
        div = math.prod(mesh.size(i) for i in partial if placements[i].reduce_op == "avg")
        full = full.sum(0) / div
    return DTensor.from_local(local.clone(), mesh, placements), full


def in_place_case(mesh, gen, op, pc, pins, shapes, scalars=(), fill=None):
    """op(c, a, b, *scalars) on DTensors of placements pc, *pins against op on their full values (the
    single-process result): c keeps its placements and its local storage (the write lands in it), a and
    b are left as they were. Returns c."""
    c, c_full = make(mesh, shapes[0], pc, gen, fill)
    ins = [make(mesh, shape, p, gen) for shape, p in zip(shapes[1:], pins)]
    saved = [t.to_local().clone() for t, _ in ins]
    ptr = c.to_local().data_ptr()
    op(c, *(t for t, _ in ins), *scalars)
    op(c_full, *(f for _, f in ins), *scalars)
    what = (op, pc, pins, scalars)
    assert c.placements == tuple(pc), what
    assert c.to_local().data_ptr() == ptr, what
    torch.testing.assert_close(c.full_tensor(), c_full, rtol=1e-12, atol=1e-12, msg=str(what))
    for (t, _), p, local in zip(ins, pins, saved):
        assert t.placements == tuple(p) and torch.equal(t.to_local(), local), what
    return c


def check_inplace(rank, world, port):
    """add2 and gemm on DTensors, for every placement of c, a and b on a 1-D mesh: c keeps its placement
    and its local storage (the write lands in it) and equals the single-process result; a and b are
    left as they were; a c placement that no rule has raises before anything is written."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        import cuops  # noqa: F401  (registers the rules)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

        mesh = init_device_mesh("cpu", (world,))
        gen = torch.Generator().manual_seed(4321)
        every = (Replicate(), Shard(0), Shard(1), Partial(), Partial("avg"))

        def run(op, pc, pins, shapes, scalars=(), fill=None):
            return in_place_case(mesh, gen, op, (pc,), [(p,) for p in pins], shapes, scalars, fill)

        # add2: c <- a + b for every (c, a, b) placement; a and b move to c's placement, c never.
        for pc, pa, pb in itertools.product(every, repeat=3):
            run(ops.add2, pc, (pa, pb), ((6, 4),) * 3)
        # c is a (in place, as `a += b`) and c is b: the one DTensor is read and written.
        for p in every:
            x, x_full = make(mesh, (6, 4), (p,), gen)
            y, y_full = make(mesh, (6, 4), (p,), gen)
            ops.add2(x, x, y)
            ops.add2(y, x, y)
            assert x.placements == y.placements == (p,)
            torch.testing.assert_close(x.full_tensor(), x_full + y_full, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(y.full_tensor(), x_full + 2 * y_full, rtol=1e-12, atol=1e-12)
        # gemm: c <- alpha a @ b + beta c for every (c, a, b) placement; beta = 0 over a NaN c (ignored
        # on every process, the Partial pieces included), beta != 0 over a random c (counted once).
        for pc, pa, pb in itertools.product(every, repeat=3):
            run(ops.gemm, pc, (pa, pb), ((6, 4), (6, 10), (10, 4)), (0.75, 0.0), fill=float("nan"))
            run(ops.gemm, pc, (pa, pb), ((6, 4), (6, 10), (10, 4)), (-1.25, 0.5))

        # The case register_sharding got wrong (c redistributed into a copy, the write dropped): a
        # Replicate c with Shard(0) a and b is whole on every process afterwards, a and b gathered.
        c = run(ops.add2, Replicate(), (Shard(0), Shard(0)), ((6, 4),) * 3)
        torch.testing.assert_close(c.to_local(), c.full_tensor(), rtol=0, atol=0)
        # A Replicate c with k-split a and b: beta * c once, not once per process.
        run(ops.gemm, Replicate(), (Shard(1), Shard(0)), ((6, 4), (6, 10), (10, 4)), (1.0, 1.0))

        # Rejected: a c placement no rule has (max is not linear), before anything is written.
        for op, name, shapes in ((ops.add2, "add2", ((6, 4),) * 3), (ops.gemm, "gemm", ((6, 4), (6, 10), (10, 4)))):
            c, _ = make(mesh, shapes[0], (Partial("max"),), gen)
            a, _ = make(mesh, shapes[1], (Replicate(),), gen)
            b, _ = make(mesh, shapes[2], (Replicate(),), gen)
            before = c.to_local().clone()
            with pytest.raises(RuntimeError, match=rf"cuops::{name}: c is written in place.*Partial\(max\)"):
                op(c, a, b)
            assert torch.equal(c.to_local(), before)
            # DTensors and plain tensors mixed: which placement would the plain one have?
            with pytest.raises(RuntimeError, match=rf"cuops::{name}: c, a and b must all be DTensors"):
                op(c, a, b.to_local())
        # Global shapes are checked, not local ones (here the local ones would agree: [3, 4] each).
        c, _ = make(mesh, (6, 4), (Shard(0),), gen)
        a, _ = make(mesh, (3, 4), (Replicate(),), gen)
        with pytest.raises(RuntimeError, match=r"cuops::add2:"):
            ops.add2(c, a, a)
        a, _ = make(mesh, (6, 10), (Shard(0),), gen)
        b, _ = make(mesh, (8, 4), (Replicate(),), gen)
        with pytest.raises(RuntimeError, match=r"cuops::gemm:"):
            ops.gemm(c, a, b)
        # c as an input of gemm: the kernel's own overlap error where nothing moves, and where a would
        # move (to Replicate, for a Shard(1) c) the handler's, not a product of a stale copy.
        sq, _ = make(mesh, (6, 6), (Shard(0),), gen)
        b2, _ = make(mesh, (6, 6), (Replicate(),), gen)
        with pytest.raises(RuntimeError, match=r"cuops::gemm:.*overlap"):
            ops.gemm(sq, sq, b2)
        sq, _ = make(mesh, (6, 6), (Shard(1),), gen)
        before = sq.to_local().clone()
        with pytest.raises(RuntimeError, match=r"cuops::gemm: a shares memory with the output c"):
            ops.gemm(sq, sq, b2)
        assert torch.equal(sq.to_local(), before)
        # Scalars given by keyword reach the rule and the kernel.
        in_place_case(mesh, gen, lambda c, a, b, alpha, beta: ops.gemm(c, a, b, alpha=alpha, beta=beta),
                      (Shard(1),), ((Shard(1),), (Shard(0),)), ((6, 4), (6, 10), (10, 4)), (2.0, -1.0))
        # An input that requires grad, in grad mode: the op's own error (it writes, use mm).
        a, _ = make(mesh, (6, 10), (Shard(0),), gen)
        b, _ = make(mesh, (10, 4), (Replicate(),), gen)
        with pytest.raises(RuntimeError, match=r"cuops::gemm:.*mm"):
            ops.gemm(c, a.requires_grad_(), b)
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


class Block(torch.nn.Module):
    """A pre-norm transformer block on cuops Linears: x + o(attention(q, k, v of norm(x))), then
    x + down(gelu(up(norm(x)))). The number of heads comes from q's width, so under ColwiseParallel each
    process runs n_heads / world of them (heads_run records how many ran)."""

    def __init__(self, dim=16, n_heads=4, hidden=32):
        super().__init__()
        self.head_dim = dim // n_heads
        self.attn_norm, self.mlp_norm = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        # q, k, v without bias (as in Llama): k's bias has gradient 0 in exact arithmetic (softmax is
        # shift-invariant), so its float32 gradient is rounding noise that AdamW would scale to lr.
        self.q, self.k, self.v = (CuopsLinear(dim, dim, bias=False) for _ in range(3))
        self.o = CuopsLinear(dim, dim)
        self.up, self.down = CuopsLinear(dim, hidden), CuopsLinear(hidden, dim)
        self.heads_run = None

    def forward(self, x):
        batch, seq, _ = x.shape
        h = self.attn_norm(x)
        q, k, v = (proj(h).view(batch, seq, -1, self.head_dim).transpose(1, 2) for proj in (self.q, self.k, self.v))
        self.heads_run = q.shape[1]
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(att.transpose(1, 2).reshape(batch, seq, -1))
        return x + self.down(torch.nn.functional.gelu(self.up(self.mlp_norm(x))))


def check_block(rank, world, port):
    """One AdamW step of Block under tensor parallelism (q, k, v, up colwise; o, down rowwise; the norms
    replicated) against the unsharded Block: loss, every gradient, every updated weight, and the loss
    after the step, float32, to 1e-5 relative."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        import cuops  # noqa: F401  (registers the rules)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        torch.set_float32_matmul_precision("highest")
        mesh = init_device_mesh("cpu", (world,))
        torch.manual_seed(11)  # the same model, batch and target on every rank
        ref, tp = Block(), Block()
        tp.load_state_dict(ref.state_dict())
        plan = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "o": RowwiseParallel(),
                "up": ColwiseParallel(), "down": RowwiseParallel()}
        parallelize_module(tp, mesh, plan)
        assert isinstance(tp.q.weight, DTensor) and not isinstance(tp.attn_norm.weight, DTensor)
        x, target = torch.randn(2, 5, 16), torch.randn(2, 5, 16)

        def full(t):
            return t.full_tensor() if isinstance(t, DTensor) else t

        def same(got, want, what):
            got = full(got)
            rel = ((got - want).norm() / want.norm()).item()
            assert rel <= 1e-5, (what, rel)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=what)

        losses = []
        for model in (ref, tp):
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
            loss = torch.nn.functional.mse_loss(model(x), target)
            loss.backward()
            opt.step()
            losses.append((loss.detach(), torch.nn.functional.mse_loss(model(x), target).detach()))
        assert (ref.heads_run, tp.heads_run) == (4, 4 // world)  # the heads were split over the ranks
        same(losses[1][0], losses[0][0], "loss")
        same(losses[1][1], losses[0][1], "loss after the step")
        assert losses[0][1] < losses[0][0]  # the step did something
        for (name, p_ref), (_, p_tp) in zip(ref.named_parameters(), tp.named_parameters()):
            same(p_tp.grad, p_ref.grad, f"grad {name}")
            same(p_tp.detach(), p_ref.detach(), f"updated {name}")
    finally:
        teardown()


def test_sharded_ops_equal_the_unsharded_ones_on_two_processes():
    mp.spawn(check_ops, args=(2, free_port()), nprocs=2, join=True)


def test_sharded_ops_equal_the_unsharded_ones_on_a_two_by_two_mesh():
    mp.spawn(check_ops_2d, args=(4, free_port()), nprocs=4, join=True)


def test_add2_and_gemm_write_in_place_for_every_placement_and_reject_the_others():
    mp.spawn(check_inplace, args=(2, free_port()), nprocs=2, join=True)


def test_colwise_rowwise_mlp_of_cuops_linears_trains_as_unsharded():
    """Forward and backward of Linear(16 -> 32) colwise, ReLU, Linear(32 -> 12) rowwise, float32."""
    mp.spawn(check_mlp, args=(2, free_port()), nprocs=2, join=True)


def test_tensor_parallel_transformer_block_of_cuops_linears_trains_as_unsharded():
    """Attention (heads split over 2 processes) and MLP on cuops Linears, one AdamW step, float32."""
    mp.spawn(check_block, args=(2, free_port()), nprocs=2, join=True)
