"""Splits are sticky for life, and change detection cannot be fooled.

* An example published in a split stays there in every later version: when its key
  changes (an input added, a manifest renamed, a folder moved, a class folder changed)
  and when its bytes turn up under a new name. Only --resplit starts over.
* "Unchanged" is size + mtime_ns + ctime_ns locally (a gs:// object's generation), and
  a same-size file with another stamp is hashed: cp -p / rsync -a / tar cannot hide new
  bytes, and the "up to date" fingerprint trusts nothing more.
* Moved or renamed images are re-framed from their stored JPEG bytes, not decoded.
"""

import csv
import dataclasses
import hashlib
import json
import os
import shutil
import time

import pytest

from beam_pipeline.launcher import identity, rules
from beam_pipeline.refs import ImageRef
from beam_pipeline.algorithms.spill import SortedSpill
from dataset_format import layout, schema
from tests.helpers import build, check_invariants, image_bytes, make_images, read_records

SPLITS = rules.parse_splits("train=0.8,validation=0.1,test=0.1")
ARGS = ["--name", "pets", "--target_shard_mb", "0.01", "--no_transform"]


# --- pure: re-framing and identity ------------------------------------------------------------

def test_a_reframed_record_is_byte_identical_to_a_converted_one():
    from beam_pipeline.job import images, records, reframe

    encoded = images.convert(image_bytes((10, 200, 30)))
    stored = records.make_example(encoded, 0, "cat", "photos/cat/a.jpg")
    again, features = reframe.reframe(stored, "scans/dog/b.jpg", 7, "dog")
    assert again == records.make_example(encoded, 7, "dog", "scans/dog/b.jpg")
    assert features[schema.ENCODED] == encoded.data
    assert (features[schema.HEIGHT], features[schema.WIDTH]) == (encoded.height, encoded.width)


def _by_key(refs, tmp_path):
    spill = SortedSpill(str(tmp_path))
    for ref in refs:
        spill.add(json.dumps(ref.key), ref.to_json())
    return spill


def _row(key, split, size, stamp, sha, label="cat", uri=None):
    return {"key": key, "uri": uri or f"/before/{key}", "label": label, "split": split,
            "input_size": size, "input_stamp": stamp, "input_sha256": sha, "file": "f",
            "offset": 0, "length": 1}


def _resolve(refs, rows, tmp_path, **kw):
    resolved = identity.resolve(_by_key(refs, tmp_path), rows, SPLITS, str(tmp_path), **kw)
    return {ref.key: (ref, row) for ref, row in resolved.refs()}, resolved.counts


def _not_split(key, split):
    """A key whose hash does not give `split` (so a kept split shows it was remembered)."""
    for i in range(100):
        if rules.assign_split(f"{i}{key}", SPLITS) != split:
            return f"{i}{key}"


def test_a_same_key_with_the_same_stamp_is_not_read_and_another_stamp_is_hashed(tmp_path):
    data = image_bytes((1, 2, 3))
    (tmp_path / "a.jpg").write_bytes(data)
    sha = identity.input_sha256(str(tmp_path / "a.jpg"))
    rows = [_row("a.jpg", "test", len(data), "1:1", sha),
            _row("b.jpg", "test", len(data), "1:1", sha)]
    refs = [ImageRef("a.jpg", str(tmp_path / "a.jpg"), "cat", None, len(data), "1:2"),
            ImageRef("b.jpg", str(tmp_path / "gone.jpg"), "cat", None, len(data), "1:1")]
    got, counts = _resolve(refs, rows, tmp_path)
    # b: same size and stamp, so not read (its uri does not even exist); a: read, same bytes
    assert (counts["unchanged"], counts["hashed"]) == (2, 1)
    assert got["a.jpg"][1]["key"] == "a.jpg" and got["a.jpg"][0].split == "test"
    _, counts = _resolve(refs, rows, tmp_path, verify=True)
    assert (counts["unchanged"], counts["changed"], counts["hashed"]) == (1, 1, 2)


