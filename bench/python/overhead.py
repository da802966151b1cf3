"""Host overhead per call of a planned problem: the binding choice and the front-end's cost.

    python bench/python/overhead.py [--device cuda] [--shape B,T,H,D] [--iters N]

Times, per call, on one problem whose plan is already made (the best of 7 repeats of N calls):
  C API          attn_plan_forward called in a loop from C (_ext.bench_forward): the kernel alone
  _ext (ready)   the CPython-API binding with its argument tuples built once
  _ext           the binding with the tuples built from the tensors on each call
  ctypes         attn_plan_forward through ctypes, its structures filled from the tensors per call
  op             torch.ops.libattn.fwd (PyTorch's dispatcher + the binding)
  flash_attn_func / libattn sdpa   the front-ends' repeated call (the memo: one call to the
                 binding that keys the call, allocates the outputs and runs the plan)
  fa (autograd)  flash_attn_func's forward on tensors that require grad (checks, autograd.Function)
  torch sdpa     torch.nn.functional.scaled_dot_product_attention on the same problem
  torch (autograd)  the same on tensors that require grad
and prints each one's overhead above the C API. On CUDA the C API column is the launch cost
(the kernels run asynchronously; the stream is synchronised once per repeat). Every row but the
autograd ones run under torch.no_grad(), as inference does.
"""
import argparse
import ctypes
import time

import torch
import torch.nn.functional as F

import libattn
import libattn.torch as lt
from libattn import _core, _ext


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("stride", ctypes.c_int64 * 4)]


class Inputs(ctypes.Structure):
    """attn_inputs, every field in attn.h's order (the library reads the whole structure)."""
    _fields_ = [(n, Tensor) for n in ("q", "k", "v", "bias", "mask", "alibi_slopes", "sinks",
                                      "q_segment_ids", "kv_segment_ids")] + \
               [(n, ctypes.c_void_p) for n in ("cu_seqlens_q", "cu_seqlens_k", "seqlens_q",
                                               "seqlens_k")] + \
               [("dropout_seed", ctypes.c_uint64)] + \
               [("block_table", Tensor), ("cache_seqlens", ctypes.c_void_p)] + \
               [(n, Tensor) for n in ("k_new", "v_new", "q_descale", "k_descale", "v_descale")]


class Outputs(ctypes.Structure):
    _fields_ = [("out", Tensor), ("lse", Tensor), ("probs", Tensor)]


