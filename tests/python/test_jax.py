"""libattn.jax on the CPU: every function and feature against SPEC.md's float64 NumPy reference
(jax_reference.py) and jax.nn.dot_product_attention, gradients (check_grads), jit, vmap, remat,
shard_map over 2 and 4 devices (batch, heads, ring over the sequence) equal to the unsharded call,
the executor objects, and bad input. conftest.py gives XLA 4 host devices before JAX starts.
Random inputs from the printed seed of the `seed` fixture; odd sizes.
"""
import os

import numpy as np
import pytest

jax = pytest.importorskip("jax")  # make test-python installs jax: CI never skips
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, PartitionSpec as P  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

jax.config.update("jax_enable_x64", True)

import libattn  # noqa: E402
import libattn.jax as lj  # noqa: E402
from jax_reference import reference, reference_packed  # noqa: E402


def arrays(rng, *shapes, dtype=jnp.float32):
    return [jnp.asarray(rng.standard_normal(s), dtype) for s in shapes]


def qkv(rng, b=2, tq=5, tk=7, hq=4, hkv=2, d=8, dv=None, dtype=jnp.float32):
    return arrays(rng, (b, tq, hq, d), (b, tk, hkv, d), (b, tk, hkv, dv or d), dtype=dtype)


def close(a, ref, tol=1e-4):
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    assert a.shape == ref.shape, (a.shape, ref.shape)
    err = np.abs(a - ref).max() if a.size else 0.0
    assert err <= tol * max(1.0, np.abs(ref).max() if ref.size else 0), f"max error {err}"


# ---- the oracle, anchored to JAX ----------------------------------------------------------------


def test_reference_matches_jax(seed):
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng, tq=6, tk=6, dtype=jnp.float64)
    bias = jnp.asarray(rng.standard_normal((2, 4, 6, 6)))
    mask = jnp.asarray(rng.random((2, 1, 6, 6)) > 0.3).at[..., 0].set(True)  # no empty row
    for kw, jkw in (({}, {}), (dict(causal=True, top_left=True), dict(is_causal=True)),
                    (dict(bias=bias), dict(bias=bias)), (dict(mask=mask), dict(mask=mask)),
                    (dict(window=(2, 1), top_left=True), dict(local_window_size=(2, 1))),
                    (dict(scale=0.3), dict(scale=0.3))):
        out, _ = reference(q, k, v, **kw)
        # (jax.nn computes its logits in float32, even for float64 inputs.)
        close(out, jax.nn.dot_product_attention(q, k, v, implementation="xla", **jkw), 1e-6)


# ---- flash_attention: every feature --------------------------------------------------------------


FEATURES = {
    "plain": ({}, {}),
    "causal": (dict(causal=True), dict(causal=True)),
    "window_int": (dict(sliding_window=2), dict(window=(2, 2))),
    "window_pair": (dict(sliding_window=(3, 0)), dict(window=(3, 0))),
    "causal_window": (dict(causal=True, sliding_window=(2, 5)), dict(causal=True, window=(2, 5))),
    "softcap": (dict(logits_soft_cap=1.5), dict(softcap=1.5)),
    "scale": (dict(softmax_scale=0.7), dict(scale=0.7)),
}


@pytest.mark.parametrize("feature", sorted(FEATURES))
@pytest.mark.parametrize("shape", [(2, 5, 7, 4, 2, 8, 8), (1, 17, 3, 3, 1, 5, 7),
                                   (3, 9, 9, 2, 2, 16, 16)])
def test_flash_features(seed, feature, shape):
    rng = np.random.default_rng(seed)
    b, tq, tk, hq, hkv, d, dv = shape
    q, k, v = qkv(rng, b, tq, tk, hq, hkv, d, dv)
    kw, rkw = FEATURES[feature]
    out = lj.flash_attention(q, k, v, **kw)
    close(out, reference(q, k, v, **rkw)[0])


