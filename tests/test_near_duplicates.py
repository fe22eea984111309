"""beam_pipeline.dedup.near_duplicates against brute force on seeded random hashes."""

import dataclasses
import json
import random

import numpy as np
import pytest

from beam_pipeline.dedup import band_plan, descriptor
from beam_pipeline.dedup import perceptual
from beam_pipeline.dedup import multi_index as mi
from beam_pipeline.dedup import near_duplicates as nd
from beam_pipeline.dedup.near_duplicates import Row

SPLITS = ("train", "validation", "test")


def limits(monkeypatch, **values):
    """Set the join's size limits where each is defined: the plan's or the join's module."""
    for name, value in values.items():
        monkeypatch.setattr(band_plan if hasattr(band_plan, name) else mi, name, value)


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
    """Every pair within radius but old-old ones, by comparing all pairs (numpy, a block of
    rows against all at a time: 3000 rows in ~0.1 s, where a Python loop took ~1.5 s)."""
    h = np.array([r.hash for r in rows], np.uint64)
    old = np.array([r.old for r in rows], bool)
    out = set()
    for lo in range(0, len(rows), 512):
        d = np.bitwise_count(h[lo:lo + 512, None] ^ h[None, :])
        for i, j in zip(*np.nonzero(d <= radius)):
            i = int(i) + lo
            if i < j and not (old[i] and old[j]):
                a, b = rows[i], rows[j]
                out.add(tuple(sorted((a.key, b.key))) + (int(d[i - lo, j]),))
    return out


def found(rows, radius, bands=None, tmp_path=None):
    pairs = [(a.key, b.key, d) for a, b, d in nd.find_pairs(rows, radius, bands, tmp_path)]
    assert len(pairs) == len(set(pairs)), "a pair reported twice"
    return {tuple(sorted((a, b))) + (d,) for a, b, d in pairs}


@pytest.mark.parametrize("radius, bands", [(0, None), (3, None), (6, None), (6, 3), (6, 7),
                                           (10, 11), (10, None), (10, 4), (12, None), (2, 1),
                                           # wide bands, as (2, 1): ~2 s of look-ups
                                           pytest.param(4, 2, marks=pytest.mark.slow)])
def test_pairs_equal_brute_force(radius, bands, tmp_path):
    rows = seeded_rows(300, radius, seed=radius * 10 + (bands or 0))
    expected = brute(rows, radius)
    assert len(expected) > 30  # the plants make the test meaningful
    assert found(rows, radius, bands, tmp_path) == expected


def biased_rows(n, radius, seed, old_every=0):
    """pHash-like rows: the top bit always 1, two bits always 0, a big bucket of 12 rows
    within 1 bit of one hash, and planted copies."""
    rng = random.Random(seed)
    rows = seeded_rows(n, radius, seed, old_every)
    fixed = [Row(r.key, r.split, (r.hash | 1 << 63) & ~0b1001000, r.old) for r in rows]
    base = fixed[0].hash
    return fixed + [Row(f"same{i:02d}", SPLITS[i % 3], base ^ (1 << rng.randrange(8)),
                        bool(old_every) and i % 2 == 0) for i in range(12)]


@pytest.mark.parametrize("radius, bands, old_every", [(4, None, 0), (10, 4, 0), (6, 3, 2),
                                                      (10, None, 3), (0, None, 0),
                                                      (12, None, 2), (5, 2, 0)])
def test_tiny_memory_limits_give_the_same_pairs(radius, bands, old_every, tmp_path,
                                                monkeypatch):
    """Hashes read 37 rows at a time, band pieces of ~20 rows (so values are cut into piece
    files per band and compared across pieces), 5 candidates at a time (big buckets
    as tiles), buckets found by search rather than by offset table (at most 4 pieces, values
    wider than 3 bits); constant bits dropped."""
    limits(monkeypatch, SCAN_ROWS=37, TABLE_ROWS=20, PAIR_CHUNK=5, DIRECT_BITS=3,
           MAX_PIECE_BITS=2)
    rows = biased_rows(150, radius, seed=7, old_every=old_every)
    assert found(rows, radius, bands, tmp_path) == brute(rows, radius)
    assert not list(tmp_path.iterdir()), "scratch files left behind"


