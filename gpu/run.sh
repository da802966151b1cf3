#!/bin/bash
# gpu/run.sh - the whole GPU check of libattn in one call, for a lent GPU machine (or any Linux box
# with an NVIDIA GPU, the CUDA toolkit, cuDNN and PyTorch).
#
# usage: gpu/run.sh [cuda] [cudnn] [build] [test] [cli] [bench] [sanitize] [lab] [ncu]
#
# Implementations (none named: both):
#   cuda      libattn's own kernels (src/impl/cuda)
#   cudnn     the cuDNN implementation (src/impl/cudnn)
# Steps (none named: build test bench sanitize; they run in the order below, whatever the order
# of the arguments):
#   build     one build tree, build-gpu/ (Release, -j16): the library with the named
#             implementations, their tests and their benchmark programs. With cudnn it uses the
#             cuDNN that PyTorch's wheels ship when there is one, so both sides of the benchmark
#             run the same cuDNN, else the toolkit's.
#   test      tests/test_<impl> against the reference, with the golden cases of $GOLDEN (cuda:
#             then its quick suite under each sm90 forward tile scheduler forced), then
#             tests/test_paged, whose GPU cases run each named implementation on paged caches
#             (cuda: the split-KV decode kernel; cudnn: cuDNN's paged attention), and for cuda
#             tests/test_fp8_cuda (the sm90 fp8 forward; its refusal elsewhere) and
#             tests/test_dist_gpu, distributed attention with ranks as threads on this GPU
#   cli       the tests modules (the real modules load) and cli_gpu (attn check / bench on GPU
#             problems), and `attn bench` of two large problems, timed whole with their check
#   lab       cuda only: the kernel lab, dev/cuda/fwd_tiles.cu, bwd_tiles.cu, fwd_hopper.cu, bwd_hopper.cu and fwd_hopper_fp8.cu (sm_90a,
#             with dev/cuda/fwd_hopper_torch.py timing cuDNN and flash beside it), built and run
#   ncu       cuda only, implies lab: Nsight Compute on one lab launch of each lab program built:
#             the D = 128 forward (64-key tiles), the atomic backward (v5), the sm90 forward (v2)
#             and the sm90 backward (v8, D = 64); reports in /tmp/ncu_{fwd,bwd,fwd90,bwd90}.ncu-rep
#   bench     cuda: gpu/cuda_bench through gpu/cuda_bench.py (vs PyTorch's flash, cuDNN and
#             efficient SDPA); cudnn: gpu/bench_cudnn and gpu/bench_torch.py joined by gpu/report.py
#   sanitize  compute-sanitizer on the quick suite: memcheck, racecheck and synccheck for cuda
#             (test_cuda's quick suite, then test_fp8_cuda), memcheck for cudnn (racecheck on
#             cuDNN's own kernels would be slow and nothing we could fix); memcheck on
#             test_paged's quick GPU cases of each implementation
# Environment: GOLDEN, the golden cases (default ../shared/golden when it exists, else ./.golden,
# both from the current folder); OUT, the logs (default /tmp/gpu_out); BENCH_REPS, timed calls per
# shape of gpu/cuda_bench (default 20); LAB_PROGRAMS, the lab's programs to build and run (default
# "fwd_tiles bwd_tiles fwd_hopper bwd_hopper fwd_hopper_fp8"); CUDA_GENCODE, the -gencode flags of the cuda kernels when
# only this GPU's are wanted (e.g. "-gencode=arch=compute_90,code=sm_90": half the build time);
# SANITIZE_KERNELS, a kernel-name substring (e.g. fwd90) that limits test_cuda's sanitizers to
# those kernels, to check one family within the call's time.
#
# Logs: $OUT/env.txt, $OUT/build.log, $OUT/test_paged.log, and per implementation $OUT/cuda/
# (test.log, lab.log, lab_build.log, ncu_{fwd,bwd,fwd90,bwd90}_sass.csv, bench.md,
# sanitizer_{memcheck,racecheck,synccheck}.log) and $OUT/cudnn/ (test.log, cudnn.log, ours.csv,
# torch.csv, results.md, sanitizer_memcheck.log), each with sanitizer_memcheck_paged.log. Stdout
# is a summary in which every step ends in "rc=N" (124: timed out). Each step has a time limit,
# and all of them together stay under 9 minutes, so that one call of a device machine (10 minutes
# at most) always returns its logs.
#
# The tree built is the one this script sits in. While others edit the same checkout, run the
# script of a snapshot of the commit under test (`git archive HEAD | tar -x -C build-snap`, an
# ignored folder): `build-snap/gpu/run.sh`, with GOLDEN pointing at the cases.
set -u -o pipefail

