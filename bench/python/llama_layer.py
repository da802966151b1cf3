"""Forward + backward of a Llama-style attention layer: libattn.torch against PyTorch's SDPA.

    python bench/python/llama_layer.py [--shape B,T,Hq,Hkv,D] [--iters N]

Default B=8, T=4096, Hq=32, Hkv=8, D=128, bf16, causal (issue 16's target: libattn at least as
fast as PyTorch's fastest SDPA backend). Each row is the median over N timed steps (CUDA events)
of out = attention(q, k, v); out.backward(dout), after 3 warm-up steps. PyTorch's backends that
refuse the problem (GQA, head size) are listed as such.
"""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import libattn
import libattn.torch as lt


def timed(step, iters):
    for _ in range(3):
        step()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="8,4096,32,8,128")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--impl", default=None, help="libattn implementation (default: executor)")
    args = ap.parse_args()
    b, t, hq, hkv, d = (int(x) for x in args.shape.split(","))
    dev, dtype = torch.device("cuda"), torch.bfloat16
    q = torch.randn(b, t, hq, d, device=dev, dtype=dtype, requires_grad=True)
    k = torch.randn(b, t, hkv, d, device=dev, dtype=dtype, requires_grad=True)
    v = torch.randn(b, t, hkv, d, device=dev, dtype=dtype, requires_grad=True)
    dout = torch.randn(b, t, hq, d, device=dev, dtype=dtype)
    flops = 4 * b * hq * t * t * d / 2 * 3.5  # causal: half the products; bwd = 2.5x fwd

    rows = []

    def libattn_step():
        out = lt.attention(q, k, v, causal=True, impl=args.impl)
        out.backward(dout)

    rows.append(("libattn flash_attn", timed(libattn_step, args.iters)))
    plan = libattn.plan(f"b{b} hq{hq} hkv{hkv} sq{t} sk{t} d{d} bf16 causal device=cuda",
                        impl=args.impl)
    qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_(True) for x in (q, k, v))
    doutt = dout.transpose(1, 2)
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION),
                          ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                          ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        def step():
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True)
            out.backward(doutt)
        try:
            rows.append((f"torch sdpa {name}", timed(step, args.iters)))
        except RuntimeError as e:
            rows.append((f"torch sdpa {name}", None))
            print(f"torch sdpa {name}: refused ({str(e).splitlines()[0][:100]})")
    print(f"B={b} T={t} Hq={hq} Hkv={hkv} D={d} bf16 causal, fwd+bwd; libattn plan: {plan.impl}/"
          f"{plan.config} (forward); {torch.cuda.get_device_name()}, torch {torch.__version__}")
    best = min(ms for _, ms in rows[1:] if ms is not None) if len(rows) > 1 else None
    for name, ms in rows:
        if ms is None:
            print(f"{name:<22}{'refused':>10}")
        else:
            ratio = f"{best / ms:.2f}x of torch's best" if best else ""
            print(f"{name:<22}{ms:>9.2f} ms{flops / ms / 1e9:>9.1f} TFLOP/s  {ratio}")


if __name__ == "__main__":
    main()
