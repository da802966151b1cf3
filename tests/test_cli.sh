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

expect 0 "attn bench (table)" "$ATTN" bench --reps 2 --min-time 0 "$P1"
has "^  ref +default +ok .* [0-9]+\.[0-9] " "bench prints a checked, timed row"
has "^machine: .*f32 FMA peak [0-9.]+ GFLOP/s per thread" "bench states the machine and its measured peak"
expect 0 "attn bench --csv" "$ATTN" bench --csv --reps 2 --min-time 0 "$P1" "$P2"
has "^problem,impl,config,check,err_over_tol,median_us,gflops,peak_fraction,runs,kv_gbps,bw_fraction$" "csv header"
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
