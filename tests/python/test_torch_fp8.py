"""libattn.torch with torch.float8_e4m3fn inputs (docs/FP8.md): FlashAttention-3's descale
factors, out in bfloat16 (or float16 / float32), forward only.

The oracle is reference.py in float64 on the decoded e4m3 values times their factors (exact in
float64), which is the function FP8.md defines. Every test draws its data from the printed seed
(conftest.py); sizes are odd on purpose.
"""
import pytest
import torch

import libattn
import libattn.torch as lt
from libattn import _core
from reference import reference

F8 = torch.float8_e4m3fn
F64 = torch.float64

# The bound of out against the float64 reference, as a fraction of max|reference|, per out dtype:
# the cpu implementation decodes to float32 and keeps P in float32, so its error is out's own
# rounding (float32: ~1e-7; bfloat16: 2^-9 relative). bfloat16's is FP8.md's absolute term
# (2^-6), the rule a Hopper kernel that rounds P to e4m3 must meet too.
OUT_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2.0 ** -6}


def fp8(*shape, spread=2.0):
    """e4m3 values from a normal distribution of standard deviation `spread` (saturating)."""
    return (torch.randn(*shape) * spread).clamp(-448, 448).to(F8)


def factors(*shape):
    """Positive float32 descale factors, away from 1 so a missed or misplaced one shows."""
    return torch.rand(*shape, dtype=torch.float32) * 1.5 + 0.25


def decoded(t, factor, heads):
    """t [B, T, H, D] (e4m3) in float64, times its factor of (b, KV head of h): factor is None
    (1), one element, or [B, Hkv] with `heads` / Hkv query heads per KV head."""
    x = t.to(F64)
    if factor is None:
        return x
    f = factor.to(F64)
    if f.numel() == 1:
        return x * f.reshape(())
    group = heads // f.shape[1]
    return x * f.repeat_interleave(group, dim=1)[:, None, :, None]


def check(got, want, out_dtype):
    """out against the float64 reference under OUT_TOL; lse (if given) under FP8.md's rule."""
    out, want_out = (got[0], want[0]) if isinstance(got, tuple) else (got, want[0])
    assert out.dtype == out_dtype
    scale = max(1e-30, want_out.abs().max().item())
    err = (out.to(F64) - want_out).abs().max().item()
    assert err <= OUT_TOL[out_dtype] * scale, f"out: error {err:.3g} of max|r| {scale:.3g}"
    if isinstance(got, tuple):
        lse, want_lse = got[1], want[1]
        assert lse.dtype == torch.float32
        finite = torch.isfinite(want_lse)
        assert torch.equal(torch.isfinite(lse), finite)  # fully masked rows: -inf
        if finite.any():
            bound = 1e-3 * max(1.0, want_lse[finite].abs().max().item())
            err = (lse.to(F64)[finite] - want_lse[finite]).abs().max().item()
            assert err <= bound, f"lse: error {err:.3g} > {bound:.3g}"


# ---- flash_attn_func: FlashAttention-3's arguments --------------------------------------------

CASES = {
    # name: (b, tq, tk, hq, hkv, d, dv, descale form, options)
    "bhkv": (2, 5, 7, 4, 2, 8, 8, "bhkv", {}),
    "per_tensor": (2, 5, 7, 4, 2, 8, 8, "tensor", {}),
    "none": (1, 6, 9, 2, 2, 16, 16, None, {}),
    "causal_tq_lt_tk": (2, 5, 11, 4, 2, 8, 8, "bhkv", dict(causal=True)),
    "causal_tq_gt_tk": (2, 9, 4, 4, 2, 8, 8, "bhkv", dict(causal=True)),  # rows with no keys
    "gqa_dv": (3, 7, 5, 6, 2, 12, 5, "bhkv", {}),
    "mqa_scale": (2, 3, 13, 3, 1, 8, 8, "tensor", dict(softmax_scale=0.3)),
    "everything": (2, 9, 13, 6, 3, 16, 9, "bhkv",
                   dict(causal=True, window_size=(4, -1), softcap=3.0, alibi=True)),
    "long_d": (1, 17, 33, 2, 1, 129, 129, "bhkv", dict(causal=True)),
}