def test_offset_tables_and_many_pieces(tmp_path, monkeypatch):
    """Bands wider than DIRECT_BITS are cut into more pieces so buckets are found by offset
    table: 2**6 pieces per band here."""
    limits(monkeypatch, DIRECT_BITS=10)
    rows = biased_rows(300, 6, seed=9, old_every=3)
    assert found(rows, 6, 4, tmp_path) == brute(rows, 6)


@pytest.mark.parametrize("radius, bands, old_every", [(10, 11, 0), (10, 4, 3), (4, None, 0),
                                                   (6, 3, 2)])
def test_near_pairs_lists_every_candidate_once_by_keys(radius, bands, old_every, tmp_path):
    rows = seeded_rows(3000, radius, seed=99, old_every=old_every)
    pairs = nd.near_pairs(rows, radius, bands, tmp_path)
    assert [p.keys for p in pairs] == sorted(p.keys for p in pairs)
    assert all(p.keys[0] < p.keys[1] for p in pairs)
    assert {(*p.keys, p.hash_distance) for p in pairs} == found(rows, radius, bands, tmp_path)
    # no descriptors (rows as a catalog from before them): listed, never confirmed
    assert pairs and not any(p.confirmed for p in pairs)
    assert {p.why for p in pairs} == {"no descriptor (a catalog row from before it)"}


@pytest.mark.parametrize("bands", [None, 3])
def test_incremental_finds_exactly_the_pairs_with_a_new_row(bands, tmp_path):
    rows = seeded_rows(300, 6, seed=3, old_every=1)  # all old ...
    rows = [Row(r.key, r.split, r.hash, old=i < 200) for i, r in enumerate(rows)]  # 100 new
    full = brute([Row(r.key, r.split, r.hash) for r in rows], 6)
    new = {r.key for r in rows if not r.old}
    expected = {p for p in full if p[0] in new or p[1] in new}
    assert 0 < len(expected) < len(full)
    assert found(rows, 6, bands, tmp_path) == expected