def test_a_same_key_with_another_generation_and_the_same_md5_is_the_same_bytes(tmp_path):
    """gs:// keys of the same size under another generation: their md5 decides, without a
    read (none of these uris exists). a: the same md5, unchanged, its record reused in its
    stored split; b: the same md5 relabelled, changed (re-framed); c: another md5, new
    bytes (its key's hash)."""
    md5s = [f"{c * 22}==" for c in "abc"]
    rows = [dict(_row(k, "test", 500, "gen:1", "ab" * 32), input_md5="a" * 22 + "==")
            for k in ("a.jpg", "b.jpg", "c.jpg")]
    refs = [ImageRef("a.jpg", "gs://gone/a.jpg", "cat", None, 500, "gen:2", md5=md5s[0]),
            ImageRef("b.jpg", "gs://gone/b.jpg", "dog", None, 500, "gen:2", md5=md5s[0]),
            ImageRef("c.jpg", "gs://gone/c.jpg", "cat", None, 500, "gen:2", md5=md5s[2])]
    got, counts = _resolve(refs, rows, tmp_path)
    assert (counts["unchanged"], counts["changed"], counts["hashed"]) == (1, 2, 0)
    assert got["a.jpg"][0].split == "test" and got["a.jpg"][0].sha256 == "ab" * 32
    assert got["a.jpg"][1]["key"] == "a.jpg"  # its stored record, to reuse
    assert got["b.jpg"][0].split == "test" and got["b.jpg"][1]["key"] == "b.jpg"
    assert got["c.jpg"][1] is None and got["c.jpg"][0].sha256 is None


def test_a_new_key_with_stored_content_keeps_its_split(tmp_path):
    data, other = image_bytes((1, 2, 3)), image_bytes((200, 100, 50), size=(30, 20))
    (tmp_path / "x.jpg").write_bytes(data)
    (tmp_path / "y.jpg").write_bytes(other)
    sha = identity.input_sha256(str(tmp_path / "x.jpg"))
    moved, new = _not_split("moved/x.jpg", "test"), "new/y.jpg"
    same_file = _not_split("in0/z.jpg", "validation")
    rows = [_row("old/x.jpg", "test", len(data), "1:1", sha),
            _row("z.jpg", "validation", 7, "3:3", "ab" * 32, uri="/in0/z.jpg")]
    refs = [ImageRef(moved, str(tmp_path / "x.jpg"), "dog", None, len(data), "5:5"),
            ImageRef(new, str(tmp_path / "y.jpg"), "dog", None, len(other), "5:5"),
            ImageRef("fixed/x.jpg", str(tmp_path / "x.jpg"), "dog", "validation", len(data),
                     "5:5"),
            ImageRef(same_file, "/in0/z.jpg", "cat", None, 7, "3:3")]
    got, counts = _resolve(refs, rows, tmp_path)
    assert got[moved][0].split == "test" and got[moved][1]["key"] == "old/x.jpg"
    assert got[moved][0].sha256 == sha
    assert got[new] == (got[new][0], None)
    assert got[new][0].split == rules.assign_split(new, SPLITS)
    assert got["fixed/x.jpg"][0].split == "validation"  # a split folder or column wins
    # The same file (uri, size, stamp) under a new key: an input added. Not even read.
    assert got[same_file][0].split == "validation" and got[same_file][1]["key"] == "z.jpg"
    assert (counts["moved"], counts["added"], counts["removed"]) == (3, 1, 2)
    assert counts["hashed"] == 2  # y.jpg has a size no stored input has: never read
    # No split map (a new root, or --resplit): every split from the key hash.
    got, _ = _resolve(refs, None, tmp_path)
    assert got[moved][0].split == rules.assign_split(moved, SPLITS)


def test_a_gs_input_is_found_in_the_split_map_by_its_md5_without_a_read(tmp_path,
                                                                         gcs_without_objects):
    """Content only an older version held, back under a new key on gs://: the split map's
    md5 gives its split; none of these uris exists, so any hash would count and fail."""
    import base64

    from beam_pipeline.store import split_map

    def md5(i):
        return base64.b64encode(hashlib.md5(bytes([i])).digest()).decode()

    shas = [hashlib.sha256(bytes([i])).hexdigest() for i in range(3)]
    smap = split_map.from_columns(shas, [500, 600, 700], ["test", "validation", "train"],
                                  input_md5=[md5(0), md5(1), None])
    back, new, local = (_not_split("back/a.jpg", "test"), "new/b.jpg", "local/c.jpg")
    refs = [ImageRef(back, "gs://gone/a.jpg", "cat", None, 500, "gen:9", md5=md5(0)),
            ImageRef(new, "gs://gone/b.jpg", "cat", None, 600, "gen:9", md5=md5(5)),
            ImageRef(local, str(tmp_path / "c.jpg"), "cat", None, 700, "1:1")]
    row = _row("other.jpg", "train", 1, "1:1", "cd" * 32)
    got, counts = _resolve(refs, [row], tmp_path, split_map=smap)
    assert got[back][0].split == "test" and counts["restored"] == 1
    # b: the map knows an md5 for every 600-byte content, and b's is none of them: new.
    assert got[new][0].split == rules.assign_split(new, SPLITS) and counts["added"] == 2
    # c has no md5 (a local file): a 700-byte content was published, so it is hashed.
    assert counts["hashed"] == 1
    # A map written before md5s: b's size is all it can go by, so b is hashed too.
    older = dataclasses.replace(smap, md5s=None)
    got, counts = _resolve(refs, [row], tmp_path, split_map=older)
    assert counts["hashed"] == 3 and got[back][0].split == rules.assign_split(back, SPLITS)
    _, counts = _resolve(refs, [row], tmp_path, split_map=smap, verify=True)
    assert counts["hashed"] == 3


