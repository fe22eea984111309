"""A published image keeps its split for life, by content, and a damaged root degrades
gracefully.

* Renumbering (delete one, rename the rest down), renames onto existing names and swaps
  move no published bytes to another split: the bytes outrank the key.
* Bytes absent from a version (a night their read failed, a leak exclusion, a delete and a
  restore nights later) come back in the split they were published in: the split map
  (split_map.parquet) spans every version since --resplit, not just the previous one.
* A missing or unreadable LATEST, manifest, catalog or split map is one line naming the
  file and the way out; the build goes on from the newest intact version, never
  resplitting silently.
"""

import hashlib
import json
import os
import shutil

import pytest

from beam_pipeline.launcher import rules
from beam_pipeline.store import split_map
from dataset_format import layout
from tests.helpers import build, check_invariants, make_images
from tests.model_tree import near_copy, tiny_image

SPLITS = "train=0.6,validation=0.2,test=0.2"
ARGS = ["--name", "pets", "--target_shard_mb", "0.01", "--no_transform", "--splits", SPLITS,
        "--max_error_rate", "1"]


def content_splits(result):
    """{input sha256: split} of a published version, from its catalog."""
    from beam_pipeline.store import catalog

    rows = catalog.iter_rows(layout.join(result["version_dir"], layout.CATALOG))
    return {r["input_sha256"]: r["split"] for r in rows}


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def hashed_into(split, prefix, ext="jpg"):
    """A file name (under cat/) whose key hashes into `split`, and one that does not."""
    parsed = rules.parse_splits(SPLITS)
    names = [f"{prefix}{i}.{ext}" for i in range(200)]
    inside = next(n for n in names if rules.assign_split(f"cat/{n}", parsed) == split)
    outside = next(n for n in names if rules.assign_split(f"cat/{n}", parsed) != split)
    return inside, outside


# --- 1. renumbering, renames onto existing names, swaps ------------------------------------

@pytest.mark.slow
def test_renumbering_renames_onto_names_and_swaps_move_no_bytes(tmp_path):
    src = tmp_path / "src"
    names = [f"img_{i:03d}.jpg" for i in range(30)]
    make_images(src, {"cat": {n: tiny_image(i, "jpg") for i, n in enumerate(names)}})
    v1 = build([src], tmp_path / "root", *ARGS)
    first = content_splits(v1)
    assert len(set(first.values())) == 3  # all three splits are at stake
    # Delete img_005 and rename img_006..029 down by one, as photo tools do.
    os.remove(src / "cat" / names[5])
    for a, b in zip(names[5:], names[6:]):
        os.rename(src / "cat" / b, src / "cat" / a)
    v2 = build([src], tmp_path / "root", *ARGS)
    after = content_splits(v2)
    moved = {s: (first[s], after[s]) for s in after if after[s] != first[s]}
    assert moved == {}  # before: 5 of 29 changed split, test -> train among them
    assert v2["manifest"]["build"]["converted"] == 0  # each record re-framed, not decoded
    # mv a b onto an existing b, then a swap of two names: the bytes keep their splits.
    os.rename(src / "cat" / names[0], src / "cat" / names[1])
    tmp = src / "cat" / "swap.tmp"
    os.rename(src / "cat" / names[2], tmp)
    os.rename(src / "cat" / names[3], src / "cat" / names[2])
    os.rename(tmp, src / "cat" / names[3])
    v3 = build([src], tmp_path / "root", *ARGS, "--max_delta_share", "1")
    assert {s: first[s] for s in content_splits(v3)} == content_splits(v3)
    inc = v3["manifest"]["incremental"]
    assert (inc["changed"], inc["removed"], v3["manifest"]["build"]["converted"]) == (3, 1, 0)
    check_invariants(v3)


# --- 2. bytes absent for a night or more ----------------------------------------------------

