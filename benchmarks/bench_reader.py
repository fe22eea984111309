"""The reader against same-work tf.data pipelines and a decode-only one, on photographs.

    python benchmarks/bench_reader.py [--n 4096] [--epochs 1] [--runs 1] [--only NAME ...]

Writes N records (photographs from benchmarks/photos.py, cycling over --distinct of them;
~40 KB, ~500 px) into 16 shards the way the build does (records spread over shards by a key
hash, `.index` beside each shard), then runs each pipeline in its own subprocess, alternating
(`--runs` rounds), so every pipeline's peak RSS is its own and load changes hit all alike.

Pipelines (224 px, batch 128):
  ceiling     TFRecordDataset -> parse -> decode_jpeg (decode only, no batch)
  same        TFRecordDataset -> parse -> decode_and_crop_jpeg of a random crop -> resize ->
              flip -> batch -> prefetch: the reader's training work, nothing else
  stream      make_dataset(training=True): the stream order (interleave + shuffle buffer)
  resumable   make_dataset(training=True, start=0): the resumable order
  same_eval   as `same` with the center crop, no flip
  eval        make_dataset(training=False)
  cached      make_dataset(training=True, cache=<a file in a temporary directory>): with
              --epochs 2, the first writes the cache, the second reads it (--only cached)
  NAME_fast_idct  stream, resumable or eval with dct_method="INTEGER_FAST" (TensorFlow's
              default IDCT) instead of the exact one: what bit-exact pixels cost
              (--only stream --only stream_fast_idct ...)
Each prints the time to its first batch (building included), the first epoch's images/s,
CPU ms per image, peak RSS and, with --epochs > 1, the RSS after every epoch.

--profile: instead, where the reader's CPU goes, stage by stage, against plain tf.data: each
stage run alone on one thread (in-graph `reduce`, no Python per record), CPU µs per record,
medians of --runs alternating rounds. With --idct, only the reader's decode functions, the
exact IDCT (the default) against dct_method="INTEGER_FAST", and their ratio per round.

--base DIR also runs the reader's pipelines (stream, resumable, eval, cached) from another
checkout of the repository (e.g. `git archive main | tar -x -C DIR`), as NAME@base, in the
same alternation: a change's before and after from one run.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import zlib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import Record, add_record_argument  # noqa: E402
from dataset_format import frames, layout, schema  # noqa: E402  (no TensorFlow at import)

TRAIN = ("ceiling", "same", "stream", "resumable")
EVAL = ("same_eval", "eval")
PIPELINES = TRAIN + EVAL
FAST_IDCT = ("stream_fast_idct", "resumable_fast_idct", "eval_fast_idct")
EXTRA = ("cached",) + FAST_IDCT  # run with --only: memory against the split's size, IDCTs
LABELS = [f"class{i:02d}" for i in range(10)]


def write_data(root, n, num_shards, distinct):
    """N records over `distinct` photographs, shards by key hash, with .index files."""
    from photos import _load_sources, photo_jpeg

    _load_sources()
    jpegs = [photo_jpeg(i) for i in range(min(n, distinct))]
    version = "20260101T000000Z"
    vdir = layout.version_dir(root, version)
    os.makedirs(vdir)
    keys = [f"{LABELS[i % len(LABELS)]}/{i:06d}.jpg" for i in range(n)]
    by_shard = [[] for _ in range(num_shards)]
    for i, key in enumerate(keys):
        by_shard[zlib.crc32(key.encode()) % num_shards].append(i)
    shards = []
    for s, rids in enumerate(by_shard):
        name = layout.shard_name("bench", "train", s, num_shards)
        entries, offset = [], 0
        with open(layout.join(vdir, name), "wb") as f:
            for rid in sorted(rids, key=lambda r: zlib.crc32(keys[r].encode(), 7)):
                record = _example(jpegs[rid % len(jpegs)], rid % len(LABELS), keys[rid])
                frame = frames.tfrecord_frame(record)
                f.write(frame)
                entries.append((offset, len(frame)))
                offset += len(frame)
        with open(layout.join(vdir, layout.index_name(name)), "wb") as f:
            f.write(frames.index_bytes(entries))
        shards.append({"path": name, "num_examples": len(rids), "num_bytes": offset})
    split = {"num_examples": n, "num_bytes": sum(s["num_bytes"] for s in shards),
             "shards": shards}
    manifest = {"format_version": layout.FORMAT_VERSION, "name": "bench", "version": version,
                "labels": LABELS, "label_offset": 0, "features": schema.FEATURES,
                "splits": {"train": split, "validation": split}}
    with open(layout.join(vdir, layout.MANIFEST), "w") as f:
        json.dump(manifest, f)
    with open(layout.join(root, layout.LATEST), "w") as f:
        json.dump(layout.latest_record(version), f)
    kb = sum(len(j) for j in jpegs) / len(jpegs) / 1024
    print(f"wrote {n} records ({kb:.0f} KB photographs, {len(jpegs)} distinct) in "
          f"{num_shards} shards to {root}")


def _example(jpeg, label, key):
    import tensorflow as tf

    return tf.train.Example(features=tf.train.Features(feature={
        schema.ENCODED: tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
        schema.LABEL: tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
        schema.FILENAME: tf.train.Feature(bytes_list=tf.train.BytesList(
            value=[key.encode()]))})).SerializeToString()


def tf_pipeline(files, which, batch_size, image_size):
    """ceiling / same / same_eval: plain tf.data, no checks, no shuffle."""
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices(files).interleave(
        tf.data.TFRecordDataset, num_parallel_calls=tf.data.AUTOTUNE)
    spec = schema.feature_spec([schema.ENCODED, schema.LABEL])

    def decode(record):
        ex = tf.io.parse_single_example(record, spec)
        jpeg = ex[schema.ENCODED]
        if which == "ceiling":
            return tf.io.decode_jpeg(jpeg, channels=3)
        shape = tf.io.extract_jpeg_shape(jpeg)
        if which == "same":
            begin, size, _ = tf.image.sample_distorted_bounding_box(
                shape, tf.constant([[[0.0, 0.0, 1.0, 1.0]]]), min_object_covered=0.1,
                aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0), max_attempts=10,
                use_image_if_no_bounding_boxes=True)
            window = tf.stack([begin[0], begin[1], size[0], size[1]])
        else:
            side = tf.cast(0.875 * tf.cast(tf.minimum(shape[0], shape[1]), tf.float32),
                           tf.int32)
            window = tf.stack([(shape[0] - side) // 2, (shape[1] - side) // 2, side, side])
        image = tf.io.decode_and_crop_jpeg(jpeg, window, channels=3)
        image = tf.image.resize(tf.cast(image, tf.float32), [image_size, image_size])
        if which == "same":
            image = tf.image.random_flip_left_right(image)
        return image * (1 / 255), tf.cast(ex[schema.LABEL], tf.int32)

    ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE)
    if which == "ceiling":
        return ds
    return ds.batch(batch_size, drop_remainder=which == "same").prefetch(tf.data.AUTOTUNE)


def _stages(root, image_size):
    """{name: a function making the dataset} for `profile`: reading, the checks with a
    trivial decode, and the decode function itself on one thread."""
    import tensorflow as tf

    import readers
    from readers import checked, hosts, images, records, shards

    info = readers.info(root)
    split = info.split("validation")
    files = split.files
    evals = hosts.plan(split, hosts.detect(None), False)
    train = hosts.plan(split, hosts.detect(None), True)
    trivial = lambda record, *seed: (tf.zeros([2]), tf.constant(0))  # noqa: E731
    spec = schema.feature_spec([schema.ENCODED, schema.LABEL])
    output = images.Output(tf.float32)

    def recs(plan, training):
        return records.records(plan, split, training, 1)

    def checks(plan, training, fn, batch=None):
        ds, pieces = recs(plan, training)
        names = checked.Names(pieces, False, shards.sentinel_record())
        if batch:
            return checked.decoded_batches(ds, fn, names, False, batch, drop_remainder=False,
                                           total=plan.records)
        return checked.decoded(ds, fn, names, False, lambda d: d, plan.records)

    def same_fn(record):
        ex = tf.io.parse_single_example(record, spec)
        jpeg = ex[schema.ENCODED]
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            tf.io.extract_jpeg_shape(jpeg), tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
            min_object_covered=0.1, aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0),
            max_attempts=10, use_image_if_no_bounding_boxes=True)
        image = tf.io.decode_and_crop_jpeg(
            jpeg, tf.stack([begin[0], begin[1], size[0], size[1]]), channels=3)
        image = tf.image.resize(tf.cast(image, tf.float32), [image_size, image_size])
        return tf.image.random_flip_left_right(image) * (1 / 255), ex[schema.LABEL]

    ours_fn = images.example_fn(True, images.Pixels((image_size, image_size), output))
    fast_fn = images.example_fn(True, images.Pixels((image_size, image_size), output,
                                                    dct_method=images.FAST_IDCT))
    eval_fn = images.example_fn(False, images.Pixels((image_size, image_size), output))
    eval_fast_fn = images.example_fn(False, images.Pixels((image_size, image_size), output,
                                                          dct_method=images.FAST_IDCT))
    plain = lambda: tf.data.Dataset.from_tensor_slices(files).flat_map(  # noqa: E731
        tf.data.TFRecordDataset)
    seeds = lambda: tf.data.Dataset.random(seed=1).batch(2, drop_remainder=True)  # noqa: E731
    return {
        "read: TFRecordDataset, file after file": plain,
        "read: the reader, stream order (training)": lambda: recs(train, True)[0],
        "read: the reader, eval ranges by offset": lambda: recs(evals, False)[0],
        "read + map(trivial) (no checks)": lambda: recs(evals, False)[0].map(
            lambda r, i: trivial(r)),
        "read + checks + map(trivial)": lambda: checks(evals, False, trivial),
        "read + checks once a batch + map(trivial)": lambda: checks(evals, False, trivial, 128),
        "decode: same-work map fn": lambda: plain().map(same_fn),
        "decode: the reader's fn (+ seeds)": lambda: tf.data.Dataset.zip(
            plain(), seeds()).map(ours_fn),
        "decode: the reader's fn, fast IDCT": lambda: tf.data.Dataset.zip(
            plain(), seeds()).map(fast_fn),
        "decode: the reader's eval fn": lambda: plain().map(eval_fn),
        "decode: the reader's eval fn, fast IDCT": lambda: plain().map(eval_fast_fn),
    }


def profile(root, image_size, runs, idct=False):
    """Print CPU µs per record of each stage (`_stages`), medians of `runs` rounds; `idct`:
    only the decode functions, and each exact/fast pair's ratio per round (paired rounds
    cancel most of the load that moves the absolute figures)."""
    import tensorflow as tf

    import readers

    n = readers.info(root).split("validation").num_examples
    stages = _stages(root, image_size)
    if idct:
        stages = {k: v for k, v in stages.items() if k.startswith("decode: the reader's")}
    cpu = {name: [] for name in stages}
    for _ in range(runs):
        for name, make in stages.items():
            ds = make().with_options(_one_thread())
            c0 = _cpu_seconds()
            ds.reduce(tf.constant(0, tf.int64), lambda count, *_: count + 1).numpy()
            cpu[name].append(1e6 * (_cpu_seconds() - c0) / n)
    print(f"\n{'stage (one thread, in-graph)':<45}{'CPU us/record':>14}  (rounds)")
    for name, values in cpu.items():
        print(f"{name:<45}{sorted(values)[len(values) // 2]:>14.0f}  "
              + " ".join(f"{v:.0f}" for v in values))
    print(f"(load average {os.getloadavg()[0]:.1f}; {n} records)")
    pairs = [("decode: the reader's fn (+ seeds)", "decode: the reader's fn, fast IDCT"),
             ("decode: the reader's eval fn", "decode: the reader's eval fn, fast IDCT")]
    for exact, fast in pairs:
        if exact in cpu and fast in cpu:
            ratios = sorted(a / b for a, b in zip(cpu[exact], cpu[fast]))
            print(f"exact / fast IDCT, {'training' if 'eval' not in exact else 'evaluation'}"
                  f" decode: CPU per record "
                  f"{ratios[len(ratios) // 2]:.3f}x (median of paired rounds; "
                  + " ".join(f"{r:.2f}" for r in ratios) + ")")
    return {name: sorted(v)[len(v) // 2] for name, v in cpu.items()}


def _one_thread():
    import tensorflow as tf

    options = tf.data.Options()
    options.threading.private_threadpool_size = 1
    options.autotune.enabled = False
    return options


def child(which, root, batch_size, image_size, epochs):
    """Run one pipeline; print a JSON line with its figures."""
    import tensorflow as tf

    import readers
    from readers import images as images_lib

    dct_method = images_lib.EXACT_IDCT
    if which.endswith("_fast_idct"):
        which, dct_method = which[:-len("_fast_idct")], images_lib.FAST_IDCT
    base_rss = _rss()
    t0, cpu0 = time.perf_counter(), _cpu_seconds()
    ds_info = readers.info(root)
    if which in ("ceiling", "same", "same_eval"):
        ds = tf_pipeline(ds_info.split("train").files, which, batch_size, image_size)
    else:
        cache = False
        if which == "cached":
            import atexit
            import shutil

            tmp = tempfile.mkdtemp(prefix="bench_cache_")
            atexit.register(shutil.rmtree, tmp, True)
            cache = os.path.join(tmp, "cache")
        ds = readers.make_dataset(root, "validation" if which == "eval" else "train",
                                  batch_size=batch_size, image_size=image_size,
                                  training=which != "eval", seed=1, cache=cache,
                                  start=0 if which == "resumable" else None,
                                  **({} if dct_method == images_lib.EXACT_IDCT
                                     else {"dct_method": dct_method}))
    if which == "ceiling":  # one image per element: batch in the graph, count in Python
        ds = ds.map(lambda img: tf.size(img) > 0).batch(batch_size)
    first = None
    images, seconds, rss = 0, None, []
    for _ in range(epochs):
        for x in ds:
            if first is None:
                first = time.perf_counter() - t0
            images += int(x.shape[0]) if which == "ceiling" else int(x[0].shape[0])
        if seconds is None:
            seconds, cpu, first_images = time.perf_counter() - t0, _cpu_seconds() - cpu0, images
        rss.append(_rss())
    if dct_method != images_lib.EXACT_IDCT:
        which += "_fast_idct"
    print(json.dumps({"which": which, "images": first_images, "seconds": seconds, "cpu": cpu,
                      "first_batch": first, "peak_rss": _peak_rss(), "base_rss": base_rss,
                      "rss_by_epoch": rss}))


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", help="an existing root written by this script")
    p.add_argument("--n", type=int, default=4096, help="records to write")
    p.add_argument("--distinct", type=int, default=2000, help="distinct photographs")
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--batch_size", type=int, default=128)
    p.add_argument("--image_size", type=int, default=224)
    p.add_argument("--epochs", type=int, default=1, help="epochs per run (RSS per epoch)")
    p.add_argument("--runs", type=int, default=1, help="alternating rounds (median shown)")
    p.add_argument("--only", choices=PIPELINES + EXTRA, action="append",
                   help="run just these")
    p.add_argument("--base", help="another checkout: its reader runs too, as NAME@base")
    p.add_argument("--profile", action="store_true", help="CPU per record, stage by stage")
    p.add_argument("--idct", action="store_true",
                   help="with --profile: the decode functions only, exact against fast IDCT")
    p.add_argument("--child", choices=PIPELINES + EXTRA, help=argparse.SUPPRESS)
    add_record_argument(p)
    args = p.parse_args(argv)
    if args.child:
        return child(args.child, args.data, args.batch_size, args.image_size, args.epochs)
    record = Record("bench_reader", {k: v for k, v in vars(args).items() if k != "child"})

    with tempfile.TemporaryDirectory(prefix="bench_reader_") as tmp:
        root = args.data or tmp
        if not args.data:
            write_data(root, args.n, args.shards, args.distinct)
        if args.profile:
            return record.save({"profile": profile(root, args.image_size, args.runs,
                                                   args.idct)})
        runs = {}
        for _ in range(args.runs):
            for which, script in _schedule(args.only or PIPELINES, args.base):
                out = subprocess.run(
                    [sys.executable, script, "--child", which.split("@")[0], "--data",
                     root, "--batch_size", str(args.batch_size), "--image_size",
                     str(args.image_size), "--epochs", str(args.epochs)],
                    capture_output=True, text=True, env=dict(os.environ,
                                                             TF_CPP_MIN_LOG_LEVEL="2"))
                if out.returncode:
                    sys.exit(f"{which} failed:\n{out.stderr[-3000:]}")
                r = json.loads(out.stdout.strip().splitlines()[-1])
                r["rate"] = r["images"] / r["seconds"]
                runs.setdefault(which, []).append(r)
    record.save({"runs": runs, "medians": report(runs)})


def _schedule(pipelines, base):
    """(name, script) in the order run: each reader pipeline right after its @base twin."""
    for which in pipelines:
        if base and which not in ("ceiling", "same", "same_eval"):
            yield f"{which}@base", os.path.join(os.path.abspath(base), "benchmarks",
                                                os.path.basename(__file__))
        yield which, os.path.abspath(__file__)


def _median(rows, key):
    values = sorted(r[key] for r in rows)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def report(runs):
    gb = 1 << 30
    print(f"\n{'pipeline':<15}{'images':>7}{'img/s':>7}{'CPU ms/img':>11}{'1st batch':>10}"
          f"{'peak RSS':>10}  RSS after each epoch (GB)")
    med = {}
    for which, rows in runs.items():
        med[which] = {k: _median(rows, k) for k in ("rate", "cpu", "first_batch", "peak_rss")}
        by_epoch = " ".join(f"{v / gb:.2f}" for v in rows[-1]["rss_by_epoch"])
        print(f"{which:<15}{rows[0]['images']:>7}{med[which]['rate']:>7.0f}"
              f"{1000 * med[which]['cpu'] / rows[0]['images']:>11.2f}"
              f"{med[which]['first_batch']:>9.2f}s{med[which]['peak_rss'] / gb:>9.2f}G  "
              f"{by_epoch}")
    print(f"({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; medians of "
          f"{len(next(iter(runs.values())))} alternating runs)")
    checks = []
    pairs = [("stream", "same"), ("resumable", "same"), ("resumable", "stream"),
             ("eval", "same_eval")]
    pairs += [(f"{ours}@base", base) for ours, base in pairs]
    pairs += [(name[:-len("_fast_idct")], name) for name in FAST_IDCT]
    for ours, base in pairs:
        if ours in med and base in med:
            a, b = med[ours], med[base]
            checks.append(f"{ours} / {base}: throughput {a['rate'] / b['rate']:.2f}x, first "
                          f"batch {a['first_batch'] / b['first_batch']:.2f}x, peak RSS "
                          f"{a['peak_rss'] / b['peak_rss']:.2f}x")
    print("\n".join(checks))
    return med


if __name__ == "__main__":
    main()
