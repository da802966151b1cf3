"""libattn.torch on CUDA tensors: the cuda and cudnn implementations, streams, CUDA graphs, two
GPUs, torch.compile with Inductor. Run on a machine with a GPU (make test-python does not collect
this folder: CI has no GPU):

    build/venv/bin/python -m pytest -q tests/python/gpu     # from the repository root

Low-precision results are checked with SPEC.md's rule: the error against the float64 reference is
at most twice that of PyTorch's math SDPA in the same dtype, plus 1e-3 * max |reference| (three
times for gradients).
"""
import os
import sys

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import libattn  # noqa: E402
import libattn.torch as lt  # noqa: E402
from reference import reference  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

GPU_IMPLS = [i["name"] for i in libattn.info()["implementations"] if i["device"] == "cuda"]
DEV = torch.device("cuda")


def gpu_impls():
    return GPU_IMPLS or [pytest.param("none", marks=pytest.mark.skip("no GPU implementation"))]


def run(fn, *args, **kwargs):
    """fn, or a skip when the implementation asked for cannot run the problem."""
    try:
        return fn(*args, **kwargs)
    except libattn.Unsupported as e:
        pytest.skip(f"unsupported: {e}")


def naive(q, k, v, causal):
    """SPEC.md's naive same-dtype computation on [B, T, H, D] tensors: scores and P rounded to
    q's dtype (PyTorch's math SDPA would compute in float32), bottom-right causal."""
    group = q.shape[2] // k.shape[2]
    kk, vv = k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)
    x = torch.einsum("bihd,bjhd->bhij", q, kk) * q.new_tensor(q.shape[-1] ** -0.5)
    if causal:
        tq, tk = q.shape[1], k.shape[1]
        keep = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(tk - tq)
        x = x.masked_fill(~keep, float("-inf"))
    p = torch.softmax(x, dim=-1).nan_to_num(0.0)  # rounded to the dtype; 0 on masked rows
    return torch.einsum("bhij,bjhd->bihd", p, vv)


def assert_spec_close(got, want64, naive_out, factor=2.0):
    err = (got.double() - want64).abs().max().item()
    naive_err = (naive_out.double() - want64).abs().max().item()
    bound = factor * naive_err + 1e-3 * want64.abs().max().item()
    assert err <= bound, f"error {err:.3g} > bound {bound:.3g} (naive {naive_err:.3g})"


@pytest.mark.parametrize("impl", gpu_impls())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 129, 257, 8, 2, 64), (1, 1000, 1000, 4, 4, 128),
                                   (3, 63, 17, 6, 3, 128)])
def test_forward_backward(seed, impl, dtype, causal, shape):
    b, tq, tk, hq, hkv, d = shape
    q = torch.randn(b, tq, hq, d, device=DEV, dtype=dtype, requires_grad=True)
    k = torch.randn(b, tk, hkv, d, device=DEV, dtype=dtype, requires_grad=True)
    v = torch.randn(b, tk, hkv, d, device=DEV, dtype=dtype, requires_grad=True)
    dout = torch.randn(b, tq, hq, d, device=DEV, dtype=dtype)
    out = run(lt.attention, q, k, v, causal=causal, impl=impl)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    q64, k64, v64 = (t.detach().cpu().double().requires_grad_(True) for t in (q, k, v))
    want, _ = reference(q64, k64, v64, causal=causal)
    want = want.nan_to_num(0.0)
    want_grads = torch.autograd.grad(want, (q64, k64, v64), dout.cpu().double())
    qn, kn, vn = (t.detach().requires_grad_(True) for t in (q, k, v))
    nout = naive(qn, kn, vn, causal).nan_to_num(0.0)
    ngrads = torch.autograd.grad(nout, (qn, kn, vn), dout)
    assert_spec_close(out.cpu(), want, nout.cpu())
    for g, w, n in zip(grads, want_grads, ngrads):
        assert_spec_close(g.cpu(), w.nan_to_num(0.0), n.cpu(), factor=3.0)


