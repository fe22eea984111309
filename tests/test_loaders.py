"""The TensorFlow-free loaders (loaders/): random access and sequential reads, in the real
PyTorch DataLoader and Grain, each record exactly once, pixels and labels of the right record.

Records come from tests/tiny_dataset.py: record `rid`'s red is 6 * rid, green 100 * label.
"""

import collections
import os
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest

from loaders import Example, RecordSource, SequentialRecords
from tests import tiny_dataset
from tests.helpers import REPO

TRAIN = tiny_dataset.rids_in_order("train")
ALL_TRAIN_KEYS = sorted(tiny_dataset.key("train", r) for r in TRAIN)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(tiny_dataset.write(tmp_path_factory.mktemp("loaders") / "ds"))


def _rid_of(example):
    """The record id an Example's pixels encode; checks its label and key agree with them."""
    image = np.asarray(example.image)
    assert image.shape == (30, 40, 3) and image.dtype == np.uint8
    red, green = image[..., 0].mean(), image[..., 1].mean()
    rid, label = int(round(red / 6)), int(round(green / 100))
    assert abs(red - 6 * rid) < 2 and abs(green - 100 * label) < 2
    assert int(example.label) == label == rid % 3
    assert example.key.endswith(f"/{tiny_dataset.LABELS[label]}/{rid:02d}.jpg")
    return rid


