"""The results file (schema: PROTOCOL.md), the stdout table and the plots."""
from __future__ import annotations

import datetime
import json
import os
import subprocess
from pathlib import Path

import torch

from .harness import DTYPES, Bench, error_text
from .library import REPO
from .sections.gemm_squares import VARIANTS as GEMM_VARIANTS

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
    path.write_text(json.dumps(results, indent=1) + "\n")


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
    the JSON."""
    if r["family"] == "copy":
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
    """The stdout table: one line per (row, baseline), then the call overheads."""
    lines = [HEAD, "-" * len(HEAD)]
    for r in filter(in_table, results["rows"]):
        lines += row_lines(r)
    lines += [overhead_line(lang, o) for lang, o in (results.get("overhead") or {}).items()]
    return lines


def print_summary(results: dict, reference_copy: dict, json_path: Path) -> None:
    commit, dirty = results["git_commit"], results["git_dirty"]
    print(f"cuops benchmarks on {results['gpu']} | torch {results['torch']} | commit {commit}"
          f"{' (dirty)' if dirty else ''} | timer {results['timer']}")
    print(f"ceiling: D2D copy {fmt_num(results['copy_bandwidth_GBps'])} GB/s at {reference_copy['size']}; "
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


def plot(results: dict, out: Path) -> dict:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        return {"error": f"matplotlib unavailable: {error_text(e)}"}
    written, errors = [], []
    title = f"{results['gpu']} · torch {results['torch']} · {str(results['git_commit'])[:10]}"
    for name, draw in (("bandwidth.png", bandwidth_figure), ("gemm_tflops.png", gemm_figure)):
        try:
            fig = draw(plt, results["rows"], title)
            fig.tight_layout()
            fig.savefig(out / name, dpi=120)
            plt.close(fig)
            written.append(name)
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
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, (dname, precision) in zip(axes.flat, GEMM_VARIANTS):
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
