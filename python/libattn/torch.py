"""libattn.torch: the PyTorch front-end.

Drop-in functions for code written against FlashAttention 2 (``flash_attn_func`` and friends:
[B, T, H, D] tensors, bottom-right causal) or PyTorch (``scaled_dot_product_attention``:
[B, H, T, D], top-left ``is_causal``), and ``attention`` with every feature of SPEC.md by keyword.

All of them run two custom operators, ``torch.ops.libattn.fwd`` and ``torch.ops.libattn.bwd``,
registered with torch.library: autograd is registered on them (dq, dk, dv, dbias, dsinks) and
fake implementations give torch.compile the output shapes, so ``torch.compile(fullgraph=True)``
traces a model through them. Tensors cross into the C library as data pointers and strides
(libattn._ext), never through PyTorch's C++ ABI, so one build works with any PyTorch >= 2.4.
CUDA tensors run on the current stream of their device, with no host synchronisation.
"""

import operator
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _core, _ext

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_qkvpacked_func",
           "flash_attn_kvpacked_func", "flash_attn_varlen_qkvpacked_func",
           "flash_attn_varlen_kvpacked_func", "scaled_dot_product_attention", "attention"]

_DTYPES = {torch.float32: _core.DTYPE_F32, torch.float16: _core.DTYPE_F16,
           torch.bfloat16: _core.DTYPE_BF16, torch.float64: _core.DTYPE_F64,
           torch.float8_e4m3fn: _core.DTYPE_F8E4M3}
_TORCH_DTYPES = {code: dtype for dtype, code in _DTYPES.items()}
_DTYPE_NAMES = "float16, bfloat16, float32, float64 or float8_e4m3fn"
_FP8 = torch.float8_e4m3fn
# out of a float8_e4m3fn call (docs/FP8.md): bfloat16 by default, as FlashAttention-3's.
_FP8_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# ---- the problem of a call -------------------------------------------------------------------


def _broadcast_shape(t):
    """A broadcast input's shape as attn.h reads it: a dimension of stride 0 has size 1."""
    return tuple(1 if st == 0 else n for n, st in zip(t.shape, t.stride()))


def _problem(q, k, v, bias, mask, alibi_slopes, sinks, q_segment_ids, cu_seqlens_q, seqlens_q,
             max_seqlen_q, max_seqlen_k, scale, causal, top_left, window_left, window_right,
             softcap, dropout_p, sdpa, q_descale=None, out_dtype=_core.OUT_DTYPE_DEFAULT):
    packed = cu_seqlens_q is not None
    if packed:
        total_q, hq, d = q.shape
        total_k, hkv, _ = k.shape
        batch, tq, tk = cu_seqlens_q.shape[0] - 1, max_seqlen_q, max_seqlen_k
        varlen = _core.VARLEN_PACKED
    else:
        batch, tq, hq, d = q.shape
        tk, hkv = k.shape[1], k.shape[2]
        total_q = total_k = 0
        varlen = _core.VARLEN_PADDED if seqlens_q is not None else _core.VARLEN_NONE
    bshape = _broadcast_shape(bias) if bias is not None else (0, 0, 0, 0)
    mshape = _broadcast_shape(mask) if mask is not None else (0, 0, 0, 0)
    cuda = q.device.type == "cuda"
    return (
        _core.OP_SDPA if sdpa else _core.OP_FLASH, _DTYPES[q.dtype],
        _core.DEVICE_CUDA if cuda else _core.DEVICE_CPU, (q.device.index or 0) if cuda else 0,
        batch, tq, tk, hq, hkv, d, 0 if v.shape[-1] == d else v.shape[-1], float(scale),
        int(causal),
        _core.ALIGN_TOP_LEFT if top_left else _core.ALIGN_BOTTOM_RIGHT, window_left, window_right,
        float(softcap), float(dropout_p),
        int(bias is not None), _DTYPES[bias.dtype] if bias is not None else 0, *bshape,
        int(mask is not None), *mshape,
        0 if alibi_slopes is None else (_core.ALIBI_PER_HEAD if alibi_slopes.dim() == 1
                                         else _core.ALIBI_PER_BATCH_HEAD),
        0 if sinks is None else sinks.shape[-1], int(sinks is not None and sinks.dim() == 1),
        int(q_segment_ids is not None), varlen, total_q, total_k,
        # The fields appended for fp8 (_core.PROBLEM_FIELDS): the checks made the three descale
        # tensors alike, so q_descale's size says the form.
        out_dtype, _core.DESCALE_NONE if q_descale is None else
        (_core.DESCALE_TENSOR if q_descale.numel() == 1 else _core.DESCALE_PER_BATCH_KV_HEAD))


def _t(t):
    """A tensor as the binding takes it: (data pointer, *strides), or None."""
    if t is None:
        return None
    return (t.data_ptr(), *t.stride())


def _p(t):
    return None if t is None else t.data_ptr()


def _inputs(q, k, v, bias, mask, alibi_slopes, sinks, q_segment_ids, kv_segment_ids,
            cu_seqlens_q, cu_seqlens_k, seqlens_q, seqlens_k, seed, q_descale=None,
            k_descale=None, v_descale=None):
    """The inputs tuple in _core.INPUT_FIELDS' order; without descale factors it stops before
    them (the binding's defaults: none)."""
    inputs = (_t(q), _t(k), _t(v), _t(bias), _t(mask), _t(alibi_slopes), _t(sinks),
              _t(q_segment_ids), _t(kv_segment_ids), _p(cu_seqlens_q), _p(cu_seqlens_k),
              _p(seqlens_q), _p(seqlens_k), seed)
    if q_descale is None:
        return inputs
    return (*inputs, _t(q_descale), _t(k_descale), _t(v_descale))


# The cudaStream_t of a device's current stream, by device index: PyTorch's own fast query (no
# Stream object per call) where it has one.
_raw_stream = (getattr(torch._C, "_cuda_getCurrentRawStream", None)
               or (lambda index: torch.cuda.current_stream(index).cuda_stream))


def _stream(t):
    """The cudaStream_t of t's device's current stream (None on the CPU)."""
    return _raw_stream(t.get_device()) if t.is_cuda else None


def _workspace(nbytes, device):
    """Workspace for a GPU plan, from PyTorch's caching allocator (stream-ordered, graph-safe);
    a CPU plan given none allocates its own."""
    if nbytes == 0 or device.type != "cuda":
        return None, 0, None
    buf = torch.empty(nbytes, dtype=torch.uint8, device=device)
    return buf.data_ptr(), nbytes, buf


