"""cuops under DTensor (python/cuops/_sharding.py): the sharded result of every op with a rule equals
the single-process one, for each placement the rule accepts; add2 and gemm write into c for every
placement of c, a and b, c keeping its own, and refuse a placement they cannot write; an MLP of cuops
Linears under ColwiseParallel / RowwiseParallel trains as the unsharded one does, and so does a
transformer block (attention heads and MLP split over 2 processes), eager and under torch.compile; in
bfloat16 the sharded model's error against the unsharded one stays within what the same model shows on
aten's nn.Linear. FSDP2 (fully_shard, parameters sharded as DTensors, gathered for each layer) trains
the block on a split batch as one process does on the whole batch.
1-D meshes of 2 processes and 2-D meshes (2 x 2 of 4 processes where there are 4 ranks to give).

Each check runs in three places (the test ids):
  cpu           CPU processes joined by gloo: CI (no GPU). A GPU machine leaves them to CI, saying
                so: they prove nothing about the CUDA kernels and took 50-230 s each there (the
                compiled block's the GPU suite's longest test).
  one-gpu       one process on cuda:0 (NCCL, a world of 1): the CUDA kernels under the same rules,
                in the GPU suite, with meshes of size 1 (ONE_GPU below says why not two processes).
  gpus-nccl     one GPU a rank, NCCL: skipped below 2 GPUs; issue 26 runs them (nvidia-h200-x2)."""
import datetime
import itertools
import json
import math
import os
import socket
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import HAS_CUDA, REPORT, ops, rel_error, requires_cuda

dist_ok = dist.is_available() and dist.is_gloo_available()
pytestmark = pytest.mark.skipif(not dist_ok, reason="torch.distributed with gloo is not available here")


def needs_gpus(n):
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nccl = dist.is_available() and dist.is_nccl_available()
    return pytest.mark.skipif(
        count < n or not nccl,
        reason=f"needs {n} GPUs (issue 26): NCCL takes one GPU a rank; this machine has {count} GPU(s)"
               + ("" if nccl else " and no NCCL"))


CPU_PLACE = pytest.mark.skipif(HAS_CUDA, reason="the gloo (CPU) place: CI runs it; a GPU machine runs the CUDA "
                                                "places (the CPU ones took 50-230 s each there)")


def places(gpus_for_nccl):
    """(device, backend) of each place a check runs (the module docstring says which is which)."""
    return [pytest.param("cpu", "gloo", id="cpu", marks=CPU_PLACE),
            pytest.param("cuda", ONE_GPU, id="one-gpu", marks=requires_cuda),
            pytest.param("cuda", "nccl", id="gpus-nccl", marks=needs_gpus(gpus_for_nccl))]


# The one-GPU place: a single process on cuda:0 (NCCL, a world of 1, meshes of size 1), so every rule
# and the CUDA kernels under it run, with no collective to make. Two processes sharing the GPU over
# gloo (which takes CUDA tensors through pinned host memory) segfaulted a process in 4 of 5 checks on
# the H100 (torch 2.11), and NCCL refuses two ranks on one GPU.
ONE_GPU = "nccl-1"


# The shared GPU hosts forbid NVLink multicast (it can take a host's GPUs out of service): NCCL's NVLS,
# torch's symmetric-memory multicast and NVSHMEM's stay off in every rank.
NVLINK_MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(check, world, device, backend, *extra):
    world = 1 if backend == ONE_GPU else world
    mp.spawn(run_check, args=(check, world, free_port(), device, backend, *extra), nprocs=world, join=True)


