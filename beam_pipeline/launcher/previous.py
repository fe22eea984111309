"""The previous version's catalog as the identity stage reads it: a compact record per row,
spilled by key (and by uri, size and content when some listed key is new), and full rows
read back from catalog.parquet by row number, in file order, only for the images that
keep a stored record.

Why not the rows themselves: a catalog row as JSON is ~640 bytes, so four sorted spills of
them plus the resolved listing's copy came to ~26 + 8 GB of launcher scratch at 10M images
(estimated). A `Stored` record holds the seven fields identity decides with (~150 bytes as
JSON); the uri, size and content spills hold a sort key and where the record is (a byte
offset and length into one file of records), not the record.
"""

import itertools
import json
import os
from json.encoder import encode_basestring_ascii as json_string  # = json.dumps(a str)
from typing import NamedTuple, Optional

from beam_pipeline.algorithms import fast_json
from beam_pipeline.algorithms.spill import SortedSpill
from beam_pipeline.store import catalog
from dataset_format import catalog_schema, fields as field_types
from dataset_format.catalog_schema import DESCRIPTOR

# What identity decides with, read column-wise from the catalog.
IDENTITY_COLUMNS = ("key", "uri", "label", "split", "input_size", "input_stamp",
                    "input_sha256", "input_md5")


class Stored(NamedTuple):
    """A previous catalog row, as much of it as identity needs (JSON: a short list)."""

    row: int                      # its number in catalog.parquet (file order, from 0)
    input_size: int
    input_stamp: Optional[str]
    input_sha256: Optional[str]
    input_md5: Optional[str]
    label: str
    split: str
    fields: Optional[str] = None  # fields_digest of its declared fields (None: none)

    @classmethod
    def from_json(cls, text):
        return cls(*fast_json.loads(text))


def fields_digest(fields):
    """A short digest of declared field values ({name: value}, a catalog row's, or a listing
    line's text of them: fields.values_text), so a compact record can tell an edited
    caption or box (a re-frame) from unchanged values without holding them. None: none."""
    if isinstance(fields, dict):
        fields = fields and field_types.values_text(fields)
    if not fields or fields == "{}":
        return None
    import hashlib

    return hashlib.sha256(fields.encode()).hexdigest()[:16]


