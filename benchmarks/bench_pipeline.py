"""Build speed and memory against the strong script and the codec floor, in one run.

    .venv/bin/python benchmarks/bench_pipeline.py [--sizes 5000,20000] [--repeat 1]
                                                  [--only default,header,reencode]

On seeded crops of real photographs (benchmarks/photos.py, ~500 px, JPEG quality 75-95),
at each size, for each variant, three programs on the same files:
  script  benchmarks/baseline_pool.py: Pool(cores), each worker writes its own shard with
          tf.io.TFRecordWriter, Pillow (re-encode / full decode with load() / header only)
  floor   benchmarks/codec_floor.py: Pool(cores) running only libjpeg-turbo, writing nothing
  ours    the default command with configs/local.yaml (+ --reencode always / --validate header)
It prints whole wall times, the per-image slope and the fixed start-up (the line through the
smallest and largest size), peak RSS of the largest process, then the ratios against the
targets. Medians over --repeat runs; the machine is shared, so read ratios, not absolutes.
Needs the "bench" extra (scikit-image for the photographs, TensorFlow for the script).
"""

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from common import Record, add_record_argument, build_command, files_of, run_measured  # noqa: E402
from photos import photo_tree  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# name -> (script flags, floor flags, our flags, target: script seconds / our seconds at the
# largest size)
VARIANTS = {
    "default": (["--validate_full"], [], [], 1.2),
    "header": (["--passthrough"], ["--read"], ["--validate", "header"], 0.9),
    "reencode": ([], ["--reencode"], ["--reencode", "always"], 1.0),
}
LABELS = {"default": "default (validated pass-through)", "header": "--validate header",
          "reencode": "--reencode always"}
SLOPE_TARGET = 1.1  # default build's slope / the full-decode floor's
RSS_TARGET = 0.10   # peak RSS growth, smallest -> largest size


def commands(impl, variant, src, out):
    script, floor, ours, _ = VARIANTS[variant]
    if impl == "script":
        return [sys.executable, os.path.join(HERE, "baseline_pool.py"), src, out, *script]
    if impl == "floor":
        return [sys.executable, os.path.join(HERE, "codec_floor.py"), src, *floor]
    return build_command(src, out, *ours)


def measure(cmd_of, repeat):
    """Median wall seconds, CPU seconds of the whole process tree and peak RSS."""
    runs = []
    for _ in range(repeat):
        tmp = tempfile.mkdtemp(prefix="bench-")
        try:
            before = _tree_cpu()
            seconds, rss, *_ = run_measured(cmd_of(os.path.join(tmp, "out")))
            runs.append((seconds, _tree_cpu() - before, rss))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return {key: statistics.median(r[i] for r in runs)
            for i, key in enumerate(("seconds", "cpu", "rss"))}


