"""gs:// end to end on the DirectRunner, against a real GCS JSON-API server.

The emulator (gcp-storage-emulator, started by tests/gcs_emulator.py) stands in for Cloud
Storage: images are uploaded to a bucket, the CLI builds from gs:// inputs (an ImageFolder
prefix, a glob, and a CSV manifest of gs:// uris) into a gs:// root, and everything is checked
by reading the objects back. Beam's gcsio (google-cloud-storage) talks to the emulator
directly; TensorFlow's gs:// filesystem (used by readers/ and by the TFDS metadata writer)
reaches it through the fixture's TLS bridge, because its endpoints are compiled in.
"""

import gc
import json

import pytest

from dataset_format import frames


pytestmark = pytest.mark.slow  # every test here talks to the storage emulator

ARGS = ["--name", "pets", "--num_shards", "2", "--max_error_rate", "0.5", "--no_transform"]


def _upload_inputs(gcs, bucket, tmp_path, make_images):
    """ImageFolder prefix (with one broken file), a glob prefix, a CSV manifest -> --input list."""
    make_images(tmp_path / "in", {"cat": 3, "dog": 3, "dog/": {"broken.jpg": b"not an image"}})
    make_images(tmp_path / "glob", {"fox": 2})
    make_images(tmp_path / "extra", {"owl": 2})
    base = f"gs://{bucket}"
    for name in ("in", "glob", "extra"):
        gcs.upload_tree(tmp_path / name, f"{base}/{name}")
    rows = ["uri,label",
            f"{base}/extra/owl/000.jpg,owl",
            f"{base}/extra/owl/001.jpg,owl",
            f"{base}/in/cat/000.jpg,cat",        # also in the ImageFolder: a duplicate
            f"{base}/extra/owl/missing.jpg,owl"]  # no such object: not_found
    gcs.upload_bytes(f"{base}/lists/extra.csv", ("\n".join(rows) + "\n").encode())
    return ["--input", f"{base}/in", "--input", f"{base}/glob/*/*.jpg",
            "--input", f"{base}/lists/extra.csv"]


def test_build_and_read_on_gcs(gcs, gcs_bucket, tmp_path, make_images):
    from beam_pipeline import cli

    root = f"gs://{gcs_bucket}/datasets/pets"
    inputs = _upload_inputs(gcs, gcs_bucket, tmp_path, make_images)
    result = cli.run(inputs + ["--output", root] + ARGS)
    assert result.status == "published", result
    version = result.version
    vdir = f"{root}/versions/{version}"

    # LATEST and the manifest, read straight from the bucket (not through our own code)
    assert gcs.read_json(f"{root}/LATEST") == {
        "version": version, "manifest": f"versions/{version}/manifest.json"}
    manifest = gcs.read_json(f"{vdir}/manifest.json")
    assert manifest == result.manifest
    acc = manifest["accounting"]
    # 7 ImageFolder files + 2 glob + 4 manifest rows; 1 duplicate; broken.jpg + missing.jpg
    assert acc == dict(acc, listed=13, duplicates=1, failed=2, written=10)
    assert acc["listed"] == acc["duplicates"] + acc["failed"] + acc["written"]
    assert manifest["labels"] == ["cat", "dog", "fox", "owl"]
    splits = manifest["splits"]
    assert sum(s["num_examples"] for s in splits.values()) == acc["written"]
    assert sum(sh["num_examples"] for s in splits.values() for sh in s["shards"]) == acc["written"]
    assert sum(c for s in splits.values() for c in s["label_counts"].values()) == acc["written"]

    objects = gcs.list(f"{root}/")
    for split in splits.values():
        for shard in split["shards"]:
            uri = f"{vdir}/{shard['path']}"
            assert objects[uri] == shard["num_bytes"], uri
            assert frames.file_crc32c(gcs.read(uri)) == shard["crc32c"], uri

    errors = [json.loads(l) for l in gcs.read(f"{vdir}/errors.jsonl").decode().splitlines()]
    assert len(errors) == manifest["errors"]["count"] == 2
    by_uri = {e["uri"]: e["reason"] for e in errors}
    assert by_uri[f"gs://{gcs_bucket}/extra/owl/missing.jpg"] == "not_found"
    assert f"gs://{gcs_bucket}/in/dog/broken.jpg" in by_uri

    # Commit cleaned up: no temp objects, no write probe, no half-written LATEST
    leftovers = [u for u in objects if "/.tmp/" in u or "/.write-check" in u or "/.LATEST" in u]
    assert leftovers == []

    # The readers (tf.io.gfile / tf.data) on the gs:// root, through the TLS bridge.
    import readers

    info = readers.info(root)
    assert info.version_dir == vdir and list(info.labels) == manifest["labels"]
    seen = 0
    for name, split in info.splits.items():
        if not split.num_examples:
            continue
        ds = readers.make_dataset(root, split=name, batch_size=4, image_size=8, training=False,
                                  dtype="uint8")
        labels = [int(l) for _, batch in ds for l in batch.numpy()]
        assert sorted(labels) == sorted(
            i for i, label in enumerate(manifest["labels"])
            for _ in range(split.label_counts.get(label, 0)))
        seen += len(labels)
    assert seen == acc["written"]
    # The resumable order on gs://: byte ranges from the `.index` offsets, read in C++.
    ds = readers.make_dataset(root, "train", batch_size=1, image_size=8, start=0,
                              with_keys=True)
    keys = [k for _, _, batch in ds for k in batch.numpy().tolist()]
    assert len(keys) == len(set(keys)) == splits["train"]["num_examples"] > 0

    # Unchanged inputs: the launcher reads LATEST + manifest from gs:// and stops early.
    from beam_pipeline.launcher.prepare import UpToDate

    again = cli.run(inputs + ["--output", root] + ARGS)
    assert again == UpToDate(version)

    # Nothing tried to reach a Google endpoint other than the storage API we bridge.
    assert not [r for r in gcs.proxy.refused if "google" in r], gcs.proxy.refused


