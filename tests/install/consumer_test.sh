#!/bin/sh
# tests/install/consumer_test.sh - run by CTest as the test `install`.
#
# Installs the build into a temporary prefix, then builds examples/hello.c against the installed
# files (the README's pkg-config lines, shared and static; CMake find_package shared and static), runs
# each program and checks it exits 0 and prints its result. Exits 77 (skip) without pkg-config.
#
# usage: consumer_test.sh BUILD_DIR LIBDIR HELLO_C CONSUMER_DIR CC CMAKE GENERATOR README [EXTRA_CFLAGS]
set -eu
build=$1 libdir_rel=$2 hello=$3 consumer=$4 cc=$5 cmake=$6 generator=$7 readme=$8 extra=${9:-}

if ! command -v pkg-config >/dev/null 2>&1; then
  echo "SKIP: pkg-config is not installed (apt-get install pkg-config)"
  exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/attn-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

run() { # run NAME PROGRAM: the program must exit 0 and print out[0]
  out=$("$2") || { echo "FAIL $1: $2 exited with $?"; exit 1; }
  case $out in
  "out[0] = "*) echo "PASS $1: $out" ;;
  *) echo "FAIL $1: unexpected output: $out"; exit 1 ;;
  esac
}

"$cmake" --install "$build" --prefix "$prefix" >"$tmp/install.log" || {
  cat "$tmp/install.log"; echo "FAIL: cmake --install"; exit 1; }
libdir=$prefix/$libdir_rel
for f in "$prefix/include/attn.h" "$libdir/libattn.a" "$libdir/libattn.so" \
         "$libdir/pkgconfig/attn.pc" "$libdir/pkgconfig/attn-static.pc" "$libdir/cmake/attn/attnConfig.cmake" \
         "$libdir/cmake/attn/attnConfigVersion.cmake" "$libdir/cmake/attn/attnTargets.cmake"; do
  [ -e "$f" ] || { echo "FAIL: $f was not installed"; exit 1; }
done
echo "PASS installed into $prefix"
# The exported targets are relocatable and name no library of this machine's CUDA installation
# (the GPU implementations are modules, loaded at run time).
if grep -il 'cuda\|cudnn' "$libdir"/cmake/attn/attnTargets*.cmake "$libdir"/pkgconfig/*.pc; then
  echo "FAIL: the installed CMake package or pkg-config files name CUDA"; exit 1
fi

# pkg-config: the README's own lines (those starting `cc app.c`), run as written with app.c =
# hello.c, so the README cannot show a link line that fails. The first links the shared library
# (found at run time through the rpath), the second the static one.
export PKG_CONFIG_PATH="$libdir/pkgconfig"
pclibdir=$(pkg-config --variable=libdir attn)
[ "$(cd "$pclibdir" && pwd -P)" = "$(cd "$libdir" && pwd -P)" ] || {
  echo "FAIL: attn.pc says libdir=$pclibdir, the library is in $libdir"; exit 1; }
grep '^cc app.c ' "$readme" >"$tmp/readme_lines" || { echo "FAIL: no 'cc app.c' line in $readme"; exit 1; }
[ "$(wc -l <"$tmp/readme_lines")" -eq 2 ] || {
  echo "FAIL: expected the README's two link lines (shared, static):"; cat "$tmp/readme_lines"; exit 1; }
n=0
while IFS= read -r line; do
  n=$((n + 1))
  echo "README line $n: $line"
  cmd=$(printf '%s' "$line" | sed -e 's/ *#.*$//' -e "s|^cc app.c|\"\$cc\" \$extra \"\$hello\"|")
  eval "$cmd -o \"\$tmp/hello_readme_$n\"" || { echo "FAIL: README line $n did not build"; exit 1; }
done <"$tmp/readme_lines"
run readme-shared "$tmp/hello_readme_1"
run readme-static "$tmp/hello_readme_2"
if command -v readelf >/dev/null 2>&1; then
  readelf -d "$tmp/hello_readme_1" | grep -q 'libattn\.so' || {
    echo "FAIL: README line 1 does not link the shared libattn"; exit 1; }
  if readelf -d "$tmp/hello_readme_2" | grep -q 'libattn'; then
    echo "FAIL: README line 2 (static) depends on the shared libattn"; exit 1
  fi
fi

# CMake: find_package(attn CONFIG REQUIRED) with attn::attn and attn::attn_static.
"$cmake" -S "$consumer" -B "$tmp/consumer" -G "$generator" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$cc" -DHELLO_SOURCE="$hello" \
  -DCMAKE_C_FLAGS="$extra" >"$tmp/consumer.log" 2>&1 &&
  "$cmake" --build "$tmp/consumer" >>"$tmp/consumer.log" 2>&1 || {
  cat "$tmp/consumer.log"; echo "FAIL: the CMake consumer did not build"; exit 1; }
run cmake-shared "$tmp/consumer/hello_shared"
run cmake-static "$tmp/consumer/hello_static"
if command -v readelf >/dev/null 2>&1; then
  readelf -d "$tmp/consumer/hello_shared" | grep -q 'libattn\.so' || {
    echo "FAIL: hello_shared does not load libattn.so (attn::attn must be the shared library)"; exit 1; }
fi
echo "install test: all passed"
