"""gpu/report.py - joins the CSV rows of gpu/bench_cudnn.c and gpu/bench_torch.py into the markdown
table of bench/RESULTS.md: per shape and pass, each implementation's median time and TFLOPS, and
libattn's time over PyTorch's cuDNN backend (< 1.05 meets the issue's target).

usage: report.py ours.csv torch.csv
"""
import csv
import sys


def load(path):
    rows = {}
    with open(path) as f:
        for r in csv.DictReader(line for line in f if not line.startswith("#")):
            rows[(r["impl"], int(r["d"]), int(r["t"]), int(r["causal"]), r["pass"])] = (float(r["ms"]), float(r["tflops"]))
    return rows


def main():
    rows = {}
    for path in sys.argv[1:]:
        rows.update(load(path))
    impls = ["libattn-cudnn", "torch-cudnn", "torch-flash"]
    print("| D | T | B | Hq | causal | pass | libattn cudnn ms (TFLOPS) | torch cudnn ms (TFLOPS) | torch flash ms (TFLOPS) | libattn / torch-cudnn time |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for d in (128, 64):
        for t in (512, 8192):
            for causal in (0, 1):
                for p in ("fwd", "bwd"):
                    cells = []
                    for impl in impls:
                        v = rows.get((impl, d, t, causal, p))
                        cells.append(f"{v[0]:.3f} ({v[1]:.0f})" if v else "n/a")
                        ours, ref = rows.get(("libattn-cudnn", d, t, causal, p)), rows.get(("torch-cudnn", d, t, causal, p))
                    ratio = f"{ours[0] / ref[0]:.3f}" if ours and ref else "n/a"
                    print(f"| {d} | {t} | {16384 // t} | {2048 // d} | {causal} | {p} | " + " | ".join(cells) + f" | {ratio} |")


if __name__ == "__main__":
    main()