def sticky_start(tmp_path):
    """A root where one image's bytes were published in test and then renamed to a key
    that hashes elsewhere (so only the split map can say test). -> (src, root, path)"""
    src, root = tmp_path / "src", tmp_path / "root"
    make_images(src, {"cat": {f"x{i}.jpg": tiny_image(100 + i, "jpg") for i in range(8)}})
    test_name, other = hashed_into("test", "t")
    make_images(src, {"cat": {test_name: tiny_image(7, "jpg")}})
    v1 = build([src], root, *ARGS)
    assert content_splits(v1)[sha(src / "cat" / test_name)] == "test"
    os.rename(src / "cat" / test_name, src / "cat" / other)
    v2 = build([src], root, *ARGS)
    assert content_splits(v2)[sha(src / "cat" / other)] == "test"  # (the previous version)
    return src, root, src / "cat" / other


@pytest.mark.slow
def test_a_night_the_read_failed_and_a_restore_nights_later_keep_the_split(tmp_path):
    src, root, path = sticky_start(tmp_path)
    content, data = sha(path), path.read_bytes()
    os.rename(path, tmp_path / "away.jpg")
    os.symlink(tmp_path / "gone.jpg", path)  # the read fails tonight: a broken link
    v3 = build([src], root, *ARGS)
    assert v3["manifest"]["accounting"]["failed"] == 1 and content not in content_splits(v3)
    assert v3["manifest"]["split_map"]["contents"] == 9  # still in the map
    os.remove(path)
    os.rename(tmp_path / "away.jpg", path)
    v4 = build([src], root, *ARGS, "--max_delta_share", "1")
    assert content_splits(v4)[content] == "test"  # before: its key's hash, train
    assert v4["manifest"]["incremental"]["restored"] == 1
    os.remove(path)  # deleted, two nights of other changes, then restored from a backup
    build([src], root, *ARGS)
    make_images(src, {"cat": {"new.jpg": tiny_image(50, "jpg")}})
    build([src], root, *ARGS)
    path.write_bytes(data)
    v7 = build([src], root, *ARGS)
    assert content_splits(v7)[content] == "test"
    check_invariants(v7)


@pytest.mark.slow
def test_a_leak_left_out_one_night_returns_in_its_split_and_is_left_out_again(tmp_path):
    src, root, path = sticky_start(tmp_path)
    content = sha(path)
    train_name = hashed_into("train", "copy")[0]
    (src / "cat" / train_name).write_bytes(near_copy(path.read_bytes()))  # a train near-copy
    leaks = ["--near_duplicates", "--drop_near_duplicate_leaks"]
    v3 = build([src], root, *ARGS, *leaks)
    assert v3["manifest"]["accounting"]["leaks"] == 1 and content not in content_splits(v3)
    os.remove(src / "cat" / train_name)  # the copy goes: the test image comes back
    v4 = build([src], root, *ARGS, *leaks)
    assert content_splits(v4)[content] == "test"  # before: train, its key's hash
    (src / "cat" / train_name).write_bytes(near_copy(path.read_bytes()))
    v5 = build([src], root, *ARGS, *leaks)
    assert content not in content_splits(v5)  # a leak again, not a train image beside it
    assert v5["manifest"]["near_duplicates"]["excluded"] == 1


@pytest.mark.slow
def test_resplit_starts_over_and_splits_changes_apply_to_new_content_only(tmp_path, capsys):
    src, root, path = sticky_start(tmp_path)
    before = content_splits(build([src], root, *ARGS, "--force"))
    capsys.readouterr()
    other = ["--name", "pets", "--target_shard_mb", "0.01", "--no_transform", "--splits",
             "train=0.1,validation=0.1,test=0.8"]
    make_images(src, {"cat": {"late.jpg": tiny_image(60, "jpg")}})
    v = build([src], root, *other)
    out = capsys.readouterr().out
    assert "--splits changed" in out and "new images only" in out
    after = content_splits(v)
    assert {s: after[s] for s in before} == before
    v = build([src], root, *ARGS, "--resplit")
    assert content_splits(v)[sha(path)] == rules.assign_split(
        "cat/" + path.name, rules.parse_splits(SPLITS))
    assert v["manifest"]["split_map"]["from"] is None


