"""Pipeline speed and memory, side by side with the baseline, in one run.

    .venv/bin/python benchmarks/bench_pipeline.py [--small 5000] [--large 20000] [--repeat 1]

Prints, side by side, the images/s of this pipeline (DirectRunner, configs/local.yaml: one
worker per core) and of benchmarks/baseline_pool.py (Pool + Pillow + TFRecordWriter) on the
same --large files, each pair against its issue 10 target:
  re-encode (--reencode always)            >= 1.15x the Pillow re-encode baseline
  pass-through, default --validate decode  >= 1.0x  the baseline that fully decodes (Pillow)
  pass-through, --validate header          >= 0.9x  the header-only baseline
then the peak RSS of the largest process, --small -> --large images (<= +10%), and the
per-image slope between them (start-up cost excluded). Medians over --repeat runs; the
machine is shared, so read ratios, not absolutes.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from common import build_command, files_of, jpeg_tree, run_measured  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def pipeline(src, out, *extra):
    return build_command(src, out, "--force", "--splits", "train=1.0", *extra)


def baseline(src, out, *mode):
    return [sys.executable, os.path.join(HERE, "baseline_pool.py"), src, out, *mode]


def measure(make_cmd, n, repeat):
    runs = []
    for _ in range(repeat):
        tmp = tempfile.mkdtemp(prefix="bench-")
        try:
            runs.append(run_measured(make_cmd(os.path.join(tmp, "out"))))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    seconds = statistics.median(r[0] for r in runs)
    return {"img_s": n / seconds, "seconds": seconds,
            "max_proc_rss": statistics.median(r[1] for r in runs),
            "tree_rss": statistics.median(r[2] for r in runs)}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--small", type=int, default=5000)
    ap.add_argument("--large", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--with_beam_sink", action="store_true",
                    help="also run --sink beam (WriteToTFRecord) on the small set")
    args = ap.parse_args()
    small, large = jpeg_tree(args.small), jpeg_tree(args.large)
    n_small, n_large = len(files_of(small)), len(files_of(large))
    mb = sum(os.path.getsize(p) for p in files_of(large)) / 2**20
    print(f"data: {n_large} JPEGs, {mb:.0f} MiB ({mb * 1024 / n_large:.0f} KiB each); "
          f"{os.cpu_count()} cores; median of {args.repeat}")

    rows = []

    def row(name, result, base=None, target=None):
        ratio = f"{result['img_s'] / base['img_s']:.2f}x" if base else ""
        ok = "" if target is None else ("PASS" if result["img_s"] / base["img_s"] >= target
                                        else "FAIL")
        rows.append((name, result, ratio, f">= {target}x {ok}" if target else ""))

    b_re = measure(lambda o: baseline(large, o), n_large, args.repeat)
    p_re = measure(lambda o: pipeline(large, o, "--reencode", "always"), n_large, args.repeat)
    b_full = measure(lambda o: baseline(large, o, "--validate_full"), n_large, args.repeat)
    p_pt = measure(lambda o: pipeline(large, o), n_large, args.repeat)
    b_hdr = measure(lambda o: baseline(large, o, "--passthrough"), n_large, args.repeat)
    p_hdr = measure(lambda o: pipeline(large, o, "--validate", "header"), n_large, args.repeat)
    p_small = measure(lambda o: pipeline(small, o), n_small, args.repeat)
    row("baseline Pillow re-encode", b_re)
    row("pipeline --reencode always", p_re, b_re, 1.15)
    row("baseline Pillow full decode, keep bytes", b_full)
    row("pipeline default (validate decode)", p_pt, b_full, 1.0)
    row("baseline Pillow header, keep bytes", b_hdr)
    row("pipeline --validate header", p_hdr, b_hdr, 0.9)
    row(f"pipeline default, {n_small} images", p_small)
    if args.with_beam_sink:
        row(f"pipeline --sink beam, {n_small}", measure(
            lambda o: pipeline(small, o, "--sink", "beam"), n_small, args.repeat))

    print(f"\n{'run':42}{'img/s':>8}{'sec':>8}{'max proc RSS':>14}{'tree RSS':>10}"
          f"{'ratio':>8}  target")
    for name, r, ratio, target in rows:
        print(f"{name:42}{r['img_s']:8.0f}{r['seconds']:8.1f}{r['max_proc_rss'] / 2**30:12.2f}GB"
              f"{r['tree_rss'] / 2**30:8.2f}GB{ratio:>8}  {target}")
    growth = p_pt["max_proc_rss"] / p_small["max_proc_rss"] - 1
    print(f"\npeak RSS of the largest process, {n_small} -> {n_large} images: "
          f"{p_small['max_proc_rss'] / 2**30:.2f} -> {p_pt['max_proc_rss'] / 2**30:.2f} GB "
          f"({growth:+.1%}; target <= +10%: {'PASS' if growth <= 0.10 else 'FAIL'})")
    slope = (p_pt["seconds"] - p_small["seconds"]) / (n_large - n_small)
    print(f"per-image slope, default build, {n_small} -> {n_large} images: {slope * 1e3:.3f} ms "
          f"({1 / slope:.0f} img/s once started; start-up "
          f"{p_small['seconds'] - slope * n_small:.1f} s)")


if __name__ == "__main__":
    main()
