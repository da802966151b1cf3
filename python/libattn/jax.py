"""libattn.jax: the JAX front-end, with ejKernel's interface.

``flash_attention`` and ``scaled_dot_product_attention`` take ejKernel's arguments (names, order,
defaults) and run libattn's forward and backward passes as XLA custom calls (FFI handlers,
python/src/_jax_ffi.cc) on the CPU and on CUDA, inside ``jit``, with a custom VJP (gradients for
query, key, value, bias and softmax_aux; residuals out and lse), under ``vmap``, ``remat`` and
``shard_map`` over a mesh, where a sequence-sharded key/value runs ring attention. ``Executor``,
``FlashAttention()`` and friends are thin wrappers over libattn's executor (its policy, tuning and
cache file). Layout: [batch, seq, heads, dim] (ejKernel's and libattn's own). docs/JAX.md has the
rest, including where libattn's meaning differs from one of ejKernel's backends.
"""

import dataclasses
import functools
import os
import threading

import jax
import jax.numpy as jnp
import numpy as np

from . import _core, _ext

try:
    from . import _jax_ffi
except ImportError as e:  # built without jaxlib's headers
    raise ImportError(
        "libattn was built without its JAX FFI handlers: install jax first, then build the "
        "package with jaxlib's headers in reach (pip install --no-build-isolation ., or "
        "-C cmake.define.ATTN_JAX_FFI_INCLUDE=$(python -c 'import jax.ffi; "
        "print(jax.ffi.include_dir())'); docs/JAX.md)") from e

__all__ = ["flash_attention", "scaled_dot_product_attention", "FlashAttention",
           "ScaledDotProductAttention", "Executor", "ConfigSelectorChain", "ConfigCache",
           "AutotunePolicy", "Tuner", "PersistentCache", "create_default_executor",
           "select_mechanism"]

_FORWARD, _BACKWARD = "libattn_forward", "libattn_backward"


def _register():
    for platform, handlers in _jax_ffi.handlers().items():
        for name, capsule in handlers.items():
            try:
                jax.ffi.register_ffi_target(f"libattn_{name}", capsule, platform=platform)
            except Exception:  # a jaxlib without that platform (CUDA on a CPU-only install)
                if platform == "cpu":
                    raise


_register()

_DTYPES = {jnp.dtype(jnp.float32): _core.DTYPE_F32, jnp.dtype(jnp.float16): _core.DTYPE_F16,
           jnp.dtype(jnp.bfloat16): _core.DTYPE_BF16, jnp.dtype(jnp.float64): _core.DTYPE_F64,
           jnp.dtype(jnp.float8_e4m3fn): _core.DTYPE_F8E4M3}
_FP8 = jnp.dtype(jnp.float8_e4m3fn)
# out of a float8_e4m3fn call (docs/FP8.md): bfloat16 by default, as FlashAttention-3's.
_FP8_OUT_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32))

# ejKernel's platform names for its own kernels (Triton, Pallas, its CUDA kernels, plain XLA): no
# such kernels here, so they mean "let libattn's executor choose" (docs/JAX.md).
_EJKERNEL_PLATFORMS = ("triton", "pallas", "xla")


def select_mechanism(name):
    """(operation, platform) of an EasyDeL mechanism name ("vanilla", "sdpa", "flash", "cudnn") or
    a platform name ("auto", "ref", "cpu", "cuda"), as attn_select_mechanism reads it: operation
    is "flash", "sdpa" or None (the call's own). ValueError names the argument otherwise."""
    op, platform = _mechanism(name)
    return ({-1: None, _core.OP_FLASH: "flash", _core.OP_SDPA: "sdpa"}[op],
            {v: k for k, v in _core.PLATFORMS.items()}[platform])


@functools.lru_cache(maxsize=None)
def _mechanism(name):
    try:
        return _jax_ffi.select_mechanism(name)
    except ValueError as e:
        raise ValueError(f"platform={name!r}: {e}; ejKernel's names triton, pallas and xla mean "
                         "auto here") from None


# ---- the static description of a call ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Spec:
    """Everything about a call that is not an array: hashable, a custom_vjp's static argument."""
    sdpa: bool = False
    scale: float = 0.0
    causal: bool = False
    top_left: bool = False
    window: tuple = (-1, -1)
    softcap: float = 0.0
    dropout_p: float = 0.0
    seed: int = 0
    mechanism: str = "auto"
    impl: str = ""
    config: str = ""
    policy: tuple = ()  # attn_policy's fields in _core._POLICY_KEYS's order
    num_threads: int = 0
    out_dtype: object = None  # a float8_e4m3fn call's out dtype (None: bfloat16)