usage() { sed -n '/^set -u/q; 2,$ s/^# \{0,1\}//p' "$0"; } # the comment above
die() {
  echo "gpu/run.sh: $*" >&2
  exit 2
}
first_file() { # the first of its arguments that is a file
  local f
  for f in "$@"; do if [ -f "$f" ]; then echo "$f" && return; fi; done
}

# ---- arguments ------------------------------------------------------------------------------------
impls="" steps=""
for arg in "$@"; do
  case $arg in
  cuda | cudnn) impls="$impls $arg" ;;
  build | test | cli | bench | sanitize | lab | ncu) steps="$steps $arg" ;;
  -h | --help) usage && exit 0 ;;
  *) die "unknown argument '$arg' (see gpu/run.sh --help)" ;;
  esac
done
impls=${impls:-" cuda cudnn"}
lab_programs=${LAB_PROGRAMS:-fwd_tiles bwd_tiles fwd_hopper bwd_hopper fwd_hopper_fp8}
steps=${steps:-" build test bench sanitize"}
impl() { case " $impls " in *" $1 "*) return 0 ;; esac; return 1; }
step() { case " $steps " in *" $1 "*) return 0 ;; esac; return 1; }
if step ncu && ! step lab; then steps="$steps lab"; fi # ncu profiles the lab's programs
if step lab && ! impl cuda; then die "lab and ncu are the CUDA kernels' (dev/cuda): name cuda too"; fi

# ---- what the machine must have, checked before anything is written ------------------------------
command -v nvcc >/dev/null || die "no nvcc on PATH: this needs the CUDA toolkit (nothing done)"
needs_gpu=0
for s in $steps; do [ "$s" = build ] || needs_gpu=1; done # every step but the build runs on the GPU
if [ $needs_gpu = 1 ] && ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  die "no NVIDIA GPU here (nvidia-smi -L lists none): only 'build' runs without one (nothing done)"
fi
if step sanitize; then command -v compute-sanitizer >/dev/null || die "no compute-sanitizer on PATH"; fi
if step ncu; then command -v ncu >/dev/null || die "no ncu (Nsight Compute) on PATH"; fi

# Paths given relative to the caller's folder, made absolute before moving to the tree to build.
if [ -z "${GOLDEN:-}" ]; then
  if [ -d ../shared/golden ]; then GOLDEN=../shared/golden; else GOLDEN=.golden; fi
fi
GOLDEN=$(realpath -m "$GOLDEN")
OUT=$(realpath -m "${OUT:-/tmp/gpu_out}")
BENCH_REPS=${BENCH_REPS:-20}
cd "$(dirname "$0")/.." || die "cannot enter the source tree"
BUILD=build-gpu
mkdir -p "$OUT" "$BUILD"
for i in $impls; do mkdir -p "$OUT/$i"; done

# Time limits: each step's own, cut to what is left of the 9 minutes of the whole call.
DEADLINE=$((SECONDS + 540))
limit() {
  local left=$((DEADLINE - SECONDS))
  if [ "$1" -lt "$left" ]; then echo "$1"; elif [ "$left" -gt 1 ]; then echo "$left"; else echo 1; fi
}

# ---- environment: the GPU, the toolkit, PyTorch and which cuDNN ----------------------------------
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>&1
  nvcc --version 2>&1 | tail -1
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())' 2>&1
} >"$OUT/env.txt"
if impl cudnn; then
  CUDNN_DIR=$(
    python3 - <<'EOF' 2>/dev/null
import glob, os, site
for base in site.getsitepackages():
    for h in glob.glob(os.path.join(base, "nvidia", "**", "cudnn_backend.h"), recursive=True):
        print(os.path.dirname(os.path.dirname(h)))
        raise SystemExit
EOF
  )
  if [ -z "$CUDNN_DIR" ]; then
    h=$(first_file /usr/local/cuda/include/cudnn_backend.h /usr/include/cudnn_backend.h)
    [ -n "$h" ] || die "cudnn named but no cudnn_backend.h found (PyTorch's wheels, /usr/local/cuda, /usr)"
    CUDNN_DIR=$(dirname "$(dirname "$h")")
  fi
  CUDNN_LIB=$(first_file "$CUDNN_DIR"/lib/libcudnn.so.9 "$CUDNN_DIR"/lib/libcudnn.so \
    "$CUDNN_DIR"/lib64/libcudnn.so /usr/local/cuda/lib64/libcudnn.so /usr/lib/x86_64-linux-gnu/libcudnn.so)
  [ -n "$CUDNN_LIB" ] || die "cudnn named but no libcudnn.so found beside $CUDNN_DIR/include"
  CUDNN_LIBDIR=$(dirname "$CUDNN_LIB")
  export LD_LIBRARY_PATH="$CUDNN_LIBDIR:${LD_LIBRARY_PATH:-}"
  echo "cudnn headers: $CUDNN_DIR/include, library: $CUDNN_LIB" >>"$OUT/env.txt"
  grep -h "define CUDNN_MAJOR\|define CUDNN_MINOR\|define CUDNN_PATCHLEVEL" \
    "$CUDNN_DIR"/include/cudnn_version*.h >>"$OUT/env.txt" 2>&1
