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
set -eu
build=$1 python=$2 threads=${3:-1 2} reps=${4:-5} rounds=${5:-1}
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp)
trap 'rm -f "$out"' EXIT

round=0
while [ "$round" -lt "$rounds" ]; do
round=$((round + 1))
for dtype in f32 bf16; do
  for d in 128 64; do
    for causal in 0 1; do
      for th in $threads; do
        "$build/bench/cpu_bench" --t 4096 --hq 16 --d "$d" --causal "$causal" --dtype "$dtype" \
          --threads "$th" --reps "$reps" --csv | tee -a "$out"
        if [ "$python" != none ]; then
          "$python" "$here/torch_sdpa.py" --t 4096 --hq 16 --d "$d" --causal "$causal" \
            --dtype "$dtype" --threads "$th" --reps "$reps" | tee -a "$out"
        fi
      done
    done
  done
done
done

# The table: one line per problem and thread count.
echo
awk -F, '
  $1 == "libattn" { key = $2 "|" $4; cfg[key] = $3
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
      k = order[i]; split(k, parts, "|")
      tfs = (k in tf) ? sprintf("%.1f", tf[k] * 1e3) : "-"
      tbs = (k in tb) ? sprintf("%.1f", tb[k] * 1e3) : "-"
      rf = (k in tf) ? sprintf("%.2fx", tf[k] / lf[k]) : "-"
      rb = (k in tb) ? sprintf("%.2fx", tb[k] / lb[k]) : "-"
      printf "| %s | %s | %s | %.1f | %.1f | %.1f%% | %.1f | %.1f | %.1f%% | %s | %s | %s | %s |\n",
        parts[1], parts[2], cfg[k], lf[k] * 1e3, gf[k], pf[k] * 100, lb[k] * 1e3, gb[k], pb[k] * 100,
        tfs, tbs, rf, rb
    }
  }' "$out"
