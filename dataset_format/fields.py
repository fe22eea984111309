"""Declared fields beyond the class label (docs/format.md, "Fields"): the schema, its file,
the strict check of a manifest row's values, and what each value becomes in the Example
and in the catalog. Pure Python, no TensorFlow: the launcher checks rows with it, the
writer encodes them, the readers and loaders take the Example keys from it.

A schema file (YAML or JSON) names each field and its type:

    fields:
      caption: {type: string}
      score:   {type: float, required: true}
      tags:    {type: classes, max_len: 8}              # multi-label; open vocabulary
      objects: {type: boxes, max_len: 50, classes: [cat, dog]}   # closed vocabulary

Values are checked as they come (a JSONL manifest's JSON types are kept: 3 is an int,
"3" a string, and neither passes for the other); a CSV cell is text, read as the declared
type (a list or boxes cell as a JSON array). Every failure is one FieldError line naming
the column and the value.
"""

import dataclasses
import difflib
import functools
import json
import math
import re
from typing import Optional

from dataset_format import storage
from dataset_format.catalog_schema import COLUMNS
from dataset_format.schema import FEATURES as _IMAGE_KEYS
from dataset_format import examples
from dataset_format.examples import Entries, ListFeature

SCALARS = ("int", "float", "string")
LISTS = ("list[int]", "list[float]", "list[string]")
CLASSES, BOXES = "classes", "boxes"
TYPES = SCALARS + LISTS + (CLASSES, BOXES)
# Names a field may not take: the manifest's own columns, the Example's image/ tree, and
# the catalog's columns (a field is a catalog column of its own name).
RESERVED = frozenset({"uri", "label", "split", "image", "fields"}) | frozenset(COLUMNS)
NAME = re.compile(r"[a-z][a-z0-9_]*")
BOX_SIDES = ("xmin", "ymin", "xmax", "ymax")
BOX_KEYS = BOX_SIDES + ("label",)

# The Object Detection API's keys (its create_*_tf_record tools): detection trainers read them
# as they are. Box class ids start at 1 there (0 is the background in its label maps).
BBOX = {side: f"image/object/bbox/{side}" for side in BOX_SIDES}
BOX_LABEL, BOX_TEXT = "image/object/class/label", "image/object/class/text"
BOX_ID_OFFSET = 1
# A manifest row with fields may leave out its class label: image/class/label is then this,
# image/class/text "" (and so are the catalog's label_id and label).
NO_LABEL = -1


class FieldError(ValueError):
    """A value that breaks its field's declaration: one line naming the column and value."""

    def __init__(self, column, value, problem):
        super().__init__(f"column {column!r}: {problem}: {_shown(value)}")
        self.column, self.value, self.problem = column, value, problem


class UndeclaredColumn(FieldError):
    """A row's column that the schema does not declare: the launcher stops on it with one
    line naming the column and the schema file, instead of rejecting every such row."""


def _shown(value, limit=120):
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit - 3] + "..."


@dataclasses.dataclass(frozen=True)
class Field:
    """One declared field. `classes`: the vocabulary of a classes/boxes field, in id order:
    declared (closed: other names are rejected) or, for an open one, the ids the launcher
    gave (earlier ids kept, new names appended: launcher/rules.label_ids)."""

    name: str
    type: str
    max_len: int = 0                 # lists, classes, boxes: most values (0: no limit)
    required: bool = False           # a row without it is rejected
    classes: Optional[tuple] = None  # classes/boxes: the vocabulary in id order
    closed: bool = False             # classes came from the schema file: nothing else passes

    @property
    def has_classes(self):
        return self.type in (CLASSES, BOXES)

    def keys(self):
        """The Example keys this field's values go under, with their dtype."""
        if self.type == BOXES:
            return {**{key: "float" for key in BBOX.values()},
                    BOX_LABEL: "int64", BOX_TEXT: "string"}
        if self.type == CLASSES:
            return {f"{self.name}/label": "int64", f"{self.name}/text": "string"}
        return {self.name: _element(self.type)}

    def to_json(self):
        out = {"type": self.type}
        if self.max_len:
            out["max_len"] = self.max_len
        if self.required:
            out["required"] = True
        if self.classes is not None:
            out["classes"] = list(self.classes)
            out["closed"] = self.closed
        return out


def _element(kind):
    return {"int": "int64", "float": "float", "string": "string"}[kind.removeprefix(
        "list[").removesuffix("]")]


