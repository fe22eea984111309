"""Reader throughput and memory: the seed pipeline vs a decode-only ceiling vs make_dataset.

    python benchmarks/bench_reader.py [--n 10000] [--data ROOT]

Without --data it writes N synthetic ~500x375 JPEG records (~40 KB, as photos) into shards
with a manifest. Each pipeline then runs one first epoch in its own subprocess, so its peak
RSS is its own (TensorFlow's baseline included; printed separately).
Pipelines: seed (the first reader: decoded pixels in the shuffle buffer), ceiling (read, parse,
decode_jpeg: no crop, resize or batch), same (the reader's work alone: center-crop decode,
resize, cast, batch), ours (make_dataset, training). Targets: ours >= 0.8x the decode-only
ceiling and >= 1.0x the same-work one, peak RSS <= 1.5 GB.
"""

import argparse
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from dataset_format import layout, schema  # noqa: E402  (no TensorFlow at import)

PIPELINES = ("seed", "ceiling", "same", "ours")
LABELS = [f"class{i:02d}" for i in range(10)]


def write_data(root, n, num_shards, distinct=500):
    """N records cycling over `distinct` synthetic JPEGs (smooth colour fields + noise)."""
    import numpy as np
    import tensorflow as tf
    from PIL import Image

    rng = np.random.default_rng(0)
    jpegs = []
    for _ in range(min(n, distinct)):
        low = rng.uniform(0, 255, (12, 16, 3)).astype(np.uint8)
        img = np.asarray(Image.fromarray(low).resize((500, 375), Image.BICUBIC), np.float32)
        img += rng.normal(0, 4.5, img.shape)
        buf = io.BytesIO()
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
        jpegs.append(buf.getvalue())

    version = "20260101T000000Z"
    vdir = layout.version_dir(root, version)
    os.makedirs(vdir)
    shards = []
    for s in range(num_shards):
        name = layout.shard_name("bench", "train", s, num_shards)
        rids = range(s, n, num_shards)
        with tf.io.TFRecordWriter(layout.join(vdir, name)) as w:
            for rid in rids:
                enc, label = jpegs[rid % len(jpegs)], rid % len(LABELS)
                w.write(tf.train.Example(features=tf.train.Features(feature={
                    schema.ENCODED: tf.train.Feature(bytes_list=tf.train.BytesList(value=[enc])),
                    schema.LABEL: tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                })).SerializeToString())
        size = os.path.getsize(layout.join(vdir, name))
        shards.append({"path": name, "num_examples": len(rids), "num_bytes": size})
    manifest = {"format_version": layout.FORMAT_VERSION, "name": "bench", "version": version,
                "labels": LABELS, "label_offset": 0, "features": schema.FEATURES,
                "splits": {"train": {"num_examples": n,
                                     "num_bytes": sum(s["num_bytes"] for s in shards),
                                     "shards": shards}}}
    with open(layout.join(vdir, layout.MANIFEST), "w") as f:
        json.dump(manifest, f)
    with open(layout.join(root, layout.LATEST), "w") as f:
        json.dump(layout.latest_record(version), f)
    mean_kb = sum(len(jpegs[r % len(jpegs)]) for r in range(n)) / n / 1024
    print(f"wrote {n} records ({mean_kb:.0f} KB JPEGs) in {num_shards} shards to {root}")


def seed_pipeline(vdir):
    """The seed reader, as it was: decoded float images in a 10,000-element shuffle buffer."""
    import tensorflow as tf

    files = tf.data.Dataset.list_files(os.path.join(vdir, "*-train.tfrecord-*"))
    ds = files.interleave(tf.data.TFRecordDataset, num_parallel_calls=tf.data.AUTOTUNE)

    def parse(record):
        ex = tf.io.parse_single_example(record, {
            "image/encoded": tf.io.FixedLenFeature([], tf.string),
            "image/class/label": tf.io.FixedLenFeature([], tf.int64)})
        image = tf.io.decode_jpeg(ex["image/encoded"], channels=3)
        image = tf.cast(image, tf.float32) / 255.0
        image = tf.image.resize(image, [224, 224])
        return image, ex["image/class/label"]

    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.shuffle(10000).batch(128).prefetch(tf.data.AUTOTUNE)


def ceiling_pipeline(files):
    """Read, parse and decode: what a reader cannot beat on this CPU."""
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices(files).interleave(
        tf.data.TFRecordDataset, num_parallel_calls=tf.data.AUTOTUNE)

    def decode(record):
        ex = tf.io.parse_single_example(record, schema.feature_spec([schema.ENCODED]))
        return tf.io.decode_jpeg(ex[schema.ENCODED], channels=3)

    return ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE)