def _policy_of(overrides=None):
    """The executor's policy a call is planned under: the process-wide one of libattn.set_policy
    with the fields an executor's chain overrides, as the tuple _ext.set_policy takes."""
    p = _core.get_policy()
    if overrides:
        p.update(overrides)
    values = []
    for key in _core._POLICY_KEYS:
        value = p[key]
        if key == "max_seconds":
            value = float(value)
        elif key == "cache_path":
            value = None if value is None else os.fspath(value)
        else:
            value = int(value)
        values.append(value)
    return tuple(values)


# The optional operands in attn_inputs' order (the handler binds them so, python/src/_jax_ffi.cc);
# a call's opt tuple may stop before the descale factors (the ring's does).
_OPTIONAL = ("bias", "mask", "sinks", "q_segment_ids", "kv_segment_ids", "cu_seqlens_q",
             "cu_seqlens_k", "q_descale", "k_descale", "v_descale")


def _problem(spec, q, k, v, opt, device):
    """The problem tuple of a call (attn_problem's fields), from static shapes."""
    bias, mask, sinks, qseg, _, cuq, _ = opt[:7]
    q_descale = opt[7] if len(opt) > 7 else None
    op = _core.OP_SDPA if spec.sdpa else _core.OP_FLASH
    mech_op, _ = _mechanism(spec.mechanism)
    if mech_op >= 0:
        op = mech_op
    if cuq is not None:
        total_q, hq, d = q.shape
        total_k, hkv = k.shape[0], k.shape[1]
        # The largest sequence cannot be read from traced cu_seqlens: the totals bound it.
        batch, tq, tk, varlen = cuq.shape[0] - 1, total_q, total_k, _core.VARLEN_PACKED
    else:
        batch, tq, hq, d = q.shape
        tk, hkv = k.shape[1], k.shape[2]
        total_q = total_k = 0
        varlen = _core.VARLEN_NONE
    fields = dict(
        operation=op, dtype=_DTYPES[q.dtype], device=device, batch=batch, seqlen_q=tq,
        seqlen_k=tk, heads_q=hq, heads_kv=hkv, head_dim=d,
        head_dim_v=0 if v.shape[-1] == d else v.shape[-1], scale=float(spec.scale),
        causal=int(spec.causal),
        align=_core.ALIGN_TOP_LEFT if spec.top_left else _core.ALIGN_BOTTOM_RIGHT,
        window_left=spec.window[0], window_right=spec.window[1], softcap=float(spec.softcap),
        dropout_p=float(spec.dropout_p), varlen=varlen, total_q=total_q, total_k=total_k)
    if spec.out_dtype is not None:
        fields.update(out_dtype=_DTYPES[spec.out_dtype])
    if q_descale is not None:  # the checks made the three alike: its size says the form
        fields.update(descale=_core.DESCALE_TENSOR if q_descale.size == 1
                      else _core.DESCALE_PER_BATCH_KV_HEAD)
    if bias is not None:
        fields.update(has_bias=1, bias_dtype=_DTYPES[bias.dtype],
                      **{f"bias_shape{i}": n for i, n in enumerate(bias.shape)})
    if mask is not None:
        fields.update(has_mask=1, **{f"mask_shape{i}": n for i, n in enumerate(mask.shape)})
    if sinks is not None:
        fields.update(num_sinks=sinks.shape[-1], sinks_shared=int(sinks.ndim == 1))
    if qseg is not None:
        fields.update(has_segment_ids=1)
    return _core.make_problem(**fields)


def _device(q):
    """Where the call will run: the device of a concrete array, else (a tracer) JAX's default
    backend."""
    try:
        platform = next(iter(q.devices())).platform
    except Exception:
        platform = jax.default_backend()
    return _core.DEVICE_CUDA if platform in ("gpu", "cuda") else _core.DEVICE_CPU


class _Planner(threading.local):
    """This thread's context for planning traced calls, set to the policy of the last call."""

    def __init__(self):
        self.ctx = _ext.ctx_new()
        self.policy = None
        self.plans = {}


_planner = _Planner()


def _plan_call(spec, q, k, v, opt):
    """Plans a call when it is traced, through libattn's executor under the call's policy (the
    cache, the cache file, autotuning when the policy says so, heuristics; bad problems raise
    here, naming the field). Returns the custom call's attributes and the workspace sizes: the
    handler runs exactly the implementation and configuration chosen here."""
    problem = _problem(spec, q, k, v, opt, _device(q))
    st = _planner
    key = (problem, spec.mechanism, spec.impl, spec.config, spec.policy, spec.num_threads)
    found = st.plans.get(key)
    if found is None:
        found = st.plans[key] = _new_plan(st, spec, q, k, v, opt, problem)
    attrs, forward_bytes, backward_bytes = found
    # The seed is an attribute of its own: a new seed makes no new plan.
    seed = np.int64(np.uint64(spec.seed & (2**64 - 1)).view(np.int64))
    return dict(attrs, seed=seed), forward_bytes, backward_bytes