fi
echo "== environment (gpu/run.sh$impls$steps; logs in $OUT; golden cases $GOLDEN)"
cat "$OUT/env.txt"

# ---- build ----------------------------------------------------------------------------------------
# The lab's programs are experiments, rebuilt whenever the lab runs, beside the library's build.
if step lab; then
  for lab in $lab_programs; do
    arch=compute_90,code=sm_90
    case $lab in *_hopper | *_hopper_fp8) arch=compute_90a,code=sm_90a ;; esac # wgmma and setmaxnreg are sm_90a's
    timeout "$(limit 300)" nvcc -std=c++17 -O3 -Iinclude -Isrc -gencode=arch=$arch \
      "dev/cuda/$lab.cu" -o "$BUILD/$lab" >"$OUT/cuda/lab_build_$lab.log" 2>&1 &
  done
fi
if step build; then
  echo "== build"
  # The implementations are run-time modules (libattn_cuda.so, libattn_cudnn.so) beside libattn.a;
  # every program below finds them through ATTN_MODULE_PATH (exported after the build).
  args=(-DCMAKE_BUILD_TYPE=Release -DATTN_BUILD_EXAMPLES=OFF -DATTN_BUILD_BENCH=OFF
        -DATTN_CUDA_SPILL_WARNINGS=ON)
  targets=(attn_static attn_shared attn_tool attn_fake_modules)
  targets+=(test_paged)
  if impl cuda; then args+=(-DATTN_WITH_CUDA=ON) targets+=(attn_cuda_module test_cuda test_fp8_cuda test_dist_gpu attn_test_loopback); else args+=(-DATTN_WITH_CUDA=OFF); fi
  if impl cudnn; then
    args+=(-DATTN_WITH_CUDNN=ON -DATTN_CUDNN_INCLUDE_DIR="$CUDNN_DIR/include" -DATTN_CUDNN_LIBRARY="$CUDNN_LIB")
    targets+=(attn_cudnn_module test_cudnn)
  else
    args+=(-DATTN_WITH_CUDNN=OFF)
  fi
  if [ -n "${CUDA_GENCODE:-}" ]; then args+=("-DATTN_CUDA_GENCODE=$CUDA_GENCODE"); fi
  t0=$SECONDS
  timeout "$(limit 120)" cmake -S . -B "$BUILD" "${args[@]}" >"$OUT/build.log" 2>&1 &&
    timeout "$(limit 300)" cmake --build "$BUILD" -j16 --target "${targets[@]}" >>"$OUT/build.log" 2>&1
  rc=$?
  echo "build rc=$rc in $((SECONDS - t0)) s; ptxas spill warnings: $(grep -c 'spilled' "$OUT/build.log")"
  grep -E "warning|error" "$OUT/build.log" | grep -v "spilled" | head -20
  if [ $rc -ne 0 ]; then
    tail -40 "$OUT/build.log"
    echo "BUILD FAILED: nothing else runs"
    exit 1
  fi
  # The benchmarks are one file each against the public header and the static library; not CMake
  # targets, since they mean nothing without a GPU.
  cudart=$(grep -h "^CUDA_cudart_LIBRARY:" "$BUILD/CMakeCache.txt" | cut -d= -f2)
  libs=("$BUILD/libattn.a")
  if impl cudnn; then libs+=("$CUDNN_LIB" "-Wl,-rpath,$CUDNN_LIBDIR"); fi
  libs+=("$cudart" "-Wl,-rpath,$(dirname "$cudart")" -fopenmp -lm -lpthread)
  bench_programs=""
  if impl cuda; then bench_programs="$bench_programs cuda_bench decode_bench"; fi
  if impl cudnn; then bench_programs="$bench_programs bench_cudnn"; fi
  for b in $bench_programs; do
    echo "-- gcc gpu/$b.c" >>"$OUT/build.log"
    gcc -O2 -std=c11 -Iinclude -I"$(dirname "$(dirname "$(command -v nvcc)")")/include" "gpu/$b.c" \
      "${libs[@]}" -o "$BUILD/$b" >>"$OUT/build.log" 2>&1
    rc=$?
    echo "gpu/$b.c rc=$rc"
    [ $rc -eq 0 ] || tail -20 "$OUT/build.log"
  done
