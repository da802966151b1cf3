"""gpu/cp_torch.py - the peer of `attn_dist_bench --gpu` for issue 12's 2-GPU benchmark: PyTorch's
context parallelism (torch.distributed.tensor.experimental.context_parallel: a load-balanced ring
over SDPA, here its cuDNN backend) on the GPUs of one machine, forward + backward, timed the way
attn_dist_bench times (a warm-up, then the median of --iters, every rank synchronised).

  torchrun --nproc-per-node 1 gpu/cp_torch.py --t 131072 --causal    # one GPU: plain SDPA
  torchrun --nproc-per-node 2 gpu/cp_torch.py --t 131072 --causal    # the ring on two

Prints one line per run: ranks, the median ms of the slowest rank, and TFLOPS (forward 4 B Hq T^2 D,
halved when causal, times 3.5 for forward + backward, as attn_dist_bench counts). NVLink multicast
must stay off on the lent machines: gpu/dist.sh exports NCCL_NVLS_ENABLE=0 and the others.
"""

import argparse
import contextlib
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--t", type=int, default=131072, help="sequence length (whole problem)")
    ap.add_argument("--hq", type=int, default=32)
    ap.add_argument("--hkv", type=int, default=32, help="KV heads (GQA through enable_gqa when < hq)")
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--iters", type=int, default=3)
    args = ap.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if world > 1:
        dist.init_process_group("nccl")
    dev, dt = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(1)  # every rank the same whole problem

    def tensor(heads):
        return torch.randn(1, heads, args.t, args.d, device=dev, dtype=dt, generator=gen).requires_grad_()

    q, k, v = tensor(args.hq), tensor(args.hkv), tensor(args.hkv)
    if world > 1:  # each rank keeps its load-balanced shard of the sequence (dim 2)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel

        mesh = init_device_mesh("cuda", (world,))
        ring = context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2], no_restore_buffers={q, k, v})
    else:
        ring = contextlib.nullcontext()

    def step():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=args.causal, enable_gqa=args.hkv != args.hq)
        out.sum().backward()
        q.grad = k.grad = v.grad = None

    times = []
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION), ring:
        for i in range(args.iters + 1):
            torch.cuda.synchronize()
            if world > 1:
                dist.barrier()
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            elapsed = torch.tensor(time.perf_counter() - t0, device=dev)
            if world > 1:  # the slowest rank's time
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            if i > 0:  # the first is the warm-up
                times.append(elapsed.item())
    ms = statistics.median(times) * 1e3
    flops = 3.5 * 4.0 * args.hq * args.t * args.t * args.d * (0.5 if args.causal else 1.0)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"torch context_parallel b1 hq{args.hq} hkv{args.hkv} sq{args.t} d{args.d} bf16"
              f"{' causal' if args.causal else ''}, {world} ranks (cudnn): {ms:.3f} ms (slowest rank),"
              f" {flops / ms * 1e-9:.1f} TFLOPS", flush=True)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