def test_flash_bias_mask_sinks_segments(seed):
    rng = np.random.default_rng(seed)
    b, tq, tk, hq, hkv = 2, 7, 9, 4, 2
    q, k, v = qkv(rng, b, tq, tk, hq, hkv)
    for bshape in ((b, hq, tq, tk), (1, hkv, tq, tk), (b, 1, 1, tk), (1, 1, tq, 1)):
        bias = jnp.asarray(rng.standard_normal(bshape), jnp.float32)
        close(lj.flash_attention(q, k, v, bias), reference(q, k, v, bias=bias)[0])
    mask = jnp.asarray(rng.random((b, hq, tq, tk)) > 0.4)
    close(lj.flash_attention(q, k, v, attention_mask=mask), reference(q, k, v, mask=mask)[0])
    close(lj.flash_attention(q, k, v, mask_info=mask), reference(q, k, v, mask=mask)[0])
    for sshape in ((hq, 3), (2,)):
        sinks = jnp.asarray(rng.standard_normal(sshape), jnp.float32)
        close(lj.flash_attention(q, k, v, None, None, None, sinks, causal=True),
              reference(q, k, v, sinks=sinks, causal=True)[0])
    qs = jnp.asarray(rng.integers(-1, 3, (b, tq)), jnp.int32)
    ks = jnp.asarray(rng.integers(0, 3, (b, tk)), jnp.int32)
    close(lj.flash_attention(q, k, v, q_segment_ids=qs, kv_segment_ids=ks),
          reference(q, k, v, q_segment_ids=qs, kv_segment_ids=ks)[0])
    # Everything at once.
    bias = jnp.asarray(rng.standard_normal((b, hq, tq, tk)), jnp.float32)
    sinks = jnp.asarray(rng.standard_normal((hq, 2)), jnp.float32)
    out = lj.flash_attention(q, k, v, bias, None, None, sinks, attention_mask=mask, causal=True,
                             sliding_window=(4, 0), logits_soft_cap=2.0, softmax_scale=0.5,
                             q_segment_ids=qs, kv_segment_ids=ks)
    close(out, reference(q, k, v, bias=bias, mask=mask, sinks=sinks, causal=True, window=(4, 0),
                         softcap=2.0, scale=0.5, q_segment_ids=qs, kv_segment_ids=ks)[0])


def test_flash_packed(seed):
    rng = np.random.default_rng(seed)
    lens_q, lens_k = [3, 0, 6, 1], [4, 2, 6, 5]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q, k, v = arrays(rng, (cu_q[-1], 4, 8), (cu_k[-1], 2, 8), (cu_k[-1], 2, 8))
    for causal in (False, True):
        out = lj.flash_attention(q, k, v, None, jnp.asarray(cu_q), jnp.asarray(cu_k),
                                 causal=causal)
        want = reference_packed(q, k, v, cu_q, cu_k, causal=causal)
        close(out, want)
        # ejKernel's [1, total, H, D] form.
        out4 = lj.flash_attention(q[None], k[None], v[None], None, jnp.asarray(cu_q),
                                  jnp.asarray(cu_k), causal=causal)
        close(out4[0], want)


def test_low_precision(seed):
    rng = np.random.default_rng(seed)
    for dtype in (jnp.bfloat16, jnp.float16):
        q, k, v = qkv(rng, 2, 33, 65, 4, 2, 16, dtype=dtype)
        out = lj.flash_attention(q, k, v, causal=True)
        assert out.dtype == dtype
        want = reference(q, k, v, causal=True)[0]
        # SPEC.md's rule: twice a naive same-dtype computation's error plus 1e-3 max|ref|.
        naive = jax.nn.dot_product_attention(  # bottom-right causal as a mask
            q, k, v, mask=jnp.asarray(np.tril(np.ones((33, 65), bool), 65 - 33)))
        naive_err = np.abs(np.asarray(naive, np.float64) - want).max()
        err = np.abs(np.asarray(out, np.float64) - want).max()
        assert err <= 2 * naive_err + 1e-3 * np.abs(want).max(), (dtype, err, naive_err)


# ---- scaled_dot_product_attention: jax.nn.dot_product_attention's meaning -------------------------


def test_sdpa_matches_jax(seed):
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng, 2, 9, 13, 6, 3, 8)
    bias = jnp.asarray(rng.standard_normal((2, 6, 9, 13)), jnp.float32)
    for kw, jkw in (({}, {}), (dict(causal=True), dict(is_causal=True)),
                    (dict(softmax_scale=0.4), dict(scale=0.4)),
                    (dict(sliding_window=(3, 2)), dict(local_window_size=(3, 2))),
                    (dict(causal=True, sliding_window=(4, 0)),
                     dict(is_causal=True, local_window_size=(4, 0)))):
        out = lj.scaled_dot_product_attention(q, k, v, **kw)
        close(out, jax.nn.dot_product_attention(q, k, v, implementation="xla", **jkw))
    close(lj.scaled_dot_product_attention(q, k, v, bias),
          jax.nn.dot_product_attention(q, k, v, bias=bias))
    close(lj.scaled_dot_product_attention(q, k, v, init_bias=lambda: bias),
          jax.nn.dot_product_attention(q, k, v, bias=bias))
    mask = jnp.asarray(rng.random((2, 1, 9, 13)) > 0.2).at[..., 0].set(True)
    close(lj.scaled_dot_product_attention(q, k, v, mask_info=mask),
          jax.nn.dot_product_attention(q, k, v, mask=mask))


