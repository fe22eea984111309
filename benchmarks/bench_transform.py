"""What the tf.Transform analysis pass adds to a build's wall time (issue 6: at most +25%).

    .venv/bin/python benchmarks/bench_transform.py [--n 2000] [--repeat 3] [--accuracy]

Builds the same generated set (~500x375 JPEGs, benchmarks/common.py, cached under
benchmarks/_data) with configs/local.yaml, alternately with --no_transform and with the
transform (default), each run a fresh `python -m beam_pipeline` process timed end to end.
Prints the median wall times and their ratio. With --accuracy it also compares the
manifest's mean/std (reduced-resolution analysis) with a full-resolution NumPy pass over
the stored train images.
The machine is shared: read the ratio of medians, not the absolute seconds.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from common import jpeg_tree, run_measured  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PY = sys.executable
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
TARGET = 1.25


def build(src, out, transform):
    return [PY, "-m", "beam_pipeline", "--config", os.path.join(REPO, "configs/local.yaml"),
            "--input", src, "--output", out, "--force",
            "--transform=true" if transform else "--no_transform"]


def full_resolution_stats(vdir, manifest):
    """Per-channel mean/std over every pixel of the stored train images, decoded in full."""
    import io

    import numpy as np
    import tensorflow as tf
    from PIL import Image

    files = [os.path.join(vdir, s["path"]) for s in manifest["splits"]["train"]["shards"]]
    total, sums, squares = 0, np.zeros(3), np.zeros(3)
    for record in tf.data.TFRecordDataset(files):
        example = tf.train.Example.FromString(record.numpy())
        data = example.features.feature["image/encoded"].bytes_list.value[0]
        pixels = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), np.float64)
        pixels = pixels.reshape(-1, 3)
        total += len(pixels)
        sums += pixels.sum(0)
        squares += np.square(pixels).sum(0)
    mean = sums / total
    return mean, np.sqrt(squares / total - mean * mean)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="images in the generated set")
    parser.add_argument("--repeat", type=int, default=3, help="builds per mode (median)")
    parser.add_argument("--accuracy", action="store_true",
                        help="also compare the statistics with a full-resolution pass")
    args = parser.parse_args(argv)

    src = jpeg_tree(args.n)
    times = {False: [], True: []}
    tmp = tempfile.mkdtemp(prefix="bench-transform-")
    try:
        for i in range(args.repeat):
            for transform in (False, True) if i % 2 == 0 else (True, False):
                out = os.path.join(tmp, f"out-{transform}-{i}")
                seconds, *_ = run_measured(build(src, out, transform), env=ENV)
                times[transform].append(seconds)
                print(f"  run {i + 1}: {'transform   ' if transform else 'no_transform'} "
                      f"{seconds:6.1f}s", flush=True)
                if transform and i == 0:
                    last = out
                else:
                    shutil.rmtree(out, ignore_errors=True)
        base, with_tft = statistics.median(times[False]), statistics.median(times[True])
        ratio = with_tft / base
        print(f"\n{args.n} images (~500x375 JPEG), configs/local.yaml, median of {args.repeat}:")
        print(f"  --no_transform  {base:6.1f}s")
        print(f"  --transform     {with_tft:6.1f}s  (+{with_tft - base:.1f}s)")
        print(f"  ratio           {ratio:6.2f}x  (target <= {TARGET}x: "
              f"{'ok' if ratio <= TARGET else 'MISSED'})")

        sys.path.insert(0, REPO)
        from readers import layout

        vdir, manifest = layout.load_manifest(last)
        t = manifest["transform"]
        print(f"  manifest mean {t['mean']}  std {t['std']}  ({t['statistics']['resolution']})")
        if args.accuracy:
            mean, std = full_resolution_stats(vdir, manifest)
            print(f"  full-res mean {[round(float(v), 4) for v in mean]}  "
                  f"std {[round(float(v), 4) for v in std]}")
            print(f"  |mean diff| max {max(abs(a - b) for a, b in zip(t['mean'], mean)):.3f} "
                  f"levels; std diff max "
                  f"{max(abs(a - b) / b for a, b in zip(t['std'], std)):.2%}")
        print(json.dumps({"n": args.n, "no_transform_s": base, "transform_s": with_tft,
                          "ratio": round(ratio, 3)}))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