class CatalogRows:
    """A catalog.parquet read again as often as needed: identity columns for the spills,
    full rows (as catalog.iter_rows gives them) by row number. `stale`: names of fields
    removed or retyped since (fields.stale_fields): a row's value for one is renamed
    fields.STALE + name, so the row's fields digest matches no listed image's and its
    record is re-framed with the listing's values."""

    def __init__(self, path, stale=frozenset()):
        self.path, self.stale = path, stale

    def identity(self):
        """(row number, {column: value} of IDENTITY_COLUMNS and, with declared fields, the
        fields under "fields"), in file order."""
        names = catalog.fragment_schema(self.path).names  # the footer alone (gs://: ranged)
        wanted = list(IDENTITY_COLUMNS) + [n for n in names if n not in catalog_schema.COLUMNS]
        number = 0
        for table in catalog.iter_tables(self.path, columns=wanted):
            columns = table.to_pydict()
            for values in zip(*(columns[c] for c in wanted)):
                yield number, self._marked(catalog_schema.nest_fields(dict(zip(wanted, values))))
                number += 1

    def _marked(self, row):
        found = self.stale and row.get(catalog_schema.FIELDS)
        if found:
            for name in self.stale & found.keys():
                found[field_types.STALE + name] = found.pop(name)
        return row

    def with_fields(self):
        """Whether the catalog has declared fields' columns."""
        names = catalog.fragment_schema(self.path).names
        return any(n not in catalog_schema.COLUMNS for n in names)

    def records(self, keep=None, groups=None):
        """(key, uri, Stored) of every row in file order; `keep`: a function of a row
        group's table (IDENTITY_COLUMNS) -> a boolean mask of the rows worth looking at
        (pyarrow.compute, so a pass for the 1% of rows some new key can match converts
        only those to Python); `groups`: the row groups worth reading (None: all). Rows
        without declared fields are built from the columns without a dict each (~4 µs a
        row less, read once a night at least)."""
        if self.with_fields():  # rare: declared fields, digested from their nested values
            wanted = set(_candidates(self, keep))
            for number, row in self.identity():
                if keep is None or number in wanted:
                    yield row["key"], row["uri"], stored(number, row)
            return
        for start, table in self._tables(groups):
            numbers = range(start, start + table.num_rows)
            if keep is not None:
                mask = keep(table)
                numbers = (start + _true(mask)).tolist()
                if not numbers:
                    continue
                table = table.filter(mask)
            c = table.to_pydict()
            for number, key, uri, label, split, size, stamp, sha, md5 in zip(
                    numbers, c["key"], c["uri"], c["label"], c["split"], c["input_size"],
                    c["input_stamp"], c["input_sha256"], c["input_md5"]):
                yield key, uri, Stored._make((number, size, stamp, sha, md5, label, split, None))

    def _tables(self, groups):
        """(first row number, table of IDENTITY_COLUMNS): every row group's, batched, or
        only those numbered in `groups`, one at a time."""
        columns = list(IDENTITY_COLUMNS)
        if groups is None:
            first = 0
            for table in _batched(catalog.iter_tables(self.path, columns=columns)):
                yield first, table
                first += table.num_rows
            return
        meta = catalog.footer(self.path)  # gs://: the footer alone, by range
        starts = list(itertools.accumulate(
            (meta.row_group(g).num_rows for g in range(meta.num_row_groups)), initial=0))
        for group, table in zip(groups, catalog.iter_tables(self.path, columns=columns,
                                                           row_groups=groups)):
            yield starts[group], table

    def md5_less_groups(self):
        """The row groups that may hold a row without an input md5 (null or empty), by the
        column's statistics; None: every one may. A gs:// catalog has none: a later
        night's pass for rows without an md5 of the new keys' sizes read all 10M rows'
        identity columns to find none (~1 s of CPU a million rows)."""
        meta = catalog.footer(self.path)  # gs://: the footer alone, by range
        paths = [meta.schema.column(i).path for i in range(meta.num_columns)]
        if "input_md5" not in paths:
            return None
        at = paths.index("input_md5")
        out = []
        for group in range(meta.num_row_groups):
            if not meta.row_group(group).num_rows:
                continue
            stats = meta.row_group(group).column(at).statistics
            if not (stats is not None and stats.has_null_count and stats.null_count == 0
                    and stats.has_min_max and stats.min != ""):
                out.append(group)
        return out

    def full(self, wanted, columns=None):
        """Ascending row numbers (repeats allowed) -> (number, row dict), reading only the
        row groups that hold one: every column (as catalog.iter_rows gives them), or only
        `columns` (and the declared fields, under "fields", when "fields" is among them).
        The plans ask for the few columns they use: converting all twenty to Python, for
        every kept row of a night, was a third of the incremental plan's CPU."""
        for number, row, _ in self.by_number(((n, True) for n in wanted), columns):
            yield number, row

    def by_number(self, wanted, columns):
        """Ascending (row number, whole) pairs (repeats allowed) -> (number, row or None,
        file): `columns` of a row asked whole (as full() gives them), else only its shard
        file, read per row group from the column's statistics when the group is one
        shard's, never a dict. A later night asks for ~99% of the rows, most of them only
        for their file (incremental.kept_as_is was decided by identity), so a row group's
        wanted columns are read only for the rows asked whole (`take`)."""
        import pyarrow.parquet as pq

        wanted = iter(wanted)
        item = next(wanted, None)
        if item is None:
            return
        with catalog.open_row_groups(self.path) as f:  # gs://: by range, from the footer
            source = pq.ParquetFile(f)
            names = _read_columns(source.schema_arrow.names, columns)
            names = list(source.schema_arrow.names) if names is None else names
            read = names if "file" in names else names + ["file"]
            file_at = [source.schema.column(i).path
                       for i in range(len(source.schema))].index("file")
            start = 0
            for group in range(source.num_row_groups):
                meta = source.metadata.row_group(group)
                end = start + meta.num_rows
                batch = []
                while item is not None and item[0] < end:
                    batch.append(item)
                    item = next(wanted, None)
                if batch:
                    whole = [n - start for n, w in batch if w]
                    file = _one_value(meta.column(file_at).statistics)
                    table = None
                    if whole or file is None:
                        table = source.read_row_group(group, columns=read if whole else ["file"])
                    if file is None:
                        shard_files = table.column("file").to_pylist()
                    rows = iter(self._rows(table.take(whole), names)) if whole else None
                    for number, w in batch:
                        yield (number, next(rows) if w else None,
                               file if file is not None else shard_files[number - start])
                if item is None:
                    return
                start = end

    def _rows(self, table, names):
        """A table of catalog columns -> row dicts (every column's values, declared fields
        nested under "fields", a descriptor in base64)."""
        import base64

        values = table.to_pydict()
        nest = any(n not in catalog_schema.COLUMNS for n in names)
        for i in range(table.num_rows):
            row = {name: values[name][i] for name in names}
            if row.get(DESCRIPTOR) is not None and not isinstance(row[DESCRIPTOR], str):
                row[DESCRIPTOR] = base64.b64encode(row[DESCRIPTOR]).decode()
            yield self._marked(catalog_schema.nest_fields(row)) if nest else row