# --- 4. a damaged root ----------------------------------------------------------------------

def two_versions(tmp_path):
    src, root, path = sticky_start(tmp_path)
    versions = sorted(os.listdir(root / "versions"))
    return src, root, path, [root / "versions" / v for v in versions]


@pytest.mark.slow
def test_a_truncated_or_missing_catalog_is_named_and_the_splits_hold(tmp_path, capsys):
    src, root, path, (_, latest) = two_versions(tmp_path)
    catalog = latest / layout.CATALOG
    catalog.write_bytes(catalog.read_bytes()[:100])
    capsys.readouterr()
    v = build([src], root, *ARGS)  # before: "Parquet magic bytes not found", every build
    err = capsys.readouterr().err
    assert f"{catalog}: unreadable" in err and "converted again" in err
    assert content_splits(v)[sha(path)] == "test"
    assert v["manifest"]["build"]["converted"] == 9
    assert v["manifest"]["split_map"]["notes"]  # the summary says what was gone around
    os.remove(layout.join(v["version_dir"], layout.CATALOG))
    capsys.readouterr()
    v = build([src], root, *ARGS)
    assert "catalog.parquet: missing" in capsys.readouterr().err
    assert content_splits(v)[sha(path)] == "test"


@pytest.mark.slow
def test_a_damaged_latest_or_manifest_is_named_and_the_build_goes_on(tmp_path, capsys):
    src, root, path, (older, latest) = two_versions(tmp_path)
    (root / "LATEST").write_text('{"version": "2026')  # truncated
    capsys.readouterr()
    v = build([src], root, *ARGS)  # before: a raw JSON error
    err = capsys.readouterr().err
    assert f"{root}/LATEST: unreadable" in err and latest.name in err
    assert content_splits(v)[sha(path)] == "test"
    assert json.loads((root / "LATEST").read_text())["version"] == v["version"]
    shutil.rmtree(v["version_dir"])  # LATEST names a version that is gone
    capsys.readouterr()
    v = build([src], root, *ARGS)  # before: [Errno 2]
    err = capsys.readouterr().err
    assert "manifest.json: missing" in err and f"building on version {latest.name}" in err
    assert content_splits(v)[sha(path)] == "test"
    check_invariants(v)


@pytest.mark.slow
def test_a_damaged_split_map_falls_back_to_an_older_one_never_a_silent_resplit(tmp_path,
                                                                              capsys):
    src, root, path, (older, latest) = two_versions(tmp_path)
    (latest / layout.SPLIT_MAP).write_bytes(b"PAR1 not really")
    make_images(src, {"cat": {"late.jpg": tiny_image(61, "jpg")}})
    capsys.readouterr()
    v = build([src], root, *ARGS)
    err = capsys.readouterr().err
    assert f"{latest / layout.SPLIT_MAP}: unreadable" in err
    assert f"splits from {older / layout.SPLIT_MAP}" in err
    assert content_splits(v)[sha(path)] == "test"
    for vdir in (older, latest, root / "versions" / v["version"]):
        (vdir / layout.SPLIT_MAP).unlink()
    with pytest.raises(Exception, match="--resplit") as e:
        build([src], root, *ARGS, expect=None)
    assert layout.SPLIT_MAP in str(e.value)


