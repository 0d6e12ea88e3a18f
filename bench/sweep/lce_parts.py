"""linear_cross_entropy's CUDA walk piece by piece at one (T, K, V) in bf16: one chunk's three products
(cuops against torch.mm; the weight gradient with beta 0 and 1), the op's forward alone and forward +
backward, and a profile of the step's kernels. An experiment: its output is not committed.

    python3 bench/sweep/lce_parts.py 8192 2048 128256 [chunk rows, default 1920]
"""
import sys

import torch
from triton.testing import do_bench

import cuops  # noqa: F401  (registers torch.ops.cuops)


def main() -> None:
    torch.manual_seed(0)
    tokens, k, vocab = (int(a) for a in sys.argv[1:4])
    rows = int(sys.argv[4]) if len(sys.argv) > 4 else 1920
    dt = torch.bfloat16
    ops = torch.ops.cuops
    x = torch.randn(tokens, k, device="cuda", dtype=dt)
    w = torch.randn(vocab, k, device="cuda", dtype=dt) / k ** 0.5
    t = torch.randint(0, vocab, (tokens,), device="cuda")
    ld = (vocab + 7) // 8 * 8
    logits = torch.empty(rows, ld, device="cuda", dtype=dt)[:, :vocab]
    xc = x[:rows]
    dx = torch.empty(rows, k, device="cuda", dtype=dt)
    dw = torch.empty(vocab, k, device="cuda", dtype=dt)
    chunk_flops = 2 * rows * vocab * k

    def line(name, flops, fn):
        ms = do_bench(fn, warmup=50, rep=300)
        print(f"{name:28s} {ms:8.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s")

    ops.gemm(logits, xc, w.t(), 1.0, 0.0)
    line("chunk logits, cuops", chunk_flops, lambda: ops.gemm(logits, xc, w.t(), 1.0, 0.0))
    line("chunk logits, torch.mm", chunk_flops, lambda: torch.mm(xc, w.t()))
    line("chunk dx, cuops", chunk_flops, lambda: ops.gemm(dx, logits, w, 1.0, 0.0))
    line("chunk dx, torch.mm", chunk_flops, lambda: torch.mm(logits, w))
    line("chunk dweight beta 0, cuops", chunk_flops, lambda: ops.gemm(dw, logits.t(), xc, 1.0, 0.0))
    line("chunk dweight beta 1, cuops", chunk_flops, lambda: ops.gemm(dw, logits.t(), xc, 1.0, 1.0))
    line("chunk dweight, torch addmm_", chunk_flops, lambda: dw.addmm_(logits.t(), xc))
    full = 2 * tokens * vocab * k
    line("forward, no gradients", full, lambda: ops._linear_cross_entropy_fwd(x, w, t, None, -100, "mean"))
    line("forward with gradients", 3 * full, lambda: ops._linear_cross_entropy_fwd_grad(x, w, t, None, -100, "mean",
                                                                               [True, True, False]))
    xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()

    def step():
        return torch.autograd.grad(ops.linear_cross_entropy(xr, wr, t), (xr, wr))

    line("forward + backward", 3 * full, step)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))


if __name__ == "__main__":
    main()
