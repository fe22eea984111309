"""launcher/incremental.py on hand-made inputs: the key join, what each image becomes
(kept, changed, added, removed), the shard tasks and their listings. No build: the previous
version is a catalog.parquet and a manifest dict written here."""

import json

import pytest

from beam_pipeline.launcher import incremental
from beam_pipeline.refs import ImageRef
from beam_pipeline.store.catalog import FragmentWriter
from beam_pipeline.store.spill import SortedSpill
from readers import layout


def test_join_by_key_pairs_sorted_streams():
    new = [("a", "A1"), ("c", "C1"), ("d", "D1")]
    old = [("b", "B0"), ("c", "C0"), ("e", "E0")]
    assert list(incremental.join_by_key(new, old)) == [
        ("a", "A1", None), ("b", None, "B0"), ("c", "C1", "C0"), ("d", "D1", None),
        ("e", None, "E0")]
    assert list(incremental.join_by_key([], old)) == [(k, None, v) for k, v in old]
    assert list(incremental.join_by_key(new, [])) == [(k, v, None) for k, v in new]


def row(key, shard, position, label="cat", split="train", size=10, mtime=1.0):
    return {"key": key, "uri": f"/old/{key}", "label": label, "label_id": 0, "split": split,
            "shard": shard, "file": f"{split}-{shard:05d}-of-00002.tfrecord",
            "position": position, "offset": 100 * position, "length": 100, "sha256": "0" * 64,
            "height": 4, "width": 4, "input_size": size, "input_mtime": mtime}


# The previous version: train shard 0 holds a, b; shard 1 holds c, d (hash shards).
PREVIOUS_ROWS = [row("a", 0, 0), row("b", 0, 1), row("c", 1, 0), row("d", 1, 1)]


@pytest.fixture
def previous(tmp_path):
    vdir = tmp_path / "versions" / "V1"
    vdir.mkdir(parents=True)
    with FragmentWriter(str(vdir / layout.CATALOG)) as writer:
        for r in PREVIOUS_ROWS:
            writer.append(r)
    shards = [{"path": f"train-{i:05d}-of-00002.tfrecord", "num_examples": 2,
               "sha256": f"{i}" * 64, "origin": incremental.HASH} for i in range(2)]
    return str(vdir), {"version": "V1", "splits": {"train": {"shards": shards}}}


def by_key(tmp_path, refs):
    spill = SortedSpill(str(tmp_path))
    for ref in refs:
        spill.add(json.dumps(ref.key), ref.to_json())
    return spill


def ref(key, size=10, mtime=1.0, label="cat", split="train"):
    return ImageRef(key, f"/new/{key}", label, split, size, mtime)


def test_each_image_is_kept_changed_added_or_removed(tmp_path, previous):
    vdir, manifest = previous
    # a: same; b: touched (new mtime); c: gone; d: same; e: new
    new = [ref("a"), ref("b", mtime=2.0), ref("d"), ref("e", size=30)]
    inc = incremental.plan_increment(by_key(tmp_path, new), vdir, manifest, str(tmp_path),
                                     target_shard_mb=1, max_delta_share=1.0)
    try:
        assert inc.previous == "V1"
        assert inc.counts == {"unchanged": 2, "changed": 1, "added": 1, "removed": 1}
        # Each old shard keeps one of two members: copied; b and e go to one delta shard.
        assert [(s, i, kind, origin, e and e["path"]) for s, i, kind, origin, e in inc.tasks] \
            == [("train", 0, "copy", "hash", "train-00000-of-00002.tfrecord"),
                ("train", 1, "copy", "hash", "train-00001-of-00002.tfrecord"),
                ("train", 2, "images", "delta", None)]
        assert inc.num_shards == {"train": 3} and inc.fresh_shards == {"train": (2, 1)}

        listings = [(s, i, kind, origin, list(lines))
                    for s, i, kind, origin, lines in incremental.task_listings(inc)]
        (s0, _, _, _, copy0), (s1, _, _, _, copy1), (_, i2, _, _, images) = listings
        assert json.loads(copy0[0]) == {"source": "train-00000-of-00002.tfrecord",
                                        "sha256": "0" * 64}
        kept = [json.loads(line) for line in copy0[1:] + copy1[1:]]
        assert [(r["key"], r["position"], r["uri"]) for r in kept] == [
            ("a", 0, "/new/a"), ("d", 1, "/new/d")]  # old positions; the new uri
        assert i2 == 2 and sorted(ImageRef.from_json(l).key for l in images) == ["b", "e"]
    finally:
        inc.close()


def test_an_unchanged_listing_reuses_every_shard(tmp_path, previous):
    vdir, manifest = previous
    new = [ref(k) for k in "abcd"]
    inc = incremental.plan_increment(by_key(tmp_path, new), vdir, manifest, str(tmp_path), 1, 0.5)
    try:
        assert inc.counts == {"unchanged": 4, "changed": 0, "added": 0, "removed": 0}
        assert [kind for _, _, kind, _, _ in inc.tasks] == ["reuse", "reuse"]
        assert inc.num_shards == {"train": 2} and len(inc.fresh) == 0
    finally:
        inc.close()


def test_a_moved_label_or_split_is_a_change_not_a_reuse(tmp_path, previous):
    vdir, manifest = previous
    new = [ref("a", label="dog"), ref("b", split="test"), ref("c"), ref("d")]
    inc = incremental.plan_increment(by_key(tmp_path, new), vdir, manifest, str(tmp_path), 1, 1.0)
    try:
        assert inc.counts == {"unchanged": 2, "changed": 2, "added": 0, "removed": 0}
        assert [(s, i, kind) for s, i, kind, _, _ in inc.tasks] == [
            ("test", 0, "images"), ("train", 0, "reuse"), ("train", 1, "images")]
        assert inc.num_shards == {"test": 1, "train": 2}
    finally:
        inc.close()


def test_too_many_delta_images_mean_a_full_build(tmp_path, previous):
    vdir, manifest = previous
    new = [ref(k) for k in "abcd"] + [ref(f"new{i}") for i in range(4)]  # 4 of 8 new
    assert incremental.plan_increment(by_key(tmp_path, new), vdir, manifest, str(tmp_path),
                                      1, max_delta_share=0.4) is None
    inc = incremental.plan_increment(by_key(tmp_path, new), vdir, manifest, str(tmp_path),
                                     1, max_delta_share=0.5)
    assert inc is not None and inc.counts["added"] == 4
    inc.close()