def textured(seed, side=48):
    """A seeded textured image's descriptor: equal seeds, equal descriptors (confirmed).
    Its confirmation bytes alone (as catalogs before the probe hashes stored it), so the
    rows' own hashes are all the search sees."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)
    return descriptor.describe(np.kron(small, np.ones((8, 8, 1), np.uint8)))[
        -descriptor.CONFIRM_SIZE:]


def test_pairs_are_confirmed_by_descriptors_and_leaks_need_a_direct_pair():
    h = 0x0123456789ABCDEF
    same, other = textured(1), textured(2)
    rows = [Row("c.jpg", "test", h ^ 0b111, descriptor=same), Row("a.jpg", "train", h,
            descriptor=same), Row("b.jpg", "train", h ^ 0b1, descriptor=same),
            Row("z.jpg", "test", ~h & (2**64 - 1), descriptor=same),
            Row("d.jpg", "validation", h ^ 0xFF00000000000000, descriptor=other),
            Row("e.jpg", "test", (h ^ 0xFF00000000000000) ^ 0b10, descriptor=same)]
    pairs = nd.near_pairs(rows, radius=4)
    # a-b 1 bit, a-c 3, b-c 2 (all confirmed); d-e 1 bit but their descriptors differ
    assert [(p.keys, p.hash_distance, p.confirmed) for p in pairs] == [
        (("a.jpg", "b.jpg"), 1, True), (("a.jpg", "c.jpg"), 3, True),
        (("b.jpg", "c.jpg"), 2, True), (("d.jpg", "e.jpg"), 1, False)]
    assert pairs[1].splits == ("train", "test") and pairs[1].leak() == "c.jpg"
    assert pairs[0].leak() is None and pairs[3].leak() is None  # train-train; rejected
    s, c = pairs[3].structure, pairs[3].chroma
    # descriptors without the colour grid: their chroma is of the whole means, held to its limit
    assert all(p.mean_colour for p in pairs)
    assert s > descriptor.MAX_STRUCTURE and c > descriptor.MAX_MEAN_CHROMA
    assert pairs[3].why == (f"structure differs ({s:g} > {descriptor.MAX_STRUCTURE:g}), "
                            f"colour differs ({c:g} > {descriptor.MAX_MEAN_CHROMA:g})")
    assert pairs[3].excess() == pytest.approx(max(s / descriptor.MAX_STRUCTURE,
                                                  c / descriptor.MAX_MEAN_CHROMA))
    assert nd.components(pairs) == [("a.jpg", "b.jpg", "c.jpg")]


def test_why_names_each_measure_past_its_limit_and_by_how_much():
    def pair(structure, chroma, mean_colour=False):
        return nd.NearPair(("a", "b"), ("train", "test"), 5, structure, chroma, False,
                           mean_colour)

    assert pair(0.3412, 1.0).why == "structure differs (0.3412 > 0.31)"
    assert pair(0.01, 3.03).why == "colour differs (3.03 > 2.5)"
    assert pair(0.6014, 11.2).why == ("structure differs (0.6014 > 0.31), "
                                      "colour differs (11.2 > 2.5)")
    # a row without the colour grid: the whole means, held to their own limit
    assert pair(0.01, 3.03, True).why == "within the limits"
    assert pair(0.01, 5.03, True).why == "colour differs (5.03 > 4.4)"
    # against a build's own limits (a version records them; one from before the grid only
    # max_chroma, of the means, which its lines (no mean_colour) are held to)
    assert pair(0.27, 1.0).reason(0.25, 3.0) == "structure differs (0.27 > 0.25)"
    assert pair(0.27, 1.0).excess(0.25, 3.0) == pytest.approx(0.27 / 0.25)
    assert pair(0.01, 5.0, True).excess(0.25, 3.0, 4.0) == pytest.approx(5.0 / 4.0)
    assert pair(0.01, 5.0).excess(0.25, 4.4) == pytest.approx(5.0 / 4.4)
    assert nd.NearPair(("a", "b"), ("x", "y"), 1, 0.0, 0.0, True).why == ""


def test_closest_rejected_are_the_cross_split_rejects_nearest_the_limits():
    pairs = [nd.NearPair(("a", "b"), ("train", "test"), 7, 0.61, 0.0, False),  # 1.97x
             nd.NearPair(("c", "d"), ("train", "test"), 3, 0.01, 4.5, False),  # 1.80x
             nd.NearPair(("e", "f"), ("train", "train"), 1, 0.30, 0.0, False),  # one split
             nd.NearPair(("g", "h"), ("test", "train"), 2, 0.01, 0.1, True),  # confirmed
             nd.NearPair(("i", "j"), ("train", "test"), 1, None, None, False),  # none: last
             nd.NearPair(("k", "l"), ("validation", "train"), 8, 0.32, 1.0, False),  # 1.03x
             nd.NearPair(("m", "n"), ("train", "test"), 3, 0.01, 4.5, False, True)]  # 1.02x
    assert [p.keys for p in nd.closest_rejected(pairs, 10)] == [
        ("m", "n"), ("k", "l"), ("c", "d"), ("a", "b"), ("i", "j")]
    assert [p.keys for p in nd.closest_rejected(pairs, 2)] == [("m", "n"), ("k", "l")]
    # the build's limits order them: chroma 4.5 of 9 is nearer than structure 0.32 of 0.29
    assert [p.keys for p in nd.closest_rejected(pairs, 1, 0.29, 9.0, 9.0)] == [("c", "d")]
    assert [p.keys for p in nd.closest_rejected(pairs, 1, 0.31, 4.0, 4.0)] == [("k", "l")]
    assert nd.closest_rejected(pairs, 0) == []


def test_a_chain_is_not_a_pair():
    """a~b and b~c confirmed, a-c 8 bits apart: c leaks only through its own pair with a
    train image, and a component lists all three without making a-c a pair."""
    d = textured(3)
    rows = [Row("a", "train", 0, descriptor=d), Row("b", "test", 0b1111, descriptor=d),
            Row("c", "test", 0xFF, descriptor=d)]
    pairs = nd.near_pairs(rows, radius=4)
    assert [(p.keys, p.hash_distance) for p in pairs] == [(("a", "b"), 4), (("b", "c"), 4)]
    assert {p.leak() for p in pairs} == {"b", None}  # c pairs only with b (test): no leak
    assert nd.components(pairs) == [("a", "b", "c")]


def test_a_pair_found_only_through_the_corner_probes_comes_back_whole():
    """An original and its copy cut to the top-left 95%: the copy's whole hash equals the
    original's first probe, 0 bits, where the whole hashes differ more than the radius. The
    rows come back with their own hashes, centre (or none) and descriptor bytes."""
    rng = np.random.default_rng(11)
    img = (rng.integers(0, 256, (12, 16), dtype=np.uint8).repeat(4, 0).repeat(4, 1))
    h, w = img.shape
    copy = img[:h - (h + 10) // 20, :w - (w + 10) // 20]
    d_img, d_copy = descriptor.describe(img), descriptor.describe(copy)
    whole, centre = perceptual.phash_pair(img)
    rows = [Row("original.jpg", "train", whole, descriptor=d_img),
            Row("copy.jpg", "test", perceptual.phash(copy), center=perceptual.phash_pair(copy)[1],
                descriptor=d_copy)]
    assert perceptual.hamming(rows[0].hash, rows[1].hash) > 2
    assert descriptor.probes(d_img)[0] == rows[1].hash
    ((a, b, dist),) = nd.find_pairs(rows, radius=2)
    assert dist == 0 and {a.key, b.key} == {"original.jpg", "copy.jpg"}
    back = {r.key: r for r in (a, b)}
    assert back["original.jpg"] == rows[0] and back["copy.jpg"] == rows[1]
    (pair,) = nd.near_pairs(rows, radius=2)
    assert pair.confirmed and pair.leak() == "copy.jpg"
    assert not pair.mean_colour and "mean_colour" not in pair.to_json()  # both have the grid
    (cut,) = nd.near_pairs([rows[0], dataclasses.replace(rows[1], descriptor=d_copy[:32] +
                                                          d_copy[80:])], radius=2)
    assert cut.mean_colour and cut.structure == pair.structure  # one without: whole means
    assert not list(nd.find_pairs([dataclasses.replace(r, descriptor=r.descriptor[32:])
                                   for r in rows], radius=2))  # without the probes: none


def test_a_pair_found_only_through_the_thumbnail_probe_comes_back_whole():
    """Two rows whose six stored hashes are all far apart but whose thumbnails are one: the
    seventh hash, made at commit from the thumbnail's central 85%, pairs them at 0 bits, and
    the rows come back with their own hashes, centre and descriptor. A flat thumbnail, or a
    descriptor without stored probes, gets no seventh hash."""
    rng = np.random.default_rng(12)
    d = descriptor.describe(rng.integers(0, 256, (12, 16, 3), dtype=np.uint8).repeat(4, 0)
                            .repeat(4, 1))
    far = [rng.integers(0, 2**63, 6, dtype=np.int64).tolist() for _ in range(2)]
    assert min(perceptual.hamming(a, b) for a in far[0] for b in far[1]) > 12
    rows = [Row(f"{k}.jpg", "train", h[0], center=h[1],
                descriptor=b"".join(x.to_bytes(8, "big") for x in h[2:]) + d[32:])
            for k, h in enumerate(far)]
    made = descriptor.thumbnail_probes([r.descriptor for r in rows])
    assert made[0] == made[1] and made[0] not in far[0] + far[1]
    ((a, b, dist),) = nd.find_pairs(rows, radius=8)
    assert dist == 0 and {a.key: a for a in (a, b)} == {r.key: r for r in rows}
    (pair,) = nd.near_pairs(rows, radius=8)
    assert pair.confirmed and pair.structure == 0.0
    flat = d[:32] + bytes(d[32:-descriptor.CONFIRM_SIZE]) + bytes([100] * 256) + d[-3:]
    assert descriptor.thumbnail_probes([flat, d[-descriptor.CONFIRM_SIZE:], None, d[32:]]) == [
        None] * 4
    old = [dataclasses.replace(r, descriptor=r.descriptor[-descriptor.CONFIRM_SIZE:])
           for r in rows]
    assert not list(nd.find_pairs(old, radius=8))  # no stored probes: no thumbnail probe


def test_the_thumbnail_probe_is_the_phash_of_the_thumbnails_central_85_percent():
    """The probe against one made independently: the thumbnail's central 85% resampled back
    to 16 px by Pillow (bilinear), scipy's DCT-II, its 8x8 lowest frequencies, each bit above
    their median. Adding 10 levels (brightness) moves only the DC term: the same hash."""
    from PIL import Image
    from scipy.fft import dct

    side = descriptor.SIDE
    thumb = np.random.default_rng(13).integers(20, 200, (side, side)).astype(np.float32)

    def desc(t):
        return (bytes(8 * descriptor.PROBES + 48) + t.astype(np.uint8).tobytes()
                + bytes([120, 128, 128]))

    (h,), (brighter,) = (descriptor.thumbnail_probes([desc(t)]) for t in (thumb, thumb + 10))
    cut = np.asarray(Image.fromarray(thumb, "F").resize(
        (side, side), Image.Resampling.BILINEAR, box=(1.2, 1.2, 14.8, 14.8)), np.float64)
    low = dct(dct(cut, axis=0), axis=1)[:8, :8].ravel()
    assert h == int("".join("1" if b else "0" for b in low > np.median(low)), 2)
    assert h == brighter and 20 < h.bit_count() < 44


def test_signed_hashes_from_a_catalog_column_are_read_as_unsigned():
    rows = [Row("a", "train", -1), Row("b", "test", (1 << 64) - 2)]
    (p,) = nd.near_pairs(rows, radius=1)
    assert p.hash_distance == 1


def test_jsonl_lines_round_trip():
    d = textured(4)
    rows = [Row("x/2.jpg", "test", 5, descriptor=d), Row("x/1.jpg", "train", 4, descriptor=d),
            Row("y/1.jpg", "train", 0xFFFF << 40, descriptor=textured(5)),
            Row("y/2.jpg", "test", 0xFFFF << 40)]
    pairs = nd.near_pairs(rows, radius=2)
    lines = [json.loads(p.to_json()) for p in pairs]
    assert lines[0] == {"keys": ["x/1.jpg", "x/2.jpg"], "splits": ["train", "test"],
                        "hash_distance": 1, "structure": 0.0, "chroma": 0.0,
                        "mean_colour": True}  # descriptors without the colour grid
    assert lines[1]["why"] == "no descriptor (a catalog row from before it)"
    assert lines[1]["structure"] is None
    assert list(nd.read_pairs(p.to_json() for p in pairs)) == pairs
    # the earlier group form is not read as pairs: a build after it compares everything
    assert list(nd.read_pairs(['{"keys": ["a", "b"], "splits": ["train", "test"], '
                               '"distances": [[0, 1, 3]]}'])) == []


def test_keys_with_tabs_quotes_and_escapes_survive_the_spill():
    odd = ['a\t"b"\n.jpg', "c\\t.jpg", "d\\\\n\r.jpg", "e\u2028\udcff.jpg"]
    rows = [Row(k, "train", 9) for k in odd] + [Row("z.jpg", "te\\st", 9)]
    pairs = nd.near_pairs(rows, radius=0)
    assert {k for p in pairs for k in p.keys} == set(odd + ["z.jpg"])
    assert "te\\st" in {s for p in pairs for s in p.splits}


@pytest.mark.parametrize("radius, bands", [(-1, None), (64, None), (3, 65)])
def test_rejects_impossible_plans(radius, bands):
    with pytest.raises(ValueError):
        list(nd.find_pairs([Row("a", "train", 1)], radius, bands))


def test_a_plan_too_wide_to_enumerate_is_refused():
    with pytest.raises(ValueError, match="values within the sub-radius"):
        list(nd.find_pairs(seeded_rows(20, 10, seed=1), 10, bands=1))


def stats(n, old=0, ones=None):
    return band_plan.Stats(n - old, old, tuple(ones or [n // 2] * 63 + [n]))


def test_plan_pigeonhole_over_the_informative_bits():
    p = band_plan.make_plan(10, 4, stats(1000))  # top bit always 1: 63 bits, equal entropy
    assert sum(p.widths) == 63 and sorted(p.widths) == [15, 16, 16, 16]
    assert p.runs == ((0, 63),) and p.sub_radius == 2  # 4 bands x 3 bits > 10
    assert band_plan.make_plan(10, 11, stats(1000)).sub_radius == 0


def test_plan_grows_wider_bands_as_rows_grow():
    """The cost model trades look-ups (values within the sub-radius) for compared pairs: more
    rows, fewer and wider bands."""
    bands = [len(band_plan.choose_plan(10, stats(n)).widths) for n in (1_000, 100_000, 10_000_000)]
    assert bands == sorted(bands, reverse=True) and bands[0] > bands[-1]
    assert len(band_plan.choose_plan(4, stats(10_000_000)).widths) <= 3


def test_found_share_counts_the_placements_every_band_misses():
    """Brute force over every placement of the differing bits: a pair is found when some
    band holds at most the sub-radius of them."""
    import itertools

    p = band_plan.Plan(9, (4, 3, 5), probe=1)
    assert p.sub_radius == 1 and p.exact_radius == 5
    starts = p.starts
    for distance in range(0, 11):
        placements = list(itertools.combinations(range(12), distance))
        hit = sum(any(sum(start <= b < start + w for b in bits) <= 1
                      for w, start in zip(p.widths, starts)) for bits in placements)
        want = hit / len(placements) if distance <= p.radius else 0.0
        assert band_plan.found_share(p, distance) == pytest.approx(want), distance
    assert band_plan.found_share(p, 5) == 1.0 and band_plan.found_share(p, 6) < 1.0
    assert band_plan.found_share(band_plan.Plan(2, (3, 3), probe=0), 2) == pytest.approx(6 / 15)


def test_past_its_budget_the_plan_is_multi_probe_and_says_what_it_finds():
    """Exact radius-10 search costs more per row as rows grow; past BUDGET the plan keeps
    the cost and gives up the pairs no band holds within its sub-radius."""
    small, big = band_plan.choose_plan(10, stats(20_000)), band_plan.choose_plan(10, stats(2_000_000))
    assert small.probe is None and small.exact_radius == 10
    assert band_plan.choose_plan(10, stats(10)).exact_radius == 10  # under BUDGET_FLOOR: exact
    assert big.probe is not None and big.exact_radius < 10
    assert band_plan.estimate(big, stats(2_000_000)) <= band_plan.BUDGET * 2_000_000
    exact = min((band_plan.make_plan(10, b, stats(2_000_000)) for b in range(1, 12)),
                key=lambda p: band_plan.estimate(p, stats(2_000_000)))
    assert band_plan.estimate(exact, stats(2_000_000)) > band_plan.BUDGET * 2_000_000
    assert 0.5 < band_plan.found_share(big, 10) < 1.0 and band_plan.found_share(big, big.exact_radius) == 1
    # a night of 1% new rows against them stays exact: its cost is per spilled row
    assert band_plan.choose_plan(10, stats(2_020_000, old=2_000_000)).exact_radius == 10


def test_a_multi_probe_search_finds_exactly_the_pairs_some_band_holds(tmp_path, monkeypatch):
    monkeypatch.setattr(band_plan, "BUDGET", 1e-9)  # any plan is over budget: a probe plan
    monkeypatch.setattr(band_plan, "BUDGET_FLOOR", 0.0)
    rows = rows_with_centres(300, 10, seed=21, old_every=4)
    plans = []
    got = {(a.key, b.key, d) for a, b, d in nd.find_pairs(rows, 10, None, tmp_path,
                                                          plans.append)}
    (p,) = plans
    assert p.probe is not None and p.exact_radius < 10

    def held(x, y):  # the join's rule for one pair of hashes, band by band
        if (x ^ y).bit_count() > 10:
            return False
        c = int(p.compress(np.array([x ^ y], np.uint64))[0])
        assert bool(band_plan.found_by(p, [x ^ y])[0]) == ((x ^ y).bit_count() <= 10 and any(
            ((c >> start) & ((1 << w) - 1)).bit_count() <= p.sub_radius
            for w, start in zip(p.widths, p.starts)))
        return bool(band_plan.found_by(p, [x ^ y])[0])

    def hashes(r):
        return [r.hash] + ([r.center] if r.center is not None else [])

    want = set()
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            ds = [(x ^ y).bit_count() for x in hashes(a) for y in hashes(b) if held(x, y)]
            if ds and not (a.old and b.old):
                want.add(tuple(sorted((a.key, b.key))) + (min(ds),))
    assert {tuple(sorted(k[:2])) + (k[2],) for k in got} == want
    everything = {pair[:2]: pair[2] for pair in least_brute(rows, 10)}
    missed = everything.keys() - {pair[:2] for pair in want}
    assert missed and len(want) > 40  # the plan gave some pairs up, and the test sees which
    assert all(everything[k] > p.exact_radius for k in missed)  # pigeonhole below it


def test_constant_bits_are_left_out_and_cut_runs_compress():
    ones = [0] * 64
    ones[5:20] = [50] * 15
    ones[40:60] = [50] * 20
    p = band_plan.make_plan(3, 2, band_plan.Stats(100, 0, tuple(ones)))
    assert p.runs == ((5, 15), (40, 20)) and sum(p.widths) == 35
    import numpy as np
    h = np.array([(0b101 << 5) | (0b11 << 40)], np.uint64)
    assert int(p.compress(h)[0]) == 0b101 | 0b11 << 15


def test_identical_hashes_only(tmp_path):
    rows = [Row(f"k{i}", "train", 42) for i in range(5)]
    assert len(found(rows, 3, None, tmp_path)) == 10


def test_no_rows_and_no_pairs(tmp_path):
    assert nd.near_pairs([], 10, directory=tmp_path) == []
    assert nd.near_pairs([Row("a", "train", 0), Row("b", "test", 2**64 - 1)], 10) == []
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("bands", [None, 4])
def test_incremental_pairs_equal_a_full_run(bands, tmp_path):
    """Old rows paired by an earlier run (its measured pairs carried over) plus new rows
    searched against them give the pairs a run over everything gives."""
    rows = [Row(r.key, r.split, r.hash, descriptor=textured(k % 7))
            for k, r in enumerate(seeded_rows(400, 10, seed=11))]
    earlier = nd.near_pairs(rows[:300], 10, bands, tmp_path)
    known = list(nd.read_pairs(p.to_json() for p in earlier))
    assert any(p.confirmed for p in known) and not all(p.confirmed for p in known)
    now = [dataclasses.replace(r, old=i < 300) for i, r in enumerate(rows)]
    assert nd.near_pairs(now, 10, bands, tmp_path, known) == nd.near_pairs(rows, 10, bands)


def test_band_pieces_in_memory_stay_near_table_rows(tmp_path, monkeypatch):
    """Memory is bounded by TABLE_ROWS, not by the rows: 1500 rows, pieces of ~64."""
    limits(monkeypatch, TABLE_ROWS=64)
    sizes = []
    table = mi._Table

    def recording(h, *args):
        sizes.append(len(h))
        return table(h, *args)

    monkeypatch.setattr(mi, "_Table", recording)
    rows = seeded_rows(1500, 6, seed=5)
    assert found(rows, 6, 3, tmp_path) == brute(rows, 6)
    assert max(sizes) <= 2 * 64 and len(sizes) > 3 * 1500 // 64


# --- two hashes per row (whole image and central 90%) -----------------------------------------

def rows_with_centres(n, radius, seed, old_every=0):
    """seeded_rows with a second hash per row: mostly a few bits from the row's own (so a
    row's two hashes are often within the radius of each other), for some rows near another
    row's hash, for one row in 7 none (a catalog row from before the second hash)."""
    rng = random.Random(seed + 1)
    rows = seeded_rows(n, radius, seed, old_every)
    out = []
    for k, r in enumerate(rows):
        pick = rng.random()
        if pick < 1 / 7:
            center = None
        elif pick < 0.4 and k:
            other = rows[rng.randrange(k)]
            flips = rng.sample(range(64), rng.randint(0, radius + 2))
            center = other.hash ^ sum(1 << f for f in flips)
        else:
            center = r.hash ^ sum(1 << f for f in rng.sample(range(64), rng.randint(0, 12)))
        out.append(Row(r.key, r.split, r.hash, r.old, center))
    return out


