#!/bin/bash
# gpu/jax.sh - the JAX front-end on a lent GPU machine, in one call (docs/JAX.md): builds the
# package with the GPU modules and the JAX FFI handlers into the machine's Python (jax with its
# CUDA plugin, scikit-build-core already there; nothing is downloaded), then runs
# tests/python/gpu/test_jax_gpu.py, the benchmark bench/python/jax_bench.py (B=2 T=8192 Hq=16
# D=128 bf16, fwd+bwd under jit, against jax.nn.dot_product_attention's cuDNN and XLA paths) and
# the CPU tests of the front-end under JAX_PLATFORMS=cpu (the machine's newer jax).
#
# usage: gpu/jax.sh            (from the repository root; logs in $OUT, default /tmp/gpu_out)
# GENCODE: the kernels' nvcc targets (default sm_90 only: H100/H200, a third of the compile time).
# Time limits in seconds per step: BUILD_S (60), TESTS_S (45), BENCH_S (50), CPU_S (0 = skip the CPU
# suite); ITERS, timed steps per benchmark row (10).
set -u -o pipefail
OUT="${OUT:-/tmp/gpu_out}"
GENCODE="${GENCODE:--gencode=arch=compute_90,code=sm_90}"
mkdir -p "$OUT"
BUILD_S="${BUILD_S:-60}" TESTS_S="${TESTS_S:-45}" BENCH_S="${BENCH_S:-50}" CPU_S="${CPU_S:-0}"
step() { # name limit command...: runs with a time limit, prints "name rc=N seconds"
  local name=$1 limit=$2 t0=$SECONDS
  shift 2
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - t0))s"
  return $rc
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import jax; print("jax", jax.__version__, jax.devices())' 2>&1 | tail -1
step build "$BUILD_S" python3 -m pip install --no-build-isolation --no-deps -v -C build-dir=build/python-gpu \
  -C cmake.define.ATTN_WITH_CUDA=ON \
  -C cmake.define.ATTN_PYTHON_JAX=ON -C "cmake.define.ATTN_CUDA_GENCODE=$GENCODE" \
  -C cmake.define.ATTN_WITH_MPI=OFF . || { tail -40 "$OUT/build.log"; exit 1; }
python3 -c 'import libattn; print([i["name"] for i in libattn.info()["implementations"]])'
step gpu_tests "$TESTS_S" python3 -m pytest -q -p no:cacheprovider --rootdir tests/python \
  tests/python/gpu/test_jax_gpu.py
tail -15 "$OUT/gpu_tests.log"
step bench "$BENCH_S" python3 bench/python/jax_bench.py --iters "${ITERS:-10}"
cat "$OUT/bench.log"
[ "$CPU_S" -gt 0 ] && JAX_PLATFORMS=cpu step cpu_tests "$CPU_S" python3 -m pytest -q -p no:cacheprovider --rootdir tests/python \
  tests/python/test_jax.py
[ "$CPU_S" -gt 0 ] && tail -5 "$OUT/cpu_tests.log"
exit 0
