"""What the split map (split_map.parquet) costs a night, at N published images (default 1M).

    python benchmarks/bench_split_map.py [--n N]

A generated root: a split map of N contents and a catalog.parquet of N rows (one row group
per ~2,000-image shard, every column filled as a build fills it), seeded. A night with 1%
new images, timed:

  * launcher: read the newest map, look the new images up by their listing md5 (gs://, the
    first lookup builds the md5 index) and by size and content (a local root);
  * commit: read the previous map, add this version's catalog, write the new map;
  * the same two as builds now do them (store/split_map_file.py), the map never held whole:
    opened, probed by md5 and size, merge-joined by content; built from sorted runs (the
    same bytes, checked);

beside the baseline a build pays anyway: reading the catalog's three columns the map is
made from. Prints bytes, seconds, µs per published image per night, and the peak RSS.
"""

import base64
import os
import resource
import sys
import tempfile
import time
import tracemalloc

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from beam_pipeline.store import catalog, split_map, split_map_file  # noqa: E402
from benchmarks.common import Record, add_record_argument  # noqa: E402

ROWS_PER_SHARD = 2000


def fake_catalog(path, n, seed=0):
    """A catalog.parquet of n rows with random contents, in the catalog's schema."""
    rng = np.random.default_rng(seed)
    splits = np.array(["train", "validation", "test"], dtype=object)
    with pq.ParquetWriter(path, catalog.SCHEMA) as writer:
        for start in range(0, n, ROWS_PER_SHARD):
            m = min(ROWS_PER_SHARD, n - start)
            raw = rng.integers(0, 256, (m, 32), dtype=np.uint8)
            hexes = [bytes(r).hex() for r in raw]
            keys = [f"photos/class{(start + i) % 1000:04d}/img{start + i:08d}.jpg"
                    for i in range(m)]
            split = splits[rng.choice(3, m, p=[0.8, 0.1, 0.1])]
            cols = {
                "key": keys, "uri": ["/data/" + k for k in keys],
                "label": [k.split("/")[1] for k in keys], "label_id": np.zeros(m, np.int64),
                "split": split.tolist(), "shard": np.zeros(m, np.int32),
                "file": [f"x-{split[0]}.tfrecord-{start // ROWS_PER_SHARD:05d}"] * m,
                "position": np.arange(m, dtype=np.int32),
                "offset": np.arange(m, dtype=np.int64) * 40_000,
                "length": np.full(m, 40_000, np.int64), "sha256": hexes,
                "height": np.full(m, 375, np.int32), "width": np.full(m, 500, np.int32),
                "input_size": rng.integers(20_000, 80_000, m), "input_stamp": ["1:1"] * m,
                "input_sha256": hexes, "phash": [None] * m, "phash_center": [None] * m,
                "input_md5": [base64.b64encode(bytes(r[:16])).decode() for r in raw],
            }
            cols.update({f.name: [None] * m for f in catalog.SCHEMA
                         if f.name not in cols})
            writer.write_table(pa.table({f.name: cols[f.name] for f in catalog.SCHEMA},
                                        schema=catalog.SCHEMA))


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main():
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="published images")
    add_record_argument(parser)
    args = parser.parse_args()
    record = Record("bench_split_map", args)
    figures = measure(args.n)
    record.save(figures)


def measure(n):
    figures = {"seconds": {}}
    with tempfile.TemporaryDirectory() as tmp:
        cat, old_map, new_map, streamed_map = (
            os.path.join(tmp, f) for f in
            ("catalog.parquet", "old.parquet", "new.parquet", "streamed.parquet"))
        fake_catalog(cat, n)
        first = split_map.add_catalog(None, cat)
        split_map.write(old_map, first)
        rng = np.random.default_rng(1)
        new = [bytes(r).hex() for r in rng.integers(0, 256, (n // 100, 32), dtype=np.uint8)]
        sizes = rng.integers(20_000, 80_000, n // 100)
        md5s = [base64.b64encode(bytes.fromhex(h)[16:]).decode() for h in new]

        def baseline():
            for _ in catalog.iter_tables(cat, columns=["input_sha256", "input_size", "split"]):
                pass

        def launcher():
            smap = split_map.read(old_map)
            hits = sum(smap.split_of_md5(m, int(s)) is not None for m, s in zip(md5s, sizes))
            hits += sum(smap.has_size(int(s)) and smap.split_of(h) is not None
                        for h, s in zip(new, sizes))
            return smap, hits

        def commit():
            split_map.write(new_map, split_map.add_catalog(split_map.read(old_map), cat))

        def launcher_streamed():  # what a build does: the map opened, asked, merge-joined
            smap = split_map_file.open_stored(old_map)
            asked = smap.probe(set(zip(md5s, sizes.tolist())), set(sizes.tolist()))
            hits = sum(asked.split_of_md5(m, int(s)) is not None for m, s in zip(md5s, sizes))
            hashed = sorted((h, h) for h, s in zip(new, sizes) if asked.has_size(int(s)))
            return smap, hits + sum(split is not None for _, split in smap.splits_of(hashed))

        def commit_streamed():
            split_map_file.build(split_map_file.open_stored(old_map), cat, streamed_map)

        steps = (("baseline", baseline), ("launcher", launcher), ("commit", commit),
                 ("launcher_streamed", launcher_streamed), ("commit_streamed", commit_streamed))
        for name, fn in steps + steps:
            _, seconds = timed(fn)
            figures["seconds"].setdefault(name, []).append(round(seconds, 3))
            print(f"{name:17s} {seconds:7.3f} s  {seconds / n * 1e6:6.2f} µs per published "
                  "image")
        same = open(new_map, "rb").read() == open(streamed_map, "rb").read()
        print(f"commit and commit_streamed wrote the same bytes: {same}")
        figures["traced_peak_bytes"] = {}
        for name, fn in steps[1:]:  # numpy's allocations are traced: the arrays held
            tracemalloc.start()
            fn()
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            figures["traced_peak_bytes"][name] = peak
            print(f"{name:17s} traced peak {peak / 2**20:7.1f} MB ({peak / n:.0f} B per "
                  "published image)")
        figures["same_bytes"] = same
        held = (first.contents.nbytes + first.sizes.nbytes + first.codes.nbytes
                + first.md5s.nbytes)
        print(f"split_map.parquet at {n:,} contents: {os.path.getsize(old_map):,} bytes "
              f"({os.path.getsize(old_map) / n:.1f} B each); catalog.parquet "
              f"{os.path.getsize(cat):,} bytes; in memory {held:,} bytes; peak RSS "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB; load "
              f"{os.getloadavg()[0]:.1f}")
        figures.update(contents=n, map_bytes=os.path.getsize(old_map), held_bytes=held,
                       catalog_bytes=os.path.getsize(cat),
                       us_per_image={k: round(min(v) / n * 1e6, 2)
                                     for k, v in figures["seconds"].items()})
    return figures


if __name__ == "__main__":
    main()
