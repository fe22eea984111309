"""Unit tests for beam_pipeline.job.records and dataset_format.examples (Example + TFRecord
framing) and beam_pipeline.launcher.plan."""

import collections
import hashlib
import io

import pytest
import tensorflow as tf
from PIL import Image

from beam_pipeline.launcher import plan, rules
from beam_pipeline.job import records
from beam_pipeline.job.images import Encoded
from beam_pipeline.refs import SPLIT_NAMES, ImageRef
from dataset_format import examples, frames, schema


def _encoded(colour=(10, 200, 30), size=(20, 12)):
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, "JPEG", quality=90)
    return Encoded(buf.getvalue(), size[1], size[0], True)


# --- records ----------------------------------------------------------------------------------

def test_make_example_round_trip_has_every_schema_key():
    enc = _encoded()
    record = records.make_example(enc, 7, "tulip", "tulip/ü 1.jpg")
    parsed = tf.io.parse_single_example(record, schema.feature_spec())
    assert set(parsed) == set(schema.FEATURES)
    got = {k: v.numpy() for k, v in parsed.items()}
    assert got[schema.ENCODED] == enc.data
    assert got[schema.FORMAT] == b"JPEG"
    assert got[schema.HEIGHT] == 12 and got[schema.WIDTH] == 20
    assert got[schema.CHANNELS] == 3
    assert got[schema.COLORSPACE] == b"RGB"
    assert got[schema.LABEL] == 7
    assert got[schema.TEXT] == b"tulip"
    assert got[schema.FILENAME].decode() == "tulip/ü 1.jpg"
    assert got[schema.SHA256] == hashlib.sha256(enc.data).hexdigest().encode()
    image = tf.io.decode_jpeg(got[schema.ENCODED])
    assert tuple(image.shape) == (12, 20, 3)
    # Nothing beyond the schema: a reader's spec covers the whole record.
    example = tf.train.Example.FromString(record)
    assert set(example.features.feature) == set(schema.FEATURES)


def test_schema_dtypes_match_the_stored_features():
    example = tf.train.Example.FromString(records.make_example(_encoded(), 0, "a", "a/x.jpg"))
    for key, dtype in schema.FEATURES.items():
        kind = example.features.feature[key].WhichOneof("kind")
        assert kind == {"string": "bytes_list", "int64": "int64_list"}[dtype], key


def test_make_example_deterministic():
    enc = _encoded()
    first = records.make_example(enc, 1, "rose", "rose/1.jpg")
    assert all(records.make_example(enc, 1, "rose", "rose/1.jpg") == first for _ in range(5))
    assert records.make_example(enc, 2, "rose", "rose/1.jpg") != first


def test_tfrecord_frames_read_by_tf_data(tmp_path):
    payloads = [records.make_example(_encoded((i * 40, 0, 0)), i, f"c{i}", f"c{i}/x.jpg")
                for i in range(3)] + [b"", b"x" * 70_000]
    path = tmp_path / "frames.tfrecord"
    path.write_bytes(b"".join(frames.tfrecord_frame(p) for p in payloads))
    # A corrupt CRC would make TFRecordDataset raise DataLossError.
    read = [r.numpy() for r in tf.data.TFRecordDataset(str(path))]
    assert read == payloads