# --- builds ------------------------------------------------------------------------------------

def catalog_of(result):
    """{key: catalog row} of a published version (local or gs://)."""
    from beam_pipeline.store import catalog

    rows = catalog.iter_rows(layout.join(result["version_dir"], layout.CATALOG))
    return {r["key"]: r for r in rows}


def stored(result):
    """{key: (split, label text, stored image bytes)} read back from the shards."""
    out = {}
    for (split, _), records in read_records(result["version_dir"]).items():
        for r in records:
            out[r[schema.FILENAME].decode()] = (split, r[schema.TEXT].decode(),
                                                r[schema.ENCODED])
    return out


def same_as_full_build(result, tmp_path):
    """The version equals a full build of the same files with the same split map: a
    --full_rebuild on a copy of its root (the split map is the version itself)."""
    copy = tmp_path / f"full-{result['version']}"
    shutil.copytree(result["root"], copy)
    full = build(result["inputs"], copy, *ARGS, "--full_rebuild", "--force")
    assert full["manifest"]["build"]["reframed"] == 0
    assert stored(full) == stored(result)
    return full


def built(inputs, root, *args, expect="published"):
    result = build(inputs, root, *ARGS, *args, expect=expect)
    return dict(result, inputs=inputs)


@pytest.mark.slow
def test_adding_a_second_input_moves_no_example_and_decodes_only_the_new_one(tmp_path):
    first = tmp_path / "photos"
    make_images(first, {"cat": 100, "dog": 100, "owl": 100})
    v1 = built([first], tmp_path / "root")
    before = catalog_of(v1)
    # Some files share their bytes (clipped colours): the same file is matched, not a copy.
    assert len({r["input_sha256"] for r in before.values()}) < len(before)
    second = tmp_path / "scans"
    make_images(second, {"cat": {"s.jpg": image_bytes((5, 6, 7))}})
    v2 = built([first, second], tmp_path / "root")
    after = catalog_of(v2)
    assert set(after) == {f"photos/{k}" for k in before} | {"scans/cat/s.jpg"}
    moved = [k for k in before if after[f"photos/{k}"]["split"] != before[k]["split"]]
    assert moved == []  # before: ~1/3 of them changed split, the key hash having changed
    # ...and the key hash would have moved many of them: the splits were remembered.
    assert sum(rules.assign_split(f"photos/{k}", SPLITS) != r["split"]
               for k, r in before.items()) > 50
    assert after["scans/cat/s.jpg"]["split"] == rules.assign_split("scans/cat/s.jpg", SPLITS)
    assert v2["manifest"]["build"] == dict(v2["manifest"]["build"], converted=1, reframed=300)
    check_invariants(v2)
    same_as_full_build(v2, tmp_path)


@pytest.mark.slow
def test_renaming_a_manifest_or_moving_a_folder_keeps_every_split(tmp_path):
    make_images(tmp_path / "img", {"cat": 15, "dog": 15})
    make_images(tmp_path / "more", {"owl": 3})

    def manifest(name):
        path = tmp_path / name
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["uri", "label"])
            for label in ("cat", "dog"):
                for i in range(15):
                    w.writerow([f"img/{label}/{i:03d}.jpg", label])
        return path

    v1 = built([manifest("batch1.csv"), tmp_path / "more"], tmp_path / "root")
    first = catalog_of(v1)
    os.rename(tmp_path / "batch1.csv", tmp_path / "renamed.csv")
    v2 = built([tmp_path / "renamed.csv", tmp_path / "more"], tmp_path / "root")
    second = catalog_of(v2)
    for key, row in first.items():
        new = key.replace("batch1/", "renamed/", 1)
        assert second[new]["split"] == row["split"], key
        assert second[new]["input_sha256"] == row["input_sha256"]
    assert v2["manifest"]["build"]["converted"] == 0
    os.rename(tmp_path / "more", tmp_path / "moved")  # the folder (and its key prefix) moves
    v3 = built([tmp_path / "renamed.csv", tmp_path / "moved"], tmp_path / "root")
    third = catalog_of(v3)
    for i in range(3):
        assert third[f"moved/owl/{i:03d}.jpg"]["split"] == first[f"more/owl/{i:03d}.jpg"]["split"]
    assert v3["manifest"]["build"]["converted"] == 0
    same_as_full_build(v3, tmp_path)