fi

export ATTN_MODULE_PATH="$PWD/$BUILD"

# Runs only when the program exists, else says why with rc=127.
built() {
  [ -x "$1" ] && return 0
  echo "$1 rc=127: not built (name the build step)"
  return 1
}

# ---- correctness ----------------------------------------------------------------------------------
if step test; then
  for i in $impls; do
    echo "== test $i"
    built "$BUILD/tests/test_$i" || continue
    t0=$SECONDS
    if [ "$i" = cudnn ]; then # cuDNN's own log of errors, for a failure inside cuDNN
      export CUDNN_LOGLEVEL_DBG=1 CUDNN_LOGDEST_DBG="$OUT/cudnn/cudnn.log"
    fi
    timeout "$(limit 200)" "$BUILD/tests/test_$i" "$GOLDEN" >"$OUT/$i/test.log" 2>&1
    rc=$?
    unset CUDNN_LOGLEVEL_DBG CUDNN_LOGDEST_DBG
    echo "test_$i rc=$rc in $((SECONDS - t0)) s: $(tail -1 "$OUT/$i/test.log")"
    grep -E "^FAIL|^FATAL" "$OUT/$i/test.log" | head -40
  done
  if impl cuda && built "$BUILD/tests/test_cuda"; then # the sm90 forward's other tile scheduler
    for sched in grid persistent; do # each forced where the measured choice takes the other
      t0=$SECONDS
      log="$OUT/cuda/test_sched_$sched.log"
      timeout "$(limit 120)" env ATTN_CUDA_QUICK=1 ATTN_CUDA_SM90_SCHED=$sched "$BUILD/tests/test_cuda" "$GOLDEN" >"$log" 2>&1
      echo "test_cuda (quick, ATTN_CUDA_SM90_SCHED=$sched) rc=$? in $((SECONDS - t0)) s: $(tail -1 "$log")"
      grep -E "^FAIL|^FATAL" "$log" | head -20
    done
  fi
  if built "$BUILD/tests/test_paged"; then # paged and decode problems on the built modules
    t0=$SECONDS
    timeout "$(limit 150)" "$BUILD/tests/test_paged" >"$OUT/test_paged.log" 2>&1
    echo "test_paged rc=$? in $((SECONDS - t0)) s: $(tail -1 "$OUT/test_paged.log")"
    grep -E "^test_paged: " "$OUT/test_paged.log"
    grep -E "^FAIL|^FATAL" "$OUT/test_paged.log" | head -20
  fi
  if impl cuda && built "$BUILD/tests/test_fp8_cuda"; then # the sm90 fp8 forward (docs/FP8.md)
    t0=$SECONDS
    timeout "$(limit 120)" "$BUILD/tests/test_fp8_cuda" >"$OUT/cuda/test_fp8_cuda.log" 2>&1
    echo "test_fp8_cuda rc=$? in $((SECONDS - t0)) s: $(tail -1 "$OUT/cuda/test_fp8_cuda.log")"
    grep -E "^FAIL|^FATAL" "$OUT/cuda/test_fp8_cuda.log" | head -20
  fi
  if impl cuda && built "$BUILD/tests/test_dist_gpu"; then # sharded problems, ranks as threads
    t0=$SECONDS
    timeout "$(limit 180)" "$BUILD/tests/test_dist_gpu" >"$OUT/cuda/test_dist_gpu.log" 2>&1
    echo "test_dist_gpu rc=$? in $((SECONDS - t0)) s: $(tail -1 "$OUT/cuda/test_dist_gpu.log")"
    grep -E "^FAIL|^FATAL|SKIP" "$OUT/cuda/test_dist_gpu.log" | head -30
  fi
fi