def test_tfrecord_frame_matches_tf_writer(tmp_path):
    payload = records.make_example(_encoded(), 3, "x", "x/y.jpg")
    path = str(tmp_path / "tf.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        w.write(payload)
    with open(path, "rb") as f:
        assert frames.tfrecord_frame(payload) == f.read()


# --- splits -----------------------------------------------------------------------------------

def test_parse_splits_ok():
    assert rules.parse_splits("train=0.8,validation=0.1,test=0.1") == (
        ("train", 0.8), ("validation", 0.1), ("test", 0.1))
    assert rules.parse_splits(" train = 1 ") == (("train", 1.0),)


@pytest.mark.parametrize("text, named", [
    ("train=0.8,validation=abc", "validation=abc"),
    ("train", "train"),
    ("train=0.5,test=0.4", "0.9"),
    ("train=0.5,train=0.5", "train=0.5,train=0.5"),
    ("train=1.5", "train=1.5"),
    ("train=0,test=1", "train=0"),
    ("tr ain=1", "tr ain=1"),
    ("", "''"),
])
def test_parse_splits_errors_name_the_bad_value(text, named):
    with pytest.raises(ValueError) as info:
        rules.parse_splits(text)
    assert named in str(info.value) and "--splits" in str(info.value)


def test_assign_split_stable_and_proportional():
    splits = rules.parse_splits("train=0.7,validation=0.2,test=0.1")
    keys = [f"/data/class{i % 5}/img_{i:05d}.jpg" for i in range(5000)]
    first = [rules.assign_split(k, splits) for k in keys]
    assert first == [rules.assign_split(k, splits) for k in keys]
    counts = collections.Counter(first)
    assert set(counts) == {"train", "validation", "test"}
    for name, fraction in splits:
        assert abs(counts[name] / len(keys) - fraction) < 0.03, counts


# --- pinned: what a release must never change ------------------------------------------------
# Computed once and written down. If one of these fails, images would move between splits or
# shards across versions of the same dataset: a breaking change, not a test to update.
# Keys are paths relative to an input root, as the listing makes them.

PINNED_SPLITS = rules.parse_splits("train=0.8,validation=0.1,test=0.1")

# key -> (its split by hash, its shard in that split for num_shards 1, 3, 16)
PINNED = {
    "cat/000.jpg": ("train", (0, 2, 13)),
    "cat/001.jpg": ("train", (0, 1, 8)),
    "cat/002.jpg": ("train", (0, 1, 9)),
    "dog/000.jpg": ("train", (0, 2, 10)),
    "dog/001.jpg": ("validation", (0, 0, 3)),
    "dog/x.png": ("train", (0, 0, 2)),
    "train/dog/x.png": ("test", (0, 1, 8)),
    "validation/cat/y.jpg": ("test", (0, 2, 15)),
    "fox/ü 1.jpg": ("train", (0, 1, 9)),
    "owl/a/b/c.jpeg": ("test", (0, 1, 9)),
    "input1/cat/000.jpg": ("train", (0, 1, 5)),
    "0.gif": ("train", (0, 0, 3)),
}


@pytest.mark.parametrize("key", PINNED)
def test_split_and_shard_of_pinned_keys(key):
    split, shards = PINNED[key]
    assert rules.assign_split(key, PINNED_SPLITS) == split
    assert tuple(rules.shard_of(split, key, n) for n in (1, 3, 16)) == shards


def test_unit_hash_pinned_values():
    assert rules.unit_hash("split", "cat/000.jpg") == 0.6917624722071029
    assert rules.unit_hash("shard", "train", "cat/000.jpg") == 0.8729854129553617
    assert rules.unit_hash("x") == 0.17750681999964502
    assert rules.shard_position("train", "cat/000.jpg") == 0.8729854129553617
    # the documented recipe: the first 8 bytes of sha256("split\0key"), big-endian, / 2**64
    digest = hashlib.sha256("split\0cat/000.jpg".encode()).digest()
    assert int.from_bytes(digest[:8], "big") / 2.0**64 == 0.6917624722071029


def test_shard_of_layout_splits_pinned():
    """A ROOT/<split>/<class>/ layout fixes the split; the shard still hashes (split, key)."""
    assert [rules.shard_of(s, "train/dog/x.png", 3) for s in SPLIT_NAMES] == [1, 2, 1]
    assert [rules.shard_of(s, "validation/cat/y.jpg", 3) for s in SPLIT_NAMES] == [0, 2, 2]


PINNED_NUM_SHARDS = {"train": 3, "validation": 1, "test": 2}
# (split, shard) -> its keys in record order (by shard hash, not by key); empty shards absent
PINNED_SHARDS = {
    ("test", 1): ["train/dog/x.png", "owl/a/b/c.jpeg", "validation/cat/y.jpg"],
    ("train", 0): ["dog/x.png", "0.gif"],
    ("train", 1): ["input1/cat/000.jpg", "cat/001.jpg", "fox/ü 1.jpg", "cat/002.jpg"],
    ("train", 2): ["dog/000.jpg", "cat/000.jpg"],
    ("validation", 0): ["dog/001.jpg"],
}


def test_shard_contents_and_order_pinned():
    """The launcher's streaming path: refs spilled sorted by shard_sort_key, cut into shards."""
    by_position = sorted(
        (rules.shard_sort_key(split, key),
         ImageRef(key=key, uri=f"/in/{key}", label="x", split=split).to_json())
        for key, (split, _) in PINNED.items())

    got = {(split, shard): [ImageRef.from_json(line).key for line in lines]
           # each run is consumed before the next shard
           for split, shard, lines in plan.iter_shards(by_position, PINNED_NUM_SHARDS)}
    assert got == PINNED_SHARDS and list(got) == sorted(got)


def test_label_ids_pinned():
    assert rules.label_ids({"owl", "cat", "dog", "fox", "Zebra", "ant"}) == [
        "Zebra", "ant", "cat", "dog", "fox", "owl"]  # code-point order: capitals first
    assert rules.label_ids({"owl", "cat", "ant"}, previous=["dog", "cat"]) == [
        "dog", "cat", "ant", "owl"]
    assert rules.label_ids({"owl"}, previous=["dog"], label_file=["b", "a"]) == ["b", "a"]


def test_unit_hash_range():
    values = [rules.unit_hash("x", str(i)) for i in range(1000)]
    assert all(0 <= v < 1 for v in values) and len(set(values)) == 1000


# --- shards -----------------------------------------------------------------------------------

@pytest.mark.parametrize("num_shards", [1, 2, 7, 16])
def test_shard_of_in_range_and_spread(num_shards):
    shards = [rules.shard_of("train", f"k{i}", num_shards) for i in range(2000)]
    assert set(shards) == set(range(num_shards))
    assert shards == [rules.shard_of("train", f"k{i}", num_shards) for i in range(2000)]


def test_shard_depends_on_split():
    a = [rules.shard_position("train", f"k{i}") for i in range(50)]
    b = [rules.shard_position("test", f"k{i}") for i in range(50)]
    assert a != b


def test_auto_num_shards():
    assert rules.auto_num_shards(0, 128) == 1
    assert rules.auto_num_shards(128 * 2**20, 128) == 1
    assert rules.auto_num_shards(128 * 2**20 + 1, 128) == 2
    assert rules.auto_num_shards(3 * 2**20, 1) == 3


@pytest.mark.parametrize("cpus, direct_workers", [(1, 0), (2, 0), (64, 0), (8, 3), (2, 16)])
def test_auto_shard_count_is_the_same_on_any_machine(monkeypatch, cpus, direct_workers):
    """Only data and options decide the count: not the launcher's cores, not the local runner's
    worker count (that parallelism comes from the runner), so the bytes match everywhere."""
    from apache_beam.options.pipeline_options import DirectOptions

    from beam_pipeline.launcher import options

    monkeypatch.setattr("os.cpu_count", lambda: cpus)
    pipeline_options, build = options.parse(["--input=in", "--output=out", "--target_shard_mb=1",
                                             f"--direct_num_workers={direct_workers}"])
    assert pipeline_options.view_as(DirectOptions).direct_num_workers == direct_workers
    per_split = {"train": (9000, 5 * 2**20 + 1), "validation": (3, 2**20), "test": (2, 9 * 2**20)}
    assert rules.shard_counts(per_split, build.num_shards, build.target_shard_mb) == {"train": 6, "validation": 1, "test": 2}


# --- labels -----------------------------------------------------------------------------------

def test_label_ids_sorted_by_default():
    assert rules.label_ids({"tulip", "daisy", "rose"}) == ["daisy", "rose", "tulip"]


def test_label_ids_keep_previous_and_append_new_sorted():
    previous = ["rose", "daisy"]  # earlier version's order, not sorted
    got = rules.label_ids({"daisy", "zinnia", "aster", "rose"}, previous)
    assert got == ["rose", "daisy", "aster", "zinnia"]
    # A class that vanished keeps its id.
    assert rules.label_ids({"daisy"}, previous) == ["rose", "daisy"]


def test_label_file_order_wins():
    got = rules.label_ids({"daisy", "rose"}, previous=["rose", "daisy"],
                         label_file=["tulip", "daisy", "rose"])
    assert got == ["tulip", "daisy", "rose"]


def test_image_ref_json_round_trip():
    from beam_pipeline.refs import StoredFrame

    ref = ImageRef("x/ü.jpg", "gs://b/x/ü.jpg", "x", "train", 12, "gen:3")
    assert ImageRef.from_json(ref.to_json()) == ref
    again = ImageRef("y.jpg", "/in/y.jpg", "y", None, 5, "1:2", "ab" * 32,
                     StoredFrame("/root/versions/V/s-train.tfrecord-00000-of-00001", 40, 99))
    assert ImageRef.from_json(again.to_json()) == again


def test_listing_line_positions_are_image_ref_fields():
    """refs.LINE_* name the positions of ImageRef.to_json's list, field for field."""
    import dataclasses
    import json

    from beam_pipeline import refs

    ref = ImageRef("k", "u", "l", "s", 7, "st", "sha", refs.StoredFrame("p", 1, 2), "md5",
                   '{"caption": "c"}')
    fields = json.loads(ref.to_json())
    names = [f.name for f in dataclasses.fields(ImageRef)]
    assert len(fields) == len(names) == 10
    # without declared fields the line is the nine fields it was before they existed
    assert json.loads(dataclasses.replace(ref, fields=None).to_json()) == fields[:9]
    assert refs.Listed._make(fields[:9]).fields is None
    assert ImageRef.from_json(json.dumps(fields[:9])).fields is None
    for name in names:
        position = getattr(refs, "LINE_" + ("SOURCE" if name == "source" else name.upper()))
        want = getattr(ref, name)
        assert fields[position] == (["p", 1, 2, None, None, None] if name == "source" else want)


def test_serialize_example_equals_tensorflow_deterministic_serialization():
    """Our encoder must give exactly TF's bytes (the writer does not import TensorFlow)."""
    import tensorflow as tf

    cases = [records.make_example(_encoded(), 7, "tulip", "tulip/ü 1.jpg"),
             records.make_example(_encoded((1, 2, 3)), 0, "", ""),
             records.make_example(_encoded(), 2**40, "x" * 300, "y/" * 200),
             # an image long enough to stay a piece of its own (records.example_parts)
             records.make_example(Encoded(bytes(range(256)) * 40, 5, 6, True), 3, "c", "c/x")]
    for ours in cases:
        example = tf.train.Example.FromString(ours)
        assert example.SerializeToString(deterministic=True) == ours
    negative = examples.serialize_example({"a": -5, "b": b"\x00\xff"})
    parsed = tf.train.Example.FromString(negative)
    assert parsed.features.feature["a"].int64_list.value == [-5]
    assert parsed.SerializeToString(deterministic=True) == negative
    assert examples.parse_example(negative) == {"a": -5, "b": b"\x00\xff"}  # the way back


def test_the_rules_are_a_leaf_and_prepare_imports_at_the_top():
    """rules.py imports nothing of the package (every stage may use it, it uses none);
    prepare.py, the orchestration, shows its dependencies at the top: no import inside a
    function."""
    import ast
    import inspect

    from beam_pipeline.launcher import prepare

    tree = ast.parse(inspect.getsource(rules))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported == {"hashlib", "math"}
    tree = ast.parse(inspect.getsource(prepare))
    local = [f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
             for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert local == []
