#!/usr/bin/env python3
"""gpu/cuda_bench.py - the side-by-side table of the issue: libattn's "cuda" implementation
(gpu/cuda_bench, CSV on stdin or run here) against PyTorch's SDPA backends (flash, cuDNN,
efficient) on the same shapes: bf16, B * T = 16384 tokens, Hq * D = 2048, D in {64, 128, 256},
T in {512, 8192}, causal and not; CUDA-event medians; TFLOPS forward 4 * B * Hq * T * T * D
(halved when causal), backward 2.5x; the cuda implementation under its configurations
("deterministic", "atomic", and on an H100 / H200 "sm90": the Hopper forward and backward, the
latter atomic, at D = 64, 128 and 256); ratios take the fastest of them.

usage: cuda_bench.py <cuda_bench binary> [reps]   prints a markdown table.
"""
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
            ("efficient", SDPBackend.EFFICIENT_ATTENTION)]


def median_ms(fn, reps):
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def torch_time(backend, d, t, causal, reps):
    b, h = 16384 // t, 2048 // d
    q, k, v, do = (torch.rand(b, h, t, d, device="cuda", dtype=torch.bfloat16) * 2 - 1 for _ in range(4))
    qq, kk, vv = (x.requires_grad_(True) for x in (q.clone(), k.clone(), v.clone()))
    try:
        with sdpa_kernel([backend]):
            with torch.no_grad():
                fwd = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), reps)
            out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)

            def bwd():
                torch.autograd.grad(out, (qq, kk, vv), do, retain_graph=True)
            bwdt = median_ms(bwd, reps)
        return fwd, bwdt
    except RuntimeError as e:
        return None, str(e).splitlines()[0][:60]


def main():
    binary = sys.argv[1]
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    rows, atomic, sm90 = {}, {}, {}
    for config, table in (("deterministic", rows), ("atomic", atomic), ("sm90", sm90)):
        res = subprocess.run([binary, str(reps), config], capture_output=True, text=True)
        sys.stderr.write(res.stderr)
        for line in res.stdout.splitlines():
            f = line.split(",")
            if f[0] != "cuda":
                continue
            key = (int(f[1]), int(f[2]), int(f[3]))
            table[key] = (float(f[4]), float(f[5])) if len(f) >= 8 else None
            if table[key] is None:
                print("cuda", config, key, line)
            else:
                print(config, line, flush=True)
    print("| D | T | causal | pass | cuda | cuda atomic | cuda sm90 | flash | cudnn | efficient | cuda / flash | cuda / best |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (d, t, c), ours in sorted(rows.items()):
        other, hopper = atomic.get((d, t, c)), sm90.get((d, t, c))
        b, h = 16384 // t, 2048 // d
        flops = 4.0 * b * h * t * t * d * (0.5 if c else 1.0)
        theirs = {name: torch_time(be, d, t, bool(c), reps) for name, be in BACKENDS}
        for i, pname in enumerate(("fwd", "bwd")):
            fl = flops * (1.0 if i == 0 else 2.5)
            tf = lambda ms: fl / ms * 1e-9
            mine = tf(ours[i]) if ours else float("nan")
            mine_a = tf(other[i]) if other else float("nan")
            mine_h = tf(hopper[i]) if hopper else float("nan")
            best_mine = max(x for x in (mine, mine_a, mine_h) if x == x) if ours else mine
            cells, best = [], 0.0
            for name, _ in BACKENDS:
                r = theirs[name]
                if r[0] is None:
                    cells.append("n/a")
                else:
                    v = tf(r[i])
                    best = max(best, v)
                    cells.append(f"{v:.1f}")
            flash = theirs["flash"]
            ratio_flash = f"{best_mine / tf(flash[i]):.2f}" if flash[0] is not None else "n/a"
            ratio_best = f"{best_mine / best:.2f}" if best > 0 else "n/a"
            print(f"| {d} | {t} | {c} | {pname} | {mine:.1f} | {mine_a:.1f} | {mine_h:.1f} | " + " | ".join(cells) +
                  f" | {ratio_flash} | {ratio_best} |", flush=True)


if __name__ == "__main__":
    main()
