"""The baseline the pipeline must keep up with: multiprocessing.Pool + Pillow + TFRecordWriter.

`python benchmarks/baseline_pool.py SRC OUT.tfrecord [--passthrough | --validate_full]`

Default: decode and re-encode every image at quality 90. --passthrough stores the original
bytes after opening the header only; --validate_full stores them after a full Pillow decode
(img.load()), the fair baseline for the pipeline's default strict validation.
"""

import hashlib
import io
import multiprocessing
import os
import sys


def to_example(path, mode):
    from PIL import Image
    from tensorflow.core.example import example_pb2, feature_pb2

    with open(path, "rb") as f:
        data = f.read()
    img = Image.open(io.BytesIO(data))
    w, h = img.size
    if mode == "validate_full":
        img.load()
    elif mode == "reencode":
        img = img.convert("RGB")
        out = io.BytesIO()
        img.save(out, "JPEG", quality=90)
        data = out.getvalue()
    b = lambda v: feature_pb2.Feature(bytes_list=feature_pb2.BytesList(value=[v]))  # noqa: E731
    i = lambda v: feature_pb2.Feature(int64_list=feature_pb2.Int64List(value=[v]))  # noqa: E731
    label = os.path.basename(os.path.dirname(path))
    ex = example_pb2.Example(features=feature_pb2.Features(feature={
        "image/encoded": b(data), "image/format": b(b"JPEG"), "image/height": i(h),
        "image/width": i(w), "image/class/text": b(label.encode()),
        "image/filename": b(path.encode()),
        "image/key/sha256": b(hashlib.sha256(data).hexdigest().encode())}))
    return ex.SerializeToString()


def _convert(args):
    return to_example(*args)


def main():
    src, out = sys.argv[1], sys.argv[2]
    mode = ("validate_full" if "--validate_full" in sys.argv
            else "passthrough" if "--passthrough" in sys.argv else "reencode")
    import tensorflow as tf

    paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(src) for f in fs
                   if f.endswith(".jpg"))
    n = 0
    with multiprocessing.Pool(os.cpu_count()) as pool, tf.io.TFRecordWriter(out) as writer:
        for record in pool.imap(_convert, [(p, mode) for p in paths], chunksize=32):
            writer.write(record)
            n += 1
    print(f"wrote {n}")


if __name__ == "__main__":
    main()
