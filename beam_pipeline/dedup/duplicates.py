"""Content duplicates: groups of byte-identical stored images, found from the catalog's sha256.

Barz & Denzler (2020) found 3.3% of CIFAR-10's and 10% of CIFAR-100's test images
duplicated in their training sets; a group that spans splits inflates test accuracy.
Runs in the commit stage, over the shards' catalog fragments. Only their sha256 column is
read; the first 8 bytes of each hash are sorted in memory (8 B per row: 80 MB at 10 M
rows), and only the rows whose prefix occurs twice are loaded and sorted by hash on disk,
so memory stays flat however many duplicates there are. (Every row through the on-disk
sort as JSON cost ~0.3 ms per image, serially, at commit.) With --drop_content_duplicates
the copy whose key sorts first stays; the others leave their shards (frames copied,
nothing decoded) and count as duplicates.
"""

import itertools
import json
import os
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_pipeline.store import catalog, files
from beam_pipeline.algorithms.spill import SortedSpill
from dataset_format import layout

_HEX = np.full(256, 255, dtype=np.uint8)  # hex digit -> nibble; anything else -> 255
_HEX[np.frombuffer(b"0123456789abcdef", np.uint8)] = np.arange(16, dtype=np.uint8)
_HEX[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16, dtype=np.uint8)
_SHIFTS = np.arange(56, -8, -8, dtype=np.uint64)
_MEMBER_COLUMNS = ["key", "split", "file", "position", "sha256"]


def groups(fragments):
    """Catalog fragments -> (sha256, members) for each hash stored more than once, in hash
    order; members are [key, split, file, position], sorted by the key's JSON text."""
    with tempfile.TemporaryDirectory(prefix="duplicates-") as scratch:
        prefix_file = os.path.join(scratch, "prefixes.u64")
        layout_ = _write_prefixes(fragments, prefix_file)  # [(fragment, row group, rows)]
        prefixes = np.fromfile(prefix_file, dtype=np.uint64)
        prefixes.sort()
        colliding = np.unique(prefixes[1:][prefixes[1:] == prefixes[:-1]])
        del prefixes
        if not colliding.size:
            return
        with SortedSpill(scratch) as by_hash:
            for row in _colliding_rows(fragments, layout_, prefix_file, colliding):
                by_hash.add(f"{row['sha256']} {json.dumps(row['key'])}",
                            json.dumps([row["key"], row["split"], row["file"],
                                        row["position"]]))
            for sha256, run in itertools.groupby(by_hash, key=lambda item: item[0].split()[0]):
                members = [json.loads(line) for _, line in run]
                if len(members) > 1:
                    yield sha256, members


def _write_prefixes(fragments, path):
    """Append every row's hash prefix to `path`, fragment by fragment, row group by row
    group -> [(fragment number, row group number, rows)] in the order written."""
    written = []
    with open(path, "wb") as out:
        groups_of = catalog.fragment_row_groups(fragments, columns=["sha256"])
        for f, tables in enumerate(groups_of):  # gs://: one GET each, read ahead
            for g, table in enumerate(tables):
                _prefixes(table["sha256"]).tofile(out)
                written.append((f, g, table.num_rows))
    return written


def _colliding_rows(fragments, written, prefix_file, colliding):
    """The catalog rows (member columns) whose hash prefix is in `colliding`; only the row
    groups holding one are read again."""
    hits, start = {}, 0
    for f, g, rows in written:
        mine = np.fromfile(prefix_file, dtype=np.uint64, count=rows, offset=8 * start)
        start += rows
        where = np.flatnonzero(np.isin(mine, colliding))
        if where.size:
            hits.setdefault(f, {})[g] = where
    for f, by_group in hits.items():
        tables = catalog.iter_tables(fragments[f], columns=_MEMBER_COLUMNS,
                                     row_groups=list(by_group))
        for g, table in zip(by_group, tables):
            yield from table.take(by_group[g]).to_pylist()


def _prefixes(column):
    """Hex sha256 strings -> their first 8 bytes as uint64. A null or malformed hash gets
    some value too; a shared prefix only means its rows are compared by the full hash."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    head = pc.utf8_slice_codeunits(column.fill_null(""), 0, 16)
    if len(head) and pc.min(pc.utf8_length(head)).as_py() < 16:
        head = pc.utf8_rpad(head, 16, padding="z")
    fixed = head.cast(pa.binary(16))
    digits = np.frombuffer(fixed.buffers()[1], np.uint8, count=16 * len(fixed),
                           offset=16 * fixed.offset)
    nibbles = _HEX[digits].reshape(-1, 8, 2).astype(np.uint64)
    packed = ((nibbles[:, :, 0] << np.uint64(4)) | nibbles[:, :, 1]) << _SHIFTS
    return np.bitwise_or.reduce(packed, axis=1)


def report(fragments, vdir, collect_extras=False):
    """Write VDIR/duplicates.jsonl -> (manifest entry, {shard file: positions to drop}).

    The extra copies (all but the key that sorts first) are collected only when asked.
    """
    count, across, extras = 0, 0, {}
    with tempfile.NamedTemporaryFile("w", suffix=layout.JSONL) as out:
        for sha256, members in groups(fragments):
            splits = [m[1] for m in members]
            count += 1
            across += len(set(splits)) > 1
            out.write(json.dumps({"sha256": sha256, "keys": [m[0] for m in members],
                                  "splits": splits}) + "\n")
            for _, _, file, position in members[1:] if collect_extras else ():
                extras.setdefault(file, set()).add(position)
        out.flush()
        files.copy_local_file(out.name, layout.join(vdir, layout.DUPLICATES))
    return {"groups": count, "across_splits": across, "path": layout.DUPLICATES}, extras
