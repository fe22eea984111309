"""catalog.parquet's I/O: one row per stored example — which image sits where, with what label
and hash (its columns: dataset_format/catalog_schema.py).

Each shard writer writes its shard's rows as a small Parquet fragment beside the temp
shard; commit appends the fragments, shard by shard, into VDIR/catalog.parquet with one
ParquetWriter, so no process ever holds the whole table (one row group per shard).
Incremental regeneration and users' queries both read it:

    import pandas as pd
    pd.read_parquet("ROOT/versions/V/catalog.parquet").query("split == 'test'")
"""

import base64
import itertools

import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from beam_pipeline.algorithms.read_ahead import threaded
from beam_pipeline.store import files, gcs, transient
from dataset_format import catalog_schema
from dataset_format.catalog_schema import DESCRIPTOR, CatalogRow

SCHEMA = catalog_schema.arrow_schema()  # the columns: dataset_format/catalog_schema.py
ROWS_PER_BATCH = 8192


def schema_of(field_schema):
    """The catalog's Arrow schema for a build declaring `field_schema` (fields.Schema or
    None): SCHEMA itself without fields."""
    return catalog_schema.arrow_schema(field_schema) if field_schema else SCHEMA


class FragmentWriter:
    """One shard's rows -> a Parquet file at `path`, written in batches as the shard is;
    `schema`: the build's (schema_of), SCHEMA by default."""

    def __init__(self, path, schema=None):
        self.path, self.rows, self.schema = path, [], schema or SCHEMA

    def __enter__(self):
        self.opened = files.create_final(self.path)  # complete or absent
        self.writer = pq.ParquetWriter(self.opened.__enter__(), self.schema)
        return self

    def append(self, row):
        """One row: a CatalogRow (a dict only here, at the Parquet seam)."""
        self.rows.append(row.to_dict())
        if len(self.rows) >= ROWS_PER_BATCH:
            self._flush()

    def record(self, metadata):
        """Key-value metadata for the file's footer ({str: str}; job/attempts.py)."""
        self.writer.add_key_value_metadata(metadata)

    def _flush(self):
        self.writer.write_table(pa.Table.from_pylist(self.rows, schema=self.schema))
        self.rows = []

    def __exit__(self, *exc):
        if not exc[0]:
            self._flush()
        self.writer.close()
        self.opened.__exit__(*exc)


def merge(fragments, path):
    """Append the fragments (in order) into one Parquet file at `path`.

    Returns (row count, {longer side: count}) of the stored images. The catalog has the
    fragments' columns (SCHEMA, and a build's declared fields after them).
    """
    import pyarrow.compute as pc

    rows, sides = 0, {}

    tables = _row_groups(fragments)  # the fragments' own row groups, in order
    first = next(tables, None)
    schema = SCHEMA if first is None or first.schema.names == SCHEMA.names else (
        first.schema.remove_metadata())
    with files.create_final(path) as raw, pq.ParquetWriter(raw, schema) as writer:
        for table in itertools.chain([first] if first is not None else [], tables):
            writer.write_table(table)
            rows += table.num_rows
            longer = pc.max_element_wise(table["height"], table["width"])
            for item in pc.value_counts(longer).to_pylist():
                if item["values"] is not None:
                    sides[item["values"]] = sides.get(item["values"], 0) + item["counts"]
    return rows, sides


def _row_groups(paths):
    """Each fragment's row groups as tables, in order. Local fragments are read one row
    group at a time: reading ahead saves nothing on a local disk and held up to
    FRAGMENTS_AHEAD whole fragments (a 20,000-photo build's whole catalog); on gs:// the
    round trips cost more, so fragments are read ahead in threads."""
    if any(p.startswith("gs://") for p in paths):
        for fragment in iter_fragments(paths):
            for batch in fragment.to_batches():
                yield pa.Table.from_batches([batch], fragment.schema)
    else:
        for path in paths:
            yield from iter_tables(path)


def median(counts):
    """The median of a {value: count} histogram (None when empty)."""
    total, seen = sum(counts.values()), 0
    for value in sorted(counts):
        seen += counts[value]
        if 2 * seen >= total:
            return value
    return None


FRAGMENTS_AHEAD = 8  # catalog fragments read concurrently by commit (gs:// latency)