def _out_dtype(q, out_dtype):
    """The torch dtype of out (and probs) for q and the operator's out_dtype (an attn_dtype,
    -1 = the problem's: q's, bfloat16 for float8_e4m3fn)."""
    if out_dtype == _core.OUT_DTYPE_DEFAULT:
        return torch.bfloat16 if q.dtype == _FP8 else q.dtype
    return _TORCH_DTYPES[out_dtype]


def _new_out(q, dv, dtype=None):
    """out for q [B, Tq, Hq, D] and Dv (of dtype, default q's): with Dv == D, torch.empty_like(q),
    which keeps a dense q's memory order as FlashAttention and PyTorch's cuDNN SDPA do (q read
    through [B, H, T, D] gives out the same way, no copy either side); otherwise contiguous."""
    dtype = dtype or q.dtype
    if dv == q.shape[-1]:
        return torch.empty_like(q, dtype=dtype)
    return q.new_empty((*q.shape[:-1], dv), dtype=dtype)


def _lse_shape(q, cu_seqlens_q):
    if cu_seqlens_q is not None:
        return (q.shape[1], q.shape[0])
    return (q.shape[0], q.shape[2], q.shape[1])


def _stat_dtype(q):
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _probs_shape(q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k):
    if cu_seqlens_q is not None:
        return (cu_seqlens_q.shape[0] - 1, q.shape[1], max_seqlen_q, max_seqlen_k)
    return (q.shape[0], q.shape[2], q.shape[1], k.shape[1])


# ---- the custom operators --------------------------------------------------------------------


def _forward_plan(q, k, v, bias, mask, alibi_slopes, sinks, q_segment_ids, kv_segment_ids,
                  cu_seqlens_q, cu_seqlens_k, seqlens_q, seqlens_k, q_descale, k_descale,
                  v_descale, max_seqlen_q, max_seqlen_k, scale, causal, top_left, window_left,
                  window_right, softcap, dropout_p, seed, return_probs, sdpa, impl, config,
                  platform, deterministic, out_dtype):
    """The plan of a forward call, from _fwd's arguments (this thread's, cached per problem)."""
    sdpa = sdpa or return_probs  # attn.h returns probabilities from the SDPA operation only
    problem = _problem(q, k, v, bias, mask, alibi_slopes, sinks, q_segment_ids, cu_seqlens_q,
                       seqlens_q, max_seqlen_q, max_seqlen_k, scale, causal, top_left,
                       window_left, window_right, softcap, dropout_p, sdpa, q_descale, out_dtype)
    return _core.get_plan(problem, impl, config, platform, deterministic)


def _fwd_impl(need_lse, q, k, v, bias, mask, alibi_slopes, sinks, q_segment_ids, kv_segment_ids,
              cu_seqlens_q, cu_seqlens_k, seqlens_q, seqlens_k, q_descale, k_descale, v_descale,
              max_seqlen_q, max_seqlen_k, scale, causal, top_left, window_left, window_right,
              softcap, dropout_p, seed, return_probs, sdpa, impl, config, platform, deterministic,
              out_dtype):
    """The forward pass: out, and lse / probs when asked (None otherwise)."""
    plan = _forward_plan(q, k, v, bias, mask, alibi_slopes, sinks, q_segment_ids, kv_segment_ids,
                         cu_seqlens_q, cu_seqlens_k, seqlens_q, seqlens_k, q_descale, k_descale,
                         v_descale, max_seqlen_q, max_seqlen_k, scale, causal, top_left,
                         window_left, window_right, softcap, dropout_p, seed, return_probs, sdpa,
                         impl, config, platform, deterministic, out_dtype)
    dtype = _out_dtype(q, out_dtype)
    out = _new_out(q, v.shape[-1], dtype)
    lse = (torch.empty(_lse_shape(q, cu_seqlens_q), dtype=_stat_dtype(q), device=q.device)
           if need_lse or return_probs else None)
    probs = (q.new_empty(_probs_shape(q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k),
                         dtype=dtype) if return_probs else None)
    ws, ws_size, _keep = _workspace(plan.forward_workspace, q.device)
    _ext.forward(plan.capsule,
                 _inputs(q, k, v, bias, mask, alibi_slopes, sinks, q_segment_ids, kv_segment_ids,
                         cu_seqlens_q, cu_seqlens_k, seqlens_q, seqlens_k, seed, q_descale,
                         k_descale, v_descale),
                 _t(out), _t(lse), _t(probs), _stream(q), ws, ws_size)
    return out, lse, probs


@torch.library.custom_op("libattn::fwd", mutates_args=())
def _fwd(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], mask: Optional[Tensor],
         alibi_slopes: Optional[Tensor], sinks: Optional[Tensor],
         q_segment_ids: Optional[Tensor], kv_segment_ids: Optional[Tensor],
         cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
         seqlens_q: Optional[Tensor], seqlens_k: Optional[Tensor], q_descale: Optional[Tensor],
         k_descale: Optional[Tensor], v_descale: Optional[Tensor], max_seqlen_q: int,
         max_seqlen_k: int, scale: float, causal: bool, top_left: bool, window_left: int,
         window_right: int, softcap: float, dropout_p: float, seed: int, return_probs: bool,
         sdpa: bool, impl: Optional[str], config: Optional[str], platform: int,
         deterministic: bool, out_dtype: int) -> Tuple[Tensor, Tensor, Tensor]:
    out, lse, probs = _fwd_impl(
        True, q, k, v, bias, mask, alibi_slopes, sinks, q_segment_ids, kv_segment_ids,
        cu_seqlens_q, cu_seqlens_k, seqlens_q, seqlens_k, q_descale, k_descale, v_descale,
        max_seqlen_q, max_seqlen_k, scale, causal, top_left, window_left, window_right, softcap,
        dropout_p, seed, return_probs, sdpa, impl, config, platform, deterministic, out_dtype)
    return out, lse, probs if probs is not None else out.new_empty((0,))


