"""Scheduled regeneration: versions, LATEST, no-op runs, stable ids and splits,
killed runs, retention and the concurrent-publish guard, on local paths and gs://."""

import json
import logging
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import pytest

from beam_pipeline import cli
from beam_pipeline.job import commit, contracts
from beam_pipeline.store import files, retention, versions
from dataset_format import dataset_info, layout, schema
from tests.helpers import (REPO, assert_dead_run_gone_or_shared, build, image_bytes,
                           make_images, read_records)

# Two splits of one shard each, so every image visibly lands in a split and a move would show.
ARGS = ["--name", "regen", "--num_shards", "1", "--splits", "train=0.5,validation=0.5",
        "--no_transform"]


def snapshot(root):
    """Every file under root with its size and mtime: any write shows up as a difference."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.stat(path)
            out[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns)
    return out


def latest_version(root):
    return files.read_json(layout.join(str(root), layout.LATEST))["version"]


def records(root, version):
    """(manifest, {image/filename: (split, label id, class text)}) of a version."""
    vdir = layout.version_dir(str(root), version)
    manifest = files.read_json(layout.join(vdir, layout.MANIFEST))
    out = {}
    for (split, _), recs in read_records(vdir, manifest).items():
        for r in recs:
            name = r[schema.FILENAME].decode()
            assert name not in out, f"{name} written twice"
            out[name] = (split, r[schema.LABEL], r[schema.TEXT].decode())
    return manifest, out


def fake_version(root, version, complete=True):
    """A version directory made by hand: complete (has a manifest) or half-written."""
    vdir = pathlib.Path(layout.version_dir(str(root), version))
    (vdir / ".tmp").mkdir(parents=True)
    (vdir / ".tmp" / "regen-train.tfrecord-00000-of-00001.abc").write_bytes(b"partial")
    if complete:
        (vdir / layout.MANIFEST).write_text(json.dumps({"version": version}))
    return vdir


# --- unchanged inputs ----------------------------------------------------------------------

@pytest.mark.slow
def test_unchanged_inputs_are_a_no_op_and_force_rebuilds(tmp_path, capsys):
    make_images(tmp_path / "in", {"cat": 3, "dog": 3})
    root = tmp_path / "ds"
    first = build(tmp_path / "in", root, *ARGS)
    assert first["status"] == "published"
    before, latest_bytes = snapshot(root), (root / layout.LATEST).read_bytes()
    capsys.readouterr()

    code = cli.main(["--input", str(tmp_path / "in"), "--output", str(root)] + ARGS)
    out = capsys.readouterr().out
    assert code == 0
    assert "up to date" in out and first["version"] in out
    assert snapshot(root) == before, "an up-to-date run wrote something"
    assert (root / layout.LATEST).read_bytes() == latest_bytes

    forced = build(tmp_path / "in", root, *ARGS, "--force")
    assert forced["status"] == "published" and forced["version"] > first["version"]
    assert latest_version(root) == forced["version"]
    assert forced["manifest"]["input_fingerprint"] == first["manifest"]["input_fingerprint"]
    assert set(versions.list_versions(str(root))) == {first["version"], forced["version"]}


# --- label ids and splits across versions --------------------------------------------------

@pytest.mark.slow
def test_new_images_and_classes_keep_ids_and_splits_and_removed_class_keeps_its_id(
        tmp_path, caplog):
    src = tmp_path / "in"
    make_images(src, {"cat": 4, "dog": 4})
    root = tmp_path / "ds"
    v1 = build(src, root, *ARGS)["version"]
    m1, r1 = records(root, v1)
    assert m1["labels"] == ["cat", "dog"]
    assert {split for split, _, _ in r1.values()} == {"train", "validation"}

    # New images in an old class and a new class that sorts first: it is appended, not sorted in.
    make_images(src, {"cat": {"100.jpg": image_bytes((230, 50, 50))},
                      "ant": {f"{i}.jpg": image_bytes((i, 9, 9)) for i in range(3)}})
    v2 = build(src, root, *ARGS)["version"]
    assert v2 > v1 and latest_version(root) == v2
    m2, r2 = records(root, v2)
    assert m2["labels"] == ["cat", "dog", "ant"]
    assert len(r2) == len(r1) + 4
    for name, (split, label, text) in r1.items():
        assert r2[name] == (split, label, text), f"{name} changed split or id"
    for name, (split, label, text) in r2.items():
        assert m2["labels"][label] == text == name.split("/")[0]
    assert {r2[f"ant/{i}.jpg"][1] for i in range(3)} == {2}

    # A class with no images left keeps its id, with zero examples and a warning.
    for path in (src / "dog").iterdir():
        path.unlink()
    (src / "dog").rmdir()
    with caplog.at_level(logging.WARNING):
        v3 = build(src, root, *ARGS)["version"]
    m3, r3 = records(root, v3)
    assert m3["labels"] == ["cat", "dog", "ant"]
    assert all(s["label_counts"]["dog"] == 0 for s in m3["splits"].values())
    assert any("'dog'" in r.getMessage() and "no images" in r.getMessage()
               for r in caplog.records), caplog.text
    assert not any(name.startswith("dog/") for name in r3)
    assert all(r3[name] == r2[name] for name in r3)


# --- a run killed midway -------------------------------------------------------------------

@pytest.mark.slow
def test_killed_run_keeps_latest_readers_read_old_version_and_it_is_cleaned_up(tmp_path):
    import readers

    src, root = tmp_path / "in", tmp_path / "ds"
    make_images(src, {"cat": 3, "dog": 3})
    v1 = build(src, root, *ARGS)["version"]
    latest_bytes = (root / layout.LATEST).read_bytes()

    # A FIFO nobody writes to: reading it blocks, so the run hangs inside a shard writer with
    # its temp shard open, which is the moment to kill it (deterministic, however fast it is).
    # The listing rejects special files, so the image becomes one once it has been listed.
    stuck = src / "cat" / "stuck.jpg"
    stuck.write_bytes(image_bytes((200, 10, 10)))
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    log = tmp_path / "run.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "beam_pipeline", "--input", str(src), "--output", str(root)]
            + ARGS, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while "Building " not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, f"the run ended early:\n{log.read_text()[-3000:]}"
            time.sleep(0.01)
        stamp = os.stat(stuck).st_mtime_ns
        stuck.unlink()
        os.mkfifo(stuck)
        os.utime(stuck, ns=(stamp, stamp))
        deadline, shard = time.monotonic() + 90, None
        while shard is None and time.monotonic() < deadline:
            assert proc.poll() is None, f"the run ended early:\n{log.read_text()[-3000:]}"
            shard = next((p for p in (root / "versions").glob("*/.tmp/*.tfrecord-*")), None)
            time.sleep(0.05)
        assert shard is not None, f"no shard started in 90 s:\n{log.read_text()[-3000:]}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the run and any children
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    killed = shard.parent.parent.name
    assert killed > v1

    # LATEST is untouched; the half-written version has no manifest; readers see v1.
    assert (root / layout.LATEST).read_bytes() == latest_bytes
    assert versions.list_versions(str(root)) == {v1: True, killed: False}
    vdir, manifest = dataset_info.load_manifest(str(root))
    assert (vdir, manifest["version"]) == (layout.version_dir(str(root), v1), v1)
    assert readers.info(str(root)).version == v1
    expected = manifest["splits"]["train"]["num_examples"]
    ds = readers.make_dataset(str(root), split="train", batch_size=64, image_size=8,
                              training=False)
    assert sum(int(labels.shape[0]) for _, labels in ds) == expected

    # The next successful run publishes a newer version and removes the dead one.
    stuck.unlink()
    make_images(src, {"dog": {"new.jpg": image_bytes((1, 2, 3))}})
    v3 = build(src, root, *ARGS)["version"]
    assert v3 > killed and latest_version(root) == v3
    assert_dead_run_gone_or_shared(str(root), {v1, v3}, killed)


# --- retention and the publish guard -------------------------------------------------------

@pytest.mark.slow
def test_keep_versions_deletes_only_what_it_should(tmp_path):
    src, root = tmp_path / "in", tmp_path / "ds"
    make_images(src, {"cat": 2, "dog": 2})
    for v in ("20200101T000000Z", "20200102T000000Z", "20200103T000000Z"):
        fake_version(root, v)
    fake_version(root, "20200102T120000Z", complete=False)    # a killed run: cleaned up
    fake_version(root, "29991231T000000Z", complete=False)    # a newer run in progress: kept
    new = build(src, root, *ARGS, "--keep_versions", "2")["version"]
    assert latest_version(root) == new
    assert versions.list_versions(str(root)) == {
        new: True, "20200103T000000Z": True, "29991231T000000Z": False}

    # The version LATEST names survives however many newer complete versions exist.
    for v in ("29990101T000000Z", "29990102T000000Z"):
        fake_version(root, v)
    # 20200103 was superseded by `new` seconds ago: kept for --keep_superseded_hours (48 h
    # by default), then deleted; 29990101 was never superseded (never LATEST): kept.
    assert retention.prune(str(root), new, 1) == []
    assert retention.prune(str(root), new, 1, keep_superseded_hours=0) == ["20200103T000000Z"]
    assert versions.list_versions(str(root)) == {
        new: True, "29990101T000000Z": True, "29990102T000000Z": True,
        "29991231T000000Z": False}
    assert latest_version(root) == new


def test_an_older_version_is_never_published_over_a_newer_one(tmp_path):
    root = str(tmp_path / "ds")
    old, new = "20260101T000000Z", "20260102T000000Z"
    fake_version(root, new)
    assert versions.publish(root, new) == new
    assert versions.publish(root, old) == new, "publish must refuse an older version"
    assert latest_version(root) == new

    # The job's commit stage raises, so the run fails; its version is complete, unpublished.
    spec = contracts.CommitSpec(
        root=root, version=old, name="regen", labels=("cat",), num_shards={},
        listed=contracts.Listed(0, 0, ""), input_fingerprint="sha256:0", config={},
        generator={}, max_error_rate=1.0, retention=contracts.Retention(keep_versions=1),
        write_index=False)
    with pytest.raises(commit.PublishRefused, match=new):
        commit.commit([], spec)
    assert latest_version(root) == new
    assert versions.list_versions(root)[old] is True


def assert_same_second_claims_differ(root, monkeypatch, prefix):
    """Two runs whose clocks say the same second: the second claim moves to the next id."""
    ids = iter([prefix + "0Z", prefix + "0Z", prefix + "1Z"])
    monkeypatch.setattr(versions, "new_version_id", lambda now=None: next(ids))
    monkeypatch.setattr(versions.time, "sleep", lambda s: None)
    assert versions.claim_version(root) == prefix + "0Z"
    assert versions.claim_version(root) == prefix + "1Z"
    monkeypatch.undo()


def test_runs_starting_in_the_same_second_get_different_versions(tmp_path, monkeypatch):
    root = str(tmp_path / "ds")
    assert_same_second_claims_differ(root, monkeypatch, "20260101T00000")

    # For real: three runs released at once (same second, most likely) never share a version.
    barrier, got = threading.Barrier(3), []
    def claim():
        barrier.wait()
        got.append(versions.claim_version(root))
    threads = [threading.Thread(target=claim) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(got) == 3 and len(set(got)) == 3, got


# --- the same cycle on gs:// (storage emulator) --------------------------------------------

def objects(gcs, bucket):
    return {(b.name, b.generation, b.size) for b in gcs.client.list_blobs(bucket)}


@pytest.mark.slow
def test_regeneration_cycle_on_gcs(gcs, gcs_bucket, tmp_path, monkeypatch):
    local = tmp_path / "in"
    make_images(local, {"cat": 2, "dog": 2})
    src, root = f"gs://{gcs_bucket}/in", f"gs://{gcs_bucket}/ds"
    gcs.upload_tree(local, src)

    v1 = build(src, root, *ARGS)["version"]
    assert gcs.read_json(f"{root}/LATEST")["version"] == v1
    before = objects(gcs, gcs_bucket)
    build(src, root, *ARGS, expect="up_to_date")
    assert objects(gcs, gcs_bucket) == before, "an up-to-date run wrote to the bucket"

    # Two ids claimed in one second on an object store: the claim objects keep them apart.
    assert_same_second_claims_differ(root, monkeypatch, "29990101T00000")
    for v in ("29990101T000000Z", "29990101T000001Z"):  # drop them: they'd outrank the build
        retention.delete_version(root, v)

    # A half-written version, a new class, retention: the same as on local paths.
    gcs.upload_bytes(f"{root}/versions/20200101T000000Z/.tmp/listing.jsonl", b"{}\n")
    gcs.upload_bytes(f"{src}/ant/0.jpg", image_bytes((9, 9, 9)))
    v2 = build(src, root, *ARGS, "--keep_versions", "1", "--keep_superseded_hours", "0")
    assert v2["status"] == "published" and v2["version"] > v1
    assert v2["manifest"]["labels"] == ["cat", "dog", "ant"]
    assert gcs.read_json(f"{root}/LATEST")["version"] == v2["version"]
    assert versions.list_versions(root) == {v2["version"]: True}
    assert not [p for p in gcs.list(f"{root}/versions/") if f"/{v2['version']}/" not in p]
