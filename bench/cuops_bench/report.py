"""The results file (schema: PROTOCOL.md), the stdout table and the plots."""
from __future__ import annotations

import datetime
import json
import math
import os
import subprocess
from pathlib import Path

import torch

from .context import GEMM_VARIANTS, SHAPE_VARIANTS
from .harness import DTYPES, Bench, error_text
from .library import REPO

SHORT = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def git_info() -> tuple[str, bool | None]:
    """(commit, dirty). CUOPS_GIT_COMMIT wins: the GPU machine's copy of the tree carries a .git that
    can lag the working tree it was sent with (seen: the session's first commit, marked dirty)."""
    if os.environ.get("CUOPS_GIT_COMMIT"):
        return os.environ["CUOPS_GIT_COMMIT"], None
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                timeout=20, check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                                capture_output=True, text=True, timeout=20, check=True).stdout
        return commit, bool(status.strip())
    except Exception:  # noqa: BLE001 - the GPU machine's copy of the tree may have no .git
        return "unknown", None


def device_info(bench: Bench) -> dict:
    if not bench.cuda:
        return {"type": "cpu"}
    p = torch.cuda.get_device_properties(0)
    return {"type": "cuda", "name": p.name, "capability": f"{p.major}.{p.minor}",
            "multiprocessors": p.multi_processor_count, "memory_bytes": p.total_memory,
            "l2_bytes": getattr(p, "L2_cache_size", None), "cuda": torch.version.cuda}


def new_results(bench: Bench, library: Path, args: dict) -> dict:
    """The results file before any measurement; args: the command line as recorded."""
    commit, dirty = git_info()
    try:
        build_info = json.loads(torch.ops.cuops.build_info())
    except Exception as e:  # noqa: BLE001
        build_info = error_text(e)
    return {
        "schema": 1,
        "gpu": torch.cuda.get_device_name() if bench.cuda else "cpu (harness smoke test)",
        "torch": torch.__version__, "git_commit": commit, "git_dirty": dirty,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device_info(bench), "library": str(library), "build_info": build_info,
        "timer": bench.timer_name, "args": args,
        "copy_bandwidth_GBps": None, "rows": [], "overhead": {}, "elapsed_s": {},
    }


def save(results: dict, path: Path) -> None:
    """The results as JSON, one row a line (compact, and a regenerated row is a one-line diff)."""
    head = json.dumps({k: v for k, v in results.items() if k != "rows"}, indent=1)
    rows = ",\n".join(json.dumps(r, separators=(",", ":")) for r in results["rows"])
    path.write_text(f'{head[:-2]},\n "rows": [\n{rows}\n ]\n}}\n')


# What names a row across runs: a merged results file keeps one row per key, the newest run's.
ROW_KEY = ("family", "op", "dtype", "precision", "size", "label", "class", "model", "linear", "kind", "tokens",
           "mode", "batch", "steps", "dropout", "routing")


def row_key(r: dict) -> str:
    return json.dumps([r.get(k) for k in ROW_KEY])


def run_part(results: dict) -> dict:
    """What a merged file keeps of each run that wrote into it."""
    return {k: results.get(k) for k in ("git_commit", "git_dirty", "date", "args", "elapsed_s", "library")}


def merge(old: dict, new: dict) -> dict:
    """`new` merged into the results file `old` (bench/run.py --merge): new's rows replace old's of the
    same key in place and the rest are appended; class summaries by (class, variant), overheads and the
    models' configs likewise; `parts` lists every run (commit, date, arguments). A results file holds
    one GPU's figures: merging another GPU's is refused."""
    if old.get("gpu") != new.get("gpu"):
        raise ValueError(f"--merge: the file holds {old.get('gpu')} results, this run is on {new.get('gpu')}; "
                         "regenerate the whole file on one GPU")
    fresh = {row_key(r): r for r in new["rows"]}
    rows = [fresh.pop(row_key(r), r) for r in old["rows"]] + list(fresh.values())
    classes = {(c["class"], c["variant"]): c for c in old.get("shape_classes") or []}
    classes.update({(c["class"], c["variant"]): c for c in new.get("shape_classes") or []})
    # The model sections' configs (what their tables' headers read), kept where this run has none.
    merged = {**{k: v for k, v in old.items() if k in ("llama", "gpt_train", "hf_llama", "hf_lora", "moe")}, **new}
    merged.update(rows=rows, shape_classes=list(classes.values()),
                  overhead={**(old.get("overhead") or {}), **(new.get("overhead") or {})},
                  parts=(old.get("parts") or [run_part(old)]) + [run_part(new)])
    if not merged["shape_classes"]:
        del merged["shape_classes"]
    return merged


# ----------------------------------------------------------------------------------------------
# The table


def fmt_time(ms) -> str:
    if ms is None:
        return "-"
    if ms < 1:
        return f"{ms * 1e3:.1f}us"
    if ms < 1000:
        return f"{ms:.3g}ms"
    return f"{ms / 1e3:.3g}s"


def fmt_num(x, suffix="") -> str:
    return "-" if x is None else f"{x:.3f}{suffix}"


HEAD = (f"{'op':<12} {'dtype':<5} {'size':<15} {'cuops':>9}  {'baseline':<20} {'base time':>9} {'ratio':>7} "
        f"{'frac':>6} {'steady':>7}")


def in_table(r: dict) -> bool:
    """mm repeats gemm's kernel, so the table shows it only at the sizes with targets; every row is in
    the JSON. The shape suite and the model have tables of their own (shape_lines, llama_lines)."""
    if r["family"] not in ("elementwise", "norm", "gemm"):
        return False
    return r["op"] != "mm" or (r["M"] == r["K"] == r["N"] and r["M"] in (1024, 4096, 8192))