def test_the_version_a_build_starts_from_is_its_manifest_typed(tmp_path):
    from beam_pipeline.launcher import history

    src, root = tmp_path / "src", tmp_path / "root"
    make_images(src, {"cat": {f"c{i}.jpg": tiny_image(i, "jpg") for i in range(4)},
                      "dog": {"d.jpg": tiny_image(9, "jpg")}})
    v = build([src], root, *ARGS)
    manifest = json.loads((root / "versions" / v["version"] / layout.MANIFEST).read_text())
    past = history.find(history.HistoryConfig(str(root)))
    info = past.manifest
    assert (info.version, info.version_dir) == (v["version"], v["version_dir"])
    assert info.labels == ("cat", "dog")
    assert (info.input_fingerprint, info.config, info.generator, info.key_scheme) == (
        manifest["input_fingerprint"], manifest["config"], manifest["generator"],
        manifest["key_scheme"])
    assert (info.has_catalog, info.has_split_map, info.catalog_rows) == (True, True, 5)
    assert past.catalog == info.catalog == f"{v['version_dir']}/{layout.CATALOG}"
    shards = [(sh.name, sh.origin, sh.num_examples, sh.crc32c)
              for s in info.splits.values() for sh in s.shards]
    assert shards == [(sh["path"], sh["origin"], sh["num_examples"], sh["crc32c"])
                      for s in manifest["splits"].values() for sh in s["shards"]]


# --- the split map itself ---------------------------------------------------------------------

def test_the_split_map_keeps_the_first_split_of_each_content(tmp_path):
    shas = [hashlib.sha256(bytes([i])).hexdigest() for i in range(6)]
    first = split_map.from_columns(shas[:3], [10, 20, 30], ["train", "test", "validation"])
    # A later version: one content now in train too, one new content in two splits at once.
    later = split_map.from_columns([shas[1], shas[3], shas[3]], [20, 40, 40],
                                   ["train", "validation", "test"], first)
    assert [later.split_of(s) for s in shas] == ["train", "test", "validation", "test", None,
                                                None]
    assert later.has_size(40) and not later.has_size(50)
    split_map.write(str(tmp_path / "m.parquet"), later)
    again = split_map.read(str(tmp_path / "m.parquet"))
    assert [again.split_of(s) for s in shas] == [later.split_of(s) for s in shas]
    (tmp_path / "cut.parquet").write_bytes((tmp_path / "m.parquet").read_bytes()[:40])
    with pytest.raises(split_map.SplitMapUnreadable, match="cut.parquet: unreadable"):
        split_map.read(str(tmp_path / "cut.parquet"))


def test_the_split_map_carries_the_listing_md5_and_reads_maps_without_it(tmp_path):
    import base64

    import pyarrow.parquet as pq

    shas = [hashlib.sha256(bytes([i])).hexdigest() for i in range(3)]
    md5 = [base64.b64encode(hashlib.md5(bytes([i])).digest()).decode() for i in range(3)]
    first = split_map.from_columns(shas[:2], [10, 20], ["train", "test"],
                                   input_md5=[md5[0], None])
    assert first.split_of_md5(md5[0], 10) == "train" and first.split_of_md5(md5[0], 11) is None
    assert first.split_of_md5(md5[1], 20) is None and first.has_size_without_md5(20)
    # Content 1 published again from gs:// (its md5 now known), content 2 new.
    later = split_map.from_columns(shas[1:], [20, 30], ["validation", "train"], first,
                                   input_md5=md5[1:])
    assert [later.split_of_md5(m, s) for m, s in zip(md5, [10, 20, 30])] == [
        "train", "test", "train"]
    assert not later.has_size_without_md5(20)
    path = str(tmp_path / "m.parquet")
    split_map.write(path, later)
    again = split_map.read(path)
    assert [again.split_of_md5(m, s) for m, s in zip(md5, [10, 20, 30])] == [
        "train", "test", "train"]
    assert pq.read_table(path)["md5"].to_pylist() == [
        base64.b64decode(m) for m in (md5[1], md5[0], md5[2])]  # sorted by content
    pq.write_table(pq.read_table(path).drop_columns(["md5"]), str(tmp_path / "old.parquet"))
    older = split_map.read(str(tmp_path / "old.parquet"))  # a map written before md5s
    assert [older.split_of(s) for s in shas] == ["train", "test", "train"]
    assert older.split_of_md5(md5[0], 10) is None and older.has_size_without_md5(10)
    with pytest.raises(ValueError, match="not a base64 md5"):
        split_map.md5_words(["abc"])
