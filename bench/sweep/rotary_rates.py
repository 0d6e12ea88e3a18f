"""rotary against Hugging Face's apply_rotary_pos_emb (eager and torch.compile) and the copy rate: forward,
and the backward alone (autograd from the outputs' gradients, each side's own), on q [B, Hq, T, D] / k [B, Hk, T, D]
in HF's layout (the projection's transposed view), bf16 and autocast's mix (float32 cos / sin, float32
out). Bytes counted: q and k read and written once, cos / sin once a position. An experiment: its output
is not committed.

    python3 bench/sweep/rotary_rates.py
"""
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cuops  # noqa: E402
from cuops_bench.sections.rms_norm import hf_rotary  # noqa: E402  (the bench section's HF code)


def copy_rate(nbytes):
    a = torch.empty(nbytes // 4, device="cuda")
    b = torch.empty_like(a)
    return 2 * nbytes / do_bench(lambda: b.copy_(a)) / 1e6


def main():
    compiled = torch.compile(hf_rotary)
    b, t, hq, hk, d = 8, 1024, 16, 4, 128
    print(f"{'mix':<5} {'pass':<4} {'cuops us':>9} {'GB/s':>6} {'copy':>5} {'eager':>6} {'compiled':>8}")
    for mix in ("bf16", "auto"):
        trig = torch.float32 if mix == "auto" else torch.bfloat16
        q = torch.randn(b, t, hq * d, device="cuda", dtype=torch.bfloat16).view(b, t, hq, d).transpose(1, 2)
        k = torch.randn(b, t, hk * d, device="cuda", dtype=torch.bfloat16).view(b, t, hk, d).transpose(1, 2)
        pos = torch.arange(t, device="cuda", dtype=torch.float32)
        freqs = pos[:, None] / 10000 ** (torch.arange(0, d, 2, device="cuda") / d)
        emb = torch.cat((freqs, freqs), -1)[None].expand(b, t, d)
        cos, sin = emb.cos().to(trig).contiguous(), emb.sin().to(trig).contiguous()
        out_size = 4 if mix == "auto" else 2
        elems = b * t * (hq + hk) * d
        trig_bytes = 2 * b * t * d * cos.element_size()
        fwd_bytes = elems * (2 + out_size) + trig_bytes
        copy = copy_rate(fwd_bytes // 2)
        fwd = {"cuops": lambda: cuops.rotary(q, k, cos, sin), "eager": lambda: hf_rotary(q, k, cos, sin),
               "compiled": lambda: compiled(q, k, cos, sin)}
        times = {s: do_bench(f) for s, f in fwd.items()}
        print(f"{mix:<5} fwd  {times['cuops'] * 1e3:9.1f} {fwd_bytes / times['cuops'] / 1e6:6.0f} "
              f"{fwd_bytes / times['cuops'] / 1e6 / copy:5.2f} {times['eager'] / times['cuops']:6.2f} "
              f"{times['compiled'] / times['cuops']:8.2f}")
        # The backward alone (autograd from the outputs' gradients, in the outputs' dtype, to q's and k's
        # in bf16): gradients read once, q / k gradients written once.
        gq = torch.randn(q.shape, device="cuda", dtype=torch.float32 if mix == "auto" else torch.bfloat16)
        gk = torch.randn(k.shape, device="cuda", dtype=gq.dtype)
        bwd_bytes = elems * (gq.element_size() + 2) + trig_bytes
        qr, kr = q.detach().requires_grad_(), k.detach().requires_grad_()
        outs = {"cuops": cuops.rotary(qr, kr, cos, sin), "eager": hf_rotary(qr, kr, cos, sin),
                "compiled": compiled(qr, kr, cos, sin)}
        bwd = {s: (lambda o=o: torch.autograd.grad(o, (qr, kr), (gq, gk), retain_graph=True))
               for s, o in outs.items()}
        # The op alone (autograd's host time can exceed a 40 us kernel's).
        op_us = do_bench(lambda: torch.ops.cuops._rotary_bwd(gq, gk, cos, sin, torch.bfloat16)) * 1e3
        print(f"{mix:<5} _rotary_bwd alone {op_us:.1f} us, {bwd_bytes / op_us / 1e3:.0f} GB/s, "
              f"{bwd_bytes / op_us / 1e3 / copy:.2f} of copy")
        times = {s: do_bench(f) for s, f in bwd.items()}
        print(f"{mix:<5} bwd  {times['cuops'] * 1e3:9.1f} {bwd_bytes / times['cuops'] / 1e6:6.0f} "
              f"{bwd_bytes / times['cuops'] / 1e6 / copy:5.2f} {times['eager'] / times['cuops']:6.2f} "
              f"{times['compiled'] / times['cuops']:8.2f}")


if __name__ == "__main__":
    main()