def row_lines(r: dict) -> list[str]:
    """One line per baseline, or one saying why the row has none."""
    dtype = "tf32" if r.get("precision") == "high" else SHORT.get(r["dtype"], r["dtype"])
    lead = f"{r['op']:<12} {dtype:<5} {r['size']:<15}"
    if r.get("status") == "error":
        return [f"{lead} ERROR {r.get('error', '')}"[:130]]
    bases = r.get("baselines") or {}
    if not bases:
        return [f"{lead} SKIPPED {r.get('skip_reason', '')}"[:130]]
    lines = []
    for i, b in enumerate(bases.values()):
        if "error" in b:
            lines.append(f"{lead} {fmt_time(r.get('cuops_ms')):>9}  {b['label']:<20} ERROR {b['error']}"[:130])
            continue
        cuops = fmt_time(r.get("cuops_ms")) if r.get("status") == "ok" else r.get("status", "?")
        frac, steady = (r.get("fraction"), r.get("steady_fraction")) if i == 0 else (None, None)
        lines.append(f"{lead} {cuops:>9}  {b['label']:<20} {fmt_time(b.get('ms')):>9} "
                     f"{fmt_num(b.get('ratio'), 'x'):>7} {fmt_num(frac):>6} {fmt_num(steady):>7}".rstrip())
    return lines


def overhead_line(lang: str, o: dict) -> str:
    lead = f"{'overhead/' + ('py' if lang == 'python' else 'c++'):<12} {'f32':<5} {'16':<15}"
    if o.get("status") != "ok":
        return f"{lead} {o.get('status', '').upper()} {o.get('reason') or o.get('error') or ''}"[:130]
    base = "aten.add.out" if lang == "python" else "at::add_out"
    return (f"{lead} {o['cuops_us']:>7.2f}us  {base:<20} {o['aten_us']:>7.2f}us "
            f"{fmt_num(o['aten_us'] / o['cuops_us'], 'x'):>7} {'-':>6}")


def table_lines(results: dict) -> list[str]:
    """The stdout table: one line per (row, baseline), then the call overheads; then the shape suite's
    and the model's tables when they ran."""
    lines = []
    for r in filter(in_table, results["rows"]):
        lines += row_lines(r)
    lines += [overhead_line(lang, o) for lang, o in (results.get("overhead") or {}).items()]
    if lines:  # a run of only the shape suite or the model has no line for this table
        lines = [HEAD, "-" * len(HEAD)] + lines
    lines += shape_lines(results)
    lines += llama_lines(results)
    lines += gpt_train_lines(results)
    lines += fused_lines(results)
    lines += rms_norm_lines(results)
    lines += cross_entropy_lines(results)
    lines += hf_llama_lines(results)
    lines += hf_lora_lines(results)
    lines += moe_lines(results)
    return lines


def variant_label(r: dict) -> str:
    return {"high": "tf32", "highest": "f32"}.get(r.get("precision"), SHORT.get(r["dtype"], r["dtype"]))


def fmt_ratio(x) -> str:
    return "-" if x is None else f"{x:.3f}x"


def fmt_frac(x) -> str:
    return "-" if x is None else f"{x:.2f}"


SHAPE_HEAD = (f"{'class':<8} {'dtype':<4} {'model':<13} {'linear':<12} {'kind':<5} {'M':>5} {'MxKxN':<17} "
              f"{'cuops':>8} {'torch.mm':>8} {'ratio':>7} {'compiled':>8} {'c.ratio':>7} {'TFLOP/s':>7} "
              f"{'frac':>5} {'t.frac':>6} {'flushed':>7}")


def not_run_line(lead: str, r: dict) -> str:
    """A row that did not run: its lead columns, ERROR or SKIPPED, and why."""
    why = r.get("error") if r.get("status") == "error" else r.get("skip_reason", "")
    return f"{lead} {r.get('status', '?').upper()} {why}"[:150]


def shape_row_line(r: dict) -> str:
    kind = {"forward": "fwd", "input_grad": "dgrad", "weight_grad": "wgrad"}.get(r["kind"], r["kind"])
    lead = (f"{r['class']:<8} {variant_label(r):<4} {r['model'][:13]:<13} {r['linear'][:12]:<12} {kind:<5} "
            f"{r['tokens']:>5} {r['size']:<17}")
    if r.get("status") != "ok":
        return not_run_line(lead, r)
    torch_b = (r.get("baselines") or {}).get("torch", {})
    comp = (r.get("baselines") or {}).get("compiled")
    comp_ms = fmt_time(comp.get("ms")) if comp and "ms" in comp else ("ERROR" if comp else "-")
    comp_ratio = fmt_ratio(comp.get("ratio")) if comp else "-"
    has_bw = "weight_bytes" in r
    return (f"{lead} {fmt_time(r.get('cuops_ms')):>8} {fmt_time(torch_b.get('ms')):>8} {fmt_ratio(r.get('ratio')):>7} "
            f"{comp_ms:>8} {comp_ratio:>7} {r.get('cuops_TFLOPs') or 0:>7.2f} "
            f"{fmt_frac(r.get('fraction') if has_bw else None):>5} "
            f"{fmt_frac(torch_b.get('fraction') if has_bw else None):>6} "
            f"{fmt_ratio(torch_b.get('flushed_ratio')):>7}").rstrip()


def shape_lines(results: dict) -> list[str]:
    """The shape suite: one line per row, then the per-(class, dtype) summary."""
    rows = [r for r in results["rows"] if r["family"] == "gemm_shape"]
    if not rows:
        return []
    lines = ["", "shape suite (SPEC §3): ratio = torch.mm time / cuops time (> 1: cuops faster); decode rows "
             "(M <= 16) timed in steady state (one CUDA graph over > 4x L2 of operands), compiled = F.linear "
             "under max-autotune; frac / t.frac = weight bytes read per second / copy rate (cuops / torch.mm); "
             "flushed = the ratio under do_bench's L2 flush", SHAPE_HEAD, "-" * len(SHAPE_HEAD)]
    lines += [shape_row_line(r) for r in rows]
    lines += class_lines(results.get("shape_classes") or [])
    return lines