def _one_value(statistics):
    """A row group's column statistics -> its one value when min and max are equal (a row
    group of one shard's rows: the catalog's usual one), else None."""
    if statistics is None or not statistics.has_min_max or statistics.min != statistics.max:
        return None
    return statistics.min


def _read_columns(present, columns):
    """The catalog's columns to read for `columns` (None: all): those asked for that it has,
    and its declared fields' when "fields" is asked for."""
    if columns is None:
        return None
    names = [c for c in columns if c in present]
    if catalog_schema.FIELDS in columns:
        names += [n for n in present if n not in catalog_schema.COLUMNS]
    return names


class RowList:
    """Rows given as dicts (tests; a version without a catalog file): the same interface."""

    def __init__(self, rows):
        self.rows = [json.loads(json.dumps(r)) for r in rows]  # as spilled JSON gave them

    def identity(self):
        for number, row in enumerate(self.rows):
            yield number, row

    def full(self, wanted, columns=None):
        for number in wanted:
            row = json.loads(json.dumps(self.rows[number]))
            if columns is not None:
                row = {c: row[c] for c in columns if c in row}
            yield number, row

    def by_number(self, wanted, columns):
        for number, whole in wanted:
            row = self.rows[number]
            if whole:
                yield number, next(iter(self.full([number], columns)))[1], row["file"]
            else:
                yield number, None, row["file"]

    def md5_less_groups(self):
        return None

    def records(self, keep=None, groups=None):
        """(key, uri, Stored) of every row (`keep`, `groups` are for a catalog file's row
        groups)."""
        for number, row in self.identity():
            yield row["key"], row["uri"], stored(number, row)

    def __iter__(self):
        return iter(self.rows)


def _candidates(rows, keep):
    """The row numbers `keep` selects, read column-wise (a catalog with declared fields)."""
    if keep is None:
        return
    first = 0
    for table in _batched(catalog.iter_tables(rows.path, columns=list(IDENTITY_COLUMNS))):
        yield from (first + _true(keep(table))).tolist()
        first += table.num_rows


KEEP_ROWS = 1 << 16  # rows a `keep` mask is computed over at once


def _batched(tables, rows=KEEP_ROWS):
    """Row groups' tables -> tables of `rows` rows or more (the last may hold fewer), in
    order. pyarrow.compute.is_in builds its hash set of the value set on every call: with
    150k uris and md5s asked (a night of 1% new keys at 10M rows) ~30 ms a call, once for
    each of 7,500 row groups, each pass over the catalog (measured at 1M rows: 22.8 s a
    pass a row group at a time, 0.8 s in 65k-row batches)."""
    import pyarrow as pa

    pending, count = [], 0
    for table in tables:
        pending.append(table)
        count += table.num_rows
        if count >= rows:
            yield pa.concat_tables(pending) if len(pending) > 1 else pending[0]
            pending, count = [], 0
    if pending:
        yield pa.concat_tables(pending) if len(pending) > 1 else pending[0]


def _true(mask):
    """A boolean Arrow array (no nulls) -> the positions of its true values (numpy)."""
    import numpy as np

    return np.flatnonzero(mask.to_numpy(zero_copy_only=False))


def stored(number, row):
    return Stored(row=number, input_size=row["input_size"], input_stamp=row.get("input_stamp"),
                  input_sha256=row.get("input_sha256"), input_md5=row.get("input_md5"),
                  label=row["label"], split=row["split"],
                  fields=fields_digest(row.get("fields")))


