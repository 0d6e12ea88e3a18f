"""Warp-stall samples of one kernel by region of its SASS: before the HGMMA loop, the loop, after it.
Input: ncu's per-instruction table of a wgmma kernel, e.g.

    ncu --kernel-name-base mangled --kernel-name regex:gemm_wgmma --launch-count 1 \\
        --section WarpStateStats --section SourceCounters --page source --csv --print-source sass \\
        ./wgmma_lib_sweep shapes > k.csv
    python3 bench/sweep/ncu_stall_regions.py k.csv

Once-per-tile code that stalls on instruction fetch shows as `no_inst` after the loop
(docs/performance.md, "split tail")."""
import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"


def main(path):
    header, kernel = None, None
    rows = []
    with open(path) as f:
        for line in f:  # the sweep's own output is interleaved with ncu's table
            if line.startswith('"Address"') and header is None:
                header = next(csv.reader([line]))
            elif line.startswith('"Kernel Name"') and kernel is None:
                kernel = next(csv.reader([line]))[1]
            elif line.startswith('"0x'):
                rows.append(next(csv.reader([line])))
    col = {h: i for i, h in enumerate(header)}
    stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    base = int(rows[0][0], 16)
    # The main loop: the address range of the HGMMAs that ran, with a margin for its waits and branch.
    hgmma = [int(r[0], 16) - base for r in rows if "HGMMA" in r[1] and int(r[col["Instructions Executed"]] or 0) > 0]
    lo, hi = min(hgmma) - 0x200, max(hgmma) + 0x100

    def region(address):
        a = address - base
        return "0 before the main loop" if a < lo else "1 main loop" if a <= hi else "2 after the main loop"

    samples, reasons = collections.Counter(), collections.defaultdict(collections.Counter)
    for r in rows:
        g = region(int(r[0], 16))
        samples[g] += int(r[col[SAMPLES]])
        for s in stalls:
            reasons[g][s] += int(r[col[s]])
    total = sum(samples.values())
    print(kernel.split("gemm_wgmma")[1][:60], "instructions", len(rows), "samples", total)
    for g in sorted(samples):
        top = ", ".join(f"{k.replace('stall_', '')} {v}" for k, v in reasons[g].most_common(4))
        print(f"  {g:<24} {samples[g]:5d} ({100 * samples[g] / total:4.1f}%) {top}")


if __name__ == "__main__":
    main(sys.argv[1])