@pytest.mark.slow
def test_moving_an_image_to_another_class_relabels_it_in_its_split(tmp_path):
    src = tmp_path / "src"
    make_images(src, {"cat": 12, "dog": 12})
    v1 = built([src], tmp_path / "root")
    split = catalog_of(v1)["cat/004.jpg"]["split"]
    data = (src / "cat" / "004.jpg").read_bytes()
    os.rename(src / "cat" / "004.jpg", src / "dog" / "cat-004.jpg")
    v2 = built([src], tmp_path / "root")
    got = stored(v2)
    assert got["dog/cat-004.jpg"] == (split, "dog", data) and "cat/004.jpg" not in got
    inc = v2["manifest"]["incremental"]
    assert (inc["moved"], inc["removed"], inc["added"]) == (1, 1, 0)
    assert v2["manifest"]["build"]["converted"] == 0
    same_as_full_build(v2, tmp_path)


def same_size_pair():
    """Two different solid-colour JPEGs of equal size (deterministic search)."""
    seen = {}
    for i in range(256):
        data = image_bytes((i, 255 - i, 60))
        if len(data) in seen:
            return seen[len(data)], data
        seen[len(data)] = data
    raise AssertionError("no two same-size images")


@pytest.mark.slow
def test_bytes_replaced_with_the_same_size_and_mtime_are_seen(tmp_path, capsys):
    src = tmp_path / "src"
    make_images(src, {"cat": 10, "dog": 10})
    a, b = same_size_pair()
    make_images(src, {"cat": {"a.jpg": a}, "dog": {"b.jpg": b}})
    v1 = built([src], tmp_path / "root")
    # Swap them the way cp -p, rsync -a or tar would: other bytes, same size and mtime.
    times = {p: os.stat(p).st_mtime_ns for p in (src / "cat" / "a.jpg", src / "dog" / "b.jpg")}
    (src / "cat" / "a.jpg").write_bytes(b)
    (src / "dog" / "b.jpg").write_bytes(a)
    for path, ns in times.items():
        os.utime(path, ns=(ns, ns))
    v2 = built([src], tmp_path / "root")  # before: "up to date", and the old records forever
    got = stored(v2)
    assert got["cat/a.jpg"][2] == b and got["dog/b.jpg"][2] == a
    inc = v2["manifest"]["incremental"]
    assert (inc["changed"], inc["unchanged"]) == (2, 20)
    # A swap: each key holds the other's published bytes, which keep their splits and
    # records (re-framed under the other key and label, not decoded).
    first = stored(v1)
    assert (got["cat/a.jpg"][0], got["dog/b.jpg"][0]) == (first["dog/b.jpg"][0],
                                                          first["cat/a.jpg"][0])
    assert v2["manifest"]["build"] == dict(v2["manifest"]["build"], converted=0, reframed=2)
    same_as_full_build(v2, tmp_path)
    # Only the stamp moved (touch, chmod): read, found equal, nothing rebuilt.
    os.chmod(src / "cat" / "000.jpg", 0o600)
    v3 = built([src], tmp_path / "root")
    assert v3["manifest"]["incremental"]["unchanged"] == 22
    assert v3["manifest"]["build"]["converted"] == 0
    built([src], tmp_path / "root", expect="up_to_date")


@pytest.mark.slow
def test_verify_inputs_reads_every_input(tmp_path, monkeypatch, capsys):
    from beam_pipeline.launcher import stamps

    src = tmp_path / "src"
    make_images(src, {"cat": 6, "dog": 6})
    a, b = same_size_pair()
    make_images(src, {"cat": {"a.jpg": a}})
    monkeypatch.setattr(stamps, "local_stamp", lambda st: "blind")  # a stamp that lies
    built([src], tmp_path / "root")
    capsys.readouterr()
    built([src], tmp_path / "root", "--verify_inputs", expect="up_to_date")
    assert "every input's bytes verified" in capsys.readouterr().out
    (src / "cat" / "a.jpg").write_bytes(b)
    built([src], tmp_path / "root", expect="up_to_date")  # the lying stamp fools this one...
    v = built([src], tmp_path / "root", "--verify_inputs")  # ...not this one
    assert stored(v)["cat/a.jpg"][2] == b
    assert v["manifest"]["incremental"]["changed"] == 1


