"""Keys relative to their input, the streaming planner, and catalog.parquet."""

import hashlib
import json
import os
import random

import pyarrow.parquet as pq
import pytest

from beam_pipeline.launcher import listing, plan, rules
from beam_pipeline.refs import ImageRef
from beam_pipeline.algorithms.spill import SortedSpill
from dataset_format import layout, schema
from dataset_format.error_record import ErrorRecord
from tests.helpers import FAST, build, check_invariants, make_images, read_records

SPLITS = rules.parse_splits("train=0.8,validation=0.1,test=0.1")


# --- pure: the spill sort and the planner --------------------------------------------------------

def test_sorted_spill_merges_chunks_in_order(tmp_path):
    rng = random.Random(7)
    items = [(f"{rng.random():.12f}", json.dumps({"i": i})) for i in range(1000)]
    with SortedSpill(str(tmp_path), chunk_lines=64) as spill:
        for key, line in items:
            spill.add(key, line)
        assert len(spill.files) == 1000 // 64  # it really spilled
        got = list(spill)
    assert got == sorted(items)
    assert os.listdir(tmp_path) == [] or all(not f.startswith("spill-")
                                              for f in os.listdir(tmp_path))


def _plan(items, tmp_path, chunk=None):
    errors = []
    p = listing.plan_listing(iter(items), listing.Fingerprint({"a": 1}, "0"), None,
                             str(tmp_path), errors.append)
    return p, errors


def _splits(p, tmp_path):
    """A new root's splits (no previous version): identity.Resolved."""
    from beam_pipeline.launcher import identity

    return identity.resolve(p.by_key, None, SPLITS, str(tmp_path))


def _refs(n):
    return [ImageRef(f"c{i % 3}/{i:04d}.jpg", f"/data/c{i % 3}/{i:04d}.jpg", f"c{i % 3}",
                     None, 100 + i, "1500:1500") for i in range(n)]


def test_the_full_plan_is_a_shard_plan_of_the_hash_cut(tmp_path):
    """plan.full_plan (a frozen config, not the options) -> the same ShardPlan type the
    incremental plan returns: --num_shards per split, every image once, in its hash shard."""
    from beam_pipeline.job.contracts import Kind, Origin, PlannedShard, ShardPlan

    listed, _ = _plan(_refs(120), tmp_path)
    resolved = _splits(listed, tmp_path)
    config = plan.FullPlanConfig(num_shards=3, target_shard_mb=1, reframe=False)
    shard_plan = plan.full_plan(resolved, config, str(tmp_path))
    assert isinstance(shard_plan, ShardPlan) and shard_plan.increment is None
    assert shard_plan.to_convert == 120
    assert shard_plan.num_shards == {s: 3 for s in resolved.per_split}
    seen = {}
    for planned in shard_plan.shards:
        assert isinstance(planned, PlannedShard)
        assert (planned.kind, planned.origin) == (Kind.IMAGES, Origin.HASH)
        for line in planned.lines:
            ref = ImageRef.from_json(line)
            seen[ref.key] = (planned.split, planned.shard)
            assert planned.shard == rules.shard_of(planned.split, ref.key, 3)
    assert sorted(seen) == sorted(r.key for r in _refs(120))


def test_plan_is_independent_of_listing_order_and_cuts_shards_by_hash(tmp_path):
    refs = _refs(300)
    shuffled = refs[:]
    random.Random(3).shuffle(shuffled)
    a, _ = _plan(refs, tmp_path)
    b, _ = _plan(shuffled, tmp_path)
    assert a.fingerprint == b.fingerprint
    ra, rb = _splits(a, tmp_path), _splits(b, tmp_path)
    assert ra.per_split == rb.per_split and ra.num_images == a.num_images == 300
    num_shards = {"train": 4, "validation": 2, "test": 1}
    by_position = plan.by_shard_position((r.to_json() for r, _ in rb.refs()), str(tmp_path))
    streamed = {(split, shard): [ImageRef.from_json(l) for l in lines]
                for split, shard, lines in plan.iter_shards(by_position, num_shards)}
    expected = {}  # shard_of(split, key), ordered by shard_position inside a shard
    for r in refs:
        split = rules.assign_split(r.key, SPLITS)
        expected.setdefault((split, rules.shard_of(split, r.key, num_shards[split])), []).append(
            ImageRef(r.key, r.uri, r.label, split, r.size, r.stamp))
    for shard in expected.values():
        shard.sort(key=lambda ref: rules.shard_position(ref.split, ref.key))
    assert streamed == expected
    assert sum(len(v) for v in streamed.values()) == 300
    for spill in (a.by_key, b.by_key, ra.by_key, rb.by_key, by_position):
        spill.close()