def iter_fragments(paths):
    """Each fragment as one table, in order, with the next FRAGMENTS_AHEAD being read in
    threads: the merge over every shard's fragment costs bandwidth, not one round trip after
    another. Memory: at most FRAGMENTS_AHEAD + 1 fragments (one shard's rows each)."""
    return _ahead(paths, read_fragment)


def fragment_row_groups(paths, columns=None):
    """Per fragment, in order, its row groups (only `columns`) as tables. gs:// fragments
    are fetched whole, one GET each, FRAGMENTS_AHEAD at a time (commit's duplicate scan
    opened them one after another through Beam: a new client and ~4 requests each); local
    ones are read one row group at a time."""
    if not any(p.startswith("gs://") for p in paths):
        for path in paths:
            yield iter_tables(path, columns)
        return
    for data in _ahead(paths, _fragment_bytes):
        source = pq.ParquetFile(pa.BufferReader(data))
        yield (source.read_row_group(i, columns=columns) for i in range(source.num_row_groups))


def _ahead(paths, read):
    """read(path) for each path, in order, the next FRAGMENTS_AHEAD read in threads."""
    for _, data in threaded(paths, read, FRAGMENTS_AHEAD):
        yield data


def read_fragment(path):
    """One fragment (a small Parquet file) as a table: gs:// in one request through the
    process's storage client."""
    return pq.read_table(pa.BufferReader(_fragment_bytes(path)))


def _fragment_bytes(path):
    from apache_beam.io.filesystem import CompressionTypes

    if path.startswith("gs://"):
        return gcs.read_bytes(path)
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        return f.read()


def iter_tables(path, columns=None, row_groups=None):
    """A catalog file's row groups (one per shard), one in memory at a time: all of them, or
    those numbered in `row_groups`; all columns, or only `columns`. Each read is
    transient.retrying's: a failure that proves no damage raises StorageUnavailable naming
    `path`; damage (missing, not Parquet) raises as it is."""
    with transient.retrying(lambda: files.open_seekable(path), path) as f:  # gs://: one GET
        # for a fragment, no new client; the footer, then one row group at a time
        source = transient.retrying(lambda: pq.ParquetFile(f), path)
        for i in range(source.num_row_groups) if row_groups is None else row_groups:
            yield transient.retrying(lambda: source.read_row_group(i, columns=columns), path)


def read_numbered(path, numbers):
    """Rows of a catalog file by row number (file order, from 0; ascending, repeats allowed)
    -> [CatalogRow], reading only the row groups (one per shard) that hold them: a reuse or
    copy task's kept rows, which its listing names by number (job/reuse.read_task). The
    footer is read once per process and file (~1 MB a million rows), not once a task; on
    gs://, with the object's size (a metadata GET), then one ranged GET per row group
    (gcs.RangedObject). Before, every task downloaded the whole catalog up to 16 MiB (a
    larger one: its first 16 MiB, then 16 MiB chunks): a worker's 8 tasks of an 11.3 MiB
    catalog downloaded 90 MiB, now 2.0 (benchmarks/bench_catalog_reads.py).
    A failure that proves no damage raises StorageUnavailable naming `path` (a local EIO
    retried first: transient.retrying); damage (missing, not Parquet, too few rows) raises
    as it is."""
    numbers = list(numbers)
    if not numbers:
        return []
    return transient.retrying(lambda: _read_numbered(path, numbers), path)


def _read_numbered(path, numbers):
    import bisect

    key = _identity(path)
    metadata, size = _FOOTERS.get(key, (None, None))
    with _by_range(path, size) as f:
        source = pq.ParquetFile(f, metadata=metadata)
        if metadata is None:
            _FOOTERS.clear()  # one previous catalog a job: keep the last one only
            _FOOTERS[key] = source.metadata, getattr(f, "size", None)
        starts = _group_starts(path, source.metadata)
        if numbers[-1] >= starts[-1]:
            raise ValueError(f"{path}: no row {numbers[-1]} (it holds {starts[-1]})")
        rows, i = [], 0
        while i < len(numbers):
            group = bisect.bisect_right(starts, numbers[i]) - 1
            start, end = starts[group], starts[group + 1]
            j = bisect.bisect_left(numbers, end, i)
            if isinstance(f, gcs.RangedObject):  # its column chunks in one GET
                f.fetch(*_group_span(source.metadata, group))
            table = source.read_row_group(group).take([n - start for n in numbers[i:j]])
            rows += [CatalogRow.from_dict(catalog_schema.nest_fields(r))
                     for r in table.to_pylist()]
            i = j
    return rows