# ---- gradients ----------------------------------------------------------------------------------


def test_check_grads(seed):
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng, 1, 3, 5, 2, 1, 4, 3, dtype=jnp.float64)
    bias = jnp.asarray(rng.standard_normal((1, 2, 3, 5)))
    sinks = jnp.asarray(rng.standard_normal((2, 2)))

    def f(q, k, v, bias, sinks):
        return lj.flash_attention(q, k, v, bias, None, None, sinks, causal=True,
                                  logits_soft_cap=3.0)
    check_grads(f, (q, k, v, bias, sinks), order=1, modes=["rev"], eps=1e-5)

    def g(q, k, v, bias):
        return lj.scaled_dot_product_attention(q, k, v, bias, causal=True)
    check_grads(g, (q, k, v, bias), order=1, modes=["rev"], eps=1e-5)
    # Broadcast bias and shared sinks: gradients summed over the broadcast dimensions.
    bias1 = jnp.asarray(rng.standard_normal((1, 1, 3, 1)))
    sinks1 = jnp.asarray(rng.standard_normal((1,)))
    check_grads(lambda q, k, v, b, s: lj.flash_attention(q, k, v, b, None, None, s),
                (q, k, v, bias1, sinks1), order=1, modes=["rev"], eps=1e-5)


def test_grads_match_jax(seed):
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng, 2, 17, 17, 4, 2, 8)
    bias = jnp.asarray(rng.standard_normal((2, 4, 17, 17)), jnp.float32)

    def loss(fn):
        return lambda q, k, v, b: jnp.sum(jnp.sin(fn(q, k, v, b)))
    mine = jax.value_and_grad(loss(lambda q, k, v, b: lj.scaled_dot_product_attention(
        q, k, v, b, causal=True)), argnums=(0, 1, 2, 3))(q, k, v, bias)
    theirs = jax.value_and_grad(loss(lambda q, k, v, b: jax.nn.dot_product_attention(
        q, k, v, b, is_causal=True)), argnums=(0, 1, 2, 3))(q, k, v, bias)
    close(mine[0], theirs[0])
    for a, b in zip(mine[1], theirs[1]):
        close(a, b, 2e-4)


# ---- transformations ------------------------------------------------------------------------------


def test_jit_vmap_remat(seed):
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng, 2, 5, 7, 4, 2, 8)
    sinks = jnp.asarray(rng.standard_normal((4, 1)), jnp.float32)

    def f(q, k, v):
        return lj.flash_attention(q, k, v, None, None, None, sinks, causal=True)
    want = f(q, k, v)
    close(jax.jit(f)(q, k, v), want, 1e-6)
    loss = lambda q, k, v: jnp.sum(f(q, k, v) ** 2)  # noqa: E731
    grads = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(jax.jit(jax.grad(jax.checkpoint(loss), argnums=(0, 1, 2)))(q, k, v), grads):
        close(a, b, 1e-6)
    # vmap over a leading axis: each slice as its own call.
    qs, ks, vs = (jnp.stack([x, x[::-1] * 0.5, -x]) for x in (q, k, v))
    out = jax.jit(jax.vmap(f))(qs, ks, vs)
    for i in range(3):
        close(out[i], f(qs[i], ks[i], vs[i]), 1e-6)
    gv = jax.vmap(jax.grad(loss, argnums=(0, 1, 2)))(qs, ks, vs)
    for i in range(3):
        for a, b in zip(gv, jax.grad(loss, argnums=(0, 1, 2))(qs[i], ks[i], vs[i])):
            close(a[i], b, 1e-6)


