"""The classic 'call my CUDA kernel from PyTorch' demo, through cuops: load the library, call the ops,
check each against torch, and on a GPU time each against torch with CUDA events after a warm-up."""
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The package is the one place that finds the library ($CUOPS_LIBRARY, $CUOPS_BUILD_DIR, build/).
sys.path.insert(0, str(ROOT / "python"))
import cuops  # noqa: E402

device = "cuda" if torch.cuda.is_available() else "cpu"
print(f"cuops Python demo on {device}" + ("" if device == "cuda" else " (no GPU found: CPU kernels, no timing)"))
print("build_info:", cuops.build_info())


def time_ms(fn, reps=50):
    """Median of `reps` CUDA-event timings after a warm-up."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


rows, ok = [], True


def report(name, got, want, tol, ours=None, theirs=None):
    global ok
    err = ((got.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-30)).item()
    passed = err <= tol
    ok &= passed
    timing = ""
    if device == "cuda" and ours is not None:
        t_ours, t_torch = time_ms(ours), time_ms(theirs)
        timing = f"{t_ours * 1e3:9.1f} us {t_torch * 1e3:9.1f} us {t_torch / t_ours:6.2f}x"
    rows.append(f"{name:<28} {err:10.2e} {'ok' if passed else 'MISMATCH':<9} {timing}")


a = torch.randn(1024, 1024, device=device)
b = torch.randn(1024, 1024, device=device)
c = torch.empty_like(a)
cuops.add2(c, a, b)
report("add2 1024x1024", c, a + b, 0.0, lambda: cuops.add2(c, a, b), lambda: torch.add(a, b, out=c))

ga, gb = torch.randn(640, 640, device=device), torch.randn(640, 640, device=device)
gc = torch.empty(640, 640, device=device)
cuops.gemm(gc, ga, gb)
report("gemm 640x640x640 (fp32)", gc, ga.double() @ gb.double(), 1e-5, lambda: cuops.gemm(gc, ga, gb),
       lambda: torch.mm(ga, gb, out=gc))

x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], device=device)
sq = cuops.square(x)
print("square of\n", x.cpu(), "\nis\n", sq.cpu())
report("square 2x3", sq, x * x, 0.0, lambda: cuops.square(x), lambda: torch.square(x))

na, nb = torch.randn(32, 14, device=device), torch.randn(32, 14, device=device)
report("two_norm 32x14", cuops.two_norm(na, nb), torch.linalg.vector_norm(na.double() - nb.double()), 1e-6,
       lambda: cuops.two_norm(na, nb), lambda: torch.linalg.vector_norm(na - nb))

header = f"{'op':<28} {'max rel err':>10} {'check':<9}"
if device == "cuda":
    header += f" {'cuops':>12} {'torch':>12} {'speed-up':>8}"
print("\n" + header)
print("\n".join(rows))
print("\nall ops match torch" if ok else "\nSOME OPS DO NOT MATCH torch")
sys.exit(0 if ok else 1)
