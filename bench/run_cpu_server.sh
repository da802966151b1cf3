#!/bin/sh
# bench/run_cpu_server.sh - issue 15 on a many-core server in one run (about 5 minutes on 16 cores):
# build (Release, no GPU modules), test every kernel table of the "cpu" implementation against the
# reference, then time libattn beside PyTorch's CPU SDPA (bench/run_cpu.sh) at all the machine's
# threads, the bf16 rows on AMX and on AVX512-BF16, and the scaling from 1 thread to all.
#
# usage: bench/run_cpu_server.sh [OUT_DIR] [PYTHON] [BUILD_DIR]
#   OUT_DIR    logs and tables (default $OUT, else ./cpu-server-out)
#   PYTHON     a python with torch (default python3), or "none"
#   BUILD_DIR  default build-server (configured here: Release, ATTN_WITH_CUDA=OFF, ATTN_WITH_CUDNN=OFF)
# Environment: THREADS (default: nproc), GOLDEN (the golden folder; default shared/golden or
# ../shared/golden, skipped with a line if neither exists), REPS (default 5); T_MAIN (4096) and
# T_SCALE (2048), the sequence lengths of the tables (small values make a quick trial of the script);
# PARTS (default "tests main f16 scaling config"): the parts to run, for a shorter call; MAIN_DTYPES
# ("f32 bf16") and MAIN_ISAS ("auto avx512bf16"): the main table's rows; CONFIGS ("bq64_bk256
# bq128_bk256") and CONFIG_DTYPES ("f32 bf16"): the block sizes compared at d128 (the f32 forward
# runs twice the configuration's query rows: src/impl/cpu/cpu.c's fwd_bq).
#
# Writes to OUT_DIR: machine.txt, build.log, test_compare.log, golden_<isa>.log, main.log/.csv (the
# table against PyTorch), scaling.log/.csv (1 thread and all), config.log (bq128 against the
# default), summary.txt (what is printed last: the test verdicts and the tables).
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
out=${1:-${OUT:-cpu-server-out}} python=${2:-python3} build=${3:-build-server}
threads=${THREADS:-$(nproc)} reps=${REPS:-5} t_main=${T_MAIN:-4096} t_scale=${T_SCALE:-2048}
parts=${PARTS:-tests main f16 scaling config}
want() { case " $parts " in *" $1 "*) return 0 ;; esac; return 1; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$root" || exit 1
summary=$out/summary.txt
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
start=$(date +%s)
stamp() { echo "[$(($(date +%s) - start)) s] $*"; }

# ---- the machine ----
{
  uname -a
  lscpu 2>/dev/null
  echo "cpu flags of interest:"
  grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(amx|avx512_bf16|avx512_fp16|avx512f$)' | sort | tr '\n' ' '
  echo
  [ "$python" != none ] && "$python" -c 'import torch; print("torch", torch.__version__, torch.backends.cpu.get_cpu_capability())' 2>&1
} > "$out/machine.txt" 2>&1
say "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) threads; flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(amx_bf16|amx_tile|avx512_bf16|avx512_fp16)$' | tr '\n' ' ')"

# ---- build ----
stamp "build"
if ! { cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DATTN_WITH_CUDA=OFF -DATTN_WITH_CUDNN=OFF &&
       cmake --build "$build" -j "$threads" --target test_compare test_golden cpu_bench; } > "$out/build.log" 2>&1; then
  say "BUILD FAILED (build.log):"
  tail -40 "$out/build.log"
  exit 1
fi
say "build: ok, $(grep -c 'warning:' "$out/build.log") compiler warnings (build.log); AMX compiled: $(grep -q 'ATTN_CC_HAS_AMX:INTERNAL=1' "$build/CMakeCache.txt" && echo yes || echo no)"

if want tests; then
# ---- tests: every kernel table against the f64 reference ----
# test_compare runs the cpu implementation once per table (auto, avx512, avx2, generic, and for bf16
# avx512bf16 and amx), on 1 and 2 threads; a table the machine lacks is reported as skipped.
stamp "test_compare"
timeout 300 "$build/tests/test_compare" > "$out/test_compare.log" 2>&1
rc=$?
say "test_compare: rc=$rc, $(tail -1 "$out/test_compare.log"); amx runs passed: $(grep -c '^PASS .*isa=amx.*: out' "$out/test_compare.log"), failed: $(grep -c '^FAIL .*isa=amx' "$out/test_compare.log")"
grep '^skip cpu' "$out/test_compare.log" | tee -a "$summary"
grep '^FAIL' "$out/test_compare.log" | head -20 | tee -a "$summary"

