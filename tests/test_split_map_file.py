"""The split map read and written a row group at a time (store/split_map_file.py): the same
bytes as the map built whole, the same answers as the map held whole."""

import base64
import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from beam_pipeline.store import split_map, split_map_file

SPLITS = ["train", "test", "validation", "zeta"]


def _rows(n, seed, pool=300):
    """Catalog rows drawn from `pool` contents: repeats, rows without an input sha256, md5s
    missing or (for one content in ten) differing between copies, four splits."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        c = int(rng.integers(0, pool))
        sha = None if rng.random() < 0.05 else hashlib.sha256(str(c).encode()).hexdigest()
        other = 1000 if rng.random() < 0.1 else 0
        md5 = (None if rng.random() < 0.3 else
               base64.b64encode(hashlib.md5(str(c + other).encode()).digest()).decode())
        rows.append((sha, 100 + c % 50, SPLITS[int(rng.integers(0, 4))], md5))
    return rows


def _catalog(path, rows, group=37):
    """A catalog.parquet with the four columns a map is made from, `group` rows a row group."""
    schema = pa.schema([("input_sha256", pa.string()), ("input_size", pa.int64()),
                        ("split", pa.string()), ("input_md5", pa.string())])
    with pq.ParquetWriter(str(path), schema) as writer:
        for start in range(0, len(rows), group):
            part = list(zip(*rows[start:start + group]))
            writer.write_table(pa.table(dict(zip(schema.names, part)), schema=schema))
    return str(path)


@pytest.fixture
def small(monkeypatch):
    """Row groups of 64 rows, runs of 50, blocks of 16: every seam crossed many times."""
    monkeypatch.setattr(split_map_file, "ROW_GROUP", 64)
    monkeypatch.setattr(split_map_file, "RUN_ROWS", 50)
    monkeypatch.setattr(split_map_file, "BLOCK_ROWS", 16)


def _whole(path, smap, row_group=64):
    """split_map.write's bytes, with its row groups as small as the fixture's."""
    with open(path, "wb") as f:
        pq.write_table(split_map.table(smap), f, compression="zstd", row_group_size=row_group)
    return open(path, "rb").read()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_map_built_from_sorted_runs_has_the_bytes_of_one_built_whole(tmp_path, small, seed):
    first = _catalog(tmp_path / "v1.parquet", _rows(500, seed))
    later = _catalog(tmp_path / "v2.parquet", _rows(300, seed + 10))
    streamed = str(tmp_path / "s1.parquet")
    assert split_map_file.build(None, first, streamed) == len(split_map.add_catalog(None, first))
    whole = split_map.add_catalog(None, first)
    assert open(streamed, "rb").read() == _whole(tmp_path / "w1.parquet", whole)
    assert pq.ParquetFile(streamed).num_row_groups > 3
    # The next version's map, from the streamed map on disk and from the whole one.
    expected = _whole(tmp_path / "w2.parquet", split_map.add_catalog(
        split_map.read(streamed), later))
    split_map_file.build(split_map_file.open_stored(streamed), later, str(tmp_path / "s2"))
    assert open(tmp_path / "s2", "rb").read() == expected
    # A version written before split maps: its catalog, read whole, is the old map.
    split_map_file.build(split_map.read_catalog(first), later, str(tmp_path / "s3"))
    assert open(tmp_path / "s3", "rb").read() == expected


def test_a_map_written_before_the_md5_column_is_built_on_and_looked_up(tmp_path, small):
    first = _catalog(tmp_path / "v1.parquet", _rows(400, 5))
    later = _catalog(tmp_path / "v2.parquet", _rows(300, 6))
    old = str(tmp_path / "old.parquet")
    split_map.write(str(tmp_path / "m.parquet"), split_map.add_catalog(None, first))
    pq.write_table(pq.read_table(str(tmp_path / "m.parquet")).drop_columns(["md5"]), old)
    expected = _whole(tmp_path / "w.parquet", split_map.add_catalog(split_map.read(old), later))
    stored = split_map_file.open_stored(old)
    split_map_file.build(stored, later, str(tmp_path / "s.parquet"))
    assert open(tmp_path / "s.parquet", "rb").read() == expected
    size = _rows(400, 5)[0][1]
    assert stored.probe({("AAAAAAAAAAAAAAAAAAAAAA==", size)}, {size}).has_size_without_md5(size)


def test_an_empty_catalog_writes_the_empty_map_write_writes(tmp_path, small):
    empty = _catalog(tmp_path / "v.parquet", [(None, 10, "train", None)])
    split_map_file.build(None, empty, str(tmp_path / "s.parquet"))
    assert open(tmp_path / "s.parquet", "rb").read() == _whole(
        tmp_path / "w.parquet", split_map.add_catalog(None, empty))


def test_a_stored_map_answers_as_the_map_held_whole(tmp_path, small):
    rows = _rows(600, 3)
    path = str(tmp_path / "m.parquet")
    split_map_file.build(None, _catalog(tmp_path / "v.parquet", rows), path)
    whole, stored = split_map.read(path), split_map_file.open_stored(path)
    assert (len(stored), stored.names, stored.source) == (len(whole), whole.names, path)
    shas = sorted({r[0] for r in rows if r[0]} | {hashlib.sha256(b"x%d" % i).hexdigest()
                                                  for i in range(40)})
    got = list(stored.splits_of([(None, "none")] + [(s, s) for s in shas]))
    assert got == [("none", None)] + [(s, whole.split_of(s)) for s in shas]
    assert sum(split is not None for _, split in got) == len(whole)  # a digest ending in 0 too
    md5s = {(r[3], r[1]) for r in rows if r[3]} | {(r[3], r[1] + 1) for r in rows if r[3]}
    sizes = set(range(90, 160))
    probe = stored.probe(md5s, sizes)
    assert [probe.split_of_md5(m, s) for m, s in sorted(md5s)] == [
        whole.split_of_md5(m, s) for m, s in sorted(md5s)]
    assert [(probe.has_size(s), probe.has_size_without_md5(s)) for s in sorted(sizes)] == [
        (whole.has_size(s), whole.has_size_without_md5(s)) for s in sorted(sizes)]
    with pytest.raises(KeyError, match="size 5000 was not asked about"):
        probe.has_size(5000)


def test_a_damaged_map_is_unreadable_at_open_naming_it(tmp_path, small):
    path = tmp_path / "m.parquet"
    split_map_file.build(None, _catalog(tmp_path / "v.parquet", _rows(300, 4)), str(path))
    whole = path.read_bytes()
    (tmp_path / "cut.parquet").write_bytes(whole[:len(whole) // 2])
    with pytest.raises(split_map.SplitMapUnreadable, match="cut.parquet: unreadable"):
        split_map_file.open_stored(str(tmp_path / "cut.parquet"))
    with pytest.raises(split_map.SplitMapUnreadable, match="gone.parquet: missing"):
        split_map_file.open_stored(str(tmp_path / "gone.parquet"))
