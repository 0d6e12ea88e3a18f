#!/usr/bin/env bash
# Runs the CUDA tests of every kernel family under compute-sanitizer's memcheck, racecheck, initcheck and synccheck and fails
# on any report. memcheck, racecheck and synccheck check cuops' kernels only (--kernel-name kns=cuops):
# torch's own kernels are not ours to fix, and instrumenting them makes the run many times slower.
# initcheck cannot be filtered that way (see below).
# The caching allocator is turned off so every tensor is its own cudaMalloc: memcheck then sees an
# access one element past a tensor, and initcheck sees reads of memory nothing wrote.
#   bash tools/sanitize.sh            # all four tools
#   TOOLS="memcheck" bash tools/sanitize.sh
set -uo pipefail
source "$(dirname "$0")/env.sh"
cd "$CUOPS_ROOT"
[ -f "$CUOPS_BUILD_DIR/libcuops.so" ] || bash tools/build.sh || exit 1
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
"$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" ||
  { echo "sanitize.sh: no CUDA GPU here; nothing to check"; exit 1; }
out=${SANITIZE_LOG_DIR:-${OUT:-$CUOPS_BUILD_DIR}}
mkdir -p "$out"
export PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONUNBUFFERED=1
# The family list: FAMILY_TESTS and GEMM_PATH_TESTS below. TOOLS picks the tools; SANITIZE_PYTESTS,
# SANITIZE_PATH_PYTESTS (empty: none), SANITIZE_K, SANITIZE_PATH_K, SANITIZE_RACE_K and
# SANITIZE_INIT_K narrow a run; SANITIZE_JOBS and SANITIZE_CHUNK spread it (below).
# Every kernel family and the test files that reach its kernels (CUDA cases): each tool runs all of
# them, with a selection below; the C++ op tests run under every tool too. A new family adds its
# test file here (docs/design.md, "Adding a GEMM family").
FAMILY_TESTS=(
  tests/python/test_ops.py tests/python/test_bad_inputs.py tests/python/test_reliability.py  # elementwise, two_norm, GEMM
  tests/python/test_linear.py tests/python/test_swiglu.py tests/python/test_lora.py  # fused GEMM epilogues, linear.cu
  tests/python/test_cross_entropy.py  # loss
  tests/python/test_rms_norm.py       # norm
  tests/python/test_rotary.py         # elementwise
  tests/python/test_moe.py            # grouped GEMM (grouped_simt.cu), the MoE ops
)
# The GEMM paths' own files (small M, k split, float64), run apart with a narrower selection: their
# float16 cases repeat bfloat16's instances' code, and their largest products (k 8192 and more,
# weights of 14336 and 28672 rows) repeat the smaller ones' paths at many times the tools' cost.
GEMM_PATH_TESTS=(tests/python/test_gemm_small_m.py tests/python/test_gemm_split_k.py tests/python/test_gemm_f64.py)
PYTESTS=${SANITIZE_PYTESTS:-${FAMILY_TESTS[*]}}
PATH_PYTESTS=${SANITIZE_PATH_PYTESTS-${GEMM_PATH_TESTS[*]}}
# Left out everywhere: the CPU places; tensors over 2^31 elements, the 8-thread and the 100-run
# tests (the same kernels, at sizes or counts the tools make slow); torch.compile (Inductor's
# compile under the tool, for the kernels the eager tests run); CUDA graphs: the tools run with
# torch's caching allocator off (PYTORCH_NO_CUDA_MEMORY_CACHING), and a capture that allocates then
# fails and poisons the process ("not graph" below; a test that captures under another name skips
# at its capture: tests/python/conftest.py). Tests that name launched kernels through the profiler
# skip themselves (CUOPS_SANITIZER; the tool holds CUPTI).
BASE_K="not cpu and not huge and not threads and not bitwise and not graph and not compile"
PYSEL=${SANITIZE_K:-$BASE_K}
PATH_SEL=${SANITIZE_PATH_K:-"$BASE_K and not (float16 or 8192 or 65537 or 14336 or 28672)"}
# racecheck, many times slower, takes one 32-bit and one 16-bit dtype of every test (dtype0 float32,
# dtype3 bfloat16 in test_ops.py; named elsewhere): the shared-memory code is the same template for
# the other two. Plus test_ops.py's float32 edge-cut GEMM tests, both precisions: the SIMT kernel
# and, on Hopper, TF32's wgmma kernel in both of its forms (A from shared memory; A from registers,
# read from the TMA-written tile). Those tests leave out their torch.mm comparison under racecheck and
# initcheck (H200, compute-sanitizer 2025.3.1): torch's cuBLAS TF32 kernel, outside racecheck's
# --kernel-name filter, aborts the tool ("failed to handle a hardware exception"; alone too; clean
# unfiltered), and initcheck, not seeing that kernel's TMA stores (below), reports each read of its
# output.
RACE_SEL=${SANITIZE_RACE_K:-"$BASE_K and (dtype0 or dtype3 or float32 or bfloat16 or cut_chunks)"}
canary=$out/sanitizer_canary
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
"$nvcc" -O1 -arch=native -o "$canary" tests/sanitizer_canary.cu || { echo "sanitize.sh: canary build failed"; exit 1; }
# The tests run in processes of at most SANITIZE_CHUNK tests each: under memcheck a process's free
# device memory fell ~250 MB a test through test_ops.py's GEMM layout tests while torch held nothing
# (the same tests without the tool: 139 GB free throughout), and the H200's 139 GB ran out after
# 1240 tests. The tool's, not ours; a process's exit gives it back.
# SANITIZE_JOBS processes run at once, the next chunk starting as soon as one ends, the family and
# path files in one pool; each chunk logs apart, joined in order. The tools leave the GPU mostly idle
# while each process's host side works, so a process a core pays (H200, 16 cores: memcheck's 2,900
# tests 4.3 min with 9 at once; initcheck's 1,750 1.7 min with 12). Per tool unless SANITIZE_JOBS and
# SANITIZE_CHUNK say: memcheck at most 9 jobs of 70 tests (a process's device memory grows with its
# tests, above: 9 x 70 ran within the H200's 139 GB); racecheck at most 8 jobs of 25 (its GEMM tests
# take 2-4 s of GPU time each under it, float64 and k-split ones more, so small chunks keep the pool
# even; its processes share the one GPU its instrumented kernels keep busy, so 8 was chosen, not
# measured against others; with 16 one failed to attach in time, below); the others 150. At most 16
# jobs, as many as ran on the H200: each process holds a few GB of host memory and its own CUDA
# context. racecheck's whole selection takes longer than one 10-minute device call (H200: 325 to 980
# of its 1,753 tests in 8 minutes, by which files); run it in parts there, the family files and the
# path files apart, each narrowed with SANITIZE_PYTESTS / SANITIZE_PATH_PYTESTS.
default_pool() { # tool -> "jobs chunk"
  local cores
  cores=$(nproc)
  cores=$((cores < 16 ? cores : 16))
  case $1 in
    memcheck) echo "$((cores < 9 ? cores : 9)) 70" ;;
    racecheck) echo "$((cores < 8 ? cores : 8)) 25" ;;
    *) echo "$cores 150" ;;
  esac
}
chunk_pids=()
start_chunks() { # selection, test files...: every selected test, CHUNK to a process, JOBS at once
  local sel=$1 ids i
  shift
  mapfile -t ids < <("$PY" -m pytest "$@" -q --collect-only -p no:cacheprovider -k "$sel" | grep "::")
  [ ${#ids[@]} -gt 0 ] || { echo "sanitize.sh: no test selected in $*" >>"$log"; return 1; }
  for ((i = 0; i < ${#ids[@]}; i += CHUNK)); do
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do sleep 1; done
    cs_run --target-processes all "$PY" -m pytest -q -p no:cacheprovider "${ids[@]:i:CHUNK}" \
      >"$log.${#chunk_pids[@]}" 2>&1 &
    chunk_pids+=($!)
  done
}
join_chunks() { # waits for every chunk and appends its log in order; fails if any chunk failed
  local j rc=0
  for ((j = 0; j < ${#chunk_pids[@]}; j++)); do
    wait "${chunk_pids[j]}" || rc=1
    cat "$log.$j" >>"$log" && rm -f "$log.$j"
  done
  chunk_pids=()
  return $rc
}
status=0
for tool in ${TOOLS:-memcheck racecheck initcheck synccheck}; do
  extra=(--kernel-name kns=cuops)
  [ "$tool" = memcheck ] && extra+=(--leak-check no --padding 32)
  sel=$PYSEL tests=$PYTESTS
  if [ "$tool" = racecheck ]; then
    sel=$RACE_SEL
    # SANITIZE_RACE_EXCLUDE: kernels racecheck skips (compute-sanitizer's --kernel-name-exclude
    # syntax, e.g. kns=gemm_wgmma), for a kernel the tool cannot run; it stays under the others.
    [ -z "${SANITIZE_RACE_EXCLUDE:-}" ] || extra+=(--kernel-name-exclude "$SANITIZE_RACE_EXCLUDE")
  fi
  if [ "$tool" = initcheck ]; then
    # initcheck only counts memory as written by kernels it instruments: under the cuops filter every
    # input torch's own kernels filled (randn, fill_) looked uninitialised, and initcheck reported our
    # add kernel reading it (H200). So no filter here (torch's kernels are instrumented
    # too, and so slower), on racecheck's narrower selection.
    extra=(--check-api-memory-access no)
    sel=${SANITIZE_INIT_K:-$RACE_SEL}
    # initcheck does not see the bulk tensor copy engine's stores (H100): every bf16 output
    # of the Hopper wgmma GEMM, which leaves by TMA store, read back as "uninitialised" in torch's
    # copy kernel, though the same tests pass with c pre-filled with NaN (every element written). So
    # initcheck runs the portable GEMM kernels; the wgmma kernel stays under the other three tools.
    export CUOPS_DISABLE_WGMMA=1
  else
    unset CUOPS_DISABLE_WGMMA
  fi
  # racecheck does not model the mbarrier transaction that orders two_norm's bulk copies (UBLKCP)
  # into shared memory before the consumer warps' reads: on the bulk pass it reported every read as
  # racing with the copy (H100). So racecheck checks two_norm's load pass (the same block
  # reduction); the bulk pass stays under memcheck, synccheck and initcheck.
  # The same holds for the small-M GEMM's streaming form (a TMA ring under mbarriers): racecheck runs
  # its per-lane forms.
  if [ "$tool" = racecheck ]; then
    export CUOPS_DISABLE_BULK_NORM=1 CUOPS_DISABLE_SKINNY_TMA=1
  else
    unset CUOPS_DISABLE_BULK_NORM CUOPS_DISABLE_SKINNY_TMA
  fi
  export CUOPS_SANITIZER=$tool
  read -r pool_jobs pool_chunk < <(default_pool "$tool")
  JOBS=${SANITIZE_JOBS:-$pool_jobs} CHUNK=${SANITIZE_CHUNK:-$pool_chunk}
  log=$out/sanitize_$tool.log
  start=$(date +%s)
  # --launch-timeout: with 16 racecheck processes at once one waited past the default 10 s to attach
  # to its Python process and failed ("No attachable process found"; H200).
  cs_run() {
    "$cs" --tool "$tool" "${extra[@]}" --launch-timeout 300 --error-exitcode 86 --print-limit 50 "$@"
  }
  # The canary's bug must be reported (exit 86), or a clean run below proves nothing.
  cs_run "$canary" "$tool" >"$log" 2>&1
  canary_rc=$?
  py_rc=0
  # shellcheck disable=SC2086
  start_chunks "$sel" $tests || py_rc=1
  # shellcheck disable=SC2086
  [ -z "$PATH_PYTESTS" ] || start_chunks "$PATH_SEL" $PATH_PYTESTS || py_rc=1
  join_chunks || py_rc=1
  cs_run "$CUOPS_BUILD_DIR/tests/cpp/cuops_cpp_tests" --gtest_filter='Devices/Ops.*/cuda:-*EightThreads*:*100Runs*' \
    >>"$log" 2>&1
  cpp_rc=$?
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | sed 's/=* *//' | tr '\n' ';')
  results=$(grep -E "^[0-9]+ (passed|failed)|PASSED|FAILED" "$log" | tr '\n' ' ')
  echo "$tool: canary rc=$canary_rc (86 = caught) | pytest rc=$py_rc | gtest rc=$cpp_rc | $(($(date +%s) - start)) s | $summary | $results"
  [ $canary_rc -eq 86 ] && [ $py_rc -eq 0 ] && [ $cpp_rc -eq 0 ] || status=1
done
exit $status
