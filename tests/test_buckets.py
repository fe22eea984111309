"""algorithms/buckets.py: a stream sorted by row-number buckets gives a sorted spill's order,
line for line (seeded random lines, several buckets, flushed files, repeats)."""

import random

from beam_pipeline.algorithms import buckets
from beam_pipeline.algorithms.buckets import NumberedSpill
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

