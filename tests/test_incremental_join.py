"""launcher/identity.py + launcher/incremental.py on hand-made inputs: the key join, what
each image becomes (kept, changed, added, moved, removed), the shard tasks and their
listings. No build: the previous version is a catalog.parquet and a manifest dict written
here."""

import json

import pytest

from beam_pipeline.job.contracts import Kind, Origin, PlannedShard, ShardPlan, ShardTask
from beam_pipeline.algorithms import fast_json
from beam_pipeline.launcher import identity, incremental, rules
from beam_pipeline.launcher import previous as stored_rows
from beam_pipeline.refs import ImageRef
from beam_pipeline.store import catalog
from beam_pipeline.store.catalog import FragmentWriter
from dataset_format.catalog_schema import CatalogRow
from beam_pipeline.algorithms.spill import join_sorted, SortedSpill
from dataset_format import dataset_info, layout

SPLITS = rules.parse_splits("train=0.5,test=0.5")


def test_join_sorted_pairs_sorted_streams():
    new = [("a", "A1"), ("c", "C1"), ("d", "D1")]
    old = [("b", "B0"), ("c", "C0"), ("e", "E0")]
    assert list(join_sorted(new, old)) == [
        ("a", "A1", None), ("b", None, "B0"), ("c", "C1", "C0"), ("d", "D1", None),
        ("e", None, "E0")]
    assert list(join_sorted([], old)) == [(k, None, v) for k, v in old]
    assert list(join_sorted(new, [])) == [(k, v, None) for k, v in new]


def row(key, shard, position, label="cat", split="train", size=10, stamp="1:1"):
    return {"key": key, "uri": f"/old/{key}", "label": label, "label_id": 0, "split": split,
            "shard": shard, "file": f"{split}-{shard:05d}-of-00002.tfrecord",
            "position": position, "offset": 100 * position, "length": 100, "sha256": "0" * 64,
            "height": 4, "width": 4, "input_size": size, "input_stamp": stamp,
            "input_sha256": f"{key}" * 64}


# The previous version: train shard 0 holds a, b; shard 1 holds c, d (hash shards).
PREVIOUS_ROWS = [row("a", 0, 0), row("b", 0, 1), row("c", 1, 0), row("d", 1, 1)]


@pytest.fixture
def previous(tmp_path):
    vdir = tmp_path / "versions" / "V1"
    vdir.mkdir(parents=True)
    with FragmentWriter(str(vdir / layout.CATALOG)) as writer:
        for r in PREVIOUS_ROWS:
            writer.append(CatalogRow.from_dict(r))
    shards = [{"path": f"train-{i:05d}-of-00002.tfrecord", "num_examples": 2,
               "sha256": f"{i}" * 64, "origin": Origin.HASH} for i in range(2)]
    manifest = {"version": "V1", "splits": {"train": {"num_examples": 4, "shards": shards}}}
    return str(vdir), dataset_info.from_manifest(str(vdir), manifest)


def planned(tmp_path, refs, previous, max_delta_share=1.0):
    vdir, manifest = previous
    spill = SortedSpill(str(tmp_path))
    for ref in refs:
        spill.add(json.dumps(ref.key), ref.to_json())
    rows = catalog.iter_rows(layout.join(vdir, layout.CATALOG))
    resolved = identity.resolve(spill, rows, SPLITS, str(tmp_path))
    return incremental.plan_increment(resolved, vdir, manifest, str(tmp_path),
                                      target_shard_mb=1, max_delta_share=max_delta_share)


def ref(key, size=10, stamp="1:1", label="cat", split=None):
    return ImageRef(key, f"/new/{key}", label, split, size, stamp)


