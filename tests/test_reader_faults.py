"""The reader on damaged or vanishing inputs: it fails within seconds naming the file, in the
default and skip_corrupt modes alike, and never spins.

Files damaged before `make_dataset` are caught by its eager check (in process: it raises
before anything is read). Files that vanish or shrink after it, while iterating, used to spin
forever inside `ignore_errors`; those cases run in a subprocess with a timeout, so a
regression fails the test instead of hanging the suite.
"""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

import readers
from dataset_format import layout
from tests.helpers import REPO
from tests.test_reader import SIZE, write_dataset

VERSION = "20261129T220102Z"


@pytest.fixture
def root(tmp_path):
    write_dataset(tmp_path, VERSION)
    return tmp_path


def _shard(root, s=1):
    return pathlib.Path(layout.version_dir(str(root), VERSION),
                        layout.shard_name("flowers", "train", s, 4))


@pytest.mark.parametrize("skip_corrupt", [False, True])
def test_missing_shard_fails_at_once_naming_it(root, skip_corrupt):
    shard = _shard(root)
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=f"{shard}: shard file missing"):
        readers.make_dataset(str(root), batch_size=4, image_size=SIZE, skip_corrupt=skip_corrupt)


@pytest.mark.parametrize("skip_corrupt", [False, True])
def test_short_shard_fails_at_once_naming_it(root, skip_corrupt):
    shard = _shard(root)
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(ValueError, match=f"{shard}: .* bytes, but manifest.json says"):
        readers.make_dataset(str(root), batch_size=4, image_size=SIZE, skip_corrupt=skip_corrupt)


_AFTER = textwrap.dedent("""
    import json, os, shutil, sys, time
    import tensorflow as tf
    import readers
    src, rel = sys.argv[1], sys.argv[2]
    for n, case in enumerate(sys.argv[3:]):
        how, skip = case.split(":")
        root = f"{src}-{n}"
        shutil.copytree(src, root)
        shard = os.path.join(root, rel)
        ds = readers.make_dataset(root, batch_size=4, image_size=8, skip_corrupt=skip == "1",
                                  cycle_length=1, shuffle_buffer=1, seed=0)
        if how == "missing":
            os.remove(shard)
        elif how == "short":
            data = open(shard, "rb").read()
            open(shard, "wb").write(data[:len(data) // 2])
        else:
            os.chmod(shard, 0)
        start = time.monotonic()
        try:
            out = {"error": None, "batches": sum(int(b[1].shape[0]) for b in ds)}
        except tf.errors.OpError as e:
            out = {"error": e.message[:5000], "type": type(e).__name__}
        out.update(case=case, shard=shard, seconds=time.monotonic() - start)
        print("RESULT " + json.dumps(out), flush=True)
""")


@pytest.mark.slow
def test_shard_damaged_while_reading_fails_naming_it(root):
    """Checked when each file is opened: no spinning, the file named, both modes. One
    subprocess (a timeout guards against a spin) runs every case on its own copy."""
    cases = [f"{how}:{skip}" for how in ("missing", "short", "unreadable") for skip in "01"
             if how != "unreadable" or os.geteuid() != 0]  # root reads a file whatever its mode
    rel = os.path.relpath(_shard(root), root)
    out = subprocess.run([sys.executable, "-c", _AFTER, str(root), rel] + cases, cwd=REPO,
                         capture_output=True, text=True, timeout=180,
                         env=dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2"))
    assert out.returncode == 0, out.stderr[-3000:]
    results = [json.loads(x[len("RESULT "):]) for x in out.stdout.splitlines()
               if x.startswith("RESULT ")]
    assert [r["case"] for r in results] == cases
    for r in results:
        assert r["error"] and r["shard"] in r["error"], r
        assert r["seconds"] < 30, r
    assert len(out.stderr) < 200_000  # no flood of retried "No such file" warnings


def _with_bad_jpeg(root, rid=7):
    """Rewrite the shard holding record `rid` with its JPEG bytes replaced by garbage (the
    record itself stays valid: CRC and size updated in the manifest)."""
    vdir = pathlib.Path(layout.version_dir(str(root), VERSION))
    manifest = json.loads((vdir / layout.MANIFEST).read_text())
    s = rid % 4
    shard = _shard(root, s)
    records = [r.numpy() for r in tf.data.TFRecordDataset(str(shard))]
    position = rid // 4
    ex = tf.train.Example.FromString(records[position])
    ex.features.feature["image/encoded"].bytes_list.value[0] = b"\xff\xd8 not a jpeg"
    records[position] = ex.SerializeToString()
    with tf.io.TFRecordWriter(str(shard)) as w:
        for r in records:
            w.write(r)
    manifest["splits"]["train"]["shards"][s]["num_bytes"] = shard.stat().st_size
    (vdir / layout.MANIFEST).write_text(json.dumps(manifest))
    return shard, position, ex.features.feature["image/filename"].bytes_list.value[0].decode()


def test_undecodable_record_names_shard_and_key(root):
    shard, position, key = _with_bad_jpeg(root)
    ds = readers.make_dataset(str(root), batch_size=4, image_size=SIZE, training=False)
    with pytest.raises(tf.errors.InvalidArgumentError) as e:
        for _ in ds:
            pass
    assert f"{shard}: record {position} (key {key})" in e.value.message


def test_skip_corrupt_skips_an_undecodable_record_naming_it(root, capfd):
    shard, position, key = _with_bad_jpeg(root)
    ds = readers.make_dataset(str(root), batch_size=4, image_size=SIZE, training=False,
                              skip_corrupt=True)
    labels = [int(x) for _, b in ds for x in b]
    assert len(labels) == 29
    err = capfd.readouterr().err
    assert f"{shard}: record {position} (key {key}) is not a decodable image" in err


def _write_indexes(vdir):
    """The `.index` beside every shard, as the build writes it (offset and length a line)."""
    import io

    from dataset_format import frames

    for shard in vdir.glob("*.tfrecord-*"):
        data, entries, offset = shard.read_bytes(), [], 0
        f = io.BytesIO(data)
        while (frame := frames.read_frame(f, offset)) is not None:
            entries.append((offset, frame[1]))
            offset += frame[1]
        shard.with_name(layout.index_name(shard.name)).write_bytes(frames.index_bytes(entries))


def test_skip_corrupt_with_index_files_loses_only_the_damaged_record(root, capfd):
    """A flipped byte in one record's payload: the stream order skips that record alone and
    reads the rest of its shard from the next record's offset in the `.index`."""
    from tests.test_reader import _ids_labels

    _write_indexes(pathlib.Path(layout.version_dir(str(root), VERSION)))
    shard = _shard(root)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x40  # inside a record's payload: its data CRC no longer matches
    shard.write_bytes(bytes(data))
    ds = readers.make_dataset(str(root), batch_size=4, image_size=SIZE, skip_corrupt=True,
                              drop_remainder=False, seed=3)
    ids, labels = _ids_labels(ds)
    lost = sorted(set(range(30)) - set(ids))
    assert len(lost) == 1 and lost[0] % 4 == 1, lost  # one record of shard 1 (ids 1, 5, 9, ..)
    assert sorted(ids[:29]) == sorted(set(range(30)) - set(lost))
    assert len(ids) == 30 and ids[29] != lost[0]  # one readable record makes up the count
    assert labels == [i % 3 for i in ids]
    err = capfd.readouterr().err
    assert f"{shard}: record {lost[0] // 4} (offset" in err and "skipped this record only" in err