def _tree_cpu():
    """User + system seconds of every finished descendant (each process waits for its own
    children, so the build's workers count too): what a loaded machine inflates least."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def line(results, sizes, key="seconds"):
    """(slope s/image, start-up s) through the smallest and largest size."""
    lo, hi = results[sizes[0]][key], results[sizes[-1]][key]
    slope = (hi - lo) / (sizes[-1] - sizes[0])
    return slope, lo - slope * sizes[0]


def report(res, sizes, variants):
    big = sizes[-1]
    two = len(sizes) > 1
    print(f"\n{'variant':34}{'program':8}" + "".join(f"{f'{n} s':>10}" for n in sizes)
          + f"{'img/s':>8}" + (f"{'slope ms':>10}{'start-up s':>12}" if two else "")
          + f"{'CPU s':>8}" + (f"{'CPU ms/img':>12}{'CPU start-up':>14}" if two else "")
          + f"{'peak RSS GB':>16}")
    for v in variants:
        for impl in ("script", "floor", "ours"):
            r = res[v, impl]
            row = f"{LABELS[v]:34}{impl:8}" + "".join(f"{r[n]['seconds']:10.1f}" for n in sizes)
            row += f"{big / r[big]['seconds']:8.0f}"
            if two:
                slope, start = line(r, sizes)
                row += f"{slope * 1e3:10.3f}{start:12.1f}"
            row += f"{r[big]['cpu']:8.1f}"
            if two:
                slope, start = line(r, sizes, "cpu")
                row += f"{slope * 1e3:12.3f}{start:14.1f}"
            rss = " -> ".join(f"{r[n]['rss'] / 2**30:.2f}" for n in (sizes[0], big)) if two \
                else f"{r[big]['rss'] / 2**30:.2f}"
            print(row + f"{rss:>16}")

    print(f"\n{'variant':34}{f'speed vs script @{big}':>22}{'target':>14}"
          + (f"{'slope/floor':>13}{'slope/script':>14}{'start-up vs script':>26}"
             f"{'RSS growth':>12}" if two else ""))
    for v in variants:
        ours, script, floor = res[v, "ours"], res[v, "script"], res[v, "floor"]
        speed = script[big]["seconds"] / ours[big]["seconds"]
        target = VARIANTS[v][3]
        row = f"{LABELS[v]:34}{speed:21.2f}x{_verdict(speed >= target, f'>= {target}x'):>14}"
        if two:
            (s_o, i_o), (s_s, i_s), (s_f, _) = (line(x, sizes) for x in (ours, script, floor))
            slope_mark = ("" if v != "default"
                          else f" {_verdict(s_o / s_f <= SLOPE_TARGET, f'<= {SLOPE_TARGET}')}")
            growth = ours[big]["rss"] / ours[sizes[0]]["rss"] - 1
            row += (f"{s_o / s_f:12.2f}x{s_o / s_s:13.2f}x"
                    f"{f'{i_o:.1f} vs {i_s:.1f} s {_verdict(i_o <= i_s)}':>26}"
                    f"{f'{growth:+.1%} {_verdict(growth <= RSS_TARGET)}':>12}{slope_mark}")
        print(row)
    if two:
        print(f"\n{'on CPU seconds (less moved by load)':34}{f'CPU vs script @{big}':>22}"
              f"{'CPU slope/floor':>17}{'CPU slope/script':>18}{'CPU start-up vs script':>26}")
        for v in variants:
            ours, script, floor = res[v, "ours"], res[v, "script"], res[v, "floor"]
            (s_o, i_o), (s_s, i_s), (s_f, _) = (line(x, sizes, "cpu")
                                                for x in (ours, script, floor))
            print(f"{LABELS[v]:34}{script[big]['cpu'] / ours[big]['cpu']:21.2f}x"
                  f"{s_o / s_f:16.2f}x{s_o / s_s:17.2f}x{f'{i_o:.1f} vs {i_s:.1f} s':>26}")
    print("\nspeed = the script's wall time / ours (higher is better); slope = seconds per extra "
          "image between the sizes; start-up = the line's intercept at 0 images; CPU = user + "
          "system seconds of the whole process tree")


def _verdict(ok, target=""):
    return f"{target} {'PASS' if ok else 'FAIL'}".strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="5000,20000",
                    help="comma-separated image counts; slope and start-up need two")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--only", default=",".join(VARIANTS),
                    help=f"comma-separated variants among {','.join(VARIANTS)}")
    add_record_argument(ap)
    args = ap.parse_args()
    record = Record("bench_pipeline", args)
    sizes = sorted(int(s) for s in args.sizes.split(","))
    variants = [v for v in VARIANTS if v in args.only.split(",")]
    trees = {n: photo_tree(n) for n in sizes}
    big = files_of(trees[sizes[-1]])
    mb = sum(os.path.getsize(p) for p in big) / 2**20
    print(f"data: photographs, {len(big)} JPEGs, {mb:.0f} MiB ({mb * 1024 / len(big):.0f} KiB "
          f"each); {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f}; "
          f"median of {args.repeat}")
    res = {}
    for n in sizes:  # programs interleaved per size, so a change in load hits all three alike
        for v in variants:
            for impl in ("script", "floor", "ours"):
                res.setdefault((v, impl), {})[n] = measure(
                    lambda out: commands(impl, v, trees[n], out), args.repeat)
    report(res, sizes, variants)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    big = sizes[-1]
    record.save({
        "images": {"kind": "photographs", "mib_at_largest": round(mb, 1)},
        "runs": {v: {impl: {str(n): res[v, impl][n] for n in sizes}
                     for impl in ("script", "floor", "ours")} for v in variants},
        "wall_vs_script": {v: res[v, "script"][big]["seconds"] / res[v, "ours"][big]["seconds"]
                           for v in variants},
        "cpu_vs_script": {v: res[v, "script"][big]["cpu"] / res[v, "ours"][big]["cpu"]
                          for v in variants}})


if __name__ == "__main__":
    main()
