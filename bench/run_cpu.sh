#!/bin/sh
# bench/run_cpu.sh - the table of bench/RESULTS.md: libattn's "cpu" implementation (bench/cpu_bench)
# and PyTorch's CPU scaled_dot_product_attention (bench/torch_sdpa.py) on the same shapes and
# thread counts, in one run, then their ratio.
#
# usage: bench/run_cpu.sh BUILD_DIR PYTHON [THREADS] [REPS] [ROUNDS]
#   BUILD_DIR  a Release build (cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build)
#   PYTHON     a python with torch (python3 -m venv venv && venv/bin/pip install torch), or "none"
#   THREADS    thread counts, default "1 2"; REPS timed runs per point, default 5
#   ROUNDS     times the whole table is measured, default 1; the table keeps each point's best
#              median (for each program alike), which filters out other processes on a shared machine
# Problems: B=1, Hq=16, T=4096, D in {128, 64}, causal in {0, 1}, f32 and bf16 (the issue's targets).
# Each cpu_bench row is checked against the f64 reference (at T=256) before it is timed.
# Environment (optional): DTYPES (default "f32 bf16"), DIMS ("128 64"), CAUSALS ("0 1"), T (4096),
#   HQ (16); ISAS ("auto"): kernel tables to time libattn with (ATTN_CPU_ISA), each a row of its own
#   ("auto" = what cpuid picks; avx512bf16 and amx only for bf16 problems); CONFIG: a cpu_bench
#   --config for every libattn row; CSV: a file that keeps every raw row. The config column says
#   which kernel table ran (config@table).
set -eu
build=$1 python=$2 threads=${3:-1 2} reps=${4:-5} rounds=${5:-1}
here=$(cd "$(dirname "$0")" && pwd)
dtypes=${DTYPES:-f32 bf16} dims=${DIMS:-128 64} causals=${CAUSALS:-0 1} t=${T:-4096} hq=${HQ:-16}
isas=${ISAS:-auto}
out=$(mktemp)
trap 'rm -f "$out"' EXIT

round=0
while [ "$round" -lt "$rounds" ]; do
round=$((round + 1))
for dtype in $dtypes; do
  for d in $dims; do
    for causal in $causals; do
      for th in $threads; do
        for isa in $isas; do
          case $isa in avx512bf16|amx) [ "$dtype" = bf16 ] || continue ;; esac
          if [ "$isa" = auto ]; then force=; else force=$isa; fi
          env ${force:+ATTN_CPU_ISA=$force} "$build/bench/cpu_bench" --t "$t" --hq "$hq" \
            --d "$d" --causal "$causal" --dtype "$dtype" --threads "$th" --reps "$reps" \
            ${CONFIG:+--config "$CONFIG"} --csv | tee -a "$out"
        done
        if [ "$python" != none ]; then
          "$python" "$here/torch_sdpa.py" --t "$t" --hq "$hq" --d "$d" --causal "$causal" \
            --dtype "$dtype" --threads "$th" --reps "$reps" | tee -a "$out"
        fi
      done
    done
  done
done
done
if [ -n "${CSV:-}" ]; then cat "$out" >> "$CSV"; fi

# The table: one line per problem and thread count.
echo
awk -F, '
  $1 == "libattn" { isa = $3; sub(/^[^@]*@?/, "", isa); key = $2 "|" $4 "|" isa; cfg[key] = $3
                    if (!(key in lf)) order[n++] = key
                    if (!(key in lf) || $5 < lf[key]) { lf[key] = $5; gf[key] = $7; pf[key] = $9 }
                    if (!(key in lb) || $6 < lb[key]) { lb[key] = $6; gb[key] = $8; pb[key] = $10 } }
  $1 == "torch"   { key = $2 "|" $3
                    if (!(key in tf) || $4 < tf[key]) tf[key] = $4
                    if (!(key in tb) || $5 < tb[key]) tb[key] = $5 }
  END {
    printf "| problem | threads | config | fwd ms | fwd GFLOP/s | fwd %%peak | bwd ms | bwd GFLOP/s | bwd %%peak | torch fwd ms | torch bwd ms | fwd speedup | bwd speedup |\n"
    printf "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    for (i = 0; i < n; ++i) {
      split(order[i], parts, "|"); k = parts[1] "|" parts[2]; lk = order[i]
      tfs = (k in tf) ? sprintf("%.1f", tf[k] * 1e3) : "-"
      tbs = (k in tb) ? sprintf("%.1f", tb[k] * 1e3) : "-"
      rf = (k in tf) ? sprintf("%.2fx", tf[k] / lf[lk]) : "-"
      rb = (k in tb) ? sprintf("%.2fx", tb[k] / lb[lk]) : "-"
      printf "| %s | %s | %s | %.1f | %.1f | %.1f%% | %.1f | %.1f | %.1f%% | %s | %s | %s | %s |\n",
        parts[1], parts[2], cfg[lk], lf[lk] * 1e3, gf[lk], pf[lk] * 100, lb[lk] * 1e3, gb[lk],
        pb[lk] * 100, tfs, tbs, rf, rb
    }
  }' "$out"
