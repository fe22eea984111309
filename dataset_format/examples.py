"""The records of docs/format.md as bytes: a tf.train.Example serialized and parsed without
TensorFlow, both directions of one wire format.

The writer serializes its Examples here (beam_pipeline/job/records.py builds the features):
importing TensorFlow costs each worker ~3 s and ~0.5 GB, more than writing a shard of JPEGs
takes. The way back is for re-framing stored records and for the TensorFlow-free loaders.
The image's own features are scalars (parse_example keeps a list's first value); declared
fields (dataset_format/fields.py) are lists, ListFeature both ways (parse_features), or
written as Entries the writer encoded per schema.
"""

import functools
import struct
import typing


class ListFeature(typing.NamedTuple):
    """A feature's whole list, typed (an empty list still has a kind): `kind` is "bytes",
    "int64" or "float" (float32 on the wire). A named tuple, not a frozen dataclass: the
    writer makes ~9 a record with three fields, at half the cost."""

    kind: str
    values: tuple


class Entries(tuple):
    """One declared field's Features.feature map entries, encoded already: pieces of bytes
    in its keys' sorted order (fields.encoded makes them), which serialize_parts writes as
    they are. Its key in a features dict is the field's first Example key; no other key
    sorts between a field's own keys (fields.encoded checks that once per schema)."""

    __slots__ = ()


# --- serialize --------------------------------------------------------------------------------

def serialize_example(features):
    """{key: bytes | int} -> the bytes of `tf.train.Example.SerializeToString(deterministic=True)`.

    Encoded here, not with TensorFlow's protos, so shard writers never import TensorFlow:
    that import costs each worker ~3 s and ~0.5 GB, more than writing a shard of JPEGs
    takes. Deterministic protobuf order is map entries sorted by key; a test checks
    equality with TensorFlow's own serialization.
    """
    return b"".join(serialize_parts(features)[0])


def serialize_parts(features):
    """serialize_example's bytes as (pieces, total length). Each length-delimited field's
    header is computed from its payload's length, so no payload is copied per nesting
    level (5 levels: 60 µs of a 40 KB photo's ~1 ms); the small pieces between two large
    values are joined (one piece each)."""
    parts, small, total = [], [], 0
    for key in sorted(features):
        value = features[key]
        kind = type(value)
        if kind is bytes and len(value) > _CACHED_BYTES:
            if len(value) < _PIECE:  # a hash, a file name: joined with its neighbours
                small += (_entry_head(key, value), value)
                continue
            small.append(_entry_head(key, value))
            parts += (b"".join(small), value)
            small = []
            total += len(parts[-2]) + len(value)
        elif kind is Entries:  # a declared field's entries, encoded per schema
            small += value
        elif kind is ListFeature:  # a declared field's values
            small.append(_list_entry(key, value))
        else:  # labels, sizes, format: the same few entries in every record
            small.append(_small_entry(key, value))
    tail = b"".join(small)
    total += len(tail)
    head = _field_header(1, total)                                      # Example.features
    if parts:
        parts[0] = head + parts[0]
    else:
        tail = head + tail
    parts.append(tail)
    return parts, total + len(head)


_CACHED_BYTES = 16  # bytes values up to this long are encoded once (hashes and images are not)
_PIECE = 4096  # bytes values from this long stay pieces of their own (images): not copied


def _entry_head(key, value):
    """A Features.feature map entry for a bytes value, up to where the value's bytes go."""
    values = _field_header(1, len(value))                               # BytesList.value
    inner = _field_header(1, len(values) + len(value)) + values         # Feature.bytes_list
    feature_len = len(inner) + len(value)
    head = _key_field(key) + _field_header(2, feature_len)              # map entry: key, value
    return _field_header(1, len(head) + feature_len) + head + inner     # Features.feature


@functools.lru_cache(maxsize=1024)
def _small_entry(key, value):
    """A whole map entry for an int or a short bytes value."""
    if isinstance(value, bytes):
        return _entry_head(key, value) + value
    packed = _field(1, _varint(value & _U64))                           # Int64List.value
    inner = _field(3, packed)                                           # Feature.int64_list
    head = _key_field(key) + _field_header(2, len(inner))               # map entry: key, value
    return _field_header(1, len(head) + len(inner)) + head + inner      # Features.feature


def _list_entry(key, feature):
    """A whole map entry for a ListFeature; a one-value list is what _small_entry writes
    for that value (TensorFlow packs int64 and float lists). Tags spelt inline, a value's
    one-byte length looked up, ids 0-127 packed by bytes(): a record with three fields has
    ~9 of these, and _varint's ~50 calls a record were a third of their cost."""
    values, kind = feature.values, feature.kind
    if kind == "bytes":
        body = b"".join([b"\x0a" + (_SMALL[len(v)] if len(v) < 0x80 else _varint(len(v))) + v
                         for v in values])                                  # BytesList.value
        inner = b"\x0a" + _varint(len(body)) + body                          # bytes_list
    elif kind == "int64" or kind == "float":
        if not values:
            body = b""
        elif kind == "int64":
            packed = (bytes(values) if 0 <= min(values) and max(values) < 0x80
                      else b"".join([_varint(v & _U64) for v in values]))
            body = b"\x0a" + _varint(len(packed)) + packed                   # Int64List.value
        else:
            packed = _float_struct(len(values)).pack(*values)
            body = b"\x0a" + _varint(len(packed)) + packed                   # FloatList.value
        inner = (b"\x1a" if kind == "int64" else b"\x12") + _varint(len(body)) + body
    else:
        raise ValueError(f"feature {key!r}: kind {kind!r} is not bytes, int64 or float")
    head = _key_field(key) + b"\x12" + _varint(len(inner))
    return b"\x0a" + _varint(len(head) + len(inner)) + head + inner