def by_key_texts(rows):
    """CatalogRows or RowList -> lists of the by-key spill's texts, "key JSON<TAB>Stored
    JSON\n", in file order: a row group's built column-wise with pyarrow.compute when its
    strings need no JSON escapes (printable ASCII without quotes or backslashes: every
    gs:// listing's), else a row at a time. The same text either way: what
    fast_json.dumps makes of the key and the Stored record. Column-wise, a row costs ~0.3 µs
    where records() and a dump cost ~4."""
    if not isinstance(rows, CatalogRows) or rows.with_fields():
        records = iter(rows.records())
        while texts := [f"{json_string(key)}\t{fast_json.dumps(record)}\n"
                        for key, _, record in itertools.islice(records, 10_000)]:
            yield texts
        return
    import pyarrow as pa
    import pyarrow.compute as pc

    first = 0
    for table in catalog.iter_tables(rows.path, columns=list(IDENTITY_COLUMNS)):
        numbers = pa.array(range(first, first + table.num_rows), pa.int64())
        first += table.num_rows
        texts = _json_columns([table["key"], numbers] + [table[c] for c in (
            "input_size", "input_stamp", "input_sha256", "input_md5", "label", "split")])
        if texts is None:  # a string to escape: this row group a row at a time
            c = table.to_pydict()
            yield [f"{json_string(key)}\t{fast_json.dumps((number, *values, None))}\n"
                   for number, key, *values in zip(
                       numbers.to_pylist(), c["key"], c["input_size"], c["input_stamp"],
                       c["input_sha256"], c["input_md5"], c["label"], c["split"])]
            continue
        key, *record = texts
        parts = [key, "\t["]
        for text in record:
            parts += [text, ", "]
        parts[-1] = ", null]\n"  # Stored.fields: a catalog without declared fields
        yield pc.binary_join_element_wise(*parts, "").to_pylist()


_PLAIN = "^[ !#-\\[\\]-~]*$"  # printable ASCII but the quote and the backslash: such a
                              # string's JSON text is itself in quotes


def _json_columns(columns):
    """Arrow columns (int64 or string) -> each value's JSON text as a string column (nulls
    "null"), or None when some string needs an escape."""
    import pyarrow as pa
    import pyarrow.compute as pc

    strings = [pc.fill_null(c, "") for c in columns if not pa.types.is_integer(c.type)]
    if strings:  # one check of the strings joined (~0.2 s a million rows less than six)
        joined = pc.binary_join_element_wise(*strings, "") if len(strings) > 1 else strings[0]
        if pc.all(pc.match_substring_regex(joined, _PLAIN)).as_py() is False:
            return None
    out = []
    for column in columns:
        if pa.types.is_integer(column.type):
            text = pc.cast(column, pa.string())
        else:
            text = pc.binary_join_element_wise('"', column, '"', "")
        out.append(pc.fill_null(text, "null"))
    return out


