"""dev/cuda/fwd_hopper_torch.py - the peers of dev/cuda/fwd_hopper.cu in the same call: PyTorch's
scaled_dot_product_attention forward through its cuDNN and flash backends on the lab's bench shapes
(bf16, B * T = 16384, Hq * D = 2048, T = 8192, [B, T, H, D] memory viewed as [B, H, T, D] like
libattn's, inputs that require grad so the log-sum-exp is computed too). 5 warm-up calls, 20 timed
with CUDA events, median. Prints one line per backend and shape. Arguments: the sequence lengths
(default 8192; `fwd_hopper SEED sched`'s peers: 512 2048 8192)."""
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def median_ms(fn, warmup=5, reps=20):
    times = []
    for r in range(warmup + reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        if r >= warmup:
            times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version(), torch.cuda.get_device_name())
    lengths = [int(a) for a in sys.argv[1:]] or [8192]
    for t in lengths:
        for d in (128, 64, 256):
            for causal in (0, 1):
                b, h = 16384 // t, 2048 // d
                q, k, v = ((torch.rand(b, t, h, d, device="cuda") * 2 - 1).to(torch.bfloat16).transpose(1, 2)
                           .requires_grad_(True) for _ in range(3))
                flops = 4.0 * b * h * t * t * d / (2 if causal else 1)
                for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
                    try:
                        with sdpa_kernel(backend):
                            ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal)))
                        print(f"torch fwd {name} D={d} T={t} causal={causal}: {ms:.3f} ms {flops / ms * 1e-9:.1f} TFLOPS")
                    except Exception as e:  # a backend that refuses the shape is reported, not fatal
                        print(f"torch fwd {name} D={d} T={t} causal={causal}: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