@dataclasses.dataclass(frozen=True)
class Schema:
    """The declared fields, in the file's order."""

    fields: tuple = ()
    source: str = dataclasses.field(default="", compare=False)  # the file it was read from

    def __bool__(self):
        return bool(self.fields)

    @property
    def names(self):
        return tuple(f.name for f in self.fields)

    @functools.cached_property
    def columns(self):
        """The manifest columns a row may have: uri, label, split and the fields (kept: a
        row check asks per column)."""
        return frozenset(self.names) | {"uri", "label", "split"}

    def field(self, name):
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"no field {name!r} (fields: {', '.join(self.names) or 'none'})")

    def keys(self):
        """{Example key: dtype} over every field."""
        out = {}
        for f in self.fields:
            out.update(f.keys())
        return out

    def to_json(self):
        """The manifest's "fields" entry (and a schema file's content)."""
        return {"fields": {f.name: f.to_json() for f in self.fields}}

    def with_classes(self, vocabularies):
        """{field name: class names in id order} -> the schema with those vocabularies."""
        return dataclasses.replace(self, fields=tuple(
            dataclasses.replace(f, classes=tuple(vocabularies[f.name]))
            if f.name in vocabularies else f for f in self.fields))


def from_json(obj, where="schema"):
    """A schema file's parsed content (or a manifest's "fields" entry) -> Schema, checked."""
    if not isinstance(obj, dict) or not isinstance(obj.get("fields"), dict) or set(obj) - {"fields"}:
        raise ValueError(f"{where}: expected a mapping with one key, fields: {{name: {{type: "
                         f"...}}}}")
    fields, box_fields = [], []
    for name, spec in obj["fields"].items():
        fields.append(_field(name, spec, f"{where}: field {name!r}"))
        if fields[-1].type == BOXES:
            box_fields.append(name)
    if len(box_fields) > 1:
        raise ValueError(f"{where}: fields {box_fields} are both boxes; one boxes field per "
                         "dataset (its values go under the Object Detection API's fixed keys)")
    return Schema(tuple(fields))


def _field(name, spec, where):
    if not isinstance(name, str) or not NAME.fullmatch(name) or name in RESERVED:
        raise ValueError(f"{where}: a field name must match [a-z][a-z0-9_]* and not be a "
                         "manifest or catalog column (uri, label, split, key, sha256, ...)")
    if isinstance(spec, str):
        spec = {"type": spec}
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: expected {{type: ...}}, not {_shown(spec)}")
    unknown = set(spec) - {"type", "max_len", "required", "classes", "closed"}
    if unknown:
        raise ValueError(f"{where}: unknown key {sorted(unknown)[0]!r} (keys: type, max_len, "
                         "required, classes)")
    kind = spec.get("type")
    if kind not in TYPES:
        hint = difflib.get_close_matches(str(kind), TYPES, n=1)
        raise ValueError(f"{where}: type {kind!r} is not one of {', '.join(TYPES)}"
                         + (f" (did you mean {hint[0]!r}?)" if hint else ""))
    max_len = spec.get("max_len", 0)
    if type(max_len) is not int or max_len < 0 or (max_len and kind in SCALARS):
        raise ValueError(f"{where}: max_len must be a whole number >= 0, for lists, classes "
                         f"and boxes only; found {_shown(max_len)}")
    required = spec.get("required", False)
    if type(required) is not bool:
        raise ValueError(f"{where}: required must be true or false, not {_shown(required)}")
    classes = spec.get("classes")
    if classes is not None:
        if kind not in (CLASSES, BOXES):
            raise ValueError(f"{where}: classes is for classes and boxes fields only")
        if (not isinstance(classes, list) or not all(isinstance(c, str) and c for c in classes)
                or len(set(classes)) != len(classes)):
            raise ValueError(f"{where}: classes must be a list of distinct non-empty names")
        classes = tuple(classes)
    closed = spec.get("closed", classes is not None)
    if type(closed) is not bool:
        raise ValueError(f"{where}: closed must be true or false, not {_shown(closed)}")
    return Field(name, kind, max_len, required, classes, closed and classes is not None)


