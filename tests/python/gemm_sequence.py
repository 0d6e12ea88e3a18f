"""Sequences of GEMM calls as a training loop makes them, for tests/python/test_gemm_sequences.py.

A step is one call (mm, gemm with alpha/beta into a row- or column-major c, or mm's forward and
backward through autograd) on one recipe: a shape, dtype and precision that the planner gives to one
of its paths on an H100 (kernels/gemm/gemm_plan.cpp), with operands in the recipe's layouts or in drawn
ones (row-major, transposed views, padded rows, every other row of a wider tensor, a column stride of
2), run on the calling thread or as the first CUDA work of a fresh thread, on the fast paths or with
the switches that send every product to the portable ones (kernels/switches.h). Every result is
checked against torch's float64 product of the same operands.

Bugs of this class depend on what ran before (a thread's CUDA context bound or not, the allocator's
blocks, a kernel's attributes), so a failing sequence is written to a JSON file and replayed in a
fresh process (`python tests/python/gemm_sequence.py replay FILE`); the failure names the file, the
command and whether the replay failed too.

Run as a program, `replay FILE` runs a recorded sequence under the switches it was recorded with.
"""
import contextlib
import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time

import torch
from hypothesis import HealthCheck, Phase, example, given, seed, settings
from hypothesis import strategies as st

from conftest import fast_kernel_tol, matmul_precision, ops

HERE = pathlib.Path(__file__).resolve()


@dataclasses.dataclass(frozen=True)
class Recipe:
    m: int
    k: int
    n: int
    dtypes: tuple
    precision: str = "highest"
    layout_a: str = "row"
    layout_b: str = "row"
    family: str = ""  # the kernel that runs on compute capability 9.0 with no switch on
    portable: str = ""  # the kernel with CUOPS_DISABLE_WGMMA and CUOPS_DISABLE_SKINNY_TMA on (else family)
    exact: str = ""  # the planner's pick on a 132-SM H100 (tile, split), where it depends on the SMs