def _new_plan(st, spec, q, k, v, opt, problem):
    """The attributes and workspace sizes of a problem's plan, made under the call's policy (the
    plan itself is not kept: the context's executor cache remembers its choice)."""
    if len(st.plans) >= 4096:
        st.plans.clear()
    if st.policy != (spec.policy, spec.num_threads):
        _ext.set_policy(st.ctx, *spec.policy)
        _ext.set_num_threads(st.ctx, spec.num_threads)
        st.policy = (spec.policy, spec.num_threads)
    _, platform = _mechanism(spec.mechanism)
    plan = _core.Plan(_ext.plan_new(st.ctx, problem, spec.impl or None, spec.config or None,
                                    platform, 0), problem)
    attrs = dict(problem=_core.problem_string(_problem(spec, q, k, v, opt, _core.DEVICE_CPU)),
                 impl=plan.impl, config=plan.config, num_threads=np.int64(spec.num_threads))
    return attrs, plan.forward_workspace, plan.backward_workspace


def _stat_dtype(q):
    return jnp.float64 if q.dtype == jnp.float64 else jnp.float32


def _out_dtype(spec, q):
    if q.dtype == _FP8:
        return spec.out_dtype or jnp.dtype(jnp.bfloat16)
    return q.dtype


def _lse_shape(q, packed):
    return (q.shape[1], q.shape[0]) if packed else (q.shape[0], q.shape[2], q.shape[1])


def _ffi_forward(spec, q, k, v, opt):
    """out [.., Tq, Hq, Dv] and lse [B, Hq, Tq] (packed: [Hq, total_q]) of one call."""
    attrs, workspace, _ = _plan_call(spec, q, k, v, opt)
    packed = opt[5] is not None
    results = (jax.ShapeDtypeStruct((*q.shape[:-1], v.shape[-1]), _out_dtype(spec, q)),
               jax.ShapeDtypeStruct(_lse_shape(q, packed), _stat_dtype(q)),
               jax.ShapeDtypeStruct((workspace,), jnp.uint8))
    call = jax.ffi.ffi_call(_FORWARD, results, vmap_method="broadcast_all")
    out, lse, _ = call(q, k, v, *[x for x in opt if x is not None], **attrs)
    return out, lse


def _ffi_backward(spec, dout, q, k, v, out, lse, opt):
    """dq, dk, dv, and dbias / dsinks when the call has a bias / sinks (None otherwise)."""
    if q.dtype == _FP8:
        raise NotImplementedError(
            "query: float8_e4m3fn attention has no backward pass (forward only, as "
            "FlashAttention-3's fp8; train in bfloat16, or stop the gradient at its inputs)")
    attrs, _, workspace = _plan_call(spec, q, k, v, opt)
    bias, sinks = opt[0], opt[2]
    results = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v)]
    if bias is not None:
        results.append(jax.ShapeDtypeStruct(bias.shape, bias.dtype))
    if sinks is not None:
        results.append(jax.ShapeDtypeStruct(sinks.shape, _stat_dtype(q)))
    results.append(jax.ShapeDtypeStruct((workspace,), jnp.uint8))
    call = jax.ffi.ffi_call(_BACKWARD, tuple(results), vmap_method="broadcast_all")
    grads = list(call(dout, q, k, v, out, lse, *[x for x in opt if x is not None], **attrs))[:-1]
    dq, dk, dv = grads[:3]
    rest = grads[3:]
    dbias = rest.pop(0) if bias is not None else None
    dsinks = rest.pop(0) if sinks is not None else None
    return dq, dk, dv, dbias, dsinks


# ---- the differentiable call ------------------------------------------------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attend(spec, q, k, v, bias, sinks, mask, qseg, kvseg, cuq, cuk, qd=None, kd=None, vd=None):
    out, _ = _ffi_forward(spec, q, k, v, (bias, mask, sinks, qseg, kvseg, cuq, cuk, qd, kd, vd))
    return out


def _attend_fwd(spec, q, k, v, bias, sinks, mask, qseg, kvseg, cuq, cuk, qd=None, kd=None,
                vd=None):
    opt = (bias, mask, sinks, qseg, kvseg, cuq, cuk, qd, kd, vd)
    out, lse = _ffi_forward(spec, q, k, v, opt)
    # The residuals are the inputs, out and lse: never the probabilities.
    return out, (q, k, v, opt, out, lse)


def _attend_bwd(spec, residuals, dout):
    q, k, v, opt, out, lse = residuals
    dq, dk, dv, dbias, dsinks = _ffi_backward(spec, dout, q, k, v, out, lse, opt)
    # Masks, segment ids, cu_seqlens and descale factors (fp8 raises above) take no gradient.
    return dq, dk, dv, dbias, dsinks, None, None, None, None, None, None, None, None


_attend.defvjp(_attend_fwd, _attend_bwd)


# ---- argument checks ----------------------------------------------------------------------------