def same_work_pipeline(files, batch_size, image_size):
    """The reader's work and nothing else: center-crop decode, resize, cast, batch (no shuffle,
    no augmentation, no checks)."""
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices(files).interleave(
        tf.data.TFRecordDataset, num_parallel_calls=tf.data.AUTOTUNE)

    def decode(record):
        ex = tf.io.parse_single_example(record, schema.feature_spec([schema.ENCODED,
                                                                     schema.LABEL]))
        jpeg = ex[schema.ENCODED]
        shape = tf.io.extract_jpeg_shape(jpeg)
        side = tf.cast(0.875 * tf.cast(tf.minimum(shape[0], shape[1]), tf.float32), tf.int32)
        window = tf.stack([(shape[0] - side) // 2, (shape[1] - side) // 2, side, side])
        image = tf.io.decode_and_crop_jpeg(jpeg, window, channels=3)
        image = tf.image.resize(image, [image_size, image_size])
        return tf.cast(image * (1 / 255), tf.float32), tf.cast(ex[schema.LABEL], tf.int32)

    ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def child(which, root, batch_size, image_size):
    """Run one pipeline for one epoch; print a JSON line with images, seconds and peak RSS."""
    import tensorflow as tf

    import readers

    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    ds_info = readers.info(root)
    cpu0, t0 = _cpu_seconds(), time.perf_counter()
    if which == "seed":
        images = sum(int(x.shape[0]) for x, _ in seed_pipeline(ds_info.version_dir))
    elif which == "ceiling":
        # counted in-graph: iterating 10k single images in Python would measure Python
        images = int(ceiling_pipeline(ds_info.split("train").files).reduce(
            tf.constant(0, tf.int64), lambda n, img: n + tf.cast(tf.size(img) > 0, tf.int64)))
    elif which == "same":
        images = sum(int(x.shape[0]) for x, _ in same_work_pipeline(
            ds_info.split("train").files, batch_size, image_size))
    else:
        ds = readers.make_dataset(root, "train", batch_size=batch_size, image_size=image_size,
                                  training=True)
        images = sum(int(x.shape[0]) for x, _ in ds)
    seconds, cpu = time.perf_counter() - t0, _cpu_seconds() - cpu0
    print(json.dumps({"which": which, "images": images, "seconds": seconds, "cpu": cpu,
                      "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "base_rss": base_rss}))


def _cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", help="an existing dataset root or version dir (split 'train')")
    p.add_argument("--n", type=int, default=10000, help="records to generate")
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--batch_size", type=int, default=128)
    p.add_argument("--image_size", type=int, default=224)
    p.add_argument("--runs", type=int, default=1, help="runs of each pipeline (median shown)")
    p.add_argument("--only", choices=PIPELINES, action="append", help="run just these")
    p.add_argument("--child", choices=PIPELINES, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args.child, args.data, args.batch_size, args.image_size)

    with tempfile.TemporaryDirectory(prefix="bench_reader_") as tmp:
        root = args.data
        if not root:
            root = tmp
            t0 = time.perf_counter()
            write_data(root, args.n, args.shards)
            print(f"  ({time.perf_counter() - t0:.0f} s)")
        runs = {}
        for _ in range(args.runs):  # interleaved, so load changes hit every pipeline alike
            for which in args.only or PIPELINES:
                out = subprocess.run(
                    [sys.executable, os.path.abspath(__file__), "--child", which, "--data",
                     root, "--batch_size", str(args.batch_size), "--image_size",
                     str(args.image_size)], capture_output=True, text=True)
                if out.returncode:
                    sys.exit(f"{which} failed:\n{out.stderr[-3000:]}")
                r = json.loads(out.stdout.strip().splitlines()[-1])
                r["rate"] = r["images"] / r["seconds"]
                runs.setdefault(which, []).append(r)
    report(runs)


def _median(rows, key):
    values = sorted(r[key] for r in rows)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def report(runs):
    gb = 1 << 30
    print(f"\n{'pipeline':<10}{'images':>8}{'img/s':>8}{'(runs)':>24}{'CPU ms/img':>12}"
          f"{'peak RSS':>10}{'TF baseline':>13}")
    med = {}
    for which, rows in runs.items():
        med[which] = {k: _median(rows, k) for k in ("rate", "cpu", "peak_rss", "base_rss")}
        each = "/".join(f"{r['rate']:.0f}" for r in rows)
        print(f"{which:<10}{rows[0]['images']:>8}{med[which]['rate']:>8.0f}{each:>24}"
              f"{1000 * med[which]['cpu'] / rows[0]['images']:>12.2f}"
              f"{med[which]['peak_rss'] / gb:>9.2f}G{med[which]['base_rss'] / gb:>12.2f}G")
    print(f"({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}: on a shared machine "
          "img/s moves with the load; CPU ms/img much less; medians of the runs)")
    ours = med.get("ours")
    if not ours:
        return
    print()
    checks = [("peak RSS <= 1.5 GB", ours["peak_rss"] / gb, "GB", ours["peak_rss"] <= 1.5 * gb)]
    for which, target in (("ceiling", 0.8), ("same", 1.0), ("seed", 2.5)):
        if which in med:
            x = ours["rate"] / med[which]["rate"]
            checks.append((f"vs {which} >= {target}x", x, "x", x >= target))
    if "transform" in med:
        x = med["transform"]["rate"] / ours["rate"]
        checks.append(("transform vs ours >= 0.8x", x, "x", x >= 0.8))
    for name, value, unit, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name:<28} {value:.2f}{unit}")


if __name__ == "__main__":
    main()