BF, FP, F32, F64 = torch.bfloat16, torch.float16, torch.float32, torch.float64
HALF = (BF, FP)
WG, SK, SK_TMA = "gemm_wgmma", "gemm_skinny<", "gemm_skinny_tma"
# Planner paths (kernels/gemm/gemm_plan.cpp; checked by test_recipes_reach_their_paths).
RECIPES = {
    "tiny": Recipe(5, 3, 4, (F32, F64, BF), family="gemm_tiled"),  # rows not 16 bytes apart: general
    "general": Recipe(100, 70, 90, HALF, family="gemm_tiled"),  # too small to pay for the copies
    "copied": Recipe(300, 200, 520, HALF, layout_a="strided", family=WG, portable="hgemm_mma"),  # a copied
    "simt": Recipe(300, 200, 260, (F32,), family="sgemm_simt"),
    "simt_split": Recipe(128, 4096, 128, (F32,), family="sgemm_simt", exact="sum_planes<float>"),
    "wgmma": Recipe(512, 256, 384, HALF, family=WG, portable="hgemm_mma"),
    "wgmma_tf32": Recipe(512, 256, 384, (F32,), "high", family=WG, portable="sgemm_tf32"),
    "wgmma_tall": Recipe(2304, 1024, 1024, HALF, family=WG, portable="hgemm_mma"),  # 192 x 128 tiles
    "wgmma_tail": Recipe(256, 4096, 768, HALF, family=WG, portable="hgemm_mma"),  # last wave split along k
    "wgmma_tail_tf32": Recipe(768, 4096, 3072, (F32,), "high", family=WG, portable="sgemm_tf32"),
    "small_m": Recipe(4, 1000, 4096, HALF, layout_b="transposed", family=SK_TMA, portable=SK),
    "small_m_cluster": Recipe(3, 8192, 512, HALF, layout_b="transposed", family=SK_TMA, portable=SK),
    "small_m_tf32": Recipe(8, 512, 2048, (F32,), "high", layout_b="transposed", family=SK_TMA, portable=SK),
    "small_m_fma": Recipe(8, 512, 2048, (F32,), layout_b="transposed", family=SK_TMA, portable=SK),
    "small_m_lanes": Recipe(2, 512, 8448, (F32,), layout_b="transposed", family=SK, exact=SK),
    "small_m_f64": Recipe(7, 1000, 512, (F64,), layout_b="transposed", family=SK_TMA, portable="dgemm_mma"),
    "small_m_f64_few": Recipe(16, 4096, 768, (F64,), layout_b="transposed", family=SK_TMA, portable="dgemm_mma"),
    "small_m_f64_k8": Recipe(32, 8, 16, (F64,), layout_b="transposed", family=SK_TMA,  # k < a TMA box
                             portable="dgemm_mma"),
    "f64_128x128": Recipe(2048, 600, 1024, (F64,), family="dgemm_mma", exact="dgemm_mma<128, 128"),
    "f64_128x64": Recipe(1000, 1000, 1000, (F64,), family="dgemm_mma", exact="dgemm_mma<128, 64"),
    "f64_64x64": Recipe(500, 4096, 1000, (F64,), family="dgemm_mma", exact="dgemm_mma<64, 64"),
    "f64_32x64": Recipe(200, 256, 300, (F64,), family="dgemm_mma", exact="dgemm_mma<32, 64"),
    "f64_32x32": Recipe(128, 768, 768, (F64,), family="dgemm_mma", exact="dgemm_mma<32, 32"),
    "f64_32x32_split": Recipe(100, 4096, 130, (F64,), family="dgemm_mma", exact="sum_planes<double>"),
    "f64_16x128_split": Recipe(12, 2000, 1000, (F64,), layout_a="transposed", family="dgemm_mma",
                               exact="dgemm_mma<16, 128"),
    "f64_split": Recipe(256, 4096, 256, (F64,), family="dgemm_mma", exact="sum_planes<double>"),
}
# The switches read once per process and settable in it (kernels/switches.h); PORTABLE sends every
# product to the kernels GPUs other than compute capability 9.0 run.
SWITCHES = ("CUOPS_DISABLE_WGMMA", "CUOPS_DISABLE_SKINNY_TMA", "CUOPS_DISABLE_BULK_NORM")
PORTABLE = {"CUOPS_DISABLE_WGMMA": True, "CUOPS_DISABLE_SKINNY_TMA": True}


@contextlib.contextmanager
def switches(states):
    """The switches in `states` ({name: on}) set for the block, restored after."""
    old = {name: ops.set_switch(name, on) for name, on in states.items()}
    try:
        yield
    finally:
        for name, on in old.items():
            ops.set_switch(name, on)


def switch_states():
    return {name: ops.set_switch(name) for name in SWITCHES}


LAYOUTS = ["recipe", "row", "transposed", "padded", "rows", "strided"]
CALLS = ["mm", "gemm", "backward"]


def operand(rows, cols, dtype, device, layout, gen):
    """A random [rows, cols] tensor whose memory layout is `layout`."""
    def randn(*shape):  # drawn on the device (gen is the device's generator): no host work per step
        return torch.randn(*shape, dtype=torch.float64, generator=gen, device=device).to(dtype)

    unit = 16 // torch.empty((), dtype=dtype).element_size()
    ld = (cols + unit - 1) // unit * unit + unit  # padded: whole 16-byte rows and a spare one
    if layout == "row":
        return randn(rows, cols)
    if layout == "transposed":
        return randn(cols, rows).t()
    if layout == "padded":
        return randn(rows, ld)[:, :cols]
    if layout == "rows":  # every other row of a wider tensor, from its second row (a base one row in)
        return randn(2 * rows + 1, ld)[1::2, :cols]
    if layout == "strided":  # a column stride of 2: no fast kernel reads it in place
        return randn(rows, 2 * cols)[:, ::2]
    raise ValueError(layout)


