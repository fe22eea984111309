"""A manifest row's declared fields checked and written as their JSON text in one pass, and
the tally of the class names the listed rows use: what the launcher does per row.

fields.check_row then fields.values_text cost ~13.5 µs a row for three fields (a caption,
1-4 tags, 1-3 boxes; 300 of bench_fields.py's rows, a loaded machine): nested dicts built,
then dumped with their keys sorted. row_text checks the same values with a checker made
once per schema and writes each value's text as it checks it (~8.5 µs, most of it the four
float reprs of a box): the bytes values_text gives (the listing's digests and fingerprints
depend on them; tests/test_field_rows.py compares them on random rows). Any value off the common path (a wrong type, an int in
a float field, a missing required field) goes to check_row itself, so every FieldError is
the one it raises, for the same first bad column.
"""

import collections
import math
from json.encoder import encode_basestring_ascii as _string  # = json.dumps(a str)

from dataset_format import fields as field_types
from dataset_format.fields import BOXES, CLASSES, LISTS, SCALARS

_INT64 = (-2**63, 2**63)
_float_text, _int_text = float.__repr__, int.__repr__  # what json writes for each


def row_text(schema, row, text=False):
    """check_row(schema, row, text) -> (values_text of its values, [(field name, class
    names)] of its open classes/boxes fields with a value). Raises check_row's FieldError
    (fields.UndeclaredColumn for a column the schema does not declare)."""
    found = _CHECKERS.get(id(schema))
    if found is None or found[0] is not schema:
        found = _CHECKERS[id(schema)] = (schema, _checker(schema))
    return found[1](row, text)


_CHECKERS = {}  # id(schema) -> (the schema, its checker), as fields.encoded's encoders


def _checker(schema):
    allowed = schema.columns
    steps = [(f, _step(f)) for f in schema.fields]
    order = sorted(range(len(steps)), key=lambda i: steps[i][0].name)
    heads = [_string(f.name) + ": " for f, _ in steps]
    open_classes = [f.has_classes and not f.closed for f, _ in steps]

    def slow(row, text):
        values = field_types.check_row(schema, row, text)
        return field_types.values_text(values), [
            (f.name, field_types.class_names(f, values[f.name])) for f, _ in steps
            if f.has_classes and not f.closed and values.get(f.name)]

    def check(row, text):
        if not allowed.issuperset(row):
            return slow(row, text)
        pieces, classes = [None] * len(steps), []
        for i, (f, step) in enumerate(steps):
            value = row.get(f.name)
            if text and value is not None:
                value = field_types._from_text(f, value)
            if value is None:
                if f.required:
                    return slow(row, text)
                continue
            piece = step(value)
            if piece is None:  # off the common path: check_row says what is wrong
                return slow(row, text)
            pieces[i] = piece
            if open_classes[i] and value:
                classes.append((f.name, value if f.type == CLASSES
                                else [box["label"] for box in value]))
        return "{" + ", ".join([heads[i] + pieces[i] for i in order
                                if pieces[i] is not None]) + "}", classes

    return check


def _step(f):
    """Field f -> value -> its JSON text when it is plainly valid, else None (the row then
    goes to check_row)."""
    limit = f.max_len
    if f.type in SCALARS:
        return _SCALAR[f.type]
    if f.type in LISTS:
        one = _SCALAR[f.type[len("list["):-1]]

        def listed(value):
            if type(value) is not list or limit and len(value) > limit:
                return None
            parts = [one(v) for v in value]
            return None if None in parts else "[" + ", ".join(parts) + "]"
        return listed
    closed = frozenset(f.classes) if f.closed else None

    if f.type == CLASSES:
        def classes(value):
            if (type(value) is not list or limit and len(value) > limit
                    or not _STR.issuperset(map(type, value))):
                return None
            names = set(value)
            if len(names) != len(value) or "" in names or closed is not None and not (
                    names <= closed):
                return None
            return "[" + ", ".join(map(_string, value)) + "]"
        return classes
    assert f.type == BOXES

    def boxes(value):
        if type(value) is not list or limit and len(value) > limit:
            return None
        parts = []
        for box in value:
            if type(box) is not dict or box.keys() != _BOX_KEYS:
                return None
            xmin, ymin, xmax, ymax = box["xmin"], box["ymin"], box["xmax"], box["ymax"]
            label = box["label"]
            if (type(xmin) is not float or type(ymin) is not float or type(xmax) is not float
                    or type(ymax) is not float or not 0.0 <= xmin <= xmax <= 1.0
                    or not 0.0 <= ymin <= ymax <= 1.0 or type(label) is not str or not label
                    or closed is not None and label not in closed):
                return None
            parts.append(_BOX % (_string(label), xmax, xmin, ymax, ymin))
        return "[" + ", ".join(parts) + "]"
    return boxes


_BOX_KEYS = frozenset(field_types.BOX_KEYS)
_BOX = '{"label": %s, "xmax": %r, "xmin": %r, "ymax": %r, "ymin": %r}'  # keys sorted; %r of
# a float is float.__repr__, what json writes
_STR = {str}


def _int(v):
    return _int_text(v) if type(v) is int and _INT64[0] <= v < _INT64[1] else None


def _float(v):
    return _float_text(v) if type(v) is float and math.isfinite(v) else None


def _str(v):
    return _string(v) if type(v) is str else None


_SCALAR = {"int": _int, "float": _float, "string": _str}


class ClassTally:
    """How many listed rows use each class name of each open classes/boxes field: rows
    counted as checked (row_text's names), taken off again when a later stage drops the
    row (not found, too large, a duplicate, an unknown label). The names left are those
    of the images the build keeps: what plan_listing collected by parsing each kept
    line's text again (~5 µs an image)."""

    def __init__(self, schema):
        self.open = {f.name: f for f in schema.fields if f.has_classes and not f.closed}
        self.counts = {name: collections.Counter() for name in self.open}

    def add(self, classes):
        """row_text's [(field name, class names)] of a row listed."""
        for name, names in classes:
            self.counts[name].update(names)

    def drop(self, text):
        """A counted row's values_text (None: no fields), its row dropped since."""
        if not text or not self.open:
            return
        values = field_types.values_from_text(text)
        for name, f in self.open.items():
            self.counts[name].subtract(field_types.class_names(f, values.get(name) or ()))

    def present(self):
        """{field name: the class names kept images use} (fields with none left out)."""
        out = {name: {n for n, k in counts.items() if k > 0}
               for name, counts in self.counts.items()}
        return {name: names for name, names in out.items() if names}