def test_each_image_is_kept_changed_added_or_removed(tmp_path, previous):
    # a: same; b: new bytes (another size); c: gone; d: same; e: new
    new = [ref("a"), ref("b", size=11, stamp="2:2"), ref("d"), ref("e", size=30)]
    inc = planned(tmp_path, new, previous)
    try:
        assert inc.previous == "V1"
        assert inc.counts == {"unchanged": 2, "changed": 1, "added": 1, "moved": 0,
                              "restored": 0, "removed": 1}
        assert inc.to_convert == 2
        # Each old shard keeps one of two members: copied; b and e go to delta shards.
        assert [(t.split, t.shard, t.kind, t.origin, t.previous and t.previous.name)
                for t in inc.tasks if t.split == "train"][:2] == [
            ("train", 0, "copy", "hash", "train-00000-of-00002.tfrecord"),
            ("train", 1, "copy", "hash", "train-00001-of-00002.tfrecord")]
        listings = [(p.split, p.shard, p.kind, p.origin, list(p.lines))
                    for p in incremental.task_listings(inc)]
        (_, _, _, _, copy0), (_, _, _, _, copy1) = listings[:2]
        assert json.loads(copy0[0]) == {"source": "train-00000-of-00002.tfrecord",
                                        "sha256": "0" * 64}
        # A kept image: its previous catalog row (a, d: rows 0 and 3) and its input now.
        kept = [json.loads(line) for line in copy0[1:] + copy1[1:]]
        assert kept == [[0, "/new/a", 10, "1:1", "a" * 64, None],
                        [3, "/new/d", 10, "1:1", "d" * 64, None]]
        fresh = sorted(ImageRef.from_json(l).key for *_, kind, _, lines in listings[2:]
                       for l in lines)
        assert fresh == ["b", "e"]
        b = next(ImageRef.from_json(l) for *_, lines in listings[2:] for l in lines
                 if ImageRef.from_json(l).key == "b")
        # A key whose bytes changed is new content (b's new size no input had: not read).
        assert b.split == rules.assign_split("b", SPLITS)
    finally:
        inc.close()


def test_the_increment_is_handed_on_as_a_shard_plan(tmp_path, previous):
    inc = planned(tmp_path, [ref("a"), ref("b"), ref("d"), ref("e", size=30)], previous)
    try:
        shard_plan = incremental.shard_plan(inc)
        assert isinstance(shard_plan, ShardPlan)
        assert shard_plan.num_shards == inc.num_shards
        assert (shard_plan.to_convert, shard_plan.increment) == (1, {
            "unchanged": 3, "changed": 0, "added": 1, "moved": 0, "restored": 0,
            "removed": 1, "from": "V1"})
        shards = list(shard_plan.shards)
        assert all(isinstance(p, PlannedShard) for p in shards)
        assert [(p.split, p.shard, p.kind, p.origin) for p in shards] == [
            ("train", 0, Kind.REUSE, Origin.HASH), ("train", 1, Kind.COPY, Origin.HASH),
            ("train", 2, Kind.IMAGES, Origin.DELTA)]
        task = shards[0].task("L")
        assert task == ShardTask("train", 0, "L", Kind.REUSE, Origin.HASH)
    finally:
        inc.close()


def test_an_unchanged_listing_reuses_every_shard(tmp_path, previous):
    inc = planned(tmp_path, [ref(k) for k in "abcd"], previous, max_delta_share=0.5)
    try:
        assert inc.counts == {"unchanged": 4, "changed": 0, "added": 0, "moved": 0,
                              "restored": 0, "removed": 0}
        assert [t.kind for t in inc.tasks] == ["reuse", "reuse"]
        assert inc.num_shards == {"train": 2} and len(inc.fresh) == 0
    finally:
        inc.close()


def test_a_moved_label_or_split_is_re_framed_not_reused(tmp_path, previous):
    new = [ref("a", label="dog"), ref("b", split="test"), ref("c"), ref("d")]
    inc = planned(tmp_path, new, previous)
    try:
        assert inc.counts == {"unchanged": 2, "changed": 2, "added": 0, "moved": 0,
                              "restored": 0, "removed": 0}
        assert inc.to_convert == 0  # both re-framed from their stored records
        assert [(t.split, t.shard, t.kind) for t in inc.tasks] == [
            ("test", 0, "images"), ("train", 0, "reuse"), ("train", 1, "images")]
        assert inc.num_shards == {"test": 1, "train": 2}
        sources = {ImageRef.from_json(line).key: ImageRef.from_json(line).source
                   for _, line in inc.fresh}
        assert sources["a"].path.endswith("train-00000-of-00002.tfrecord")
        assert (sources["b"].offset, sources["b"].length) == (100, 100)
    finally:
        inc.close()