def _shape_error(name, x, rule):
    return ValueError(f"{name}: {rule} (shape {tuple(x.shape)})")


def _check_inputs(q, k, v, bias, mask, sinks, qseg, kvseg, cuq, cuk):
    for name, x in (("query", q), ("key", k), ("value", v)):
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise TypeError(f"{name}: expected an array, got {type(x).__name__}")
        if jnp.dtype(x.dtype) not in _DTYPES:
            raise TypeError(f"{name}: dtype {x.dtype} is not float16, bfloat16, float32, "
                            "float64 or float8_e4m3fn")
    for name, x in (("key", k), ("value", v)):
        if x.dtype != q.dtype:
            raise TypeError(f"{name}: dtype {x.dtype} differs from query's {q.dtype}")
    packed = cuq is not None or cuk is not None
    if packed:
        if cuq is None or cuk is None:
            raise ValueError("cum_seqlens_q and cum_seqlens_k: give both or neither")
        rank, what = 3, "[total, heads, dim]"
    else:
        rank, what = 4, "[batch, seq, heads, dim]"
    for name, x in (("query", q), ("key", k), ("value", v)):
        if x.ndim != rank:
            raise _shape_error(name, x, f"expected {rank} dimensions {what}")
    if k.shape[:-1] != v.shape[:-1]:
        raise _shape_error("value", v, f"must match key's {tuple(k.shape[:-1])} but for the "
                           "last dimension")
    if q.shape[-1] != k.shape[-1]:
        raise _shape_error("key", k, f"head dim {k.shape[-1]} differs from query's "
                           f"{q.shape[-1]}")
    if not packed and k.shape[0] != q.shape[0]:
        raise _shape_error("key", k, f"batch {k.shape[0]} differs from query's {q.shape[0]}")
    hq, hkv = q.shape[-2], k.shape[-2]
    if hq % hkv:
        raise _shape_error("key", k, f"query's {hq} heads are not a multiple of its {hkv}")
    if packed:
        for name, x in (("cum_seqlens_q", cuq), ("cum_seqlens_k", cuk)):
            if x.ndim != 1 or x.dtype != jnp.int32:
                raise _shape_error(name, x, f"expected int32 [batch + 1], got {x.dtype}")
        if cuq.shape != cuk.shape:
            raise _shape_error("cum_seqlens_k", cuk, "must have cum_seqlens_q's shape "
                               f"{tuple(cuq.shape)}")
        if bias is not None or mask is not None or qseg is not None:
            raise ValueError("cum_seqlens_q: packed sequences take no bias, attention_mask or "
                             "segment ids (attn.h)")
        return
    b, tq, tk = q.shape[0], q.shape[1], k.shape[1]
    if bias is not None:
        if jnp.dtype(bias.dtype) not in _DTYPES or bias.dtype == _FP8 or (
                bias.dtype == jnp.float64) != (q.dtype == jnp.float64):
            raise TypeError(f"bias: dtype {bias.dtype} is not float16, bfloat16 or float32 "
                            "(float64 with float64 inputs)")
        if bias.ndim != 4 or bias.shape[0] not in (1, b) or bias.shape[1] not in (1, hq, hkv) \
                or bias.shape[2] not in (1, tq) or bias.shape[3] not in (1, tk):
            raise _shape_error("bias", bias, f"expected [{b} or 1, {hq} or {hkv} or 1, {tq} or "
                               f"1, {tk} or 1]")
    if mask is not None:
        if mask.ndim != 4 or mask.shape[0] not in (1, b) or mask.shape[1] not in (1, hq) \
                or mask.shape[2] not in (1, tq) or mask.shape[3] not in (1, tk):
            raise _shape_error("attention_mask", mask, f"expected [{b} or 1, {hq} or 1, {tq} or "
                               f"1, {tk} or 1]")
    if sinks is not None:
        if sinks.ndim not in (1, 2) or (sinks.ndim == 2 and sinks.shape[0] != hq) \
                or sinks.shape[-1] < 1:
            raise _shape_error("softmax_aux", sinks, f"expected [{hq}, num_sinks] or "
                               "[num_sinks]")
    if (qseg is None) != (kvseg is None):
        raise ValueError("q_segment_ids and kv_segment_ids: give both or neither")
    if qseg is not None:
        for name, x, t in (("q_segment_ids", qseg, tq), ("kv_segment_ids", kvseg, tk)):
            if x.shape != (b, t) or not jnp.issubdtype(x.dtype, jnp.integer):
                raise _shape_error(name, x, f"expected integer [{b}, {t}], got {x.dtype}")