def test_versions_delete_and_prune_on_gcs(gcs, gcs_bucket):
    """GCS has no directories: deleting a version or the temp dir must remove every object
    under the prefix, nested ones included."""
    from beam_pipeline.store import files, retention, versions

    root = f"gs://{gcs_bucket}/ds"
    old, broken, new = "20260101T000000Z", "20260102T000000Z", "20260103T000000Z"
    for v in (old, new):
        gcs.upload_bytes(f"{root}/versions/{v}/manifest.json", b"{}")
        gcs.upload_bytes(f"{root}/versions/{v}/x-train.tfrecord-00000-of-00001", b"")
    gcs.upload_bytes(f"{root}/versions/{broken}/.tmp/listing.jsonl", b"{}\n")
    gcs.upload_bytes(f"{root}/versions/{broken}/.tmp/progress/a", b"1")
    gcs.upload_bytes(f"{root}/versions/{broken}/x-train.tfrecord-00000-of-00001.abc", b"")
    assert versions.list_versions(root) == {old: True, broken: False, new: True}

    assert versions.publish(root, new) == new
    assert versions.publish(root, old) == new            # never moves LATEST backwards
    assert versions.latest(root)[0] == new

    assert sorted(retention.prune(root, new, keep=1)) == [old, broken]
    assert versions.list_versions(root) == {new: True}
    assert not [u for u in gcs.list(f"{root}/versions/") if f"/{old}/" in u or f"/{broken}/" in u]

    gcs.upload_bytes(f"{root}/versions/{new}/.tmp/a/b/c", b"1")
    gcs.upload_bytes(f"{root}/versions/{new}/.tmp/d", b"1")
    files.delete_tree(f"{root}/versions/{new}/.tmp")
    assert sorted(gcs.list(f"{root}/versions/")) == [
        f"{root}/versions/{new}/manifest.json",
        f"{root}/versions/{new}/x-train.tfrecord-00000-of-00001"]


def test_unwritable_gcs_output_is_one_clear_error(gcs, gcs_bucket, tmp_path,
                                                  make_images):
    from beam_pipeline import cli
    from beam_pipeline.errors import UserError

    make_images(tmp_path / "in", {"cat": 1})
    with pytest.raises(UserError, match="not writable"):
        cli.run(["--input", str(tmp_path / "in"), "--output", "gs://no-such-bucket-4/ds"] + ARGS)
    gc.collect()  # the failed writer retries on finalization: now, while the emulator is up


def test_commit_retried_after_failed_manifest_write_keeps_listing_errors(
        gcs, gcs_bucket, monkeypatch):
    """A retried commit (the manifest write failed once) must publish the same accounting."""
    from beam_pipeline.job import commit
    from beam_pipeline.job.contracts import (CommitSpec, Listed, Made, ShardFiles, ShardResult,
                                             Sums, Written)
    from beam_pipeline.store import files

    root, version = f"gs://{gcs_bucket}/ds", "20260105T000000Z"
    vdir = f"{root}/versions/{version}"
    listing_errors = f"{vdir}/.tmp/listing_errors.jsonl"
    gcs.upload_bytes(listing_errors, b'{"uri": "gs://x/a.jpg", "stage": "read", '
                                     b'"reason": "not_found", "detail": "gone"}\n')
    temp = f"{vdir}/.tmp/p-train.tfrecord-00000-of-00001.abc"
    gcs.upload_bytes(temp, b"frame")
    stats = [ShardResult(split="train", shard=0, files=ShardFiles(temp=temp),
                         written=Written(1, 5, crc32c=frames.file_crc32c(b"frame")),
                         made=Made(passed_through=1), sums=Sums({"cat": 1}))]
    spec = CommitSpec(
        root=root, version=version, name="p", labels=("cat",), num_shards={"train": 1},
        listed=Listed(2, 0, listing_errors), input_fingerprint="sha256:x",
        config={}, generator={}, max_error_rate=1.0, write_index=False)

    real_write_whole, calls = files.write_whole, []

    def flaky_manifest_write(path, data):
        calls.append(path)
        if path.endswith("/manifest.json") and calls.count(path) == 1:
            raise OSError("transient GCS error")
        return real_write_whole(path, data)

    monkeypatch.setattr(files, "write_whole", flaky_manifest_write)
    with pytest.raises(OSError):
        commit.commit(stats, spec)
    manifest = commit.commit(stats, spec)  # the runner's retry of the same bundle
    assert manifest["accounting"] == dict(manifest["accounting"], listed=2, failed=1, written=1)
    assert len(gcs.read(f"{vdir}/errors.jsonl").splitlines()) == 1
    assert gcs.read_json(f"{root}/LATEST")["version"] == version
    assert not [u for u in gcs.list(f"{vdir}/") if "/.tmp/" in u]