def test_vmap_stacks_or_slices(seed):
    """vmap reaches the handler as one call with a leading axis: stacked into the batch when every
    input stacks (bias with a full batch dimension, segment ids), else run slice by slice (a
    broadcast bias, sinks, packed sequences); both equal the per-slice calls, with gradients."""
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng, 2, 5, 7, 4, 2, 8, 3)
    n = 3
    qs, ks, vs = (jnp.asarray(rng.standard_normal((n, *x.shape)), jnp.float32) for x in (q, k, v))
    bias_full = jnp.asarray(rng.standard_normal((n, 2, 4, 5, 7)), jnp.float32)
    bias_bcast = jnp.asarray(rng.standard_normal((n, 1, 1, 5, 7)), jnp.float32)
    seg = jnp.asarray(rng.integers(0, 2, (n, 2, 7)), jnp.int32)
    for bias in (bias_full, bias_bcast):
        def f(q, k, v, b, s):
            return lj.flash_attention(q, k, v, b, causal=True, q_segment_ids=s[:, :5],
                                      kv_segment_ids=s)
        out = jax.jit(jax.vmap(f))(qs, ks, vs, bias, seg)
        loss = lambda *a: jnp.sum(jnp.sin(f(*a)))  # noqa: E731
        grads = jax.vmap(jax.grad(loss, argnums=(0, 1, 2, 3)))(qs, ks, vs, bias, seg)
        for i in range(n):
            close(out[i], f(qs[i], ks[i], vs[i], bias[i], seg[i]), 1e-6)
            for a, b in zip(grads, jax.grad(loss, argnums=(0, 1, 2, 3))(
                    qs[i], ks[i], vs[i], bias[i], seg[i])):
                close(a[i], b, 1e-6)
    # An unbatched key/value is broadcast to every slice.
    out = jax.vmap(lambda q: lj.flash_attention(q, k, v))(qs)
    for i in range(n):
        close(out[i], lj.flash_attention(qs[i], k, v), 1e-6)


def test_dropout_same_bits_as_torch(seed):
    torch = pytest.importorskip("torch")
    import libattn.torch as lt
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng, 2, 9, 11, 4, 2, 8)
    f = jax.jit(lambda q, k, v: lj.flash_attention(q, k, v, dropout_prob=0.3, dropout_seed=seed,
                                                   causal=True))
    out = f(q, k, v)
    close(out, f(q, k, v), 0)
    assert np.abs(np.asarray(out) - np.asarray(lj.flash_attention(
        q, k, v, dropout_prob=0.3, dropout_seed=seed + 1, causal=True))).max() > 1e-3
    tq, tk, tv = (torch.from_numpy(np.array(x)) for x in (q, k, v))
    want = lt.attention(tq, tk, tv, dropout_p=0.3, dropout_seed=seed, causal=True)
    close(out, want.numpy(), 1e-5)


# ---- shard_map ------------------------------------------------------------------------------------


def mesh_of(n, names):
    devices = np.array(jax.devices()[:int(np.prod(n))]).reshape(n)
    return Mesh(devices, names)


@pytest.mark.parametrize("n", [2, 4])
def test_shard_batch_heads(seed, n):
    assert len(jax.devices()) >= 4, "conftest.py sets XLA_FLAGS for 4 host devices"
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng, 4, 7, 9, 8, 4, 8)
    sinks = jnp.asarray(rng.standard_normal((8, 2)), jnp.float32)
    want = lj.flash_attention(q, k, v, None, None, None, sinks, causal=True)
    loss = lambda fn: lambda q, k, v, s: jnp.sum(jnp.cos(fn(q, k, v, s)))  # noqa: E731
    want_g = jax.grad(loss(lambda q, k, v, s: lj.flash_attention(
        q, k, v, None, None, None, s, causal=True)), argnums=(0, 1, 2, 3))(q, k, v, sinks)
    for specs in ((P("x"), P("x"), P("x"), None, None, P()),
                  (P(None, None, "x"), P(None, None, "x"), P(None, None, "x"), None, None,
                   P("x"))):
        mesh = mesh_of((n,), ("x",))

        def sharded(q, k, v, s, specs=specs, mesh=mesh):
            return lj.flash_attention(q, k, v, None, None, None, s, causal=True, mesh=mesh,
                                      in_specs=specs, out_specs=specs[0])
        close(jax.jit(sharded)(q, k, v, sinks), want, 1e-6)
        for a, b in zip(jax.jit(jax.grad(loss(sharded), argnums=(0, 1, 2, 3)))(q, k, v, sinks),
                        want_g):
            close(a, b, 1e-5)


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_ring(seed, n, causal):
    rng = np.random.default_rng(seed)
    t = 8 * n * 3 // 2  # divisible by 2n (zigzag chunks)
    q, k, v = qkv(rng, 2, t, t, 4, 2, 8, 5)
    sinks = jnp.asarray(rng.standard_normal((4, 2)), jnp.float32)
    qs = jnp.asarray(np.sort(rng.integers(0, 3, (2, t)), axis=1), jnp.int32)
    kw = dict(causal=causal, logits_soft_cap=4.0)
    mesh = mesh_of((n,), ("sp",))
    seq = P(None, "sp")
    specs = (seq, seq, seq, None, None, P(), None, None, seq, seq)

    def plain(q, k, v, s):
        return lj.flash_attention(q, k, v, None, None, None, s, q_segment_ids=qs,
                                  kv_segment_ids=qs, **kw)

    def ring(q, k, v, s):
        return lj.flash_attention(q, k, v, None, None, None, s, q_segment_ids=qs,
                                  kv_segment_ids=qs, mesh=mesh, in_specs=specs, out_specs=seq,
                                  **kw)
    close(jax.jit(ring)(q, k, v, sinks), reference(
        q, k, v, sinks=sinks, causal=causal, softcap=4.0, q_segment_ids=qs,
        kv_segment_ids=qs)[0])
    close(jax.jit(ring)(q, k, v, sinks), plain(q, k, v, sinks), 1e-5)
    loss = lambda fn: lambda *a: jnp.sum(jnp.sin(fn(*a)))  # noqa: E731
    mine = jax.jit(jax.grad(loss(ring), argnums=(0, 1, 2, 3)))(q, k, v, sinks)
    want = jax.grad(loss(plain), argnums=(0, 1, 2, 3))(q, k, v, sinks)
    for name, a, b in zip(("dq", "dk", "dv", "dsinks"), mine, want):
        try:
            close(a, b, 1e-4)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from None