@functools.lru_cache(maxsize=256)
def _float_struct(n):
    return struct.Struct(f"<{n}f")


_U64 = (1 << 64) - 1
_SMALL = [bytes((n,)) for n in range(0x80)]  # one-byte varints: most tags and lengths


def _varint(n):
    """n >= 0 -> its varint bytes (_read_varint reads them back)."""
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_varint(data, i):
    """The varint at data[i] -> (its value, the index after it)."""
    shift = value = 0
    while True:
        if i >= len(data):
            raise ValueError("protobuf varint runs past the end")
        byte = data[i]
        value |= (byte & 0x7F) << shift
        i += 1
        if byte < 0x80:
            return value, i
        shift += 7


_TAGS = {number: _varint(number << 3 | 2) for number in (1, 2, 3)}


def _field(number, payload):
    """A length-delimited protobuf field (wire type 2)."""
    return _TAGS[number] + _varint(len(payload)) + payload


def _field_header(number, length):
    """The tag and length that precede a length-delimited field's `length` payload bytes."""
    return _TAGS[number] + _varint(length)


@functools.lru_cache(maxsize=64)
def _key_field(key):
    return _field(1, key.encode())


# --- parse ------------------------------------------------------------------------------------

def parse_example(record):
    """Serialized tf.train.Example -> {feature key: bytes | int} (scalar features, as
    serialize_example writes them; a list feature keeps its first value, an empty one is
    None; a float list, a declared field's, is left to parse_features)."""
    features = {}
    for number, value in _fields(_only(record, 1)):        # Example.features
        if number != 1:
            continue
        entry = dict(_fields(value))                       # Features.feature map entry
        key, feature = entry[1].decode(), dict(_fields(entry.get(2, b"")))
        if 1 in feature:                                   # bytes_list
            features[key] = _only(feature[1], 1) if feature[1] else None
        elif 3 in feature:                                 # int64_list
            features[key] = _int64(feature[3]) if feature[3] else None
        elif 2 not in feature:
            raise ValueError(f"feature {key!r}: not a bytes, float or int64 list")
    return features


def parse_features(record):
    """Serialized tf.train.Example -> {feature key: ListFeature}: every value of every list
    (packed or not), for records with declared fields."""
    features = {}
    for number, value in _fields(_only(record, 1)):
        if number != 1:
            continue
        entry = dict(_fields(value))
        key, feature = entry[1].decode(), dict(_fields(entry.get(2, b"")))
        if 1 in feature:
            features[key] = ListFeature(
                "bytes", tuple(v for n, v in _fields(feature[1]) if n == 1))
        elif 3 in feature:
            features[key] = ListFeature("int64", tuple(_int64_all(feature[3])))
        elif 2 in feature:
            features[key] = ListFeature("float", tuple(_floats(feature[2])))
        else:
            raise ValueError(f"feature {key!r}: not a bytes, float or int64 list")
    return features


def _int64_all(payload):
    for _, value in _fields(payload, varints=True):
        if isinstance(value, bytes):                       # packed
            i = 0
            while i < len(value):
                v, i = _read_varint(value, i)
                yield v - (1 << 64) if v >= 1 << 63 else v
        else:
            yield value - (1 << 64) if value >= 1 << 63 else value


def _floats(payload):
    for number, value in _fields(payload, varints=False, fixed32=True):
        if isinstance(value, bytes):                       # packed
            yield from (v for (v,) in struct.iter_unpack("<f", value))
        else:
            yield value


def _int64(payload):
    fields = list(_fields(payload, varints=True))
    number, value = fields[0]
    if isinstance(value, bytes):                           # packed
        value, _ = _read_varint(value, 0)
    return value - (1 << 64) if value >= 1 << 63 else value


def _only(payload, number):
    for n, value in _fields(payload):
        if n == number:
            return value
    raise ValueError(f"protobuf field {number} missing")


def _fields(data, varints=False, fixed32=False):
    """(field number, bytes or int) of each field of a protobuf message.

    Tags and lengths below 128 (nearly all of them here) are read inline, not through
    _read_varint: 90 of a record's ~110 varints, which halves the parse (~330 -> ~150 us)."""
    i, end = 0, len(data)
    while i < end:
        tag = data[i]
        i += 1
        if tag >= 0x80:
            tag, i = _read_varint(data, i - 1)
        number, wire = tag >> 3, tag & 7
        if wire == 2:
            length = data[i] if i < end else 0x80
            i += 1
            if length >= 0x80:
                length, i = _read_varint(data, i - 1)
            if i + length > end:
                raise ValueError("protobuf field runs past the end")
            yield number, data[i:i + length]
            i += length
        elif wire == 0 and varints:
            value, i = _read_varint(data, i)
            yield number, value
        elif wire == 5 and fixed32 and i + 4 <= end:  # an unpacked float
            yield number, struct.unpack_from("<f", data, i)[0]
            i += 4
        else:
            raise ValueError(f"unexpected protobuf wire type {wire}")