CLASS_HEAD = (f"{'class':<8} {'dtype':<4} {'rows':>7} {'geomean':>8} {'worst':>7}  {'worst row':<58} "
              f"{'compiled':>15} {'min frac >= 64MB':>17}")


def class_lines(summary: list) -> list[str]:
    if not summary:
        return []
    lines = ["", "shape classes: geometric mean of the ratios and the worst row; compiled = geomean / worst against "
             "F.linear compiled; min frac = the least weight bandwidth / copy of weights >= 64 MB (cuops, torch.mm)",
             CLASS_HEAD, "-" * len(CLASS_HEAD)]
    for c in summary:
        dtype = {"tf32": "tf32", "float32": "f32"}.get(c["variant"], SHORT.get(c["variant"], c["variant"]))
        worst = c.get("worst") or {}
        comp = c.get("compiled")
        comp_text = f"{comp['geomean_ratio']:.3f}/{comp['worst']['ratio']:.3f}" if comp else "-"
        big = c.get("weight_fraction_64MB")
        big_text = f"{big['min']:.2f} / {fmt_frac(big.get('torch_min'))}" if big else "-"
        lines.append(f"{c['class']:<8} {dtype:<4} {c['ok']:>3}/{c['rows']:<3} {fmt_ratio(c.get('geomean_ratio')):>8} "
                     f"{fmt_ratio(worst.get('ratio')):>7}  {worst.get('label', '-')[:58]:<58} {comp_text:>15} "
                     f"{big_text:>17}".rstrip())
    return lines


LLAMA_HEAD = (f"{'phase':<8} {'batch':>5} {'tokens':>6} {'cuops':>9} {'torch':>9} {'ratio':>7} {'cuops tok/s':>11} "
              f"{'torch tok/s':>11}  {'argmax':>7} {'max|dl|':>8} {'prefix':>9}")


def llama_lines(results: dict) -> list[str]:
    """The model's rows: time a call (prefill) or a token step (decode), tokens per second, and how
    closely the two models' logits and tokens agree (sections/llama.py says how that is judged)."""
    rows = [r for r in results["rows"] if r["family"] == "llama"]
    if not rows:
        return []
    info = results.get("llama") or {}
    cfg = info.get("config") or {}
    lines = ["", f"llama ({cfg.get('layers')} layers, hidden {cfg.get('hidden')}, "
             f"{cfg.get('heads')}/{cfg.get('kv_heads')} "
             f"heads, FFN {cfg.get('ffn')}, vocab {cfg.get('vocab')}, bf16; decode after a {info.get('prompt')}-token "
             f"prompt{', CUDA graphs' if info.get('cuda_graphs') else ', eager (cpu)'}): ratio = nn.Linear time / "
             "cuops twin time (MLPs on swiglu, other Linears on mm); tokens = the prefill's length or the decode's steps, decode times are per token step; "
             "argmax = teacher-forced agreement, max|dl| = largest logit difference / largest |logit|, prefix = "
             "least common prefix of the free-running tokens",
             LLAMA_HEAD, "-" * len(LLAMA_HEAD)]
    for r in rows:
        n = r.get("tokens") if r["op"] == "prefill" else r.get("steps")
        lead = f"{r['op']:<8} {r['batch']:>5} {n:>6}"
        if r.get("status") != "ok":
            lines.append(not_run_line(lead, r))
            continue
        b = r["baselines"]["torch"]
        check = r.get("check") or {}
        prefix = check.get("free_running_prefix")
        prefix_text = f"{min(prefix)}/{check['free_running_tokens']}" if prefix else "-"
        lines.append(f"{lead} {fmt_time(r['cuops_ms']):>9} {fmt_time(b.get('ms')):>9} {fmt_ratio(r.get('ratio')):>7} "
                     f"{r['cuops_tokens_per_s']:>11.0f} {b.get('tokens_per_s') or 0:>11.0f}  "
                     f"{fmt_frac(check.get('argmax_agreement')):>7} {check.get('max_rel_diff', 0):>8.4f} "
                     f"{prefix_text:>9}".rstrip())
    return lines


GPT_HEAD = f"{'mode':<8} {'tokens':>6} {'cuops':>9} {'torch':>9} {'ratio':>7} {'cuops tok/s':>11} {'torch tok/s':>11} {'max dloss':>9}"


def gpt_train_lines(results: dict) -> list[str]:
    """The training step's rows: time per step (eager, compiled), tokens per second, and the largest
    relative loss difference over the first steps from the common start (sections/gpt_train.py)."""
    rows = [r for r in results["rows"] if r["family"] == "gpt_train"]
    if not rows:
        return []
    cfg = (results.get("gpt_train") or {}).get("config") or {}
    lines = ["", f"gpt_train ({cfg.get('layers')} layers, width {cfg.get('width')}, FFN {cfg.get('ffn')}, vocab "
             f"{cfg.get('vocab')}, {cfg.get('batch')} x {cfg.get('seq')} tokens, "
             f"{'bf16 autocast' if cfg.get('autocast') else 'float32'}, AdamW): ratio = nn.Linear "
             "step time / cuops step time (MLP on linear(..., 'gelu'), other Linears on mm); max dloss = largest |loss difference| / loss over the first "
             f"{cfg.get('loss_steps')} steps from the same weights", GPT_HEAD, "-" * len(GPT_HEAD)]
    for r in rows:
        lead = f"{r['mode']:<8} {r['tokens']:>6}"
        if r.get("status") != "ok":
            lines.append(not_run_line(lead, r))
            continue
        b = r["baselines"]["torch"]
        lines.append(f"{lead} {fmt_time(r['cuops_ms']):>9} {fmt_time(b.get('ms')):>9} {fmt_ratio(r.get('ratio')):>7} "
                     f"{r['cuops_tokens_per_s']:>11.0f} {b.get('tokens_per_s') or 0:>11.0f} "
                     f"{(r.get('check') or {}).get('max_rel_loss_diff', 0):>9.4f}")
    return lines


