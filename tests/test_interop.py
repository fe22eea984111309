"""Other tools read our output: TFDS through its metadata, the `tfrecord` package and raw
random access through the .index files, tf.data for the CRCs."""

import hashlib
import io
import json
import os

import numpy as np
import pytest

from dataset_format import frames, layout, schema
from tests.helpers import read_records


def _shards(built, min_records=0):
    """[(split, absolute shard path, manifest shard dict)] with at least `min_records`."""
    vdir, manifest = built["version_dir"], built["manifest"]
    return [(split, layout.join(vdir, sh["path"]), sh)
            for split, s in sorted(manifest["splits"].items()) for sh in s["shards"]
            if sh["num_examples"] >= min_records]


# --- TFDS -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tfds_builder(built_dataset):
    import tensorflow_datasets as tfds

    return tfds.builder_from_directory(built_dataset["version_dir"])


def test_build_writes_tfds_metadata_listed_in_manifest(built_dataset):
    tfds_part = built_dataset["manifest"]["tfds"]
    assert {"dataset_info.json", "features.json", "image-class-label.labels.txt"} <= set(
        tfds_part["files"])
    for name in tfds_part["files"]:
        assert os.path.isfile(os.path.join(built_dataset["version_dir"], name)), name
    with open(os.path.join(built_dataset["version_dir"], "image-class-label.labels.txt")) as f:
        assert f.read().split() == built_dataset["manifest"]["labels"]


def test_tfds_info_matches_manifest(tfds_builder, built_dataset):
    manifest = built_dataset["manifest"]
    info = tfds_builder.info
    assert info.name == manifest["name"]
    label = info.features["image"]["class"]["label"]
    assert label.names == manifest["labels"]
    readable = {s for s, v in manifest["splits"].items() if v["num_examples"]}
    assert set(info.splits.keys()) == readable
    for split in readable:
        s = manifest["splits"][split]
        assert info.splits[split].shard_lengths == [sh["num_examples"] for sh in s["shards"]]
        assert info.splits[split].num_examples == s["num_examples"]
        assert info.splits[split].num_bytes == s["num_bytes"]


def test_tfds_reads_slices_with_decoded_images_and_names(tfds_builder, built_dataset):
    import tensorflow_datasets as tfds

    n = built_dataset["manifest"]["splits"]["train"]["num_examples"]
    label = tfds_builder.info.features["image"]["class"]["label"]
    head = list(tfds.as_numpy(tfds_builder.as_dataset(split="train[:10%]")))
    tail = list(tfds.as_numpy(tfds_builder.as_dataset(split="train[10%:]")))
    assert 1 <= len(head) < n and len(head) + len(tail) == n
    keys = {ex["image"]["key"]["sha256"] for ex in head + tail}
    assert len(keys) == n  # the two slices partition the split
    for ex in head:
        img = ex["image"]
        assert img["encoded"].dtype.name == "uint8"
        assert img["encoded"].shape == (img["height"], img["width"], 3)
        assert label.int2str(img["class"]["label"]) == img["class"]["text"].decode()
        assert img["format"] == b"JPEG"


def test_tfds_metadata_counts_come_from_manifest_not_files(tmp_path):
    """dataset_info is built from the manifest alone: no shard file has to exist."""
    from beam_pipeline.job import tfds_metadata

    manifest = {
        "format_version": 1, "name": "fake", "version": "20260101T000000Z",
        "labels": ["a", "b"], "label_offset": 0, "features": dict(schema.FEATURES),
        "splits": {
            "train": {"num_examples": 1234, "num_bytes": 99,
                      "shards": [{"path": layout.shard_name("fake", "train", i, 3),
                                  "num_examples": n} for i, n in enumerate([400, 434, 400])]},
            "test": {"num_examples": 0, "num_bytes": 0,
                     "shards": [{"path": layout.shard_name("fake", "test", 0, 1),
                                 "num_examples": 0}]},
        },
    }
    part = tfds_metadata.write(str(tmp_path), manifest)  # -> the manifest's "tfds" section
    import tensorflow_datasets as tfds

    info = tfds.builder_from_directory(str(tmp_path)).info
    assert info.splits["train"].shard_lengths == [400, 434, 400]
    assert info.splits["train"].num_bytes == 99
    assert "test" not in info.splits and part["tfds"]["omitted_splits"] == ["test"]

    manifest["splits"]["train"]["shards"][0]["path"] = "fake-train-00000.tfrecord"
    with pytest.raises(ValueError, match="TFDS template"):
        tfds_metadata.write(str(tmp_path), manifest)


