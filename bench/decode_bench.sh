#!/bin/bash
# bench/decode_bench.sh - issue 14's decode benchmark on a GPU machine: builds gpu/decode_bench
# against a libattn build that has the cuda module (and, when built, cudnn's), then runs
# bench/decode_bench.py, which times libattn and PyTorch's flash and cuDNN SDPA in one run and
# prints the table of bench/RESULTS.md "Decode (14)".
#
# usage: bench/decode_bench.sh [BUILD] [MAX_KEYS [PROBLEMS [VARIANTS]]]
#   BUILD     a build folder of this tree with the modules (default build-gpu, gpu/run.sh's); made
#             here when it has no libattn.a: Release, the cuda module only (-j16)
#   MAX_KEYS  problems with B * Tk up to this (default 524288: K + V of 2 GiB at most)
#   PROBLEMS, VARIANTS  a part of the grid: gpu/decode_bench.c's usage
set -eu -o pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
MAX_KEYS=${2:-524288}
if [ ! -f "$BUILD/libattn.a" ]; then
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DATTN_WITH_CUDA=ON -DATTN_WITH_CUDNN=OFF \
    -DATTN_BUILD_EXAMPLES=OFF -DATTN_BUILD_BENCH=OFF >/dev/null
  cmake --build "$BUILD" -j16 --target attn_static attn_cuda_module >/dev/null
fi
cudart=$(grep -h "^CUDA_cudart_LIBRARY:" "$BUILD/CMakeCache.txt" | cut -d= -f2)
cudnn=$(grep -h "^ATTN_CUDNN_LIBRARY:" "$BUILD/CMakeCache.txt" | cut -d= -f2 || true)
libs=("$BUILD/libattn.a")
if [ -n "$cudnn" ] && [ -f "$cudnn" ]; then libs+=("$cudnn" "-Wl,-rpath,$(dirname "$cudnn")"); fi
libs+=("$cudart" "-Wl,-rpath,$(dirname "$cudart")" -fopenmp -lm -lpthread)
gcc -O2 -std=c11 -Iinclude -I"$(dirname "$(dirname "$(command -v nvcc)")")/include" gpu/decode_bench.c \
  "${libs[@]}" -o "$BUILD/decode_bench"
export ATTN_MODULE_PATH="$PWD/$BUILD"
python3 bench/decode_bench.py "$BUILD/decode_bench" "$MAX_KEYS" "${@:3}"
