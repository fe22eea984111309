"""What `--transform` adds to a build's wall time (target: at most 1.25x a plain build).

    .venv/bin/python benchmarks/bench_transform.py [--n 20000] [--repeat 1] [--accuracy]

Builds the same generated set (~500x375 JPEGs, benchmarks/common.py, cached under
benchmarks/_data) with configs/local.yaml, re-encoding (`--reencode always`) and passing
JPEGs through (the default), each without and with --transform, each run a fresh
`python -m beam_pipeline` process timed end to end; the modes alternate within a repeat.
Prints median wall times side by side and the with/without ratios. With --accuracy it also
checks the manifest's mean/std against NumPy over the stored train images (pass-through:
the statistics are over exactly those pixels).
The machine is shared: read the ratios of one run, not the absolute seconds.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from common import ENV, REPO, Record, add_record_argument, build_command, jpeg_tree  # noqa: E402

TARGET = 1.25  # re-encode build with --transform / without
BUILDS = (("re-encode", False), ("re-encode", True), ("pass-through", False),
          ("pass-through", True))  # (build, --transform)


def build(src, out, reencode, transform):
    return build_command(src, out, "--force",
            "--reencode", "always" if reencode == "re-encode" else "auto",
            "--transform" if transform else "--no_transform")


def timed_build(cmd, out):
    """Run one build -> (seconds, note). A build that published its version counts even if
    the process then died at exit: --transform builds under configs/local.yaml segfault
    during interpreter teardown (exit 139; before the writer computed the statistics too)."""
    import subprocess
    import time

    start = time.monotonic()
    proc = subprocess.run(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seconds = time.monotonic() - start
    if not os.path.exists(os.path.join(out, "LATEST")):
        raise SystemExit(f"build failed ({proc.returncode}): {' '.join(cmd)}\n"
                         f"{proc.stdout.decode()[-3000:]}")
    return seconds, f"exit {proc.returncode} after publishing" if proc.returncode else ""


def stored_train_stats(vdir, manifest):
    """Per-channel mean/std over every pixel of the stored train images, decoded by Pillow."""
    import io

    import numpy as np
    from PIL import Image

    sys.path.insert(0, REPO)
    from dataset_format.frames import read_frame

    total, sums, squares = 0, np.zeros(3), np.zeros(3)
    for shard in manifest["splits"]["train"]["shards"]:
        with open(os.path.join(vdir, shard["path"]), "rb") as f:
            offset = 0
            while (frame := read_frame(f, offset)) is not None:
                record, offset = frame[0], offset + frame[1]
                data = _encoded(record)
                pixels = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), np.float64)
                pixels = pixels.reshape(-1, 3)
                total += len(pixels)
                sums += pixels.sum(0)
                squares += np.square(pixels).sum(0)
    mean = sums / total
    return mean, np.sqrt(squares / total - mean * mean)


def _encoded(record):
    import tensorflow as tf  # only for --accuracy

    example = tf.train.Example.FromString(record)
    return example.features.feature["image/encoded"].bytes_list.value[0]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=20000, help="images in the generated set")
    parser.add_argument("--repeat", type=int, default=1, help="builds per mode (median)")
    parser.add_argument("--accuracy", action="store_true",
                        help="also compare the statistics with NumPy over the stored images")
    add_record_argument(parser)
    args = parser.parse_args(argv)
    record = Record("bench_transform", args)

    src = jpeg_tree(args.n)
    times = {b: [] for b in BUILDS}
    tmp = tempfile.mkdtemp(prefix="bench-transform-")
    kept = None
    try:
        for i in range(args.repeat):
            for reencode, transform in (BUILDS if i % 2 == 0 else BUILDS[::-1]):
                out = os.path.join(tmp, f"out-{reencode}-{transform}-{i}")
                seconds, note = timed_build(build(src, out, reencode, transform), out)
                times[reencode, transform].append(seconds)
                print(f"  run {i + 1}: {reencode:12} {'--transform' if transform else '           '}"
                      f" {seconds:6.1f}s  load {os.getloadavg()[0]:.1f}  {note}", flush=True)
                if transform and reencode == "pass-through" and kept is None:
                    kept = out
                else:
                    shutil.rmtree(out, ignore_errors=True)
        median = {b: statistics.median(t) for b, t in times.items()}
        print(f"\n{args.n} images (~500x375 JPEG), configs/local.yaml, median of {args.repeat}:")
        print(f"  {'build':14}{'without':>10}{'--transform':>13}{'ratio':>8}")
        result = {"n": args.n, "repeat": args.repeat}
        for reencode in ("re-encode", "pass-through"):
            base, with_tft = median[reencode, False], median[reencode, True]
            ratio = with_tft / base
            target = (f"  (target <= {TARGET}x: {'ok' if ratio <= TARGET else 'MISSED'})"
                      if reencode == "re-encode" else "")
            print(f"  {reencode:14}{base:9.1f}s{with_tft:12.1f}s{ratio:7.2f}x{target}")
            result[reencode] = {"without_s": round(base, 2), "transform_s": round(with_tft, 2),
                                "ratio": round(ratio, 3)}

        sys.path.insert(0, REPO)
        from dataset_format import dataset_info

        vdir, manifest = dataset_info.load_manifest(kept)
        t = manifest["transform"]
        print(f"  manifest mean {t['mean']}  std {t['std']}  ({t['statistics']['resolution']})")
        if args.accuracy:
            mean, std = stored_train_stats(vdir, manifest)
            print(f"  NumPy    mean {[round(float(v), 4) for v in mean]}  "
                  f"std {[round(float(v), 4) for v in std]}")
            print(f"  |mean diff| max {max(abs(a - b) for a, b in zip(t['mean'], mean)):.2g} "
                  f"levels; std diff max "
                  f"{max(abs(a - b) / b for a, b in zip(t['std'], std)):.2g} relative")
            result["numpy"] = {"mean": [float(v) for v in mean], "std": [float(v) for v in std]}
        result["manifest"] = {"mean": t["mean"], "std": t["std"]}
        print(json.dumps(result))
        record.save(result)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
