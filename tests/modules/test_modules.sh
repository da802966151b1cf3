#!/bin/sh
# tests/modules/test_modules.sh - run by CTest as the test `modules`: the GPU module loader
# (src/module/loader.c) on stand-in modules (fake_module.c), on any machine.
#
# usage: test_modules.sh ATTN LIBATTN_SO FAKES_DIR [REAL_MODULES]
#   ATTN          the attn command (libattn.a linked in)
#   LIBATTN_SO    the shared core library, whose dependencies must name no CUDA library
#   FAKES_DIR     folders good/ bad_abi/ bad_name/ missing_dep/, each with a libattn_cuda.so
#   REAL_MODULES  colon-separated paths of the real modules this build made (may be empty): each
#                 must load (a machine with the CUDA toolkit and no GPU loads them too)
set -u
attn=$1 core=$2 fakes=$3 real=${4:-}
failures=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; failures=$((failures + 1)); }
# expect NAME PATTERN TEXT: TEXT must contain the fixed string PATTERN
expect() {
  case $3 in
  *"$2"*) pass "$1" ;;
  *) fail "$1: expected \"$2\" in:"; echo "$3" ;;
  esac
}
info() { ATTN_MODULE_PATH=$1 "$attn" info 2>&1; }

# The core's dependencies: libc, libm, OpenMP's runtime and the loader's; never a CUDA library.
if command -v readelf >/dev/null 2>&1; then
  needed=$(readelf -d "$core" | grep NEEDED)
  echo "$needed"
  if echo "$needed" | grep -Eiq 'cuda|cudnn|cublas|nvidia|nccl'; then
    fail "libattn.so needs a CUDA library"
  else
    pass "libattn.so needs no CUDA library"
  fi
else
  echo "readelf not found: dependency check not run"
fi

# No module anywhere: the CPU implementations alone, and a problem still runs.
out=$(info "$fakes/absent")
expect "absent module reported" "libattn_cuda.so is in no folder of ATTN_MODULE_PATH=$fakes/absent" "$out"
expect "cpu first without modules" "implementations, in order of preference:
  cpu" "$out"
if ATTN_MODULE_PATH="$fakes/absent" "$attn" check "b1 hq2 sq5 d8" >/dev/null 2>&1; then
  pass "a problem runs without modules"
else
  fail "attn check without modules"
fi

# A module that loads: its implementation leads the list; problems it refuses go to the next.
out=$(info "$fakes/good")
expect "good module loaded" "cuda   loaded from $fakes/good/libattn_cuda.so" "$out"
expect "module implementation first" "implementations, in order of preference:
  fakegpu" "$out"
if ATTN_MODULE_PATH="$fakes/good" "$attn" check "b1 hq2 sq5 d8" >/dev/null 2>&1; then
  pass "a refusing module leaves the problem to cpu and ref"
else
  fail "attn check with the fake module"
fi

# Defects, each reported with its reason; none stops the CPU implementations.
expect "wrong ABI refused" "built for module ABI 999" "$(info "$fakes/bad_abi")"
expect "wrong name refused" "it calls itself \"cudnn\", not \"cuda\"" "$(info "$fakes/bad_name")"
out=$(info "$fakes/missing_dep")
expect "missing dependency named" "libattn_fake_dep.so: cannot open shared object file" "$out"
expect "missing dependency leaves cpu" "implementations, in order of preference:
  cpu" "$out"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/attn-modules.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/garbage"
echo "not a shared object" >"$tmp/garbage/libattn_cuda.so"
expect "a file that is no library" "$tmp/garbage/libattn_cuda.so" "$(info "$tmp/garbage")"

# The folders of ATTN_MODULE_PATH in order: a broken copy first does not hide a good one later.
expect "search goes on past a broken copy" "cuda   loaded from $fakes/good/libattn_cuda.so" \
  "$(info "$fakes/bad_abi:$fakes/good")"

# Without ATTN_MODULE_PATH the folder of libattn.so is searched: a copy of the library with the
# fake module beside it, loaded as Python's ctypes (or any program) would.
# (Not for a sanitizer build: python3 would have to load the ASan runtime first.)
if readelf -d "$core" 2>/dev/null | grep -q 'libasan'; then
  echo "an ASan build: the search beside libattn.so is not run (python3 cannot load it)"
elif command -v python3 >/dev/null 2>&1; then
  mkdir "$tmp/lib"
  cp "$core" "$tmp/lib/libattn.so"
  cp "$fakes/good/libattn_cuda.so" "$tmp/lib/"
  names=$(env -u ATTN_MODULE_PATH python3 -c '
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.attn_impl_name.restype = ctypes.c_char_p
print(",".join(lib.attn_impl_name(i).decode() for i in range(lib.attn_impl_count())))
' "$tmp/lib/libattn.so" 2>&1)
  expect "module found beside libattn.so" "fakegpu,cpu,ref" "$names"
else
  echo "python3 not found: the search beside libattn.so is not run"
fi

# The real modules of this build load here (the CUDA runtime loads without a GPU).
old_ifs=$IFS
IFS=:
for m in $real; do
  IFS=$old_ifs
  name=$(basename "$m" .so)
  name=${name#libattn_}
  expect "real module $name loads" "loaded from $m" "$(info "$(dirname "$m")")"
done
IFS=$old_ifs

echo "modules: $failures failed"
[ "$failures" -eq 0 ]
