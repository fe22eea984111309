"""Tests for readers/: the tf.data reader over a built dataset.

Multi-worker runs: tests/test_reader_multihost.py; damaged files: tests/test_reader_faults.py.
"""

import collections
import datetime
import hashlib
import json
import logging
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import readers
from dataset_format import layout, schema
from tests.helpers import REPO, assert_same_arrays, build, image_bytes, same_arrays

LABELS = ["daisy", "rose", "tulip"]
SIZE = 16  # output image side; inputs are 40x30, so crops still have pixels to choose from


# --- a tiny writer, so these tests don't need Beam --------------------------------------------
# Each image is one solid colour that encodes its record: red = 6 * id (ids < 42), green = 100 *
# label. Solid colours survive JPEG, crop and resize, so any output image tells which record it
# came from and whether its label is the right one.

def _jpeg(rid, label):
    return image_bytes((6 * rid, 100 * label, 50), (40, 30))


def _example(rid, label):
    enc = _jpeg(rid, label)
    b = lambda v: tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))  # noqa: E731
    i = lambda v: tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))  # noqa: E731
    feats = {schema.ENCODED: b(enc), schema.FORMAT: b(b"JPEG"), schema.HEIGHT: i(30),
             schema.WIDTH: i(40), schema.CHANNELS: i(3), schema.COLORSPACE: b(b"RGB"),
             schema.LABEL: i(label), schema.TEXT: b(LABELS[label].encode()),
             schema.FILENAME: b(f"{LABELS[label]}/{rid}.jpg".encode()),
             schema.SHA256: b(hashlib.sha256(enc).hexdigest().encode())}
    return tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString(
        deterministic=True)


VERSION = "20261129T220102Z"


def write_dataset(root, version=VERSION, splits=(("train", 30, 4),
                                                           ("validation", 9, 2)),
                  name="flowers", publish=True):
    """Write ROOT/versions/VERSION/{shards, manifest.json} and (if publish) ROOT/LATEST."""
    vdir = pathlib.Path(layout.version_dir(str(root), version))
    vdir.mkdir(parents=True)
    manifest_splits, written = {}, 0
    for split, n, num_shards in splits:
        shards = []
        for s in range(num_shards):
            fname = layout.shard_name(name, split, s, num_shards)
            rids = range(s, n, num_shards)
            with tf.io.TFRecordWriter(str(vdir / fname)) as w:
                for rid in rids:
                    w.write(_example(rid, rid % len(LABELS)))
            data = (vdir / fname).read_bytes()
            shards.append({"path": fname, "num_examples": len(rids), "num_bytes": len(data),
                           "sha256": hashlib.sha256(data).hexdigest()})
        counts = collections.Counter(LABELS[r % len(LABELS)] for r in range(n))
        manifest_splits[split] = {"num_examples": n,
                                  "num_bytes": sum(s["num_bytes"] for s in shards),
                                  "label_counts": dict(counts), "shards": shards}
        written += n
    manifest = {
        "format_version": layout.FORMAT_VERSION, "name": name, "version": version,
        "created_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "generator": {"package": "tests", "version": "0", "tensorflow": tf.__version__},
        "input_fingerprint": "sha256:0", "config": {}, "labels": LABELS, "label_offset": 0,
        "features": dict(schema.FEATURES), "splits": manifest_splits,
        "accounting": {"listed": written, "duplicates": 0, "failed": 0, "written": written},
        "errors": {"path": layout.ERRORS, "count": 0, "by_reason": {}}}
    (vdir / layout.ERRORS).write_text("")
    (vdir / layout.MANIFEST).write_text(json.dumps(manifest, indent=1))
    if publish:
        (pathlib.Path(root) / layout.LATEST).write_text(json.dumps(layout.latest_record(version)))
    return vdir


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds")
    write_dataset(root)
    return root


