#!/bin/sh
# tests/test_cli_gpu.sh - `attn check` and `attn bench` on GPU problems: inputs drawn on the host,
# copied to the device, outputs and gradients copied back and compared with the f64 reference under
# SPEC.md's tolerance. Label gpu. Where `attn info` lists no usable GPU it checks instead that a GPU
# problem is refused with one line naming the problem and the reason, and exits 77 ("skipped").
# Run by CTest as `test_cli_gpu.sh path/to/attn`; uses a private cache file.
set -u
ATTN=${1:?usage: test_cli_gpu.sh path/to/attn}
CLI_SHOW_OUTPUT=1
. "$(dirname "$0")/cli_lib.sh"

# Forward only, causal grouped-query (4 query heads per kv head), sizes off the tile sizes.
FWD="b2 hq8 hkv2 sq77 sk77 d64 bf16 causal device=cuda"
# Backward with odd sizes everywhere the kernels allow them (head dims stay multiples of 8), Tq < Tk
# so the causal diagonal is bottom-right aligned.
BWD="b3 hq3 hkv1 sq37 sk53 d40 f16 causal device=cuda"
# Packed varlen: the cu_seqlens arrays must be on the device too.
VARLEN="b3 hq4 hkv2 sq40 sk40 d64 bf16 causal varlen=packed:100,110 device=cuda"

if ! "$ATTN" info >"$DIR/info" 2>&1 || ! grep -q "^gpu 0: " "$DIR/info"; then
  sed 's/^/  | /' "$DIR/info"
  expect 3 "a GPU problem without a usable GPU is a library error" "$ATTN" check "$FWD"
  has "^attn: \"$FWD\": .*(GPU module|CUDA device)" "the one line names the problem and the reason" "$DIR/err"
  [ "$(wc -l <"$DIR/err")" -eq 1 ] && ok "the refusal is one line" || bad "the refusal is one line"
  echo "SKIP: no usable GPU ($(grep '^gpus' "$DIR/info"))"
  echo "$pass passed, $fail failed"
  [ $fail -eq 0 ] && exit 77
  exit 1
fi
grep "^gpu " "$DIR/info"

expect 0 "attn check, forward, causal GQA on the GPU" "$ATTN" check "$FWD"
has "^  cuda +deterministic +ok " "the cuda implementation is compared with the reference"
expect 0 "attn check --backward, odd sizes on the GPU" "$ATTN" check --backward "$BWD"
has "^  cuda +deterministic +ok .* dq .* dk .* dv " "the gradients come back and are compared"
expect 0 "attn check --backward, packed varlen on the GPU" "$ATTN" check --backward "$VARLEN"
has "^  cuda +[a-z]+ +ok " "varlen runs with its sequence lengths on the device"

# bench: checked, then timed with a wait for the device; the table in TFLOP/s without %peak, and
# the csv/json columns of a CPU run with an empty / null peak_fraction.
expect 0 "attn bench on the GPU" "$ATTN" bench --impl cuda --reps 3 --min-time 0 "$FWD"
has "^gpu 0: cuda " "bench states the GPU"
has "TFLOP/s +%peak" "a GPU table counts TFLOP/s"
has "^  cuda +deterministic +ok .* [0-9]+\.[0-9]{3} +- +[0-9]+$" "a GPU row is timed, without %peak"
expect 0 "attn bench --csv on the GPU" "$ATTN" bench --csv --impl cuda --reps 2 --min-time 0 "$FWD"
has "^\"$FWD\",cuda,deterministic,ok,[^,]+,[0-9.]+,[0-9.e+]+,,[0-9]+,1232,1232,0,0,,$" "csv: peak_fraction empty, every row checked, no KV rate (not decode)"
expect 0 "attn bench --json --backward on the GPU" "$ATTN" bench --json --backward --impl cuda --reps 2 --min-time 0 "$BWD"
if command -v python3 >/dev/null 2>&1; then
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d and all(r["median_us"] > 0 and r["peak_fraction"] is None for r in d)' "$DIR/out" \
    && ok "json parses, times every row, peak_fraction null" || bad "json output"
fi
# The sampled check of a large problem, asked for here on small ones (ATTN_BENCH_ROWS): the device's
# outputs compared on the sampled query rows and, backward, on a slice's key rows.
expect 0 "attn bench --backward, sampled, on the GPU" env ATTN_BENCH_ROWS=24 "$ATTN" bench --backward --impl cuda --reps 1 --min-time 0 "$BWD"
has "^  checked against the f64 reference: [0-9]+ of 333 query rows and [0-9]+ of 159 key rows \(sampled, seed 1\)$" "bench says which rows it sampled"
has "^  cuda +deterministic +ok " "the sampled check passes the cuda implementation"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
