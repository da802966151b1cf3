"""libattn.jax under shard_map: per-shard calls, and ring attention over a sequence-sharded mesh
axis (docs/JAX.md).

Batch and head sharding need nothing but shard_map: every shard is an independent problem. When
key/value's sequence dimension is split over a mesh axis, each device holds one slice of K/V; the
slices travel around the ring with ``jax.lax.ppermute`` while every device attends its queries to
the slice it holds, and the partial results merge through their lse:

    lse = log(e^lse_a + e^lse_b),   out = e^(lse_a - lse) out_a + e^(lse_b - lse) out_b

The backward pass is the ring again (a custom VJP): each block's gradients come from the final
out and lse (P = exp(x - lse), Delta = dout . out, as in one call), dQ stays home and dK/dV travel
with their slice, one more shift bringing them to their owner. Under a causal mask the sequence is
put in the zigzag order of src/dist (docs/DISTRIBUTED.md): of 2n chunks, device r holds chunks r
and 2n - 1 - r, so every device has the same work; the permutation is applied before the
shard_map and undone after, so the caller sees natural order and the unsharded call's result.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec

from . import jax as front

# ejKernel's order of the shard_map's inputs.
_NAMES = ("query", "key", "value", "attention_mask", "bias", "softmax_aux", "cum_seqlens_q",
          "cum_seqlens_k", "q_segment_ids", "kv_segment_ids")

try:
    _shard_map = jax.shard_map
except AttributeError:  # older JAX
    from jax.experimental.shard_map import shard_map as _shard_map


def _smap(fn, mesh, in_specs, out_specs):
    try:
        return _shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
    except TypeError:  # JAX before check_vma
        return _shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_rep=False)


def _specs(in_specs):
    """ejKernel's in_specs (a sequence in _NAMES's order, shorter allowed, or a dict by name) as
    one PartitionSpec per name (replicated where none is given)."""
    if in_specs is None:
        raise ValueError("in_specs: required with mesh (ejKernel's order: " + ", ".join(_NAMES)
                         + ")")
    if isinstance(in_specs, dict):
        unknown = set(in_specs) - set(_NAMES)
        if unknown:
            raise ValueError(f"in_specs: unknown names {sorted(unknown)}; expected {_NAMES}")
        specs = [in_specs.get(n) for n in _NAMES]
    else:
        specs = list(in_specs)
        if not 3 <= len(specs) <= len(_NAMES):
            raise ValueError(f"in_specs: {len(specs)} specs, expected 3 to {len(_NAMES)} in the "
                             f"order {_NAMES}")
        specs += [None] * (len(_NAMES) - len(specs))
    return [PartitionSpec() if s is None else s for s in specs]


def _axis_of(spec, dim):
    return spec[dim] if len(spec) > dim else None


def sharded(local, spec, mesh, in_specs, out_specs, arrays):
    """The call under shard_map over mesh; arrays in _NAMES's order (None where absent)."""
    specs = _specs(in_specs)
    if out_specs is None:
        out_specs = specs[0]
    present = [i for i, a in enumerate(arrays) if a is not None]
    seq_axis = _axis_of(specs[1], 1)
    if seq_axis is None:
        def body(*xs):
            full = [None] * len(_NAMES)
            for i, x in zip(present, xs):
                full[i] = x
            q, k, v, mask, bias, sinks, cuq, cuk, qseg, kvseg = full
            return local(spec, q, k, v, bias, mask, sinks, qseg, kvseg, cuq, cuk)
        fn = _smap(body, mesh, tuple(specs[i] for i in present), out_specs)
        return fn(*[arrays[i] for i in present])
    return _ring_sharded(spec, mesh, specs, out_specs, arrays, seq_axis)


