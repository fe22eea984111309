"""beam_pipeline.store.near_duplicates against brute force on seeded random hashes."""

import hashlib
import io
import json
import random

import pytest

from beam_pipeline.store import near_duplicates as nd
from beam_pipeline.store.near_duplicates import Row

SPLITS = ("train", "validation", "test")


def seeded_rows(n, radius, seed, old_every=0):
    """n random 64-bit hashes, a third of them with a planted copy 0..radius+2 bits away."""
    rng = random.Random(seed)
    hashes = []
    for k in range(n):
        if k and rng.random() < 0.33:
            base = hashes[rng.randrange(k)]
            flips = rng.sample(range(64), rng.randint(0, radius + 2))
            hashes.append(base ^ sum(1 << f for f in flips))
        else:
            hashes.append(rng.getrandbits(64))
    return [Row(f"k{k:04d}.jpg", SPLITS[rng.randrange(3)], h,
                bool(old_every) and k % old_every == 0) for k, h in enumerate(hashes)]


def brute(rows, radius):
    return {(a.key, b.key, (a.hash ^ b.hash).bit_count())
            for i, a in enumerate(rows) for b in rows[i + 1:]
            if (a.hash ^ b.hash).bit_count() <= radius and not (a.old and b.old)}


def found(rows, radius, bands=None, tmp_path=None):
    pairs = [(a.key, b.key, d) for a, b, d in nd.find_pairs(rows, radius, bands, tmp_path)]
    assert len(pairs) == len(set(pairs)), "a pair reported twice"
    return {tuple(sorted((a, b))) + (d,) for a, b, d in pairs}


@pytest.mark.parametrize("radius, bands", [(0, None), (3, None), (6, None), (6, 3), (6, 7),
                                           (10, 11), (10, None)])
def test_pairs_equal_brute_force(radius, bands, tmp_path):
    rows = seeded_rows(300, radius, seed=radius * 10 + (bands or 0))
    expected = brute(rows, radius)
    assert len(expected) > 30  # the plants make the test meaningful
    assert found(rows, radius, bands, tmp_path) == expected


@pytest.mark.parametrize("radius, bands, old_every", [(4, None, 0), (10, 4, 0), (6, 3, 2),
                                                      (10, None, 3)])
def test_tiny_memory_limits_give_the_same_pairs(radius, bands, old_every, tmp_path,
                                                monkeypatch):
    """Hashes read 37 rows at a time, band tables of ~40 rows (value-range pieces), 5
    candidate pairs compared at a time, buckets of over 3 rows as blocks, buckets found by
    search rather than by offset table."""
    for name, value in (("SCAN_ROWS", 37), ("TABLE_ROWS", 40), ("PAIR_CHUNK", 5),
                        ("BLOCK_ROWS", 3), ("DIRECT_BITS", 3)):
        monkeypatch.setattr(nd, name, value)
    rows = seeded_rows(100, radius, seed=7, old_every=old_every)
    assert found(rows, radius, bands, tmp_path) == brute(rows, radius)
    assert not list(tmp_path.iterdir()), "scratch files left behind"


# sha256 (first 16 hex digits) of near_duplicates.jsonl as the previous engine (a text
# spill sorted on disk, compared row by row in Python) wrote it for seeded_rows(3000, radius,
# seed=99, old_every)
PREVIOUS_ENGINE = {(10, 11, 0): (459, "e65533c03a5fa24a"), (10, 4, 3): (423, "1ca80cf33cdf7a5a"),
                   (4, None, 0): (444, "448b88181fbbcaa4"), (6, 3, 2): (361, "3a74227dcb293415")}


@pytest.mark.parametrize("radius, bands, old_every", sorted(PREVIOUS_ENGINE, key=str))
def test_jsonl_equals_the_previous_engines(radius, bands, old_every, tmp_path):
    rows = seeded_rows(3000, radius, seed=99, old_every=old_every)
    buf = io.StringIO()
    lines = nd.write_jsonl(nd.find_groups(rows, radius, bands, tmp_path), buf)
    digest = hashlib.sha256(buf.getvalue().encode()).hexdigest()[:16]
    assert (lines, digest) == PREVIOUS_ENGINE[(radius, bands, old_every)]