def descales(form, b, hkv):
    if form is None:
        return None, None, None
    shape = (b, hkv) if form == "bhkv" else (1,)
    return factors(*shape), factors(*shape), factors(*shape)


@pytest.mark.parametrize("case", CASES)
def test_flash_attn_func_fp8(case, seed):
    b, tq, tk, hq, hkv, d, dv, form, options = CASES[case]
    q, k, v = fp8(b, tq, hq, d), fp8(b, tk, hkv, d), fp8(b, tk, hkv, dv)
    dq, dk, dv_ = descales(form, b, hkv)
    options = dict(options)
    slopes = torch.rand(b, hq, dtype=torch.float32) * 0.5 if options.pop("alibi", False) else None
    got = lt.flash_attn_func(q, k, v, q_descale=dq, k_descale=dk, v_descale=dv_,
                             alibi_slopes=slopes, return_attn_probs=True, **options)
    want = reference(decoded(q, dq, hq), decoded(k, dk, hkv), decoded(v, dv_, hkv),
                     scale=options.get("softmax_scale"), causal=options.get("causal", False),
                     window=options.get("window_size", (-1, -1)),
                     softcap=options.get("softcap", 0.0),
                     alibi_slopes=None if slopes is None else slopes.to(F64))
    check(got[:2], want, torch.bfloat16)
    assert got[2].dtype == torch.bfloat16  # probs: of out's dtype


@pytest.mark.parametrize("align", ["bottom_right", "top_left"])
@pytest.mark.parametrize("out_dtype", [None, torch.bfloat16, torch.float16, torch.float32])
def test_attention_fp8_out_dtypes_and_alignments(align, out_dtype, seed):
    b, tq, tk, hq, hkv, d = 2, 7, 5, 6, 3, 24
    q, k, v = fp8(b, tq, hq, d), fp8(b, tk, hkv, d), fp8(b, tk, hkv, d)
    dq, dk, dv = factors(b, hkv), factors(b, hkv), factors(b, hkv)
    got = lt.attention(q, k, v, causal=True, align=align, q_descale=dq, k_descale=dk,
                       v_descale=dv, out_dtype=out_dtype, return_lse=True)
    want = reference(decoded(q, dq, hq), decoded(k, dk, hkv), decoded(v, dv, hkv), causal=True,
                     top_left=align == "top_left")
    check(got, want, out_dtype or torch.bfloat16)


def test_attention_fp8_bhtd_layout(seed):
    """PyTorch's layout, [B, H, T, D], read through strides as for every dtype."""
    q, k, v = fp8(2, 5, 4, 8), fp8(2, 9, 2, 8), fp8(2, 9, 2, 8)
    dq, dk, dv = factors(2, 2), factors(2, 2), factors(2, 2)
    got = lt.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), layout="bhtd",
                       q_descale=dq, k_descale=dk, v_descale=dv)
    want = reference(decoded(q, dq, 4), decoded(k, dk, 2), decoded(v, dv, 2))
    check(got.transpose(1, 2), want, torch.bfloat16)


def test_descales_partial_and_mixed_forms(seed):
    """FlashAttention-3 takes any of the three factors (one left out is 1); a per-tensor factor
    beside [B, Hkv] ones means the same factor for every (b, KV head)."""
    b, hq, hkv = 3, 4, 2
    q, k, v = fp8(b, 5, hq, 8), fp8(b, 6, hkv, 8), fp8(b, 6, hkv, 8)
    dk = factors(b, hkv)
    got = lt.flash_attn_func(q, k, v, k_descale=dk)
    check(got, reference(q.to(F64), decoded(k, dk, hkv), v.to(F64)), torch.bfloat16)
    dq, dv = factors(1), factors(b, hkv)
    got = lt.flash_attn_func(q, k, v, q_descale=dq, k_descale=dk, v_descale=dv)
    want = reference(decoded(q, dq, hq), decoded(k, dk, hkv), decoded(v, dv, hkv))
    check(got, want, torch.bfloat16)
    # A scalar and a broadcast [B, Hkv] view (strides 0) are the per-tensor factor too.
    s = factors(1)
    got = lt.flash_attn_func(q, k, v, q_descale=s.reshape(()), k_descale=s.expand(b, hkv),
                             v_descale=s)
    want = reference(decoded(q, s, hq), decoded(k, s, hkv), decoded(v, s, hkv))
    check(got, want, torch.bfloat16)


