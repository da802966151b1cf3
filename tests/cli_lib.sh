# tests/cli_lib.sh - what test_cli.sh and test_cli_gpu.sh share, sourced by both after they set
# ATTN (the attn program): a private folder and cache file, the pass/fail count, and the checks.
# CLI_SHOW_OUTPUT=1 before sourcing shows every command's output (the GPU test's record of what it
# compared); otherwise output is shown only for a failed check.
DIR=$(mktemp -d "${TMPDIR:-/tmp}/attn_cli_XXXXXX")
trap 'rm -rf "$DIR"' EXIT
export ATTN_CACHE_PATH="$DIR/cache.txt"
unset ATTN_AUTOTUNE ATTN_BENCH_ROWS
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "PASS $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }

# expect CODE DESCRIPTION COMMAND...: runs the command, output in $DIR/out, checks the exit code.
expect() {
  code=$1; what=$2; shift 2
  "$@" >"$DIR/out" 2>"$DIR/err"
  got=$?
  if [ "${CLI_SHOW_OUTPUT:-0}" = 1 ]; then sed 's/^/  | /' "$DIR/out" "$DIR/err"; fi
  if [ "$got" -eq "$code" ]; then ok "$what (exit $got)"; else
    bad "$what: exit $got, expected $code"
    if [ "${CLI_SHOW_OUTPUT:-0}" != 1 ]; then sed 's/^/  | /' "$DIR/out" "$DIR/err"; fi
  fi
}
# has PATTERN DESCRIPTION [FILE]: the last output matches the extended regular expression.
has() {
  if grep -Eq -- "$1" "${3:-$DIR/out}"; then ok "$2"; else
    bad "$2: no /$1/ in ${3:-$DIR/out}"; sed 's/^/  | /' "${3:-$DIR/out}"; fi
}