@_fwd.register_fake
def _fwd_fake(q, k, v, bias, mask, alibi_slopes, sinks, q_segment_ids, kv_segment_ids,
              cu_seqlens_q, cu_seqlens_k, seqlens_q, seqlens_k, q_descale, k_descale, v_descale,
              max_seqlen_q, max_seqlen_k, scale, causal, top_left, window_left, window_right,
              softcap, dropout_p, seed, return_probs, sdpa, impl, config, platform,
              deterministic, out_dtype):
    dtype = _out_dtype(q, out_dtype)
    out = _new_out(q, v.shape[-1], dtype)
    lse = q.new_empty(_lse_shape(q, cu_seqlens_q), dtype=_stat_dtype(q))
    probs = (q.new_empty(_probs_shape(q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k),
                         dtype=dtype) if return_probs else out.new_empty((0,)))
    return out, lse, probs


def _bwd_impl(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
              bias: Optional[Tensor], mask: Optional[Tensor], alibi_slopes: Optional[Tensor],
              sinks: Optional[Tensor], q_segment_ids: Optional[Tensor],
              kv_segment_ids: Optional[Tensor], cu_seqlens_q: Optional[Tensor],
              cu_seqlens_k: Optional[Tensor], seqlens_q: Optional[Tensor],
              seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int, scale: float,
              causal: bool, top_left: bool, window_left: int, window_right: int, softcap: float,
              dropout_p: float, seed: int, sdpa: bool, impl: Optional[str], config: Optional[str],
              platform: int, deterministic: bool, need_dbias: bool,
              need_dsinks: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    problem = _problem(q, k, v, bias, mask, alibi_slopes, sinks, q_segment_ids, cu_seqlens_q,
                       seqlens_q, max_seqlen_q, max_seqlen_k, scale, causal, top_left,
                       window_left, window_right, softcap, dropout_p, sdpa)
    plan = _core.get_plan(problem, impl, config, platform, deterministic)
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    dq, dk, dv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
    dbias = (bias.new_empty(_broadcast_shape(bias)) if need_dbias else q.new_empty((0,)))
    dsinks = (torch.empty(sinks.shape, dtype=_stat_dtype(q), device=q.device) if need_dsinks
              else q.new_empty((0,)))
    ws, ws_size, _keep = _workspace(plan.backward_workspace, q.device)
    _ext.backward(plan.capsule,
                  _inputs(q, k, v, bias, mask, alibi_slopes, sinks, q_segment_ids,
                          kv_segment_ids, cu_seqlens_q, cu_seqlens_k, seqlens_q, seqlens_k, seed),
                  _t(out), _t(lse), _t(dout), _t(dq), _t(dk), _t(dv),
                  _t(dbias) if need_dbias else None, _t(dsinks) if need_dsinks else None,
                  _stream(q), ws, ws_size)
    return dq, dk, dv, dbias, dsinks


_bwd = torch.library.custom_op("libattn::bwd", _bwd_impl, mutates_args=())


@_bwd.register_fake
def _bwd_fake(dout, q, k, v, out, lse, bias, mask, alibi_slopes, sinks, q_segment_ids,
              kv_segment_ids, cu_seqlens_q, cu_seqlens_k, seqlens_q, seqlens_k, max_seqlen_q,
              max_seqlen_k, scale, causal, top_left, window_left, window_right, softcap,
              dropout_p, seed, sdpa, impl, config, platform, deterministic, need_dbias,
              need_dsinks):
    dbias = bias.new_empty(_broadcast_shape(bias)) if need_dbias else q.new_empty((0,))
    dsinks = (sinks.new_empty(sinks.shape, dtype=_stat_dtype(q)) if need_dsinks
              else q.new_empty((0,)))
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dbias, dsinks


_TENSOR_INPUTS = 16  # q .. v_descale: the tensors of _fwd, saved for the backward pass
_BWD_TENSORS = 13  # q .. seqlens_k: those _bwd takes (float8_e4m3fn, the one with descale
# factors, has no backward)
_SCALARS = ("max_seqlen_q", "max_seqlen_k", "scale", "causal", "top_left", "window_left",
            "window_right", "softcap", "dropout_p", "seed", "return_probs", "sdpa", "impl",
            "config", "platform", "deterministic", "out_dtype")


def _no_fp8_backward(q):
    """Raises for a backward pass of float8_e4m3fn inputs (docs/FP8.md: forward only)."""
    if q.dtype == _FP8:
        raise _core.Unsupported(
            "q: float8_e4m3fn attention has no backward pass (forward only, as FlashAttention-3's "
            "fp8; train in bfloat16, or call it under torch.no_grad() or on tensors that do not "
            "require grad)")


def _setup_context(ctx, inputs, output):
    tensors = inputs[:_TENSOR_INPUTS]
    out, lse, _ = output
    ctx.save_for_backward(*tensors, out, lse)
    ctx.scalars = inputs[_TENSOR_INPUTS:]
    bias, sinks = inputs[3], inputs[6]
    ctx.need_dbias = bias is not None and bias.requires_grad
    ctx.need_dsinks = sinks is not None and sinks.requires_grad
    ctx.bias_shape = None if bias is None else bias.shape
    ctx.sinks_dtype = None if sinks is None else sinks.dtype


def _backward(ctx, dout, dlse, dprobs, bwd=None):
    saved = ctx.saved_tensors
    tensors, out, lse = saved[:_TENSOR_INPUTS], saved[_TENSOR_INPUTS], saved[_TENSOR_INPUTS + 1]
    (max_seqlen_q, max_seqlen_k, scale, causal, top_left, window_left, window_right, softcap,
     dropout_p, seed, return_probs, sdpa, impl, config, platform, deterministic,
     _out_dtype_code) = ctx.scalars
    _no_fp8_backward(tensors[0])
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv, dbias, dsinks = (bwd or _bwd)(
        dout, tensors[0], tensors[1], tensors[2], out, lse, *tensors[3:_BWD_TENSORS],
        max_seqlen_q, max_seqlen_k, scale, causal, top_left, window_left, window_right, softcap,
        dropout_p, seed, sdpa or return_probs, impl, config, platform, deterministic,
        ctx.need_dbias, ctx.need_dsinks)
    grads = [dq, dk, dv, dbias.expand(ctx.bias_shape) if ctx.need_dbias else None, None, None,
             dsinks.to(ctx.sinks_dtype) if ctx.need_dsinks else None]
    return (*grads, *([None] * (_TENSOR_INPUTS - len(grads) + len(_SCALARS))))


_fwd.register_autograd(_backward, setup_context=_setup_context)


class _EagerAttention(torch.autograd.Function):
    """Eager mode's autograd: the same implementation as the operators, without the cost of
    PyTorch's dispatcher and custom-op wrappers (tens of microseconds per call, docs/PYTHON.md).
    torch.compile, fake tensors and tensor subclasses take the operators."""

    @staticmethod
    def forward(ctx, *args):
        out, lse, probs = _fwd_impl(True, *args)
        probs = probs if probs is not None else out.new_empty((0,))
        _setup_context(ctx, args, (out, lse, probs))
        ctx.mark_non_differentiable(lse, probs)
        return out, lse, probs

    @staticmethod
    def backward(ctx, dout, dlse, dprobs):
        return _backward(ctx, dout, dlse, dprobs, bwd=_bwd_impl)


_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 0)
_function_modes = getattr(torch._C, "_is_torch_function_mode_enabled", lambda: False)


