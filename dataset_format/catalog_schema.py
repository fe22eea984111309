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
FIELDS = "fields"  # a CatalogRow's declared fields ({name: value}): one column each on disk

# A declared field's type (dataset_format/fields.py) -> its column's Arrow type, as text
# arrow_schema() builds: numbers as int64 and float64 (the value as the manifest gave it;
# the Example holds float32), classes by name, boxes as structs.
FIELD_COLUMNS = {
    "int": "int64", "float": "float64", "string": "string",
    "list[int]": "list<int64>", "list[float]": "list<float64>", "list[string]": "list<string>",
    "classes": "list<string>",
    "boxes": "list<struct<xmin: float64, ymin: float64, xmax: float64, ymax: float64, "
             "label: string>>",
}

_PYTHON_TYPES = {"string": str, "int32": int, "int64": int, "binary": bytes}


def arrow_schema(field_schema=None):
    """The catalog's pyarrow schema, built from COLUMNS, then a column per declared field
    (`field_schema`, a fields.Schema), in its order."""
    import pyarrow as pa

    columns = [(name, getattr(pa, kind)()) for name, kind in COLUMNS.items()]
    for f in field_schema.fields if field_schema else ():
        columns.append((f.name, _field_type(pa, f.type)))
    return pa.schema(columns)


def _field_type(pa, kind):
    if kind == "boxes":
        return pa.list_(pa.struct([(side, pa.float64()) for side in
                                   ("xmin", "ymin", "xmax", "ymax")] + [("label", pa.string())]))
    if kind.startswith("list[") or kind == "classes":
        return pa.list_(_field_type(pa, "string" if kind == "classes" else kind[5:-1]))
    return {"int": pa.int64(), "float": pa.float64(), "string": pa.string()}[kind]


def nest_fields(row):
    """A row as pyarrow gives it, field columns among the catalog's -> the row with them
    under FIELDS ({name: value}, nulls left out); a row without any is returned as it is."""
    extra = row.keys() - _COLUMN_NAMES
    if not extra:
        return row
    values = {name: row.pop(name) for name in sorted(extra)}
    row[FIELDS] = {name: v for name, v in values.items() if v is not None}
    return row


_COLUMN_NAMES = frozenset(COLUMNS)
_NAMES = frozenset(COLUMNS) | {FIELDS}
_NULLS = dict.fromkeys(COLUMNS)
_NULLS[FIELDS] = None


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
        Parquet writer (dataclasses.asdict deep-copies every value: several times slower);
        declared fields flattened into their own columns."""
        row = self.__dict__.copy()
        values = row.pop(FIELDS)
        if values:
            row.update(values)
        return row

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
        row = self.__dict__.copy()
        if row[FIELDS] is None:  # the line it was before fields existed
            del row[FIELDS]
        if row[DESCRIPTOR] is not None:
            row[DESCRIPTOR] = base64.b64encode(row[DESCRIPTOR]).decode()
        return json.dumps(row)

    return dataclasses.make_dataclass(
        "CatalogRow", fields, frozen=True, init=False,  # + row.fields, not a column: FIELDS
        namespace={"__module__": __name__,
                   "__doc__": "One catalog row, typed: a field per COLUMNS entry. Writers "
                              "build it and update it (row.replace(...), a new row); it "
                              "becomes a dict only at the Parquet seam (store/catalog.py).",
                   "__init__": __init__, "replace": replace,
                   "from_dict": classmethod(from_dict), "to_dict": to_dict,
                   "from_json": classmethod(from_json), "to_json": to_json})


CatalogRow = _row_type()
