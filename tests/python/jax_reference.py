"""SPEC.md's forward in float64 NumPy: the oracle of the JAX tests (test_jax.py).

[B, T, H, D] arrays. Its plain part (scale, bias, boolean masks, causal, GQA, top-left windows) is
checked against jax.nn.dot_product_attention in test_reference_matches_jax, so the comparisons are
anchored to JAX itself.
"""
import numpy as np


def visible(tq, tk, causal=False, window=(-1, -1), top_left=False):
    """[tq, tk] bool: SPEC.md's causal/window rule with the alignment offset."""
    o = 0 if top_left else tk - tq
    i = np.arange(tq)[:, None] + o
    j = np.arange(tk)[None, :]
    left, right = window
    if causal:
        right = 0
    ok = np.ones((tq, tk), dtype=bool)
    if left >= 0:
        ok &= j >= i - left
    if right >= 0:
        ok &= j <= i + right
    return ok


def reference(q, k, v, *, bias=None, mask=None, sinks=None, q_segment_ids=None,
              kv_segment_ids=None, scale=None, causal=False, window=(-1, -1), top_left=False,
              softcap=0.0):
    """out [B, Tq, Hq, Dv] and lse [B, Hq, Tq] of SPEC.md's forward, in float64."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    b, tq, hq, d = q.shape
    tk, hkv = k.shape[1], k.shape[2]
    group = hq // hkv
    kk, vv = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    s = d ** -0.5 if scale is None else scale
    x = s * np.einsum("bihd,bjhd->bhij", q, kk)
    if bias is not None:
        bias = np.asarray(bias, np.float64)
        if bias.shape[1] == hkv and hkv != hq:
            bias = np.repeat(bias, group, axis=1)
        x = x + bias
    if softcap > 0:
        x = softcap * np.tanh(x / softcap)
    keep = np.broadcast_to(visible(tq, tk, causal, window, top_left), x.shape).copy()
    if mask is not None:
        keep &= np.asarray(mask).astype(bool)
    if q_segment_ids is not None:
        qs = np.asarray(q_segment_ids)[:, None, :, None]
        ks = np.asarray(kv_segment_ids)[:, None, None, :]
        keep &= (qs == ks) & (qs >= 0)
    x = np.where(keep, x, -np.inf)
    if sinks is not None:
        a = np.asarray(sinks, np.float64)
        a = np.broadcast_to(a, (hq, a.shape[-1]))
        x = np.concatenate([x, np.broadcast_to(a[None, :, None, :], (b, hq, tq, a.shape[-1]))],
                           axis=-1)
    m = x.max(axis=-1, keepdims=True)
    m = np.where(np.isneginf(m), 0.0, m)
    e = np.exp(x - m)
    z = e.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = (m + np.log(z))[..., 0]
    p = np.where(z > 0, e / np.where(z > 0, z, 1), 0.0)[..., :tk]
    out = np.einsum("bhij,bjhd->bihd", p, vv)
    return out, lse


def reference_packed(q, k, v, cu_q, cu_k, **kw):
    """Packed sequences ([total, H, D], cu_seqlens [B + 1]): each sequence alone."""
    outs = []
    for i in range(len(cu_q) - 1):
        sq, eq, sk, ek = cu_q[i], cu_q[i + 1], cu_k[i], cu_k[i + 1]
        o, _ = reference(q[None, sq:eq], k[None, sk:ek], v[None, sk:ek], **kw)
        outs.append(o[0])
    return np.concatenate(outs, axis=0)