_compiling = torch.compiler.is_compiling


def _eager(q):
    """True when the direct path gives what the operators would: plain tensors, no tracing."""
    return (type(q) is Tensor and not _compiling() and not _dispatch_modes()
            and not _function_modes())


# ---- the memo: a repeated call in one call to the binding -------------------------------------
#
# A call of q, k, v and options only, whose kind was seen before (the same options, and q, k, v of
# the same shapes, strides, dtypes and devices), is run by _ext.memo_forward from an entry kept
# beside this thread's plans: no Python checks, no problem tuple, outputs allocated and the plan
# run from C (python/src/_ext.c). A call that records autograd runs _MemoAttention, whose forward
# and backward are one call to the binding each. The first call of a kind takes the checked path,
# which adds the entry (_remember); everything the checks read is in the key, so a call they would
# refuse never finds one. The binding's gate is _eager's: exact torch.Tensor arguments and no
# dispatch or function mode (torch.compile's tracing is excluded by the callers, _compiling()).

_memo_forward = _ext.memo_forward


class _MemoAttention(torch.autograd.Function):
    """Autograd of a call run from its memo entry (gradients dq, dk, dv: the memo takes no bias
    or sinks)."""

    @staticmethod
    def forward(ctx, q, k, v, entry, key):
        out, lse = _ext.memo_run(entry, key, q, k, v)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.memo = entry, key
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        if dout.stride(-1) != 1:
            dout = dout.contiguous()
        dq, dk, dv = _ext.memo_backward(*ctx.memo, q, k, v, out, lse, dout)
        return dq, dk, dv, None, None


def _memo_autograd(entry, key, q, k, v):
    """The binding's autograd hook: the result of a call that records autograd."""
    out, lse = _MemoAttention.apply(q, k, v, entry, key)
    return (out, lse) if entry[4] else out  # entry[4]: return_lse (_ext.c, the entry's layout)


_ext.memo_hooks(Tensor, torch.is_grad_enabled, (_dispatch_modes, _function_modes),
                _memo_autograd, torch.empty_like)


def _remember(options, given, views, checked, args, out, bhtd, return_lse):
    """Adds the memo entry of a call that passed the checks and ran eagerly:
    given are q, k, v as the caller passed them, views what was checked (transposed to
    [B, T, H, D] for bhtd), checked what the checks returned, args _fwd's arguments, out the
    result as returned."""
    try:
        hash(options)
    except TypeError:
        return  # an unhashable option (a list for window, say): never kept
    if any(a is not b for a, b in zip(views, checked)):
        return  # the checks replaced a tensor (an all-broadcast one, copied): not repeated
    q = checked[0]
    if q.dtype == _FP8:
        return  # out's dtype is not q's (the entry allocates like q): the checked path runs it
    dv = given[2].shape[-1]
    if dv == given[0].shape[-1]:
        alloc_out = (torch.empty_like, None)  # _new_out's rule
    elif not bhtd:
        alloc_out = (Tensor.new_empty, {"size": (*given[0].shape[:-1], dv)})
    else:
        return  # Dv != D in [B, H, T, D]: out is a view the checked path makes; not repeated
    if out.stride() != alloc_out[0](given[0], **(alloc_out[1] or {})).stride():
        return  # the memo's out would not be laid out as the checked path's
    plan = _forward_plan(*args)
    cuda = q.is_cuda
    # A CPU plan given no workspace allocates its own; a GPU plan's comes from PyTorch's caching
    # allocator, as _workspace's.
    ws = [(Tensor.new_empty, {"size": (n,), "dtype": torch.uint8}) if cuda and n else None
          for n in (plan.forward_workspace, plan.backward_workspace)]
    entry = (plan.capsule, bhtd, alloc_out,
             (Tensor.new_empty, {"size": _lse_shape(q, None), "dtype": _stat_dtype(q)}),
             bool(return_lse), ws[0], plan.forward_workspace, ws[1], plan.backward_workspace,
             _raw_stream if cuda else None, q.get_device())
    _core.remember(_ext.memo_key(options, *given), entry)


# ---- checks: every tensor's dtype, device and shape, before any pointer crosses ---------------


def _fail(name, rule, exc=ValueError):
    raise exc(f"{name}: {rule}")


def _check_tensor(name, t, device, ndim=None):
    if not isinstance(t, Tensor):
        _fail(name, f"expected a torch.Tensor, got {type(t).__name__}", TypeError)
    if t.device != device:
        _fail(name, f"is on {t.device} but q is on {device}: every tensor must be on q's device")
    if ndim is not None and t.dim() not in ((ndim,) if isinstance(ndim, int) else ndim):
        _fail(name, f"expected {ndim} dimensions, got shape {tuple(t.shape)}")


def _check_shape(name, t, expected):
    """expected: a tuple of sizes, each an int or a tuple of allowed sizes."""
    if t.shape[:len(expected)] == expected:  # the common case, without the loop
        return
    for d, (n, want) in enumerate(zip(t.shape, expected)):
        allowed = want if isinstance(want, tuple) else (want,)
        if n not in allowed:
            _fail(name, f"dimension {d} has size {n}, expected "
                  f"{' or '.join(str(a) for a in allowed)} (shape {tuple(t.shape)})")


def _dense_if_all_broadcast(t):
    # attn.h reads all-zero strides as "dense": a tensor broadcast along every dimension is
    # passed as its one real element... copied, so no stride pattern is ambiguous.
    if t is not None and t.numel() > 1 and not any(t.stride()):
        return t.contiguous()
    return t


