"""End-to-end pipeline tests on the DirectRunner, through beam_pipeline.cli.run."""

import collections
import csv
import hashlib
import json
import os
import pathlib

import pytest

from beam_pipeline import cli
from beam_pipeline.errors import UserError
from dataset_format import layout, schema
from tests.helpers import (BROKEN_REASONS, BUILT_ARGS, CLASS_COLOURS, FAST, REPO, build,
                           check_invariants, errors_of, image_bytes, make_images, read_records,
                           shard_files)


def all_records(result):
    """{(split, shard file): [record]} of a build result (tests.helpers.read_records)."""
    return read_records(result["version_dir"], result["manifest"])


# --- the shared build (sample_data, 3 classes x 12 images + 3 broken files) --------------------

def test_manifest_invariants(built_dataset):
    m = check_invariants(built_dataset)
    assert m["format_version"] == 3 and m["name"] == "shapes"
    assert m["version"] == built_dataset["version"]
    assert m["labels"] == ["circle", "square", "triangle"] and m["label_offset"] == 0
    assert m["features"] == schema.FEATURES
    assert m["accounting"]["listed"] == 39 and m["accounting"]["written"] == 36
    assert m["accounting"]["failed"] == 3 and m["accounting"]["duplicates"] == 0
    # Keys are paths relative to the input root ("circle/circle_000.jpg"), so the hashed splits
    # are the same on every run and every machine (rules.assign_split, pinned in
    # test_records_plan.py), and each split gets its 2 shards.
    assert {s: info["num_examples"] for s, info in m["splits"].items()} == {
        "train": 26, "validation": 5, "test": 5}
    assert all(len(s["shards"]) == 2 for s in m["splits"].values())
    assert built_dataset["version_dir"] == layout.version_dir(built_dataset["root"], m["version"])


def test_errors_jsonl_dead_letter(built_dataset):
    errors = errors_of(built_dataset)
    by_name = {os.path.basename(e["uri"]): e for e in errors}
    assert len(errors) == len(by_name) == 3
    assert {n: e["reason"] for n, e in by_name.items()} == BROKEN_REASONS
    for e in errors:
        assert set(e) == {"uri", "stage", "reason", "detail"}
        assert e["stage"] in ("read", "decode", "convert", "encode") and e["detail"]
        assert os.path.exists(e["uri"])
    assert built_dataset["manifest"]["errors"]["by_reason"] == collections.Counter(
        BROKEN_REASONS.values())


def test_every_record_reads_back(built_dataset):
    m = built_dataset["manifest"]
    seen_files, label_counts = set(), collections.defaultdict(collections.Counter)
    for (split, path), recs in all_records(built_dataset).items():
        shard = next(s for s in m["splits"][split]["shards"] if s["path"] == path)
        assert len(recs) == shard["num_examples"]
        for r in recs:
            assert r["_decoded_shape"] == (r[schema.HEIGHT], r[schema.WIDTH], 3)
            assert r[schema.CHANNELS] == 3
            assert r[schema.FORMAT] == b"JPEG" and r[schema.COLORSPACE] == b"RGB"
            text = r[schema.TEXT].decode()
            assert m["labels"][r[schema.LABEL]] == text
            filename = r[schema.FILENAME].decode()
            assert filename.split("/")[0] == text and not filename.startswith("/")
            assert hashlib.sha256(r[schema.ENCODED]).hexdigest().encode() == r[schema.SHA256]
            seen_files.add(filename)
            label_counts[split][text] += 1
    assert len(seen_files) == m["accounting"]["written"]  # each image once, none lost
    for split, info in m["splits"].items():
        assert {k: v for k, v in info["label_counts"].items() if v} == dict(label_counts[split])
    # Every sample image (all 12 variants x 3 classes) is in there; broken ones are not.
    on_disk = {f"{c}/{n}" for c in m["labels"]
               for n in os.listdir(os.path.join(built_dataset["input"], c))
               if n not in BROKEN_REASONS}
    assert seen_files == on_disk