def load(path):
    """A YAML or JSON schema file -> Schema (ValueError naming the file and the problem)."""
    import yaml

    try:
        obj = yaml.safe_load(storage.read_bytes(str(path)).decode("utf-8"))
    except OSError as e:
        raise ValueError(f"--schema {path}: cannot read it ({e.strerror or e})") from e
    except UnicodeDecodeError as e:
        raise ValueError(f"--schema {path}: not UTF-8 text ({e.reason})") from e
    except yaml.YAMLError as e:
        raise ValueError(f"--schema {path}: not valid YAML or JSON "
                         f"({' '.join(str(e).split())})") from e
    return dataclasses.replace(from_json(obj, path), source=str(path))


def dump(schema):
    """A Schema as the YAML a user keeps (load reads it back to an equal Schema)."""
    lines = ["fields:"]
    for f in schema.fields:
        lines.append(f"  {f.name}: {json.dumps(f.to_json(), ensure_ascii=False)}")
    return "\n".join(lines) + "\n"


# --- checking a row -------------------------------------------------------------------------

def check_row(schema, row, text=False):
    """A manifest row's field columns -> {name: checked value} (absent fields left out).

    `row`: the row's dict (uri, label and split are not fields); `text`: the row is CSV, so
    every cell is a string, read as its field's type (empty: absent). Raises FieldError for
    the first bad value, or a column the schema does not declare."""
    values = {}
    allowed = schema.columns
    for column in row:
        if column not in allowed:
            hint = difflib.get_close_matches(str(column), schema.names, n=1)
            raise UndeclaredColumn(column, row[column], "not a field of the schema"
                             + (f" (did you mean {hint[0]!r}?)" if hint else ""))
    for f in schema.fields:
        value = row.get(f.name)
        if text and value is not None:
            value = _from_text(f, value)
        if value is None:
            if f.required:
                raise FieldError(f.name, None, "required, and missing")
            continue
        values[f.name] = check_value(f, value)
    return values


def values_text(values):
    """check_row's values -> the JSON text a listing line carries them as (keys sorted: equal
    values, equal text; a previous version's catalog values give the same text). The
    launcher's passes hand the text on as a string: parsing and dumping three fields'
    nested values (a caption, tags, boxes) cost ~20 µs a pass against ~4 for the text, and
    a fresh build parses a line ~7 times; the writer parses it once (values_from_text)."""
    return _SORTED_JSON(values)


_SORTED_JSON = json.JSONEncoder(sort_keys=True).encode  # = json.dumps(v, sort_keys=True),
# without building an encoder per call


def values_from_text(text):
    """values_text's text (or None) -> {name: value} ({} for None)."""
    return json.loads(text) if text else {}


def _from_text(f, cell):
    """A CSV cell -> the value it spells for field f (None: empty)."""
    if cell.strip() == "":
        return None
    if f.type == "string":
        return cell
    if f.type in ("int", "float"):
        try:
            return int(cell) if f.type == "int" else float(cell)
        except ValueError:
            raise FieldError(f.name, cell, f"not {'an int' if f.type == 'int' else 'a float'}"
                             ) from None
    try:
        return json.loads(cell)
    except json.JSONDecodeError:
        raise FieldError(f.name, cell, "not a JSON array (a CSV cell of a list or boxes "
                         "field holds JSON)") from None


def check_value(f, value):
    """One field's value -> its checked form (FieldError when it breaks the declaration)."""
    if f.type in SCALARS:
        return _scalar(f, f.type, value, value)
    if not isinstance(value, list):
        raise FieldError(f.name, value, f"expected a list ({f.type})")
    if f.max_len and len(value) > f.max_len:
        raise FieldError(f.name, value, f"{len(value)} values, more than max_len {f.max_len}")
    if f.type in LISTS:
        kind = f.type[len("list["):-1]
        return [_scalar(f, kind, v, value) for v in value]
    if f.type == CLASSES:
        names = [_class(f, name, value) for name in value]
        if len(set(names)) != len(names):
            raise FieldError(f.name, value, "a class is listed twice")
        return names
    return [_box(f, box, value) for box in value]


def _scalar(f, kind, v, whole):
    if kind == "int":
        if type(v) is not int:  # bool is an int subclass: refused too
            raise FieldError(f.name, whole, f"expected int, found {_kind(v)}")
        if not -2**63 <= v < 2**63:
            raise FieldError(f.name, whole, "int outside the int64 range")
        return v
    if kind == "float":
        if type(v) not in (int, float):
            raise FieldError(f.name, whole, f"expected float, found {_kind(v)}")
        if not _finite(v):
            raise FieldError(f.name, whole, "not a finite number")
        return float(v)
    if type(v) is not str:
        raise FieldError(f.name, whole, f"expected string, found {_kind(v)}")
    return v


