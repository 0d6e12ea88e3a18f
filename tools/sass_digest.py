#!/usr/bin/env python3
"""Per-kernel SASS digest of a CUDA binary: instruction count and a hash of the instruction text, per
kernel and arch, so a refactor can be shown to leave the machine code of every kernel unchanged
(and a change to touch only the kernels it meant to), on a machine without a GPU.

    python3 tools/sass_digest.py build/libcuops.so > before.txt    # (or a .o, or saved -sass text)
    ... change, rebuild ...
    python3 tools/sass_digest.py build/libcuops.so --diff before.txt
    python3 tools/sass_digest.py gemm_f64.cu.o --loops 'gemm_mmaILi128'   # each loop of those kernels, counted

Names are mangled with the anonymous-namespace tag of their file removed (it depends on the file's
path and contents, not on the code). Needs cuobjdump (and nvdisasm) on PATH or in NVIDIA's wheels.
"""
import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys

ANON = re.compile(r"\d*_GLOBAL__N__[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]+")


def cuobjdump():
    found = shutil.which("cuobjdump") or ("/usr/local/cuda/bin/cuobjdump" if os.path.exists("/usr/local/cuda/bin/cuobjdump") else None)
    if found:
        return found
    try:
        import nvidia  # the nvidia-cuda-cuobjdump wheel (tools/env.sh pins it)
        for p in nvidia.__path__:
            cand = os.path.join(p, "cu13", "bin", "cuobjdump")
            if os.path.exists(cand):
                return cand
    except ImportError:
        pass
    sys.exit("sass_digest.py: no cuobjdump (CUDA toolkit or the nvidia-cuda-cuobjdump wheel)")


def bodies(path):
    """{(arch, kernel): [instruction text]}"""
    if path.endswith(".sass"):  # cuobjdump -sass output saved earlier
        text = open(path).read()
    else:
        tool = cuobjdump()
        env = dict(os.environ, PATH=os.path.dirname(tool) + os.pathsep + os.environ.get("PATH", ""))
        text = subprocess.run([tool, "-sass", path], capture_output=True, text=True, env=env, check=True).stdout
    out, arch, name, body = {}, "?", None, []

    def close():
        if name is not None:
            out[(arch, ANON.sub("<anon>", name))] = body

    for line in text.splitlines():
        m = re.match(r"\s*arch = (sm_\w+)", line)
        if m:
            # The section's last kernel ends here: recorded under its own arch, not the next one's.
            close()
            name = None
            arch = m.group(1)
            continue
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            close()
            name, body = m.group(1), []
            continue
        # "        /*0040*/                   LDC R1, c[0x0][0x28] ;         /* 0x00000a00ff017b82 */"
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;?\s*/\*", line)
        if m and name is not None:
            # Branch targets are addresses: kept (a moved target is a changed kernel).
            body.append(m.group(1))
    close()
    return out


def digest(path):
    """{(arch, kernel): (instructions, sha1 of the instruction text)}"""
    return {key: (len(body), hashlib.sha1("\n".join(body).encode()).hexdigest()[:12]) for key, body in bodies(path).items()}


# What a main loop's schedule comes down to: its matrix ops, shared / global / local memory traffic,
# barriers, and how many matrix ops follow the first barrier (the ones that can cover the loads after
# it: a guard on those loads once let ptxas hoist all but two of them above it).
LOOP_OPS = {"mma": r"^(@!?U?P\w+ )?(DMMA|HMMA|HGMMA|IMMA)", "LDS": r"\bLDS", "LDSM": r"\bLDSM", "LDGSTS": r"\bLDGSTS",
            "LDL": r"\bLDL", "STL": r"\bSTL", "BAR": r"\bBAR\.SYNC"}


def loops(path, pattern):
    """Each loop (a backward branch over 20+ instructions) of the kernels whose name matches pattern."""
    for (arch, name), body in sorted(bodies(path).items()):
        if not re.search(pattern, name):
            continue
        # Addresses advance 16 bytes an instruction in sm_70+ SASS, so a branch target is an index.
        found = []
        for i, t in enumerate(body):
            m = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", t)
            if m and int(m.group(1), 16) // 16 < i - 20:
                found.append((int(m.group(1), 16) // 16, i))
        print(f"{arch} {name[:120]}")
        for start, end in found:
            loop = body[start:end + 1]
            counts = {k: sum(bool(re.search(r, t)) for t in loop) for k, r in LOOP_OPS.items()}
            bar = next((j for j, t in enumerate(loop) if re.search(LOOP_OPS["BAR"], t)), len(loop))
            after = sum(bool(re.search(LOOP_OPS["mma"], t)) for t in loop[bar:])
            print(f"  loop {start:5d}-{end:5d}: {len(loop):4d} instructions, " + ", ".join(f"{k} {v}" for k, v in counts.items())
                  + f", mma after the first barrier {after}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("binary")
    parser.add_argument("--diff", help="a digest written earlier by this script: print what changed")
    parser.add_argument("--loops", metavar="REGEX", help="count each loop of the kernels whose name matches")
    args = parser.parse_args()
    if args.loops:
        loops(args.binary, args.loops)
        return 0
    now = digest(args.binary)
    if not args.diff:
        for (arch, name), (n, h) in sorted(now.items()):
            print(f"{arch} {n:6d} {h} {name}")
        return 0
    before = {}
    for line in open(args.diff):
        arch, n, h, name = line.split(maxsplit=3)
        before[(arch, name.strip())] = (int(n), h)
    changed = 0
    for key in sorted(set(before) | set(now)):
        b, a = before.get(key), now.get(key)
        if b != a:
            changed += 1
            print(f"{'changed' if a and b else 'added' if a else 'removed'}: {key[0]} {key[1][:110]} "
                  f"{b[0] if b else '-'} -> {a[0] if a else '-'} instructions")
    print(f"{len(now)} kernels, {changed} differ from {args.diff}")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