def _check_fp8(q, k, cuq, descales, out_dtype):
    """Checks a call's fp8 arguments (docs/FP8.md); returns q_descale, k_descale, v_descale as
    the handler takes them: None without any, else three float32 arrays of one form, [B, Hkv] or
    [1] (one left out is ones; a per-tensor one beside a [B, Hkv] one is broadcast to it)."""
    fp8 = q.dtype == _FP8
    if out_dtype is not None:  # a dtype already (_fp8_out_dtype)
        if fp8 and out_dtype not in _FP8_OUT_DTYPES:
            raise TypeError(f"out_dtype: {out_dtype} with float8_e4m3fn inputs: out must be "
                            "bfloat16 (the default), float16 or float32")
        if not fp8 and out_dtype != q.dtype:
            raise TypeError(f"out_dtype: {out_dtype} with {q.dtype} inputs: out has the inputs' "
                            "dtype; only float8_e4m3fn inputs write another")
    names = ("q_descale", "k_descale", "v_descale")
    given = {n: d for n, d in zip(names, descales) if d is not None}
    if not given:
        return None, None, None
    if not fp8:
        raise TypeError(f"{next(iter(given))}: descale factors belong to float8_e4m3fn inputs "
                        f"only (query is {q.dtype})")
    b = cuq.shape[0] - 1 if cuq is not None else q.shape[0]
    hkv = k.shape[-2]
    for name, d in given.items():
        if not hasattr(d, "shape") or not hasattr(d, "dtype"):
            raise TypeError(f"{name}: expected an array, got {type(d).__name__}")
        if d.dtype != jnp.float32:
            raise TypeError(f"{name}: dtype {d.dtype} is not float32 (descale factors are "
                            "float32)")
        if d.size != 1 and tuple(d.shape) != (b, hkv):
            raise _shape_error(name, d, f"is neither [batch, kv heads] = [{b}, {hkv}] (one "
                               "factor per batch entry and KV head) nor one element (per tensor)")
    shape = (b, hkv) if any(d.size != 1 for d in given.values()) else (1,)
    return tuple(jnp.broadcast_to(jnp.reshape(given[n], (-1,) if given[n].size == 1 else shape),
                                  shape) if n in given else jnp.ones(shape, jnp.float32)
                 for n in names)


def _window(sliding_window):
    if sliding_window is None:
        return (-1, -1)
    if isinstance(sliding_window, (int, np.integer)):
        w = (int(sliding_window), int(sliding_window))
    else:
        try:
            w = tuple(int(x) for x in sliding_window)
        except TypeError:
            w = ()
        if len(w) != 2:
            raise ValueError(f"sliding_window={sliding_window!r}: expected an int or "
                             "(left, right)")
    if any(x < -1 for x in w):
        raise ValueError(f"sliding_window={sliding_window!r}: sizes are >= 0 (-1: unbounded)")
    return w


def _config(cfg):
    """(impl, config) of a cfg argument: None, "impl", "impl:config", a dict or an object with
    impl / config attributes."""
    if cfg is None:
        return "", ""
    if isinstance(cfg, str):
        impl, _, config = cfg.partition(":")
        return impl, config
    if isinstance(cfg, dict):
        return cfg.get("impl") or "", cfg.get("config") or ""
    impl, config = getattr(cfg, "impl", None), getattr(cfg, "config", None)
    if impl is None and config is None:
        raise TypeError(f"cfg: expected 'impl[:config]', a dict or an object with impl/config, "
                        f"got {type(cfg).__name__}")
    return impl or "", config or ""


def _mask_parts(mask_info, attention_mask, q_segment_ids, kv_segment_ids):
    """mask_info: a boolean array (ejKernel's attention_mask) or an object with attention_mask /
    q_segment_ids / kv_segment_ids attributes (ejKernel's MaskInfo)."""
    if mask_info is not None:
        if hasattr(mask_info, "shape"):
            attention_mask = mask_info if attention_mask is None else attention_mask
        else:
            attention_mask = getattr(mask_info, "attention_mask", attention_mask)
            q_segment_ids = getattr(mask_info, "q_segment_ids", q_segment_ids)
            kv_segment_ids = getattr(mask_info, "kv_segment_ids", kv_segment_ids)
    return attention_mask, q_segment_ids, kv_segment_ids


def _platform(platform):
    if platform is None or platform in _EJKERNEL_PLATFORMS:
        return "auto"
    if not isinstance(platform, str):
        raise TypeError(f"platform: expected a name, got {type(platform).__name__}")
    _mechanism(platform)  # ValueError naming it
    return platform


# ---- the functions -------------------------------------------------------------------------------