FUSED_HEAD = (f"{'op':<17} {'pass':<8} {'dtype':<9} {'model':<11} {'tokens':>6} {'cuops':>9} {'eager':>7} "
              f"{'compiled':>8} {'addmm_act':>9} {'frac mm':>7} {'frac copy':>9}")


def geomean_and_worst(pairs: list) -> tuple:
    """pairs of (ratio, row): the ratios' geometric mean, the least ratio and its row."""
    geo = math.exp(sum(math.log(x) for x, _ in pairs) / len(pairs))
    low, worst = min(pairs, key=lambda p: p[0])
    return geo, low, worst


def fused_lines(results: dict) -> list[str]:
    """The fused ops' rows (sections/fused.py): cuops time and each baseline's time / cuops time."""
    rows = [r for r in results["rows"] if r["family"] == "fused"]
    if not rows:
        return []
    lines = ["", "fused ops: ratio = the torch code's time / cuops' (eager; compiled; torch._addmm_activation); "
             "frac mm = the bare products' time (torch.mm) / cuops'; frac copy (decode) = the weights' bytes read "
             "per second / the copy rate at the same bytes, both steady (CUDA-graph replays over a pool larger than L2)", FUSED_HEAD, "-" * len(FUSED_HEAD)]
    for r in rows:
        dtype = r["dtype"] + ("/" + r["precision"] if r.get("precision") else "")
        lead = f"{r['op']:<17} {r['kind']:<8} {dtype:<9} {r['model']:<11} {r['tokens']:>6}"
        if r.get("status") != "ok":
            lines.append(not_run_line(lead, r))
            continue
        b = r["baselines"]
        ratio = lambda key: fmt_ratio((b.get(key) or {}).get("ratio"))  # noqa: E731
        lines.append(f"{lead} {fmt_time(r['cuops_ms']):>9} {ratio('eager'):>7} {ratio('compiled'):>8} "
                     f"{ratio('addmm_act'):>9} {fmt_frac(r.get('fraction')):>7} "
                     f"{fmt_frac(r.get('copy_fraction')):>9}")
    # Geometric means over the bf16 rows of 512+ tokens (the acceptance's), each with its worst row.
    for op, kind in sorted({(r["op"], r["kind"]) for r in rows}):
        sel = [r for r in rows if (r["op"], r["kind"]) == (op, kind) and r.get("status") == "ok"
               and r["dtype"] == "bfloat16" and r["tokens"] >= 512]
        parts = []
        for key in ("eager", "compiled", "addmm_act"):
            ratios = [(r["baselines"][key]["ratio"], r) for r in sel if key in r["baselines"]]
            if ratios:
                geo, low, worst = geomean_and_worst(ratios)
                parts.append(f"{key} {geo:.3f}x (worst {low:.3f}x at {worst['model']} {worst['tokens']})")
        if parts:
            lines.append(f"geomean {op} {kind} bf16, 512+ tokens: " + "; ".join(parts))
    # Decode rows whose weights exceed L2 (SPEC §3's 64 MB): the weights' rate against the copy's.
    for op in sorted({r["op"] for r in rows}):
        sel = [r for r in rows if r["op"] == op and r.get("copy_fraction") and r["weight_bytes"] >= 64e6]
        if sel:
            low = min(sel, key=lambda r: r["copy_fraction"])
            flushed = min(r.get("flushed_copy_fraction") or 0 for r in sel)
            steady = {key: [r["baselines"][key].get("steady_ratio") or 0 for r in sel] for key in ("eager", "mm")}
            lines.append(f"decode {op} ({len(sel)} rows of >= 64 MB of weights): frac copy "
                         f"{low['copy_fraction']:.2f} at the worst ({low['dtype']} {low['model']} {low['tokens']}); "
                         f"flushed {flushed:.2f}; steady eager / cuops {min(steady['eager']):.3f}-"
                         f"{max(steady['eager']):.3f}, mm / cuops {min(steady['mm']):.3f}-{max(steady['mm']):.3f}")
    return lines


RMS_HEAD = (f"{'op':<13} {'pass':<4} {'mix':<8} {'rows x D':<12} {'cuops':>9} {'GB/s':>6} {'frac':>5} "
            f"{'eager':>7} {'compiled':>8}")


