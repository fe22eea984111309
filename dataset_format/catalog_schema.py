"""catalog.parquet's columns (docs/format.md, "catalog.parquet"): one row per stored example.

The column list is the one source: `arrow_schema()` is what the writer's fragments and the
merged catalog are written with (beam_pipeline/store/catalog.py does the Parquet I/O), and
`CatalogRow` is the typed row derived from it. Pure Python: pyarrow is imported only by
`arrow_schema()`.
"""

import base64
import dataclasses
import json
from typing import Optional

# name -> Arrow type name, in file order.
COLUMNS = {
    "key": "string",             # image/filename: path relative to its input root
    "uri": "string",             # where it was read from
    "label": "string",
    "label_id": "int64",
    "split": "string",
    "shard": "int32",            # shard index within the split
    "file": "string",            # shard file name, relative to the version directory
    "position": "int32",         # record number within the shard
    "offset": "int64",           # byte offset of its TFRecord frame in the shard file
    "length": "int64",           # frame length in bytes
    "sha256": "string",          # of the stored image/encoded bytes
    "height": "int32",           # of the stored image
    "width": "int32",
    "input_size": "int64",
    "input_stamp": "string",     # change token: "mtime_ns:ctime_ns", or "gen:N" on gs://
    "input_sha256": "string",    # of the input bytes: identity for a key not seen before
    "input_md5": "string",       # the gs:// listing's md5Hash of the input (base64): the
                                 # same identity without reading it; null locally
    "phash": "int64",            # --near_duplicates: 64-bit perceptual hash as a signed
                                 # int64 (dedup/perceptual.py); null when not computed
    "phash_center": "int64",     # ... of the central 90%; null also in rows hashed before it
    "near_descriptor": "binary",  # --near_duplicates: dedup/descriptor.py's bytes, four
                                  # corner-crop hashes then the second opinion on a pair
                                  # (docs/format.md); null in rows from before it
}

DESCRIPTOR = "near_descriptor"

_PYTHON_TYPES = {"string": str, "int32": int, "int64": int, "binary": bytes}


def arrow_schema():
    """The catalog's pyarrow schema, built from COLUMNS."""
    import pyarrow as pa

    return pa.schema([(name, getattr(pa, kind)()) for name, kind in COLUMNS.items()])


_NAMES = frozenset(COLUMNS)
_NULLS = dict.fromkeys(COLUMNS)


def _filled(cls, *values):
    """A new `cls` row whose dict is filled from `values` in turn (no __init__ call)."""
    row = object.__new__(cls)
    state = row.__dict__
    for more in values:
        state.update(more)
    return row


def _row_type():
    """A frozen dataclass with one field per column (None: null, as in rows written before
    a column existed)."""
    fields = [(name, Optional[_PYTHON_TYPES[kind]], dataclasses.field(default=None))
              for name, kind in COLUMNS.items()]

    def __init__(self, **values):
        """Keyword arguments only, one per column (the others null). Fills the instance's
        dict in two calls: the generated frozen __init__ sets each of the 20 fields through
        object.__setattr__, ~7 µs a row against ~1 µs, which an incremental plan pays per
        kept row and the writer per image."""
        if not values.keys() <= _NAMES:
            raise TypeError(f"not catalog columns: {sorted(values.keys() - _NAMES)}")
        state = self.__dict__
        state.update(_NULLS)
        state.update(values)

    def from_dict(cls, row):
        """A row as pyarrow gives it (a dict of columns, near_descriptor as bytes); a column
        it lacks is null, an unknown one is a KeyError naming it."""
        if not row.keys() <= _NAMES:
            raise KeyError(f"not catalog columns: {sorted(row.keys() - _NAMES)}")
        return _filled(cls, _NULLS, row)

    def replace(self, **changes):
        """This row with `changes` (what dataclasses.replace gives: a new frozen row; an
        unknown column is a TypeError). dataclasses.replace walks the 20 fields in Python:
        ~6.5 µs a row against ~1.5, paid per kept row by every reused or copied shard."""
        if not changes.keys() <= _NAMES:
            raise TypeError(f"not catalog columns: {sorted(changes.keys() - _NAMES)}")
        return _filled(type(self), self.__dict__, changes)

    def to_dict(self):
        """{column: value} in file order (__init__ fills the dict in that order), for the
        Parquet writer (dataclasses.asdict deep-copies every value: several times slower)."""
        return self.__dict__.copy()

    def from_json(cls, value):
        """A row carried as JSON between processes (to_json's text, or the dict it parses
        to): near_descriptor as base64 text."""
        row = json.loads(value) if isinstance(value, str) else value
        if row.get(DESCRIPTOR) is not None:
            row = dict(row, **{DESCRIPTOR: base64.b64decode(row[DESCRIPTOR])})
        return from_dict(cls, row)

    def to_json(self):
        """The row as one line of JSON text (near_descriptor as base64): the launcher's
        reuse/copy listings carry kept rows this way."""
        row = to_dict(self)
        if row[DESCRIPTOR] is not None:
            row[DESCRIPTOR] = base64.b64encode(row[DESCRIPTOR]).decode()
        return json.dumps(row)

    return dataclasses.make_dataclass(
        "CatalogRow", fields, frozen=True, init=False,
        namespace={"__module__": __name__,
                   "__doc__": "One catalog row, typed: a field per COLUMNS entry. Writers "
                              "build it and update it (row.replace(...), a new row); it "
                              "becomes a dict only at the Parquet seam (store/catalog.py).",
                   "__init__": __init__, "replace": replace,
                   "from_dict": classmethod(from_dict), "to_dict": to_dict,
                   "from_json": classmethod(from_json), "to_json": to_json})


CatalogRow = _row_type()