def flash_attention(query, key, value, bias=None, cum_seqlens_q=None, cum_seqlens_k=None,
                    softmax_aux=None, /, *, mask_info=None, attention_mask=None,
                    softmax_scale=None, dropout_prob=0.0, causal=False, dropout_seed=None,
                    sliding_window=None, logits_soft_cap=None, normalize_output=True,
                    platform=None, cfg=None, q_segment_ids=None, kv_segment_ids=None, mesh=None,
                    in_specs=None, out_specs=None, q_descale=None, k_descale=None,
                    v_descale=None, out_dtype=None, _policy=None):
    """Flash attention, SPEC.md's function: out [batch, seq_q, heads_q, dim_v].

    query [B, Tq, Hq, D], key [B, Tk, Hkv, D], value [B, Tk, Hkv, Dv] (Hq a multiple of Hkv:
    GQA/MQA); packed sequences: [total, H, D] with cum_seqlens_q/k int32 [B + 1].
    bias: additive, [B|1, Hq|Hkv|1, Tq|1, Tk|1] (differentiable; dbias is summed over broadcast
    dimensions). softmax_aux: attention sinks, raw logits [Hq, S] or [S] (differentiable).
    attention_mask (or mask_info): boolean [B|1, Hq|1, Tq|1, Tk|1], True takes part.
    q_segment_ids [B, Tq] / kv_segment_ids [B, Tk]: a query sees keys of its own segment;
    negative ids are padding. softmax_scale: default 1/sqrt(D). causal and sliding_window
    (int w meaning (w, w), or (left, right), -1 unbounded) are aligned bottom-right when
    Tq != Tk (SPEC.md; ejKernel's Triton and CUDA backends do so, its XLA backend aligns top-left).
    logits_soft_cap: cap * tanh(x / cap) with bias inside the cap (ejKernel's flash convention).
    dropout_prob with dropout_seed (a Python int, required: SPEC.md's Philox bits, the same on
    every libattn backend, not ejKernel's; a new seed recompiles, as every attribute does).
    normalize_output must stay True (libattn always normalises). platform: "auto", "ref", "cpu",
    "cuda", "cudnn", or EasyDeL's "vanilla", "sdpa", "flash"; ejKernel's "triton", "pallas" and
    "xla" mean "auto". cfg: "impl" or "impl:config" (a configuration name of that
    implementation, `attn tune` lists them), replacing ejKernel's block-size objects.
    mesh, in_specs, out_specs: run under shard_map (docs/JAX.md); in_specs in ejKernel's order
    (query, key, value, attention_mask, bias, softmax_aux, cum_seqlens_q, cum_seqlens_k,
    q_segment_ids, kv_segment_ids). A key/value sequence axis sharded over a mesh axis runs
    ring attention over it, equal to the unsharded call (ejKernel computes each shard's block
    alone there).
    float8_e4m3fn query, key, value (docs/FP8.md; forward only): q_descale, k_descale,
    v_descale are float32 factors the values are read times, each [batch, kv heads]
    (FlashAttention-3's) or one element (per tensor); one left out is 1. out_dtype: bfloat16 (the
    default), float16 or float32. Not with a mesh.
    """
    attention_mask, q_segment_ids, kv_segment_ids = _mask_parts(
        mask_info, attention_mask, q_segment_ids, kv_segment_ids)
    if not normalize_output:
        raise ValueError("normalize_output=False: libattn returns the normalised output only")
    spec = _make_spec(False, softmax_scale, causal, False, sliding_window, logits_soft_cap,
                      dropout_prob, dropout_seed, platform, cfg, _policy)
    descales = (q_descale, k_descale, v_descale)
    if out_dtype is not None or any(d is not None for d in descales):
        if mesh is not None:
            raise NotImplementedError("q_descale/out_dtype: float8_e4m3fn arguments do not "
                                      "combine with mesh (each shard's factors are a slice)")
        spec = dataclasses.replace(spec, out_dtype=None if out_dtype is None else
                                   _fp8_out_dtype(out_dtype))
    return _run(spec, query, key, value, bias, attention_mask, softmax_aux, q_segment_ids,
                kv_segment_ids, cum_seqlens_q, cum_seqlens_k, mesh, in_specs, out_specs,
                descales)


def scaled_dot_product_attention(query, key, value, bias=None, cum_seqlens_q=None,
                                 cum_seqlens_k=None, /, *, mask_info=None, init_bias=None,
                                 softmax_scale=None, causal=False, sliding_window=None,
                                 platform=None, mesh=None, in_specs=None, out_specs=None,
                                 attention_mask=None, _policy=None):
    """Scaled dot-product attention (SPEC.md's function through its SDPA operation, which on a
    GPU prefers cuDNN): out [batch, seq_q, heads_q, dim_v], [B, T, H, D] tensors as
    ``flash_attention``.

    As ``jax.nn.dot_product_attention`` (which ejKernel's sdpa calls), causal and sliding_window
    align top-left: query i sees keys j <= i. init_bias: a callable returning the bias, called
    when bias is None. mask_info: as flash_attention's. mesh/in_specs/out_specs: as
    flash_attention's (in_specs in the same order).
    """
    if bias is None and init_bias is not None:
        bias = init_bias()
    attention_mask, qseg, kvseg = _mask_parts(mask_info, attention_mask, None, None)
    spec = _make_spec(True, softmax_scale, causal, True, sliding_window, None, 0.0, None,
                      platform, None, _policy)
    return _run(spec, query, key, value, bias, attention_mask, None, qseg, kvseg,
                cum_seqlens_q, cum_seqlens_k, mesh, in_specs, out_specs)