def rms_norm_lines(results: dict) -> list[str]:
    """The norms' rows (sections/rms_norm.py): time, bytes per second against the copy's, and the Hugging
    Face code's time / cuops' eager and compiled; then, per op and pass, the worst fraction and the
    compiled geomean."""
    rows = [r for r in results["rows"] if r["family"] == "rms_norm"]
    if not rows:
        return []
    lines = ["", "rms_norm, add_rms_norm, rotary: frac = bytes moved per second / the copy's; ratio = Hugging Face's "
             "code's time / cuops' (eager; compiled); bwd = the backward alone; rotary's rows x D: tokens x (q + k "
             "heads) x D", RMS_HEAD, "-" * len(RMS_HEAD)]
    for r in rows:
        lead = f"{r['op']:<13} {r['kind']:<4} {r['dtype']:<8} {r['size']:<12}"
        if r.get("status") != "ok":
            lines.append(not_run_line(lead, r))
            continue
        b = r["baselines"]
        ratio = lambda key: fmt_ratio((b.get(key) or {}).get("ratio"))  # noqa: E731
        lines.append(f"{lead} {fmt_time(r['cuops_ms']):>9} {r['GBps']:>6.0f} {fmt_frac(r.get('fraction')):>5} "
                     f"{ratio('eager'):>7} {ratio('compiled'):>8}")
    for op, kind in sorted({(r["op"], r["kind"]) for r in rows}):
        sel = [r for r in rows if (r["op"], r["kind"]) == (op, kind) and r.get("status") == "ok"]
        fracs = [(r["fraction"], r) for r in sel if r.get("fraction")]
        comp = [(r["baselines"]["compiled"]["ratio"], r) for r in sel if "compiled" in r["baselines"]]
        parts = []
        if fracs:
            low, worst = min(fracs, key=lambda p: p[0])
            parts.append(f"frac >= {low:.2f} (at {worst['dtype']} {worst['size']})")
        if comp:
            geo, low, worst = geomean_and_worst(comp)
            parts.append(f"compiled {geo:.3f}x (worst {low:.3f}x at {worst['dtype']} {worst['size']})")
        if parts:
            lines.append(f"{op} {kind}: " + "; ".join(parts))
    return lines


HF_TRAIN_HEAD = (f"{'variant':<14} {'ms/step':>9} {'vs torch eager':>14} {'vs torch compile':>16} {'GB a step adds':>14} "
                 f"{'vs torch eager':>14}")
HF_INFER_HEAD = f"{'op':<8} {'batch':>5} {'size':<14} {'patch':>9} {'torch':>9} {'ratio':>7} {'argmax agree':>12}"


def hf_llama_lines(results: dict) -> list[str]:
    """transformers' Llama unpatched and patched (sections/hf_llama.py): the training step's four variants
    (time, ratios, the memory a step adds), the loss check; eager decode and prefill."""
    every = [r for r in results["rows"] if r["family"] == "hf_llama"]
    lines = []
    for model in dict.fromkeys(r.get("model", "llama") for r in every):  # a table a family (--hf-model-type)
        lines += hf_model_lines(results, model, [r for r in every if r.get("model", "llama") == model])
    return lines


def hf_model_lines(results: dict, model: str, rows: list) -> list[str]:
    cfg = (results.get("hf_llama") or {}).get("config") or {}
    lines = ["", f"hf_llama (transformers {model} ForCausalLM, {cfg.get('layers')} layers, width {cfg.get('hidden')}, "
             f"FFN {cfg.get('ffn')}, {cfg.get('heads')}/{cfg.get('kv_heads')} heads, vocab {cfg.get('vocab')}; "
             f"training {cfg.get('batch')} x {cfg.get('seq')} tokens, {(results.get('hf_llama') or {}).get('optimizer')}): "
             "patch = cuops.patch(model)"]
    lines += train_step_lines([r for r in rows if r["op"] == "train_step"])
    infer = [r for r in rows if r["op"] != "train_step"]
    if infer:
        lines += [HF_INFER_HEAD, "-" * len(HF_INFER_HEAD)]
    for r in infer:
        lead = f"{r['op']:<8} {r['batch']:>5} {r['size']:<14}"
        if r.get("status") != "ok":
            lines.append(not_run_line(lead, r))
            continue
        lines.append(f"{lead} {fmt_time(r['cuops_ms']):>9} {fmt_time(r['baselines']['torch']['ms']):>9} "
                     f"{fmt_ratio(r['ratio']):>7} {r['check']['argmax_agreement']:>12.2f}")
    return lines


def train_step_lines(train: list, base: str = "torch") -> list[str]:
    """One model's training-step rows (sections/hf_llama.py's time_training, a row a mode): the four
    variants' time, ratios and the memory a step adds, then the loss check; `base` names the unpatched
    side (torch, or PEFT for hf_lora)."""
    lines = []
    done = [r for r in train if r.get("status") == "ok"]
    if done:
        figures = {}
        for r in done:
            figures[f"patch {r['mode']}"] = (r["cuops_ms"], r.get("cuops_added_gb"))
            for key, b in r["baselines"].items():
                figures.setdefault(key, (b["ms"], b.get("added_gb")))
        eager, comp = figures.get("torch eager"), figures.get("torch compile")
        head = HF_TRAIN_HEAD.replace("vs torch", f"vs {base}")
        lines += [head, "-" * len(head)]
        for key in ("torch eager", "torch compile", "patch eager", "patch compile"):
            if key not in figures:
                continue
            ms, gb = figures[key]
            mem = f"{gb:>14.2f} {fmt_ratio(gb / eager[1] if gb and eager and eager[1] else None):>14}" if gb else ""
            lines.append(f"{key.replace('torch', base):<14} {fmt_time(ms):>9} "
                         f"{fmt_ratio(eager[0] / ms if eager else None):>14} "
                         f"{fmt_ratio(comp[0] / ms if comp else None):>16} {mem}")
        check = done[0]["check"]
        lines.append(f"losses over the first {len(check['losses']['torch'])} eager steps from the same weights: largest "
                     f"|patch - {base}| / {base} {check['max_rel_loss_diff']:.2e} ({base}'s median step-to-step "
                     f"change {check['median_step_change'] or 0:.2e}); first {check['losses']['torch'][0]:.4f}, last "
                     f"{base} {check['losses']['torch'][-1]:.4f} / patch {check['losses']['patch'][-1]:.4f}")
    for r in train:
        if r.get("status") != "ok":
            lines.append(not_run_line(f"train_step {r['mode']}", r))
    return lines