def test_too_many_delta_images_mean_a_full_build(tmp_path, previous):
    new = [ref(k) for k in "abcd"] + [ref(f"new{i}", size=20, split="train") for i in range(4)]
    assert planned(tmp_path, new, previous, max_delta_share=0.4) is None
    inc = planned(tmp_path, new, previous, max_delta_share=0.5)
    assert inc is not None and inc.counts["added"] == 4
    inc.close()


def test_kept_rows_come_back_grouped_by_shard_in_row_order(tmp_path):
    """In catalog order they are appended as they come; a shard's rows met apart (resume's
    key order) switch to a sort by file and row number, the lines kept."""
    in_order = incremental.KeptRows(str(tmp_path))
    for file, number in [("s0", 0), ("s0", 1), ("s1", 2)]:
        in_order.add(file, number, f"[{number}, \"u\"]")
    assert in_order.spill is None
    assert list(in_order) == [("s0", '[0, "u"]'), ("s0", '[1, "u"]'), ("s1", '[2, "u"]')]
    in_order.close()
    apart = incremental.KeptRows(str(tmp_path))
    for file, number in [("s1", 3), ("s0", 1), ("s1", 2), ("s0", 0)]:
        apart.add(file, number, f"[{number}, \"u\"]")
    assert apart.spill is not None
    assert list(apart) == [("s0", '[0, "u"]'), ("s0", '[1, "u"]'), ("s1", '[2, "u"]'),
                           ("s1", '[3, "u"]')]
    apart.close()
    assert list(tmp_path.iterdir()) == []  # both closed: nothing left in scratch


