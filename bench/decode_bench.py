"""bench/decode_bench.py - issue 14's decode table in one run: libattn (gpu/decode_bench, which
validates every configuration against the main forward kernel before timing it) side by side with
PyTorch's scaled_dot_product_attention through its flash and cuDNN backends on the dense
equivalent, timed the same way (20 calls captured in a CUDA graph, replayed for 100 ms to warm
up, then the median of 10 replays), and the
device's measured copy rate for the percentages.

usage: python3 bench/decode_bench.py BUILD/decode_bench [max_keys [problems [variants]]]
(bench/decode_bench.sh builds the program and runs this; the arguments go to gpu/decode_bench.c). Prints the raw CSV of both sides, then a markdown table:
K+V read rate (TB/s) and its share of the copy rate; for the features and Tq = 4 their time
against paged 16's plain time at the same B and Tk.

PyTorch has no sinks, soft cap or bottom-right window in SDPA, so it is timed on the dense grid
and on Tq = 4 without a mask (the causal mask of Tq = 4 against the cache's end is bottom-right,
which SDPA's is_causal is not); GQA through enable_gqa=True, else (a backend refusing it) with
K and V expanded to Hq heads, marked "x".
"""
import collections
import statistics
import subprocess
import sys

HQ, HKV, D = 32, 8, 128
GRAPH_CALLS, REPLAYS, WARM_MS = 20, 10, 100.0


def time_us(fn):
    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(GRAPH_CALLS):
                fn()
        run = graph.replay
    except Exception:  # a backend that cannot be captured runs eagerly
        def run():
            for _ in range(GRAPH_CALLS):
                fn()
    def replay_ms():
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        run()
        e1.record()
        e1.synchronize()
        return e0.elapsed_time(e1)

    # warm-up: replays for WARM_MS, so the GPU's clocks have risen (as gpu/decode_bench.c does)
    spent = 0.0
    while spent < WARM_MS:
        spent += replay_ms()
    times = [replay_ms() for _ in range(REPLAYS + 2)][2:]  # the first two not counted
    return statistics.median(times) * 1e3 / GRAPH_CALLS


def torch_rows(shapes):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    rows = []
    backends = [("torch-flash", SDPBackend.FLASH_ATTENTION), ("torch-cudnn", SDPBackend.CUDNN_ATTENTION)]
    gen = torch.Generator(device="cuda").manual_seed(0)
    for variant, B, Tk, Tq in shapes:
        def rnd(*shape):
            return (torch.rand(*shape, device="cuda", generator=gen) * 2 - 1).to(torch.bfloat16)
        q = rnd(B, Tq, HQ, D).transpose(1, 2)
        k = rnd(B, Tk, HKV, D).transpose(1, 2)
        v = rnd(B, Tk, HKV, D).transpose(1, 2)
        kv_bytes = B * Tk * HKV * D * 2 * 2
        for name, backend in backends:
            us, note = None, ""
            with torch.inference_mode(), sdpa_kernel(backend):
                try:
                    us = time_us(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
                except Exception:
                    try:
                        ke = k.repeat_interleave(HQ // HKV, dim=1)
                        ve = v.repeat_interleave(HQ // HKV, dim=1)
                        us = time_us(lambda: F.scaled_dot_product_attention(q, ke, ve))
                        note = "x"
                        del ke, ve
                    except Exception as e:
                        print(f"# {name} {variant} B{B} Tk{Tk}: {type(e).__name__}: {str(e)[:120]}")
            if us is not None:
                rows.append((variant, B, Tk, Tq, name, note, us, kv_bytes / (us * 1e-6) / 1e9))
        del q, k, v
        torch.cuda.empty_cache()
    return rows


def main():
    prog = sys.argv[1]
    args = [prog] + sys.argv[2:5]
    res = subprocess.run(args, capture_output=True, text=True)
    print(res.stdout, end="")
    if res.returncode != 0:
        print(res.stderr[-2000:])
        sys.exit(1)
    copy = None
    ours = collections.defaultdict(list)  # (variant, B, Tk) -> [(impl, config, us, gbps)]
    bad = []
    for line in res.stdout.splitlines():
        f = line.split(",")
        if f[0] == "copy":
            copy = float(f[8])
        elif f[0] == "row":
            ours[(f[1], int(f[2]), int(f[3]))].append((f[5], f[6], float(f[7]), float(f[8])))
        elif f[0] == "bad":
            bad.append(line)
    shapes = [(v, B, Tk, 1) for (v, B, Tk) in ours if v == "dense"]
    shapes += [("tq4", B, Tk, 4) for (v, B, Tk) in ours if v == "tq4"]
    theirs = collections.defaultdict(dict)
    print("variant,B,Tk,Tq,impl,note,us,kv_gbps")
    for r in torch_rows(shapes):
        print(",".join(str(x) if not isinstance(x, float) else f"{x:.2f}" for x in r))
        theirs[(r[0], r[1], r[2])][r[4]] = (r[6], r[7], r[5])

    def best(key, impl):
        c = [x for x in ours.get(key, []) if x[0] == impl]
        return min(c, key=lambda x: x[2]) if c else None

    def cell(x):
        return "-" if x is None else f"{x[3] / 1000:.2f} ({100 * x[3] / copy:.0f}%)"

    print(f"\ncopy rate {copy / 1000:.2f} TB/s; K+V TB/s (% of copy rate); cuda: the fastest of its "
          "configurations, named\n")
    print("| B, Tk | variant | libattn cuda | config | us | libattn cudnn | PyTorch flash | PyTorch cuDNN |")
    print("|---|---|---|---|---|---|---|---|")
    for key in sorted(ours, key=lambda k: (["dense", "paged16", "paged64", "sinks", "softcap",
                                           "window4k", "tq4"].index(k[0]) > 2, k[1], k[2], k[0])):
        v, B, Tk = key
        cu, dn = best(key, "cuda"), best(key, "cudnn")
        th = theirs.get(key if v != "tq4" else key, {})
        tcell = []
        for name in ("torch-flash", "torch-cudnn"):
            t = th.get(name) if v in ("dense", "tq4") else None
            tcell.append("-" if t is None else f"{t[1] / 1000:.2f} ({100 * t[1] / copy:.0f}%){t[2]}")
        extra = ""
        if v in ("sinks", "softcap", "window4k", "tq4"):
            plain = best(("paged16", B, Tk), "cuda")
            if plain and cu:
                extra = (f" ({cu[2] / plain[2]:.2f}x paged16's time, "
                         f"{100 * cu[3] / plain[3]:.0f}% of its rate)")
        print(f"| {B}, {Tk} | {v} | {cell(cu)}{extra} | {cu[1] if cu else '-'} | "
              f"{cu[2] if cu else '-'} | {cell(dn)} | {tcell[0]} | {tcell[1]} |")
    if bad:
        print("\nFAILED validation (not timed):")
        print("\n".join(bad))
        sys.exit(1)


if __name__ == "__main__":
    main()
