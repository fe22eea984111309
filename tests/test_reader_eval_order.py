"""Evaluation reads manifest order: ranges of consecutive records read in parallel by byte
offset (readers/records.py), yielded whole and in turn. Every record's label is its number in
manifest order, so the labels that come out are the order itself."""

import json
import pathlib

import numpy as np
import pytest
import tensorflow as tf

import readers
from dataset_format import examples, frames, layout, schema
from readers import hosts as hosts_lib
from readers import records as records_lib
from tests.helpers import image_bytes

VERSION = "20261201T000000Z"
COUNTS = (300, 17, 290)  # files longer and shorter than a range, one not a multiple of it
TOTAL = sum(COUNTS)
JPEG = image_bytes((120, 60, 30), (8, 8))


def _write(root, index=True, bad=()):
    """ROOT/versions/VERSION: one split, "validation", record r's label r; `.index` files
    beside the shards when `index`; the records numbered in `bad` hold bytes that are not a
    JPEG (their frames are sound)."""
    vdir = pathlib.Path(layout.version_dir(str(root), VERSION))
    vdir.mkdir(parents=True)
    shards, rid = [], 0
    for s, count in enumerate(COUNTS):
        name = layout.shard_name("order", "validation", s, len(COUNTS))
        entries, data = [], b""
        for _ in range(count):
            frame = frames.tfrecord_frame(examples.serialize_example(
                {schema.ENCODED: b"\xff\xd8 not a jpeg" if rid in bad else JPEG,
                 schema.LABEL: rid,
                 schema.FILENAME: f"r{rid}.jpg".encode()}))
            entries.append((len(data), len(frame)))
            data += frame
            rid += 1
        (vdir / name).write_bytes(data)
        if index:
            (vdir / layout.index_name(name)).write_bytes(frames.index_bytes(entries))
        shards.append({"path": name, "num_examples": count, "num_bytes": len(data)})
    manifest = {"format_version": layout.FORMAT_VERSION, "name": "order", "version": VERSION,
                "labels": [f"c{i}" for i in range(TOTAL)], "label_offset": 0,
                "features": dict(schema.FEATURES),
                "splits": {"validation": {"num_examples": TOTAL, "shards": shards,
                                          "num_bytes": sum(s["num_bytes"] for s in shards)}}}
    (vdir / layout.MANIFEST).write_text(json.dumps(manifest))
    (pathlib.Path(root) / layout.LATEST).write_text(json.dumps(layout.latest_record(VERSION)))
    return vdir


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval_order")
    _write(root)
    return root


def _labels(root, **kwargs):
    kwargs.setdefault("batch_size", 128)
    ds = readers.make_dataset(root, "validation", image_size=8, training=False, **kwargs)
    return np.concatenate([np.reshape(labels, [-1]) for _, labels in ds]).tolist()


def test_evaluation_reads_ranges_by_offset_in_manifest_order(root):
    info = readers.info(root)
    plan = hosts_lib.plan(info.split("validation"), hosts_lib.detect(None), False)
    pieces, offsets = records_lib.read_pieces(plan, False, False, False)
    assert offsets is not None  # the .index files were found: ranges, read by offset
    assert [p.count for p in pieces] == [128, 128, 44, 17, 128, 128, 34]
    assert _labels(root) == list(range(TOTAL))
    assert _labels(root, cycle_length=3, batch_size=None) == list(range(TOTAL))


@pytest.mark.parametrize("hosts", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_each_host_reads_its_range_in_order(root, hosts):
    """Host ranges start inside files (300 / 2 is record 303 of 607, in the third file)."""
    got = []
    for h in range(hosts):
        ctx = tf.distribute.InputContext(hosts, h, hosts)
        got.append(_labels(root, input_context=ctx, version=VERSION, batch_size=64))
        assert got[-1] == list(range(h * TOTAL // hosts, (h + 1) * TOTAL // hosts))
    assert sum(got, []) == list(range(TOTAL))


def test_without_index_files_the_order_is_the_same(tmp_path):
    _write(tmp_path, index=False)
    assert _labels(tmp_path) == list(range(TOTAL))


def test_a_bad_frame_names_its_file_and_range(root, tmp_path):
    copy = tmp_path / "copy"
    vdir = _write(copy)
    shard = vdir / layout.shard_name("order", "validation", 2, len(COUNTS))
    entries = frames.parse_index((vdir / layout.index_name(shard.name)).read_text())
    data = bytearray(shard.read_bytes())
    data[entries[200][0] + 100] ^= 0xFF  # record 200 of the third file: its data CRC fails
    shard.write_bytes(bytes(data))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"{shard.name}: could not read all of records 128..255"):
        _labels(copy)


@pytest.mark.slow  # ~2 s
def test_a_file_removed_after_make_dataset_is_named(tmp_path):
    vdir = _write(tmp_path)
    ds = readers.make_dataset(tmp_path, "validation", batch_size=128, image_size=8,
                              training=False)
    gone = vdir / layout.shard_name("order", "validation", 1, len(COUNTS))
    gone.unlink()
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"{gone.name}: shard file missing, unreadable"):
        for _ in ds:
            pass


# Evaluation's check once a batch (readers/checked.py `decoded_batches`): a record that does
# not decode shifts every number after it; a short last batch is one that lost a record.
@pytest.mark.parametrize("bad, batch, drop", [
    ((200,), 128, False),          # inside a batch (the first file's record 200)
    ((255,), 128, False),          # the last of a batch: the next batch starts one late
    ((TOTAL - 1,), 128, False),    # the very last record: the last batch comes out short
    ((TOTAL - 1,), 64, True),      # ... in the remainder drop_remainder then drops
    ((5, 400), 64, True),          # two: the first is named
])
def test_a_record_that_does_not_decode_is_named_once_a_batch(tmp_path, bad, batch, drop):
    _write(tmp_path, bad=bad)
    ds = readers.make_dataset(tmp_path, "validation", batch_size=batch, image_size=8,
                              training=False, drop_remainder=drop)
    with pytest.raises(tf.errors.InvalidArgumentError) as e:
        for _ in ds:
            pass
    named = [r for r in bad if f"(key r{r}.jpg) is not a decodable image record" in
             e.value.message]
    assert named and e.value.message.count("is not a decodable") == len(named), e.value.message
    file = 0 if named[0] < COUNTS[0] else 1 if named[0] < COUNTS[0] + COUNTS[1] else 2
    first = sum(COUNTS[:file])
    assert f"order-validation.tfrecord-0000{file}-of-00003: record {named[0] - first} " in (
        e.value.message)