def test_ring_with_batch_and_heads(seed):
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng, 2, 16, 16, 4, 2, 8)
    mesh = mesh_of((2, 2), ("dp", "sp"))
    spec = P("dp", "sp")
    out = jax.jit(lambda q, k, v: lj.flash_attention(q, k, v, causal=True, mesh=mesh,
                                                     in_specs=(spec, spec, spec),
                                                     out_specs=spec))(q, k, v)
    close(out, reference(q, k, v, causal=True)[0])


# ---- the executor objects and the mechanism names --------------------------------------------------


def test_executor_objects(seed, tmp_path):
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng, 1, 9, 9, 2, 2, 8)
    want = reference(q, k, v, causal=True)[0]
    close(lj.create_default_executor()(lj.FlashAttention(), q, k, v, causal=True), want)
    close(lj.FlashAttention()(q, k, v, causal=True), want)
    path = tmp_path / "tuned.txt"
    executor = lj.Executor(lj.ConfigSelectorChain(
        cache=lj.ConfigCache(),
        policy=lj.AutotunePolicy(allow_autotune=True, cache_miss_fallback="autotune"),
        tuner=lj.Tuner(warmup=1, iters=2), persistent=lj.PersistentCache(str(path))))
    assert executor.policy()["autotune"] and executor.policy()["cache_path"] == str(path)
    # The chain's policy reaches the FFI handler, whose executor tunes and writes the file.
    out = jax.jit(lambda q, k, v: executor(lj.FlashAttention(), q, k, v, causal=True))(q, k, v)
    close(out, want)
    entries = libattn._core.read_cache_file(str(path))
    assert any("sq9" in e["problem"] for e in entries), entries
    close(executor(lj.ScaledDotProductAttention(), q, k, v, causal=True),
          reference(q, k, v, causal=True, top_left=True)[0])
    lj.ConfigCache().clear()  # the next trace plans again (the file keeps the tuned entry)
    close(executor(lj.FlashAttention(), q, k, v, causal=True), want)
    with pytest.raises(ValueError, match="cache_miss_fallback"):
        lj.Executor(lj.ConfigSelectorChain(policy=lj.AutotunePolicy(
            cache_miss_fallback="sometimes")))(lj.FlashAttention(), q, k, v)


def test_mechanisms(seed):
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng, 1, 5, 5, 2, 2, 8)
    want = reference(q, k, v, causal=True)[0]
    for name in ("vanilla", "flash", "sdpa", "ref", "cpu", "auto", "xla", "triton", None):
        close(lj.flash_attention(q, k, v, causal=True, platform=name), want)
    assert lj.select_mechanism("sdpa") == ("sdpa", "auto")
    assert lj.select_mechanism("vanilla") == (None, "ref")
    assert lj.select_mechanism("cudnn") == (None, "cudnn")
    if jax.default_backend() == "cpu":
        with pytest.raises(libattn.Unsupported):
            lj.flash_attention(q, k, v, platform="cudnn")
    close(lj.flash_attention(q, k, v, causal=True, cfg="ref"), want)