def ctypes_tensor(t):
    s = t.stride()
    return Tensor(t.data_ptr(), (ctypes.c_int64 * 4)(*s, *([0] * (4 - len(s)))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--shape", default="1,1,1,8", help="B,T,H,D")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--iters", type=int, default=2000)
    args = ap.parse_args()
    b, t, h, d = (int(x) for x in args.shape.split(","))
    dtype = getattr(torch, args.dtype)
    dev = torch.device(args.device)
    q, k, v = (torch.randn(b, t, h, d, dtype=dtype, device=dev) for _ in range(3))
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    out = lt.flash_attn_func(q, k, v)  # plans the problem
    problem = lt._problem(q, k, v, None, None, None, None, None, None, None, t, t, 0.0, False,
                          False, -1, -1, 0.0, 0.0, False)
    plan = _core.get_plan(problem)
    lse = torch.empty(b, h, t, dtype=torch.float32, device=dev)
    inputs = lt._inputs(q, k, v, None, None, None, None, None, None, None, None, None, None, 0)
    stream = lt._stream(q)
    ws, ws_size, ws_buf = lt._workspace(plan.forward_workspace, q.device)
    _ext.forward(plan.capsule, inputs, lt._t(out), lt._t(lse), None, stream, ws, ws_size)

    lib = ctypes.CDLL(libattn.info()["path"] + "/libattn.so")
    lib.attn_plan_forward.argtypes = [ctypes.c_void_p, ctypes.POINTER(Inputs), ctypes.c_void_p,
                                      ctypes.c_size_t, ctypes.POINTER(Outputs)]
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    plan_ptr = get_pointer(plan.capsule, b"libattn.plan")

    def c_api(n):
        _ext.bench_forward(plan.capsule, inputs, lt._t(out), lt._t(lse), n, ws, ws_size)

    def ext_ready(n):
        o, l_ = lt._t(out), lt._t(lse)
        for _ in range(n):
            _ext.forward(plan.capsule, inputs, o, l_, None, stream, ws, ws_size)

    def ext(n):
        for _ in range(n):
            p = _core.get_plan(problem)
            _ext.forward(p.capsule, lt._inputs(q, k, v, None, None, None, None, None, None, None,
                                               None, None, None, 0),
                         lt._t(out), lt._t(lse), None, lt._stream(q), ws, ws_size)

    def with_ctypes(n):
        for _ in range(n):
            inp = Inputs()
            inp.q, inp.k, inp.v = ctypes_tensor(q), ctypes_tensor(k), ctypes_tensor(v)
            outs = Outputs()
            outs.out, outs.lse = ctypes_tensor(out), ctypes_tensor(lse)
            if lib.attn_plan_forward(plan_ptr, ctypes.byref(inp), ws, ws_size, ctypes.byref(outs)):
                raise RuntimeError("attn_plan_forward failed")

    def op(n):
        f = torch.ops.libattn.fwd
        for _ in range(n):
            f(q, k, v, None, None, None, None, None, None, None, None, None, None, None, None,
              None, t, t, 0.0, False, False, -1, -1, 0.0, 0.0, 0, False, False, None, None, 0,
              False, -1)

    def front(n):
        for _ in range(n):
            lt.flash_attn_func(q, k, v)

    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def front_sdpa(n):
        for _ in range(n):
            lt.scaled_dot_product_attention(qt, kt, vt)

    def torch_sdpa(n):
        for _ in range(n):
            F.scaled_dot_product_attention(qt, kt, vt)

    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))

    def front_autograd(n):
        with torch.enable_grad():
            for _ in range(n):
                lt.flash_attn_func(qg, kg, vg)

    qgt, kgt, vgt = (t.transpose(1, 2) for t in (qg, kg, vg))

    def torch_sdpa_autograd(n):
        with torch.enable_grad():
            for _ in range(n):
                F.scaled_dot_product_attention(qgt, kgt, vgt)

    # Validate first: the memo's repeated call gives the checked call's bits.
    with torch.no_grad():
        first = lt.flash_attn_func(q, k, v)
        for name, got in (("flash_attn_func", lt.flash_attn_func(q, k, v)),
                          ("libattn sdpa", lt.scaled_dot_product_attention(qt, kt, vt)
                           .transpose(1, 2))):
            if not torch.equal(got, first):
                raise SystemExit(f"{name}: the repeated call differs from the first")

    rows = [("C API", c_api), ("_ext (ready)", ext_ready), ("_ext", ext), ("ctypes", with_ctypes),
            ("op", op), ("flash_attn_func", front), ("libattn sdpa", front_sdpa),
            ("fa (autograd)", front_autograd), ("torch sdpa", torch_sdpa),
            ("torch (autograd)", torch_sdpa_autograd)]
    with torch.no_grad():
        results = {}
        for name, fn in rows:
            fn(max(1, args.iters // 10))
            times = []
            for _ in range(7):
                sync()
                t0 = time.perf_counter()
                fn(args.iters)
                sync()
                times.append((time.perf_counter() - t0) / args.iters * 1e6)
            results[name] = min(times)  # the cost without other processes' interference
    base = results["C API"]
    print(f"device {dev}, problem {_core.problem_string(problem)}, plan {plan.impl}/{plan.config},"
          f" torch {torch.__version__}")
    print(f"{'path':<18}{'us/call':>10}{'above C API':>14}")
    for name, _ in rows:
        print(f"{name:<18}{results[name]:>10.2f}{results[name] - base:>14.2f}")
    worst = max(results["flash_attn_func"], results["libattn sdpa"]) - base
    print(f"front-ends' repeated call: at most {worst:.2f} us above the C API (target <= 10): "
          f"{'met' if worst <= 10 else 'missed'}")


if __name__ == "__main__":
    main()
