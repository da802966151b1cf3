#!/bin/bash
# dev/cuda/fwd_hopper_fp8_call.sh - one self-contained device call (an H200, about 6 minutes) that
# checks and times the sm90 fp8 forward's configurations (issue 13): the kernel lab
# (dev/cuda/fwd_hopper_fp8.cu: each variant checked against the library's, then timed beside the
# bf16 sm90 forward), the library's GPU build, tests/test_fp8_cuda (every configuration cuda offers
# against the f64 reference) and `attn bench` rows of every fp8 configuration and bf16 `sm90` at
# B = 2, H = 16, T = 8192, D = 128, causal and not. Logs in /tmp/g (the caller tars them); the
# summary is the tail of stdout. Run from the tree's root.
set -u
mkdir -p /tmp/g
S=$SECONDS
t() { echo "[$((SECONDS - S)) s] $*"; }
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee /tmp/g/env.txt
(nvcc -std=c++17 -O3 -Iinclude -Isrc -Idev/cuda -gencode=arch=compute_90a,code=sm_90a -Xptxas -v \
  dev/cuda/fwd_hopper_fp8.cu -o /tmp/g/lab90fp8 >/tmp/g/lab_build.log 2>&1
 echo "lab build rc=$?" >>/tmp/g/lab_build.log) &
lab_pid=$!
OUT=/tmp/g/run CUDA_GENCODE="-gencode=arch=compute_90,code=sm_90" timeout 230 gpu/run.sh cuda build 2>&1 | tail -4
t build done
wait $lab_pid
tail -1 /tmp/g/lab_build.log
timeout 70 /tmp/g/lab90fp8 >/tmp/g/lab.log 2>&1
echo "lab rc=$?"
grep -E "^FAIL|failed checks" /tmp/g/lab.log
t lab done
timeout 110 build-gpu/tests/test_fp8_cuda >/tmp/g/test_fp8_cuda.log 2>&1
echo "test_fp8_cuda rc=$?"
grep -E "^FAIL|^FATAL|seed" /tmp/g/test_fp8_cuda.log | head -12
tail -1 /tmp/g/test_fp8_cuda.log
t test done
for c in "" " causal"; do
  for cfg in sm90_fp8 sm90_fp8_pingpong sm90_fp8_n192; do
    echo "== $cfg fp8$c" >>/tmp/g/bench.log
    timeout 30 build-gpu/tools/attn bench --platform cuda --reps 10 --config $cfg \
      "b2 hq16 hkv16 sq8192 sk8192 d128 fp8 descale=bhkv$c device=cuda" >>/tmp/g/bench.log 2>&1
    echo "rc=$?" >>/tmp/g/bench.log
  done
  echo "== sm90 bf16$c" >>/tmp/g/bench.log
  timeout 30 build-gpu/tools/attn bench --platform cuda --reps 10 --config sm90 \
    "b2 hq16 hkv16 sq8192 sk8192 d128 bf16$c device=cuda" >>/tmp/g/bench.log 2>&1
  echo "rc=$?" >>/tmp/g/bench.log
done
t bench done
grep -v "^$" /tmp/g/bench.log | cut -c1-220
grep -E "TFLOPS|pre-pass" /tmp/g/lab.log | sed 's/lab fwd90 fp8 //' | cut -c1-200