def _make_spec(sdpa, softmax_scale, causal, top_left, sliding_window, softcap, dropout_prob,
               dropout_seed, platform, cfg, policy):
    if softmax_scale is not None and not float(softmax_scale) > 0:
        raise ValueError(f"softmax_scale={softmax_scale!r}: must be > 0 (None: 1/sqrt(dim))")
    if softcap is not None and not float(softcap) >= 0:
        raise ValueError(f"logits_soft_cap={softcap!r}: must be >= 0 (None or 0: off)")
    p = float(dropout_prob or 0.0)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout_prob={dropout_prob!r}: must be in [0, 1)")
    if p > 0 and dropout_seed is None:
        raise ValueError("dropout_seed: required with dropout_prob > 0 (a Python int; vary it "
                         "from step to step)")
    if dropout_seed is not None and not isinstance(dropout_seed, (int, np.integer)):
        raise TypeError(f"dropout_seed: expected a Python int, got {type(dropout_seed).__name__}"
                        " (a traced seed cannot reach the kernel's attributes)")
    impl, config = _config(cfg)
    return _Spec(sdpa=sdpa, scale=float(softmax_scale or 0.0), causal=bool(causal),
                 top_left=top_left, window=_window(sliding_window), softcap=float(softcap or 0.0),
                 dropout_p=p, seed=int(dropout_seed or 0), mechanism=_platform(platform),
                 impl=impl, config=config, policy=_policy_of(policy),
                 num_threads=int(_core._num_threads))


def _fp8_out_dtype(out_dtype):
    """out_dtype as the spec keeps it (a hashable numpy dtype); checked with the inputs."""
    try:
        return jnp.dtype(out_dtype)
    except TypeError:
        raise TypeError(f"out_dtype: expected a dtype, got {out_dtype!r}") from None


def _prepare(q, bias, mask, sinks, qseg, kvseg):
    """The dtypes attn.h reads: u8 masks, i32 segment ids, f32 (f64) sinks."""
    if mask is not None:
        mask = jnp.asarray(mask)
        mask = mask.astype(jnp.uint8) if mask.dtype != jnp.uint8 else mask
    if sinks is not None:
        sinks = jnp.asarray(sinks).astype(_stat_dtype(q))
    if qseg is not None:
        qseg, kvseg = jnp.asarray(qseg).astype(jnp.int32), jnp.asarray(kvseg).astype(jnp.int32)
    return bias, mask, sinks, qseg, kvseg


def _local(spec, q, k, v, bias, mask, sinks, qseg, kvseg, cuq, cuk, descales=(None,) * 3):
    """One device's call: checks, then the differentiable custom call."""
    _check_inputs(q, k, v, bias, mask, sinks, qseg, kvseg, cuq, cuk)
    descales = _check_fp8(q, k, cuq, descales, spec.out_dtype)
    bias, mask, sinks, qseg, kvseg = _prepare(q, bias, mask, sinks, qseg, kvseg)
    return _attend(spec, q, k, v, bias, sinks, mask, qseg, kvseg, cuq, cuk, *descales)


def _run(spec, q, k, v, bias, mask, sinks, qseg, kvseg, cuq, cuk, mesh, in_specs, out_specs,
         descales=(None,) * 3):
    if cuq is not None and q.ndim == 4 and q.shape[0] == 1:
        # ejKernel passes packed sequences as [1, total, H, D].
        return _run(spec, q[0], k[0], v[0], bias, mask, sinks, qseg, kvseg, cuq, cuk, mesh,
                    in_specs, out_specs, descales)[None]
    if mesh is None:
        if in_specs is not None or out_specs is not None:
            raise ValueError("in_specs/out_specs: given without mesh")
        return _local(spec, q, k, v, bias, mask, sinks, qseg, kvseg, cuq, cuk, descales)
    from . import _jax_ring
    return _jax_ring.sharded(_local, spec, mesh, in_specs, out_specs,
                             (q, k, v, mask, bias, sinks, cuq, cuk, qseg, kvseg))


# ---- ejKernel's objects ---------------------------------------------------------------------------


class FlashAttention:
    """ejKernel's FlashAttention operation: ``executor(FlashAttention(), q, k, v, ...)`` or
    ``FlashAttention()(q, k, v, ...)`` calls ``flash_attention``."""
    op_id = "flash_attention"

    def __call__(self, *args, **kwargs):
        return flash_attention(*args, **kwargs)


class ScaledDotProductAttention:
    """ejKernel's ScaledDotProductAttention operation (calls ``scaled_dot_product_attention``)."""
    op_id = "scaled_dot_product_attention"

    def __call__(self, *args, **kwargs):
        return scaled_dot_product_attention(*args, **kwargs)