def check(what, got, ref, scale, tol, step):
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    got = got.double()
    assert not torch.isnan(got).any(), f"{what}: NaN in the result (an element not written) at {step}"
    err = ((got - ref).norm() / scale.norm().clamp_min(1e-300)).item()
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol:.3g} at {step}"


def on_thread(fresh, fn):
    """fn() on this thread, or as the first CUDA work of a fresh one (its exception raised here)."""
    if not fresh:
        return fn()
    box = {}

    def body():
        try:
            box["out"] = fn()
        except BaseException as e:  # noqa: BLE001 (re-raised on the caller's thread)
            box["err"] = e

    t = threading.Thread(target=body)
    t.start()
    t.join()
    if "err" in box:
        raise box["err"]
    return box.get("out")


def run_step(step):
    """One call of `step` (a dict: recipe, dtype, layouts, call, alpha, beta, layout_c, thread, seed,
    device), checked against float64."""
    r = RECIPES[step["recipe"]]
    dtype = getattr(torch, step["dtype"])
    device = step.get("device", "cuda")
    gen = torch.Generator(device=device).manual_seed(step["seed"])
    la = r.layout_a if step["layout_a"] == "recipe" else step["layout_a"]
    lb = r.layout_b if step["layout_b"] == "recipe" else step["layout_b"]
    a = operand(r.m, r.k, dtype, device, la, gen)
    b = operand(r.k, r.n, dtype, device, lb, gen)
    a64, b64 = a.double(), b.double()
    ref, scale = a64 @ b64, a64.abs() @ b64.abs()
    tol = fast_kernel_tol(dtype, r.precision, r.k)
    fresh = step["thread"] == "fresh"
    tamper = 1.0 + 1e-3 if step.get("tamper") else 1.0  # the replay test's deliberate error
    with matmul_precision(r.precision), switches(PORTABLE if step.get("portable") else {}):
        if step["call"] == "mm":
            out = on_thread(fresh, lambda: ops.mm(a, b))
            check("mm", out * tamper, ref, scale, tol, step)
        elif step["call"] == "gemm":
            c0 = operand(r.m, r.n, dtype, device, "row" if step["layout_c"] == "row" else "transposed", gen)
            c = c0.clone() if step["beta"] != 0 else torch.full_like(c0, float("nan"))  # beta 0 never reads c
            on_thread(fresh, lambda: ops.gemm(c, a, b, step["alpha"], step["beta"]))
            want = step["alpha"] * ref + step["beta"] * c0.double()
            check("gemm", c * tamper, want, abs(step["alpha"]) * scale + abs(step["beta"]) * c0.double().abs(), tol,
                  step)
        else:
            a, b = a.requires_grad_(), b.requires_grad_()
            g = operand(r.m, r.n, dtype, device, "row", gen)
            out = ops.mm(a, b)
            on_thread(fresh, lambda: out.backward(g))
            g64 = g.double()
            check("mm", out.detach() * tamper, ref, scale, tol, step)
            tol_a, tol_b = fast_kernel_tol(dtype, r.precision, r.n), fast_kernel_tol(dtype, r.precision, r.m)
            check("grad a", a.grad, g64 @ b64.t(), g64.abs() @ b64.abs().t(), tol_a, step)
            check("grad b", b.grad, a64.t() @ g64, a64.abs().t() @ g64.abs(), tol_b, step)


def run_sequence(steps):
    for step in steps:
        run_step(step)
    if any(s.get("device", "cuda") == "cuda" for s in steps):
        torch.cuda.synchronize()