class Previous:
    """The previous catalog's records spilled by key; by uri, size and content only when
    some listed key is new (`others`)."""

    def __init__(self, spill_dir, rows):
        self.spill_dir, self.spills, self.rows = spill_dir, [], rows
        self.records = None  # written by the spills below, when first built
        self.by_key = self._spill()
        for texts in by_key_texts(rows):
            self.by_key.extend_texts(texts)

    def _spill(self):
        self.spills.append(SortedSpill(self.spill_dir))
        return self.spills[-1]

    def others(self):
        """-> (by uri, sizes, by input sha256, by (md5, size), sizes of rows without an md5)
        spills of every row, built once. By uri the line is where the record is ("offset
        length" in the records file: `record`); by content {"key", "at": [offset,
        length]}: the key for same_bytes.best_matches, the record by `record`."""
        if not hasattr(self, "_others"):
            self._others = self._spills(None, None, None)
        return self._others

    def matching(self, uris, md5s):
        """(by uri, by (md5, size)) spills of only the rows whose uri is in `uris` or whose
        (md5, "size as 20 digits") is in `md5s`: what the new keys can match by file or
        by md5. A night of 1% new keys spilled every stored row five times (~1.4 GB at
        10M rows, most of the identity stage's CPU) to look up 1% of them."""
        by_uri, _, _, by_md5, _ = self._spills((uris, md5s), None, None)
        return by_uri, by_md5

    def by_size(self, plain, missed):
        """(sizes, by input sha256, sizes of rows without an md5) spills of only the rows a
        ref could match by content: sizes in `plain` (refs hashed or to hash: any stored
        row of their size), sizes in `missed` (refs with an md5 no row had: only rows
        without one, whose bytes the md5 cannot rule out)."""
        groups = None if plain else self.rows.md5_less_groups()  # only rows without md5s
        _, sizes, by_sha, _, md5_less = self._spills(None, plain, missed, groups)
        return sizes, by_sha, md5_less

    def _spills(self, matching, plain, missed, groups=None):
        every = matching is None and plain is None
        spills = [self._spill() for _ in range(5)]
        by_uri, sizes, by_sha, by_md5, md5_less = spills
        if self.records is None:
            fd, self.records_path = _temp(self.spill_dir)
            self.records, self.records_end = os.fdopen(fd, "w+b"), 0
        uris, md5s = matching or ((), ())
        keep = None if every else _keep(uris, md5s, plain or set(), missed or set())
        for key, uri, record in self.rows.records(keep, groups):
            size, sha, md5 = record.input_size, record.input_sha256, record.input_md5
            size_key = f"{size:020d}"
            to_uri = every or uri in uris
            to_md5 = bool(sha and md5) and (every or (md5, size_key) in md5s)
            to_size = every or (plain is not None and size in plain)
            md5_less_row = bool(sha) and not md5
            to_sha = bool(sha) and (to_size or (missed is not None and md5_less_row
                                                and size in missed))
            if not (to_uri or to_md5 or to_size or to_sha):
                continue
            at = self._write(record)
            if to_uri:
                by_uri.add(json_string(uri), at)
            if to_size:
                sizes.add(size_key, "")
            if to_sha or to_md5:
                line = f'{{"key": {json_string(key)}, "at": [{at.replace(" ", ", ")}]}}'
            if to_sha:
                by_sha.add(sha, line)  # ties: by line text ~ key
            if to_md5:
                by_md5.add(f"{md5} {size_key}", line)
            if md5_less_row and (every or (missed is not None and size in missed)):
                md5_less.add(size_key, "")
        self.records.flush()
        return spills

    def _write(self, record):
        """Appends a Stored record to the records file -> "offset length"."""
        data = (fast_json.dumps(record) + "\n").encode()
        offset = self.records_end
        self.records.write(data)
        self.records_end += len(data)
        return f"{offset} {len(data)}"

    def record(self, at):
        """Where a record is ("offset length" or [offset, length]) -> Stored."""
        offset, length = map(int, at.split()) if isinstance(at, str) else at
        return Stored.from_json(os.pread(self.records.fileno(), length, offset).decode())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for spill in self.spills:
            spill.close()
        if self.records is not None:
            self.records.close()
            os.remove(self.records_path)


def _keep(uris, md5s, sizes, md5_less_sizes):
    """A row group (IDENTITY_COLUMNS) -> the mask of rows a new key may match: its uri, its
    md5 or its size is one of theirs (`sizes`), or it has no md5 and a size in
    `md5_less_sizes` (the exact tests follow in Python, on those rows). A size alone
    once selected a row whatever its md5: the sizes of a night's 100k new images at 10M
    rows are most rows' sizes too (bench_launcher_scale: 120,000 sizes in all), and those
    rows were converted to Python only to be dropped there."""
    import pyarrow as pa
    import pyarrow.compute as pc

    uri_set = pa.array(sorted(uris), pa.string())
    md5_set = pa.array(sorted({md5 for md5, _ in md5s}), pa.string())
    size_set = pa.array(sorted(sizes), pa.int64())
    md5_less_set = pa.array(sorted(md5_less_sizes), pa.int64())

    def keep(table):
        md5 = table["input_md5"]
        no_md5 = pc.or_kleene(pc.is_null(md5), pc.equal(md5, ""))
        mask = pc.or_(pc.is_in(table["uri"], value_set=uri_set),
                      pc.is_in(md5, value_set=md5_set))
        mask = pc.or_(mask, pc.is_in(table["input_size"], value_set=size_set))
        mask = pc.or_kleene(mask, pc.and_kleene(no_md5, pc.is_in(table["input_size"],
                                                     value_set=md5_less_set)))
        return pc.fill_null(mask, False)

    return keep


def _temp(directory):
    import tempfile

    return tempfile.mkstemp(prefix="records-", suffix=".jsonl", dir=directory)
