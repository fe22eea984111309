"""The script a competent user writes instead of running the pipeline: the baseline to beat.

`python benchmarks/baseline_pool.py SRC OUT_DIR [--validate_full | --passthrough]`

multiprocessing.Pool(cores); worker i takes every n-th file (paths[i::n]) and writes its own
shard with tf.io.TFRecordWriter, so no record crosses a process. Pillow does the pixels:
  default          decode and re-encode every image at quality 90
  --validate_full  full decode (img.load()), original bytes stored
  --passthrough    header only (Image.open), original bytes stored
Each record carries the same features as the pipeline's (sha256 of the stored bytes included).
"""

import hashlib
import io
import multiprocessing
import os
import sys

import tensorflow as tf  # the user imports it once; forked workers inherit it
from PIL import Image


def to_example(path, label, label_id, mode):
    with open(path, "rb") as f:
        data = f.read()
    img = Image.open(io.BytesIO(data))
    w, h = img.size
    if mode == "validate_full":
        img.load()
    elif mode == "reencode":
        out = io.BytesIO()
        img.convert("RGB").save(out, "JPEG", quality=90)
        data = out.getvalue()
    b = lambda v: tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))  # noqa: E731
    i = lambda v: tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))  # noqa: E731
    return tf.train.Example(features=tf.train.Features(feature={
        "image/encoded": b(data), "image/format": b(b"JPEG"), "image/height": i(h),
        "image/width": i(w), "image/channels": i(3), "image/colorspace": b(b"RGB"),
        "image/class/label": i(label_id), "image/class/text": b(label.encode()),
        "image/filename": b(path.encode()),
        "image/key/sha256": b(hashlib.sha256(data).hexdigest().encode()),
    })).SerializeToString()


def write_shard(args):
    index, count, paths, label_ids, out_dir, mode = args
    name = os.path.join(out_dir, f"train.tfrecord-{index:05d}-of-{count:05d}")
    with tf.io.TFRecordWriter(name) as writer:
        for path in paths:
            label = os.path.basename(os.path.dirname(path))
            writer.write(to_example(path, label, label_ids[label], mode))
    return len(paths)


def main():
    src, out_dir = sys.argv[1], sys.argv[2]
    mode = ("validate_full" if "--validate_full" in sys.argv
            else "passthrough" if "--passthrough" in sys.argv else "reencode")
    paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(src) for f in fs
                   if f.endswith(".jpg"))
    label_ids = {c: i for i, c in enumerate(sorted({os.path.basename(os.path.dirname(p))
                                                     for p in paths}))}
    os.makedirs(out_dir, exist_ok=True)
    n = os.cpu_count()
    with multiprocessing.Pool(n) as pool:
        written = sum(pool.map(write_shard, [(i, n, paths[i::n], label_ids, out_dir, mode)
                                             for i in range(n)]))
    print(f"wrote {written}")


if __name__ == "__main__":
    main()