def replay_in_fresh_process(path):
    """Runs `replay path` in a fresh Python process; (exit code, its output's tail)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}
    proc = subprocess.run([sys.executable, str(HERE), "replay", str(path)], cwd=HERE.parent, env=env,
                          capture_output=True, text=True, timeout=600)
    return proc.returncode, (proc.stdout + proc.stderr)[-3000:]


_FAILED = {}  # sequence -> the error it raised, so hypothesis' re-run of a failing example fails alike


def check_sequence(steps):
    """Runs `steps`; on failure records them and replays them in a fresh process, and fails saying both."""
    key = json.dumps(steps, sort_keys=True)
    if key in _FAILED:
        raise AssertionError(_FAILED[key])
    try:
        run_sequence(steps)
    except Exception as e:  # noqa: BLE001 (recorded, replayed, then reported)
        folder = pathlib.Path(os.environ.get("CUOPS_SEQUENCE_DIR", tempfile.gettempdir()))
        folder.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix="gemm_sequence_", suffix=".json", dir=folder)
        with os.fdopen(fd, "w") as f:
            json.dump({"switches": switch_states(), "steps": steps}, f, indent=1)
        rc, tail = replay_in_fresh_process(name)
        _FAILED[key] = (f"{type(e).__name__}: {e}\nsequence of {len(steps)} steps recorded in {name}; "
                        f"replayed in a fresh process (python {HERE} replay {name}): "
                        f"{'failed too' if rc else 'passed'} (exit {rc})\n{tail}")
        raise AssertionError(_FAILED[key]) from e


@st.composite
def steps_strategy(draw, device="cuda", names=None):
    name = draw(st.sampled_from(sorted(names or RECIPES)))
    return {"recipe": name, "dtype": str(draw(st.sampled_from(RECIPES[name].dtypes))).removeprefix("torch."),
            "layout_a": draw(st.sampled_from(LAYOUTS)), "layout_b": draw(st.sampled_from(LAYOUTS)),
            "call": draw(st.sampled_from(CALLS)), "alpha": draw(st.sampled_from([1.0, -1.5, 0.5])),
            "beta": draw(st.sampled_from([0.0, 1.0, -2.0])), "layout_c": draw(st.sampled_from(["row", "col"])),
            "thread": draw(st.sampled_from(["main", "fresh"])), "portable": draw(st.booleans()),
            "seed": draw(st.integers(0, 2**31 - 1)), "device": device}


def every_recipe_on_a_fresh_thread():
    """The explicit first example: each recipe's product as the first CUDA work of a fresh thread, in
    its own layouts, then its backward; then the product of each recipe whose portable path differs."""
    steps = []
    for portable in (False, True):
        for i, name in enumerate(sorted(RECIPES)):
            if portable and not RECIPES[name].portable:
                continue
            for call in ("mm",) if portable else ("mm", "backward"):
                steps.append({"recipe": name, "dtype": str(RECIPES[name].dtypes[0]).removeprefix("torch."),
                              "layout_a": "recipe", "layout_b": "recipe", "call": call, "alpha": 1.0,
                              "beta": 0.0, "layout_c": "row", "thread": "fresh", "portable": portable,
                              "seed": i, "device": "cuda"})
    return steps


def search(max_examples, budget_s):
    """The property search: sequences of 1-12 drawn steps, after the explicit walk over every recipe;
    no sequence starts after budget_s seconds (those left pass unrun). Returns how many ran."""
    start, ran = time.monotonic(), [0]

    @seed(46)
    @settings(max_examples=max_examples, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                  HealthCheck.large_base_example])
    @given(steps=st.lists(steps_strategy(), min_size=1, max_size=12))
    @example(steps=every_recipe_on_a_fresh_thread())
    def sequences(steps):
        if ran[0] and time.monotonic() - start > budget_s and json.dumps(steps, sort_keys=True) not in _FAILED:
            return
        ran[0] += 1
        check_sequence(steps)

    sequences()
    return ran[0]


def main(argv):
    if len(argv) == 3 and argv[1] == "replay":
        recorded = json.loads(pathlib.Path(argv[2]).read_text())
        with switches(recorded.get("switches", {})):  # as they were when it was recorded
            run_sequence(recorded["steps"])
        print(f"replay: {len(recorded['steps'])} steps passed")
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
