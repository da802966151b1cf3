#!/bin/bash
# gpu/dist.sh - the distributed layer (issue 12) on a lent machine with 2 GPUs (nvidia-h200-x2):
# the NCCL test, compute-sanitizer on it, and the CPU host's MPI benchmark when mpiexec is there.
#
# usage: gpu/dist.sh [build] [test] [sanitize] [cpubench]      (none named: all, in this order)
#   build     build-dist-gpu/ (Release, -j16): libattn with the cuda implementation, the NCCL
#             transport module libattn_nccl.so and tests/nccl/test_dist_nccl (plus the MPI module
#             and attn_dist_bench when MPI is installed)
#   test      test_dist_nccl: batch and head splits of CUDA tensors over NCCL on 2 GPUs, one thread
#             per GPU, against the single-GPU result; the agreement check; the refusal of a split
#             sequence of CUDA tensors
#   sanitize  compute-sanitizer --tool memcheck on test_dist_nccl
#   cpubench  on the host CPUs, 1 rank x 16 threads against 4 ranks x 4 threads (ring, zigzag) on
#             one causal problem (the issue's target: >= 85%); skipped without mpiexec
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0; the machine's notes ask for it). Logs in $OUT
# (default /tmp/dist_out); stdout is a summary in which every step ends in "rc=N". Each step has a
# time limit; all of them stay under 9 minutes.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/dist_out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
BUILD=build-dist-gpu
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(build test sanitize cpubench)
want() { local s; for s in "${steps[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

if want build; then
  mpi=OFF
  command -v mpicc >/dev/null 2>&1 && mpi=ON
  timeout 420 bash -c "cmake -S . -B $BUILD -DCMAKE_BUILD_TYPE=Release -DATTN_WITH_CUDA=ON \
      -DATTN_WITH_CUDNN=OFF -DATTN_WITH_NCCL=ON -DATTN_WITH_MPI=$mpi -DATTN_BUILD_EXAMPLES=OFF &&
    cmake --build $BUILD -j16 --target test_dist_nccl attn_nccl \
      $([ $mpi = ON ] && echo attn_mpi attn_dist_bench)" > "$OUT/build.log" 2>&1
  echo "build (MPI $mpi): rc=$?"
fi
if want test; then
  ATTN_MODULE_PATH=$PWD/$BUILD timeout 120 "$BUILD/tests/test_dist_nccl" > "$OUT/test.log" 2>&1
  rc=$?
  echo "test_dist_nccl: $(tail -1 "$OUT/test.log") rc=$rc"
fi
if want sanitize; then
  ATTN_MODULE_PATH=$PWD/$BUILD timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$BUILD/tests/test_dist_nccl" > "$OUT/sanitizer_memcheck.log" 2>&1
  rc=$?
  echo "compute-sanitizer memcheck: $(grep -m1 'ERROR SUMMARY' "$OUT/sanitizer_memcheck.log") rc=$rc"
fi
if want cpubench; then
  if [ -x "$BUILD/bench/attn_dist_bench" ] && command -v mpiexec >/dev/null 2>&1; then
    P="b1 hq32 hkv8 sq8192 d128 causal"
    flags=(--allow-run-as-root --oversubscribe --bind-to none)
    timeout 150 mpiexec "${flags[@]}" -n 1 "$BUILD/bench/attn_dist_bench" "$P" --mesh seq:1 \
      --threads 16 --iters 3 > "$OUT/cpubench_1x16.log" 2>&1
    rc=$?
    echo "1 rank x 16 threads: $(tail -1 "$OUT/cpubench_1x16.log") rc=$rc"
    timeout 150 mpiexec "${flags[@]}" -n 4 "$BUILD/bench/attn_dist_bench" "$P" --mesh seq:4 \
      --layout zigzag --threads 4 --iters 3 > "$OUT/cpubench_4x4.log" 2>&1
    rc=$?
    echo "4 ranks x 4 threads: $(grep -v '^rank' "$OUT/cpubench_4x4.log" | tail -1) rc=$rc"
  else
    echo "cpubench: no mpiexec or attn_dist_bench here: skipped rc=0"
  fi
fi
