"""bench/run.py's CPU smoke run and bench/check.py on the committed H100 results (no GPU needed)."""
import json
import os
import subprocess
import sys

import pytest

from conftest import HAS_CUDA, LIBRARY, ROOT

BENCH = ROOT / "bench"


def run(args, cwd, **env):
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


@pytest.mark.skipif(HAS_CUDA, reason="the harness's CPU smoke run: CI runs it; on a GPU machine bench/run.py is "
                                     "the real run (~2 minutes of CPU here under the other tests)")
def test_cpu_smoke_run(tmp_path):
    # Started in tmp_path, as from any cwd: run.py finds its package and the repo itself; a relative
    # library path would not survive the move.
    library = str(LIBRARY.absolute())
    proc = run([BENCH / "run.py", "--device", "cpu", "--quick", "--out", tmp_path], tmp_path, CUOPS_LIBRARY=library)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    results = json.loads((tmp_path / "cpu_smoke.json").read_text())
    assert "section_errors" not in results, results["section_errors"]
    for family in ("copy", "elementwise", "norm", "gemm"):
        rows = [r for r in results["rows"] if r["family"] == family]
        assert rows and all(r["status"] == "ok" for r in rows), (family, [r for r in rows if r["status"] != "ok"])
    assert results["overhead"]["python"]["status"] == "ok", results["overhead"]
    assert results["library"] == library
    assert set(results["elapsed_s"]) == {"elementwise", "norm", "gemm", "overhead", "total"}
    lines = proc.stdout.splitlines()
    assert any(ln.startswith("op ") and "baseline" in ln for ln in lines), proc.stdout
    for op in ("add2", "vector_add", "scale", "square", "two_norm", "gemm", "overhead/py"):
        assert any(ln.startswith(op + " ") for ln in lines), (op, proc.stdout)


@pytest.mark.skipif(HAS_CUDA, reason="the harness's CPU smoke run: CI runs it; on a GPU machine bench/run.py is "
                                     "the real run")