golden=${GOLDEN:-}
[ -z "$golden" ] && [ -d shared/golden ] && golden=shared/golden
[ -z "$golden" ] && [ -d ../shared/golden ] && golden=../shared/golden
if [ -n "$golden" ]; then
  for isa in auto amx avx512bf16 avx512 avx2 generic; do
    stamp "golden $isa"
    if [ "$isa" = auto ]; then force=; else force=$isa; fi
    env ${force:+ATTN_CPU_ISA=$force} timeout 120 "$build/tests/test_golden" "$golden" > "$out/golden_$isa.log" 2>&1
    say "golden ATTN_CPU_ISA=$isa: rc=$?, $(tail -1 "$out/golden_$isa.log")"
    grep '^FAIL' "$out/golden_$isa.log" | head -10 | tee -a "$summary"
  done
else
  say "golden: skipped (no shared/golden or ../shared/golden; set GOLDEN=folder)"
fi
fi

# ---- the table against PyTorch, all threads: f32 (auto) and bf16 (auto = amx, and avx512bf16) ----
rm -f "$out/main.csv" "$out/scaling.csv"
if want main; then
stamp "main table"
CSV=$out/main.csv T=$t_main DTYPES="${MAIN_DTYPES:-f32 bf16}" ISAS="${MAIN_ISAS:-auto avx512bf16}" \
  timeout 420 sh "$here/run_cpu.sh" "$build" "$python" "$threads" "$reps" 1 > "$out/main.log" 2>&1
say ""
say "## B=1 Hq=16 T=$t_main, $threads threads (speedup = torch time / libattn time; config@table)"
sed -n '/^| problem/,$p' "$out/main.log" | tee -a "$summary"
fi

if want f16; then
stamp "f16"
CSV=$out/main.csv T=$t_main DTYPES=f16 DIMS=128 CAUSALS=0 timeout 120 sh "$here/run_cpu.sh" "$build" "$python" "$threads" 3 1 > "$out/f16.log" 2>&1
sed -n '/^| problem/,$p' "$out/f16.log" | tail -n +3 | tee -a "$summary"
fi

# ---- scaling: 1 thread against all, T=2048 by default (a quarter of the work: one thread stays short) ----
if want scaling; then
stamp "scaling"
CSV=$out/scaling.csv T=$t_scale DTYPES="f32 bf16" DIMS=128 timeout 300 sh "$here/run_cpu.sh" "$build" none "1 $threads" 3 1 > "$out/scaling.log" 2>&1
say ""
say "## scaling, B=1 Hq=16 T=$t_scale d128: rate at $threads threads / ($threads x the 1-thread rate) (target >= 80%)"
awk -F, -v n="$threads" '
  $1 == "libattn" { k = $2 " " $3; sub(/@.*/, "", $3)
                    if ($4 == 1) { f1[k] = $5; b1[k] = $6 } else if ($4 == n) { fn[k] = $5; bn[k] = $6 }
                    if (!(k in seen)) { seen[k] = 1; order[m++] = k } }
  END { print "| problem | 1-thread fwd ms | fwd ms | fwd efficiency | 1-thread bwd ms | bwd ms | bwd efficiency |"
        print "|---|---|---|---|---|---|---|"
        for (i = 0; i < m; ++i) { k = order[i]
          if ((k in f1) && (k in fn))
            printf "| %s | %.1f | %.1f | %.0f%% | %.1f | %.1f | %.0f%% |\n", k, f1[k] * 1e3, fn[k] * 1e3,
                   100 * f1[k] / (n * fn[k]), b1[k] * 1e3, bn[k] * 1e3, 100 * b1[k] / (n * bn[k]) } }' \
  "$out/scaling.csv" | tee -a "$summary"
# the %peak columns scale one thread's FMA peak; what all the cores reach at once, at the clock
# they hold together
"$build/bench/cpu_bench" --peak --threads "$threads" | tee -a "$summary"
fi

# ---- configuration: block sizes at d128 (by default 128-row query blocks against 64) ----
if want config; then
stamp "config"
{
  for dt in ${CONFIG_DTYPES:-f32 bf16}; do
    for cfg in ${CONFIGS:-bq64_bk256 bq128_bk256}; do
      "$build/bench/cpu_bench" --t "$t_main" --hq 16 --d 128 --dtype "$dt" --threads "$threads" --reps 3 \
        --config "$cfg" --no-check --csv
    done
  done
} > "$out/config.log" 2>&1
say ""
say "## block sizes, d128 non-causal, $threads threads (problem, config@table, fwd s, bwd s, fwd GFLOP/s, bwd GFLOP/s)"
cut -d, -f2,3,5,6,7,8 "$out/config.log" | tee -a "$summary"
fi
stamp "done"
say "logs: $out"