def hf_lora_lines(results: dict) -> list[str]:
    """PEFT LoRA unpatched and patched (sections/hf_lora.py): a training-step table a model shape and
    adapter dropout."""
    rows = [r for r in results["rows"] if r["family"] == "hf_lora"]
    if not rows:
        return []
    info = results.get("hf_lora") or {}
    cfg = info.get("config") or {}
    lines = ["", f"hf_lora (PEFT LoRA r {cfg.get('r')}, alpha {cfg.get('alpha')} on {', '.join(cfg.get('targets') or ())} "
             f"of transformers LlamaForCausalLM, base frozen; vocab {cfg.get('vocab')}, {cfg.get('batch')} x "
             f"{cfg.get('seq')} tokens, {info.get('optimizer')} on the adapters): patch = cuops.patch, then "
             "get_peft_model"]
    groups = {}
    for r in rows:
        groups.setdefault((r["model"], r["dropout"]), []).append(r)
    for (model, dropout), train in groups.items():
        layers, hidden, ffn, heads, kv = train[0]["shape"]
        lines += ["", f"{model} ({layers} layers, width {hidden}, FFN {ffn}, {heads}/{kv} heads), dropout {dropout}:"]
        lines += train_step_lines(train, base="PEFT")
    return lines


MOE_GROUPED_HEAD = (f"{'shape':<22} {'routing':<8} {'product':<7} {'cuops':>9} {'TFLOP/s':>7} {'_grouped_mm':>11} "
                    f"{'ratio':>7} {'loop':>9} {'ratio':>7} {'err':>8}")
MOE_TRAIN_HEAD = f"{'variant':<20} {'ms/step':>9} {'vs hf fp32':>10} {'vs hf bf16':>10} {'vs liger':>9} {'GB a step adds':>14}"


def moe_lines(results: dict) -> list[str]:
    """The mixture-of-experts section (sections/moe.py): the grouped GEMM's products against
    torch._grouped_mm and a per-expert loop; each model's training-step variants (ratios against HF's
    two and Liger's) with the memory a step adds; decode."""
    rows = [r for r in results["rows"] if r["family"] == "moe"]
    if not rows:
        return []
    lines = []
    grouped = [r for r in rows if r["op"] == "grouped_mm"]
    if grouped:
        lines += ["", "grouped GEMM (T x k rows sorted by expert against [E, N, K] weights read as HF does): "
                  "ratio = baseline's time / cuops'", MOE_GROUPED_HEAD, "-" * len(MOE_GROUPED_HEAD)]
    for r in grouped:
        lead = f"{r['model']:<22} {r['routing']:<8} {r['kind']:<7}"
        if r.get("status") != "ok":
            lines.append(not_run_line(lead, r))
            continue
        tg, loop = r["baselines"].get("torch._grouped_mm"), r["baselines"]["loop"]
        lines.append(f"{lead} {fmt_time(r['cuops_ms']):>9} {r['cuops_tflops']:>7.1f} "
                     f"{fmt_time(tg['ms']) if tg else '-':>11} {fmt_ratio(tg['ratio'] if tg else None):>7} "
                     f"{fmt_time(loop['ms']):>9} {fmt_ratio(loop['ratio']):>7} {r['check']['rel_error_vs_loop']:>8.1e}")
    decode = [r for r in rows if r["op"] == "experts_decode"]
    if decode:
        lines += ["", "moe_experts at decode (bf16, no gradient, a CUDA-graph replay): the routed experts' "
                  "weights read once; frac = their bytes per second / the copy's"]
    for r in decode:
        lead = f"{r['model']:<14} {r['size']:<34}"
        lines.append(not_run_line(lead, r) if r.get("status") != "ok" else
                     f"{lead} {fmt_time(r['cuops_ms']):>9} {r['routed_experts']:>4} experts "
                     f"{r['GBps']:>6.0f} GB/s  frac {r.get('fraction', float('nan')):.2f}")
    cfg = (results.get("moe") or {}).get("config") or {}
    for model in dict.fromkeys(r["model"] for r in rows if r["op"] == "train_step"):
        train = [r for r in rows if r["op"] == "train_step" and r["model"] == model]
        shape = dict(cfg.get("model_shapes") or ()).get(model)
        lines += ["", f"{model} {shape or ''}: training step, {cfg.get('batch')} x {cfg.get('seq')} tokens, "
                  f"{(results.get('moe') or {}).get('optimizer')}; fp32 = float32 weights under bf16 autocast",
                  MOE_TRAIN_HEAD, "-" * len(MOE_TRAIN_HEAD)]
        ms = {r["mode"]: r["cuops_ms"] for r in train if r.get("status") == "ok"}
        for r in train:
            if r.get("status") != "ok":
                lines.append(not_run_line(f"{r['mode']:<20}", r))
                continue
            vs = [fmt_ratio(ms[b] / r["cuops_ms"] if b in ms else None) for b in ("hf fp32", "hf bf16", "liger fp32")]
            gb = r.get("cuops_added_gb")
            lines.append(f"{r['mode']:<20} {fmt_time(r['cuops_ms']):>9} {vs[0]:>10} {vs[1]:>10} {vs[2]:>9} "
                         f"{'-' if gb is None else f'{gb:.2f}':>14}")
        for r in [r for r in rows if r["op"] == "decode" and r["model"] == model]:
            lead = f"decode {r['batch']:>3} {r['size']:<14}"
            lines.append(not_run_line(lead, r) if r.get("status") != "ok" else
                         f"{lead} patch {fmt_time(r['cuops_ms'])}, HF {fmt_time(r['baselines']['torch']['ms'])}, "
                         f"{fmt_ratio(r['ratio'])}, argmax agreement {r['check']['argmax_agreement']:.2f}")
    return lines


LCE_HEAD = (f"{'T':>5} {'K':>5} {'V':>6} {'cuops':>9} {'eager':>7} {'compiled':>8} {'torch_lce':>9} "
            f"{'cuops MB':>8} {'eager MB':>8} {'compiled MB':>11} {'1/8 f32 MB':>10}")


