#!/bin/sh
# dev/cpu/ring_balance_device.sh - issue 12's causal rings on the 16-core host in one device call:
# the host's topology and each rank's cores, the causal half of bench/run_dist_cpu_server.sh's
# table under MPICH's defaults and again with its single-copy (CMA) transfers for large messages,
# and dev/cpu/ring_balance_bench.c (every rank's zigzag blocks in one process on 4 threads, beside
# the whole problem on 4 and on 16 threads).
#
# usage (from the tree's root, the mpich wheel beside it): dev/cpu/ring_balance_device.sh OUT [WHEEL]
# Environment: MPI_PREFIX (an MPI already installed: the wheel is not), BUILD (default /tmp/build-ringbal), ITERS (3), T (8192), REPS (3, the in-process
# bench), PARTS ("default cma inproc").
set -u
out=${1:?usage: ring_balance_device.sh OUT [WHEEL]}
wheel=${2:-}
if [ -z "$wheel" ]; then
  for w in ../wheels/mpich-*.whl; do [ -f "$w" ] && wheel=$w; done
fi
build=${BUILD:-/tmp/build-ringbal} parts=${PARTS:-default cma inproc} reps=${REPS:-3}
threads=${THREADS:-$(nproc)}
per_rank=$((threads / ${RANKS:-4}))
mkdir -p "$out"
out=$(cd "$out" && pwd)

lscpu >"$out/lscpu.txt" 2>&1
grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket|NUMA node|L1d|L2|L3)' "$out/lscpu.txt"
if [ -z "${MPI_PREFIX:-}" ] && [ -n "$wheel" ]; then
  pip install -q --no-deps --no-index --prefix /tmp/mpi "$wheel" >/dev/null 2>&1 || echo "pip failed"
  export MPI_PREFIX=/tmp/mpi
fi
mpi_bin=${MPI_PREFIX:+$MPI_PREFIX/bin/}
[ -n "${MPI_PREFIX:-}" ] && [ ! -x "${mpi_bin}mpiexec" ] && mpi_bin=$MPI_PREFIX/local/bin/
echo "each rank's cores (-bind-to core:$per_rank):"
"${mpi_bin}mpiexec" -n "${RANKS:-4}" -bind-to "core:$per_rank" grep Cpus_allowed_list /proc/self/status

# The default MPICH settings, then single-copy transfers: CMA (process_vm_readv) for every size,
# which one MPI_Test call completes; MPICH's default moves a large message through shared-memory
# cells a few per call, so a transfer barely moves during a block.
for part in $parts; do
  case $part in
  default)
    MASKS=causal bench/run_dist_cpu_server.sh "$out/default" "$build" >"$out/default.txt" 2>&1
    cat "$out/default.txt"
    ;;
  cma)
    MPIR_CVAR_CH4_CMA_ENABLE=1 MPIR_CVAR_CH4_IPC_CMA_P2P_THRESHOLD=0 MASKS=causal \
      bench/run_dist_cpu_server.sh "$out/cma" "$build" >"$out/cma.txt" 2>&1
    cat "$out/cma.txt"
    ;;
  inproc)
    [ -f "$build/libattn.a" ] || cmake --build "$build" -j"$threads" --target attn_static >/dev/null
    gcc -O2 -std=c11 -Iinclude -Isrc dev/cpu/ring_balance_bench.c "$build/libattn.a" -lm -fopenmp \
      -o /tmp/ring_balance_bench || continue
    for dtype in bf16 f32; do
      OMP_PROC_BIND=false timeout 100 /tmp/ring_balance_bench "${RANKS:-4}" $((${T:-8192} / 8)) \
        "$dtype" "$reps" "$per_rank" 32 8 causal "$threads" | tee -a "$out/inproc.txt"
    done
    ;;
  esac
done
for part in default cma; do
  [ -d "$out/$part" ] || continue
  echo "== $part: every rank of the sequence rows"
  grep -H '^rank' "$out/$part"/*_causal_ring_zigzag.log "$out/$part"/*_causal_all_to_all.log \
    "$out/$part"/*_causal_heads.log | sed 's/per forward+backward, //'
done
parts_done=""
for part in default cma; do [ -d "$out/$part" ] && parts_done="$parts_done $part"; done
# shellcheck disable=SC2086 # the folders are words
[ -n "$parts_done" ] && tar czf "$out/logs.tgz" -C "$out" $parts_done
rm -rf "$out/default" "$out/cma"
