"""libattn.jax with jnp.float8_e4m3fn inputs (docs/FP8.md): descale factors, out dtypes, jit and
vmap, forward only, bad input. The oracle is jax_reference.py in float64 on the decoded e4m3
values times their factors (exact in float64). Random inputs from the printed seed; odd sizes.
"""
import numpy as np
import pytest

jax = pytest.importorskip("jax")  # make test-python installs jax: CI never skips
import jax.numpy as jnp  # noqa: E402

import libattn.jax as lj  # noqa: E402
from jax_reference import reference  # noqa: E402

F8 = jnp.float8_e4m3fn
# The bound of out as a fraction of max|reference| per out dtype (test_torch_fp8.py says why).
OUT_TOL = {jnp.dtype(jnp.float32): 1e-5, jnp.dtype(jnp.float16): 2e-3,
           jnp.dtype(jnp.bfloat16): 2.0 ** -6}


def fp8(rng, *shape):
    return jnp.asarray(rng.standard_normal(shape) * 2.0, jnp.float32).astype(F8)


def factors(rng, *shape):
    return jnp.asarray(rng.random(shape) * 1.5 + 0.25, jnp.float32)


def decoded(x, factor, heads):
    """x [B, T, H, D] (e4m3) in float64 times its factor (None, one element or [B, Hkv])."""
    x = np.asarray(x.astype(jnp.float32), np.float64)
    if factor is None:
        return x
    f = np.asarray(factor, np.float64)
    if f.size == 1:
        return x * f.reshape(())
    return x * np.repeat(f, heads // f.shape[1], axis=1)[:, None, :, None]


def check(out, want, dtype=jnp.bfloat16):
    assert out.dtype == jnp.dtype(dtype)
    out, want = np.asarray(out.astype(jnp.float32), np.float64), np.asarray(want)
    scale = max(1e-30, np.abs(want).max())
    err = np.abs(out - want).max()
    assert err <= OUT_TOL[jnp.dtype(dtype)] * scale, f"error {err:.3g} of max|r| {scale:.3g}"


CASES = {
    # name: (b, tq, tk, hq, hkv, d, dv, form, options)
    "bhkv": (2, 5, 7, 4, 2, 8, 8, "bhkv", {}),
    "per_tensor_causal_tq_gt_tk": (2, 9, 4, 4, 2, 8, 8, "tensor", dict(causal=True)),
    "none_gqa_dv": (3, 7, 5, 6, 2, 12, 5, None, {}),
    "everything": (2, 9, 13, 6, 3, 16, 9, "bhkv",
                   dict(causal=True, sliding_window=(4, 0), logits_soft_cap=3.0)),
}


@pytest.mark.parametrize("case", CASES)
def test_flash_attention_fp8(case, seed):
    rng = np.random.default_rng(seed)
    b, tq, tk, hq, hkv, d, dv, form, options = CASES[case]
    q, k, v = fp8(rng, b, tq, hq, d), fp8(rng, b, tk, hkv, d), fp8(rng, b, tk, hkv, dv)
    shape = (b, hkv) if form == "bhkv" else (1,)
    dq, dk, dvv = ((factors(rng, *shape) for _ in range(3)) if form else (None, None, None))
    out = jax.jit(lambda q, k, v, a, b_, c: lj.flash_attention(
        q, k, v, q_descale=a, k_descale=b_, v_descale=c, **options))(q, k, v, dq, dk, dvv)
    want, _ = reference(decoded(q, dq, hq), decoded(k, dk, hkv), decoded(v, dvv, hkv),
                        causal=options.get("causal", False),
                        window=options.get("sliding_window", (-1, -1)),
                        softcap=options.get("logits_soft_cap", 0.0))
    check(out, want)


@pytest.mark.parametrize("out_dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_fp8_out_dtypes_and_partial_descales(out_dtype, seed):
    rng = np.random.default_rng(seed)
    q, k, v = fp8(rng, 2, 6, 4, 8), fp8(rng, 2, 9, 2, 8), fp8(rng, 2, 9, 2, 8)
    dk, dv = factors(rng, 2, 2), factors(rng, 1)  # q's left out (1); v's per tensor
    out = lj.flash_attention(q, k, v, k_descale=dk, v_descale=dv, causal=True,
                             out_dtype=out_dtype)
    want, _ = reference(decoded(q, None, 4), decoded(k, dk, 2), decoded(v, dv, 2), causal=True)
    check(out, want, out_dtype)


def test_fp8_packed_sequences(seed):
    rng = np.random.default_rng(seed)
    cu_q, cu_k = jnp.asarray([0, 3, 4, 10], jnp.int32), jnp.asarray([0, 5, 9, 11], jnp.int32)
    q, k, v = fp8(rng, 10, 4, 8), fp8(rng, 11, 2, 8), fp8(rng, 11, 2, 8)
    dq, dk, dv = (factors(rng, 3, 2) for _ in range(3))
    out = lj.flash_attention(q, k, v, None, cu_q, cu_k, causal=True, q_descale=dq, k_descale=dk,
                             v_descale=dv)
    assert out.dtype == jnp.bfloat16
    for i in range(3):
        sq, sk = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        want, _ = reference(decoded(q[None, sq], dq[i:i + 1], 4),
                            decoded(k[None, sk], dk[i:i + 1], 2),
                            decoded(v[None, sk], dv[i:i + 1], 2), causal=True)
        check(out[None, sq], want)


@pytest.mark.parametrize("form", ["bhkv", "tensor"])
def test_fp8_vmap(form, seed):
    """vmap stacks [B, Hkv] factors into the batch; per-tensor ones go slice by slice."""
    rng = np.random.default_rng(seed)
    n, b, hq, hkv = 3, 2, 4, 2
    qs, ks, vs = fp8(rng, n, b, 5, hq, 8), fp8(rng, n, b, 7, hkv, 8), fp8(rng, n, b, 7, hkv, 8)
    shape = (n, b, hkv) if form == "bhkv" else (n, 1)
    ds = [factors(rng, *shape) for _ in range(3)]
    out = jax.jit(jax.vmap(lambda q, k, v, a, b_, c: lj.flash_attention(
        q, k, v, causal=True, q_descale=a, k_descale=b_, v_descale=c)))(qs, ks, vs, *ds)
    for i in range(n):
        want, _ = reference(decoded(qs[i], ds[0][i], hq), decoded(ks[i], ds[1][i], hkv),
                            decoded(vs[i], ds[2][i], hkv), causal=True)
        check(out[i], want)


def test_fp8_has_no_gradient(seed):
    rng = np.random.default_rng(seed)
    q, k, v = fp8(rng, 1, 3, 2, 8), fp8(rng, 1, 3, 2, 8), fp8(rng, 1, 3, 2, 8)
    with pytest.raises(NotImplementedError, match="query: .*no backward"):
        jax.grad(lambda q: lj.flash_attention(q, k, v).astype(jnp.float32).sum())(q)


def _raises(exc, name, fn, *args, **kwargs):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert str(info.value).startswith(name + ":"), str(info.value)


def test_fp8_bad_input(seed):
    rng = np.random.default_rng(seed)
    q, k, v = fp8(rng, 2, 5, 4, 8), fp8(rng, 2, 7, 2, 8), fp8(rng, 2, 7, 2, 8)
    good = factors(rng, 2, 2)
    fa = lj.flash_attention
    _raises(ValueError, "q_descale", fa, q, k, v, q_descale=factors(rng, 2, 4))
    _raises(TypeError, "k_descale", fa, q, k, v, k_descale=good.astype(jnp.float16))
    _raises(TypeError, "v_descale", fa, q, k, v, v_descale=[1.0])
    _raises(TypeError, "key", fa, q, k.astype(jnp.bfloat16), v)
    qb, kb, vb = (x.astype(jnp.bfloat16) for x in (q, k, v))
    _raises(TypeError, "q_descale", fa, qb, kb, vb, q_descale=good)
    _raises(TypeError, "out_dtype", fa, q, k, v, out_dtype=F8)
    _raises(TypeError, "out_dtype", fa, qb, kb, vb, out_dtype=jnp.float32)
    _raises(TypeError, "out_dtype", fa, q, k, v, out_dtype="nonsense")