def test_exif_sample_stored_upright(built_dataset):
    # Each record has its source's upright size: sample_data's "exif" variant is stored rotated
    # with Orientation=6, so its record swaps the stored width and height.
    from PIL import Image

    recs = [r for rs in all_records(built_dataset).values() for r in rs]
    for r in recs:
        name = r[schema.FILENAME].decode()
        src = Image.open(os.path.join(built_dataset["input"], name))
        w, h = src.size
        if src.getexif().get(0x0112) in (5, 6, 7, 8):
            w, h = h, w
        assert (r[schema.WIDTH], r[schema.HEIGHT]) == (w, h), name


def test_shards_are_class_mixed(built_dataset):
    records_by_shard = all_records(built_dataset)
    train = [recs for (split, _), recs in records_by_shard.items() if split == "train"]
    assert len(train) == 2 and all(train)
    for recs in train:
        labels = [r[schema.LABEL] for r in recs]
        assert len(set(labels)) >= 2, labels
        assert labels != sorted(labels), "records are grouped by class"
    for (split, path), recs in records_by_shard.items():
        if len(recs) >= 4:
            assert len({r[schema.LABEL] for r in recs}) >= 2, (split, path)


def test_index_files_match_records(built_dataset):
    vdir = built_dataset["version_dir"]
    for split, shard in shard_files(built_dataset):
        data = pathlib.Path(vdir, shard["path"]).read_bytes()
        lines = pathlib.Path(vdir, layout.index_name(shard["path"])).read_text().split()
        pairs = list(zip(map(int, lines[::2]), map(int, lines[1::2])))
        assert len(pairs) == shard["num_examples"]
        assert sum(n for _, n in pairs) == len(data)
        for offset, n in pairs:
            length = int.from_bytes(data[offset:offset + 8], "little")
            assert n == length + 16


@pytest.mark.slow
def test_deterministic_rebuild_by_worker_processes(built_dataset, tmp_path):
    """The same inputs built again, by two worker processes this time (configs/local.yaml
    with multi_processing): byte-identical shards and the same rejects; and the shards
    really were written by more than one process (the manifest counts the distinct writers).
    """
    again = build(built_dataset["input"], tmp_path / "mp", "--config",
                  REPO / "configs" / "local.yaml", "--direct_num_workers", "2",
                  "--direct_running_mode", "multi_processing", *BUILT_ARGS)
    check_invariants(again)
    first = [(s, sh["path"], sh["crc32c"]) for s, sh in shard_files(built_dataset)]
    assert [(s, sh["path"], sh["crc32c"]) for s, sh in shard_files(again)] == first
    assert (sorted(errors_of(again), key=json.dumps)
            == sorted(errors_of(built_dataset), key=json.dumps))
    assert len(first) >= 2
    assert built_dataset["manifest"]["build"]["writer_processes"] == 1  # in-process
    assert again["manifest"]["build"]["writer_processes"] >= 2
    threads = build(built_dataset["input"], tmp_path / "mt", "--config",
                    REPO / "configs" / "local.yaml", "--direct_num_workers", "2", *BUILT_ARGS)
    assert [(s, sh["path"], sh["crc32c"]) for s, sh in shard_files(threads)] == first
    assert threads["manifest"]["build"]["writer_processes"] == 1  # two threads, one process


# --- small dedicated builds --------------------------------------------------------------------

@pytest.mark.slow
def test_duplicates_written_once(tmp_path):
    """A manifest that lists one file several times (however spelled) writes it once."""
    src = tmp_path / "src"
    make_images(src, {"cat": 3, "dog": 2})
    rows = ["uri,label"] + [f"{c}/{i:03d}.jpg,{c}" for c, n in (("cat", 3), ("dog", 2))
                            for i in range(n)]
    rows += ["cat/000.jpg,cat", "./cat/000.jpg,cat", f"{src}/dog/001.jpg,dog"]
    (src / "list.csv").write_text("\n".join(rows) + "\n")
    result = build([src / "list.csv"], tmp_path / "out", *FAST)
    m = check_invariants(result)
    assert m["accounting"] == dict(m["accounting"], listed=8, duplicates=3, failed=0,
                                   written=5)
    names = [r[schema.FILENAME].decode() for rs in all_records(result).values() for r in rs]
    assert sorted(names) == ["cat/000.jpg", "cat/001.jpg", "cat/002.jpg", "dog/000.jpg",
                             "dog/001.jpg"]


