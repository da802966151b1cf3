#!/bin/bash
# gpu/run.sh - the whole GPU check of the cudnn implementation in one invocation, for a lent GPU
# machine (or any Linux box with an NVIDIA GPU, CUDA, cuDNN and PyTorch):
#   1. builds libattn with cuDNN (Release) in build-gpu/, using the cuDNN that PyTorch loads when
#      it has one (so both sides of the benchmark run the same cuDNN), else the toolkit's;
#   2. runs tests/test_cudnn against the reference, with the golden cases of $GOLDEN (default
#      .golden, a copy of ../shared/golden made before the run);
#   3. benchmarks libattn's cudnn against PyTorch's cuDNN and flash SDPA backends (gpu/bench_*);
#   4. runs a quick test_cudnn under compute-sanitizer (memcheck).
# Logs go to $OUT (default gpu-out/): env.txt build.log test.log cudnn.log ours.csv torch.csv
# results.md sanitizer.log. Steps can be chosen: gpu/run.sh [build] [test] [bench] [sanitize].
# While others edit the same checkout, run it on a snapshot of the commit under test (an ignored
# folder made with `git archive HEAD | tar -x -C .cudnn-src`), with GOLDEN pointing at the cases.
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
GOLDEN=${GOLDEN:-$PWD/.golden}
steps=${*:-build test bench sanitize}
has() { case " $steps " in *" $1 "*) return 0 ;; esac; return 1; }

# ---- environment: which cuDNN --------------------------------------------------------------------
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>&1
  nvcc --version 2>&1 | tail -1
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())' 2>&1
} >"$OUT/env.txt"
CUDNN_DIR=$(python3 - <<'EOF' 2>/dev/null
import glob, os, site
for base in site.getsitepackages():
    for h in glob.glob(os.path.join(base, "nvidia", "**", "cudnn_backend.h"), recursive=True):
        print(os.path.dirname(os.path.dirname(h)))
        raise SystemExit
EOF
)
if [ -z "$CUDNN_DIR" ]; then
  h=$(ls /usr/local/cuda/include/cudnn_backend.h /usr/include/cudnn_backend.h 2>/dev/null | head -1)
  CUDNN_DIR=$(dirname "$(dirname "$h")")
fi
CUDNN_LIB=$(ls "$CUDNN_DIR"/lib/libcudnn.so.9 "$CUDNN_DIR"/lib/libcudnn.so "$CUDNN_DIR"/lib64/libcudnn.so \
  /usr/local/cuda/lib64/libcudnn.so /usr/lib/x86_64-linux-gnu/libcudnn.so 2>/dev/null | head -1)
CUDNN_LIBDIR=$(dirname "$CUDNN_LIB")
export LD_LIBRARY_PATH="$CUDNN_LIBDIR:${LD_LIBRARY_PATH:-}"
echo "cudnn headers: $CUDNN_DIR/include, library: $CUDNN_LIB" | tee -a "$OUT/env.txt"
grep -h "define CUDNN_MAJOR\|define CUDNN_MINOR\|define CUDNN_PATCHLEVEL" "$CUDNN_DIR"/include/cudnn_version*.h >>"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# ---- build ----------------------------------------------------------------------------------------
if has build; then
  echo "== build"
  (timeout 200 cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DATTN_WITH_CUDNN=ON \
      -DATTN_CUDNN_INCLUDE_DIR="$CUDNN_DIR/include" -DATTN_CUDNN_LIBRARY="$CUDNN_LIB" \
      -DATTN_BUILD_EXAMPLES=OFF -DATTN_BUILD_BENCH=OFF &&
    timeout 200 cmake --build build-gpu -j16 --target test_cudnn attn_static) >"$OUT/build.log" 2>&1
  rc=$?
  grep -E "libattn|warning|error" "$OUT/build.log" | head -30
  if [ $rc -ne 0 ]; then tail -40 "$OUT/build.log"; echo "BUILD FAILED ($rc)"; exit 1; fi
  CUDART=$(grep -h "^CUDA_cudart_LIBRARY:" build-gpu/CMakeCache.txt | cut -d= -f2)
  gcc -O2 -std=c11 -Iinclude -I/usr/local/cuda/include gpu/bench_cudnn.c build-gpu/libattn.a \
    "$CUDNN_LIB" "$CUDART" -fopenmp -lm -lpthread -Wl,-rpath,"$CUDNN_LIBDIR" -o build-gpu/bench_cudnn \
    >>"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; echo "BENCH BUILD FAILED"; }
fi

# ---- correctness ----------------------------------------------------------------------------------
if has test; then
  echo "== test_cudnn"
  CUDNN_LOGLEVEL_DBG=1 CUDNN_LOGDEST_DBG="$OUT/cudnn.log" timeout 200 build-gpu/tests/test_cudnn "$GOLDEN" \
    >"$OUT/test.log" 2>&1
  echo "test_cudnn exit code $?"
  grep -E "^FAIL|FATAL|passed, " "$OUT/test.log" | head -60
fi

# ---- benchmark ------------------------------------------------------------------------------------
if has bench; then
  echo "== bench"
  timeout 100 build-gpu/bench_cudnn >"$OUT/ours.csv" 2>"$OUT/results.md.err"
  timeout 150 python3 gpu/bench_torch.py >"$OUT/torch.csv" 2>>"$OUT/results.md.err"
  {
    python3 gpu/report.py "$OUT/ours.csv" "$OUT/torch.csv"
    echo
    echo '```'
    cat "$OUT/results.md.err"
    echo '```'
  } >"$OUT/results.md"
  rm -f "$OUT/results.md.err"
  cat "$OUT/results.md"
fi

# ---- compute-sanitizer ------------------------------------------------------------------------------
if has sanitize; then
  echo "== compute-sanitizer (memcheck, quick grid)"
  ATTN_CUDNN_QUICK=1 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 \
    build-gpu/tests/test_cudnn >"$OUT/sanitizer.log" 2>&1
  echo "compute-sanitizer exit code $?"
  grep -E "ERROR SUMMARY|passed, |^FAIL|Invalid" "$OUT/sanitizer.log" | head -20
fi