_FOOTERS = {}  # _identity(path) -> (the Parquet footer read_numbered read last (~2.4 KB
              # a row group: ~18 MB for the 7,500 shards of 10M photographs), gs:// size)


def _by_range(path, size=None, ahead=0):
    """A catalog file to read by row group: locally the file; on gs://, a RangedObject
    (its `size`, when not known, from a metadata GET; FileNotFoundError when it is absent),
    reading at least `ahead` bytes a GET."""
    if not files.is_gcs(path):
        return open(path, "rb")
    if size is None:
        found = gcs.size_and_crc32c(path)
        if found is None:
            raise FileNotFoundError(f"{path}: no such object")
        size = found[0]
    return gcs.RangedObject(path, size, ahead=ahead)


def open_row_groups(path):
    """A catalog file for a reader of some of its row groups, in order (the launcher's
    kept rows): on gs://, its size (a metadata GET), its footer, then ranged GETs of at
    least 16 MiB from the first row group wanted that is not read yet: at most the file's
    bytes in all, however few rows are wanted (files.open_seekable read the first 16 MiB
    before it knew what was wanted)."""
    return _by_range(path, ahead=gcs.CHUNK)


def _group_span(metadata, group):
    """Bytes [start, end) of a row group's column chunks (dictionary pages included)."""
    spans = []
    for c in range(metadata.num_columns):
        column = metadata.row_group(group).column(c)
        first = (column.dictionary_page_offset if column.has_dictionary_page
                 and column.dictionary_page_offset else column.data_page_offset)
        spans.append((first, first + column.total_compressed_size))
    return min(s for s, _ in spans), max(e for _, e in spans)


def _identity(path):
    """A catalog file's cache key: a version's gs:// catalog is written once; a local one is
    keyed by its size and mtime too (a file rewritten in place is read again)."""
    if files.is_gcs(path):
        return path
    import os

    stat = os.stat(path)
    return path, stat.st_size, stat.st_mtime_ns


def _group_starts(path, metadata):
    """Each row group's first row number, then the row count."""
    starts, total = [], 0
    for group in range(metadata.num_row_groups):
        starts.append(total)
        total += metadata.row_group(group).num_rows
    return starts + [total]


def fragment_schema(path):
    """A catalog file's columns as an Arrow schema (SCHEMA when it has no field columns).
    On gs:// its footer alone, by ranged GETs (_by_range), not the file's first 16 MiB.
    Retried as iter_tables' reads (transient.retrying)."""
    def read():
        with _by_range(path) as f:
            return pq.ParquetFile(f).schema_arrow.remove_metadata()

    found = transient.retrying(read, path)
    return SCHEMA if found.names == SCHEMA.names else found


def footer(path):
    """A catalog file's Parquet footer (its rows, row groups and schema), the footer alone:
    on gs://, the object's size (a metadata GET) and its last 64 KiB (one more GET for a
    larger footer). Before, the launcher's checks of a previous catalog's row count opened
    it whole: a catalog over 16 MiB cost its first 16 MiB too. Retried as iter_tables'
    reads (transient.retrying): StorageUnavailable naming `path`, or damage as it is."""
    def read():
        with _by_range(path) as f:
            return pq.ParquetFile(f).metadata

    return transient.retrying(read, path)


def read_rows(path):
    """The rows of a catalog file as CatalogRows, one row group in memory at a time."""
    for table in iter_tables(path):
        for row in table.to_pylist():
            yield CatalogRow.from_dict(catalog_schema.nest_fields(row))


def iter_rows(path):
    """The rows of a catalog file as dicts, one row group at a time, ready for JSON: the
    launcher's identity joins only read rows and spill them as JSON text (a CatalogRow per
    row would be built only to be dumped again); near_descriptor as base64 text;
    declared fields under "fields" (catalog_schema.nest_fields)."""
    for table in iter_tables(path):
        nest = table.num_columns > len(SCHEMA)
        for row in table.to_pylist():
            if nest:
                row = catalog_schema.nest_fields(row)
            if row.get(DESCRIPTOR) is not None:
                row[DESCRIPTOR] = base64.b64encode(row[DESCRIPTOR]).decode()
            yield row