@pytest.fixture(scope="module")
def built_root(tmp_path_factory):
    """`root`'s records written by the real pipeline: ROOT/<split>/<class>/NN.jpg inputs (the
    layout fixes the splits) whose colours encode record id and label, as `_jpeg` does."""
    src = tmp_path_factory.mktemp("reader_inputs")
    for split, n in (("train", 30), ("validation", 9)):
        for rid in range(n):
            path = src / split / LABELS[rid % 3] / f"{rid:02d}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(_jpeg(rid, rid % 3))
    root = tmp_path_factory.mktemp("reader_built") / "ds"
    return build(src, root, "--name", "flowers", "--num_shards", "2", "--no_transform")["root"]


@pytest.fixture(params=["hand_made", pytest.param("built", marks=pytest.mark.slow),
                        pytest.param("sample_build", marks=pytest.mark.slow)])
def pipeline_root(request):
    """(root, has_ids): a dataset to read, and whether its colours encode record ids and labels.

    hand_made: `write_dataset` (no Beam); built: the same records through the real pipeline
    (`built_root`), so the per-record check covers writer and reader together; sample_build:
    the shared build of sample_data's image variants (`built_dataset`), counts only.
    """
    if request.param == "hand_made":
        return request.getfixturevalue("root"), True
    if request.param == "built":
        return request.getfixturevalue("built_root"), True
    return request.getfixturevalue("built_dataset")["root"], False


def _ids_labels(ds):
    """(record ids from the red channel, labels) of a uint8 or float dataset, in order."""
    ids, labels = [], []
    for images, lab in ds:
        images = images.numpy().astype(np.float64)
        if images.max() <= 1.0:
            images *= 255
        ids += list(np.round(images[..., 0].mean(axis=(1, 2)) / 6).astype(int))
        labels += list(lab.numpy())
    return ids, labels


class Ctx:
    """Stands in for tf.distribute.InputContext (all the reader uses)."""

    def __init__(self, n, i):
        self.num_input_pipelines, self.input_pipeline_id = n, i


# --- tests --------------------------------------------------------------------------------------