def _finite(v):
    """An int or float that is a finite float64 (an int past 1.8e308 is not one: isfinite
    raised OverflowError for it)."""
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def _kind(v):
    return {bool: "bool", int: "int", float: "float", str: "string", list: "list",
            dict: "object", type(None): "null"}.get(type(v), type(v).__name__)


def _class(f, name, whole):
    if type(name) is not str or not name:
        raise FieldError(f.name, whole, f"a class name must be a non-empty string, not "
                         f"{_shown(name)}")
    if f.closed and name not in f.classes:
        raise FieldError(f.name, whole, f"class {name!r} is not in the schema's classes")
    return name


def _box(f, box, whole):
    if not isinstance(box, dict) or box.keys() != _BOX_KEYSET:
        raise FieldError(f.name, whole, f"a box is {{xmin, ymin, xmax, ymax, label}}, not "
                         f"{_shown(box, 60)}")
    xmin, ymin, xmax, ymax = sides = (box["xmin"], box["ymin"], box["xmax"], box["ymax"])
    for side, v in zip(BOX_SIDES, sides):
        if type(v) is not float and type(v) is not int or not 0.0 <= v <= 1.0:
            if type(v) not in (int, float) or not _finite(v):
                raise FieldError(f.name, whole, f"box {side} must be a number, not {_shown(v)}")
            raise FieldError(f.name, whole, f"box {side} {v} is outside [0, 1] (coordinates "
                             "are fractions of the image's width and height)")
    if xmin > xmax:
        raise FieldError(f.name, whole, f"box is inverted: xmin {float(xmin)} > xmax "
                         f"{float(xmax)}")
    if ymin > ymax:
        raise FieldError(f.name, whole, f"box is inverted: ymin {float(ymin)} > ymax "
                         f"{float(ymax)}")
    return {"xmin": float(xmin), "ymin": float(ymin), "xmax": float(xmax), "ymax": float(ymax),
            "label": _class(f, box["label"], whole)}


_BOX_KEYSET = frozenset(BOX_KEYS)


def features(schema, values):
    """Checked values ({name: value}, check_row's) -> their Example features ({key:
    examples.ListFeature}). An absent field has no feature; box class ids start at
    BOX_ID_OFFSET, a classes field's at 0 (as the class label's)."""
    out = {}
    for f in schema.fields:
        value = values.get(f.name)
        if value is None:
            continue
        if f.type == BOXES:
            ids = _ids(f)
            for side, key in BBOX.items():
                out[key] = ListFeature("float", tuple([box[side] for box in value]))
            out[BOX_LABEL] = ListFeature("int64", tuple([ids[box["label"]] + BOX_ID_OFFSET
                                                         for box in value]))
            out[BOX_TEXT] = ListFeature("bytes", tuple([box["label"].encode() for box in value]))
        elif f.type == CLASSES:
            ids = _ids(f)
            out[f"{f.name}/label"] = ListFeature("int64", tuple([ids[name] for name in value]))
            out[f"{f.name}/text"] = ListFeature("bytes", tuple([name.encode() for name in value]))
        else:
            kind = _FEATURE_KINDS[f.type]
            items = value if f.type in LISTS else (value,)
            out[f.name] = ListFeature(kind, tuple([v.encode() for v in items])
                                      if kind == "bytes" else tuple(items))
    return out


def encoded(schema, values):
    """Checked values -> the bytes features() gives them in an Example, without building
    it: {a field's first Example key: examples.Entries, the pieces of its map entries}.
    What the writer puts in each record. An encoder per schema (made once, kept by
    identity as _ids' vocabularies) writes each field's entries straight from its values,
    their heads cut once per value count: for three fields (a caption, tags, boxes) ~7 µs
    an image against ~21 for features() and their ListFeature entries (bench_fields.py;
    the bytes are equal, tests/test_fields.py)."""
    found = _ENCODERS.get(id(schema))
    if found is None or found[0] is not schema:
        found = _ENCODERS[id(schema)] = (schema, _encoder(schema))
    return found[1](values)


_ENCODERS = {}  # id(schema) -> (the schema, its encoder)