def _ring_sharded(spec, mesh, specs, out_specs, arrays, axis):
    q, k, v, mask, bias, sinks, cuq, cuk, qseg, kvseg = arrays
    if not isinstance(axis, str):
        raise ValueError(f"in_specs: key's sequence dimension is split over {axis!r}; ring "
                         "attention runs over one mesh axis")
    for name, x in (("attention_mask", mask), ("bias", bias), ("cum_seqlens_q", cuq)):
        if x is not None:
            raise ValueError(f"{name}: not supported with a sequence-sharded key/value (ring "
                             "attention); use segment ids, or shard batch or heads")
    if spec.dropout_p > 0:
        raise ValueError("dropout_prob: not supported with a sequence-sharded key/value")
    if spec.window != (-1, -1):
        raise ValueError("sliding_window: not supported with a sequence-sharded key/value")
    if _axis_of(specs[2], 1) != axis:
        raise ValueError(f"in_specs: value's sequence dimension must be split like key's "
                         f"({axis!r})")
    q_axis = _axis_of(specs[0], 1)
    n = mesh.shape[axis]
    zigzag = spec.causal and n > 1
    if spec.causal:
        if q_axis != axis:
            raise ValueError(f"in_specs: a causal ring needs query's sequence split over "
                             f"{axis!r} as key's")
        if q.shape[1] != k.shape[1] or q.shape[1] % (2 * n):
            raise ValueError(f"query: a causal ring needs seq_q == seq_k divisible by 2 x "
                             f"{n} devices (zigzag chunks), got {q.shape[1]} and {k.shape[1]}")
    elif q_axis not in (None, axis):
        raise ValueError(f"in_specs: query's sequence dimension is split over {q_axis!r}, "
                         f"key's over {axis!r}")
    if q_axis == axis and k.shape[1] % n:
        raise ValueError(f"key: seq {k.shape[1]} is not divisible by {n} devices")

    perm = inverse = None
    if zigzag:
        c = q.shape[1] // (2 * n)
        perm = np.concatenate([np.r_[r * c:(r + 1) * c, (2 * n - 1 - r) * c:(2 * n - r) * c]
                               for r in range(n)])
        inverse = np.argsort(perm)
        q, k, v = (jnp.take(x, perm, axis=1) for x in (q, k, v))
        if qseg is not None:
            qseg, kvseg = (jnp.take(jnp.asarray(x), perm, axis=1) for x in (qseg, kvseg))

    names = ("query", "key", "value", "softmax_aux", "q_segment_ids", "kv_segment_ids")
    index = {n_: i for i, n_ in enumerate(_NAMES)}
    xs = (q, k, v, sinks, qseg, kvseg)
    present = [i for i, x in enumerate(xs) if x is not None]

    def body(*local):
        full = [None] * 6
        for i, x in zip(present, local):
            full[i] = x
        lq, lk, lv, lsinks, lqseg, lkvseg = full
        front._check_inputs(lq, lk, lv, None, None, lsinks, lqseg, lkvseg, None, None)
        _, _, lsinks, lqseg, lkvseg = front._prepare(lq, None, None, lsinks, lqseg, lkvseg)
        return _ring(spec, axis, n, zigzag, lq, lk, lv, lsinks, lqseg, lkvseg)

    fn = _smap(body, mesh, tuple(specs[index[names[i]]] for i in present), out_specs)
    out = fn(*[xs[i] for i in present])
    return jnp.take(out, inverse, axis=1) if zigzag else out


# ---- the ring ---------------------------------------------------------------------------------


def _shift(xs, axis, n):
    """Every device's values to the next device of the ring (device r receives r - 1's)."""
    pairs = [(i, (i + 1) % n) for i in range(n)]
    return tuple(None if x is None else lax.ppermute(x, axis, pairs) for x in xs)


def _merge(out_a, lse_a, out_b, lse_b):
    """Two partial results of the same rows merged through their lse ([B, H, T]; out [B, T, H,
    Dv] in the accumulator's dtype). Rows no key reached have lse -inf and weight 0."""
    lse = jnp.logaddexp(lse_a, lse_b)
    safe = jnp.where(jnp.isneginf(lse), 0, lse)

    def weight(x):
        return jnp.swapaxes(jnp.exp(x - safe), 1, 2)[..., None]
    return out_a * weight(lse_a) + out_b.astype(out_a.dtype) * weight(lse_b), lse


def _opt(sinks, qseg, kvseg):
    return (None, None, sinks, qseg, kvseg, None, None)


def _half(x, c, first, axis=1):
    return lax.slice_in_dim(x, 0, c, axis=axis) if first else lax.slice_in_dim(x, c, None,
                                                                              axis=axis)