@pytest.mark.slow
def test_a_copied_tree_is_read_not_decoded_and_resplit_starts_over(tmp_path):
    src = tmp_path / "src"
    make_images(src, {"cat": 15, "dog": 15})
    v1 = built([src], tmp_path / "root")
    time.sleep(0.01)
    shutil.copytree(src, tmp_path / "copy")  # new inodes: new ctimes, the same bytes
    shutil.rmtree(src)
    v2 = built([tmp_path / "copy"], tmp_path / "root")
    inc = v2["manifest"]["incremental"]
    assert (inc["unchanged"], inc["changed"], inc["rewritten"]["shards"]) == (30, 0, 0)
    assert v2["manifest"]["build"]["converted"] == 0
    assert {r["uri"] for r in catalog_of(v2).values()} == {
        str(p) for p in (tmp_path / "copy").glob("*/*.jpg")}
    extra = tmp_path / "extra"
    make_images(extra, {"owl": 2})
    v3 = built([tmp_path / "copy", extra], tmp_path / "root")  # every key changes
    assert "incremental" not in v3["manifest"]  # all delta: compacted, yet nothing decoded
    assert v3["manifest"]["build"] == dict(v3["manifest"]["build"], converted=2, reframed=30)
    assert {k: r["split"] for k, r in catalog_of(v3).items() if k.startswith("copy/")} == {
        f"copy/{k}": r["split"] for k, r in catalog_of(v1).items()}
    same_as_full_build(v3, tmp_path)
    v4 = built([tmp_path / "copy", extra], tmp_path / "root", "--resplit")
    assert {k: r["split"] for k, r in catalog_of(v4).items()} == {
        k: rules.assign_split(k, SPLITS) for k in catalog_of(v3)}
    assert v4["manifest"]["build"]["reframed"] == 0


@pytest.mark.slow
def test_gcs_stamps_are_generations_not_local_times(gcs, gcs_bucket, tmp_path, monkeypatch):
    local = tmp_path / "in"
    make_images(local, {"cat": 3, "dog": 3})
    src, root = f"gs://{gcs_bucket}/in", f"gs://{gcs_bucket}/ds"
    gcs.upload_tree(local, src)
    manifest = tmp_path / "list.csv"  # a manifest of gs:// uris: each one is stat'ed
    manifest.write_text("uri,label\n" + "".join(
        f"{src}/{p.parent.name}/{p.name},{p.parent.name}\n" for p in sorted(local.glob("*/*"))))
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        v1 = build([manifest], root, *ARGS)
        # A time zone in daylight saving time today: Beam's mktime-based update times move
        # by an hour, which made every object look changed.
        monkeypatch.setenv("TZ", "Australia/Sydney")
        time.tzset()
        build([manifest], root, *ARGS, expect="up_to_date")
    finally:
        monkeypatch.undo()
        time.tzset()
    rows = catalog_of(v1)
    assert {r["input_stamp"].split(":")[0] for r in rows.values()} == {"gen"}
    data = (local / "cat" / "000.jpg").read_bytes()
    gcs.upload_bytes(f"{src}/cat/000.jpg", data)  # the same bytes again: a new generation
    v2 = build([manifest], root, *ARGS)
    assert v2["manifest"]["incremental"]["unchanged"] == 6  # read, found equal
    assert v2["manifest"]["build"]["converted"] == 0
    a, b = same_size_pair()
    gcs.upload_bytes(f"{src}/cat/000.jpg", a)
    build([manifest], root, *ARGS, "--max_delta_share", "1")
    gcs.upload_bytes(f"{src}/cat/000.jpg", b)  # same size, other bytes, a new generation
    v4 = build([manifest], root, *ARGS, "--max_delta_share", "1")
    assert v4["manifest"]["incremental"]["changed"] == 1
    assert v4["manifest"]["build"]["converted"] == 1
    key = next(k for k in rows if k.endswith("cat/000.jpg"))
    assert catalog_of(v4)[key]["input_sha256"] == hashlib.sha256(b).hexdigest()
