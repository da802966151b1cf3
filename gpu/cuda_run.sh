#!/bin/bash
# gpu/cuda_run.sh - on a machine with an NVIDIA GPU, in one invocation: build libattn with its CUDA
# implementation, run the GPU test (grid against the reference, golden cases), compute-sanitizer
# (memcheck and racecheck) on the quick suite, and the benchmark against PyTorch's SDPA backends.
#
# usage: [LAB=1 [NCU=1]] [SKIP_SANITIZER=1] [SKIP_BENCH=1] gpu/cuda_run.sh [source folder] [golden folder]
#   source: the tree to build (default: this checkout); golden: the golden cases (default
#   ../shared/golden, else .golden). Logs go to $OUT (default /tmp/cuda_out); the last lines
#   printed are the summary and the benchmark table.
set -o pipefail
SRC=${1:-.}
GOLDEN=${2:-}
[ -z "$GOLDEN" ] && { [ -d ../shared/golden ] && GOLDEN=$(cd ../shared/golden && pwd) || GOLDEN=$PWD/.golden; }
OUT=${OUT:-/tmp/cuda_out}
mkdir -p "$OUT"
BUILD=$PWD/build-gpu
CUDA=$(dirname "$(dirname "$(command -v nvcc)")")
nvidia-smi -L | tee "$OUT/env.txt"
nvcc --version | tail -1 | tee -a "$OUT/env.txt"

t0=$(date +%s)
if [ "${LAB:-0}" = 1 ]; then # dev/cuda kernel lab, built beside the library
  nvcc -std=c++17 -O3 -I"$SRC/include" -I"$SRC/src" -gencode=arch=compute_90,code=sm_90 \
    "$SRC/dev/cuda/fwd_tiles.cu" -o "$BUILD-lab" >"$OUT/lab_build.log" 2>&1 &
  nvcc -std=c++17 -O3 -I"$SRC/include" -I"$SRC/src" -gencode=arch=compute_90,code=sm_90 \
    "$SRC/dev/cuda/bwd_tiles.cu" -o "$BUILD-labb" >>"$OUT/lab_build.log" 2>&1 &
fi
cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DATTN_WITH_CUDA=ON -DATTN_WITH_CUDNN=OFF \
  -DATTN_BUILD_EXAMPLES=OFF -DATTN_BUILD_BENCH=OFF >"$OUT/build.log" 2>&1 &&
  cmake --build "$BUILD" -j16 --target test_cuda >>"$OUT/build.log" 2>&1 ||
  { tail -40 "$OUT/build.log"; exit 1; }
gcc -O2 -std=c11 -I"$SRC/include" -I"$CUDA/include" "$SRC/gpu/cuda_bench.c" "$BUILD/libattn.a" \
  -L"$CUDA/lib64" -lcudart -lgomp -lm -o "$BUILD/cuda_bench" >>"$OUT/build.log" 2>&1 ||
  { tail -20 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s; spills: $(grep -c 'spilled' "$OUT/build.log")"

t0=$(date +%s)
"$BUILD/tests/test_cuda" "$GOLDEN" >"$OUT/test.log" 2>&1
echo "test_cuda rc=$? in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/test.log")"
grep -E "^FAIL" "$OUT/test.log" | head -40

if [ "${LAB:-0}" = 1 ]; then
  wait
  "$BUILD-lab" 2>&1 | tee "$OUT/lab.log"
  "$BUILD-labb" 2>&1 | tee -a "$OUT/lab.log"
  if [ "${NCU:-0}" = 1 ]; then # D = 128 forward (64-key tiles) and atomic backward (v5), one launch each
    secs="--section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SourceCounters"
    ncu --clock-control none -k regex:fwd_kernel --launch-skip 13 -c 1 $secs -o /tmp/ncu_fwd "$BUILD-lab" 1 >/dev/null 2>&1
    ncu --clock-control none -k regex:bwd_dkv --launch-skip 52 -c 1 $secs -o /tmp/ncu_bwd "$BUILD-labb" 1 >/dev/null 2>&1
    echo "ncu rc=$?"
    for r in fwd bwd; do # the report's summary, then per-instruction stall samples (SASS)
      ncu --import "/tmp/ncu_$r.ncu-rep" >>"$OUT/lab.log" 2>&1
      ncu --import "/tmp/ncu_$r.ncu-rep" --page source --csv --print-source sass >"$OUT/ncu_${r}_sass.csv" 2>&1
    done
  fi
fi

if [ "${SKIP_BENCH:-0}" != 1 ]; then
  PYTHONUNBUFFERED=1 python3 "$SRC/gpu/cuda_bench.py" "$BUILD/cuda_bench" "${BENCH_REPS:-20}" 2>&1 | tee "$OUT/bench.md"
fi

if [ "${SKIP_SANITIZER:-0}" != 1 ]; then
  t0=$(date +%s)
  for tool in memcheck racecheck; do
    ATTN_CUDA_QUICK=1 ATTN_TEST_SEED=1 timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 \
      "$BUILD/tests/test_cuda" >"$OUT/sanitizer_$tool.log" 2>&1
    echo "compute-sanitizer $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_$tool.log" | tail -1)"
  done
  echo "sanitizer: $(( $(date +%s) - t0 )) s"
fi
