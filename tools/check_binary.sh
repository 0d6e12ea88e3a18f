#!/usr/bin/env bash
# Checks that libcuops.so holds machine code for every CUDA arch it was configured with, and that each
# arch's code contains every kernel family (elementwise, the norm's two stages, gemm): a build whose
# .cu files compiled to nothing for an arch (wrong flags, an arch list torch rewrote) fails here
# instead of at the first launch on that GPU ("no kernel image is available"). From 80 the float64
# GEMM's DMMA instructions; with 90 also the sm_90a wgmma GEMM (see the end).
#   bash tools/check_binary.sh [path/to/libcuops.so]
set -uo pipefail
source "$(dirname "$0")/env.sh"
lib=${1:-$CUOPS_BUILD_DIR/libcuops.so}
cache=$(dirname "$lib")/CMakeCache.txt
archs=$(sed -n 's/^CUOPS_CUDA_ARCHITECTURES:STRING=//p' "$cache" 2>/dev/null | tr ';' ' ')
[ -n "$archs" ] || { echo "check_binary.sh: no CUOPS_CUDA_ARCHITECTURES in $cache"; exit 1; }
# cuobjdump: the toolkit's, else the one NVIDIA's wheel puts into the venv (tools/env.sh pins it).
cuobjdump=$(command -v cuobjdump || true)
[ -x /usr/local/cuda/bin/cuobjdump ] && cuobjdump=${cuobjdump:-/usr/local/cuda/bin/cuobjdump}
if [ -z "$cuobjdump" ]; then
  cuobjdump=$("$PY" -c "import nvidia, os; print(next((os.path.join(p, 'cu13', 'bin', 'cuobjdump') for p in nvidia.__path__ if os.path.exists(os.path.join(p, 'cu13', 'bin', 'cuobjdump'))), ''))" 2>/dev/null)
fi
[ -x "$cuobjdump" ] || { echo "check_binary.sh: no cuobjdump (toolkit or nvidia-cuda-cuobjdump wheel)"; exit 1; }
# cuobjdump -sass runs nvdisasm, found beside it (the toolkit's bin, or the wheels' shared bin dir).
export PATH="$(dirname "$cuobjdump"):$PATH"
listing=$("$cuobjdump" --list-elf "$lib") || { echo "check_binary.sh: cuobjdump failed on $lib"; exit 1; }
echo "$cuobjdump --list-elf $lib:"
sed 's/^/  /' <<<"$listing"
status=0
# Every arch's machine code first (cheap, from the listing): a missing one fails before the slow
# disassembly below.
for arch in $archs; do
  if ! grep -q "\.sm_${arch}\.cubin" <<<"$listing"; then
    echo "FAIL sm_${arch}: no machine code for this arch"; status=1
  fi
done
[ $status -eq 0 ] || exit 1
for arch in $archs; do
  sm=sm_${arch}
  functions=$("$cuobjdump" -res-usage -arch "$sm" "$lib" 2>/dev/null | grep -o "Function [^:]*")
  for family in elementwise_kernel sum_sq_diff_partials finish_norm gemm_tiled sgemm_simt sgemm_tf32 hgemm_mma dgemm_mma; do
    count=$(grep -c "$family" <<<"$functions")
    if [ "$count" -eq 0 ]; then echo "FAIL $sm: no $family kernels"; status=1; fi
  done
  # From sm_80 the float64 GEMM must run on the FP64 tensor cores (DMMA); below, it holds a trap.
  if [ "$arch" -ge 80 ] 2>/dev/null; then
    # One float64 tile kernel's machine code (-fun: disassembling every kernel took ~16 s an arch).
    f64=$(grep -o "Function [^ ]*dgemm_mma[^ ]*" <<<"$functions" | head -1 | cut -d' ' -f2)
    dmma=$("$cuobjdump" -sass -arch "$sm" -fun "$f64" "$lib" 2>/dev/null | grep -c "DMMA")
    if [ "$dmma" -eq 0 ]; then echo "FAIL $sm: no DMMA instructions (the float64 GEMM lost its tensor cores)"; status=1; fi
  fi
  echo "ok   $sm: $(grep -c cuops <<<"$functions") cuops kernels"
done
# With 90 in the list, the Hopper GEMM is built for sm_90a alone: its cubin must be there, and its
# machine code must run on the wgmma tensor-core instructions (HGMMA) fed by TMA (UTMALDG); a build
# that lost the arch-specific target would hold only the portable kernels and silently run 3x slower.
if grep -qwE "90a?" <<<"$archs"; then
  if ! grep -q "\.sm_90a\.cubin" <<<"$listing"; then
    echo "FAIL sm_90a: no machine code (the wgmma GEMM was not built)"; status=1
  else
    wg=$("$cuobjdump" -res-usage -arch sm_90a "$lib" 2>/dev/null | grep -o "Function [^:]*gemm_wgmma[^:]*")
    kernels=$(grep -c . <<<"$wg")
    # The machine code of one instance a dtype (bf16, fp16, TF32), not of all.
    names=$(for t in I13__nv_bfloat16 I6__half If; do grep -m1 "gemm_wgmma$t" <<<"$wg" | cut -d' ' -f2; done | paste -sd,)
    sass=$("$cuobjdump" -sass -arch sm_90a -fun "$names" "$lib" 2>/dev/null)
    hgmma=$(grep -c "HGMMA" <<<"$sass")
    utmaldg=$(grep -c "UTMALDG" <<<"$sass")
    if [ "$kernels" -eq 0 ] || [ "$hgmma" -eq 0 ] || [ "$utmaldg" -eq 0 ]; then
      echo "FAIL sm_90a: $kernels gemm_wgmma kernels, $hgmma HGMMA, $utmaldg UTMALDG instructions"; status=1
    else
      echo "ok   sm_90a: $kernels gemm_wgmma kernels, $hgmma HGMMA and $utmaldg UTMALDG instructions"
    fi
  fi
fi
exit $status