def test_cpu_smoke_shapes_and_llama(tmp_path):
    """The sections a run measures only when named (the shape suite, the Llama-style model, the GPT
    training step, the fused ops, the LM-head loss, the mixture of experts), at the cpu config's tiny sizes: every row runs, the class summary and
    the models' agreement checks are filled."""
    library = str(LIBRARY.absolute())
    proc = run([BENCH / "run.py", "--device", "cpu", "--only",
                "gemm_shapes,llama,gpt_train,fused,cross_entropy,rms_norm,hf_llama,hf_lora,moe",
                "--out", tmp_path], tmp_path, CUOPS_LIBRARY=library)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    results = json.loads((tmp_path / "cpu_smoke.json").read_text())
    assert "section_errors" not in results, results["section_errors"]
    shapes = [r for r in results["rows"] if r["family"] == "gemm_shape"]
    assert shapes and all(r["status"] == "ok" for r in shapes), [r for r in shapes if r["status"] != "ok"]
    assert {r["class"] for r in shapes} == {"decode", "mid", "training"}
    decode = [r for r in shapes if r["class"] == "decode"]
    assert all(r["fraction"] and r["baselines"]["torch"]["fraction"] and r["flushed_ms"] for r in decode)
    compiled = [r for r in decode if "compiled" in r["baselines"]]
    assert compiled and all(r["baselines"]["compiled"].get("ratio") for r in compiled), compiled
    assert all(r["kind"] == "forward" and r["dtype"] in ("bfloat16", "float16") for r in compiled)
    summary = {(c["class"], c["variant"]): c for c in results["shape_classes"]}
    assert summary[("decode", "bfloat16")]["geomean_ratio"] > 0 and "compiled" in summary[("decode", "bfloat16")]
    assert summary[("training", "tf32")]["worst"]["label"]
    llama = {(r["op"], r["batch"]): r for r in results["rows"] if r["family"] == "llama"}
    assert set(llama) == {("prefill", 1), ("decode", 1), ("decode", 8)}
    for r in llama.values():
        assert r["status"] == "ok" and r["ratio"] > 0 and 0 <= r["check"]["argmax_agreement"] <= 1, r
    assert len(llama[("decode", 8)]["check"]["free_running_prefix"]) == 8
    lines = proc.stdout.splitlines()
    assert any(ln.startswith("decode   bf16 gpt-2") for ln in lines), proc.stdout
    assert any(ln.startswith("prefill ") for ln in lines) and any(ln.startswith("decode       8") for ln in lines)
    # The training step (eager on the cpu): both models from the same weights, float32 there, so the
    # first steps' losses agree closely.
    train = [r for r in results["rows"] if r["family"] == "gpt_train"]
    assert [r["mode"] for r in train] == ["eager"] and train[0]["status"] == "ok", train
    assert train[0]["ratio"] > 0 and train[0]["check"]["max_rel_loss_diff"] < 1e-4, train[0]["check"]
    assert any(ln.startswith("eager ") for ln in lines), proc.stdout
    # The fused ops: forward and forward + backward of both ops, decode forward only, each against eager
    # (the cpu has no compiled side), with the bare products beside the forwards.
    fused = {(r["op"], r["kind"], r["tokens"]): r for r in results["rows"] if r["family"] == "fused"}
    assert len(fused) == sum(r["family"] == "fused" for r in results["rows"]), "a fused row recorded twice"
    assert set(fused) == {(op, kind, t) for op in ("linear_gelu_tanh", "swiglu") for kind, t in
                          (("fwd", 32), ("fwd+bwd", 32), ("fwd", 1))}, sorted(fused)
    for (op, kind, _), r in fused.items():
        assert r["status"] == "ok" and r["baselines"]["eager"]["ratio"] > 0, r
        assert ("mm" in r["baselines"]) == (kind == "fwd") and ("addmm_act" in r["baselines"]) == (
            kind == "fwd" and op == "linear_gelu_tanh"), r
        # The decode row's weights against the copy rate at their bytes.
        assert (r.get("copy_fraction", 0) > 0) == (r["tokens"] == 1), r
    assert any(ln.startswith("swiglu ") for ln in lines), proc.stdout
    # The LM-head loss: forward + backward against eager (no compiled side, no memory figures on the cpu).
    lce = [r for r in results["rows"] if r["family"] == "cross_entropy"]
    assert [(r["tokens"], r["K"], r["V"]) for r in lce] == [(64, 32, 500)], lce
    assert lce[0]["status"] == "ok" and lce[0]["baselines"]["eager"]["ratio"] > 0, lce[0]
    assert lce[0]["cuops_added_bytes"] is None and "compiled" not in lce[0]["baselines"], lce[0]
    assert any(ln.startswith("   64    32    500") for ln in lines), proc.stdout
    # The norms and rotary: forward and the backward alone of each op against Hugging Face's code eager (no
    # compiled side on the cpu), with the copy fraction.
    norms = {(r["op"], r["kind"]): r for r in results["rows"] if r["family"] == "rms_norm"}
    assert set(norms) == {(op, kind) for op in ("rms_norm", "add_rms_norm", "rotary") for kind in ("fwd", "bwd")}, norms
    for r in norms.values():
        assert r["status"] == "ok" and r["baselines"]["eager"]["ratio"] > 0 and r["fraction"] > 0, r
    assert norms[("rotary", "bwd")]["size"] == "32x6x32", norms[("rotary", "bwd")]
    assert any(ln.startswith("add_rms_norm  bwd") for ln in lines), proc.stdout
    assert any(ln.startswith("rotary        bwd") for ln in lines), proc.stdout
    # transformers' Llama patched against unpatched: the eager training step (float32 on the cpu: the
    # losses from the same weights agree closely), decode at both batches and prefill.
    hf = {(r["op"], r.get("mode"), r["batch"]): r for r in results["rows"] if r["family"] == "hf_llama"}
    assert set(hf) == {("train_step", "eager", 2), ("decode", None, 1), ("decode", None, 8), ("prefill", None, 1)}, hf
    for r in hf.values():
        assert r["status"] == "ok" and r["ratio"] > 0, r
    train = hf[("train_step", "eager", 2)]
    assert train["check"]["max_rel_loss_diff"] < 1e-4 and "torch eager" in train["baselines"], train
    assert all(hf[k]["check"]["argmax_agreement"] == 1.0 for k in hf if k[0] != "train_step")
    assert any(ln.startswith("patch eager ") for ln in lines) and any(ln.startswith("decode       8") for ln in lines)
    # PEFT LoRA unpatched and patched: the eager training step at each adapter dropout.
    lora = {(r["model"], r["dropout"], r["mode"]): r for r in results["rows"] if r["family"] == "hf_lora"}
    assert set(lora) == {("tiny", 0.0, "eager"), ("tiny", 0.05, "eager")}, lora
    assert all(r["status"] == "ok" and r["ratio"] > 0 and "torch eager" in r["baselines"] for r in lora.values()), lora
    assert any(ln.startswith("PEFT eager ") for ln in lines), proc.stdout
    # Mixtures of experts: the grouped GEMM's three products against the per-expert loop (no
    # torch._grouped_mm on the cpu), the float32 training step of HF and of the patch, decode.
    moe = {(r["op"], r.get("kind") or r.get("mode") or r.get("batch")): r for r in results["rows"] if r["family"] == "moe"}
    assert set(moe) == {("grouped_mm", "forward"), ("grouped_mm", "dX"), ("grouped_mm", "dW"), ("train_step", "hf fp32"),
                        ("train_step", "patch fp32"), ("decode", 1)}, sorted(moe)
    for r in moe.values():
        assert r["status"] == "ok", r
    for kind in ("forward", "dX", "dW"):
        assert moe[("grouped_mm", kind)]["check"]["rel_error_vs_loop"] < 1e-5
    assert abs(moe[("train_step", "patch fp32")]["check"]["first_loss"] / moe[("train_step", "hf fp32")]["check"][
        "first_loss"] - 1) < 1e-5
    assert moe[("decode", 1)]["check"]["argmax_agreement"] == 1.0
    assert any(ln.startswith("patch fp32 ") for ln in lines), proc.stdout


