"""Forward + backward of a Llama-style attention layer: libattn.torch against PyTorch's SDPA.

    python bench/python/llama_layer.py [--shape B,T,Hq,Hkv,D] [--iters N] [--device cpu]

Default B=8, T=4096, Hq=32, Hkv=8, D=128, bf16, causal (issue 16's target: libattn at least as
fast as PyTorch's fastest SDPA backend). Each row is the median over N timed steps (CUDA events;
the wall clock on the CPU) of out = attention(q, k, v); out.backward(dout), after 3 warm-up
steps. PyTorch's backends that refuse the problem (GQA, head size) are listed as such. On the CPU
(--device cpu, float32) PyTorch's side is its default CPU SDPA.
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import libattn
import libattn.torch as lt


def timed(step, iters, cuda=True):
    for _ in range(3):
        step()
    times = []
    for _ in range(iters):
        if not cuda:
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e3)
            continue
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
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    b, t, hq, hkv, d = (int(x) for x in args.shape.split(","))
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    q = torch.randn(b, t, hq, d, device=dev, dtype=dtype, requires_grad=True)
    k = torch.randn(b, t, hkv, d, device=dev, dtype=dtype, requires_grad=True)
    v = torch.randn(b, t, hkv, d, device=dev, dtype=dtype, requires_grad=True)
    dout = torch.randn(b, t, hq, d, device=dev, dtype=dtype)
    flops = 4 * b * hq * t * t * d / 2 * 3.5  # causal: half the products; bwd = 2.5x fwd

    rows = []

    def libattn_step():
        out = lt.attention(q, k, v, causal=True, impl=args.impl)
        out.backward(dout)

    rows.append(("libattn flash_attn", timed(libattn_step, args.iters, cuda)))
    plan = libattn.plan(f"b{b} hq{hq} hkv{hkv} sq{t} sk{t} d{d} "
                        + ("bf16 causal device=cuda" if cuda else "f32 causal"), impl=args.impl)
    qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_(True) for x in (q, k, v))
    doutt = dout.transpose(1, 2)
    backends = ((("flash", SDPBackend.FLASH_ATTENTION),
                 ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                 ("cudnn", SDPBackend.CUDNN_ATTENTION)) if cuda else
                (("flash", SDPBackend.FLASH_ATTENTION), ("math", SDPBackend.MATH)))
    for name, backend in backends:
        def step():
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True)
            out.backward(doutt)
        try:
            rows.append((f"torch sdpa {name}", timed(step, args.iters, cuda)))
        except RuntimeError as e:
            rows.append((f"torch sdpa {name}", None))
            print(f"torch sdpa {name}: refused ({str(e).splitlines()[0][:100]})")
    where = torch.cuda.get_device_name() if cuda else f"CPU, {torch.get_num_threads()} threads"
    print(f"B={b} T={t} Hq={hq} Hkv={hkv} D={d} {str(dtype)[6:]} causal, fwd+bwd; libattn plan: "
          f"{plan.impl}/{plan.config} (forward); {where}, torch {torch.__version__}")
    best = min(ms for _, ms in rows[1:] if ms is not None) if len(rows) > 1 else None
    for name, ms in rows:
        if ms is None:
            print(f"{name:<22}{'refused':>10}")
        else:
            ratio = f"{best / ms:.2f}x of torch's best" if best else ""
            print(f"{name:<22}{ms:>9.2f} ms{flops / ms / 1e6:>10.1f} GFLOP/s  {ratio}")


if __name__ == "__main__":
    main()
