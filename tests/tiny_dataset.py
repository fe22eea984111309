"""A small published dataset written with the writer's own TensorFlow-free pieces (the Example
serializer of beam_pipeline/job/records.py, dataset_format's frames and .index lines), for
loader tests that need no Beam build.

Record `rid` of a split is a solid-colour 40x30 JPEG whose red channel is 6 * rid (rid < 42)
and green 100 * label (label = rid % 3), key "<split>/<class>/<rid>.jpg"; shard s of a split
holds the rids congruent to s modulo the shard count, in increasing order.
"""

import json
import pathlib
from typing import NamedTuple

from beam_pipeline.job import records
from dataset_format import frames, layout, schema
from tests.helpers import image_bytes

LABELS = ["daisy", "rose", "tulip"]
VERSION = "20261201T120000Z"
SPLITS = (("train", 37, 4), ("validation", 9, 2))  # (split, records, shards)
SIZE = (40, 30)  # width, height


class _Stored(NamedTuple):
    data: bytes
    height: int
    width: int


def jpeg(rid, label, size=SIZE):
    return image_bytes((6 * rid, 100 * label, 50), size)


def key(split, rid):
    return f"{split}/{LABELS[rid % 3]}/{rid:02d}.jpg"


def rids_in_order(split):
    """The rids of `split` in manifest order (shard by shard)."""
    n, shards = {s: (n, k) for s, n, k in SPLITS}[split]
    return [rid for s in range(shards) for rid in range(s, n, shards)]


def write(root, splits=SPLITS, name="flowers", size_of=lambda rid: SIZE):
    """ROOT/versions/VERSION/{shards, .index, manifest.json} and ROOT/LATEST; returns ROOT.
    size_of(rid): (width, height) of record rid's image."""
    root = pathlib.Path(root)
    vdir = pathlib.Path(layout.version_dir(str(root), VERSION))
    vdir.mkdir(parents=True)
    manifest_splits = {}
    for split, n, num_shards in splits:
        shards = []
        for s in range(num_shards):
            fname = layout.shard_name(name, split, s, num_shards)
            data, entries = b"", []
            for rid in range(s, n, num_shards):
                label = rid % 3
                width, height = size_of(rid)
                stored = _Stored(jpeg(rid, label, (width, height)), height, width)
                frame = frames.tfrecord_frame(records.make_example(
                    stored, label, LABELS[label], key(split, rid)))
                entries.append((len(data), len(frame)))
                data += frame
            (vdir / fname).write_bytes(data)
            (vdir / layout.index_name(fname)).write_bytes(frames.index_bytes(entries))
            shards.append({"path": fname, "num_examples": len(entries), "num_bytes": len(data),
                           "crc32c": frames.file_crc32c(data)})
        manifest_splits[split] = {"num_examples": n,
                                  "num_bytes": sum(s["num_bytes"] for s in shards),
                                  "label_counts": {}, "shards": shards}
    manifest = {"format_version": layout.FORMAT_VERSION, "name": name, "version": VERSION,
                "labels": LABELS, "label_offset": 0, "features": dict(schema.FEATURES),
                "splits": manifest_splits}
    (vdir / layout.MANIFEST).write_text(json.dumps(manifest, indent=1))
    (root / layout.LATEST).write_text(json.dumps(layout.latest_record(VERSION)))
    return root
