"""A few SGD steps of a small model built on cuops.mm and cuops.vector_add, run either as one process on
cuda:0 over the whole batch, or under torchrun as DistributedDataParallel over NCCL with the batch split
between the ranks. DDP averages the ranks' gradients, which for a mean loss over equal shards is the
full-batch gradient, so both runs must end with the same parameters (to float32 rounding).

    python ddp_step.py --out single.pt
    python -m torch.distributed.run --standalone --nproc_per_node=2 ddp_step.py --out ddp.pt

Run by tests/python/test_reliability.py::test_ddp_two_processes_match_single_process.
"""
import argparse
import os
import pathlib
import sys

import torch
import torch.distributed as dist

# The package is the one place that finds the library ($CUOPS_LIBRARY, $CUOPS_BUILD_DIR, build/).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
import cuops  # noqa: E402

ops = cuops.ops

BATCH, STEPS, LR = 64, 3, 0.1


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w1 = torch.nn.Parameter(torch.randn(16, 32, generator=g) * 0.3)
        self.b1 = torch.nn.Parameter(torch.randn(32, generator=g) * 0.1)
        self.w2 = torch.nn.Parameter(torch.randn(32, 4, generator=g) * 0.3)

    def forward(self, x):
        h = ops.mm(x, self.w1)
        h = torch.relu(ops.vector_add(h, self.b1.expand_as(h)))  # expanded input: grad sums over rows
        return ops.mm(h, self.w2)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    g = torch.Generator().manual_seed(1)
    x_all, y_all = torch.randn(BATCH, 16, generator=g), torch.randn(BATCH, 4, generator=g)
    shard = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    x, y = x_all[shard].to(device), y_all[shard].to(device)

    net = Net().to(device)
    initial = {k: v.detach().cpu().clone() for k, v in net.named_parameters()}
    model = net
    if world > 1:
        dist.init_process_group("nccl", device_id=device)
        model = torch.nn.parallel.DistributedDataParallel(net, device_ids=[device.index])
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for _ in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    final = {k: v.detach().cpu().clone() for k, v in net.named_parameters()}
    if world > 1:
        # Every rank must hold the same parameters; rank 0 writes them.
        for v in final.values():
            mine = v.to(device)
            theirs = [torch.empty_like(mine) for _ in range(world)]
            dist.all_gather(theirs, mine)
            assert all(torch.equal(t, mine) for t in theirs), "ranks diverged"
        dist.destroy_process_group()
    if rank == 0:
        torch.save({"initial": initial, "final": final}, args.out)


if __name__ == "__main__":
    main()