def test_flash_attn_varlen_func_fp8(seed):
    """Packed sequences: the factors are [B, Hkv] with B the number of sequences."""
    lens_q, lens_k, hq, hkv, d = [3, 1, 6], [5, 4, 2], 4, 2, 8
    cu_q = torch.tensor([0, 3, 4, 10], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 9, 11], dtype=torch.int32)
    q, k, v = fp8(10, hq, d), fp8(11, hkv, d), fp8(11, hkv, d)
    dq, dk, dv = factors(3, hkv), factors(3, hkv), factors(3, hkv)
    out, lse, _ = lt.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 6, 5, causal=True,
                                            q_descale=dq, k_descale=dk, v_descale=dv,
                                            return_attn_probs=True)
    assert out.dtype == torch.bfloat16 and lse.shape == (hq, 10)
    for i in range(3):
        sq, sk = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        want = reference(decoded(q[None, sq], dq[i:i + 1], hq),
                         decoded(k[None, sk], dk[i:i + 1], hkv),
                         decoded(v[None, sk], dv[i:i + 1], hkv), causal=True)
        check((out[None, sq], lse[None, :, sq]), want, torch.bfloat16)


def test_scaled_dot_product_attention_fp8(seed):
    """The SDPA-style function takes e4m3 tensors too (no descale: torch's has none); out is
    bfloat16."""
    q, k, v = fp8(2, 3, 5, 8), fp8(2, 3, 7, 8), fp8(2, 3, 7, 8)
    got = lt.scaled_dot_product_attention(q, k, v, is_causal=True)
    want = reference(*(t.transpose(1, 2).to(F64) for t in (q, k, v)), causal=True,
                     top_left=True)
    check(got.transpose(1, 2), want, torch.bfloat16)


def test_repeated_fp8_calls_keep_out_dtype(seed):
    """A repeated call may take the memo (_ext.c): an fp8 call must still give bfloat16 out and
    read its (new) factors every time."""
    q, k, v = fp8(2, 5, 4, 8), fp8(2, 7, 2, 8), fp8(2, 7, 2, 8)
    want = reference(q.to(F64), k.to(F64), v.to(F64), causal=True)
    for _ in range(3):
        check(lt.flash_attn_func(q, k, v, causal=True), want, torch.bfloat16)
    for _ in range(2):
        dk = factors(2, 2)
        want = reference(q.to(F64), decoded(k, dk, 2), v.to(F64), causal=True)
        check(lt.flash_attn_func(q, k, v, causal=True, k_descale=dk), want, torch.bfloat16)


# ---- torch.compile ------------------------------------------------------------------------------


def test_torch_compile_fp8(seed):
    q, k, v = fp8(2, 5, 4, 8), fp8(2, 7, 2, 8), fp8(2, 7, 2, 8)
    dq, dk, dv = factors(2, 2), factors(1), factors(2, 2)

    def layer(q, k, v, dq, dk, dv):
        out = lt.flash_attn_func(q, k, v, causal=True, q_descale=dq, k_descale=dk, v_descale=dv)
        return out.float() * 2

    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    got = compiled(q, k, v, dq, dk, dv)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, layer(q, k, v, dq, dk, dv), rtol=0, atol=0)


# ---- forward only ----------------------------------------------------------------------------


