#!/usr/bin/env python3
"""bench/torch_sdpa.py - PyTorch's CPU scaled_dot_product_attention on the shapes of
bench/cpu_bench.c, for the side-by-side table of bench/RESULTS.md (run by bench/run_cpu.sh).

Not part of the build or the tests: it needs `torch` (pip install torch, in a virtual environment).

usage: torch_sdpa.py --t 4096 --d 128 --hq 16 --b 1 --causal 0 --dtype f32 --threads 1 --reps 5
Prints one CSV row: torch,<problem>,<threads>,<forward s>,<backward s> (medians). The forward is
timed under no_grad (what inference runs); the backward is out.backward(dout) after a forward with
grad, timed alone.
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--b", type=int, default=1)
    ap.add_argument("--hq", type=int, default=16)
    ap.add_argument("--t", type=int, default=4096)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--causal", type=int, default=0)
    ap.add_argument("--dtype", default="f32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[a.dtype]
    g = torch.Generator().manual_seed(1)
    # torch's layout is [B, H, T, D]; the values match cpu_bench's range (uniform in [-1, 1)).
    q, k, v, dout = (torch.rand(a.b, a.hq, a.t, a.d, generator=g).mul(2).sub(1).to(dt)
                     for _ in range(4))
    causal = bool(a.causal)

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def bwd_once():
        qq, kk, vv = (x.detach().requires_grad_(True) for x in (q, k, v))
        out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
        t0 = time.perf_counter()
        out.backward(dout)
        return time.perf_counter() - t0

    fwd()  # warm-up
    tf = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        fwd()
        tf.append(time.perf_counter() - t0)
    bwd_once()  # warm-up
    tb = [bwd_once() for _ in range(a.reps)]
    desc = "b%d hq%d hkv%d sq%d sk%d d%d %s%s" % (a.b, a.hq, a.hq, a.t, a.t, a.d, a.dtype,
                                                  " causal" if causal else "")
    print("torch,%s,%d,%.6f,%.6f" % (desc, a.threads, statistics.median(tf), statistics.median(tb)),
          flush=True)


if __name__ == "__main__":
    main()