# ---- the attn command on GPU problems, and the modules --------------------------------------------
# The tests cli_gpu (attn check / bench with device=cuda) and modules (the real modules load, beside
# the stand-ins), then the bench problems issue 11 timed out on, each timed whole, its check included.
if step cli; then
  echo "== cli"
  (cd "$BUILD" && timeout "$(limit 200)" ctest -R '^(modules|cli_gpu)$' --output-on-failure) \
    >"$OUT/cli.log" 2>&1
  echo "ctest modules cli_gpu rc=$?: $(grep -E 'tests passed|tests failed' "$OUT/cli.log")"
  grep -E "^FAIL" "$OUT/cli.log" | head -20
  for args in "--backward|b2 hq16 sq8192 d128 bf16 device=cuda" "|b64 hq32 hkv8 sq1 sk16384 d128 bf16 device=cuda"; do
    flags=${args%%|*} problem=${args#*|}
    t0=$SECONDS
    # shellcheck disable=SC2086 # flags: one word or none
    timeout "$(limit 120)" "$BUILD/tools/attn" bench $flags --reps 5 "$problem" >>"$OUT/cli_bench.log" 2>&1
    echo "attn bench $flags \"$problem\": rc=$? in $((SECONDS - t0)) s"
  done
  cat "$OUT/cli_bench.log"
fi

# ---- kernel lab and Nsight Compute (cuda) ---------------------------------------------------------
if step lab; then
  echo "== lab (dev/cuda)"
  wait # for the lab's builds, started before the library's
  cat "$OUT"/cuda/lab_build_*.log >"$OUT/cuda/lab_build.log" && rm -f "$OUT"/cuda/lab_build_*.log
  : >"$OUT/cuda/lab.log"
  for lab in $lab_programs; do
    built "$BUILD/$lab" || { tail -20 "$OUT/cuda/lab_build.log"; continue; }
    timeout "$(limit 150)" "$BUILD/$lab" 2>&1 | tee -a "$OUT/cuda/lab.log"
    echo "$lab rc=$?"
  done
  case " $lab_programs " in *" fwd_hopper "*) # its peers: cuDNN and flash through PyTorch on the same shapes
    timeout "$(limit 100)" python3 dev/cuda/fwd_hopper_torch.py 2>&1 | tee -a "$OUT/cuda/lab.log"
    echo "fwd_hopper_torch.py rc=$?" ;;
  esac
  if step ncu; then # one launch each of the lab programs built: see the table below
    secs=(--section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis
      --section MemoryWorkloadAnalysis --section SchedulerStats --section SourceCounters)
    # report, program and its arguments, kernel, launches skipped: the D = 128 forward (64-key
    # tiles), the atomic backward (v5), the Hopper forward and backward ("ncu" modes, non-causal:
    # the forward at D = 128, the backward at D = 64)
    for spec in "fwd|fwd_tiles 1|fwd_kernel|13" "bwd|bwd_tiles 1|bwd_dkv|52" "fwd90|fwd_hopper ncu|fwd90|4" \
      "bwd90|bwd_hopper ncu|bwd90|4"; do
      IFS='|' read -r r prog kernel skip <<<"$spec"
      case " $lab_programs " in *" ${prog%% *} "*) ;; *) continue ;; esac
      rm -f "/tmp/ncu_$r.ncu-rep" # ncu -o does not overwrite: no stale report
      # shellcheck disable=SC2086 # prog: the program and its arguments
      timeout "$(limit 200)" ncu --clock-control none -k "regex:$kernel" --launch-skip "$skip" -c 1 "${secs[@]}" \
        -o "/tmp/ncu_$r" "$BUILD/"$prog >/dev/null 2>&1
      echo "ncu $kernel rc=$?"
      # the report's summary, then per-instruction stall samples (SASS)
      ncu --import "/tmp/ncu_$r.ncu-rep" >>"$OUT/cuda/lab.log" 2>&1
      ncu --import "/tmp/ncu_$r.ncu-rep" --page source --csv --print-source sass >"$OUT/cuda/ncu_${r}_sass.csv" 2>&1
      echo "ncu import $r rc=$?: $OUT/cuda/ncu_${r}_sass.csv"
    done
  fi
fi