def test_import_needs_no_beam():
    # A fresh interpreter where importing apache_beam fails. TensorFlow is a stand-in there:
    # its own imports are not under test and cost ~8 s of CPU on these machines.
    code = ("import sys; sys.modules['apache_beam'] = None; import readers; "
            "assert 'tensorflow' not in sys.modules; "
            "from unittest import mock; sys.modules['tensorflow'] = mock.MagicMock(); "
            "from readers import info, make_dataset; print(callable(info), callable(make_dataset))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "True True"


def test_info(root):
    ds = readers.info(str(root))
    assert ds.labels == tuple(LABELS) and ds.num_classes == 3 and ds.name == "flowers"
    assert ds.version == "20261129T220102Z"
    assert ds.version_dir == layout.version_dir(str(root), ds.version)
    assert {k: v.num_examples for k, v in ds.splits.items()} == {"train": 30, "validation": 9}
    files = ds.splits["train"].files
    assert [os.path.basename(f) for f in files] == [
        layout.shard_name("flowers", "train", s, 4) for s in range(4)]
    assert all(os.path.exists(f) for f in files)
    with pytest.raises(KeyError, match="test"):
        ds.split("test")


@pytest.fixture(scope="module")
def shared_read():
    """read(path, split, **make_dataset arguments) -> (dataset, its first pass as a list),
    made once per module for each distinct set of arguments: the tests that only read a
    dataset share it (building and reading one costs ~0.3 s of CPU)."""
    made = {}

    def read(path, split, **kwargs):
        key = (str(path), split, tuple(sorted(kwargs.items())))
        if key not in made:
            ds = readers.make_dataset(str(path), split, **kwargs)
            made[key] = ds, list(ds)
        return made[key]

    return read


EVAL_4 = dict(batch_size=4, image_size=SIZE, training=False, seed=1, drop_remainder=False)


@pytest.mark.parametrize("training", [False, True])
def test_labels_and_shapes(pipeline_root, training, shared_read):
    path, has_ids = pipeline_root
    meta = readers.info(str(path))
    split = "train" if training else sorted(meta.splits)[-1]
    ds, batches = shared_read(path, split, **dict(EVAL_4, training=training))
    assert ds.element_spec[0].shape.as_list() == [None, SIZE, SIZE, 3]
    assert ds.element_spec[0].dtype == tf.float32 and ds.element_spec[1].dtype == tf.int32
    n = meta.splits[split].num_examples  # the last batch kept: ceil(n / 4) batches
    assert ds.cardinality().numpy() == len(batches) == -(-n // 4)
    for images, _ in batches:
        assert 0.0 <= images.numpy().min() and images.numpy().max() <= 1.0
    seen = collections.Counter(meta.labels[i] for _, b in batches for i in b.numpy())
    assert seen == collections.Counter(meta.splits[split].label_counts)
    if has_ids:  # each image's colour says which record and label it is
        ids, labels = _ids_labels(batches)
        assert sorted(ids) == list(range(meta.splits[split].num_examples))
        assert labels == [i % 3 for i in ids]


@pytest.fixture(scope="module")
def validation_uint8(root):
    """The 9 validation records as one uint8 batch, labels offset by 1: read once, shared by
    the tests that only look at it."""
    ds = readers.make_dataset(str(root), "validation", batch_size=9, image_size=SIZE,
                              dtype="uint8", label_offset=1)
    return next(iter(ds))


def test_uint8_and_label_offset(validation_uint8):
    images, labels = validation_uint8
    assert images.dtype == tf.uint8 and images.shape == (9, SIZE, SIZE, 3)
    ids = np.round(images.numpy()[..., 0].mean(axis=(1, 2)) / 6).astype(int)
    assert list(labels.numpy()) == [i % 3 + 1 for i in ids]


def test_eval_is_deterministic(root, shared_read):
    """The same dataset read twice, and a fresh one with the defaults, give the same
    batches (the first read is test_labels_and_shapes's, shared)."""
    ds, batches = shared_read(root, "validation", **EVAL_4)
    first = [x.numpy() for b in batches for x in b]
    again = [x.numpy() for b in ds for x in b]
    fresh = [x.numpy() for b in readers.make_dataset(str(root), "validation", batch_size=4,
                                                      image_size=SIZE) for x in b]
    assert_same_arrays(first, again)  # same length, same arrays, same order
    assert_same_arrays(first, fresh)
    assert sum(len(labels) for labels in first[1::2]) == 9  # every validation record
    assert ds.cardinality().numpy() == len(first) // 2 == 3


def test_training_with_seed_is_reproducible(root):
    def epochs(seed, n=2):
        ds = readers.make_dataset(str(root), batch_size=8, image_size=SIZE, seed=seed,
                                  shuffle_buffer=16)
        assert ds.cardinality().numpy() == 3  # 30 records: training drops the remainder
        return [[x.numpy() for b in ds for x in b] for _ in range(n)]  # n iterations

    a, b, c = epochs(7), epochs(7), epochs(8, n=1)
    assert len(a) == len(b) == 2
    for ea, eb in zip(a, b):
        assert_same_arrays(ea, eb)
    assert len(a[0]) == len(a[1]) == len(c[0]) == 6  # 3 batches of 8: (images, labels)
    assert not same_arrays(a[0], a[1])  # epochs differ
    assert not same_arrays(a[0], c[0])  # seeds differ


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("pipelines,split", [
    pytest.param(2, "train", marks=pytest.mark.slow),
    pytest.param(3, "validation", marks=pytest.mark.slow),
    pytest.param(4, "train", marks=pytest.mark.slow)])
def test_host_sharding_covers_each_record_once(root, training, pipelines, split):
    # train: 30 records in 4 files; validation: 9 in 2 (fewer files than pipelines). The
    # plan's arithmetic: tests/test_hosts_plan.py; fast, 4 hosts training: the test below
    n = readers.info(str(root)).splits[split].num_examples
    all_ids, lengths = [], []
    for i in range(pipelines):
        ds = readers.make_dataset(str(root), split, batch_size=4, image_size=SIZE,
                                  training=training, seed=3 + i, drop_remainder=False,
                                  input_context=Ctx(pipelines, i), version=VERSION)
        ids, _ = _ids_labels(ds)
        # evaluation: hosts' batch counts may differ by one, and Keras refuses unequal known
        # lengths across workers, so the length is unknown; training: equal and known
        assert ds.cardinality().numpy() == (-(-len(ids) // 4) if training
                                            else tf.data.UNKNOWN_CARDINALITY)
        all_ids += ids
        lengths.append(len(ids))
    assert len(all_ids) == len(set(all_ids))  # no record twice, whatever each host's seed
    if training:  # the common minimum: every host the same number of records
        assert lengths == [n // pipelines] * pipelines
    else:  # every record exactly once; ranges at most one record apart
        assert sorted(all_ids) == list(range(n)) and max(lengths) - min(lengths) <= 1


@pytest.mark.parametrize("hosts,steps", [
    (2, 5),  # 30 records: ranges of 15; 5 batches of 3 each
    # ranges of 7, 8, 7, 8: training reads 7 each, 2 batches; slow: 4 pipelines (~1 s
    # each), the plan's arithmetic for every host count is tests/test_hosts_plan.py's
    pytest.param(4, 2, marks=pytest.mark.slow)])
def test_training_hosts_run_equal_steps_with_full_batches(root, hosts, steps):
    """Each host reads only its plan's records (files cut by a range boundary included),
    no record twice across hosts, in equal full batches."""
    cards, seen = [], []
    for i in range(hosts):
        ds = readers.make_dataset(str(root), batch_size=3, image_size=SIZE, seed=1,
                                  input_context=Ctx(hosts, i), version=VERSION)
        batches = list(ds)
        assert [int(b[1].shape[0]) for b in batches] == [3] * steps
        assert ds.element_spec[0].shape[0] == 3
        ids, labels = _ids_labels(batches)
        # shard s holds records s, s + 4, ... (write_dataset): a piece's ids follow from it
        planned = {layout.parse_shard_name(p.path)[2] + 4 * (p.start + k)
                   for p in ds.plan.pieces for k in range(p.count)}
        assert set(ids) <= planned and len(planned) == ds.plan.records
        assert labels == [r % 3 for r in ids]
        cards.append(int(ds.cardinality()))
        seen += ids
    assert cards == [steps] * hosts
    assert len(seen) == len(set(seen)) == 3 * steps * hosts


def test_several_hosts_need_a_pinned_version(root, monkeypatch, caplog):
    with pytest.raises(ValueError, match="pin one version"):
        readers.make_dataset(str(root), input_context=Ctx(2, 0))
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["a:1", "b:1"]},
                                                "task": {"type": "worker", "index": 1}}))
    with pytest.raises(ValueError, match=f"version='{VERSION}'"):
        readers.make_dataset(str(root))
    caplog.set_level(logging.INFO, logger="readers")
    ds = readers.make_dataset(str(root), version=VERSION, batch_size=4, image_size=SIZE)
    assert ds.dataset_info.version == VERSION and ds.plan.hosts.index == 1
    assert ds.cardinality().numpy() == tf.data.UNKNOWN_CARDINALITY  # tf.distribute's steps
    assert any(VERSION in r.getMessage() and "host 1 of 2 (TF_CONFIG)" in r.getMessage()
               for r in caplog.records)