def _encoder(schema):
    """Schema -> values -> {first key: Entries}, one closure per field made here."""
    every = sorted(_IMAGE_KEYS) + sorted(schema.keys())
    steps = []
    for f in schema.fields:
        keys = sorted(f.keys())
        inside = [k for k in every if keys[0] < k < keys[-1] and k not in keys]
        if inside:  # a field's entries are written together: nothing may sort between them
            raise ValueError(f"field {f.name!r}: key {inside[0]!r} sorts among its keys")
        steps.append((f.name, keys[0], _field_encoder(f, keys)))

    def encode(values):
        out = {}
        for name, first, step in steps:
            value = values.get(name)
            if value is not None:
                out[first] = Entries(step(value))
        return out

    return encode


def _field_encoder(f, keys):
    """Field f and its sorted Example keys -> value -> its map entries' pieces (the bytes
    examples._list_entry writes for features()'s ListFeatures, in key order)."""
    if f.has_classes:  # a vocabulary: each name's id and framed text made once
        offset = BOX_ID_OFFSET if f.type == BOXES else 0
        ids = {name: i + offset for name, i in _ids(f).items()}
        framed = {name: _framed(name.encode()) for name in ids}
        small_ids = not ids or max(ids.values()) < 0x80  # one byte each: bytes() packs them
        labels, names = _ints(keys[-2], small_ids), _texts(keys[-1])
        if f.type == CLASSES:
            return lambda value: (*labels([ids[name] for name in value]),
                                  *names(b"".join([framed[name] for name in value])))
        sides = _floats(keys[:4])

        def boxes(value):
            n = len(value)
            heads, pack = sides.get(n) or sides.make(n)
            classes = [b["label"] for b in value]
            return (heads[0], pack(*[b["xmax"] for b in value]),
                    heads[1], pack(*[b["xmin"] for b in value]),
                    heads[2], pack(*[b["ymax"] for b in value]),
                    heads[3], pack(*[b["ymin"] for b in value]),
                    *labels([ids[name] for name in classes]),
                    *names(b"".join([framed[name] for name in classes])))
        return boxes
    kind = _FEATURE_KINDS[f.type]
    if kind == "bytes":
        names = _texts(keys[0])
        if f.type in LISTS:
            return lambda value: names(b"".join([_framed(v.encode()) for v in value]))
        return lambda value: names(_framed(value.encode()))
    if kind == "int64":
        labels = _ints(keys[0])
        return labels if f.type in LISTS else lambda value: labels([value])
    floats = _floats(keys[:1])

    def encode(values):
        heads, pack = floats.get(len(values)) or floats.make(len(values))
        return heads[0], pack(*values)
    return encode if f.type in LISTS else lambda value: encode([value])


class _floats(dict):
    """{count: (the heads of float-list entries for `keys` holding that many, a packer of
    that many float32s)}: an entry's head depends only on its count, cut once from
    examples._list_entry's bytes."""

    def __init__(self, keys):
        super().__init__()
        self.keys_ = keys

    def make(self, n):
        heads = []
        for key in self.keys_:
            whole = examples._list_entry(key, ListFeature("float", (0.0,) * n))
            heads.append(whole[:len(whole) - 4 * n])
        self[n] = tuple(heads), examples._float_struct(n).pack
        return self[n]


def _ints(key, small=False):
    """An int64 list's entry encoder -> its pieces: values 0-127 (all of them, `small`: a
    vocabulary's ids) packed by bytes() after a head cut per count (as _floats'), other
    values whole through examples._list_entry."""
    heads = {}

    def encode(values):
        n = len(values)
        if n and (small or 0 <= min(values) and max(values) < 0x80):
            head = heads.get(n)
            if head is None:
                head = heads[n] = examples._list_entry(key, ListFeature("int64", (0,) * n))[:-n]
            return head, bytes(values)
        return (examples._list_entry(key, ListFeature("int64", tuple(values))),)
    return encode


def _framed(value):
    """One BytesList.value: its tag, length and bytes."""
    return b"\x0a" + examples._varint(len(value)) + value


def _texts(key):
    """A bytes list's entry encoder: its values framed (a body) -> (the head, which depends
    only on the body's length: kept per length up to _TEXT_HEADS, the body)."""
    heads = {}

    def encode(body):
        n = len(body)
        head = heads.get(n)
        if head is None:
            head = _text_head(key, n)
            if n < _TEXT_HEADS:
                heads[n] = head
        return head, body
    return encode


