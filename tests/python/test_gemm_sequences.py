"""GEMM calls in sequence, as training loops make them (tests/python/gemm_sequence.py): a property
search over sequences that reach every planner path, the portable ones too (through the in-process
switches), interleaved, each call checked against float64; a failing sequence is recorded and
replayed in a fresh process. Also: each path's kernel named once (the smoke test per path), each TMA
product as the first CUDA work of a thread (a thread with no current context, as the autograd
engine's worker is at a process's first backward), and float64 gradcheck on each float64 path."""
import json
import subprocess
import sys

import pytest
import torch

import gemm_sequence
from conftest import REPORT, ROOT, cuda_kernels, ops, requires_cuda


@requires_cuda
def test_gemm_sequences():
    """Every recipe on a fresh thread, forward and backward, and the portable path of each that has one;
    then up to 40 drawn sequences of 1-12 steps, as many as start within 45 s."""
    ran = gemm_sequence.search(max_examples=40, budget_s=45)
    REPORT.append(f"GEMM sequences: {ran} run (the walk over every recipe, then {ran - 1} drawn)")
    assert ran >= 1


@pytest.mark.quick
@requires_cuda
@pytest.mark.parametrize("portable", [False, True], ids=["fast", "portable"])
@pytest.mark.parametrize("name", sorted(gemm_sequence.RECIPES))
def test_recipes_reach_their_paths(name, portable):
    """Each recipe runs the kernel it is named for (on compute capability 9.0; the tile and split the
    planner picks for 132 SMs there too), so the sequences walk every path; its result is checked."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the recipes name compute capability 9.0's paths (tests/cpp/test_gemm_plan.cpp plans others)")
    r = gemm_sequence.RECIPES[name]
    want = (r.portable or r.family) if portable else r.family
    with gemm_sequence.switches(gemm_sequence.PORTABLE if portable else {}):
        gen = torch.Generator(device="cuda").manual_seed(0)
        a = gemm_sequence.operand(r.m, r.k, r.dtypes[0], "cuda", r.layout_a, gen)
        b = gemm_sequence.operand(r.k, r.n, r.dtypes[0], "cuda", r.layout_b, gen)
        with gemm_sequence.matmul_precision(r.precision):
            ops.mm(a, b)  # loaded before profiling
            names = cuda_kernels(lambda: ops.mm(a, b))
    assert any(want in x for x in names), (want, names)
    if r.exact and not portable and torch.cuda.get_device_properties(0).multi_processor_count == 132:
        assert any(r.exact in x for x in names), (r.exact, names)
    gemm_sequence.run_step({"recipe": name, "dtype": str(r.dtypes[0]).removeprefix("torch."), "layout_a": "recipe",
                            "layout_b": "recipe", "call": "mm", "alpha": 1.0, "beta": 0.0, "layout_c": "row",
                            "thread": "main", "portable": portable, "seed": 3})


@pytest.mark.quick
@requires_cuda
@pytest.mark.parametrize("name", ["wgmma", "wgmma_tf32", "small_m", "small_m_fma", "small_m_f64_k8"])
def test_tma_product_as_a_threads_first_cuda_work(name):
    """The TMA kernels encode tensor maps through the driver, which needs the thread's context current;
    the runtime binds it lazily. A fresh thread whose first CUDA work is the product has none."""
    r = gemm_sequence.RECIPES[name]
    for call in ("mm", "gemm"):
        gemm_sequence.run_step({"recipe": name, "dtype": str(r.dtypes[0]).removeprefix("torch."), "layout_a": "recipe",
                                "layout_b": "recipe", "call": call, "alpha": 1.0, "beta": 0.0, "layout_c": "row",
                                "thread": "fresh", "seed": 1})


FIRST_BACKWARD = """
import sys, torch
sys.path.insert(0, {python!r})
import cuops
a = torch.randn(32, 16, dtype=torch.float64, device="cuda", requires_grad=True)
b = torch.randn(16, 8, dtype=torch.float64, device="cuda", requires_grad=True)
assert torch.autograd.gradcheck(cuops.mm, (a, b))
print("gradcheck passed")
"""


@requires_cuda
def test_gradcheck_as_a_processes_first_backward():
    """The reported case: gradcheck's first backward product, mm(g, b.t()) with k = 8 (the float64
    small-M stream on sm_90), is the first CUDA work of the autograd engine's worker thread."""
    proc = subprocess.run([sys.executable, "-c", FIRST_BACKWARD.format(python=str(ROOT / "python"))],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "gradcheck passed" in proc.stdout, (proc.stdout + proc.stderr)[-4000:]


F64_RECIPES = [n for n, r in gemm_sequence.RECIPES.items() if r.dtypes == (torch.float64,)]


@requires_cuda
@pytest.mark.parametrize("name", F64_RECIPES)
def test_float64_gradcheck(name):
    """gradcheck of mm on each float64 path (its forward's; the backward's products take others):
    slow mode where its 2 x numel forwards are few, fast mode elsewhere."""
    r = gemm_sequence.RECIPES[name]
    gen = torch.Generator(device="cuda").manual_seed(2)
    a = gemm_sequence.operand(r.m, r.k, torch.float64, "cuda", r.layout_a, gen).requires_grad_()
    b = gemm_sequence.operand(r.k, r.n, torch.float64, "cuda", r.layout_b, gen).requires_grad_()
    fast = (r.m + r.n) * r.k > 4096
    assert torch.autograd.gradcheck(ops.mm, (a, b), fast_mode=fast)


def test_replay_records_and_reproduces(tmp_path, monkeypatch):
    """The recording and the fresh-process replay (on the CPU, so CI runs it): a sequence that passes
    replays clean; one whose check fails is recorded, replayed and reported failing in both."""
    steps = [{"recipe": "tiny", "dtype": d, "layout_a": la, "layout_b": "transposed", "call": call, "alpha": -1.5,
              "beta": 1.0, "layout_c": "col", "thread": thread, "seed": i, "device": "cpu"}
             for i, (d, la, call, thread) in enumerate([("float32", "row", "mm", "main"),
                                                        ("float64", "strided", "gemm", "fresh"),
                                                        ("bfloat16", "rows", "backward", "main")])]
    steps[1]["portable"] = True  # the step's switches set around it, and restored
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"steps": steps}))
    assert gemm_sequence.replay_in_fresh_process(good)[0] == 0
    bad = steps + [dict(steps[0], tamper=True)]
    monkeypatch.setenv("CUOPS_SEQUENCE_DIR", str(tmp_path))
    with pytest.raises(AssertionError, match=r"recorded in .*gemm_sequence_.*failed too \(exit 1\)"):
        gemm_sequence.check_sequence(bad)
    with pytest.raises(AssertionError, match="failed too"):  # the same example again fails alike
        gemm_sequence.check_sequence(bad)
    recorded = list(tmp_path.glob("gemm_sequence_*.json"))
    assert len(recorded) == 1 and json.loads(recorded[0].read_text())["steps"] == bad