def test_version_pins_an_older_one(tmp_path):
    write_dataset(tmp_path, "20260101T000000Z", (("train", 5, 1),))
    write_dataset(tmp_path, "20260202T000000Z", (("train", 7, 1),))
    meta = readers.info(str(tmp_path), version="20260101T000000Z")
    assert meta.version == "20260101T000000Z" and not meta.followed_latest
    assert readers.info(str(tmp_path)).followed_latest
    ds = readers.make_dataset(str(tmp_path), version="20260101T000000Z", batch_size=5,
                              image_size=SIZE)
    assert ds.dataset_info.version == "20260101T000000Z"
    assert sum(int(b[1].shape[0]) for b in ds) == 5
    with pytest.raises(FileNotFoundError, match="version '20250101T000000Z' does not exist"):
        readers.info(str(tmp_path), version="20250101T000000Z")


def test_global_seed_makes_training_reproducible(root):
    def epoch():
        tf.keras.utils.set_random_seed(11)
        ds = readers.make_dataset(str(root), batch_size=8, image_size=SIZE, shuffle_buffer=16)
        return [x.numpy() for b in ds for x in b]

    assert_same_arrays(epoch(), epoch())


def test_cache_reshuffles_file_order_every_epoch(root):
    ds = readers.make_dataset(str(root), batch_size=30, image_size=SIZE, seed=2, cache=True,
                              shuffle_buffer=1, cycle_length=1)
    epochs = [_ids_labels(ds)[0] for _ in range(3)]
    assert all(sorted(e) == list(range(30)) for e in epochs)
    assert len({tuple(e) for e in epochs}) > 1  # not frozen at the first epoch's order


