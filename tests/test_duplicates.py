"""Content-duplicate groups from catalog fragments: the same groups, members and order as
sorting every row by (sha256, key JSON), including hashes that share their first 8 bytes."""

import hashlib
import itertools
import json
import random

from beam_pipeline.dedup import duplicates
from beam_pipeline.store import catalog
from dataset_format.catalog_schema import CatalogRow


def _row(key, split, file, position, sha256):
    return {"key": key, "uri": "/in/" + key, "label": "a", "label_id": 0, "split": split,
            "shard": 0, "file": file, "position": position, "offset": 0, "length": 1,
            "sha256": sha256, "height": 1, "width": 1, "input_size": 1, "input_stamp": "s",
            "input_sha256": sha256, "phash": None}


def _expected(rows):
    """Every row sorted by (hash, key JSON), grouped by hash: what the commit step reports."""
    ordered = sorted(rows, key=lambda r: (r["sha256"], json.dumps(r["key"])))
    out = []
    for sha256, run in itertools.groupby(ordered, key=lambda r: r["sha256"]):
        members = [[r["key"], r["split"], r["file"], r["position"]] for r in run]
        if len(members) > 1:
            out.append((sha256, members))
    return out


def test_groups_match_a_full_sort_with_shared_prefixes_and_odd_keys(tmp_path, monkeypatch):
    monkeypatch.setattr(catalog, "ROWS_PER_BATCH", 7)  # several row groups per fragment
    rng = random.Random(5)
    hashes = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(60)]
    # Same first 8 bytes, different hashes: a prefix collision that is no duplicate...
    twin = hashes[0][:16] + hashes[1][16:]
    # ...and one that is (two rows of twin2, one of its prefix-sharing sibling).
    twin2 = hashes[2][:16] + "0" * 48
    pool = hashes + [twin, twin2, twin2] + hashes[:10] * 2
    keys = [f"k{i}" for i in range(len(pool))] + ["é/ü", 'q"uote', "b\\s", "日本"]
    fragments, rows = [], []
    for f in range(4):
        path = str(tmp_path / f"frag{f}.parquet")
        with catalog.FragmentWriter(path) as writer:
            for position in range(len(pool) // 4 + 1):
                if not keys:
                    break
                key = keys.pop(rng.randrange(len(keys)))
                row = _row(key, rng.choice(["train", "test"]), f"s{f}", position,
                           rng.choice(pool))
                writer.append(CatalogRow.from_dict(row))
                rows.append(row)
        fragments.append(path)
    got = list(duplicates.groups(fragments))
    assert got == _expected(rows)
    assert len(got) >= 5


def test_no_duplicates_and_empty_fragments(tmp_path):
    path = str(tmp_path / "f.parquet")
    with catalog.FragmentWriter(path) as writer:
        for i in range(3):
            writer.append(CatalogRow.from_dict(
                _row(f"k{i}", "train", "s", i, hashlib.sha256(bytes([i])).hexdigest())))
    empty = str(tmp_path / "e.parquet")
    with catalog.FragmentWriter(empty):
        pass
    assert list(duplicates.groups([path, empty])) == []
    assert list(duplicates.groups([])) == []