def test_inputs_with_one_name_are_a_usage_error(tmp_path):
    """Two inputs whose keys would collide never merge silently: exit 2, naming both."""
    a, b = tmp_path / "a" / "photos", tmp_path / "b" / "photos"
    make_images(a, {"cat": 1})
    make_images(b, {"cat": 1})
    with pytest.raises(UserError, match=f"--input {a} and --input {b} .*'photos'"):
        cli.run(["--input", str(a), "--input", str(b), "--output", str(tmp_path / "out")])
    assert not (tmp_path / "out" / "versions").exists()


@pytest.mark.slow
def test_split_layout_fixes_splits(tmp_path):
    src = tmp_path / "src"
    make_images(src, {"train/cat": 3, "train/dog": 2, "validation/cat": 1, "validation/dog": 1,
                      "test/dog": 2})
    # The fractions would send everything to train; the layout wins.
    result = build([src], tmp_path / "out", "--splits", "train=1", *FAST)
    m = check_invariants(result)
    assert m["labels"] == ["cat", "dog"]
    assert {s: info["label_counts"] for s, info in m["splits"].items()} == {
        "train": {"cat": 3, "dog": 2}, "validation": {"cat": 1, "dog": 1},
        "test": {"cat": 0, "dog": 2}}
    for (split, _), recs in all_records(result).items():
        for r in recs:
            assert r[schema.FILENAME].decode().startswith(f"{split}/")


@pytest.mark.slow
def test_csv_and_jsonl_manifests(tmp_path):
    data = tmp_path / "data"
    make_images(data, {"imgs": 6})
    csv_path = data / "list.csv"
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["uri", "label", "split"])
        w.writerow(["imgs/000.jpg", "cat", "train"])
        w.writerow(["imgs/001.jpg", "dog", "test"])
        w.writerow(["imgs/002.jpg", "cat", ""])          # no split: hashed
        w.writerow(["imgs/missing.jpg", "dog", "train"])
    sub = tmp_path / "elsewhere"
    sub.mkdir()
    jsonl_path = sub / "more.jsonl"
    jsonl_path.write_text(
        json.dumps({"uri": "../data/imgs/003.jpg", "label": "fox", "split": "validation"}) + "\n"
        + json.dumps({"uri": str(data / "imgs" / "004.jpg"), "label": "dog",
                      "split": "train"}) + "\n\n"
        + json.dumps({"uri": "gone.png", "label": "fox"}) + "\n")
    result = build([csv_path, jsonl_path], tmp_path / "out", "--max_error_rate", "0.5",
                   "--splits", "train=1", *FAST)
    m = check_invariants(result)
    assert m["labels"] == ["cat", "dog", "fox"]
    assert m["accounting"] == dict(m["accounting"], listed=7, failed=2, written=5, duplicates=0)
    errors = errors_of(result)
    assert sorted(os.path.basename(e["uri"]) for e in errors) == ["gone.png", "missing.jpg"]
    assert {e["reason"] for e in errors} == {"not_found"}
    got = {r[schema.FILENAME].decode(): (split, r[schema.TEXT].decode())
           for (split, _), rs in all_records(result).items() for r in rs}
    # Keys: '<manifest name>/' + the uri as written when relative, else relative to the
    # manifest's folder where it lies there, else the path without its leading '/'.
    assert got == {"list/imgs/000.jpg": ("train", "cat"), "list/imgs/001.jpg": ("test", "dog"),
                   "list/imgs/002.jpg": ("train", "cat"),
                   "more/../data/imgs/003.jpg": ("validation", "fox"),
                   "more/" + str(data / "imgs" / "004.jpg").lstrip("/"): ("train", "dog")}


@pytest.mark.slow
def test_same_file_via_two_manifests_is_one_image(tmp_path):
    # 'imgs/000.jpg' from data/ and '../data/imgs/000.jpg' from lists/ are the same file: it is
    # written once (and cannot land in two splits), under the key that sorts first, and a
    # different label for it is a conflict, not a second image.
    data, lists = tmp_path / "data", tmp_path / "lists"
    make_images(data, {"imgs": 2})
    lists.mkdir()
    (data / "a.csv").write_text("uri,label\nimgs/000.jpg,cat\nimgs/001.jpg,dog\n")
    (lists / "b.jsonl").write_text(
        json.dumps({"uri": "../data/imgs/000.jpg", "label": "cat"}) + "\n"
        + json.dumps({"uri": "../data/./imgs/001.jpg", "label": "fox"}) + "\n")
    result = build([data / "a.csv", lists / "b.jsonl"], tmp_path / "out",
                   "--max_error_rate", "0.5", *FAST)
    m = check_invariants(result)
    assert m["accounting"] == dict(m["accounting"], listed=4, duplicates=1, failed=1, written=2)
    names = sorted(r[schema.FILENAME].decode() for rs in all_records(result).values() for r in rs)
    assert names == ["a/imgs/000.jpg", "a/imgs/001.jpg"]
    assert [e["reason"] for e in errors_of(result)] == ["conflicting_duplicate"]