def test_file_cache_reads_every_record_once_an_epoch_from_its_files(root, tmp_path):
    """The first epoch writes the cache files, the second reads them (in reshuffled chunks
    of CACHE_CHUNK records), each record once."""
    from readers import records

    prefix = str(tmp_path / "cache")
    ds = readers.make_dataset(str(root), batch_size=None, image_size=SIZE, seed=2,
                              cache=prefix)
    first = _ids_labels(ds.batch(30))[0]
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written and all(n.startswith("cache") for n in written), written
    second = _ids_labels(ds.batch(30))[0]
    assert sorted(first) == sorted(second) == list(range(30))
    assert records.CACHE_CHUNK < 30  # several chunks, so their order can change


@pytest.mark.parametrize("value_range,expected", [
    ((0, 255), 1.0), pytest.param((-1, 1), 2 / 255, marks=pytest.mark.slow)])
def test_value_range(root, validation_uint8, value_range, expected):
    ds = readers.make_dataset(str(root), "validation", batch_size=9, image_size=SIZE,
                              value_range=value_range)
    images, _ = next(iter(ds))
    plain, _ = validation_uint8
    want = plain.numpy().astype(np.float32) * expected + value_range[0]
    np.testing.assert_allclose(images.numpy(), want, atol=expected * 0.51)


def test_resize_after_cast_and_flip_after_resize_change_no_pixel():
    from readers import images

    crop = tf.random.stateless_uniform([37, 53, 3], [1, 2], maxval=256, dtype=tf.int32)
    crop = tf.cast(crop, tf.uint8)
    old = tf.image.resize(crop, [16, 16])
    new = tf.image.resize(tf.cast(crop, tf.float32), [16, 16])
    assert np.array_equal(old.numpy(), new.numpy())
    flipped_first = tf.image.resize(tf.image.flip_left_right(crop), [16, 16])
    np.testing.assert_allclose(flipped_first, tf.image.flip_left_right(new), atol=1e-4)
    assert images.Output(tf.float32, (0, 255)).identity


def _with_transform_statistics(root, mean, std):
    """A `--transform`-like manifest entry and statistics asset (no saved graph needed)."""
    vdir = pathlib.Path(readers.info(str(root)).version_dir)
    assets = vdir / "transform_fn" / "assets"
    assets.mkdir(parents=True)
    (assets / "pixel_statistics.json").write_text(json.dumps({"mean": mean, "std": std}))
    manifest = json.loads((vdir / layout.MANIFEST).read_text())
    manifest["transform"] = {"transform_fn": "transform_fn", "image_size": 99,
                             "mean": mean, "std": std}
    (vdir / layout.MANIFEST).write_text(json.dumps(manifest))