def least_brute(rows, radius):
    """Every pair of distinct rows whose least distance over their hashes is within radius."""
    def hashes(r):
        return (r.hash,) if r.center is None else (r.hash, r.center)

    out = set()
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            d = min((x ^ y).bit_count() for x in hashes(a) for y in hashes(b))
            if d <= radius and not (a.old and b.old):
                out.add(tuple(sorted((a.key, b.key))) + (d,))
    return out


@pytest.mark.parametrize("radius, bands, old_every", [
    (10, None, 0), (10, 4, 3), (6, None, 2), (12, None, 0),
    pytest.param(0, None, 0, marks=pytest.mark.slow)])  # ~1 s; radius 0: the brute-force test
def test_two_hashes_per_row_give_each_pair_once_at_its_least_distance(radius, bands, old_every,
                                                                       tmp_path):
    rows = rows_with_centres(300, radius, seed=radius + 5, old_every=old_every)
    expected = least_brute(rows, radius)
    whole_only = brute(rows, radius)
    assert len(expected) > len(whole_only) > 20  # the centres add pairs, and shorten some
    pairs = list(nd.find_pairs(rows, radius, bands, tmp_path))
    assert all(a.key != b.key for a, b, _ in pairs)  # a row's own two hashes: no pair
    assert all(r.center == {x.key: x for x in rows}[r.key].center for p in pairs for r in p[:2])
    assert found(rows, radius, bands, tmp_path) == expected