def test_plan_drops_a_file_listed_twice_and_reports_a_conflicting_one(tmp_path):
    refs = _refs(4)
    again = refs[1]
    conflict = ImageRef("x/" + refs[2].key, refs[2].uri, "other", None, refs[2].size, "15:15")
    gone = ErrorRecord("gone.jpg", "read", "not_found", "no such file")
    p, errors = _plan(refs + [again, conflict, gone], tmp_path)
    assert (p.listed, p.duplicates, p.errors, p.num_images) == (7, 1, 2, 4)
    assert [e.reason for e in errors] == ["not_found", "conflicting_duplicate"]
    p.by_key.close()


# --- keys -----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_several_inputs_prefix_keys_with_their_names(tmp_path):
    make_images(tmp_path / "a" / "photos", {"cat": 2})
    make_images(tmp_path / "b" / "scans", {"cat": 1, "dog": 1})
    result = build([tmp_path / "a" / "photos", tmp_path / "b" / "scans"], tmp_path / "out", *FAST)
    check_invariants(result)
    names = sorted(r[schema.FILENAME].decode()
                   for rs in read_records(result["version_dir"]).values() for r in rs)
    assert names == ["photos/cat/000.jpg", "photos/cat/001.jpg", "scans/cat/000.jpg",
                     "scans/dog/000.jpg"]


@pytest.mark.slow
def test_same_images_under_another_path_and_on_gcs_build_identical_shards(
        tmp_path, gcs, gcs_bucket):
    """Moving a dataset (another folder, or a bucket) keeps every split and shard byte."""
    here = tmp_path / "here" / "images"
    make_images(here, {"cat": 6, "dog": 5, "owl": 4})
    there = tmp_path / "there" / "moved"
    make_images(there, {"cat": 6, "dog": 5, "owl": 4})
    gcs.upload_tree(here, f"gs://{gcs_bucket}/deep/prefix/imgs")
    args = ["--num_shards", "2", "--name", "pets"]
    local = build([here], tmp_path / "a", *args)
    moved = build([there], tmp_path / "b", *args)
    remote = build([f"gs://{gcs_bucket}/deep/prefix/imgs"], f"gs://{gcs_bucket}/ds", *args)

    def shards(result):
        return [(s, sh["path"], sh["crc32c"]) for s, info in result["manifest"]["splits"].items()
                for sh in info["shards"]]

    assert len(shards(local)) >= 4  # train: 2, validation and test: one image each
    assert shards(moved) == shards(local)
    assert shards(remote) == shards(local)
    assert remote["manifest"]["key_scheme"] == layout.KEY_SCHEME
    assert remote["manifest"]["catalog"]["rows"] == 15


# --- the catalog ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_catalog_agrees_with_the_shards_record_by_record(built_dataset):
    import readers

    meta = readers.info(built_dataset["root"])
    assert meta.catalog == os.path.join(built_dataset["version_dir"], layout.CATALOG)
    rows = pq.read_table(meta.catalog).to_pylist()
    manifest = built_dataset["manifest"]
    assert len(rows) == manifest["catalog"]["rows"] == manifest["accounting"]["written"]
    records = read_records(built_dataset["version_dir"])
    seen = 0
    for (split, path), recs in records.items():
        mine = [r for r in rows if r["file"] == path]
        assert [r["position"] for r in mine] == list(range(len(recs)))
        data = open(os.path.join(built_dataset["version_dir"], path), "rb").read()
        for row, rec in zip(mine, recs):
            seen += 1
            assert row["split"] == split and row["key"] == rec[schema.FILENAME].decode()
            assert row["label_id"] == rec[schema.LABEL]
            assert row["label"] == rec[schema.TEXT].decode()
            assert row["sha256"] == hashlib.sha256(rec[schema.ENCODED]).hexdigest()
            frame = data[row["offset"]:row["offset"] + row["length"]]
            assert frame[12:-4] == rec["_raw"]  # offset and length point at its frame
            assert os.path.getsize(row["uri"]) == row["input_size"]
            assert row["uri"] == os.path.join(built_dataset["input"], row["key"])
    assert seen == len(rows)


def test_big_image_hint_names_max_side_and_savings():
    from beam_pipeline.launcher.report import big_image_hint

    manifest = {"stored_images": {"median_longer_side": 4032}, "config": {"max_side": 0},
                "splits": {"train": {"num_bytes": 4 * 2**30}}}
    hint = big_image_hint(manifest)
    assert "median longer side 4032 px" in hint and "--max_side 512" in hint
    assert "~62x fewer bytes" in hint and "0.06 GiB instead of 4.00 GiB" in hint
    assert "from ~31.7 ms to ~0.5 ms" in hint
    assert big_image_hint(dict(manifest, stored_images={"median_longer_side": 800})) is None
    assert big_image_hint(dict(manifest, config={"max_side": 1024})) is None
    assert big_image_hint({"config": {}, "splits": {}}) is None