def test_transform_normalizes_with_its_statistics(tmp_path):
    write_dataset(tmp_path)
    mean, std = [100.0, 50.0, 25.0], [60.0, 30.0, 10.0]
    _with_transform_statistics(tmp_path, mean, std)
    kw = dict(batch_size=9, image_size=(SIZE, SIZE + 2))
    images, labels = next(iter(readers.make_dataset(str(tmp_path), "validation",
                                                    transform=True, dtype="float16", **kw)))
    plain, plain_labels = next(iter(readers.make_dataset(str(tmp_path), "validation",
                                                         dtype="uint8", **kw)))
    assert images.shape == (9, SIZE, SIZE + 2, 3) and images.dtype == tf.float16
    assert labels.dtype == tf.int32 and labels.numpy().tolist() == plain_labels.numpy().tolist()
    want = (plain.numpy().astype(np.float64) - mean) / std
    np.testing.assert_allclose(images.numpy().astype(np.float64), want, atol=0.6 / 10)


@pytest.mark.slow  # two more pipelines; fast, seeded: test_training_with_seed_is_reproducible
def test_transform_training_is_seeded(tmp_path):
    """Training with transform=True: the reader's own random crops and flips, seeded."""
    write_dataset(tmp_path)
    _with_transform_statistics(tmp_path, [100.0, 50.0, 25.0], [60.0, 30.0, 10.0])
    kw = dict(batch_size=9, image_size=(SIZE, SIZE + 2))
    a = [x.numpy() for b in readers.make_dataset(str(tmp_path), transform=True, seed=1,
                                                 **kw) for x in b]
    b = [x.numpy() for b in readers.make_dataset(str(tmp_path), transform=True, seed=1,
                                                 **kw) for x in b]
    assert_same_arrays(a, b)


def test_host_sharding_real_input_context(root):
    ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1,
                                     num_replicas_in_sync=2)
    ds = readers.make_dataset(str(root), "train", batch_size=4, image_size=SIZE,
                              input_context=ctx, drop_remainder=False, version=VERSION)
    batches = [b[1].shape[0] for b in ds]
    assert sum(batches) == 15 and ds.cardinality().numpy() == len(batches) == 4


# Also asserted where a test builds that dataset anyway (one tf.data pipeline costs ~1 s):
# training drops the remainder (test_training_with_seed_is_reproducible), keeps it when told
# (test_labels_and_shapes), evaluation (test_eval_is_deterministic), one of two training
# hosts (test_host_sharding_real_input_context).
@pytest.mark.parametrize("kwargs,batches", [
    (dict(split="train", repeat=2), 7),
    # several hosts evaluating: unknown (their lengths may differ by a batch), 2 read
    (dict(split="validation", batch_size=2, input_context=Ctx(3, 0), version=VERSION), -2),
])
def test_cardinality(root, kwargs, batches):
    ds = readers.make_dataset(str(root), **dict(dict(batch_size=8, image_size=SIZE), **kwargs))
    assert ds.cardinality().numpy() == batches
    assert sum(1 for _ in ds) == (2 if batches == tf.data.UNKNOWN_CARDINALITY else batches)


def test_repeat_forever_is_infinite(root):
    ds = readers.make_dataset(str(root), batch_size=8, image_size=SIZE, repeat=True)
    assert ds.cardinality().numpy() == tf.data.INFINITE_CARDINALITY


