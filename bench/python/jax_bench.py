"""Forward + backward under jit: libattn.jax against jax.nn.dot_product_attention (cuDNN, XLA).

    python bench/python/jax_bench.py [--shape B,T,Hq,Hkv,D] [--iters N] [--causal 0|1]

Default B=2, T=8192, Hq=16, D=128, bf16 (issue 17's target: within 5% of JAX's cuDNN path when
libattn's executor picks cuDNN). Each row: the jitted step out, vjp = jax.vjp(attention, q, k, v);
vjp(dout), validated first against JAX's XLA path (max error over max |out|), then 3 warm-up
steps and the median wall time of N steps each ended by block_until_ready (the step is one XLA
executable, so host time between kernels is XLA's, not Python's). Rows with ejKernel's features
that JAX's cuDNN path cannot run (attention sinks, logits soft cap) compare libattn's cuda kernels
with the same problem written in plain XLA, and with libattn's own plain problem. TFLOPS counts
4*B*Hq*Tq*Tk*D for the forward and 2.5 times that for the backward (halved when causal).
"""
import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import libattn
import libattn.jax as lj


def step_of(attention):
    def step(q, k, v, dout):
        out, vjp = jax.vjp(attention, q, k, v)
        return (out, *vjp(dout))
    return jax.jit(step)


def median_ms(step, args, iters):
    for _ in range(3):
        jax.block_until_ready(step(*args))
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(step(*args))
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def xla_attention(sinks=None, softcap=0.0, causal=False):
    """The problem in plain XLA (einsum, softmax with sinks appended, cap before the mask)."""
    def attention(q, k, v):
        b, t, hq, d = q.shape
        group = hq // k.shape[2]
        kk, vv = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
        x = jnp.einsum("bihd,bjhd->bhij", q, kk, preferred_element_type=jnp.float32) * d ** -0.5
        if softcap:
            x = softcap * jnp.tanh(x / softcap)
        if causal:
            x = jnp.where(jnp.tril(jnp.ones((t, k.shape[1]), bool)), x, -jnp.inf)
        if sinks is not None:
            a = jnp.broadcast_to(sinks[None, :, None, :], (*x.shape[:3], sinks.shape[-1]))
            x = jnp.concatenate([x, a], axis=-1)
        p = jax.nn.softmax(x, axis=-1)[..., :k.shape[1]].astype(q.dtype)
        return jnp.einsum("bhij,bjhd->bihd", p, vv)
    return attention


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="2,8192,16,16,128", help="B,T,Hq,Hkv,D")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--causal", type=int, default=-1, help="0 or 1 (default: both)")
    args = ap.parse_args()
    b, t, hq, hkv, d = (int(x) for x in args.shape.split(","))
    rng = np.random.default_rng(0)
    dt = jnp.bfloat16
    q = jnp.asarray(rng.standard_normal((b, t, hq, d)), dt)
    k, v = (jnp.asarray(rng.standard_normal((b, t, hkv, d)), dt) for _ in range(2))
    dout = jnp.asarray(rng.standard_normal((b, t, hq, d)), dt)
    sinks = jnp.asarray(rng.standard_normal((hq, 1)), jnp.float32)
    print(f"# {jax.devices()[0].device_kind}, jax {jax.__version__}, libattn "
          f"{libattn.__version__}; B={b} T={t} Hq={hq} Hkv={hkv} D={d} bf16, fwd+bwd under jit, "
          f"median of {args.iters}")
    print("| causal | path | plan | ms | TFLOPS | vs JAX cuDNN | max err |")
    print("|---|---|---|---|---|---|---|")
    for causal in ([0, 1] if args.causal < 0 else [args.causal]):
        flops = 3.5 * 4 * b * hq * t * t * d / (2 if causal else 1)
        c = bool(causal)
        rows = [
            ("jax.nn cudnn", None, lambda q, k, v: jax.nn.dot_product_attention(
                q, k, v, is_causal=c, implementation="cudnn")),
            ("jax.nn xla", None, lambda q, k, v: jax.nn.dot_product_attention(
                q, k, v, is_causal=c, implementation="xla")),
            ("libattn sdpa (auto)", ("sdpa", ""), lambda q, k, v: lj.scaled_dot_product_attention(
                q, k, v, causal=c)),
            ("libattn flash (auto)", ("flash", ""), lambda q, k, v: lj.flash_attention(
                q, k, v, causal=c)),
            ("libattn flash cfg=cudnn", ("flash", "cudnn"), lambda q, k, v: lj.flash_attention(
                q, k, v, causal=c, cfg="cudnn")),
            ("libattn flash cfg=cuda", ("flash", "cuda"), lambda q, k, v: lj.flash_attention(
                q, k, v, causal=c, cfg="cuda")),
            ("libattn cuda + sinks", ("flash", "cuda", "sinks"),
             lambda q, k, v: lj.flash_attention(q, k, v, None, None, None, sinks, causal=c,
                                                cfg="cuda")),
            ("xla + sinks", None, xla_attention(sinks=sinks, causal=c)),
            ("libattn cuda + softcap 30", ("flash", "cuda", "softcap"),
             lambda q, k, v: lj.flash_attention(q, k, v, causal=c, logits_soft_cap=30.0,
                                                cfg="cuda")),
            ("xla + softcap 30", None, xla_attention(softcap=30.0, causal=c)),
        ]
        refs = {}
        base = None
        for name, what, attention in rows:
            try:
                step = step_of(attention)
                out = step(q, k, v, dout)[0]
            except Exception as e:  # a path that refuses the problem
                print(f"| {causal} | {name} | - | - | - | - | {type(e).__name__}: "
                      f"{str(e).splitlines()[0][:80]} |")
                continue
            key = "sinks" if "sinks" in name else "softcap" if "softcap" in name else "plain"
            if name.startswith("xla") or name == "jax.nn xla":
                refs[key] = out
            ref = refs.get(key)
            if ref is None:  # the XLA row of a feature comes after libattn's: compute it now
                ref = jax.jit(xla_attention(sinks=sinks if key == "sinks" else None,
                                            softcap=30.0 if key == "softcap" else 0.0,
                                            causal=c))(q, k, v)
                refs[key] = ref
            err = float(jnp.abs(out.astype(jnp.float32) - ref.astype(jnp.float32)).max() /
                        jnp.abs(ref.astype(jnp.float32)).max())
            ms = median_ms(step, (q, k, v, dout), args.iters)
            if name == "jax.nn cudnn":
                base = ms
            plan = "-"
            if what is not None:
                device = " device=cuda" if jax.default_backend() == "gpu" else ""
                problem = (f"b{b} hq{hq} hkv{hkv} sq{t} d{d} bf16{device}"
                           + (" causal" if c else "") + (" op=sdpa" if what[0] == "sdpa" else "")
                           + (" sinks=1" if "sinks" in what else "")
                           + (" softcap=30" if "softcap" in what else ""))
                try:
                    p = libattn.plan(problem, impl=what[1] or None)
                    plan = f"{p.impl}/{p.config}"
                except libattn.Error as e:
                    plan = f"? ({str(e)[:60]})"
            ratio = f"{base / ms:.2f}x" if base else "-"
            print(f"| {causal} | {name} | {plan} | {ms:.2f} | {flops / ms / 1e9:.0f} | {ratio} | "
                  f"{err:.1e} |", flush=True)


if __name__ == "__main__":
    main()