def _plain_qkv_ok(q, k, v):
    """The common call's checks (dense q, k, v and nothing else) in few operations; anything in
    doubt goes through the full checks, which name the argument."""
    if type(q) is not Tensor or type(k) is not Tensor or type(v) is not Tensor:
        return False
    qs, ks, vs = q.shape, k.shape, v.shape
    dtype = q.dtype
    return (len(qs) == 4 and len(ks) == 4 and len(vs) == 4 and dtype in _DTYPES
            and k.dtype is dtype and v.dtype is dtype and ks[0] == qs[0] and ks[3] == qs[3]
            and vs[:3] == ks[:3] and qs[2] % ks[2] == 0 and q.stride(3) == 1
            and k.stride(3) == 1 and v.stride(3) == 1 and k.device == q.device
            and v.device == q.device)


def _check_inputs(q, k, v, bias, mask, alibi_slopes, sinks, q_segment_ids, kv_segment_ids,
                  cu_seqlens_q, cu_seqlens_k, seqlens_q, seqlens_k, max_seqlen_q, max_seqlen_k):
    """Raises ValueError/TypeError naming the argument; returns the inputs as the operator
    takes them (index tensors in int32, ALiBi slopes and sinks in the statistics dtype)."""
    if (bias is None and mask is None and alibi_slopes is None and sinks is None
            and q_segment_ids is None and kv_segment_ids is None and cu_seqlens_q is None
            and cu_seqlens_k is None and seqlens_q is None and seqlens_k is None
            and _plain_qkv_ok(q, k, v)):
        return (q, k, v, None, None, None, None, None, None, None, None, None, None, q.shape[1],
                k.shape[1])
    if not isinstance(q, Tensor):
        _fail("q", f"expected a torch.Tensor, got {type(q).__name__}", TypeError)
    if q.dtype not in _DTYPES:
        _fail("q", f"dtype {q.dtype} is not supported ({_DTYPE_NAMES})", TypeError)
    device = q.device
    packed = cu_seqlens_q is not None or cu_seqlens_k is not None
    dims = 3 if packed else 4
    layout = "[total, H, D]" if packed else "[B, T, H, D]"
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t, device)
        if t.dtype != q.dtype:
            _fail(name, f"dtype {t.dtype} differs from q's {q.dtype}", TypeError)
        if t.dim() != dims:
            _fail(name, f"expected {dims} dimensions {layout}, got shape {tuple(t.shape)}")
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            _fail(name, f"the last dimension must be contiguous (stride 1), got stride "
                  f"{t.stride(-1)}")
    hq, d = q.shape[-2], q.shape[-1]
    hkv = k.shape[-2]
    if packed:
        if cu_seqlens_q is None or cu_seqlens_k is None:
            _fail("cu_seqlens_k" if cu_seqlens_k is None else "cu_seqlens_q",
                  "packed varlen needs both cu_seqlens_q and cu_seqlens_k")
        _check_shape("k", k, (k.shape[0], hkv, d))
        _check_shape("v", v, (k.shape[0], hkv))
    else:
        batch, tk = q.shape[0], k.shape[1]
        _check_shape("k", k, (batch, tk, hkv, d))
        _check_shape("v", v, (batch, tk, hkv))
    if hq % hkv != 0:
        _fail("k", f"heads_kv={hkv} does not divide heads_q={hq}")

    def index(name, t, shape):
        _check_tensor(name, t, device, len(shape))
        if t.dtype not in (torch.int32, torch.int64):
            _fail(name, f"dtype {t.dtype} is not an integer dtype (int32)", TypeError)
        _check_shape(name, t, shape)
        return t.to(torch.int32).contiguous()

    if packed:
        batch = cu_seqlens_q.shape[0] - 1 if isinstance(cu_seqlens_q, Tensor) else -1
        cu_seqlens_q = index("cu_seqlens_q", cu_seqlens_q, (max(batch, 0) + 1,))
        cu_seqlens_k = index("cu_seqlens_k", cu_seqlens_k, (batch + 1,))
        if batch < 1:
            _fail("cu_seqlens_q", "needs at least 2 entries (one sequence)")
        sizes = []
        for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
            try:
                size = operator.index(value)
            except TypeError:
                size = -1
            if size < 0:
                _fail(name, f"expected an int >= 0, got {value!r}")
            sizes.append(size)
        max_seqlen_q, max_seqlen_k = sizes
    else:
        max_seqlen_q, max_seqlen_k = q.shape[1], k.shape[1]
    tq, tk = max_seqlen_q, max_seqlen_k
    if seqlens_q is not None or seqlens_k is not None:
        if packed:
            _fail("seqlens_q", "padded varlen (seqlens_q/k) and packed varlen (cu_seqlens_q/k) "
                  "exclude each other")
        if seqlens_q is None or seqlens_k is None:
            _fail("seqlens_k" if seqlens_k is None else "seqlens_q",
                  "padded varlen needs both seqlens_q and seqlens_k")
        seqlens_q = index("seqlens_q", seqlens_q, (batch,))
        seqlens_k = index("seqlens_k", seqlens_k, (batch,))
    if bias is not None:
        _check_tensor("bias", bias, device, 4)
        if bias.dtype not in (torch.float16, torch.bfloat16, torch.float32) and not (
                bias.dtype == torch.float64 and q.dtype == torch.float64):
            _fail("bias", f"dtype {bias.dtype} is not supported (float16, bfloat16, float32; "
                  "float64 with float64 q)", TypeError)
        _check_shape("bias", bias, ((batch, 1), (hq, hkv, 1), (tq, 1), (tk, 1)))
        bias = _dense_if_all_broadcast(bias)
    if mask is not None:
        _check_tensor("mask", mask, device, 4)
        if mask.dtype not in (torch.bool, torch.uint8):
            _fail("mask", f"dtype {mask.dtype} is not bool or uint8", TypeError)
        _check_shape("mask", mask, ((batch, 1), (hq, 1), (tq, 1), (tk, 1)))
        mask = _dense_if_all_broadcast(mask)
        if mask.dtype == torch.bool:
            mask = mask.view(torch.uint8)  # the same bytes: 0 masked, 1 kept
    stat = _stat_dtype(q)
    if alibi_slopes is not None:
        _check_tensor("alibi_slopes", alibi_slopes, device, (1, 2))
        _check_shape("alibi_slopes", alibi_slopes,
                     (hq,) if alibi_slopes.dim() == 1 else (batch, hq))
        alibi_slopes = alibi_slopes.to(stat)
    if sinks is not None:
        _check_tensor("sinks", sinks, device, (1, 2))
        if sinks.dim() == 2:
            _check_shape("sinks", sinks, (hq,))
        if sinks.shape[-1] < 1:
            _fail("sinks", "needs at least one sink logit per row")
        if not sinks.is_floating_point():
            _fail("sinks", f"dtype {sinks.dtype} is not a floating dtype", TypeError)
        sinks = sinks.to(stat)
    if (q_segment_ids is None) != (kv_segment_ids is None):
        _fail("kv_segment_ids" if kv_segment_ids is None else "q_segment_ids",
              "segment ids need both q_segment_ids and kv_segment_ids")
    if q_segment_ids is not None:
        if packed:
            _fail("q_segment_ids", "segment ids do not combine with packed varlen")
        q_segment_ids = index("q_segment_ids", q_segment_ids, (batch, tq))
        kv_segment_ids = index("kv_segment_ids", kv_segment_ids, (batch, tk))
    q, k, v = (_dense_if_all_broadcast(t) for t in (q, k, v))
    return (q, k, v, bias, mask, alibi_slopes, sinks, q_segment_ids, kv_segment_ids,
            cu_seqlens_q, cu_seqlens_k, seqlens_q, seqlens_k, max_seqlen_q, max_seqlen_k)