def test_two_hashes_with_tiny_memory_limits(tmp_path, monkeypatch):
    limits(monkeypatch, SCAN_ROWS=37, TABLE_ROWS=20, PAIR_CHUNK=5, DIRECT_BITS=3)
    rows = rows_with_centres(150, 10, seed=8, old_every=3)
    assert found(rows, 10, None, tmp_path) == least_brute(rows, 10)
    assert not list(tmp_path.iterdir()), "scratch files left behind"


def test_a_row_near_only_through_its_centre_is_a_candidate():
    h = 0x0123456789ABCDEF
    rows = [Row("a.jpg", "train", h, center=h ^ 0xFFFF),
            Row("crop.jpg", "test", h ^ 0xFFFF ^ 0b11, center=h ^ 0xFFFF ^ 0b111000),
            Row("old.jpg", "test", h ^ 0b1)]  # no centre: a catalog row from before
    pairs = nd.near_pairs(rows, radius=4)
    # a-crop: centre vs whole 2 bits (whole vs whole 18); a-old 1; crop-old 15+: no pair
    assert [(p.keys, p.hash_distance) for p in pairs] == [(("a.jpg", "crop.jpg"), 2),
                                                           (("a.jpg", "old.jpg"), 1)]


def test_two_hashes_per_row_and_no_pairs_between_rows(tmp_path):
    """Each row's own two hashes pair (and are dropped): no pair between rows is left, which
    once indexed empty arrays with a one-element mask ('boolean index did not match')."""
    rng = random.Random(11)
    rows = [Row(f"k{i}", "train", h, center=h ^ 0b1)
            for i, h in enumerate(rng.getrandbits(64) for _ in range(40))]
    assert all((a.hash ^ b.hash).bit_count() > 12 for i, a in enumerate(rows) for b in rows[i + 1:])
    assert list(nd.find_pairs(rows, 10, None, tmp_path)) == []
    assert nd.near_pairs(rows, 10, directory=tmp_path) == []


def test_the_summary_says_when_the_search_was_multi_probe():
    from beam_pipeline.manifest_text import near_duplicates_line

    near = {"radius": 8, "exact_radius": 8, "found_at_radius": 1.0, "pairs": 3,
            "candidates": 5, "pairs_across_splits": 1, "leaks": 1, "excluded": 0}
    exact = near_duplicates_line({"near_duplicates": near})
    assert "exact within" not in exact and exact.startswith("near-duplicates (pHash within 8")
    probe = near_duplicates_line({"near_duplicates": dict(near, exact_radius=5,
                                                          found_at_radius=0.508)})
    assert probe == exact + "; exact within 5 bits, pairs 8 bits apart found ~51% of the time"
    older = dict(near)
    del older["exact_radius"], older["found_at_radius"]  # a manifest from before the fields
    assert near_duplicates_line({"near_duplicates": older}) == exact