@pytest.mark.parametrize("impl", gpu_impls())
def test_features_in_float32(seed, impl):
    """Bias with dbias, sinks with dsinks, ALiBi, soft cap, window, varlen: float32 on the GPU
    against the float64 reference (SPEC.md: 1e-4 * max(1, max |r|))."""
    q, k, v = (torch.randn(2, 33, h, 64, device=DEV, requires_grad=True) for h in (4, 2, 2))
    bias = torch.randn(1, 4, 33, 33, device=DEV, requires_grad=True)
    sinks = torch.randn(4, 2, device=DEV, requires_grad=True)
    slopes = torch.rand(4, device=DEV)
    kw = dict(causal=True, window=(9, -1), softcap=4.0)
    out = run(lt.attention, q, k, v, bias=bias, sinks=sinks, alibi_slopes=slopes, impl=impl, **kw)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v, bias, sinks), dout)
    cpu = [t.detach().cpu().double().requires_grad_(True) for t in (q, k, v, bias, sinks)]
    want, _ = reference(*cpu[:3], bias=cpu[3], sinks=cpu[4], alibi_slopes=slopes.cpu(), **kw)
    want_grads = torch.autograd.grad(want, cpu, dout.cpu().double())
    for g, w in zip((out, *grads), (want, *want_grads)):
        tol = 1e-4 * max(1.0, w.abs().max().item())
        assert (g.detach().cpu().double() - w).abs().max().item() <= tol


@pytest.mark.parametrize("impl", gpu_impls())
def test_varlen(seed, impl):
    lens = [17, 1, 100, 64]
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
    q, k, v = (torch.randn(sum(lens), h, 64, device=DEV, dtype=torch.bfloat16) for h in (8, 2, 2))
    out = run(lt.flash_attn_varlen_func, q, k, v, cu, cu, max(lens), max(lens), causal=True)
    for b in range(len(lens)):
        s = slice(int(cu[b]), int(cu[b + 1]))
        want, _ = reference(*(t[None, s].cpu().double() for t in (q, k, v)), causal=True)
        nout = naive(q[None, s], k[None, s], v[None, s], True)
        assert_spec_close(out[s].cpu(), want[0], nout[0].cpu())


