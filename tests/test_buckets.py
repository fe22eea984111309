"""algorithms/buckets.py: streams sorted by buckets give a sorted spill's order, line for
line (seeded random lines, several buckets, flushed files, repeats, an overfull range)."""

import random

from beam_pipeline.algorithms import buckets
from beam_pipeline.algorithms.buckets import NumberedSpill, RangeSpill
from beam_pipeline.algorithms.spill import SortedSpill


def _sorted_spill(items, directory):
    with SortedSpill(str(directory), chunk_lines=50) as spill:
        for key, line in items:
            spill.add(key, line)
        return list(spill)


def test_numbered_spill_gives_the_zero_padded_sorted_spills_order(tmp_path, monkeypatch):
    monkeypatch.setattr(buckets, "PENDING_LINES", 37)  # some lines flushed to files, some held
    rnd = random.Random(7)
    items = [(rnd.randrange(1000), f'["k{rnd.randrange(10**6)}", {i}]') for i in range(700)]
    items += [(5, '["b", 1]'), (5, '["a", 2]'), (999, '["z", 3]')]  # repeats: by text
    with NumberedSpill(str(tmp_path), bucket_rows=64) as spill:
        for number, text in items:
            spill.add(number, text)
        assert len(spill) == len(items)
        got = list(spill)
    want = [(int(k), line) for k, line in _sorted_spill(
        [(f"{n:012d}", text) for n, text in items], tmp_path)]
    assert got == want
    assert [n for n, _ in got] == sorted(n for n, _ in items)
    assert not list(tmp_path.glob("bucket-*"))  # closed: its files removed


def test_range_spill_gives_the_sorted_spills_order_whatever_the_bounds(tmp_path, monkeypatch):
    monkeypatch.setattr(buckets, "PENDING_LINES", 41)
    rnd = random.Random(11)
    items = [(f'"class{rnd.randrange(30):02d}/{rnd.randrange(10**5)}.jpg"', f"[{i}, null]")
             for i in range(900)]
    want = _sorted_spill(items, tmp_path)
    keys = sorted(k for k, _ in items)
    for bounds, most in [(keys[100::100], 10_000),  # a sample's ranges, sorted in memory
                         ([keys[450]], 10_000),      # two ranges
                         ([], 10_000),               # one range
                         (['"class05'], 100)]:       # ranges over `most`: sorted on disk
        with RangeSpill(bounds, str(tmp_path), most=most) as spill:
            for start in range(0, len(items), 64):
                spill.extend_texts([f"{k}\t{line}\n" for k, line in items[start:start + 64]])
            assert len(spill) == len(items)
            assert list(spill) == want, bounds
    assert not list(tmp_path.glob("bucket-*")) and not list(tmp_path.glob("spill-*"))