class ConfigCache:
    """The executor's in-memory cache. libattn keeps it in C, per thread; ``clear()`` forgets the
    calling thread's entries and plans (those of traced JAX calls and of libattn.plan), so the
    next trace plans again (the cache file is kept)."""

    def clear(self):
        _core.cache_clear()
        _ext.cache(_planner.ctx, "clear")
        _planner.plans.clear()


@dataclasses.dataclass
class AutotunePolicy:
    """When the executor times candidates (attn_policy). allow_autotune: timing is allowed at all;
    cache_miss_fallback: "autotune" times the candidates on a cache miss, "heuristics" takes the
    heuristic pick; validate_backward: time forward + backward (training); deterministic: only
    configurations that repeat their bits. allow_heuristics is accepted for ejKernel's sake:
    libattn always has a heuristic pick."""
    allow_autotune: bool = True
    allow_heuristics: bool = True
    cache_miss_fallback: str = "heuristics"
    validate_backward: bool = False
    deterministic: bool = False

    def fields(self):
        if self.cache_miss_fallback not in ("autotune", "heuristics"):
            raise ValueError(f"cache_miss_fallback={self.cache_miss_fallback!r}: expected "
                             "'autotune' or 'heuristics'")
        return {"allow_autotune": bool(self.allow_autotune),
                "on_miss": _core.ON_MISS_AUTOTUNE if self.cache_miss_fallback == "autotune"
                else _core.ON_MISS_HEURISTICS,
                "tune_backward": bool(self.validate_backward),
                "deterministic": bool(self.deterministic)}


@dataclasses.dataclass
class Tuner:
    """How candidates are timed: warmup untimed runs, at most iters timed runs (libattn stops
    earlier once the median settles), at most max_seconds per candidate."""
    warmup: int = 5
    iters: int = 100
    max_seconds: float = 2.0

    def fields(self):
        return {"warmup_iters": int(self.warmup), "measure_iters": int(self.iters),
                "max_seconds": float(self.max_seconds)}


class PersistentCache:
    """The cache file of measured results ("wisdom"; attn.h's format, shared with the C library,
    the `attn` command and libattn.torch). name: a file name under libattn's cache folder
    ($XDG_CACHE_HOME/libattn or ~/.cache/libattn, ".txt" added), or a path (with a "/");
    None: the default file ($ATTN_CACHE_PATH, else cache.txt there). persist=False reads the file
    without writing to it."""

    def __init__(self, name=None, persist=True):
        self.name = name
        self.persist = persist
        if name is None or name == "":
            self.path = None if name is None else ""
        elif "/" in str(name):
            self.path = os.fspath(name)
        else:
            base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
                os.path.expanduser("~"), ".cache")
            fname = name if str(name).endswith(".txt") else f"{name}.txt"
            self.path = os.path.join(base, "libattn", fname)

    def fields(self):
        return {"cache_path": self.path, "persist": bool(self.persist)}


@dataclasses.dataclass
class ConfigSelectorChain:
    """The executor's chain, as attn.h runs it: the in-memory cache, the persistent file,
    autotuning (per the policy, timed by the tuner), heuristics."""
    cache: ConfigCache = None
    policy: AutotunePolicy = None
    tuner: Tuner = None
    persistent: PersistentCache = None

    def fields(self):
        d = {}
        for part in (self.policy, self.tuner, self.persistent):
            if part is not None:
                d.update(part.fields())
        return d


class Executor:
    """``executor(op, *args, **kwargs)``: runs an operation (FlashAttention(),
    ScaledDotProductAttention(), or the functions) under this chain's policy. The policy travels
    with the call into the FFI handler, whose plan is made by libattn's executor under it (so a
    tuned result lands in the chain's cache file)."""

    def __init__(self, chain=None):
        self.chain = chain if chain is not None else ConfigSelectorChain()

    def __call__(self, op, *args, **kwargs):
        fn = {FlashAttention: flash_attention,
              ScaledDotProductAttention: scaled_dot_product_attention}.get(type(op), op)
        if fn not in (flash_attention, scaled_dot_product_attention):
            raise TypeError(f"op: expected FlashAttention() or ScaledDotProductAttention(), got "
                            f"{type(op).__name__}")
        return fn(*args, _policy=self.chain.fields(), **kwargs)

    def policy(self):
        """The policy a call of this executor runs under (libattn.get_policy()'s keys)."""
        p = _core.get_policy()
        p.update(self.chain.fields())
        p["autotune"] = p["on_miss"] == _core.ON_MISS_AUTOTUNE
        return p


def create_default_executor():
    """ejKernel's default executor: libattn's in-memory cache, the default cache file, the
    heuristic pick on a miss unless ATTN_AUTOTUNE=1 (libattn.set_policy changes it)."""
    return Executor(ConfigSelectorChain(cache=ConfigCache(), persistent=None))
