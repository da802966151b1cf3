#!/bin/bash
# bench/decode_cpu_grid.sh - issue 14's CPU decode table: `attn bench --platform cpu` over the
# decode grid (Hq = 32, Hkv = 8, D = 128), every problem checked against the f64 reference first,
# in ONE attn process, so that the memory read rate behind %bw is measured once for the whole table.
#
# usage: bench/decode_cpu_grid.sh ATTN [DTYPES]
#   ATTN    the attn tool of a build (build/tools/attn)
#   DTYPES  default "bf16 f16 f32"
# The problems, per dtype: Tq = 1, B in {1, 16, 64}, Tk in {4096, 32768}, dense and paged 16; for
# bf16 sinks + soft cap 30 + a 4k window and a causal 4k window over 8k keys; Tq = 4 causal,
# B = 16, Tk = 4096, paged 16.
# Environment: MATCH, a grep -E pattern: only the problems it matches; REPS (10), timed runs;
# CONFIG (bq64_bk128): every cpu configuration runs the same decode path on these problems, so one
# is timed; THREADS, the threads (default: the implementation's choice, every CPU).
# Prints attn bench's CSV as it goes (a run cut short keeps its rows), then the table in markdown:
# problem, K+V GB/s (median), % of the read rate, and the read rate itself.
set -u -o pipefail
ATTN=${1:?usage: bench/decode_cpu_grid.sh ATTN [DTYPES]}
DTYPES=${2:-bf16 f16 f32}
problems=()
for dt in $DTYPES; do
  for tk in 4096 32768; do
    for b in 1 16 64; do
      problems+=("b$b hq32 hkv8 sq1 sk$tk d128 $dt" "b$b hq32 hkv8 sq1 sk$tk d128 $dt paged=16")
    done
  done
  if [ "$dt" = bf16 ]; then
    problems+=("b16 hq32 hkv8 sq1 sk4096 d128 bf16 paged=16 sinks=1 softcap=30 window=4096,0"
      "b16 hq32 hkv8 sq1 sk8192 d128 bf16 causal window=4096,0 paged=16")
  fi
  problems+=("b16 hq32 hkv8 sq4 sk4096 d128 $dt causal paged=16")
done
if [ -n "${MATCH:-}" ]; then
  kept=()
  for p in "${problems[@]}"; do if echo "$p" | grep -Eq "$MATCH"; then kept+=("$p"); fi; done
  problems=("${kept[@]}")
fi
threads=()
[ -n "${THREADS:-}" ] && threads=(--threads "$THREADS")
csv=$(mktemp)
trap 'rm -f "$csv"' EXIT
stdbuf -oL "$ATTN" bench --platform cpu --config "${CONFIG:-bq64_bk128}" --reps "${REPS:-10}" \
  "${threads[@]}" --csv "${problems[@]}" | tee "$csv"
rc=$?
echo
echo "| problem | K+V GB/s | of the read rate |"
echo "|---|---|---|"
# CSV columns: problem,impl,config,check,...,kv_gbps (14),bw_fraction (15); the problem is quoted
awk -F'"' 'NR > 1 && NF >= 3 {
  n = split($3, f, ","); gb = f[n - 1]; bw = f[n]
  if (f[4] != "ok") { printf "| %s | %s | |\n", $2, f[4]; next }
  printf "| %s | %.1f | %.0f%% |\n", $2, gb, 100 * bw
  if (bw > 0) rate = gb / bw
} END { if (rate > 0) printf "\nread rate (STREAM-style, every thread): %.1f GB/s\n", rate }' "$csv"
exit $rc