def _text_head(key, n):
    """The bytes before a BytesList body of n bytes in a map entry for `key`."""
    inner = b"\x0a" + examples._varint(n)                              # Feature.bytes_list
    entry = examples._key_field(key) + b"\x12" + examples._varint(len(inner) + n)
    return b"\x0a" + examples._varint(len(entry) + len(inner) + n) + entry + inner


_TEXT_HEADS = 4096  # bodies up to this long: their head kept per length


_FEATURE_KINDS = {kind: {"string": "bytes"}.get(_element(kind), _element(kind))
                  for kind in SCALARS + LISTS}
_ID_CACHE = {}  # id(vocabulary tuple) -> (the tuple, {name: id})


def _ids(f):
    """{class name: id} of a classes/boxes field, kept per vocabulary (by identity: hashing
    a tuple of names per image cost more than the lookup)."""
    found = _ID_CACHE.get(id(f.classes))
    if found is None or found[0] is not f.classes:
        if f.classes is None:
            raise ValueError(f"field {f.name!r} has no vocabulary yet (the launcher gives it one)")
        found = _ID_CACHE[id(f.classes)] = (f.classes,
                                            {name: i for i, name in enumerate(f.classes)})
    return found[1]


def values_of(fields, features):
    """A record's features (examples.parse_features) -> {name: value} for the declared
    `fields` (Field): a scalar or None when absent; a list; a classes field's ids (from 0);
    a boxes field as {"boxes": [[ymin, xmin, ymax, xmax], ...], "label": [ids from 1]}
    (float32 values, as stored). What the TensorFlow-free loaders give."""
    out = {}
    for f in fields:
        if f.type == BOXES:
            sides = [features.get(BBOX[s]) for s in ("ymin", "xmin", "ymax", "xmax")]
            labels = features.get(BOX_LABEL)
            out[f.name] = {"boxes": [list(box) for box in zip(*(s.values if s else ()
                                                                for s in sides))],
                           "label": list(labels.values) if labels else []}
        elif f.type == CLASSES:
            ids = features.get(f"{f.name}/label")
            out[f.name] = list(ids.values) if ids else []
        else:
            found = features.get(f.name)
            values = [v.decode() for v in found.values] if found and found.kind == "bytes" else (
                list(found.values) if found else [])
            out[f.name] = (values[0] if values else None) if f.type in SCALARS else values
    return out


def record_problems(schema, features, image_keys):
    """What is wrong with a stored record's field features (examples.parse_features) under
    the version's `schema` (with its vocabularies): [] when nothing. `image_keys`: the
    image's own Example keys. What verify checks per record."""
    found = []
    declared = schema.keys()
    extra = sorted(k for k in features if k not in image_keys and k not in declared)
    if extra:
        found.append(f"feature {extra[0]!r} is not a declared field's key")
    for f in schema.fields:
        keys = list(f.keys())
        present = [k for k in keys if k in features]
        if not present:
            if f.required:
                found.append(f"field {f.name!r} is required and missing")
            continue
        if len(present) != len(keys):
            found.append(f"field {f.name!r}: keys {sorted(set(keys) - set(present))} missing")
            continue
        lengths = {len(features[k].values) for k in keys}
        if len(lengths) != 1:
            found.append(f"field {f.name!r}: its keys hold {sorted(lengths)} values")
            continue
        n = lengths.pop()
        if f.type in SCALARS and n > 1 or f.max_len and n > f.max_len:
            found.append(f"field {f.name!r}: {n} values, more than {f.max_len or 1}")
        if f.has_classes:
            ids, names = (keys[-2], keys[-1])
            offset = BOX_ID_OFFSET if f.type == BOXES else 0
            for i, name in zip(features[ids].values, features[names].values):
                if not 0 <= i - offset < len(f.classes or ()) or f.classes[i - offset] != name.decode():
                    found.append(f"field {f.name!r}: class id {i} is not {name.decode()!r} in "
                                 "the manifest's vocabulary")
                    break
        if f.type == BOXES:
            box = {side: features[BBOX[side]].values for side in BOX_SIDES}
            for j in range(n):
                v = {side: box[side][j] for side in BOX_SIDES}
                if (not all(0.0 <= x <= 1.0 for x in v.values())
                        or v["xmin"] > v["xmax"] or v["ymin"] > v["ymax"]):
                    found.append(f"field {f.name!r}: box {j} {v} is outside [0, 1] or inverted")
                    break
    return found