def test_current_stream_and_no_host_sync(seed):
    q, k, v = (torch.randn(2, 256, 8, 64, device=DEV, dtype=torch.bfloat16) for _ in range(3))
    want = lt.flash_attn_func(q, k, v, causal=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        assert lt._stream(q) == side.cuda_stream  # what the library is handed
        torch.cuda.set_sync_debug_mode("error")  # any synchronising call raises
        try:
            got = lt.flash_attn_func(q, k, v, causal=True)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.current_stream().wait_stream(side)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_cuda_graph_capture_and_replay(seed):
    q, k, v = (torch.randn(2, 128, 4, 64, device=DEV, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    dout = torch.randn(2, 128, 4, 64, device=DEV, dtype=torch.bfloat16)

    def step():  # deterministic: a replay and a fresh run compare bit for bit
        out = lt.flash_attn_func(q, k, v, causal=True, deterministic=True)
        return (out, *torch.autograd.grad(out, (q, k, v), dout))

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):  # warm-up: plans are made outside the capture
            step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    with torch.no_grad():
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
    graph.replay()
    torch.cuda.synchronize()
    want = step()
    for g, w in zip(static, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


@pytest.mark.parametrize("impl", gpu_impls())
def test_memo_on_cuda(seed, impl):
    """Repeated inference calls run from the binding's memo: the same bits as the checked first
    call, in both layouts, with lse; the output laid out as q."""
    q, k, v = (torch.randn(2, 77, h, 64, device=DEV, dtype=torch.bfloat16) for h in (8, 2, 2))
    for layout, tensors in (("bthd", (q, k, v)), ("bhtd", [t.transpose(1, 2) for t in (q, k, v)])):
        runs = [run(lt.attention, *tensors, causal=True, impl=impl, layout=layout,
                    return_lse=True) for _ in range(3)]
        for out, lse in runs[1:]:
            assert out.stride() == runs[0][0].stride() == torch.empty_like(tensors[0]).stride()
            torch.testing.assert_close(out, runs[0][0], rtol=0, atol=0)
            torch.testing.assert_close(lse, runs[0][1], rtol=0, atol=0)


def test_cuda_graph_capture_of_inference_calls(seed):
    """Inference calls captured after their first call (the plan and the memo entry are made
    outside the capture): the memo's path allocates from the graph's pool and runs on the
    capturing stream; a replay on new inputs gives what a fresh call gives."""
    q, k, v = (torch.randn(2, 128, h, 64, device=DEV, dtype=torch.bfloat16) for h in (8, 2, 2))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

    def step():
        return (lt.flash_attn_func(q, k, v, causal=True),
                lt.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True),
                *lt.attention(q, k, v, window=(32, 0), return_lse=True))

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    for t in (q, k, v):
        t.copy_(torch.randn_like(t))
    graph.replay()
    torch.cuda.synchronize()
    for g, w in zip(static, step()):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpus_in_one_process(seed):
    q, k, v = (torch.randn(2, 200, 4, 64, dtype=torch.bfloat16) for _ in range(3))
    outs = []
    for dev in ("cuda:0", "cuda:1"):
        qd, kd, vd = (t.to(dev).requires_grad_(True) for t in (q, k, v))
        out = lt.flash_attn_func(qd, kd, vd, causal=True, deterministic=True)
        assert out.device == torch.device(dev)
        grads = torch.autograd.grad(out, (qd, kd, vd), torch.ones_like(out))
        outs.append([t.cpu() for t in (out, *grads)])
        # Inference from the memo (the training call added this device's entry; entries are per
        # device), first with device 0 current, then on a side stream of this device (which
        # makes it current for the block).
        side = torch.cuda.Stream(device=dev)
        with torch.no_grad():
            for stream in (None, side):
                side.wait_stream(torch.cuda.current_stream(dev))
                with torch.cuda.stream(stream):
                    assert lt._stream(qd) == torch.cuda.current_stream(dev).cuda_stream
                    runs = [lt.flash_attn_func(qd, kd, vd, causal=True, deterministic=True)
                            for _ in range(3)]
                torch.cuda.current_stream(dev).wait_stream(side)
                for again in runs:
                    assert again.device == torch.device(dev)
                    torch.testing.assert_close(again, runs[0], rtol=0, atol=0)
                # The training forward also wrote lse: the same values, not necessarily the bits.
                torch.testing.assert_close(runs[0], out.detach(), rtol=1e-2, atol=1e-2)
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert torch.cuda.current_device() == 0
    with pytest.raises(ValueError, match="k"):  # after both devices' memo entries exist
        lt.flash_attn_func(q.to("cuda:0"), k.to("cuda:1"), v.to("cuda:0"))


def test_torch_compile_inductor(seed):
    q, k, v = (torch.randn(2, 128, 8, 64, device=DEV, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))

    def layer(q, k, v):
        return lt.flash_attn_func(q * 2, k, v, causal=True).float().square().sum()

    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True)
    want = torch.autograd.grad(layer(q, k, v), (q, k, v))
    got = torch.autograd.grad(compiled(q, k, v), (q, k, v))
    for g, w in zip(got, want):  # the default backward may add with atomics: not bitwise
        torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-2)


def test_sdpa_front_end_on_cuda(seed):
    query, key, value = (torch.randn(2, h, 300, 64, device=DEV, dtype=torch.float16)
                         for h in (8, 2, 2))
    got = lt.scaled_dot_product_attention(query, key, value, is_causal=True, enable_gqa=True)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        want = F.scaled_dot_product_attention(query.double(), key.double(), value.double(),
                                              is_causal=True, enable_gqa=True)
    # is_causal is top-left: with L == S it is the bottom-right mask naive() draws.
    nout = naive(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), True)
    assert_spec_close(got.cpu(), want.cpu(), nout.transpose(1, 2).cpu())