def _ring_forward(spec, axis, n, zigzag, q, k, v, sinks, qseg, kvseg):
    acc_dtype = front._stat_dtype(q)
    block = dataclasses.replace(spec, causal=False)
    r = lax.axis_index(axis)
    # Step 0: the device's own slice, under the mask (local positions are the global order's
    # within the zigzag chunks), and the sinks, counted once.
    out, lse = front._ffi_forward(spec, q, k, v, _opt(sinks, qseg, kvseg))
    out = out.astype(acc_dtype)
    kv = (k, v, kvseg)
    c = q.shape[1] // 2
    for s in range(1, n):
        kv = _shift(kv, axis, n)
        kk, vv, ks = kv
        if zigzag:
            def earlier(kk=kk, vv=vv, ks=ks):
                # The slice's chunks s and 2n-1-s, s < r: both local chunks see all of the first
                # and none of the second.
                return front._ffi_forward(block, q, _half(kk, c, True), _half(vv, c, True),
                                          _opt(None, qseg, None if ks is None
                                               else _half(ks, c, True)))

            def later(kk=kk, vv=vv, ks=ks):
                # s > r: only the local back chunk sees the slice, all of it.
                o, l_ = front._ffi_forward(block, _half(q, c, False), kk, vv,
                                           _opt(None, None if qseg is None
                                                else _half(qseg, c, False), ks))
                o = jnp.concatenate([jnp.zeros_like(o), o], axis=1)
                l_ = jnp.concatenate([jnp.full_like(l_, -jnp.inf), l_], axis=2)
                return o, l_
            o, l_ = lax.cond((r - s) % n < r, earlier, later)
        else:
            o, l_ = front._ffi_forward(block, q, kk, vv, _opt(None, qseg, ks))
        out, lse = _merge(out, lse, o, l_)
    return out.astype(q.dtype), lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _ring(spec, axis, n, zigzag, q, k, v, sinks, qseg, kvseg):
    return _ring_forward(spec, axis, n, zigzag, q, k, v, sinks, qseg, kvseg)[0]


def _ring_fwd(spec, axis, n, zigzag, q, k, v, sinks, qseg, kvseg):
    out, lse = _ring_forward(spec, axis, n, zigzag, q, k, v, sinks, qseg, kvseg)
    return out, (q, k, v, sinks, qseg, kvseg, out, lse)


def _ring_bwd(spec, axis, n, zigzag, residuals, dout):
    q, k, v, sinks, qseg, kvseg, out, lse = residuals
    acc_dtype = front._stat_dtype(q)
    block = dataclasses.replace(spec, causal=False)
    r = lax.axis_index(axis)
    dq, dk, dv, _, dsinks = front._ffi_backward(spec, dout, q, k, v, out, lse,
                                                _opt(sinks, qseg, kvseg))
    dq = dq.astype(acc_dtype)
    dkv = (dk.astype(acc_dtype), dv.astype(acc_dtype))
    kv = (k, v, kvseg)
    c = q.shape[1] // 2
    for s in range(1, n):
        kv = _shift(kv, axis, n)
        dkv = _shift(dkv, axis, n)
        kk, vv, ks = kv
        if zigzag:
            def earlier(kk=kk, vv=vv, ks=ks):
                gq, gk, gv, _, _ = front._ffi_backward(
                    block, dout, q, _half(kk, c, True), _half(vv, c, True), out, lse,
                    _opt(None, qseg, None if ks is None else _half(ks, c, True)))
                return (gq.astype(acc_dtype),
                        jnp.concatenate([gk, jnp.zeros_like(gk)], axis=1).astype(acc_dtype),
                        jnp.concatenate([gv, jnp.zeros_like(gv)], axis=1).astype(acc_dtype))

            def later(kk=kk, vv=vv, ks=ks):
                gq, gk, gv, _, _ = front._ffi_backward(
                    block, _half(dout, c, False), _half(q, c, False), kk, vv,
                    _half(out, c, False), _half(lse, c, False, axis=2),
                    _opt(None, None if qseg is None else _half(qseg, c, False), ks))
                return (jnp.concatenate([jnp.zeros_like(gq), gq], axis=1).astype(acc_dtype),
                        gk.astype(acc_dtype), gv.astype(acc_dtype))
            gq, gk, gv = lax.cond((r - s) % n < r, earlier, later)
        else:
            gq, gk, gv, _, _ = front._ffi_backward(block, dout, q, kk, vv, out, lse,
                                                   _opt(None, qseg, ks))
        dq = dq + gq.astype(acc_dtype)
        dkv = (dkv[0] + gk.astype(acc_dtype), dkv[1] + gv.astype(acc_dtype))
    if n > 1:
        dkv = _shift(dkv, axis, n)  # home: device r now holds the gradients of its own slice
    if dsinks is not None:
        dsinks = dsinks.astype(sinks.dtype)
    return (dq.astype(q.dtype), dkv[0].astype(k.dtype), dkv[1].astype(v.dtype), dsinks, None,
            None)


_ring.defvjp(_ring_fwd, _ring_bwd)