def _check_fp8(q, k, cu_seqlens_q, q_descale, k_descale, v_descale, out_dtype):
    """Checks the fp8 arguments (docs/FP8.md) against q and k (checked before); returns
    q_descale, k_descale, v_descale as the operator takes them: None without any, else three
    float32 tensors of one form, [B, Hkv] or [1] (one left out is ones; a per-tensor one beside a
    [B, Hkv] one is broadcast to it)."""
    fp8 = q.dtype == _FP8
    if out_dtype is not None:
        if not isinstance(out_dtype, torch.dtype):
            _fail("out_dtype", f"expected a torch.dtype, got {type(out_dtype).__name__}",
                  TypeError)
        if fp8 and out_dtype not in _FP8_OUT_DTYPES:
            _fail("out_dtype", f"{out_dtype} with float8_e4m3fn q: out must be torch.bfloat16 "
                  "(the default), torch.float16 or torch.float32", TypeError)
        if not fp8 and out_dtype != q.dtype:
            _fail("out_dtype", f"{out_dtype} with q of {q.dtype}: out has q's dtype; only "
                  "float8_e4m3fn inputs write another (bfloat16, float16 or float32)", TypeError)
    given = {name: t for name, t in (("q_descale", q_descale), ("k_descale", k_descale),
                                     ("v_descale", v_descale)) if t is not None}
    if not given:
        return None, None, None
    if not fp8:
        _fail(next(iter(given)), f"descale factors belong to float8_e4m3fn inputs only (q is "
              f"{q.dtype})", TypeError)
    batch = cu_seqlens_q.shape[0] - 1 if cu_seqlens_q is not None else q.shape[0]
    hkv = k.shape[-2]
    for name, t in given.items():
        _check_tensor(name, t, q.device)
        if t.dtype != torch.float32:
            _fail(name, f"dtype {t.dtype} is not torch.float32 (descale factors are float32)",
                  TypeError)
        if t.numel() != 1 and tuple(t.shape) != (batch, hkv):
            _fail(name, f"shape {tuple(t.shape)} is neither [B, Hkv] = [{batch}, {hkv}] (one "
                  "factor per batch entry and KV head) nor one element (per tensor)")
    shape = (batch, hkv) if any(t.numel() != 1 for t in given.values()) else (1,)

    def form(name):
        t = given.get(name)
        if t is None:
            return torch.ones(shape, dtype=torch.float32, device=q.device)
        if t.numel() == 1:  # expanded to [B, Hkv] by a copy: strides all 0 would read as dense
            return t.reshape(1).expand(shape).contiguous()
        return _dense_if_all_broadcast(t)

    return form("q_descale"), form("k_descale"), form("v_descale")


def _seed(dropout_p, dropout_seed):
    if dropout_seed is not None:
        seed = int(dropout_seed) & 0xFFFFFFFFFFFFFFFF
        return seed - (1 << 64) if seed >= (1 << 63) else seed  # the schema's int is int64
    if dropout_p > 0:
        # From PyTorch's default generator, so torch.manual_seed makes a run repeatable.
        return int(torch.randint(-(1 << 63), (1 << 63) - 1, (), dtype=torch.int64).item())
    return 0


def _window(window_size):
    try:
        left, right = window_size
    except (TypeError, ValueError):
        _fail("window_size", f"expected a pair (left, right), got {window_size!r}")
    return int(left), int(right)


_ALIGNS = {"bottom_right": False, "top_left": True}

# ---- attention: every feature by keyword -----------------------------------------------------