@pytest.mark.parametrize("bands", [None, 3])
def test_incremental_finds_exactly_the_pairs_with_a_new_row(bands, tmp_path):
    rows = seeded_rows(300, 6, seed=3, old_every=1)  # all old ...
    rows = [Row(r.key, r.split, r.hash, old=i < 200) for i, r in enumerate(rows)]  # 100 new
    full = brute([Row(r.key, r.split, r.hash) for r in rows], 6)
    new = {r.key for r in rows if not r.old}
    expected = {p for p in full if p[0] in new or p[1] in new}
    assert 0 < len(expected) < len(full)
    assert found(rows, 6, bands, tmp_path) == expected


def test_groups_are_connected_sets_with_their_pairs():
    h = 0x0123456789ABCDEF
    rows = [Row("c.jpg", "test", h ^ 0b111), Row("a.jpg", "train", h),
            Row("b.jpg", "train", h ^ 0b1), Row("z.jpg", "test", ~h & (2**64 - 1)),
            Row("d.jpg", "validation", (h ^ 0xFF00000000000000)),
            Row("e.jpg", "validation", (h ^ 0xFF00000000000000) ^ 0b10)]
    groups = nd.find_groups(rows, radius=4)
    assert [g.keys for g in groups] == [("a.jpg", "b.jpg", "c.jpg"), ("d.jpg", "e.jpg")]
    first, second = groups
    assert first.splits == ("train", "train", "test")
    # a-b 1 bit, a-c 3, b-c 2: all within 4, so all three pairs verified
    assert [(p.a, p.b, p.distance) for p in first.pairs] == [(0, 1, 1), (0, 2, 3), (1, 2, 2)]
    assert first.spans_splits and first.leaks() == ("c.jpg",)
    assert not second.spans_splits and second.leaks() == ()


def test_chain_groups_keep_only_verified_pairs():
    rows = [Row("a", "train", 0), Row("b", "test", 0b1111), Row("c", "test", 0xFF)]
    (g,) = nd.find_groups(rows, radius=4)
    assert g.keys == ("a", "b", "c")
    assert [(p.a, p.b, p.distance) for p in g.pairs] == [(0, 1, 4), (1, 2, 4)]  # a-c is 8


def test_signed_hashes_from_a_catalog_column_are_read_as_unsigned():
    rows = [Row("a", "train", -1), Row("b", "test", (1 << 64) - 2)]
    (g,) = nd.find_groups(rows, radius=1)
    assert g.pairs[0].distance == 1


def test_jsonl_lines():
    rows = [Row("x/2.jpg", "test", 5), Row("x/1.jpg", "train", 4)]
    buf = io.StringIO()
    assert nd.write_jsonl(nd.find_groups(rows, radius=2), buf) == 1
    assert json.loads(buf.getvalue()) == {"keys": ["x/1.jpg", "x/2.jpg"],
                                          "splits": ["train", "test"],
                                          "distances": [[0, 1, 1]]}


def test_keys_with_tabs_and_quotes_survive_the_spill():
    rows = [Row('a\t"b"\n.jpg', "train", 9), Row("c.jpg", "test", 9)]
    (g,) = nd.find_groups(rows, radius=0)
    assert g.keys == ('a\t"b"\n.jpg', "c.jpg")


@pytest.mark.parametrize("radius, bands", [(-1, None), (64, None), (3, 65)])
def test_rejects_impossible_plans(radius, bands):
    with pytest.raises(ValueError):
        nd.plan(radius, bands)


def test_plan_pigeonhole():
    p = nd.plan(10)
    assert len(p.widths) == 11 and sum(p.widths) == 64 and p.sub_radius == 0
    p = nd.plan(10, bands=nd.default_bands(10))
    assert p.widths == (16, 16, 16, 16) and p.sub_radius == 2  # 4 bands x 3 bits > 10


def test_no_rows_and_no_pairs(tmp_path):
    assert nd.find_groups([], 10, directory=tmp_path) == []
    assert nd.find_groups([Row("a", "train", 0), Row("b", "test", 2**64 - 1)], 10) == []
    assert not list(tmp_path.iterdir())
