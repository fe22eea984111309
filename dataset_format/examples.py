"""A serialized tf.train.Example parsed without TensorFlow: the records of docs/format.md.

The writer serializes its Examples by hand (beam_pipeline/job/records.py); this is the way
back, for re-framing stored records and for the TensorFlow-free loaders. Every feature of the
format is a scalar, so a list feature keeps its first value.
"""


def parse_example(record):
    """Serialized tf.train.Example -> {feature key: bytes | int} (scalar features, as
    records.serialize_example writes them; a list feature keeps its first value)."""
    features = {}
    for number, value in _fields(_only(record, 1)):        # Example.features
        if number != 1:
            continue
        entry = dict(_fields(value))                       # Features.feature map entry
        key, feature = entry[1].decode(), dict(_fields(entry.get(2, b"")))
        if 1 in feature:                                   # bytes_list
            features[key] = _only(feature[1], 1)
        elif 3 in feature:                                 # int64_list
            features[key] = _int64(feature[3])
        else:
            raise ValueError(f"feature {key!r}: not a bytes or int64 list")
    return features


def _int64(payload):
    fields = list(_fields(payload, varints=True))
    number, value = fields[0]
    if isinstance(value, bytes):                           # packed
        value, _ = _varint(value, 0)
    return value - (1 << 64) if value >= 1 << 63 else value


def _only(payload, number):
    for n, value in _fields(payload):
        if n == number:
            return value
    raise ValueError(f"protobuf field {number} missing")


def _fields(data, varints=False):
    """(field number, bytes or int) of each field of a protobuf message.

    Tags and lengths below 128 (nearly all of them here) are read inline, not through
    _varint: 90 of a record's ~110 varints, which halves the parse (~330 -> ~150 us)."""
    i, end = 0, len(data)
    while i < end:
        tag = data[i]
        i += 1
        if tag >= 0x80:
            tag, i = _varint(data, i - 1)
        number, wire = tag >> 3, tag & 7
        if wire == 2:
            length = data[i] if i < end else 0x80
            i += 1
            if length >= 0x80:
                length, i = _varint(data, i - 1)
            if i + length > end:
                raise ValueError("protobuf field runs past the end")
            yield number, data[i:i + length]
            i += length
        elif wire == 0 and varints:
            value, i = _varint(data, i)
            yield number, value
        else:
            raise ValueError(f"unexpected protobuf wire type {wire}")


def _varint(data, i):
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
