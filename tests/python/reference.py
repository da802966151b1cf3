"""SPEC.md's forward in float64 with plain PyTorch operations: the oracle of the Python tests.

Its SDPA-expressible part (scale, bias, masks, causal and windows, ALiBi, GQA) is itself checked
against PyTorch's math scaled_dot_product_attention in test_reference_matches_torch_sdpa, so
every comparison is anchored to PyTorch. Tensors are [B, T, H, D] (FlashAttention's layout).
"""
import torch


def visible(tq, tk, causal=False, window=(-1, -1), top_left=False, device="cpu"):
    """[tq, tk] bool: SPEC.md's causal/window rule with the alignment offset."""
    o = 0 if top_left else tk - tq
    i = torch.arange(tq, device=device)[:, None] + o
    j = torch.arange(tk, device=device)[None, :]
    left, right = window
    if causal:
        right = 0
    ok = torch.ones(tq, tk, dtype=torch.bool, device=device)
    if left >= 0:
        ok &= j >= i - left
    if right >= 0:
        ok &= j <= i + right
    return ok


def reference(q, k, v, *, bias=None, mask=None, alibi_slopes=None, sinks=None,
              q_segment_ids=None, kv_segment_ids=None, scale=None, causal=False,
              window=(-1, -1), top_left=False, softcap=0.0, seqlens_q=None, seqlens_k=None):
    """out [B, Tq, Hq, Dv] and lse [B, Hq, Tq] of SPEC.md's forward, in q's dtype."""
    b, tq, hq, d = q.shape
    tk, hkv = k.shape[1], k.shape[2]
    group = hq // hkv
    kk = k.repeat_interleave(group, dim=2)
    vv = v.repeat_interleave(group, dim=2)
    s = d ** -0.5 if scale is None else scale
    x = s * torch.einsum("bihd,bjhd->bhij", q, kk)
    if bias is not None:
        if bias.shape[1] == hkv and hkv != hq:
            bias = bias.repeat_interleave(group, dim=1)
        x = x + bias
    keep = torch.ones(b, hq, tq, tk, dtype=torch.bool, device=q.device)
    for bi in range(b):
        lq = tq if seqlens_q is None else int(seqlens_q[bi])
        lk = tk if seqlens_k is None else int(seqlens_k[bi])
        o = 0 if top_left else lk - lq
        if alibi_slopes is not None:
            slopes = alibi_slopes if alibi_slopes.dim() == 1 else alibi_slopes[bi]
            i = torch.arange(tq, device=q.device)[:, None] + o
            j = torch.arange(tk, device=q.device)[None, :]
            x[bi] = x[bi] - slopes[:, None, None].to(x.dtype) * (i - j).abs()
        vis = torch.zeros(tq, tk, dtype=torch.bool, device=q.device)
        vis[:lq, :lk] = visible(lq, lk, causal, window, top_left, q.device)
        keep[bi] &= vis
    if softcap > 0:
        x = softcap * torch.tanh(x / softcap)
    if mask is not None:
        keep = keep & mask.bool()
    if q_segment_ids is not None:
        qs, ks = q_segment_ids[:, None, :, None], kv_segment_ids[:, None, None, :]
        keep = keep & (qs == ks) & (qs >= 0)
    x = x.masked_fill(~keep, float("-inf"))
    if sinks is not None:
        a = sinks.to(x.dtype)
        a = a.expand(hq, a.shape[-1]) if a.dim() == 1 else a
        a = a[None, :, None, :].expand(b, hq, tq, a.shape[-1])
        x = torch.cat([x, a], dim=-1)
    lse = torch.logsumexp(x, dim=-1)
    p = torch.exp(x - lse[..., None]).nan_to_num(0.0)  # fully masked rows: 0
    p = p[..., :tk]
    out = torch.einsum("bhij,bjhd->bihd", p, vv)
    return out, lse