def cross_entropy_lines(results: dict) -> list[str]:
    """linear_cross_entropy's rows (sections/cross_entropy.py): forward + backward time, each baseline's
    time / cuops', and the memory each side adds (MB) beside the bound, 1/8 of the float32 logits."""
    rows = [r for r in results["rows"] if r["family"] == "cross_entropy"]
    if not rows:
        return []
    lines = ["", "linear_cross_entropy, forward + backward: ratio = the torch code's time / cuops' (eager; compiled; "
             "F.linear_cross_entropy); MB = what a side adds beyond its inputs and returned gradients", LCE_HEAD,
             "-" * len(LCE_HEAD)]
    mb = lambda b: "-" if b is None else f"{b / 1e6:.0f}"  # noqa: E731
    for r in rows:
        lead = f"{r['tokens']:>5} {r['K']:>5} {r['V']:>6}"
        if r.get("status") != "ok":
            lines.append(not_run_line(lead, r))
            continue
        b = r["baselines"]
        ratio = lambda key: fmt_ratio((b.get(key) or {}).get("ratio"))  # noqa: E731
        added = lambda key: mb((b.get(key) or {}).get("added_bytes"))  # noqa: E731
        lines.append(f"{lead} {fmt_time(r['cuops_ms']):>9} {ratio('eager'):>7} {ratio('compiled'):>8} "
                     f"{ratio('torch_lce'):>9} {mb(r.get('cuops_added_bytes')):>8} {added('eager'):>8} "
                     f"{added('compiled'):>11} {mb(r['logits_f32_bytes'] / 8):>10}")
    return lines


def print_summary(results: dict, json_path: Path) -> None:
    commit, dirty = results["git_commit"], results["git_dirty"]
    print(f"cuops benchmarks on {results['gpu']} | torch {results['torch']} | commit {commit}"
          f"{' (dirty)' if dirty else ''} | timer {results['timer']}")
    for part in results.get("parts") or []:
        print(f"  merged run: commit {str(part['git_commit'])[:10]} {part['date']} {json.dumps(part['args'])}")
    reference = next((r["size"] for r in results["rows"]  # the copy the ceiling was read from
                      if r["family"] == "copy" and r.get("GBps") == results["copy_bandwidth_GBps"]), "-")
    print(f"ceiling: D2D copy {fmt_num(results['copy_bandwidth_GBps'])} GB/s at {reference}; "
          "ratio = baseline time / cuops time (> 1: cuops faster); frac = cuops vs ceiling "
          "(copy GB/s at the operand's size, or cuBLAS)")
    for ln in table_lines(results):
        print(ln)
    plots = results["plots"]
    print(f"wrote {json_path}" + "".join(f", {json_path.parent / p}" for p in plots.get("written", []))
          + f" in {results['elapsed_s']['total']:.0f}s")
    for err in plots.get("errors", []) + ([plots["error"]] if "error" in plots else []):
        print(f"plot: {err}")


# ----------------------------------------------------------------------------------------------
# Plots (matplotlib optional: the JSON holds every figure)


def plot(results: dict, out: Path, prefix: str = "") -> dict:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        return {"error": f"matplotlib unavailable: {error_text(e)}"}
    written, errors = [], []
    title = f"{results['gpu']} · torch {results['torch']} · {str(results['git_commit'])[:10]}"
    for name, draw in (("bandwidth.png", bandwidth_figure), ("gemm_tflops.png", gemm_figure),
                       ("gemm_shapes_bandwidth.png", shapes_bandwidth_figure), ("fused.png", fused_figure)):
        try:
            fig = draw(plt, results["rows"], title)
            if fig is None:  # no rows of that figure's section in this run
                continue
            fig.tight_layout()
            fig.savefig(out / (prefix + name), dpi=120)
            plt.close(fig)
            written.append(prefix + name)
        except Exception as e:  # noqa: BLE001
            errors.append(f"{name}: {error_text(e)}")
    return {"written": written, "errors": errors}


