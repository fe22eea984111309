"""Incremental versions: each one holds exactly a full build's examples.

Every scenario builds a first version, changes the inputs, builds incrementally, then
builds the same inputs in full (--full_rebuild) and compares the two example sets:
same keys, splits and record bytes; only the grouping into shards may differ.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from dataset_format import layout
from tests.helpers import REPO, build, check_invariants, examples, image_bytes, make_images

pytestmark = pytest.mark.slow

ARGS = ["--name", "pets", "--target_shard_mb", "0.01"]  # ~10 KB shards: several per split


def assert_same_as_full_build(incremental, src, tmp_path):
    full = build([src], tmp_path / "full", *ARGS, "--full_rebuild")
    check_invariants(incremental)
    a, b = examples(incremental), examples(full)
    assert a and sorted(a) == sorted(b)
    assert a == b
    assert incremental["manifest"]["labels"] == full["manifest"]["labels"]
    return full


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """One first version, built once; each test works on a copy (mtimes kept)."""
    tmp = tmp_path_factory.mktemp("incremental")
    make_images(tmp / "src", {"cat": 30, "dog": 30, "owl": 20})
    return tmp, build([tmp / "src"], tmp / "root", *ARGS)


@pytest.fixture
def first(base, tmp_path):
    """(source directory, first version's result) in this test's own tmp_path."""
    tmp, result = base
    shutil.copytree(tmp / "src", tmp_path / "src")
    shutil.copytree(tmp / "root", tmp_path / "root")
    moved = result["version_dir"].replace(str(tmp), str(tmp_path))
    return tmp_path / "src", dict(result, root=str(tmp_path / "root"), version_dir=moved)


def test_adding_images_reuses_every_shard_and_adds_delta_shards(first, tmp_path):
    src, v1 = first
    make_images(src, {"cat": {"new_a.jpg": image_bytes((1, 2, 3)),
                              "new_b.jpg": image_bytes((4, 5, 6))}})
    v2 = build([src], tmp_path / "root", *ARGS)
    inc = v2["manifest"]["incremental"]
    assert inc["from"] == v1["version"]
    assert (inc["unchanged"], inc["added"], inc["changed"], inc["removed"]) == (80, 2, 0, 0)
    assert inc["rewritten"]["shards"] == 0
    assert inc["reused"]["shards"] == sum(1 for s in v1["manifest"]["splits"].values()
                                         for sh in s["shards"] if sh["num_examples"])
    assert inc["reused"]["examples"] == 80 and inc["added_shards"]["examples"] == 2
    # Reused shards are the previous files, named where they are: no bytes copied.
    for split, info in v2["manifest"]["splits"].items():
        for shard in info["shards"]:
            if shard["origin"] == "hash":
                inode = os.stat(os.path.join(v2["version_dir"], shard["path"])).st_ino
                old = [os.stat(os.path.join(v1["version_dir"], s["path"])).st_ino
                       for s in v1["manifest"]["splits"][split]["shards"]]
                assert inode in old
    assert_same_as_full_build(v2, src, tmp_path)


def test_shards_reused_from_a_version_with_sha256_checksums_keep_them(first, tmp_path):
    """A version written before shards had a CRC-32C names each shard's sha256: a shard
    reused as it is keeps that checksum; shards written or copied now get a crc32c."""
    import hashlib

    from beam_pipeline.tools import verify
    from dataset_format import frames

    src, v1 = first
    path = os.path.join(v1["version_dir"], layout.MANIFEST)
    with open(path) as f:
        manifest = json.load(f)
    for info in manifest["splits"].values():
        for shard in info["shards"]:
            with open(os.path.join(v1["version_dir"], shard["path"]), "rb") as f:
                shard["sha256"] = hashlib.sha256(f.read()).hexdigest()
            del shard["crc32c"]
    with open(path, "w") as f:
        json.dump(manifest, f)
    os.remove(src / "owl" / "000.jpg")  # its shard is copied without it
    make_images(src, {"cat": {"new_a.jpg": image_bytes((1, 2, 3))}})
    v2 = build([src], tmp_path / "root", *ARGS)
    inc = v2["manifest"]["incremental"]
    assert inc["reused"]["shards"] >= 1 and inc["rewritten"]["shards"] == 1
    checksums = set()
    for info in v2["manifest"]["splits"].values():
        for shard in info["shards"]:
            with open(os.path.join(v2["version_dir"], shard["path"]), "rb") as f:
                data = f.read()
            if "sha256" in shard:  # reused as it was
                assert "crc32c" not in shard and hashlib.sha256(data).hexdigest() == shard["sha256"]
                checksums.add("sha256")
            else:
                assert shard["crc32c"] == frames.file_crc32c(data)
                checksums.add("crc32c")
    assert checksums == {"sha256", "crc32c"}
    assert verify.verify(v2["root"]) == []


def test_deleting_images_copies_survivors_without_decoding(first, tmp_path):
    src, v1 = first
    for name in ("cat/003.jpg", "dog/010.jpg", "owl/000.jpg"):
        os.remove(src / name)
    v2 = build([src], tmp_path / "root", *ARGS)
    inc = v2["manifest"]["incremental"]
    assert (inc["unchanged"], inc["added"], inc["removed"]) == (77, 0, 3)
    assert inc["rewritten"]["shards"] >= 1 and inc["added_shards"]["shards"] == 0
    assert v2["manifest"]["accounting"]["written"] == 77
    assert_same_as_full_build(v2, src, tmp_path)


def test_files_changed_in_place_are_converted_again(first, tmp_path):
    src, v1 = first
    (src / "dog" / "004.jpg").write_bytes(image_bytes((9, 9, 9), size=(30, 20)))
    os.utime(src / "dog" / "004.jpg", (time.time() + 5, time.time() + 5))
    v2 = build([src], tmp_path / "root", *ARGS)
    inc = v2["manifest"]["incremental"]
    assert (inc["changed"], inc["added"], inc["removed"]) == (1, 0, 0)
    stored = examples(v2)["dog/004.jpg"][1]
    assert image_bytes((9, 9, 9), size=(30, 20)) in stored
    assert_same_as_full_build(v2, src, tmp_path)


def test_a_new_class_is_appended_and_ids_never_move(first, tmp_path):
    src, v1 = first
    make_images(src, {"ant": 3})
    v2 = build([src], tmp_path / "root", *ARGS)
    assert v2["manifest"]["labels"] == ["cat", "dog", "owl", "ant"]
    assert v2["manifest"]["incremental"]["added"] == 3
    v1_examples = examples(v1)
    v2_examples = examples(v2)
    assert all(v2_examples[k] == v for k, v in v1_examples.items())  # ids and splits kept
    full = build([src], tmp_path / "full", *ARGS)  # a fresh root sorts ant first...
    assert full["manifest"]["labels"] == ["ant", "cat", "dog", "owl"]
    # ...so the reference is a full rebuild on the same root, which keeps existing ids.
    again = build([src], tmp_path / "root", *ARGS, "--full_rebuild", "--force")
    assert "incremental" not in again["manifest"]
    assert examples(again) == v2_examples


def test_full_rebuild_and_compaction(first, tmp_path):
    src, v1 = first
    make_images(src, {"cat": {f"x{i}.jpg": image_bytes((i, 1, 1)) for i in range(40)}})
    # 40 new of 120: delta shards would hold a third of the split > --max_delta_share 0.25
    v2 = build([src], tmp_path / "root", *ARGS)
    assert "incremental" not in v2["manifest"]
    assert {s["origin"] for i in v2["manifest"]["splits"].values() for s in i["shards"]} == {
        "hash"}
    make_images(src, {"cat": {"y.jpg": image_bytes((7, 1, 1))}})
    v3 = build([src], tmp_path / "root", *ARGS, "--full_rebuild")
    assert "incremental" not in v3["manifest"]
    assert_same_as_full_build(v3, src, tmp_path)


def test_retention_keeps_reused_shards_readable(first, tmp_path):
    import readers

    src, v1 = first
    make_images(src, {"owl": {"late.jpg": image_bytes((3, 3, 3))}})
    v2 = build([src], tmp_path / "root", *ARGS, "--keep_versions", "1", "--keep_superseded_hours", "0")
    # The version it shares shards with is gone but for those shards and their indexes.
    shared = {sh["path"].split("/")[2] for i in v2["manifest"]["splits"].values()
              for sh in i["shards"] if sh["path"].startswith(f"../{v1['version']}/")}
    assert shared and set(os.listdir(v1["version_dir"])) == shared | {
        layout.index_name(n) for n in shared}
    check_invariants(v2)
    meta = readers.info(v2["root"])
    n = sum(1 for _ in readers.make_dataset(meta, "train", batch_size=1, training=False))
    assert n == meta.splits["train"].num_examples > 0


def test_a_killed_incremental_run_leaves_latest_alone(first, tmp_path):
    src, v1 = first
    make_images(src, {"dog": {f"k{i}.jpg": image_bytes((i, 2, 2)) for i in range(3)}})
    latest = (tmp_path / "root" / layout.LATEST).read_bytes()
    proc = subprocess.Popen(
        [sys.executable, "-m", "beam_pipeline", "--input", str(src), "--output",
         str(tmp_path / "root"), *ARGS], cwd=REPO, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    versions_dir = tmp_path / "root" / layout.VERSIONS
    # Killed as soon as it claims its version directory: seconds before it could publish.
    while time.time() < deadline and len(os.listdir(versions_dir)) < 2:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (tmp_path / "root" / layout.LATEST).read_bytes() == latest
    v2 = build([src], tmp_path / "root", *ARGS, "--wait")
    assert v2["manifest"]["incremental"]["from"] == v1["version"]
    assert_same_as_full_build(v2, src, tmp_path)


def test_incremental_on_gcs(gcs, gcs_bucket, tmp_path):
    src = tmp_path / "src"
    make_images(src, {"cat": 12, "dog": 10})
    base = f"gs://{gcs_bucket}/in"
    gcs.upload_tree(src, base)
    root = f"gs://{gcs_bucket}/ds"
    v1 = build([base], root, *ARGS)
    gcs.upload_bytes(f"{base}/dog/new.jpg", image_bytes((5, 50, 5)))
    v2 = build([base], root, *ARGS)
    inc = v2["manifest"]["incremental"]
    assert inc["from"] == v1["version"]
    assert (inc["unchanged"], inc["added"], inc["removed"]) == (22, 1, 0)
    assert inc["reused"]["shards"] >= 2 and inc["bytes_reused_share"] > 0.8
    objects = gcs.list(f"{root}/")
    for split, info in v2["manifest"]["splits"].items():
        for shard in info["shards"]:
            uri = layout.shard_file(f"{root}/versions/{v2['version']}", shard["path"])
            assert objects[uri] == shard["num_bytes"]
    assert not [u for u in objects if "/.tmp/" in u]


# --- content duplicates ---------------------------------------------------------------------

def test_content_duplicates_are_reported_then_dropped(tmp_path, capsys):
    from beam_pipeline.tools import verify

    src = tmp_path / "src"
    make_images(src, {"cat": 12, "dog": 12})
    same = image_bytes((10, 20, 30))
    # One image three times (two classes), another twice; their splits come from the hash.
    make_images(src, {"cat": {"a.jpg": same, "b.jpg": same}, "dog": {"c.jpg": same},
                      "owl": {"d.jpg": image_bytes((1, 1, 1)), "e.jpg": image_bytes((1, 1, 1))}})
    kept = build([src], tmp_path / "kept", *ARGS)
    entry = kept["manifest"]["content_duplicates"]
    lines = [json.loads(l) for l in
             (tmp_path / "kept" / "versions" / kept["version"] / "duplicates.jsonl").open()]
    assert sorted(g["keys"] for g in lines) == [["cat/a.jpg", "cat/b.jpg", "dog/c.jpg"],
                                                ["owl/d.jpg", "owl/e.jpg"]]
    spans = sum(len(set(g["splits"])) > 1 for g in lines)
    assert entry == {"groups": 2, "across_splits": spans, "path": "duplicates.jsonl",
                     "dropped": 0}
    assert kept["manifest"]["accounting"]["written"] == 29
    result = verify.check(kept["root"])
    assert result["problems"] == []
    assert bool(result["warnings"]) == bool(spans)

    dropped = build([src], tmp_path / "dropped", *ARGS, "--drop_content_duplicates")
    m = check_invariants(dropped)
    assert m["content_duplicates"]["dropped"] == 3
    assert m["accounting"] == dict(m["accounting"], listed=29, duplicates=3, written=26)
    keys = set(examples(dropped))
    assert {"cat/a.jpg", "owl/d.jpg"} <= keys and not {"cat/b.jpg", "dog/c.jpg",
                                                       "owl/e.jpg"} & keys
    assert verify.check(dropped["root"])["problems"] == []
