"""gpu/bench_torch.py - PyTorch's scaled_dot_product_attention on the shapes of gpu/bench_cudnn.c,
through its cuDNN backend and its flash backend: bf16, [B, T, H, D] memory viewed as [B, H, T, D]
(the layout libattn uses), forward with requires_grad inputs (so the log-sum-exp is computed, like
libattn's forward with lse) and backward through autograd. 5 warm-up calls, 30 calls timed each
with CUDA events, median. Prints CSV rows: impl,d,t,causal,pass,ms,tflops
"""
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

WARMUP, REPS = 5, 30


def timed(fn):
    times = []
    for r in range(WARMUP + REPS):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        if r >= WARMUP:
            times.append(e0.elapsed_time(e1))
    return statistics.median(times)


def main():
    print("impl,d,t,causal,pass,ms,tflops")
    backends = [("torch-cudnn", SDPBackend.CUDNN_ATTENTION), ("torch-flash", SDPBackend.FLASH_ATTENTION)]
    for d in (128, 64):
        for t in (512, 8192):
            for causal in (0, 1):
                b, h = 16384 // t, 2048 // d
                gen = torch.Generator(device="cuda").manual_seed(0)
                def make():
                    x = torch.rand(b, t, h, d, device="cuda", generator=gen, dtype=torch.float32) * 2 - 1
                    return x.to(torch.bfloat16).transpose(1, 2).requires_grad_(True)
                q, k, v = make(), make(), make()
                dout = (torch.rand(b, t, h, d, device="cuda", generator=gen) * 2 - 1).to(torch.bfloat16).transpose(1, 2)
                flops = 4.0 * b * h * t * t * d / (2 if causal else 1)
                for name, backend in backends:
                    try:
                        with sdpa_kernel(backend):
                            fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
                            ms = timed(fwd)
                            print(f"{name},{d},{t},{causal},fwd,{ms:.4f},{flops / (ms * 1e-3) / 1e12:.1f}", flush=True)
                            out = fwd()
                            bwd = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                            ms = timed(bwd)
                            print(f"{name},{d},{t},{causal},bwd,{ms:.4f},{2.5 * flops / (ms * 1e-3) / 1e12:.1f}", flush=True)
                            del out
                    except Exception as e:  # a backend that refuses the shape is reported, not fatal
                        print(f"# {name} d{d} t{t} causal{causal}: {type(e).__name__}: {e}", file=sys.stderr)


if __name__ == "__main__":
    main()
