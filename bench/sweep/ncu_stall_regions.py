"""Warp-stall samples of one kernel by region of its SASS: before the HGMMA loop, the loop, after it.
Input: ncu's per-instruction table of a wgmma kernel, e.g.

    ncu --kernel-name-base mangled --kernel-name regex:gemm_wgmma --launch-count 1 \
        --section WarpStateStats --section SourceCounters --page source --csv --print-source sass \
        ./wgmma_lib_sweep shapes > k.csv
    python3 bench/sweep/ncu_stall_regions.py k.csv

Once-per-tile code that stalls on instruction fetch shows as `no_inst` after the loop (bench/NOTES.md
session 29)."""
import csv, collections, sys
f=sys.argv[1]
hdr=None; kname=None
for l in open(f):
    if l.startswith('"Address"') and hdr is None: hdr=next(csv.reader([l]))
    if l.startswith('"Kernel Name"') and kname is None: kname=next(csv.reader([l]))[1]
idx={h:i for i,h in enumerate(hdr)}
data=[next(csv.reader([l])) for l in open(f) if l.startswith('"0x')]
base=int(data[0][0],16)
stalls=[h for h in hdr if h.startswith('stall_') and 'Not Issued' not in h]
# find the consumer main loop: the HGMMA-containing address range
hg=[int(r[0],16)-base for r in data if 'HGMMA' in r[1] and int(r[idx['Instructions Executed']] or 0)>0]
lo,hi=min(hg)-0x200,max(hg)+0x100
def region(a):
    a-=base
    if a<lo: return '0 before the main loop'
    if a<=hi: return '1 main loop'
    return '2 after the main loop'
agg=collections.defaultdict(collections.Counter); n=collections.Counter()
for r in data:
    g=region(int(r[0],16)); s=int(r[idx['Warp Stall Sampling (All Samples)']]); n[g]+=s
    for st in stalls: agg[g][st]+=int(r[idx[st]])
tot=sum(n.values())
print(kname.split('gemm_wgmma')[1][:60], 'instructions', len(data), 'samples', tot)
for g in sorted(n):
    print('  %-24s %5d (%4.1f%%)'%(g, n[g], 100*n[g]/tot), ', '.join('%s %d'%(k.replace('stall_',''),v) for k,v in agg[g].most_common(4)))