def run_check(rank, check, *args):
    """mp.spawn's target: check(rank, *args), then, once it passed (and tore the group down), the
    process ends at once, skipping the interpreter's finalization. A gloo worker thread can still be
    releasing the last reference to an earlier collective's work (the barrier's list of prior work
    holds it) when the main thread returns; that work's tensors are Python objects, so the worker
    waits for the GIL, and taking the GIL while the interpreter finalizes ends the thread inside a
    noexcept destructor: std::terminate, "terminate called without an active exception", SIGABRT
    (core dump: ProcessGroupGloo::runLoop > ~AsyncBarrierWork > ~AsyncAllgatherCoalescedWork >
    TensorImpl::decref_pyobject > take_gil > pthread_exit, the main thread in Py_FinalizeEx). It hit
    about one spawn in ten of the MLP and block checks on 2 cores. A failing check raises as before
    (mp.spawn reports its traceback)."""
    check(rank, *args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def join(rank, world, port, device, backend):
    """Joins the process group and returns the device this rank computes on: the CPU; cuda:0 for every
    rank under gloo (the processes share the one GPU: gloo copies CUDA tensors through pinned host
    memory); cuda:<rank> under NCCL. float32 products are true FP32 ("highest": no TF32 in cuBLAS, and
    cuops' CUDA GEMMs follow the same setting), so sharded and unsharded agree to 1e-5 there too. A
    collective that waits past the timeout raises, rather than hanging the suite."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    for var, off in NVLINK_MULTICAST_OFF.items():
        os.environ.setdefault(var, off)
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    timeout = datetime.timedelta(minutes=3)
    if device == "cpu":
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout)
        return torch.device("cpu")
    backend = "nccl" if backend == ONE_GPU else backend
    dev = torch.device("cuda", rank if backend == "nccl" else 0)
    torch.cuda.set_device(dev)
    torch.cuda.init()  # initialized, dev current: DeviceMesh keeps it (else it picks rank % GPUs)
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout,
                            device_id=dev if backend == "nccl" else None)
    return dev


def teardown():
    """Every rank past its last collective before any tears gloo down (a rank closing its pairs while
    another still used them could abort it); run_check then ends the process."""
    try:
        dist.barrier()
    finally:
        dist.destroy_process_group()


def randn(gen, *shape, device):
    """The same values on every rank (gen seeded alike; drawn on the CPU, then moved)."""
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(device)


def check_ops(rank, world, port, device, backend):
    dev = join(rank, world, port, device, backend)
    try:
        import cuops  # registers the rules
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

        mesh = init_device_mesh(dev.type, (world,))
        gen = torch.Generator().manual_seed(1234)  # the same full tensors on every rank
        a, b = randn(gen, 6, 10, device=dev), randn(gen, 10, 4, device=dev)
        x, y = randn(gen, 6, 4, device=dev), randn(gen, 6, 4, device=dev)

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
        # linear and swiglu: rows of x, or the weights' rows (ColwiseParallel: each shard's columns
        # through the epilogue), forward and backward; a K split with an activation or a bias is
        # redistributed first (its result still right), without them a partial sum.
        w, bias, wu = randn(gen, 4, 10, device=dev), randn(gen, 4, device=dev), randn(gen, 4, 10, device=dev)
        for px, pw, out in ((Shard(0), Replicate(), Shard(0)), (Replicate(), Shard(0), Shard(1)),
                            (Replicate(), Replicate(), Replicate())):
            got = cuops.linear(dt(a, px), dt(w, pw), dt(bias, pw), "gelu")
            assert got.placements == (out,), (px, pw, got.placements)
            torch.testing.assert_close(got.full_tensor(), cuops.linear(a, w, bias, "gelu"), rtol=1e-12, atol=1e-12)
            for act in ("silu", "gelu_tanh"):
                got = cuops.swiglu(dt(a, px), dt(w, pw), dt(wu, pw), act)
                assert got.placements == (out,), (px, pw, got.placements)
                torch.testing.assert_close(got.full_tensor(), cuops.swiglu(a, w, wu, act), rtol=1e-12, atol=1e-12)
        got = cuops.linear(dt(a, Shard(1)), dt(w, Shard(1)), dt(bias, Replicate()), "silu")
        torch.testing.assert_close(got.full_tensor(), cuops.linear(a, w, bias, "silu"), rtol=1e-12, atol=1e-12)
        got = cuops.linear(dt(a, Shard(1)), dt(w, Shard(1)))
        assert got.placements == (Partial(),)
        torch.testing.assert_close(got.full_tensor(), cuops.linear(a, w), rtol=1e-12, atol=1e-12)
        leaves = [t.clone().requires_grad_() for t in (a, w, bias)]
        cuops.linear(*leaves, "gelu_tanh").sum().backward()
        for px, pw in ((Shard(0), Replicate()), (Replicate(), Shard(0))):
            sharded = [dt(a, px).requires_grad_(), dt(w, pw).requires_grad_(), dt(bias, pw).requires_grad_()]
            cuops.linear(*sharded, "gelu_tanh").full_tensor().sum().backward()
            for piece, whole in zip(sharded, leaves):
                torch.testing.assert_close(piece.grad.full_tensor(), whole.grad, rtol=1e-10, atol=1e-10)
        # lora_linear and lora_swiglu: x's rows (lora_x with them), or the weights' rows with their B's
        # (ColwiseParallel; A and the [rows, R] product replicated), forward and every gradient; a K
        # split is redistributed first (the adapter's product must not see partial sums).
        la, lb, lbu, lx = randn(gen, 3, 10, device=dev), randn(gen, 4, 3, device=dev), randn(gen, 4, 3, device=dev), \
            randn(gen, 6, 10, device=dev)
        whole = [t.clone().requires_grad_() for t in (a, w, la, lb, bias, lx, wu, lbu)]
        (cuops.lora_linear(*whole[:5], "gelu", whole[5]) + cuops.lora_swiglu(
            whole[0], whole[1], whole[6], whole[2], whole[3], whole[7], activation="gelu_tanh")).sum().backward()
        for px, pw, out in ((Shard(0), Replicate(), Shard(0)), (Replicate(), Shard(0), Shard(1)),
                            (Replicate(), Replicate(), Replicate())):
            sharded = [dt(t, p).requires_grad_() for t, p in zip(
                (a, w, la, lb, bias, lx, wu, lbu), (px, pw, Replicate(), pw, pw, px, pw, pw))]
            got = cuops.lora_linear(*sharded[:5], "gelu", sharded[5])
            assert got.placements == (out,), (px, pw, got.placements)
            torch.testing.assert_close(got.full_tensor(), cuops.lora_linear(a, w, la, lb, bias, "gelu", lx),
                                       rtol=1e-12, atol=1e-12)
            gated = cuops.lora_swiglu(sharded[0], sharded[1], sharded[6], sharded[2], sharded[3], sharded[7],
                                      activation="gelu_tanh")
            assert gated.placements == (out,), (px, pw, gated.placements)
            (got.full_tensor() + gated.full_tensor()).sum().backward()
            for i, (piece, full) in enumerate(zip(sharded, whole)):
                torch.testing.assert_close(piece.grad.full_tensor(), full.grad, rtol=1e-10, atol=1e-10, msg=str(i))
        got = cuops.lora_linear(dt(a, Shard(1)), dt(w, Shard(1)), dt(la, Shard(1)), dt(lb, Replicate()))
        torch.testing.assert_close(got.full_tensor(), cuops.lora_linear(a, w, la, lb), rtol=1e-12, atol=1e-12)
        # linear_cross_entropy: the tokens sharded (a per-token loss sharded alike, a sum partial, a mean
        # gathered first), forward and backward; replicated inputs, replicated results.
        vocab, vbias = randn(gen, 7, 10, device=dev), randn(gen, 7, device=dev)
        target = torch.tensor([0, 6, -100, 3, 3, 1], device=dev)
        for reduction, out, cap in (("none", Shard(0), None), ("sum", Partial(), 1.5), ("mean", Replicate(), None)):
            leaves = [t.clone().requires_grad_() for t in (a, vocab, vbias)]
            whole_loss = cuops.linear_cross_entropy(leaves[0], leaves[1], target, leaves[2], reduction=reduction,
                                                    softcap=cap)
            whole_loss.sum().backward()
            for px in (Shard(0), Replicate()):
                sharded = [dt(a, px).requires_grad_(), dt(vocab, Replicate()).requires_grad_(),
                           dt(vbias, Replicate()).requires_grad_()]
                got = cuops.linear_cross_entropy(sharded[0], sharded[1], dt(target, px), sharded[2],
                                                 reduction=reduction, softcap=cap)
                assert got.placements == ((out if px == Shard(0) else Replicate()),), (reduction, got.placements)
                torch.testing.assert_close(got.full_tensor(), whole_loss, rtol=1e-12, atol=1e-12)
                got.full_tensor().sum().backward()
                for piece, whole in zip(sharded, leaves):
                    torch.testing.assert_close(piece.grad.full_tensor(), whole.grad, rtol=1e-10, atol=1e-10)
        with pytest.raises(RuntimeError, match=r"cuops::linear_cross_entropy: expected weight replicated or "
                                               r"sharded along K, got a vocabulary-sharded weight"):
            cuops.linear_cross_entropy(dt(a, Shard(0)), dt(vocab, Shard(0)), dt(target, Shard(0)))
        # rms_norm and add_rms_norm: rows sharded (outputs alike) or replicated; the hidden dimension
        # sharded is gathered first (its result still right); forward and backward.
        nw = randn(gen, 10, device=dev)
        for px in (Shard(0), Replicate(), Shard(1)):
            got = cuops.rms_norm(dt(a, px), dt(nw, Replicate()))
            if px != Shard(1):
                assert got.placements == (px,), got.placements
            torch.testing.assert_close(got.full_tensor(), cuops.rms_norm(a, nw), rtol=1e-12, atol=1e-12)
            y, s = cuops.add_rms_norm(dt(a, px), dt(a.flip(0), px), dt(nw, Replicate()))
            torch.testing.assert_close(y.full_tensor(), cuops.add_rms_norm(a, a.flip(0), nw)[0], rtol=1e-12,
                                       atol=1e-12)
        leaves = [t.clone().requires_grad_() for t in (a, a.flip(0), nw)]
        wy, ws = cuops.add_rms_norm(*leaves)
        (wy.sum() + (ws * ws).sum()).backward()
        for px in (Shard(0), Replicate()):
            sharded = [dt(a, px).requires_grad_(), dt(a.flip(0), px).requires_grad_(),
                       dt(nw, Replicate()).requires_grad_()]
            y, s = cuops.add_rms_norm(*sharded)
            assert y.placements == (px,) and s.placements == (px,), (y.placements, s.placements)
            torch.testing.assert_close(y.full_tensor(), wy, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(s.full_tensor(), ws, rtol=0, atol=0)
            (y.full_tensor().sum() + (s.full_tensor() ** 2).sum()).backward()
            for piece, whole in zip(sharded, leaves):
                torch.testing.assert_close(piece.grad.full_tensor(), whole.grad, rtol=1e-10, atol=1e-10)
        # A narrower x beside the residual (autocast's mix): x's gradient comes from the backward's pass
        # in x's dtype (_rms_norm_bwd's x_dtype), sharded with the rows.
        xf = a.float()
        leaves = [t.clone().requires_grad_() for t in (xf, a.flip(0), nw)]
        cuops.add_rms_norm(*leaves)[0].sum().backward()
        for px in (Shard(0), Replicate()):
            sharded = [dt(xf, px).requires_grad_(), dt(a.flip(0), px).requires_grad_(),
                       dt(nw, Replicate()).requires_grad_()]
            cuops.add_rms_norm(*sharded)[0].full_tensor().sum().backward()
            assert sharded[0].grad.dtype == torch.float32 and sharded[0].grad.placements == (px,)
            for piece, whole in zip(sharded, leaves):
                torch.testing.assert_close(piece.grad.full_tensor(), whole.grad, rtol=1e-6, atol=1e-6)
        # rotary: batch, heads or positions sharded alike; cos and sin replicated or sharded with them.
        q4, k4 = randn(gen, 2, 4, 6, 8, device=dev), randn(gen, 2, 2, 6, 8, device=dev)
        cb, sb = randn(gen, 2, 6, 8, device=dev), randn(gen, 2, 6, 8, device=dev)
        want_q, want_k = cuops.rotary(q4, k4, cb, sb)
        for pq, pc in ((Shard(0), Shard(0)), (Shard(1), Replicate()), (Shard(2), Shard(1)), (Replicate(), Replicate())):
            oq, ok = cuops.rotary(dt(q4, pq), dt(k4, pq), dt(cb, pc), dt(sb, pc))
            assert oq.placements == (pq,) and ok.placements == (pq,), (pq, oq.placements)
            torch.testing.assert_close(oq.full_tensor(), want_q, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(ok.full_tensor(), want_k, rtol=1e-12, atol=1e-12)
        # Mixture of experts: grouped_mm with b's N, or K, sharded; the router and the experts with the
        # tokens sharded (each process routes its own; the weights' gradients partial sums), forward
        # and every gradient; replicated inputs, replicated results.
        offs = torch.tensor([2, 2, 6], dtype=torch.int32, device=dev)
        gb = randn(gen, 3, 10, 4, device=dev)
        for pa, pb, out in ((Replicate(), Shard(2), Shard(1)), (Shard(1), Shard(1), Partial()),
                            (Replicate(), Replicate(), Replicate())):
            got = cuops.grouped_mm(dt(a, pa), dt(gb, pb), dt(offs, Replicate()))
            assert got.placements == (out,), (pa, pb, got.placements)
            torch.testing.assert_close(got.full_tensor(), cuops.grouped_mm(a, gb, offs), rtol=1e-12, atol=1e-12)
        router, gate_up, down = randn(gen, 5, 10, device=dev), randn(gen, 5, 8, 10, device=dev), \
            randn(gen, 5, 10, 4, device=dev)
        whole = [t.clone().requires_grad_() for t in (a, router, gate_up, down)]

        def moe(x, r, gu, d):
            w, idx = cuops.moe_topk_softmax(x @ r.t(), 2, True)
            return cuops.moe_experts(x, idx, w, gu, d)

        moe_want = moe(*whole)
        moe_want.sum().backward()
        for px in (Shard(0), Replicate()):
            sharded = [dt(t, p).requires_grad_() for t, p in zip(whole, (px, Replicate(), Replicate(), Replicate()))]
            got = moe(*sharded)
            assert got.placements == (px,), got.placements
            torch.testing.assert_close(got.full_tensor(), moe_want, rtol=1e-12, atol=1e-12)
            got.full_tensor().sum().backward()
            for i, (piece, full) in enumerate(zip(sharded, whole)):
                torch.testing.assert_close(piece.grad.full_tensor(), full.grad, rtol=1e-10, atol=1e-10, msg=str(i))
        # A partial sum (k-split mm) scaled stays partial and reduces to the scaled product.
        part = ops.mm(dt(a, Shard(1)), dt(b, Shard(0)))
        got = ops.scale(part, 0.5)
        assert got.placements == (Partial(),)
        torch.testing.assert_close(got.full_tensor(), ops.scale(want, 0.5), rtol=1e-12, atol=1e-12)
    finally:
        teardown()


def check_ops_2d(rank, world, port, device, backend, shape):
    """The rules on a 2-D mesh of `shape`: each mesh dimension takes its own placement of the rule's
    (add2 and gemm: c's placement on each, a and b moved to match)."""
    dev = join(rank, world, port, device, backend)
    try:
        import cuops  # noqa: F401  (registers the rules)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

        mesh = init_device_mesh(dev.type, shape)
        gen = torch.Generator().manual_seed(99)
        a, b = randn(gen, 8, 12, device=dev), randn(gen, 12, 6, device=dev)
        x, y = randn(gen, 8, 6, device=dev), randn(gen, 8, 6, device=dev)

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
    """A float64 DTensor of `placements` on `mesh` and its full value (on the mesh's device). Each Partial
    mesh dimension holds a different random piece on each of its coordinates (the value their sum, or
    mean for "avg", or max), not one value and zeros, so a piece counted twice or dropped shows. Same
    calls on every rank give the same pieces (gen is seeded alike; drawn on the CPU, then moved)."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, distribute_tensor

    partial = [i for i, p in enumerate(placements) if isinstance(p, Partial)]
    grid = list(itertools.product(*(range(mesh.size(i)) for i in partial)))
    pieces = {g: torch.randn(shape, generator=gen, dtype=torch.float64) if fill is None
              else torch.full(shape, fill, dtype=torch.float64) for g in grid}
    coord = mesh.get_coordinate()
    mine = pieces[tuple(coord[i] for i in partial)]
    local = distribute_tensor(mine.to(mesh.device_type), mesh,
                              [Replicate() if isinstance(p, Partial) else p for p in placements],
                              src_data_rank=None).to_local()
    full = torch.stack(list(pieces.values()))
    ops_ = {placements[i].reduce_op for i in partial}
    if ops_ == {"max"}:
        full = full.amax(0)
    else:  # sums and averages commute (each linear)
        assert ops_ <= {"sum", "avg"}, ops_
        div = math.prod(mesh.size(i) for i in partial if placements[i].reduce_op == "avg")
        full = full.sum(0) / div
    return DTensor.from_local(local.clone(), mesh, placements), full.to(mesh.device_type)


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


def check_inplace(rank, world, port, device, backend):
    """add2 and gemm on DTensors, for every placement of c, a and b on a 1-D mesh: c keeps its placement
    and its local storage (the write lands in it) and equals the single-process result; a and b are
    left as they were; a c placement that no rule has raises before anything is written."""
    dev = join(rank, world, port, device, backend)
    try:
        import cuops  # noqa: F401  (registers the rules)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

        mesh = init_device_mesh(dev.type, (world,))
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


def mlp(linear=CuopsLinear):
    return torch.nn.Sequential(linear(16, 32), torch.nn.ReLU(), linear(32, 12))


def full(t):
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


# bfloat16: the sharded model against the unsharded one, with cuops Linears and with aten's nn.Linear
# (the same model, weights and batch). Neither is exact: a RowwiseParallel layer sums bf16 partial
# products (each rounded to bf16) where the unsharded one rounds the whole sum once, which moves outputs
# and gradients by about one bf16 rounding (relative errors of 1e-3 to 1e-2 on aten). aten's tolerance
# for the model is the worst relative error it shows over the output and every gradient; each of
# cuops' errors must be within BF16_FACTOR times that, plus BF16_FLOOR (on the CPU cuops.mm is its
# reference, a float32 at::mm rounded once to bf16; on a GPU its own kernels):
# - worst against worst, not tensor by tensor: a 12-element bias gradient's error is noise (on CPU, over
#   40 seeds, cuops' was up to 8 times aten's for one, both under 2e-3), while the worst over the model
#   is stable (cuops / aten at most 1.55 over 55 seeds of the MLP and the block, on CPU).
# - the factor 2: CuopsLinear rounds twice (mm, then + bias) where nn.Linear's addmm rounds once, so
#   cuops' errors run higher (1.1-1.4 times aten's on the MLP's output); sampling noise takes the rest.
# - the floor 2^-10 (a quarter of bf16's unit roundoff 2^-8): should aten's errors all be 0 (bitwise
#   equal sharded and unsharded), cuops may still differ in an element rounded the other way after a
#   float32 sum in another order (its kernels pick a plan by shape), not in every element.
# A wrong partial sum, a dropped or doubled piece, is an O(1) error: far outside. aten's own worst is
# checked against BF16_SANE (8 bf16 epsilons) so that a broken baseline cannot make the bound vacuous.
BF16_FACTOR = 2.0
BF16_FLOOR = 2.0 ** -10
BF16_SANE = 2.0 ** -4


def bf16_errors(build, plan, mesh, inputs, loss):
    """Relative Frobenius errors, sharded against unsharded, of the output and of each parameter's
    gradient: build() makes the model (bfloat16, this rank's device, the same on every rank), plan
    parallelizes a copy."""
    from torch.distributed.tensor.parallel import parallelize_module

    ref, tp = build(), build()
    tp.load_state_dict(ref.state_dict())
    parallelize_module(tp, mesh, plan)
    want, got = ref(*inputs), tp(*inputs)
    errors = {"output": rel_error(full(got), want)}
    loss(want).backward()
    loss(got).backward()
    for (name, p_ref), (_, p_tp) in zip(ref.named_parameters(), tp.named_parameters()):
        errors[f"grad {name}"] = rel_error(full(p_tp.grad), p_ref.grad)
    return errors


def check_bf16_like_aten(errors, what):
    """errors: {"cuops": {...}, "aten": {...}} from bf16_errors; the bound above."""
    tol = max(errors["aten"].values())
    assert tol <= BF16_SANE, (what, "aten's own sharded error", errors["aten"])
    bound = BF16_FACTOR * tol + BF16_FLOOR
    for key, err in errors["cuops"].items():
        assert err <= bound, (what, key, err, bound, errors)


def write_report(path, rank, errors):
    if path is not None and rank == 0:
        with open(path, "w") as f:
            json.dump(errors, f)


def report_bf16(path, what):
    """A line in pytest's summary: the bf16 errors the spawned check measured (and asserted)."""
    with open(path) as f:
        errors = json.load(f)
    worst = {k: max(v.items(), key=lambda kv: kv[1]) for k, v in errors.items()}
    REPORT.append(f"bf16 {what}, sharded vs unsharded, worst relative error: cuops {worst['cuops'][1]:.2e} "
                  f"({worst['cuops'][0]}), aten {worst['aten'][1]:.2e} ({worst['aten'][0]}); bound "
                  f"{BF16_FACTOR:g} x aten + 2^-10 = {BF16_FACTOR * worst['aten'][1] + BF16_FLOOR:.2e}")


def check_mlp(rank, world, port, device, backend, report=None):
    """Forward and backward of Linear(16 -> 32) colwise, ReLU, Linear(32 -> 12) rowwise: float32 to 1e-5
    against the unsharded MLP; then bfloat16, cuops' errors within aten's (bf16_errors)."""
    dev = join(rank, world, port, device, backend)
    try:
        import cuops  # noqa: F401  (registers the rules)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh(dev.type, (world,))
        torch.manual_seed(7)  # the same model and batch on every rank
        ref, tp = mlp().to(dev), mlp().to(dev)
        tp.load_state_dict(ref.state_dict())
        parallelize_module(tp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        x = torch.randn(4, 5, 16).to(dev)
        want, got = ref(x), tp(x)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        want.square().sum().backward()
        got.square().sum().backward()
        for (name, p_ref), (_, p_tp) in zip(ref.named_parameters(), tp.named_parameters()):
            torch.testing.assert_close(p_tp.grad.full_tensor(), p_ref.grad, rtol=1e-5, atol=1e-6, msg=name)

        errors = {}
        for name, linear in (("cuops", CuopsLinear), ("aten", torch.nn.Linear)):
            def build(linear=linear):
                torch.manual_seed(8)
                return mlp(linear).to(dev, torch.bfloat16)

            x = torch.randn(4, 5, 16, generator=torch.Generator().manual_seed(9)).to(dev, torch.bfloat16)
            errors[name] = bf16_errors(build, {"0": ColwiseParallel(), "2": RowwiseParallel()}, mesh, (x,),
                                       lambda out: out.float().square().sum())
        check_bf16_like_aten(errors, "MLP")
        write_report(report, rank, errors)
    finally:
        teardown()


class Block(torch.nn.Module):
    """A pre-norm transformer block on cuops Linears (or `linear`'s): x + o(attention(q, k, v of
    norm(x))), then x + down(gelu(up(norm(x)))). The number of heads comes from q's width, so under
    ColwiseParallel each process runs n_heads / world of them (heads_run records how many ran)."""

    def __init__(self, dim=16, n_heads=4, hidden=32, linear=CuopsLinear):
        super().__init__()
        self.head_dim = dim // n_heads
        self.attn_norm, self.mlp_norm = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        # q, k, v without bias (as in Llama): k's bias has gradient 0 in exact arithmetic (softmax is
        # shift-invariant), so its float32 gradient is rounding noise that AdamW would scale to lr.
        self.q, self.k, self.v = (linear(dim, dim, bias=False) for _ in range(3))
        self.o = linear(dim, dim)
        self.up, self.down = linear(dim, hidden), linear(hidden, dim)
        self.heads_run = None

    def forward(self, x):
        batch, seq, _ = x.shape
        h = self.attn_norm(x)
        q, k, v = (proj(h).view(batch, seq, -1, self.head_dim).transpose(1, 2) for proj in (self.q, self.k, self.v))
        self.heads_run = q.shape[1]
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(att.transpose(1, 2).reshape(batch, seq, -1))
        return x + self.down(torch.nn.functional.gelu(self.up(self.mlp_norm(x))))


def twin_blocks(dev, seed):
    """Two equal Blocks on dev, the same on every rank (seeded alike): the reference and the one to
    shard. Also seeds what the check draws next (its batch), alike on every rank."""
    torch.manual_seed(seed)
    ref, other = Block().to(dev), Block().to(dev)
    other.load_state_dict(ref.state_dict())
    return ref, other


def assert_same(got, want, what):
    """float32 sharded against unsharded: 1e-5 relative (Frobenius) and elementwise."""
    got = full(got)
    rel = ((got - want).norm() / want.norm()).item()
    assert rel <= 1e-5, (what, rel)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=what)


TP_PLAN = ("q", "k", "v", "up"), ("o", "down")  # colwise, rowwise


def tp_plan():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {**{name: ColwiseParallel() for name in TP_PLAN[0]}, **{name: RowwiseParallel() for name in TP_PLAN[1]}}


def check_block(rank, world, port, device, backend, report=None):
    """One AdamW step of Block under tensor parallelism (q, k, v, up colwise; o, down rowwise; the norms
    replicated) against the unsharded Block: loss, every gradient, every updated weight, and the loss
    after the step, float32, to 1e-5 relative. Then bfloat16 forward and backward, cuops' errors within
    aten's (bf16_errors)."""
    dev = join(rank, world, port, device, backend)
    try:
        import cuops  # noqa: F401  (registers the rules)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor.parallel import parallelize_module

        mesh = init_device_mesh(dev.type, (world,))
        ref, tp = twin_blocks(dev, 11)
        plan = tp_plan()
        parallelize_module(tp, mesh, plan)
        assert isinstance(tp.q.weight, DTensor) and not isinstance(tp.attn_norm.weight, DTensor)
        x, target = torch.randn(2, 5, 16).to(dev), torch.randn(2, 5, 16).to(dev)
        same = assert_same
        losses = []
        for model in (ref, tp):
            # foreach=False: on CUDA the default multi-tensor step takes the replicated norm's plain
            # tensors and the sharded DTensors in one call, which DTensor refuses.
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, foreach=False)
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

        errors = {}
        gen = torch.Generator().manual_seed(13)
        x, target = (torch.randn(2, 5, 16, generator=gen).to(dev, torch.bfloat16) for _ in range(2))
        for name, linear in (("cuops", CuopsLinear), ("aten", torch.nn.Linear)):
            def build(linear=linear):
                torch.manual_seed(12)
                return Block(linear=linear).to(dev, torch.bfloat16)

            errors[name] = bf16_errors(build, plan, mesh, (x,),
                                       lambda out: torch.nn.functional.mse_loss(out.float(), target.float()))
        check_bf16_like_aten(errors, "transformer block")
        write_report(report, rank, errors)
    finally:
        teardown()


def check_block_compiled(rank, world, port, device, backend):
    """The tensor-parallel Block under torch.compile (inductor, fullgraph: one graph, no break) against
    the unsharded eager Block: output, loss, every gradient and every weight after one AdamW step,
    float32 to 1e-5 relative. The graph dynamo captured calls cuops.mm on the DTensors (so the rules
    ran under the compiler, not eager code around it), and a second batch runs without recompiling."""
    dev = join(rank, world, port, device, backend)
    try:
        import cuops  # noqa: F401  (registers the rules)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import parallelize_module
        from torch._inductor.compile_fx import compile_fx

        mesh = init_device_mesh(dev.type, (world,))
        ref, tp = twin_blocks(dev, 21)
        parallelize_module(tp, mesh, tp_plan())
        graphs = []

        def inductor(gm, example_inputs):
            graphs.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"])
            return compile_fx(gm, example_inputs)

        compiled = torch.compile(tp, backend=inductor, fullgraph=True)
        x, target = torch.randn(2, 5, 16).to(dev), torch.randn(2, 5, 16).to(dev)
        out = []
        for model in (ref, compiled):
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, foreach=False)
            y = model(x)
            loss = torch.nn.functional.mse_loss(y, target)
            loss.backward()
            opt.step()
            out.append((y.detach(), loss.detach()))
        assert len(graphs) == 1, f"{len(graphs)} graphs: expected one"
        mms = sum("cuops.mm" in t for t in graphs[0])
        assert mms == 6, (mms, graphs[0])  # q, k, v, o, up, down
        assert tp.heads_run == 4 // world
        assert_same(out[1][0], out[0][0], "output")
        assert_same(out[1][1], out[0][1], "loss")
        for (name, p_ref), (_, p_tp) in zip(ref.named_parameters(), tp.named_parameters()):
            assert_same(p_tp.grad, p_ref.grad, f"grad {name}")
            assert_same(p_tp.detach(), p_ref.detach(), f"updated {name}")
        x2 = torch.randn(2, 5, 16).to(dev)
        assert_same(compiled(x2).detach(), ref(x2).detach(), "output of a second batch")  # weights stepped
        assert len(graphs) == 1, "recompiled for a second batch of the same shape"
    finally:
        teardown()


def check_fsdp(rank, world, port, device, backend):
    """FSDP2: Block with fully_shard on each Linear and on the whole (parameters Shard(0) DTensors over
    the ranks, gathered into plain tensors for each layer's cuops.mm, gradients reduce-scattered and
    averaged), each rank on its slice of the batch, three AdamW steps, against one process on the whole
    batch: the mean of the ranks' losses at each step and every parameter after the last, float32 to
    1e-5 relative."""
    dev = join(rank, world, port, device, backend)
    try:
        import cuops  # noqa: F401
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor import DTensor, Shard

        mesh = init_device_mesh(dev.type, (world,))
        ref, sharded = twin_blocks(dev, 31)
        for name in TP_PLAN[0] + TP_PLAN[1]:
            fully_shard(getattr(sharded, name), mesh=mesh)
        fully_shard(sharded, mesh=mesh)
        w = sharded.up.weight
        assert isinstance(w, DTensor) and w.placements == (Shard(0),) and w.to_local().shape[0] == 32 // world
        batch = 4
        gen = torch.Generator().manual_seed(32)
        mine = slice(rank * batch // world, (rank + 1) * batch // world)
        opts = [torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1, foreach=False) for m in (ref, sharded)]
        losses = []
        for step in range(3):
            x, target = (torch.randn(batch, 5, 16, generator=gen).to(dev) for _ in range(2))
            step_losses = []
            for model, opt, rows in ((ref, opts[0], slice(None)), (sharded, opts[1], mine)):
                loss = torch.nn.functional.mse_loss(model(x[rows]), target[rows])
                loss.backward()
                opt.step()
                opt.zero_grad()
                step_losses.append(loss.detach())
            mean = step_losses[1].clone()
            dist.all_reduce(mean)
            assert_same(mean / world, step_losses[0], f"mean loss of step {step}")
            losses.append(step_losses[0])
        assert losses[-1] < losses[0]  # the steps trained
        for (name, p_ref), (_, p) in zip(ref.named_parameters(), sharded.named_parameters()):
            assert_same(p.detach(), p_ref.detach(), f"{name} after 3 steps")
    finally:
        teardown()


@pytest.mark.parametrize("device, backend", places(2))
def test_sharded_ops_equal_the_unsharded_ones_on_two_processes(device, backend):
    spawn(check_ops, 2, device, backend)


def meshes_2d(backend):
    """The 2-D mesh shapes a place runs: 2 x 2 on 4 gloo processes, or on NCCL with 4 GPUs; with 2 GPUs,
    NCCL's 2 x 1 and 1 x 2 (one GPU a rank, so 2 x 2 needs 4 GPUs: each mesh dimension still takes
    every placement of the rules with a real collective under it); 1 x 1 on one GPU."""
    if backend == ONE_GPU:
        return [(1, 1)]
    if backend == "nccl" and torch.cuda.device_count() < 4:
        return [(2, 1), (1, 2)]
    return [(2, 2)]


@pytest.mark.parametrize("device, backend", places(2))
def test_sharded_ops_equal_the_unsharded_ones_on_2d_meshes(device, backend):
    shapes = meshes_2d(backend)
    for shape in shapes:
        spawn(check_ops_2d, math.prod(shape), device, backend, shape)
    REPORT.append(f"2-D meshes run ({device}, {backend}): " + ", ".join(f"{a} x {b}" for a, b in shapes))


@pytest.mark.parametrize("device, backend", places(2))
def test_add2_and_gemm_write_in_place_for_every_placement_and_reject_the_others(device, backend):
    spawn(check_inplace, 2, device, backend)


@pytest.mark.parametrize("device, backend", places(2))
def test_colwise_rowwise_mlp_of_cuops_linears_trains_as_unsharded(device, backend, tmp_path):
    """Forward and backward of Linear(16 -> 32) colwise, ReLU, Linear(32 -> 12) rowwise: float32 to 1e-5;
    bfloat16 within aten's error on the same MLP."""
    spawn(check_mlp, 2, device, backend, str(tmp_path / "bf16.json"))
    report_bf16(tmp_path / "bf16.json", f"MLP on 2 processes ({device}, {backend})")


@pytest.mark.parametrize("device, backend", places(2))
def test_tensor_parallel_transformer_block_of_cuops_linears_trains_as_unsharded(device, backend, tmp_path):
    """Attention (heads split over 2 processes) and MLP on cuops Linears: one AdamW step, float32 to
    1e-5; bfloat16 forward and backward within aten's error on the same block."""
    spawn(check_block, 2, device, backend, str(tmp_path / "bf16.json"))
    report_bf16(tmp_path / "bf16.json", f"transformer block on 2 processes ({device}, {backend})")


@pytest.mark.parametrize("device, backend", places(2))
def test_tensor_parallel_transformer_block_under_torch_compile_trains_as_unsharded(device, backend):
    """The block of the test above, compiled whole (inductor, no graph break), 2 processes: float32 to
    1e-5 against the unsharded eager block."""
    spawn(check_block_compiled, 2, device, backend)


@pytest.mark.parametrize("device, backend", places(2))
def test_fsdp2_training_of_cuops_block_equals_one_process(device, backend):
    """fully_shard over 2 processes, each on half the batch: 3 AdamW steps equal one process's."""
    spawn(check_fsdp, 2, device, backend)