# ---- bad input ------------------------------------------------------------------------------------


def test_bad_input(seed):
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng, 2, 5, 7, 4, 2, 8)
    cases = [
        (lambda: lj.flash_attention(q, k[..., :4], v), "key"),
        (lambda: lj.flash_attention(q, k.astype(jnp.float16), v), "key"),
        (lambda: lj.flash_attention(q, k, v[:, :3]), "value"),
        (lambda: lj.flash_attention(q[0], k, v), "query"),
        (lambda: lj.flash_attention(q.astype(jnp.int32), k, v), "query"),
        (lambda: lj.flash_attention(q, k[:, :, :1].repeat(3, 2), v[:, :, :1].repeat(3, 2)),
         "key"),
        (lambda: lj.flash_attention(q, k, v, jnp.zeros((2, 4, 5, 6))), "bias"),
        (lambda: lj.flash_attention(q, k, v, None, None, None, jnp.zeros((3, 2))),
         "softmax_aux"),
        (lambda: lj.flash_attention(q, k, v, attention_mask=jnp.ones((2, 4, 5, 8), bool)),
         "attention_mask"),
        (lambda: lj.flash_attention(q, k, v, q_segment_ids=jnp.zeros((2, 5), jnp.int32)),
         "kv_segment_ids"),
        (lambda: lj.flash_attention(q, k, v, q_segment_ids=jnp.zeros((2, 4), jnp.int32),
                                    kv_segment_ids=jnp.zeros((2, 7), jnp.int32)),
         "q_segment_ids"),
        (lambda: lj.flash_attention(q, k, v, dropout_prob=1.5), "dropout_prob"),
        (lambda: lj.flash_attention(q, k, v, dropout_prob=0.1), "dropout_seed"),
        (lambda: lj.flash_attention(q, k, v, sliding_window=(1, 2, 3)), "sliding_window"),
        (lambda: lj.flash_attention(q, k, v, sliding_window=-4), "sliding_window"),
        (lambda: lj.flash_attention(q, k, v, softmax_scale=-1.0), "softmax_scale"),
        (lambda: lj.flash_attention(q, k, v, logits_soft_cap=-1.0), "logits_soft_cap"),
        (lambda: lj.flash_attention(q, k, v, normalize_output=False), "normalize_output"),
        (lambda: lj.flash_attention(q, k, v, platform="tpu"), "platform"),
        (lambda: lj.flash_attention(q, k, v, in_specs=(P(),) * 3), "in_specs"),
        (lambda: lj.flash_attention(q[0], k[0], v[0], None, jnp.asarray([0, 5], jnp.int32)),
         "cum_seqlens"),
        (lambda: lj.flash_attention(q, k, v, mesh=mesh_of((2,), ("x",))), "in_specs"),
        (lambda: lj.flash_attention(q, k, v, bias=None), None),  # positional-only: TypeError
    ]
    for fn, name in cases:
        with pytest.raises((ValueError, TypeError)) as info:
            fn()
        if name is not None:
            assert name in str(info.value), (name, str(info.value))


def test_ring_refuses_what_it_cannot_do(seed):
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng, 2, 8, 8, 4, 2, 8)
    mesh = mesh_of((2,), ("sp",))
    seq = P(None, "sp")
    bias = jnp.zeros((2, 4, 8, 8))
    with pytest.raises(ValueError, match="bias"):
        lj.flash_attention(q, k, v, bias, mesh=mesh, in_specs=(seq, seq, seq, None, P()))
    with pytest.raises(ValueError, match="sliding_window"):
        lj.flash_attention(q, k, v, sliding_window=2, mesh=mesh, in_specs=(seq, seq, seq))
    with pytest.raises(ValueError, match="query"):
        lj.flash_attention(q[:, :6], k[:, :6], v[:, :6], causal=True, mesh=mesh,
                           in_specs=(seq, seq, seq))


def test_readme_example():
    """The README's JAX example, run as written."""
    here = os.path.dirname(os.path.abspath(__file__))
    readme = open(os.path.join(here, "..", "..", "README.md"), encoding="utf-8").read()
    start = readme.index("```python\nimport jax")
    code = readme[start + len("```python\n"):readme.index("```", start + 10)]
    exec(compile(code, "README.md", "exec"), {})