def test_importing_and_reading_loads_no_tensorflow(root):
    code = (
        "import sys, loaders\n"
        "from loaders import Example, RecordSource, SequentialRecords\n"
        f"src = RecordSource({root!r}, 'train[:5]')\n"
        "assert src[4].image.shape == (30, 40, 3)\n"
        f"assert len(list(SequentialRecords({root!r}, 'validation'))) == 9\n"
        "print(sorted(m for m in ('tensorflow', 'torch', 'apache_beam', 'jax')\n"
        "             if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_source_reads_each_record_by_position(root):
    source = RecordSource(root, "train")
    assert len(source) == 37 and source.class_names == tiny_dataset.LABELS
    assert [_rid_of(source[i]) for i in range(len(source))] == TRAIN
    assert _rid_of(source[-1]) == TRAIN[-1] and _rid_of(source[np.int64(3)]) == TRAIN[3]
    with pytest.raises(IndexError, match="record 37 of a source of 37"):
        source[37]


def test_source_keeps_few_files_open(root, monkeypatch):
    from loaders import source as source_lib

    monkeypatch.setattr(source_lib, "OPEN_FILES", 2)
    source = RecordSource(root, "train")
    order = list(range(len(source)))
    np.random.default_rng(0).shuffle(order)
    fds = len(os.listdir("/proc/self/fd"))
    assert [_rid_of(source[i]) for i in order] == [TRAIN[i] for i in order]
    assert len(source._files) == 2 and len(os.listdir("/proc/self/fd")) <= fds + 2


def test_source_bytes_labels_and_slices(root):
    raw = RecordSource(root, "validation", decode=False, label_offset=1)
    rids = tiny_dataset.rids_in_order("validation")
    assert [(ex.image, ex.label) for ex in raw] == [
        (tiny_dataset.jpeg(r, r % 3), r % 3 + 1) for r in rids]
    head = RecordSource(root, "train[:10%]")  # round(3.7) = 4, as TFDS
    assert [_rid_of(head[i]) for i in range(len(head))] == TRAIN[:4]
    both = RecordSource(root, "train[35:]+validation[-2:]")
    assert [ex.key for ex in (both[i] for i in range(len(both)))] == (
        [tiny_dataset.key("train", r) for r in TRAIN[35:]]
        + [tiny_dataset.key("validation", r) for r in rids[-2:]])


def test_sequential_parts_cover_the_split_once(root):
    seen = collections.Counter()
    for host in range(3):
        for worker in range(2):
            part = SequentialRecords(root, "train", host_index=host, host_count=3,
                                     worker_index=worker, worker_count=2, read_bytes=2000)
            rids = [_rid_of(ex) for ex in part]
            assert len(rids) == len(part) in (6, 7)
            seen.update(rids)
    assert sorted(seen) == sorted(TRAIN) and set(seen.values()) == {1}


def test_sequential_shuffle_is_a_permutation_per_epoch(root):
    stream = SequentialRecords(root, "train", seed=7, shuffle_buffer=8)
    first = [ex.key for ex in stream]
    again = [ex.key for ex in stream]
    stream.set_epoch(1)
    second = [ex.key for ex in stream]
    assert sorted(first) == sorted(second) == ALL_TRAIN_KEYS
    assert first == again and first != second


def test_without_index_files_the_frames_are_walked(root, tmp_path):
    copy = tmp_path / "noindex"
    shutil.copytree(root, copy)
    for index in copy.rglob("*.index"):
        index.unlink()
    assert [ex.key for ex in RecordSource(str(copy), "train")] == [
        tiny_dataset.key("train", r) for r in TRAIN]
    assert [_rid_of(ex) for ex in SequentialRecords(str(copy), "train")] == TRAIN


def test_a_damaged_record_is_named_and_only_it_is_lost(root, tmp_path):
    copy = tmp_path / "damaged"
    shutil.copytree(root, copy)
    source = RecordSource(str(copy), "train")
    shard = source.spans[0].path
    offset, length = [tuple(map(int, line.split()))
                      for line in open(shard + ".index").read().splitlines()][2]
    data = bytearray(open(shard, "rb").read())
    data[offset + length // 2] ^= 0x40
    open(shard, "wb").write(bytes(data))
    with pytest.raises(ValueError, match=r"00000-of-00004: record 2: offset \d+: data CRC"):
        source[2]
    assert [_rid_of(source[i]) for i in (0, 1, 3, 4)] == [TRAIN[i] for i in (0, 1, 3, 4)]


def test_an_index_that_disagrees_with_the_manifest_is_refused(root, tmp_path):
    copy = tmp_path / "short"
    shutil.copytree(root, copy)
    source = RecordSource(str(copy), "validation")
    index = source.spans[0].path + ".index"
    lines = open(index).read().splitlines(keepends=True)
    open(index, "w").write("".join(lines[:-1]))
    with pytest.raises(ValueError, match="4 records in its index or frames, 5 in the manifest"):
        source[0]


# --- the real libraries ------------------------------------------------------------------------

def _no_tensorflow_in_worker(worker_id):
    assert "tensorflow" not in sys.modules, "a DataLoader worker imported TensorFlow"


@pytest.mark.parametrize("context", [
    "fork",  # the source as workers inherit it
    # pickled into fresh interpreters that must not import TensorFlow: each imports torch
    # (~6 s); fast, the same no-TensorFlow check: test_importing_and_reading_loads_no_tensorflow
    pytest.param("spawn", marks=pytest.mark.slow)])
def test_torch_dataloader_two_workers_map_style(root, context):
    torch = pytest.importorskip("torch", reason="torch is in the test extra")
    source = RecordSource(root, "train")
    loader = torch.utils.data.DataLoader(
        source, batch_size=5, shuffle=True, num_workers=2, generator=torch.Generator().manual_seed(0),
        multiprocessing_context=context,
        worker_init_fn=_no_tensorflow_in_worker if context == "spawn" else None)
    keys, batches = [], 0
    for batch in loader:
        images, labels, batch_keys = batch
        assert images.dtype == torch.uint8 and images.shape[1:] == (30, 40, 3)
        for image, label, key in zip(images.numpy(), labels.tolist(), batch_keys):
            _rid_of(Example(image, label, key))
        keys += batch_keys
        batches += 1
    assert batches == 8 and sorted(keys) == ALL_TRAIN_KEYS  # each record exactly once
    copy = pickle.loads(pickle.dumps(source))  # what a spawned worker gets
    assert [_rid_of(copy[i]) for i in range(len(copy))] == TRAIN


def test_torch_dataloader_two_workers_two_hosts_iterable(root):
    torch = pytest.importorskip("torch", reason="torch is in the test extra")
    from loaders.pytorch import IterableRecords

    per_host = []
    for host in range(2):
        stream = IterableRecords(root, "train", host_index=host, host_count=2)
        loader = torch.utils.data.DataLoader(stream, batch_size=4, num_workers=2)
        keys = [k for _, _, batch_keys in loader for k in batch_keys]
        assert len(keys) == len(stream) == (18 if host == 0 else 19)
        per_host.append(keys)
    assert sorted(per_host[0] + per_host[1]) == ALL_TRAIN_KEYS


def test_grain_reads_the_source_with_two_workers(root):
    grain = pytest.importorskip("grain.python", reason="grain is in the test extra")
    source = RecordSource(root, "train")
    assert isinstance(source, grain.RandomAccessDataSource)
    sampler = grain.IndexSampler(len(source), grain.NoSharding(), shuffle=True, num_epochs=1,
                                 seed=3)
    loader = grain.DataLoader(data_source=source, sampler=sampler, worker_count=2,
                              operations=[grain.Batch(4)])
    keys = []
    for images, labels, batch_keys in loader:
        assert images.shape[1:] == (30, 40, 3)
        for image, label, key in zip(images, labels, batch_keys):
            _rid_of(Example(image, label, str(key)))
            keys.append(str(key))
    assert sorted(keys) == ALL_TRAIN_KEYS


def test_grain_map_dataset_per_host_and_slices(root):
    grain = pytest.importorskip("grain", reason="grain is in the test extra")
    source = RecordSource(root, "train")
    keys = []
    for host in range(2):  # each host takes every other record, then shuffles its share
        ds = grain.MapDataset.source(source)[host::2].shuffle(seed=1).map(lambda ex: ex.key)
        keys += list(ds)
    assert sorted(keys) == ALL_TRAIN_KEYS
    half = RecordSource(root, "validation[:50%]")  # round(4.5) = 4: half to even, as TFDS
    assert sorted(grain.MapDataset.source(half).map(lambda ex: ex.key)) == sorted(
        tiny_dataset.key("validation", r) for r in tiny_dataset.rids_in_order("validation")[:4])


# --- gs:// and a real build ----------------------------------------------------------------

def test_on_gcs_through_google_cloud_storage(root, gcs, gcs_bucket):
    uri = f"gs://{gcs_bucket}/flowers"
    gcs.upload_tree(root, uri)
    source = RecordSource(uri, "train")
    assert source.info.version_dir == f"{uri}/versions/{tiny_dataset.VERSION}"
    assert [_rid_of(source[i]) for i in range(len(source))] == TRAIN
    stream = SequentialRecords(uri, "train", host_index=1, host_count=2, read_bytes=3000)
    assert [_rid_of(ex) for ex in stream] == TRAIN[18:]


def test_a_real_build_reads_as_tf_data_reads_it(built_dataset):
    from tests.helpers import read_records

    vdir = built_dataset["version_dir"]
    expected = read_records(vdir)  # plain tf.data, in manifest order
    labels = built_dataset["manifest"]["labels"]
    for split, info in built_dataset["manifest"]["splits"].items():
        want = [r for shard in info["shards"] for r in expected[(split, shard["path"])]]
        source = RecordSource(built_dataset["root"], split)
        got = [source[i] for i in range(len(source))]
        assert [(ex.key, ex.label) for ex in got] == [
            (r["image/filename"].decode(), r["image/class/label"]) for r in want]
        assert [ex.image.shape for ex in got] == [r["_decoded_shape"] for r in want]
        assert source.class_names == labels
        streamed = [ex.key for ex in SequentialRecords(vdir, split)]
        assert streamed == [ex.key for ex in got]


# --- docs/reader.md's examples, run as written ---------------------------------------------

def _doc_examples():
    """The python blocks of docs/reader.md's section on the loaders."""
    text = (REPO / "docs" / "reader.md").read_text()
    section = text.split("### PyTorch and JAX, without TensorFlow")[1].split("\n### ")[0]
    return [block.split("\n", 1)[1] for block in section.split("```python")[1:]
            for block in [block.split("```")[0]]]


def test_docs_pytorch_and_grain_examples_run(root, capsys):
    torch_example, grain_example = _doc_examples()
    scope = {"ROOT": root}
    exec(compile(torch_example, "docs/reader.md (PyTorch)", "exec"), scope)
    assert tuple(scope["images"].shape) == (37 % 64, 3, 224, 224)  # one short batch of 37
    assert scope["images"].dtype == scope["torch"].float32 and 0 <= scope["images"].min()
    scope = {"ROOT": root}
    exec(compile(grain_example, "docs/reader.md (Grain)", "exec"), scope)
    assert len(scope["source"]) == 33  # round(0.9 * 37)
    assert scope["batch"]["image"].shape == (1, 224, 224, 3)  # 33 = 32 + 1
    assert "37 ['daisy', 'rose', 'tulip'] torch.Size([37, 3, 224, 224])" in capsys.readouterr().out


def test_a_missing_shard_is_one_line_per_failure_and_no_noise(root, tmp_path):
    """Each failed read names the shard in one line; the half-opened file leaves nothing on
    stderr (it printed "Exception ignored ... '_fd'" once per failed open)."""
    copy = tmp_path / "pruned"
    shutil.copytree(root, copy)
    shard = RecordSource(str(copy), "train").spans[0].path
    os.remove(shard)
    script = f"""
import gc
from loaders import RecordSource, SequentialRecords
source = RecordSource({str(copy)!r}, "train")
for i in range(5):
    try:
        source[i]
    except FileNotFoundError as e:
        print(e)
try:
    list(SequentialRecords({str(copy)!r}, "train"))
except FileNotFoundError as e:
    print(e)
gc.collect()
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    want = (f"{shard}: shard file missing (manifest.json lists it): the version was pruned "
            "or only partly copied; rebuild it or read another version")
    assert out.stdout.splitlines() == [want] * 6 and out.stderr == ""