def declared_fields(manifest, names):
    """The Fields named `names` in a version's manifest (KeyError naming an unknown one)."""
    schema = from_json(manifest["fields"]) if manifest.get("fields") else Schema()
    return tuple(schema.field(name) for name in names)


def class_names(f, value):
    """The class names a checked value of a classes/boxes field uses."""
    return value if f.type == CLASSES else [box["label"] for box in value]


# --- across versions ------------------------------------------------------------------------

def stale_fields(before, after):
    """The fields of records stored under `before` (a manifest's "fields" entry, or None)
    that `after` (Schema.to_json() or None) no longer declares with the same type: a record
    holding a value for one is re-framed (its stored image bytes, the listing's values
    under `after`: the manifest's values are checked against the new type as they are
    listed), never decoded. A field added needs nothing here: the images with a value for
    it differ from their catalog rows, and are re-framed."""
    old = (before or {}).get("fields", {})
    new = (after or {}).get("fields", {})
    return frozenset(name for name, spec in old.items()
                     if name not in new or new[name]["type"] != spec["type"])


STALE = "!"  # prefix of a stale field's name in a previous catalog row's values (no field
# name starts with it, so its digest matches no listed image's: previous.CatalogRows)


def ids_kept(before, schema):
    """Whether every class id of the previous version's classes/boxes fields holds in
    `schema` (a Schema with its vocabularies): else its records must all be re-framed."""
    if not before:
        return True
    now = {f.name: f for f in schema.fields} if schema else {}
    for name, spec in before.get("fields", {}).items():
        old = tuple(spec.get("classes") or ())
        if name not in now or now[name].type != spec["type"]:
            continue  # removed or retyped: its records are re-framed (stale_fields)
        if old and tuple(now[name].classes or ())[:len(old)] != old:
            return False
    return True


# --- inference ------------------------------------------------------------------------------

def infer(rows, text=False):
    """Manifest rows (dicts) -> the Schema their extra columns fit: ints, floats (ints and
    floats mixed), strings, lists of those, lists of strings as classes (multi-label tags,
    open vocabulary), lists of {xmin, ymin, xmax, ymax, label} as boxes. `text`: CSV cells
    (numbers read from text). Raises ValueError naming a column no type fits."""
    seen = {}  # column -> [types seen, longest list], in first-seen order: memory per column
    for row in rows:
        for column, value in row.items():
            if (column in ("uri", "label", "split") or value is None or value == []
                    or (text and value == "")):
                continue
            kind, length = _guess(column, cell_value(value) if text else value)
            found = seen.setdefault(column, [set(), 0])
            found[0].add(kind)
            found[1] = max(found[1], length)
    fields = {}
    for column, (kinds, longest) in seen.items():
        kinds = set(kinds)
        if kinds == {"int", "float"}:
            kinds = {"float"}
        elif kinds == {"list[int]", "list[float]"}:
            kinds = {"list[float]"}
        if len(kinds) != 1:
            raise ValueError(f"column {column!r}: values of several types ({', '.join(sorted(kinds))}); "
                             "write a schema for it")
        kind = kinds.pop()
        spec = {"type": kind}
        if kind not in SCALARS:
            spec["max_len"] = longest
        fields[column] = spec
    return from_json({"fields": fields}, "inferred schema")


def cell_value(cell):
    """A CSV cell as the JSON value it spells: an int, a float, a JSON array, else the text."""
    for parse in (int, float, json.loads):
        try:
            value = parse(cell)
        except ValueError:
            continue
        if parse is not json.loads or isinstance(value, list):
            return value
    return cell


def _guess(column, value):
    """(type, length) of one value."""
    if type(value) in (int, float, str):
        return {int: "int", float: "float", str: "string"}[type(value)], 0
    if isinstance(value, list):
        kinds = {type(v) for v in value}
        if value and all(isinstance(v, dict) and set(v) == set(BOX_KEYS) for v in value):
            return BOXES, len(value)
        if kinds <= {str}:
            return CLASSES, len(value)
        if kinds <= {int}:
            return "list[int]", len(value)
        if kinds <= {int, float}:
            return "list[float]", len(value)
    raise ValueError(f"column {column!r}: no field type fits {_shown(value)}; write a schema "
                     "for it")