def test_the_job_reads_kept_rows_by_number_across_row_groups(tmp_path):
    path = str(tmp_path / layout.CATALOG)
    rows = [row(f"k{i}", i // 3, i % 3) for i in range(7)]
    with FragmentWriter(path) as writer:  # 3 rows a row group: [0-2] [3-5] [6]
        for r in rows:
            writer.append(CatalogRow.from_dict(r))
            if len(writer.rows) == 3:
                writer._flush()
    got = catalog.read_numbered(path, [1, 2, 2, 5, 6])
    assert [(r.key, r.position, r.uri) for r in got] == [
        ("k1", 1, "/old/k1"), ("k2", 2, "/old/k2"), ("k2", 2, "/old/k2"),
        ("k5", 2, "/old/k5"), ("k6", 0, "/old/k6")]
    with pytest.raises(ValueError, match=r"catalog.parquet: no row 7 \(it holds 7\)"):
        catalog.read_numbered(path, [0, 7])


def test_the_previous_catalog_spills_the_same_text_column_wise_or_a_row_at_a_time(tmp_path):
    """A row group whose strings need no JSON escape is spilled column-wise; one with a
    quote, a backslash or a non-ASCII letter a row at a time: the text is json.dumps' in
    both, so the join parses them alike."""
    path = str(tmp_path / layout.CATALOG)
    rows = [row("plain/a.jpg", 0, 0), row("plain/b.jpg", 0, 1, stamp=None),
            row('odd/"q".jpg', 1, 0), row("odd/caf\u00e9\\.jpg", 1, 1, label="l\u00e9")]
    with FragmentWriter(path) as writer:  # 2 rows a row group: plain, then odd
        for r in rows:
            writer.append(CatalogRow.from_dict(r))
            if len(writer.rows) == 2:
                writer._flush()
    texts = [t for chunk in stored_rows.by_key_texts(stored_rows.CatalogRows(path)) for t in chunk]
    assert texts == [
        f"{json.dumps(r['key'])}\t" + json.dumps([i, 10, r["input_stamp"], r["input_sha256"],
                                                   None, r["label"], "train", None]) + "\n"
        for i, r in enumerate(rows)]
    assert stored_rows.Stored.from_json(texts[3].split("\t")[1]).label == "l\u00e9"


def test_fast_json_writes_and_reads_what_json_does():
    values = ["k\u00e9y/\"a\".jpg", "gs://b/k", None, 12, -3, 1.5, ["x", None], {"a": [1]}]
    assert fast_json.dumps(values) == json.dumps(values)
    assert fast_json.loads(json.dumps(values)) == values
    assert fast_json.loads(" [1] ") == [1]  # whitespace around, as json.loads allows
    with pytest.raises(json.JSONDecodeError, match="Extra data"):
        fast_json.loads("[1] x")
    with pytest.raises(json.JSONDecodeError, match="Expecting value"):
        fast_json.loads("nope")


def test_rows_by_number_give_whole_rows_or_only_their_shard_file(tmp_path):
    """CatalogRows.by_number: a row asked whole comes with the plan's columns, another with
    its shard file only: from the row group's statistics when the group is one shard's,
    else read from the column (a row group of two shards)."""
    path = str(tmp_path / layout.CATALOG)
    rows = [row("a", 0, 0), row("b", 0, 1), row("c", 1, 0), row("d", 0, 2), row("e", 1, 1)]
    with FragmentWriter(path) as writer:  # row groups: [a, b] of shard 0, [c, d, e] mixed
        for r in rows:
            writer.append(CatalogRow.from_dict(r))
            if len(writer.rows) == 2 and r["key"] == "b":
                writer._flush()
    got = list(stored_rows.CatalogRows(path).by_number(
        [(0, False), (1, True), (2, False), (3, True), (3, False), (4, False)],
        incremental.PLAN_COLUMNS))
    assert [(n, r and (r["key"], r["file"], r["offset"]), f) for n, r, f in got] == [
        (0, None, "train-00000-of-00002.tfrecord"),
        (1, ("b", "train-00000-of-00002.tfrecord", 100), "train-00000-of-00002.tfrecord"),
        (2, None, "train-00001-of-00002.tfrecord"),
        (3, ("d", "train-00000-of-00002.tfrecord", 200), "train-00000-of-00002.tfrecord"),
        (3, None, "train-00000-of-00002.tfrecord"),
        (4, None, "train-00001-of-00002.tfrecord")]
    listed = stored_rows.RowList(rows).by_number([(0, False), (3, True)], ("key", "file"))
    assert list(listed) == [(0, None, "train-00000-of-00002.tfrecord"),
                            (3, {"key": "d", "file": "train-00000-of-00002.tfrecord"},
                             "train-00000-of-00002.tfrecord")]


def test_the_pass_for_rows_without_an_md5_reads_only_row_groups_that_may_hold_one(tmp_path):
    """Row groups whose input_md5 statistics show no null and no empty value are not read
    for rows without an md5 (a gs:// catalog: none); the rows of those read keep their
    numbers."""
    path = str(tmp_path / layout.CATALOG)
    rows = [dict(row(k, 0, i), input_md5="bWQ1") for i, k in enumerate("abc")]
    rows[2]["input_md5"] = None
    rows += [dict(row("d", 1, 0), input_md5="bWQ1")]
    with FragmentWriter(path) as writer:  # row groups: [a, b] with md5s, [c, d], [] none
        for r in rows:
            writer.append(CatalogRow.from_dict(r))
            if len(writer.rows) == 2:
                writer._flush()
    catalog_rows = stored_rows.CatalogRows(path)
    assert catalog_rows.md5_less_groups() == [1]
    everything = [(k, r.row) for k, _, r in catalog_rows.records()]
    assert everything == [("a", 0), ("b", 1), ("c", 2), ("d", 3)]
    assert [(k, r.row, r.input_md5) for k, _, r in catalog_rows.records(groups=[1])] == [
        ("c", 2, None), ("d", 3, "bWQ1")]
    with stored_rows.Previous(str(tmp_path), catalog_rows) as previous:
        sizes, by_sha, md5_less = previous.by_size(set(), {10})
        assert [json.loads(line)["key"] for _, line in by_sha] == ["c"]
        assert [size for size, _ in md5_less] == [f"{10:020d}"]
