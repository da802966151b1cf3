#!/bin/sh
# tests/test_cli.sh - the attn command end to end on the CPU: every subcommand, --help, the output
# formats, and the exit codes scripts rely on (0 ok, 1 check failure, 2 usage, 3 library error).
# Run by CTest as `test_cli.sh path/to/attn`; uses a private cache file.
set -u
ATTN=${1:?usage: test_cli.sh path/to/attn}
. "$(dirname "$0")/cli_lib.sh"

P1="b1 hq2 hkv1 sq9 sk11 d8 f32 causal"
P2="b2 hq2 sq5 d4 bf16 softcap=5 sinks=1"

expect 0 "attn --help" "$ATTN" --help
has "^usage: attn <command>" "the main help names the usage"
for cmd in info bench tune check; do
  expect 0 "attn $cmd --help" "$ATTN" "$cmd" --help
  has "^usage: attn $cmd" "attn $cmd --help describes $cmd"
done
expect 2 "no command is a usage error" "$ATTN"
expect 2 "an unknown command is a usage error" "$ATTN" frobnicate
expect 2 "an unknown option is a usage error" "$ATTN" bench --frob "$P1"
expect 2 "check without a problem is a usage error" "$ATTN" check
expect 2 "an unreadable problem string is a usage error" "$ATTN" check "b1 hq2 sq4 d8 wat"
has "wat" "the message names the bad token" "$DIR/err"
expect 2 "an invalid problem is a usage error" "$ATTN" check "b1 hq3 hkv2 sq4 d8"
has "heads_q=3 is not a multiple of heads_kv=2" "the message states the rule" "$DIR/err"
expect 3 "a problem no implementation can run is a library error" "$ATTN" bench --impl ref "b1 hq2 sq4 d8 device=cuda"
has "cuda" "the message names the device" "$DIR/err"
grep -Eq "device [0-9]|\.(c|cu|cuh):[0-9]" "$DIR/err" && bad "device numbers or source paths in: $(cat "$DIR/err")" || ok "no device numbers or source paths"
if "$ATTN" info | grep -q "^gpus: none usable"; then
  expect 3 "tune refuses a GPU problem on a machine without a GPU" "$ATTN" tune "b1 hq2 sq4 d8 device=cuda"
  has "cuda" "the message names the device" "$DIR/err"
  grep -Eq "device [0-9]|\.(c|cu|cuh):[0-9]" "$DIR/err" && bad "tune: device numbers or source paths in: $(cat "$DIR/err")" || ok "tune: no device numbers or source paths"
fi