def test_tfds_metadata_is_what_tfds_itself_writes(built_dataset, tmp_path):
    """Our JSON (written without importing TFDS) equals DatasetInfo.write_to_directory's."""
    import tensorflow_datasets as tfds
    from tensorflow_datasets.core import naming

    m, vdir = built_dataset["manifest"], built_dataset["version_dir"]
    nested = {}
    kinds = {"string": lambda: tfds.features.Text(),
             "int64": lambda: tfds.features.Scalar(dtype=np.int64)}
    for key, dtype in m["features"].items():
        *parents, leaf = key.split("/")
        node = nested
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = (tfds.features.Image(shape=(None, None, 3), encoding_format="jpeg")
                      if key == schema.ENCODED else
                      tfds.features.ClassLabel(names=m["labels"]) if key == schema.LABEL
                      else kinds[dtype]())
    info = tfds.core.DatasetInfo(
        builder=tfds.core.DatasetIdentity(name=m["name"], version=tfds.core.Version(f"{m['format_version']}.0.0"),
                                          data_dir=str(tmp_path),
                                          module_name="beam_pipeline.job.tfds_metadata"),
        description=json.load(open(os.path.join(vdir, "dataset_info.json")))["description"],
        features=tfds.features.FeaturesDict(nested),
        metadata=tfds.core.MetadataDict(version=m["version"], manifest=layout.MANIFEST))
    info.set_splits(tfds.core.SplitDict([
        tfds.core.SplitInfo(name=split, shard_lengths=[sh["num_examples"] for sh in s["shards"]],
                            num_bytes=s["num_bytes"], filename_template=naming.ShardedFileTemplate(
                                data_dir=str(tmp_path), dataset_name=m["name"], split=split,
                                filetype_suffix="tfrecord"))
        for split, s in sorted(m["splits"].items()) if s["num_examples"]]))
    info.write_to_directory(str(tmp_path))
    for name in m["tfds"]["files"]:
        ours = open(os.path.join(vdir, name)).read()
        theirs = open(os.path.join(tmp_path, name)).read()
        if name.endswith(".json"):
            ours, theirs = json.loads(ours), json.loads(theirs)
        assert ours == theirs, name


# --- index files: the `tfrecord` package and raw random access -------------------------------

def test_every_shard_has_an_index_with_one_line_per_record(built_dataset):
    for _, path, sh in _shards(built_dataset):
        with open(layout.index_name(path)) as f:
            lines = f.read().splitlines()
        assert len(lines) == sh["num_examples"], path


# Runs in a fresh interpreter: tfrecord's own example_pb2 and TensorFlow's register the same
# proto symbols, so the package cannot be imported once TensorFlow is (as in a PyTorch job).
TFRECORD_READER = r"""
import json, sys
from tfrecord.reader import tfrecord_loader
description = {"image/class/label": "int", "image/class/text": "byte", "image/key/sha256": "byte"}
out = {}
for path, index in json.loads(sys.argv[1]):
    def read(index, **kw):
        return [[int(r["image/class/label"][0]), bytes(r["image/class/text"]).decode(),
                 bytes(r["image/key/sha256"]).decode()]
                for r in tfrecord_loader(path, index, description, **kw)]
    out[path] = {"plain": read(None)}
    if index:
        # shard=(i, 2): the package seeks to the index offset where each half starts;
        # with no shard it starts at a random index offset and wraps around.
        out[path]["halves"] = [read(index, shard=(i, 2)) for i in (0, 1)]
        out[path]["rotated"] = read(index)
print(json.dumps(out))
"""


def test_tfrecord_package_reads_shards_through_index(built_dataset):
    import json
    import subprocess
    import sys

    # tfrecord 1.14's loader cannot take a 0- or 1-line index (np.loadtxt gives a 1-D array,
    # vahidk/tfrecord#9); DALI can. Such shards are read without the index.
    shards = _shards(built_dataset)
    args = [[path, layout.index_name(path) if sh["num_examples"] >= 2 else None]
            for _, path, sh in shards]
    proc = subprocess.run([sys.executable, "-c", TFRECORD_READER, json.dumps(args)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    labels = built_dataset["manifest"]["labels"]
    checked = 0
    for _, path, sh in shards:
        plain = result[path]["plain"]
        assert len(plain) == sh["num_examples"]
        assert all(labels[label] == text for label, text, _ in plain)
        if "halves" in result[path]:
            halves, rotated = result[path]["halves"], result[path]["rotated"]
            assert halves[0] and halves[1] and halves[0] + halves[1] == plain
            start = plain.index(rotated[0])
            assert rotated == plain[start:] + plain[:start]
            checked += 1
    assert checked >= 1


def test_random_access_record_at_index_offset_k_is_kth_example(built_dataset):
    import tensorflow as tf

    total = 0
    # tf.data checks every frame's CRCs on the way
    by_shard = read_records(built_dataset["version_dir"], built_dataset["manifest"])
    for split, path, sh in _shards(built_dataset, min_records=1):
        records = [r["_raw"] for r in by_shard[(split, sh["path"])]]
        with open(layout.index_name(path)) as f:
            entries = [tuple(map(int, line.split())) for line in f]
        assert len(entries) == len(records) == sh["num_examples"]
        with open(path, "rb") as f:
            for k in reversed(range(len(entries))):  # any order: true random access
                offset, length = entries[k]
                f.seek(offset)
                frame = f.read(length)
                assert len(frame) == length
                record, frame_len = frames.read_frame(io.BytesIO(frame), offset)
                assert frame_len == length and record == records[k]
                ex = tf.train.Example.FromString(record).features.feature
                encoded = ex[schema.ENCODED].bytes_list.value[0]
                assert hashlib.sha256(encoded).hexdigest().encode() == \
                    ex[schema.SHA256].bytes_list.value[0]
        assert entries[-1][0] + entries[-1][1] == os.path.getsize(path)
        total += len(records)
    assert total == built_dataset["manifest"]["accounting"]["written"]