@pytest.mark.slow
def test_label_file_unknown_class(tmp_path):
    src = tmp_path / "src"
    make_images(src, {"cat": 2, "dog": 2, "owl": 1})
    labels = tmp_path / "labels.txt"
    labels.write_text("dog\ncat\nfox\n")
    result = build([src], tmp_path / "out", "--label_file", str(labels),
                   "--max_error_rate", "0.5", *FAST)
    m = check_invariants(result)
    assert m["labels"] == ["dog", "cat", "fox"]
    errors = errors_of(result)
    assert [(os.path.basename(os.path.dirname(e["uri"])), e["reason"]) for e in errors] == [
        ("owl", "unknown_label")]
    for recs in all_records(result).values():
        for r in recs:
            assert m["labels"][r[schema.LABEL]] == r[schema.TEXT].decode()
            assert r[schema.LABEL] == {"dog": 0, "cat": 1}[r[schema.TEXT].decode()]


@pytest.mark.slow
def test_max_side_resizes(tmp_path):
    src = tmp_path / "src"
    make_images(src, {"cat": 2}, size=(64, 40))
    make_images(src, {"dog": {"small.jpg": image_bytes(CLASS_COLOURS["dog"], (16, 10))}})
    result = build([src], tmp_path / "out", "--max_side", "32", *FAST)
    check_invariants(result)
    sizes = {r[schema.FILENAME].decode(): (r[schema.WIDTH], r[schema.HEIGHT], r["_decoded_shape"])
             for rs in all_records(result).values() for r in rs}
    assert sizes == {"cat/000.jpg": (32, 20, (20, 32, 3)), "cat/001.jpg": (32, 20, (20, 32, 3)),
                     "dog/small.jpg": (16, 10, (10, 16, 3))}
    assert result["manifest"]["accounting"]["passed_through"] == 1


@pytest.mark.slow
def test_max_error_rate_exceeded_publishes_nothing(tmp_path):
    src = tmp_path / "src"
    make_images(src, {"cat": 3, "dog": 2})
    make_images(src, {"cat": {"empty.jpg": b"", "text.jpg": b"not an image\n"}})
    root = tmp_path / "out"
    with pytest.raises(Exception) as info:
        cli.run(["--input", str(src), "--output", str(root), "--max_error_rate", "0.1", *FAST])
    assert "max_error_rate" in str(info.value)
    assert not (root / layout.LATEST).exists()
    (vdir,) = (root / layout.VERSIONS).iterdir()
    assert not (vdir / layout.MANIFEST).exists()
    errors = errors_of(str(vdir))
    assert sorted(e["reason"] for e in errors) == ["empty_file", "not_an_image"]
    # The writers put their shards under their final names, but nothing a reader could
    # pick up names them: no manifest.json (above), no LATEST; the next build deletes them.
    assert [p.name for p in vdir.iterdir() if p.name.endswith(".tfrecord-00000-of-00001")]


@pytest.mark.slow
def test_rebuild_unchanged_is_up_to_date_and_changed_keeps_label_ids(tmp_path):
    src, root = tmp_path / "src", tmp_path / "out"
    make_images(src, {"dog": 2, "fox": 1})
    first = build([src], root, *FAST)
    assert first["manifest"]["labels"] == ["dog", "fox"]
    assert cli.run(["--input", str(src), "--output", str(root), *FAST]).status == "up_to_date"
    make_images(src, {"cat": 1})  # sorts first, but existing ids must not move
    second = build([src], root, *FAST)
    assert second["version"] > first["version"]
    m = check_invariants(second)
    assert m["labels"] == ["dog", "fox", "cat"]
    assert json.loads((root / layout.LATEST).read_text())["version"] == second["version"]
