#!/bin/sh
# bench/run_dist_cpu_server.sh - issue 12's CPU target on a many-core host in one run: one sharded
# problem on RANKS MPI ranks x THREADS/RANKS threads against the same problem on 1 rank x THREADS
# threads (attn_dist_bench, forward + backward), for the sequence strategies (ring zigzag, ring
# contiguous, all-to-all) and the head split, causal and not, f32 and bf16. The target: the ranks
# reach >= 85% of the one rank's throughput.
#
# usage: bench/run_dist_cpu_server.sh [OUT_DIR] [BUILD_DIR]
#   OUT_DIR    logs and the table (default $OUT, else ./dist-cpu-out)
#   BUILD_DIR  default build-dist (configured here: Release, MPI, no GPU modules)
# Environment: MPI_PREFIX, an MPI installation (bin/mpicc, bin/mpiexec; default: the ones on
# PATH). A machine without one can use the `mpich` wheel from PyPI, which is relocatable:
# `pip install --no-deps --prefix /tmp/mpi mpich-*.whl`, then MPI_PREFIX=/tmp/mpi.
# RANKS (4), THREADS (nproc), T (8192, the sequence length), ITERS (3), DTYPES ("f32 bf16"),
# MASKS ("causal noncausal").
#
# Writes to OUT_DIR: build.log, one log per run (<dtype>_<causal>_<layout>.log) and table.md.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
out=${1:-${OUT:-dist-cpu-out}} build=${2:-build-dist}
ranks=${RANKS:-4} threads=${THREADS:-$(nproc)} t=${T:-8192} iters=${ITERS:-3}
dtypes=${DTYPES:-f32 bf16} masks=${MASKS:-causal noncausal}
mpi_bin=${MPI_PREFIX:+$MPI_PREFIX/bin/}
# Debian's pip installs a --prefix under PREFIX/local (its posix_local scheme)
if [ -n "${MPI_PREFIX:-}" ] && [ ! -x "${mpi_bin}mpiexec" ] && [ -x "$MPI_PREFIX/local/bin/mpiexec" ]; then
  mpi_bin=$MPI_PREFIX/local/bin/
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$root" || exit 1

# CMake keeps the MPI it found first: a build folder configured against another MPI (the host's
# own, say) would give ranks that the launcher here starts as singletons of one rank each.
mpicc=$(command -v "${mpi_bin}mpicc")
if [ -f "$build/CMakeCache.txt" ] && ! grep -q "^MPI_C_COMPILER:[A-Z]*=$mpicc\$" "$build/CMakeCache.txt"; then
  echo "$build was configured against another MPI: configuring it again for $mpicc"
  rm -rf "$build"
fi
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DATTN_WITH_CUDA=OFF -DATTN_WITH_CUDNN=OFF \
  -DATTN_WITH_MPI=ON -DMPI_C_COMPILER="$mpicc" >"$out/build.log" 2>&1 &&
  cmake --build "$build" -j"$threads" >>"$out/build.log" 2>&1 || {
  tail -20 "$out/build.log"
  exit 1
}
bench=$build/bench/attn_dist_bench
[ -f "$build/libattn_mpi.so" ] || {
  echo "no MPI transport module was built (see $out/build.log)"
  exit 1
}

# Each rank's threads on cores of their own: MPICH's launcher (Hydra) and Open MPI spell it
# differently.
per_rank=$((threads / ranks))
if "${mpi_bin}mpiexec" --version 2>&1 | grep -q -i hydra; then
  bind_one="-bind-to core:$threads" bind_ranks="-bind-to core:$per_rank"
else
  bind_one="--bind-to core --map-by slot:PE=$threads" bind_ranks="--bind-to core --map-by slot:PE=$per_rank"
fi

rate() { # the GFLOP/s of rank 0's summary line
  sed -n 's/.* \([0-9.]*\) GFLOP\/s.*/\1/p' "$1" | tail -1
}
hidden() { sed -n 's/.*hidden \([0-9]*%\).*/\1/p' "$1" | tail -1; }

{
  echo "$(nproc) cores; $ranks ranks x $per_rank threads against 1 rank x $threads threads;" \
    "b1 hq32 hkv8 sq$t d128, forward + backward, median of $iters"
  echo
  echo "| dtype | mask | sharding | 1 rank GFLOP/s | $ranks ranks GFLOP/s | ratio | hidden |"
  echo "|---|---|---|---|---|---|---|"
} >"$out/table.md"
for dtype in $dtypes; do
  for causal in $masks; do
    problem="b1 hq32 hkv8 sq$t d128 $dtype"
    [ "$causal" = causal ] && problem="$problem causal"
    one="$out/${dtype}_${causal}_one.log"
    # shellcheck disable=SC2086 # the binding options are words
    OMP_NUM_THREADS=$threads "${mpi_bin}mpiexec" -n 1 $bind_one "$bench" "$problem" --mesh seq:1 \
      --threads "$threads" --iters "$iters" >"$one" 2>&1
    for sharding in "ring zigzag:--mesh seq:$ranks --layout zigzag" \
      "ring contiguous:--mesh seq:$ranks --layout contiguous" \
      "all-to-all:--mesh seq:$ranks --strategy alltoall" "heads:--mesh heads:$ranks"; do
      name=${sharding%%:*} args=${sharding#*:}
      log="$out/${dtype}_${causal}_$(echo "$name" | tr ' -' '__').log"
      # shellcheck disable=SC2086
      OMP_NUM_THREADS=$per_rank "${mpi_bin}mpiexec" -n "$ranks" $bind_ranks "$bench" "$problem" \
        $args --threads "$per_rank" --iters "$iters" >"$log" 2>&1
      r1=$(rate "$one") rn=$(rate "$log")
      ratio=$(awk -v a="$rn" -v b="$r1" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", a / b; else print "-" }')
      echo "| $dtype | $causal | $name | ${r1:--} | ${rn:--} | $ratio | $(hidden "$log") |" >>"$out/table.md"
    done
  done
done
cat "$out/table.md"