# Every numeric option names itself and its rule (issue 11), and is a usage error.
for case in "bench --reps abc:--reps: abc is not a whole number >= 1" \
            "bench --reps 0:--reps: 0 is not a whole number >= 1" \
            "bench --threads -3:--threads: -3 is not a whole number >= 0" \
            "bench --warmup -1:--warmup: -1 is not a whole number >= 0" \
            "tune --iters 0:--iters: 0 is not a whole number >= 1" \
            "bench --reps 99999999999:--reps: 99999999999 is not a whole number <= 2147483647" \
            "bench --seed -1:--seed: -1 is not a whole number from 0" \
            "check --seed 1x:--seed: 1x is not a whole number from 0" \
            "bench --min-time abc:--min-time: abc is not a number of seconds >= 0" \
            "tune --max-seconds -1:--max-seconds: -1 is not a number of seconds >= 0"; do
  args=${case%%:*}; message=${case#*:}
  # shellcheck disable=SC2086 # the command and option are meant to split
  expect 2 "attn $args is a usage error" "$ATTN" $args "$P1"
  has "^attn: $message" "attn $args names the option and its rule" "$DIR/err"
done
expect 2 "an unknown --impl is a usage error" "$ATTN" bench --impl nope "$P1"
has "--impl nope: no implementation has that name \(available here: .*ref" "the message lists the known names" "$DIR/err"
[ ! -s "$DIR/out" ] && ok "nothing measured or printed for an unknown --impl" || bad "an unknown --impl printed: $(cat "$DIR/out")"

# Problem strings: each key's form, duplicate fields, and nan/inf left to validation's rule.
expect 2 "window=5 is a usage error" "$ATTN" check "b1 hq2 sq4 d8 window=5"
has "window=5.*expected window=L,R" "the message gives the window's form" "$DIR/err"
expect 2 "a duplicate size is a usage error" "$ATTN" check "b1 b2 hq2 sq4 d8"
has "\"b1\" and \"b2\" both set batch" "the message names both tokens" "$DIR/err"
expect 2 "two dtypes are a usage error" "$ATTN" check "b1 hq2 sq4 d8 bf16 f16"
has "\"bf16\" and \"f16\" both set dtype" "the message names both dtypes" "$DIR/err"
for value in nan inf; do
  expect 2 "scale=$value is a usage error" "$ATTN" check "b1 hq2 sq4 d8 scale=$value"
  has "scale=$value must be finite" "scale=$value is refused by validation's rule" "$DIR/err"
done

# A problem that cannot fit (issue 19: 3037000500^2 elements pass the 2^56 rule) is refused at
# once with one message saying how much it needs, by every command, before measuring anything.
HUGE="b1 hq1 sq3037000500 sk3037000500 d1"
for cmd in check bench tune; do
  expect 3 "attn $cmd of a problem too large for memory is a library error" "$ATTN" "$cmd" "$HUGE"
  has "cannot run here: needs [0-9.]+ [KMGT]iB of host memory .*, more than the [0-9.]+ [KMGT]iB available" \
    "attn $cmd says how much memory it needs and how much there is" "$DIR/err"
  [ "$(wc -l <"$DIR/err")" -eq 1 ] && ok "attn $cmd says it once" || bad "attn $cmd said: $(cat "$DIR/err")"
  grep -Eq "error|nothing to tune|machine:|^  (ref|cpu) " "$DIR/out" && bad "attn $cmd printed rows: $(cat "$DIR/out")" || ok "attn $cmd printed no rows"
done
# Under an address-space limit (ulimit -v) the memory there is, is the limit's room, not the
# machine's. Skipped where the program cannot start under one (sanitizers reserve terabytes).
if (ulimit -v 1000000 && "$ATTN" --version) >/dev/null 2>&1; then
  expect 3 "a problem past ulimit -v is refused" sh -c 'ulimit -v 1000000; exec "$0" check "$1"' "$ATTN" "b1 hq8 sq1000000 d16 f32"
  has "needs [0-9.]+ GiB of host memory .*, more than the [0-9.]+ [KM]iB available" "the limit's room is what is available" "$DIR/err"
fi

expect 0 "attn info" "$ATTN" info
has "^libattn [0-9]+\.[0-9]+\.[0-9]+" "info prints the version"
has "^cpu: " "info prints the CPU"
has "^cpu features: " "info prints the instruction sets"
has "^gpus?" "info prints the GPUs"
has "^  ref +platform ref +device cpu +version [0-9]+" "info lists the reference"
has "^cache: $DIR/cache.txt \(0 entries\)" "info prints the cache path and its entry count"

expect 0 "attn check (forward)" "$ATTN" check "$P1" "$P2"
has "^  ref +default +ok" "check compares the reference with the f64 oracle"
has "out [0-9.e+-]+/[0-9.e+-]+ lse" "check prints errors against tolerances"
expect 0 "attn check --backward" "$ATTN" check --backward "$P1"
has " dq .* dk .* dv " "check --backward compares the gradients"
# A paged cache with rows appended by the call: the oracle must read the cache after the append, as
# the implementations do (it once did not, and every implementation FAILed).
expect 0 "attn check of a paged problem with appended rows" "$ATTN" check \
  "b3 hq4 hkv1 sq3 sk33 d8 f32 paged=8,20 new=2 sinks=2 window=7,0"
# A paged problem has no backward: refused once, with the reason, before the oracle computes any
# gradient (its rows would read the cache as dense tensors, out of bounds: fuzz_problem found it).
expect 3 "attn check --backward of a paged problem is refused" "$ATTN" check --backward \
  "b3 hq4 hkv1 sq3 sk33 d8 f32 paged=8,2"
has "^attn: .*backward of a paged KV cache \(page_size=8\) is not supported" \
  "the refusal says why" "$DIR/err"
# fp8 (docs/FP8.md): checked forward, refused backward.
expect 0 "attn check of an fp8 problem" "$ATTN" check "b2 hq4 hkv2 sq9 sk17 d16 fp8 causal descale=bhkv"
has "^  cpu .* ok " "cpu runs the fp8 forward"
expect 3 "attn check --backward of an fp8 problem is refused" "$ATTN" check --backward \
  "b2 hq4 hkv2 sq9 sk17 d16 fp8"
has "^attn: .*backward of an f8e4m3 problem is not supported" "the refusal says why" "$DIR/err"

expect 0 "attn bench (table)" "$ATTN" bench --reps 2 --min-time 0 "$P1"
has "^  ref +default +ok .* [0-9]+\.[0-9] " "bench prints a checked, timed row"
has "^machine: .*f32 FMA peak [0-9.]+ GFLOP/s per thread" "bench states the machine and its measured peak"
expect 0 "attn bench --csv" "$ATTN" bench --csv --reps 2 --min-time 0 "$P1" "$P2"
has "^problem,impl,config,check,err_over_tol,median_us,gflops,peak_fraction,runs,checked_query_rows,query_rows,checked_key_rows,key_rows,kv_gbps,bw_fraction$" "csv header"
has "^\"$P2\",ref,default,ok," "csv rows quote the problem"
[ "$(grep -c ',ref,' "$DIR/out")" -eq 2 ] && ok "one csv row per problem and candidate" || bad "csv rows"
expect 0 "attn bench --json --backward" "$ATTN" bench --json --backward --reps 1 --min-time 0 "$P1"
has "\"impl\": \"ref\", \"config\": \"default\", \"check\": \"ok\"" "json rows"
has "\"pass\": \"fwd\+bwd\"" "json says which pass was timed"
if command -v python3 >/dev/null 2>&1; then
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d and d[0]["median_us"] > 0 and 0 < d[0]["peak_fraction"] < 2' "$DIR/out" \
    && ok "the json output parses" || bad "the json output does not parse"
fi
expect 2 "--csv and --json exclude each other" "$ATTN" bench --csv --json "$P1"

# The reference once per problem; every row of a small problem, a seeded sample of a large one
# (ATTN_BENCH_ROWS=N asks for a sample of N here, so a small problem takes the sampled path).
# tools/test_harness.c corrupts sampled rows and expects the check to fail.
P3="b2 hq4 hkv2 sq150 sk140 d16 f32 causal"
expect 0 "bench checks every row of a small problem" "$ATTN" bench --reps 1 --min-time 0 --impl ref "$P1"
has "^  checked against the f64 reference: every row$" "bench says every row was checked"
expect 0 "bench of a sampled problem" env ATTN_BENCH_ROWS=24 "$ATTN" bench --reps 1 --min-time 0 --warmup 0 --impl cpu "$P3"
has "^  checked against the f64 reference: [0-9]+ of 1200 query rows \(sampled, seed 1\)$" "bench says how many rows it sampled"
has "^  cpu +bq32_bk64 +ok " "the sampled check passes a correct implementation"
expect 0 "bench --backward of a sampled problem" env ATTN_BENCH_ROWS=24 "$ATTN" bench --backward --json --seed 5 --reps 1 --min-time 0 --warmup 0 --impl ref "$P3"
has "\"checked_query_rows\": [0-9]+, \"query_rows\": 1200, \"checked_key_rows\": [1-9][0-9]*, \"key_rows\": 560, \"check_seed\": 5" "json gives the checked query and key rows and the seed"
expect 0 "check compares every row whatever ATTN_BENCH_ROWS says" env ATTN_BENCH_ROWS=24 "$ATTN" check --impl ref "$P3"
has "^  checked against the f64 reference: every row$" "check says every row was checked"
expect 2 "a bad ATTN_BENCH_ROWS is a usage error" env ATTN_BENCH_ROWS=some "$ATTN" bench "$P1"
has "ATTN_BENCH_ROWS=some" "the message names the variable" "$DIR/err"

# tune: with one configuration per implementation there may be nothing to time; either way the
# command succeeds, reports what it chose, and only measured results reach the cache file.
expect 0 "attn tune" "$ATTN" tune --warmup 1 --iters 3 --max-seconds 0.05 "$P1" "$P2"
has "^b1 hq2 hkv1 sq9 sk11 d8 f32 causal -> [a-z0-9_]+ [^ ]+ \(" "tune reports the pick per problem"
has "^cache: $DIR/cache.txt \([0-9]+ entries\)" "tune reports the cache file"
if grep -q "(tuned)" "$DIR/out"; then
  head -1 "$DIR/cache.txt" | grep -qx "libattn-cache 1" && ok "tuned results are written" || bad "cache header"
  expect 0 "tuning again finds the results" "$ATTN" tune "$P1"
  has "already in the cache" "the second tune is a cache hit"
  expect 3 "tune into an unwritable cache is a library error" "$ATTN" tune --warmup 0 --iters 1 --cache "$DIR/cache.txt/x/y" "$P1"
  has "memory only" "the message says the results stay in memory" "$DIR/err"
else
  [ ! -s "$DIR/cache.txt" ] && ok "nothing measured, nothing written" || bad "a guess was written to the cache"
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