def bandwidth_figure(plt, rows: list, title: str):
    fig, ax = plt.subplots(figsize=(11, 6.5))
    copies = sorted((r for r in rows if r["family"] == "copy" and r.get("GBps")), key=lambda r: r["buffer_bytes"])
    if copies:
        ax.plot([r["buffer_bytes"] for r in copies], [r["GBps"] for r in copies], "k-", lw=2.5, marker="o",
                label="D2D copy (read+write)")
    colors = {"add2": "C0", "vector_add": "C1", "scale": "C2", "square": "C3", "two_norm": "C4"}
    styles = {"float32": "-", "bfloat16": "--", "float16": ":"}
    for op in colors:
        for dname in styles:
            pts = sorted((r["n"] * DTYPES[dname].itemsize, r["achieved_GBps"]) for r in rows
                         if r["op"] == op and r["dtype"] == dname and r.get("status") == "ok"
                         and r.get("achieved_GBps"))
            if pts:
                ax.plot(*zip(*pts), color=colors[op], ls=styles[dname], marker=".", label=f"{op} {SHORT[dname]}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes per operand (copy: per buffer)")
    ax.set_ylabel("achieved GB/s (bytes read + written / time)")
    ax.set_title(f"cuops memory-bound ops vs copy\n{title}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="upper left")
    return fig


def gemm_figure(plt, rows: list, title: str):
    fig, axes = plt.subplots(2, 3, figsize=(16, 8))
    axes.flat[-1].axis("off")  # five variants on a 2 x 3 grid
    for ax, (dname, precision) in zip(axes.flat, (SHAPE_VARIANTS[v] for v in GEMM_VARIANTS)):
        sel = [r for r in rows if r["family"] == "gemm" and r["dtype"] == dname
               and r["precision"] == precision and r["M"] == r["K"] == r["N"]]
        for op, color in (("gemm", "C0"), ("mm", "C2")):
            pts = sorted((r["M"], r["cuops_TFLOPs"]) for r in sel
                         if r["op"] == op and r.get("status") == "ok" and r.get("cuops_TFLOPs"))
            if pts:
                ax.plot(*zip(*pts), color=color, marker="o", label=f"cuops {op}")
        pts = sorted((r["M"], r["baselines"]["cublas"]["TFLOPs"]) for r in sel
                     if r["op"] == "mm" and (r.get("baselines") or {}).get("cublas", {}).get("TFLOPs"))
        if pts:
            ax.plot(*zip(*pts), "k--", marker="s", label="cuBLAS (torch.mm)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("M = N = K")
        ax.set_ylabel("TFLOP/s")
        ax.set_title({"high": "float32, TF32 on ('high')", "highest": "float32, TF32 off ('highest')"}.get(
            precision, dname), fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"cuops GEMM vs cuBLAS\n{title}", fontsize=10)
    return fig


def fused_figure(plt, rows: list, title: str):
    """The fused ops' rows of the main dtype: each baseline's time / cuops' against tokens, one panel per
    (op, pass), one colour per model; solid eager, dashed compiled, dotted _addmm_activation."""
    sel = [r for r in rows if r["family"] == "fused" and r.get("status") == "ok" and r["dtype"] in ("bfloat16",
                                                                                                    "float32")]
    sel = [r for r in sel if r["dtype"] == sel[0]["dtype"] and not r.get("precision")] if sel else []
    if not sel:
        return None
    panels = sorted({(r["op"], r["kind"]) for r in sel})
    models = sorted({r["model"] for r in sel})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.8), squeeze=False, sharey=True)
    for ax, (op, kind) in zip(axes[0], panels):
        for i, model in enumerate(models):
            pts = sorted((r for r in sel if (r["op"], r["kind"], r["model"]) == (op, kind, model)),
                         key=lambda r: r["tokens"])
            for key, ls in (("eager", "-"), ("compiled", "--"), ("addmm_act", ":")):
                xy = [(r["tokens"], r["baselines"][key]["ratio"]) for r in pts if key in r["baselines"]]
                if xy:
                    ax.plot(*zip(*xy), color=f"C{i % 10}", ls=ls, marker="o", ms=3, label=f"{model} vs {key}")
        ax.axhline(1.0, color="k", lw=0.8, alpha=0.5)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)  # host-bound compiled calls at few tokens reach 4-8x
        ax.set_xlabel("tokens")
        ax.set_title(f"{op} {kind} ({sel[0]['dtype']})", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = [], []
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h), labels.append(lab)
    axes[0][0].legend(handles, labels, fontsize=6)
    axes[0][0].set_ylabel("baseline time / cuops time")
    fig.suptitle(title, fontsize=9)
    return fig


def shapes_bandwidth_figure(plt, rows: list, title: str):
    """The skinny shape-suite rows: weight bytes read per second as a fraction of the copy rate against
    M, one panel per (kind, dtype variant), one colour per (model, Linear); solid cuops, dashed torch.mm."""
    sel = [r for r in rows if r["family"] == "gemm_shape" and r.get("status") == "ok" and r.get("fraction") is not None
           and "weight_bytes" in r]
    if not sel:
        return None
    order = ["bf16", "f16", "tf32", "f32"]
    variants = sorted({variant_label(r) for r in sel}, key=lambda v: order.index(v) if v in order else len(order))
    kinds = sorted({r["kind"] for r in sel}, key=lambda k: k != "forward")
    linears = sorted({(r["model"], r["linear"]) for r in sel})
    colors = {lin: f"C{i % 10}" for i, lin in enumerate(linears)}
    ms = sorted({r["M"] for r in sel})
    # A last column for the legend alone, so tight_layout leaves it its room.
    fig, axes = plt.subplots(len(kinds), len(variants) + 1, figsize=(4.2 * len(variants) + 2.6, 3.8 * len(kinds)),
                             squeeze=False, sharey=True, gridspec_kw={"width_ratios": [4.2] * len(variants) + [2.6]})
    for i, kind in enumerate(kinds):
        for j, variant in enumerate(variants):
            ax = axes[i][j]
            for lin in linears:
                pts = sorted((r for r in sel if r["kind"] == kind and variant_label(r) == variant
                              and (r["model"], r["linear"]) == lin), key=lambda r: r["M"])
                if not pts:
                    continue
                ax.plot([r["M"] for r in pts], [r["fraction"] for r in pts], color=colors[lin], marker="o", ms=3,
                        label=f"{lin[0]} {lin[1]}")
                tp = [(r["M"], r["baselines"]["torch"].get("fraction")) for r in pts]
                tp = [(m, f) for m, f in tp if f is not None]
                if tp:
                    ax.plot(*zip(*tp), color=colors[lin], ls="--", lw=1, marker=".", ms=3)
            ax.axhline(1.0, color="k", lw=0.8, alpha=0.5)
            ax.set_xscale("log", base=2)
            ax.set_xticks(ms, [str(m) for m in ms])
            ax.set_xlabel("M (tokens)")
            if j == 0:
                ax.set_ylabel("weight GB/s / copy GB/s")
            ax.set_title(f"{kind} {variant}", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
    handles, labels = [], []
    for ax in axes[:, :-1].flat:  # every Linear once, whichever panel has it
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    for ax in axes[:, -1]:
        ax.axis("off")
    axes[0][-1].legend(handles, labels, fontsize=7, loc="upper left", title="solid cuops, dashed torch.mm",
                       title_fontsize=7)
    fig.suptitle(f"shape suite: weight bandwidth against copy (steady state at M <= 16)\n{title}", fontsize=10)
    return fig