def test_latest_resolution(tmp_path):
    v1 = write_dataset(tmp_path, "20260101T000000Z", (("train", 5, 1),))
    write_dataset(tmp_path, "20260202T000000Z", (("train", 7, 1),))
    write_dataset(tmp_path, "20260303T000000Z", (("train", 9, 1),), publish=False)  # unpublished
    assert readers.info(str(tmp_path)).version == "20260202T000000Z"
    count = lambda p: sum(b[1].shape[0] for b in readers.make_dataset(  # noqa: E731
        p, batch_size=4, image_size=SIZE, drop_remainder=False))
    assert count(str(tmp_path)) == 7
    assert readers.info(str(tmp_path) + "/").version == "20260202T000000Z"
    assert count(str(v1)) == 5
    with pytest.raises(FileNotFoundError, match="not a dataset"):
        readers.info(str(tmp_path / "versions"))


def _corrupt_copy(root, tmp_path, how):
    dst = tmp_path / "ds"
    shutil.copytree(root, dst)
    vdir = pathlib.Path(readers.info(str(dst)).version_dir)
    shard = vdir / layout.shard_name("flowers", "train", 1, 4)
    data = bytearray(shard.read_bytes())
    if how == "flip":
        data[len(data) // 2] ^= 0x40  # inside a record's payload: its CRC no longer matches
    else:
        data = data[:-100]  # truncated last record
    shard.write_bytes(bytes(data))
    return dst, shard


@pytest.mark.parametrize("how", ["flip"])  # a truncated file: tests/test_reader_faults.py
def test_corrupt_shard_names_the_file(root, tmp_path, how):
    dst, shard = _corrupt_copy(root, tmp_path, how)
    ds = readers.make_dataset(str(dst), batch_size=4, image_size=SIZE)
    with pytest.raises(tf.errors.OpError, match=shard.name) as e:
        for _ in ds:
            pass
    assert "skip_corrupt=True" in str(e.value)


@pytest.mark.parametrize("how", ["flip"])
def test_skip_corrupt_reads_the_rest(root, tmp_path, capfd, how):
    dst, shard = _corrupt_copy(root, tmp_path, how)
    ds = readers.make_dataset(str(dst), batch_size=4, image_size=SIZE, skip_corrupt=True,
                              drop_remainder=False)
    ids, labels = _ids_labels(ds)
    lost = [r for r in range(30) if r not in ids]
    assert 1 <= len(lost) <= 8 and all(r % 4 == 1 for r in lost)  # only shard 1's records
    assert len(ids) == 30 and ds.skips.count >= 1  # made up with readable ones: same steps
    assert labels == [i % 3 for i in ids]
    assert "skipped" in capfd.readouterr().err


def test_transform_without_transform_output_names_the_fix(root):
    """This hand-written dataset has no transform_fn/: the error says how to get one."""
    with pytest.raises(ValueError, match="--no_transform"):
        readers.make_dataset(str(root), transform=True)


@pytest.mark.slow  # Model.fit on make_dataset, fast: test_reader_keras_resume.py
def test_keras_fit(root):
    """The docs/reader.md example, shrunk."""
    import keras

    train = readers.make_dataset(str(root), "train", batch_size=8, image_size=SIZE, seed=0)
    val = readers.make_dataset(str(root), "validation", batch_size=8, image_size=SIZE)
    model = keras.Sequential([keras.Input((SIZE, SIZE, 3)), keras.layers.GlobalAveragePooling2D(),
                              keras.layers.Dense(readers.info(str(root)).num_classes)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    hist = model.fit(train, validation_data=val, epochs=2, verbose=0)
    assert len(hist.history["loss"]) == 2


def test_cli_names_a_missing_dataset_in_one_line(tmp_path, capsys):
    from readers import __main__ as cli

    with pytest.raises(SystemExit) as exit_:
        cli.main([str(tmp_path / "nowhere")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "nowhere" in err
    assert "not a dataset" in err


def test_cli_names_an_unknown_split_in_one_line(root, capsys):
    from readers import __main__ as cli

    with pytest.raises(SystemExit) as exit_:
        cli.main([str(root), "--split", "nosuch"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no split 'nosuch'" in err and "train" in err