def attention(q, k, v, *, bias=None, mask=None, alibi_slopes=None, sinks=None,
              q_segment_ids=None, kv_segment_ids=None, cu_seqlens_q=None, cu_seqlens_k=None,
              max_seqlen_q=None, max_seqlen_k=None, seqlens_q=None, seqlens_k=None, scale=None,
              causal=False, align="bottom_right", window=(-1, -1), softcap=0.0, dropout_p=0.0,
              dropout_seed=None, return_lse=False, return_probs=False, layout="bthd",
              operation="flash", impl=None, config=None, platform="auto",
              deterministic=False, q_descale=None, k_descale=None, v_descale=None,
              out_dtype=None):
    """libattn's attention with every feature of SPEC.md.

    q [B, Tq, Hq, D], k [B, Tk, Hkv, D], v [B, Tk, Hkv, Dv] (layout="bthd", FlashAttention's) or
    [B, H, T, D] (layout="bhtd", PyTorch's); packed varlen: [total, H, D] with cu_seqlens_q/k
    ([B + 1], int32) and max_seqlen_q/k; padded varlen: dense tensors with seqlens_q/k ([B]).
    bias: additive [B|1, Hq|Hkv|1, Tq|1, Tk|1] (float16/bfloat16/float32), differentiable;
    mask: [B|1, Hq|1, Tq|1, Tk|1] bool/uint8, True keeps; alibi_slopes [Hq] or [B, Hq];
    sinks: [Hq, S] or [S] raw logits, differentiable; q_segment_ids [B, Tq] / kv_segment_ids
    [B, Tk] (negative = padding). scale: default 1/sqrt(D). causal and window=(left, right)
    (-1 unbounded) with align "bottom_right" (FlashAttention) or "top_left" (PyTorch). softcap > 0
    caps the logits. dropout_p with dropout_seed (drawn from torch's generator when None).
    operation: "flash" or "sdpa". impl/config/platform steer the executor ("ref", "cpu",
    "cuda", "cudnn"); deterministic selects configurations that repeat their bits.

    float8_e4m3fn q, k, v (docs/FP8.md; forward only): q_descale, k_descale, v_descale are
    float32 factors the values are read times, each [B, Hkv] (FlashAttention-3's) or one element
    (per tensor); one left out is 1. out_dtype: bfloat16 (the default), float16 or float32; other
    inputs take None or q's dtype.

    Returns out ([B, Tq, Hq, Dv] or the layout's shape); (out, lse) with return_lse, lse
    [B, Hq, Tq] (packed: [Hq, total_q]) in float32 (float64 for float64 q); (out, lse, probs) with
    return_probs, probs [B, Hq, Tq, Tk] the probabilities after dropout.
    """
    memo = None
    if (bias is None and mask is None and alibi_slopes is None and sinks is None
            and q_segment_ids is None and kv_segment_ids is None and cu_seqlens_q is None
            and cu_seqlens_k is None and seqlens_q is None and seqlens_k is None
            and q_descale is None and k_descale is None and v_descale is None
            and out_dtype is None and not return_probs and not dropout_p and not _compiling()):
        memo = ("attention", scale, causal, align, window, softcap, dropout_seed, return_lse,
                layout, operation, impl, config, platform, deterministic)
        result = _memo_forward(_core._thread().plans, memo, q, k, v)
        if result is not None:
            return result
    return _attention(q, k, v, bias=bias, mask=mask, alibi_slopes=alibi_slopes, sinks=sinks,
                      q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                      cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                      max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, seqlens_q=seqlens_q,
                      seqlens_k=seqlens_k, scale=scale, causal=causal, align=align, window=window,
                      softcap=softcap, dropout_p=dropout_p, dropout_seed=dropout_seed,
                      return_lse=return_lse, return_probs=return_probs, layout=layout,
                      operation=operation, impl=impl, config=config, platform=platform,
                      deterministic=deterministic, q_descale=q_descale, k_descale=k_descale,
                      v_descale=v_descale, out_dtype=out_dtype, memo=memo)


def _attention(q, k, v, *, bias=None, mask=None, alibi_slopes=None, sinks=None,
              q_segment_ids=None, kv_segment_ids=None, cu_seqlens_q=None, cu_seqlens_k=None,
              max_seqlen_q=None, max_seqlen_k=None, seqlens_q=None, seqlens_k=None, scale=None,
              causal=False, align="bottom_right", window=(-1, -1), softcap=0.0, dropout_p=0.0,
              dropout_seed=None, return_lse=False, return_probs=False, layout="bthd",
              operation="flash", impl=None, config=None, platform="auto",
              deterministic=False, q_descale=None, k_descale=None, v_descale=None,
              out_dtype=None, memo=None):
    """attention() past the memo: checks every input, then runs. memo: the options the caller
    looked the memo up with (None: not to be kept)."""
    given = (q, k, v)
    if layout not in ("bthd", "bhtd"):
        _fail("layout", f"expected 'bthd' or 'bhtd', got {layout!r}")
    if align not in _ALIGNS:
        _fail("align", f"expected 'bottom_right' or 'top_left', got {align!r}")
    if operation not in ("flash", "sdpa"):
        _fail("operation", f"expected 'flash' or 'sdpa', got {operation!r}")
    if not 0.0 <= float(dropout_p) < 1.0:
        _fail("dropout_p", f"{dropout_p} is outside [0, 1)")
    if scale is not None and float(scale) == 0.0:
        _fail("scale", "0 is not supported (attn.h reads 0 as the default 1/sqrt(D)); pass None "
              "for the default")
    if layout == "bhtd":
        if cu_seqlens_q is not None:
            _fail("layout", "packed varlen tensors are [total, H, D]: use layout='bthd'")
        for name, t in (("q", q), ("k", k), ("v", v)):
            if isinstance(t, Tensor) and t.dim() != 4:
                _fail(name, f"expected 4 dimensions [B, H, T, D], got shape {tuple(t.shape)}")
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    left, right = _window(window)
    views = (q, k, v)
    (q, k, v, bias, mask, alibi_slopes, sinks, q_segment_ids, kv_segment_ids, cu_seqlens_q,
     cu_seqlens_k, seqlens_q, seqlens_k, max_seqlen_q, max_seqlen_k) = _check_inputs(
        q, k, v, bias, mask, alibi_slopes, sinks, q_segment_ids, kv_segment_ids, cu_seqlens_q,
        cu_seqlens_k, seqlens_q, seqlens_k, max_seqlen_q, max_seqlen_k)
    descales = _check_fp8(q, k, cu_seqlens_q, q_descale, k_descale, v_descale, out_dtype)
    args = (q, k, v, bias, mask, alibi_slopes, sinks, q_segment_ids, kv_segment_ids, cu_seqlens_q,
            cu_seqlens_k, seqlens_q, seqlens_k, *descales, max_seqlen_q, max_seqlen_k,
            0.0 if scale is None else float(scale), bool(causal), _ALIGNS[align], left, right,
            float(softcap), float(dropout_p), _seed(dropout_p, dropout_seed), bool(return_probs),
            operation == "sdpa", impl, config, _core._platform(platform), bool(deterministic),
            _core.OUT_DTYPE_DEFAULT if out_dtype is None else _DTYPES[out_dtype])
    eager = _eager(q)
    if not eager:
        out, lse, probs = _fwd(*args)
    elif torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                         for t in (q, k, v, bias, sinks, *descales)):
        out, lse, probs = _EagerAttention.apply(*args)
    else:
        out, lse, probs = _fwd_impl(return_lse, *args)
    if layout == "bhtd":
        out = out.transpose(1, 2)
    if memo is not None and eager:
        _remember(memo, given, views, (q, k, v), args, out, layout == "bhtd", return_lse)
    if return_probs:
        return out, lse, probs
    if return_lse:
        return out, lse
    return out


# ---- FlashAttention 2's functions ------------------------------------------------------------


