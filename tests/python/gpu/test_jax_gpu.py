"""libattn.jax on a CUDA device: the CUDA FFI handlers (XLA's stream, workspace from XLA's
scratch allocator) for the cuda and cudnn implementations, forward and backward under jit,
against SPEC.md's float64 reference with its low-precision rule: the error is at most twice that
of a naive computation in the same dtype (jax.nn.dot_product_attention's XLA path) plus
1e-3 * max |reference| (three times for gradients). Run on a GPU machine (make test-python does
not collect this folder):

    python3 -m pytest -q tests/python/gpu/test_jax_gpu.py
"""
import os
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

jax.config.update("jax_enable_x64", True)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import libattn  # noqa: E402
import libattn.jax as lj  # noqa: E402
from jax_reference import reference  # noqa: E402

if jax.default_backend() != "gpu":
    pytest.skip("JAX has no GPU backend", allow_module_level=True)

IMPLS = [i["name"] for i in libattn.info()["implementations"] if i["device"] == "cuda"]


def naive(q, k, v, bias=None, causal=False):
    """The same-dtype computation the rule compares with (bottom-right causal as a mask)."""
    tq, tk = q.shape[1], k.shape[1]
    mask = jnp.asarray(np.tril(np.ones((tq, tk), bool), tk - tq)) if causal else None
    return jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, implementation="xla")


def run(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except libattn.Unsupported as e:
        pytest.skip(f"unsupported: {e}")


def within(mine, want, peer, factor):
    mine, want, peer = (np.asarray(x, np.float64) for x in (mine, want, peer))
    err = np.abs(mine - want).max()
    bound = factor * np.abs(peer - want).max() + 1e-3 * np.abs(want).max()
    assert err <= bound, f"error {err} > {bound}"


def grads_f64(fn, args, dout):
    """The gradients of sum(fn(...) * dout) by JAX's own autodiff in float64 (jax.nn's logits
    are float32 even there: 1e-7, far below the low-precision errors compared)."""
    args = [x.astype(jnp.float64) for x in args]
    dout = dout.astype(jnp.float64)
    # Jitted: one compilation, not one per operation (eager float64 on a GPU compiles each op).
    return jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a) * dout),
                            argnums=tuple(range(len(args)))))(*args)


@pytest.mark.parametrize("impl", IMPLS or ["none"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_backward(seed, impl, dtype, causal):
    if impl == "none":
        pytest.skip("no GPU implementation")
    rng = np.random.default_rng(seed)
    b, tq, tk, hq, hkv, d = 2, 129, 257, 8, 2, 64
    dt = jnp.dtype(dtype)
    q, k, v = (jnp.asarray(rng.standard_normal(s), dt)
               for s in ((b, tq, hq, d), (b, tk, hkv, d), (b, tk, hkv, d)))
    dout = jnp.asarray(rng.standard_normal((b, tq, hq, d)), dt)

    def f(q, k, v):
        return lj.flash_attention(q, k, v, causal=causal, cfg=impl)
    out = run(jax.jit(f), q, k, v)
    want = reference(q, k, v, causal=causal)[0]
    within(out, want, jax.jit(naive, static_argnames="causal")(q, k, v, causal=causal), 2)
    grads = run(jax.jit(jax.grad(lambda *a: jnp.sum(f(*a).astype(jnp.float32) * dout),
                                 argnums=(0, 1, 2))), q, k, v)
    want_g = grads_f64(lambda q, k, v: naive(q, k, v, causal=causal), (q, k, v), dout)
    peer_g = jax.jit(jax.grad(
        lambda *a: jnp.sum(naive(*a, causal=causal).astype(jnp.float32) * dout),
        argnums=(0, 1, 2)))(q, k, v)
    for mine, w, p in zip(grads, want_g, peer_g):
        within(mine, w, p, 3)


@pytest.mark.parametrize("feature", ["sinks", "softcap", "bias", "segments", "window"])
def test_features_cuda(seed, feature):
    if "cuda" not in IMPLS:
        pytest.skip("no cuda implementation")
    rng = np.random.default_rng(seed)
    b, t, hq, hkv, d = 2, 200, 4, 2, 128
    q, k, v = (jnp.asarray(rng.standard_normal(s), jnp.bfloat16)
               for s in ((b, t, hq, d), (b, t, hkv, d), (b, t, hkv, d)))
    kw, rkw = {"causal": True}, {"causal": True}
    args = [q, k, v]
    if feature == "sinks":
        sinks = jnp.asarray(rng.standard_normal((hq, 2)), jnp.float32)
        args += [None, None, None, sinks]
        rkw["sinks"] = sinks
    elif feature == "softcap":
        kw["logits_soft_cap"] = rkw["softcap"] = 5.0
    elif feature == "bias":
        bias = jnp.asarray(rng.standard_normal((b, hq, t, t)), jnp.bfloat16)
        args.append(bias)
        rkw["bias"] = bias
    elif feature == "segments":
        seg = jnp.asarray(np.sort(rng.integers(0, 3, (b, t)), axis=1), jnp.int32)
        kw.update(q_segment_ids=seg, kv_segment_ids=seg)
        rkw.update(q_segment_ids=seg, kv_segment_ids=seg)
    else:
        kw["sliding_window"] = (31, 0)
        rkw["window"] = (31, 0)
    f = jax.jit(lambda *a: lj.flash_attention(*a, cfg="cuda", **kw))
    out = run(f, *args)
    want = reference(q, k, v, **rkw)[0]
    err = np.abs(np.asarray(out, np.float64) - want).max()
    assert err <= 2e-2 * max(1.0, np.abs(want).max()), err  # bf16 inputs, f32 accumulation
    grads = run(jax.jit(jax.grad(lambda *a: jnp.sum(f(*a).astype(jnp.float32)),
                                 argnums=tuple(range(3)))), *args)
    assert all(bool(jnp.isfinite(g.astype(jnp.float32)).all()) for g in grads)


def test_sdpa_matches_jax_cudnn(seed):
    rng = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(rng.standard_normal((2, 256, 8, 128)), jnp.bfloat16)
               for _ in range(3))
    mine = jax.jit(lambda q, k, v: lj.scaled_dot_product_attention(q, k, v, causal=True))
    theirs = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(
        q, k, v, is_causal=True, implementation="cudnn"))
    a, b = mine(q, k, v), theirs(q, k, v)
    assert np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32)).max() < 2e-2
