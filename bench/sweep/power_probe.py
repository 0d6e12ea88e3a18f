"""Clock and power of the GPU while one GEMM runs back to back (3 s each): cuBLAS (torch.mm) against
cuops.mm, bf16 8192^3, with and without an L2 flush between calls. Question: is the
harness's 2-4 % gap to the sweep a lower clock under the 700 W cap? Not part of the tests.
    python3 bench/sweep/power_probe.py build/libcuops.so"""
import os
import pathlib
import subprocess
import sys
import time

import torch

if len(sys.argv) > 1:
    os.environ["CUOPS_LIBRARY"] = sys.argv[1]
# The package is the one place that finds the library ($CUOPS_LIBRARY, $CUOPS_BUILD_DIR, build/).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
import cuops  # noqa: E402,F401

n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
flush = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device="cuda")


def probe(name, fn, with_flush):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu", "--format=csv,noheader,nounits",
                            "-lms", "100"], stdout=subprocess.PIPE, text=True)
    calls, start = 0, time.perf_counter()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    gpu_ms = 0.0
    while time.perf_counter() - start < 3.0:
        if with_flush:
            flush.zero_()
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        gpu_ms += e0.elapsed_time(e1)
        calls += 1
    smi.terminate()
    rows = [list(map(float, l.split(","))) for l in smi.communicate()[0].strip().splitlines() if l.count(",") == 2]
    rows = rows[len(rows) // 4:]  # settled part
    avg = [sum(r[i] for r in rows) / len(rows) for i in range(3)]
    print(f"{name:28s} flush={int(with_flush)} {gpu_ms / calls:7.3f} ms/call  {2 * n**3 / (gpu_ms / calls) / 1e9:6.1f} TFLOP/s"
          f"  SM clock {avg[0]:6.0f} MHz  power {avg[1]:5.0f} W  temp {avg[2]:3.0f} C  ({len(rows)} samples)")


for with_flush in (False, True):
    for _ in range(2):
        probe("cuBLAS torch.mm(out=c)", lambda: torch.mm(a, b, out=c), with_flush)
        probe("cuops.gemm", lambda: torch.ops.cuops.gemm(c, a, b, 1.0, 0.0), with_flush)