def _flash(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
           deterministic, return_attn_probs, memo=None, **more):
    return _attention(q, k, v, alibi_slopes=alibi_slopes, scale=softmax_scale, causal=causal,
                      window=window_size, softcap=softcap, dropout_p=dropout_p,
                      deterministic=deterministic, return_probs=return_attn_probs, memo=memo,
                      **more)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False, *, q_descale=None, k_descale=None, v_descale=None):
    """FlashAttention 2's flash_attn_func: q [B, Tq, Hq, D], k/v [B, Tk, Hkv, D]; causal is
    bottom-right aligned. Returns out, or (out, softmax_lse [B, Hq, Tq], probs [B, Hq, Tq, Tk])
    with return_attn_probs (the probabilities after dropout, not FlashAttention's sign-encoded
    S_dmask). float8_e4m3fn q, k, v take FlashAttention-3's q_descale, k_descale, v_descale
    (float32 [B, Hkv], or one element per tensor) and give a bfloat16 out (forward only)."""
    memo = None
    if not (dropout_p or return_attn_probs or alibi_slopes is not None or _compiling()
            or q_descale is not None or k_descale is not None or v_descale is not None):
        memo = ("flash_attn_func", softmax_scale, causal, window_size, softcap, deterministic)
        out = _memo_forward(_core._thread().plans, memo, q, k, v)
        if out is not None:
            return out
    return _flash(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                  deterministic, return_attn_probs, memo, q_descale=q_descale,
                  k_descale=k_descale, v_descale=v_descale)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, *,
                           q_descale=None, k_descale=None, v_descale=None):
    """FlashAttention 2's flash_attn_varlen_func: q [total_q, Hq, D], k/v [total_k, Hkv, D],
    cu_seqlens_q/k [B + 1] int32. softmax_lse is [Hq, total_q]. block_table (paged KV) is not
    supported. float8_e4m3fn inputs as flash_attn_func's (descale factors [B, Hkv], B the
    number of sequences)."""
    if block_table is not None:
        _fail("block_table", "paged KV caches are not supported by libattn.torch yet",
              NotImplementedError)
    return _flash(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                  deterministic, return_attn_probs, cu_seqlens_q=cu_seqlens_q,
                  cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                  max_seqlen_k=max_seqlen_k, q_descale=q_descale, k_descale=k_descale,
                  v_descale=v_descale)


def _unpack(name, t, dim, count):
    if not isinstance(t, Tensor):
        _fail(name, f"expected a torch.Tensor, got {type(t).__name__}", TypeError)
    if t.dim() <= dim or t.shape[dim] != count:
        _fail(name, f"expected size {count} in dimension {dim}, got shape {tuple(t.shape)}")
    return t.unbind(dim)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False):
    """FlashAttention 2's flash_attn_qkvpacked_func: qkv [B, T, 3, H, D]."""
    q, k, v = _unpack("qkv", qkv, 2, 3)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False):
    """FlashAttention 2's flash_attn_kvpacked_func: q [B, Tq, Hq, D], kv [B, Tk, 2, Hkv, D]."""
    k, v = _unpack("kv", kv, 2, 2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """FlashAttention 2's flash_attn_varlen_qkvpacked_func: qkv [total, 3, H, D]."""
    q, k, v = _unpack("qkv", qkv, 1, 3)
    return _flash(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                  deterministic, return_attn_probs, cu_seqlens_q=cu_seqlens,
                  cu_seqlens_k=cu_seqlens, max_seqlen_q=max_seqlen, max_seqlen_k=max_seqlen)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                    causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False):
    """FlashAttention 2's flash_attn_varlen_kvpacked_func: q [total_q, Hq, D],
    kv [total_k, 2, Hkv, D]."""
    k, v = _unpack("kv", kv, 1, 2)
    return _flash(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                  deterministic, return_attn_probs, cu_seqlens_q=cu_seqlens_q,
                  cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                  max_seqlen_k=max_seqlen_k)


# ---- PyTorch's scaled_dot_product_attention -------------------------------------------------


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention's signature and meaning: query
    [B, Hq, L, E] (or [N, L, E]), key [B, Hkv, S, E], value [B, Hkv, S, Ev]; attn_mask
    broadcastable to [B, Hq, L, S], boolean (True takes part) or additive (float, differentiable);
    is_causal is top-left aligned and excludes attn_mask; Hkv != Hq needs enable_gqa=True.
    Returns [B, Hq, L, Ev], laid out in memory as query is when Ev == E (as PyTorch's cuDNN
    backend does: a view of a [B, L, Hq, E] tensor gives one again), else a view of a
    [B, L, Hq, Ev] tensor."""
    memo = None
    if attn_mask is None and not dropout_p and not _compiling():
        memo = ("scaled_dot_product_attention", is_causal, scale, enable_gqa)
        out = _memo_forward(_core._thread().plans, memo, query, key, value)
        if out is not None:
            return out
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor):
            _fail(name, f"expected a torch.Tensor, got {type(t).__name__}", TypeError)
        if t.dim() != query.dim() or t.dim() not in (3, 4):
            _fail(name, f"expected 4 dimensions [B, H, T, D] (or 3, [N, T, D]) like query, got "
                  f"shape {tuple(t.shape)}")
    squeeze = query.dim() == 3
    if squeeze:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
    hq, hkv = query.shape[1], key.shape[1]
    if hq != hkv and not enable_gqa:
        _fail("key", f"has {hkv} heads but query has {hq}: pass enable_gqa=True for grouped "
              "query attention")
    bias = mask = None
    if attn_mask is not None:
        if is_causal:
            _fail("attn_mask", "must be None when is_causal=True (PyTorch's rule)")
        if not isinstance(attn_mask, Tensor):
            _fail("attn_mask", f"expected a torch.Tensor, got {type(attn_mask).__name__}",
                  TypeError)
        if attn_mask.dim() > 4:
            _fail("attn_mask", f"expected at most 4 dimensions, got {tuple(attn_mask.shape)}")
        m = attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))
        if squeeze and attn_mask.dim() == 3:  # [N, L, S] broadcast over the one head
            m = attn_mask.unsqueeze(1)
        if m.shape[1] not in (1, hq):
            _fail("attn_mask", f"head dimension {m.shape[1]} broadcasts to neither 1 nor "
                  f"{hq} heads")
        if attn_mask.dtype == torch.bool:
            mask = m
        else:
            bias = m
    # The SDPA operation where a vendor primitive may run it (cuDNN first, attn.h's executor);
    # on the CPU the flash operation, the same function, has the optimised implementation.
    out = _attention(query, key, value, bias=bias, mask=mask, scale=scale, causal=is_causal,
                     align="top_left", dropout_p=dropout_p, layout="bhtd",
                     operation="sdpa" if query.device.type == "cuda" else "flash",
                     memo=None if squeeze else memo)
    return out.squeeze(1) if squeeze else out
