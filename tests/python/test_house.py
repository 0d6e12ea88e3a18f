"""The repository's house rules, checked on every machine (no GPU, no build): short functions in the
library's C++/CUDA, no history in the code and docs, results as a handful of current files, and the
GEMM planner's table in step with its CPU tests."""
import os
import re
import subprocess
import sys

from conftest import ROOT

FUNCTION_LIMIT = 120  # lines, tools/function_lengths.py's count


def test_no_library_function_is_longer_than_the_limit():
    proc = subprocess.run([sys.executable, ROOT / "tools" / "function_lengths.py", "--check", str(FUNCTION_LIMIT)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The count found the functions (a parse that found none would pass vacuously).
    assert int(proc.stdout.split()[-7]) > 300, proc.stdout


def test_function_lengths_counts_a_long_function(tmp_path):
    body = "\n".join(f"  x += {i};" for i in range(FUNCTION_LIMIT + 5))
    src = tmp_path / "long.cu"
    src.write_text("namespace a {\ntemplate <int N>\n__global__ void __launch_bounds__(128) k(int x) {\n"
                   + body + "\n}\nstruct S { int f() const { return 1; } };\n}  // namespace a\n")
    proc = subprocess.run([sys.executable, ROOT / "tools" / "function_lengths.py", "--check", str(FUNCTION_LIMIT),
                           src], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert f"{FUNCTION_LIMIT + 8}  " in proc.stdout and " k" in proc.stdout, proc.stdout
    assert "2 functions, 1 longer" in proc.stdout, proc.stdout


# What .gitignore keeps out of the paths tracked() walks where git cannot list them.
UNTRACKED_PARTS = {"__pycache__", "tmp"}


def tracked(*paths, root=ROOT):
    """The repository's files under paths: git's, those the working tree holds (a copy of .git can lag
    the tree it came with); in a tree git does not hold (`git archive`, an sdist) every file there but
    what .gitignore names under them (bytecode, bench/results/tmp)."""
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, text=True)
    if top.returncode == 0 and top.stdout.strip() and os.path.samefile(top.stdout.strip(), root):
        out = subprocess.run(["git", "ls-files", *paths], cwd=root, capture_output=True, text=True, check=True)
        return [root / p for p in out.stdout.split() if (root / p).exists()]
    files = []
    for p in paths:
        path = root / p
        walk = [path] if path.is_file() else sorted(q for q in path.rglob("*") if q.is_file())
        files += [q for q in walk if not UNTRACKED_PARTS & set(q.relative_to(root).parts) and q.suffix != ".pyc"]
    return files


def test_tracked_lists_an_exported_tree_as_a_checkout(tmp_path):
    """The house rules hold in a tree without git: tracked() lists there what git lists in the checkout."""
    if subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=ROOT, capture_output=True).returncode != 0:
        import pytest
        pytest.skip("this tree is not a git checkout: nothing to export it from")
    archive = subprocess.run(["git", "archive", "--format=tar", "HEAD", "bench/results", "docs"], cwd=ROOT,
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp_path)], input=archive, check=True)
    exported = sorted(p.relative_to(tmp_path) for p in tracked("bench/results", "docs", root=tmp_path))
    committed = subprocess.run(["git", "ls-tree", "-r", "--name-only", "HEAD", "bench/results", "docs"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.split()
    assert exported and [str(p) for p in exported] == sorted(committed)


def test_no_history_in_code_or_docs():
    pattern = re.compile(r"session [0-9]+|NOTES|\bs\. ?[0-9]+|_s[0-9]{2}_", re.IGNORECASE)
    hits = []
    for path in tracked("kernels", "ops", "python", "include", "schema", "docs", "README.md"):
        if path.suffix in (".so", ".png"):
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if pattern.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not hits, "\n".join(hits)


def test_results_are_a_handful_of_current_files():
    """Current results only: each file belongs to a results set -- <name>.json, its rendering <name>.txt and
    its plots <name>_*.png -- and the sets are a handful (one per section or merged run of sections)."""
    files = tracked("bench/results")
    sets = {p.stem for p in files if p.suffix == ".json"}
    assert 0 < len(sets) <= 14, sorted(sets)
    for p in files:
        owned = p.stem in sets if p.suffix in (".json", ".txt") else any(p.name.startswith(f"{s}_") for s in sets)
        assert owned and p.suffix in (".json", ".txt", ".png"), p.name
    assert all(any(p.name == f"{s}.txt" for p in files) for s in sets), sorted(sets)
    assert sum(p.stat().st_size for p in files) <= 3 << 20
    assert not [p.name for p in files if re.search(r"_s[0-9]{2}_|session", p.name)]
    assert not (ROOT / "bench" / "NOTES.md").exists()


def planner_table_rules():
    text = (ROOT / "kernels" / "gemm" / "gemm_plan.cpp").read_text()
    return re.findall(r"^// \| ([A-Z][A-Za-z0-9]+) +\|", text, re.MULTILINE)


def test_every_planner_rule_has_its_cpu_test_in_table_order():
    rules = planner_table_rules()
    assert len(rules) >= 20, rules
    tests = re.findall(r"^TEST\(GemmRule, (\w+)\)", (ROOT / "tests" / "cpp" / "test_gemm_plan.cpp").read_text(),
                       re.MULTILINE)
    assert tests == rules


def test_every_rule_the_planner_sets_is_a_table_row():
    rules = set(planner_table_rules())
    text = (ROOT / "kernels" / "gemm" / "gemm_plan.cpp").read_text()
    set_by_code = set(re.findall(r'"([A-Z][A-Za-z0-9]+)"', text))
    assert set_by_code - rules == set(), set_by_code - rules


def test_planner_fits_100_columns():
    """The planner and its table (clang-format leaves comments unwrapped elsewhere so tables survive)."""
    long = []
    for path in tracked("kernels/gemm/gemm_plan.h", "kernels/gemm/gemm_plan.cpp", "kernels/gemm/gemm_plan_hooks.h"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if len(line) > 100:
                long.append(f"{path.relative_to(ROOT)}:{n} ({len(line)})")
    assert not long, long