# ---- benchmarks against PyTorch -------------------------------------------------------------------
if step bench; then
  for i in $impls; do
    echo "== bench $i"
    if [ "$i" = cuda ]; then
      built "$BUILD/cuda_bench" || continue
      timeout "$(limit 240)" env PYTHONUNBUFFERED=1 python3 gpu/cuda_bench.py "$BUILD/cuda_bench" \
        "$BENCH_REPS" >"$OUT/cuda/bench.md" 2>&1
      rc=$?
      cat "$OUT/cuda/bench.md"
      echo "gpu/cuda_bench.py rc=$rc"
    else
      built "$BUILD/bench_cudnn" || continue
      timeout "$(limit 100)" "$BUILD/bench_cudnn" >"$OUT/cudnn/ours.csv" 2>"$OUT/cudnn/bench.err"
      rc_ours=$?
      timeout "$(limit 150)" python3 gpu/bench_torch.py >"$OUT/cudnn/torch.csv" 2>>"$OUT/cudnn/bench.err"
      rc_torch=$?
      python3 gpu/report.py "$OUT/cudnn/ours.csv" "$OUT/cudnn/torch.csv" >"$OUT/cudnn/results.md" 2>&1
      rc_report=$?
      { # plan build times and errors, below the table
        echo
        echo '```'
        cat "$OUT/cudnn/bench.err"
        echo '```'
      } >>"$OUT/cudnn/results.md"
      rm -f "$OUT/cudnn/bench.err"
      cat "$OUT/cudnn/results.md"
      echo "bench_cudnn rc=$rc_ours, gpu/bench_torch.py rc=$rc_torch, gpu/report.py rc=$rc_report"
    fi
  done
fi

# ---- compute-sanitizer on the quick suites --------------------------------------------------------
if step sanitize; then
  for i in $impls; do
    echo "== compute-sanitizer $i"
    built "$BUILD/tests/test_$i" || continue
    if [ "$i" = cuda ]; then tools="memcheck racecheck synccheck" quick=ATTN_CUDA_QUICK; else tools=memcheck quick=ATTN_CUDNN_QUICK; fi
    for tool in $tools; do
      t0=$SECONDS
      log="$OUT/$i/sanitizer_$tool.log"
      # test_cuda's one-call pair may plan cudnn: racecheck and synccheck report hazards inside
      # cuDNN's own kernels (nothing we could fix), so they look at libattn's kernels only
      only_ours=()
      if [ "$tool" != memcheck ]; then only_ours=(--kernel-name-exclude kns=cudnn); fi
      if [ -n "${SANITIZE_KERNELS:-}" ]; then only_ours+=(--kernel-name "kns=$SANITIZE_KERNELS"); fi
      timeout "$(limit 300)" env "$quick=1" ATTN_TEST_SEED=1 compute-sanitizer --tool "$tool" "${only_ours[@]}" \
        --error-exitcode 9 "$BUILD/tests/test_$i" >"$log" 2>&1
      rc=$?
      echo "compute-sanitizer $tool rc=$rc in $((SECONDS - t0)) s:" \
        "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1); $(grep -E ' passed, ' "$log" | tail -1)"
      grep -E "^FAIL|^FATAL|Invalid" "$log" | head -10
      if [ "$i" = cuda ] && built "$BUILD/tests/test_fp8_cuda"; then # the sm90 fp8 kernel's own test
        t0=$SECONDS
        log="$OUT/cuda/sanitizer_${tool}_fp8.log"
        timeout "$(limit 200)" env ATTN_TEST_SEED=1 compute-sanitizer --tool "$tool" --error-exitcode 9 \
          "$BUILD/tests/test_fp8_cuda" >"$log" 2>&1
        echo "compute-sanitizer $tool test_fp8_cuda rc=$? in $((SECONDS - t0)) s:" \
          "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1); $(grep -E ' passed, ' "$log" | tail -1)"
        grep -E "^FAIL|^FATAL|Invalid" "$log" | head -10
      fi
    done
  done
  for i in $impls; do # test_paged's GPU cases of each implementation (ATTN_TEST_PAGED_ONLY)
    built "$BUILD/tests/test_paged" || break
    t0=$SECONDS
    log="$OUT/$i/sanitizer_memcheck_paged.log"
    timeout "$(limit 200)" env ATTN_TEST_PAGED_ONLY="$i" ATTN_TEST_PAGED_QUICK=1 compute-sanitizer --tool memcheck --error-exitcode 9 \
      "$BUILD/tests/test_paged" >"$log" 2>&1
    echo "compute-sanitizer memcheck test_paged ($i) rc=$? in $((SECONDS - t0)) s: $(grep 'ERROR SUMMARY' "$log" | tail -1); $(tail -1 "$log")"
    grep -E "^FAIL|^FATAL|Invalid" "$log" | head -10
  done
fi
echo "== done in $SECONDS s; logs in $OUT"