def test_fp8_backward_raises(seed):
    q, k, v = fp8(2, 5, 4, 8), fp8(2, 7, 2, 8), fp8(2, 7, 2, 8)
    q.requires_grad_()
    out = lt.flash_attn_func(q, k, v, q_descale=factors(2, 2))  # the forward runs
    with pytest.raises(libattn.Unsupported) as info:
        out.float().sum().backward()
    assert "q" in str(info.value) and "backward" in str(info.value)
    with torch.no_grad():
        assert lt.flash_attn_func(q, k, v).dtype == torch.bfloat16


# ---- bad input: an exception naming the argument and the rule --------------------------------


def _raises(exc, name, fn, *args, **kwargs):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert str(info.value).startswith(name + ":"), str(info.value)
    return str(info.value)


def test_fp8_bad_input():
    q, k, v = fp8(2, 5, 4, 8), fp8(2, 7, 2, 8), fp8(2, 7, 2, 8)
    good = factors(2, 2)
    _raises(ValueError, "q_descale", lt.flash_attn_func, q, k, v, q_descale=factors(2, 4))
    _raises(ValueError, "v_descale", lt.flash_attn_func, q, k, v, v_descale=factors(2))
    _raises(TypeError, "k_descale", lt.flash_attn_func, q, k, v,
            k_descale=good.to(torch.float16))
    _raises(TypeError, "k_descale", lt.flash_attn_func, q, k, v, k_descale=[1.0])
    _raises(ValueError, "q_descale", lt.flash_attn_func, q, k, v, q_descale=good.to("meta"))
    _raises(TypeError, "k", lt.flash_attn_func, q, k.to(torch.bfloat16), v)
    _raises(TypeError, "v", lt.flash_attn_func, q, k, v.to(torch.bfloat16))
    qb = q.to(torch.bfloat16)
    rule = _raises(TypeError, "q_descale", lt.flash_attn_func, qb, k.to(torch.bfloat16),
                   v.to(torch.bfloat16), q_descale=good)
    assert "float8_e4m3fn" in rule
    _raises(TypeError, "out_dtype", lt.attention, q, k, v, out_dtype=F8)
    _raises(TypeError, "out_dtype", lt.attention, q, k, v, out_dtype=torch.float64)
    _raises(TypeError, "out_dtype", lt.attention, qb, k.to(torch.bfloat16),
            v.to(torch.bfloat16), out_dtype=torch.float32)
    _raises(TypeError, "out_dtype", lt.attention, q, k, v, out_dtype="bf16")
    # The library's own rule stands behind the checks: a float8_e5m2 tensor is not e4m3.
    _raises(TypeError, "q", lt.flash_attn_func, q.to(torch.float8_e5m2), k, v)


# ---- the binding's layouts -----------------------------------------------------------------------


def test_problem_tuple_layout_round_trips():
    """The problem tuple is laid out by the binding's table (_core.PROBLEM_FIELDS): fp8's and the
    paged cache's fields cross both ways, and a short tuple keeps the defaults past its end."""
    text = "b3 hq8 hkv2 sq5 sk9 d64 f8e4m3 causal out=f32 descale=bhkv"
    problem = _core.parse_problem(text)
    assert len(problem) == len(_core.PROBLEM_FIELDS)
    fields = dict(zip(_core.PROBLEM_FIELDS, problem))
    assert fields["dtype"] == _core.DTYPE_F8E4M3 and fields["out_dtype"] == _core.DTYPE_F32
    assert fields["descale"] == _core.DESCALE_PER_BATCH_KV_HEAD
    assert _core.parse_problem(_core.problem_string(problem)) == problem
    short = problem[:36]
    assert _core.problem_string(short) == "b3 hq8 hkv2 sq5 sk9 d64 f8e4m3 causal"
    with pytest.raises(TypeError):
        _core.problem_string(problem + (0,))
    paged = _core.make_problem(batch=2, seqlen_q=1, seqlen_k=40, heads_q=4, heads_kv=2,
                               head_dim=8, dtype=_core.DTYPE_F32, page_size=16)
    assert dict(zip(_core.PROBLEM_FIELDS, _core.parse_problem(
        _core.problem_string(paged))))["page_size"] == 16
    assert _core.INPUT_FIELDS[14:17] == ("q_descale", "k_descale", "v_descale")
