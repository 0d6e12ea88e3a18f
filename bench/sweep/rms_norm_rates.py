"""rms_norm and add_rms_norm against Hugging Face's code (eager and torch.compile) and the copy rate:
forward, and forward + backward, over model-sized rows in bf16 and in autocast's mix (a bf16 sublayer
output beside a float32 residual stream and float32 weight). Bytes counted: what the op must move (its
inputs read once, its outputs written once; backward: dy, the saved sum, the gradients; the weight and
the per-row statistics left out). An experiment: its output is not committed; the bench section
(`--only rms_norm`) times the backward alone.

    python3 bench/sweep/rms_norm_rates.py [ROWSxD ...]
"""
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cuops  # noqa: E402
from cuops_bench.sections.rms_norm import hf_add_norm, hf_norm  # noqa: E402  (the bench section's HF code)


def copy_rate(nbytes):
    a = torch.empty(nbytes // 4, device="cuda")
    b = torch.empty_like(a)
    ms = do_bench(lambda: b.copy_(a))
    return 2 * nbytes / ms / 1e6


def main() -> None:
    torch.manual_seed(0)
    torch._dynamo.config.recompile_limit = 64  # one graph per shape and mix; past 8 it would run eager
    compiled_norm = torch.compile(hf_norm)
    compiled_add = torch.compile(hf_add_norm)
    print(f"{'op':<9} {'mix':<5} {'rows x D':<12} {'pass':<7} {'cuops':>9} {'GB/s':>6} {'copy':>5} "
          f"{'eager':>7} {'compiled':>8}")
    shapes = [tuple(int(v) for v in a.split("x")) for a in sys.argv[1:]] or [(8192, 2048), (8192, 4096),
                                                                          (16384, 4096), (131072, 128)]
    for rows, d in shapes:
        for mix in ("bf16", "auto"):
            xt = torch.bfloat16
            rt = wt = torch.float32 if mix == "auto" else torch.bfloat16
            x = torch.randn(rows, d, device="cuda", dtype=xt)
            r = torch.randn(rows, d, device="cuda", dtype=rt)
            w = torch.randn(d, device="cuda", dtype=wt)
            for op in ("rms_norm", "add_rms_norm"):
                sides = ({"cuops": lambda a, b, c: cuops.rms_norm(b, c), "eager": lambda a, b, c: hf_norm(b, c),
                          "compiled": lambda a, b, c: compiled_norm(b, c)} if op == "rms_norm" else
                         {"cuops": cuops.add_rms_norm, "eager": hf_add_norm, "compiled": compiled_add})
                ins = (x, r, w)
                es = {t: torch.empty((), dtype=t).element_size() for t in (xt, rt)}
                s_size = 4 if (op == "add_rms_norm" and mix == "auto") else (es[rt] if op == "rms_norm" else 2)
                y_size = 4 if mix == "auto" else 2
                fwd_bytes = rows * d * ((es[xt] + es[rt] + s_size + y_size) if op == "add_rms_norm"
                                        else (es[rt] + y_size))
                bwd_bytes = rows * d * ((y_size + s_size + s_size + es[xt] + es[rt]) if op == "add_rms_norm"
                                        else (y_size + 2 * es[rt]))
                for kind in ("fwd", "fwd+bwd"):
                    times = {}
                    for key, fn in sides.items():
                        if kind == "fwd":
                            times[key] = do_bench(lambda fn=fn: fn(*ins))
                        else:
                            leaves = [t.detach().requires_grad_() for t in ins]
                            out0 = fn(*ins)
                            grads = [torch.randn_like(o) for o in (out0 if isinstance(out0, tuple) else (out0,))]

                            def step(fn=fn, leaves=leaves, grads=grads):
                                out = fn(*leaves)
                                torch.autograd.backward(out if isinstance(out, tuple) else (out,), grads)
                            times[key] = do_bench(step, grad_to_none=leaves)
                    nbytes = fwd_bytes + (bwd_bytes if kind == "fwd+bwd" else 0)
                    gbps = nbytes / times["cuops"] / 1e6
                    print(f"{op:<9} {mix:<5} {f'{rows}x{d}':<12} {kind:<7} {times['cuops'] * 1e3:>7.1f}us "
                          f"{gbps:>6.0f} {gbps / copy_rate(nbytes):>5.2f} {times['eager'] / times['cuops']:>6.2f}x "
                          f"{times['compiled'] / times['cuops']:>7.2f}x")


if __name__ == "__main__":
    main()
