#!/usr/bin/env python3
"""Lengths of the C++/CUDA functions in kernels/ and ops/ (or the files named), longest first, and a
check that none is over a limit (the house rule: 120 lines; CI runs `--check`).

How a function is counted: comments, strings and preprocessor lines are blanked; a `{` whose
statement (the text since the last `;`, `{` or `}` of the same level) ends in `)` and optional
qualifiers (`const`, `noexcept`, `override`, `mutable`, a trailing return type, a constructor's
initialiser list) opens a function body; a namespace, class, struct, union, enum or extern block
is descended into. A function's length is the lines from its statement's first line (template
header included) to its closing brace. Lambdas and blocks inside a function count as its lines.

    python3 tools/function_lengths.py                 # the 15 longest
    python3 tools/function_lengths.py --check 120     # exit 1 if any is longer
"""
import argparse
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCOPES = re.compile(r"\b(namespace|struct|class|union|enum|extern)\b")
QUALIFIED = re.compile(
    r"\)\s*(const|noexcept|override|final|mutable|volatile|&|&&|\s)*(->\s*[\w:<>,\s\*&]+)?$")


def blank(text):
    """Comments, string and char literals and preprocessor lines as spaces (newlines kept)."""
    out, i, n = [], 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#":  # a directive, with its continuations
            j = i
            while j < n and (text[j] != "\n" or text[j - 1] == "\\"):
                j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            continue
        if c == "/" and text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
            continue
        if c == "/" and text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            continue
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (j - i - 1) + c)
            i = j + 1
            continue
        if c == "\n":
            line_start = True
        elif not c.isspace():
            line_start = False
        out.append(c)
        i += 1
    return "".join(out)


def functions(path):
    text = blank(path.read_text())
    line_of = [0] * (len(text) + 1)
    line = 1
    for i, c in enumerate(text):
        line_of[i] = line
        if c == "\n":
            line += 1
    found = []

    def scan(i, end_char):
        """Scans a scope from i to its closing brace; returns the index after it."""
        stmt = i
        while i < len(text):
            c = text[i]
            if c == ";":
                stmt = i + 1
            elif c == "}":
                return i + 1
            elif c == "{":
                head = text[stmt:i].strip()
                if SCOPES.search(head.split("(")[0]) or not head:
                    i = scan(i + 1, "}")
                elif QUALIFIED.search(head) or re.search(r"\)\s*:\s*[\w:]+\s*[({].*[)}]$", head, re.S):
                    close = skip_block(i)
                    start = stmt + len(text[stmt:i]) - len(text[stmt:i].lstrip())
                    name = [x for x in re.findall(r"([~\w:]+)\s*\(", head) if x != "__launch_bounds__"]
                    found.append((line_of[close - 1] - line_of[start] + 1, path, line_of[start],
                                  name[0] if name else head[:40]))
                    i = close
                else:  # an initialiser or other block: skip it
                    i = skip_block(i)
                stmt = i
                continue
            i += 1
        return i

    def skip_block(i):
        depth = 0
        while i < len(text):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        return i

    scan(0, None)
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*", help="files or folders (default: kernels/ and ops/)")
    ap.add_argument("--check", type=int, metavar="LINES", help="exit 1 if a function is longer")
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    paths = [pathlib.Path(p) for p in args.paths] or [ROOT / "kernels", ROOT / "ops"]
    files = []
    for p in paths:
        files += sorted(p.rglob("*")) if p.is_dir() else [p]
    found = []
    for f in files:
        if f.suffix in (".cu", ".cuh", ".cpp", ".h"):
            found += functions(f)
    found.sort(key=lambda x: -x[0])
    over = [f for f in found if args.check is not None and f[0] > args.check]
    for n, path, line, name in (over if args.check is not None else found[: args.top]):
        rel = path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path
        print(f"{n:5d}  {rel}:{line}  {name}")
    if args.check is not None:
        print(f"{len(found)} functions, {len(over)} longer than {args.check} lines")
        return 1 if over else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