def test_check_reads_committed_results():
    proc = run([BENCH / "check.py", BENCH / "results" / "default.json", "--gemm", "--overhead"], ROOT)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    assert any(ln.startswith("counted targets:") for ln in proc.stdout.splitlines()), proc.stdout


def test_check_reads_committed_decode_results():
    """The shape suite's decode-class targets, counted (--shapes) on the committed H100 results: a line
    per target of each of the four dtypes, and an exit status that says whether they all hold."""
    proc = run([BENCH / "check.py", BENCH / "results" / "decode.json", "--shapes"], ROOT)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    for variant in ("bfloat16", "float16", "tf32", "float32"):
        assert any(f"decode {variant} geomean" in ln and not ln.startswith("INFO") for ln in lines), proc.stdout
    fails = [ln for ln in lines if ln.startswith(("FAIL", "MISSING"))]
    assert (proc.returncode == 1) == bool(fails), proc.stdout


def test_shape_catalog_holds_the_model_products():
    """The shape suite's catalogue (bench/cuops_bench/shapes.py): the products an nn.Linear runs, with
    the operand layouts it runs them in, and the decode rows the issue measured among them."""
    import torch
    sys.path.insert(0, str(BENCH))
    from cuops_bench.shapes import products
    rows = products()
    found = {(p.kind, p.m, p.n, p.k) for p in rows}
    for row in [("forward", 1, 4096, 14336), ("forward", 1, 28672, 4096), ("forward", 1, 6144, 4096),
                ("forward", 1, 4096, 4096), ("forward", 16, 4096, 4096), ("input_grad", 16, 4096, 28672),
                ("weight_grad", 3072, 768, 1024)]:
        assert row in found, row
    assert {p.cls for p in rows} == {"decode", "mid", "large", "training"}
    assert all(p.tokens >= 128 for p in rows if p.kind == "weight_grad")
    g = torch.Generator().manual_seed(0)
    for p in [r for r in rows if r.linear.model == "gpt-2" and r.tokens in (2, 128)]:
        a, b = p.operands(torch.float64, "cpu", g)
        assert a.shape == (p.m, p.k) and b.shape == (p.k, p.n), p.label()
        assert (a.stride(1) == 1) == (p.a_major == "k") and (b.stride(1) == 1) == (p.b_major == "n"), p.label()
