"""A stored record under a new key or label, without decoding its image.

An image that moved, was renamed or relabelled, or whose bytes reappear under a new name,
already has its converted JPEG in an earlier version. A full build would store exactly
those bytes again (conversion is deterministic), so the record is rebuilt around them:
parse the stored tf.train.Example, set the key and label, serialize it again. The result
is byte-identical to what converting the input would give.
"""

import io

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_pipeline.job import records
from dataset_format import frames, schema


def read_stored(source):
    """A StoredFrame -> the record bytes of that TFRecord frame (CRCs checked)."""
    with FileSystems.open(source.path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        f.seek(source.offset)
        frame = f.read(source.length)
    if len(frame) != source.length:
        raise IOError(f"{source.path}: frame at {source.offset} is cut short "
                      f"({len(frame)} of {source.length} bytes)")
    found = frames.read_frame(io.BytesIO(frame), source.offset)
    if found is None or found[1] != source.length:
        raise IOError(f"{source.path}: no whole frame at offset {source.offset}")
    return found[0]


def reframe(record, key, label_id, label):
    """A stored Example's bytes -> (the Example for `key` and `label`, its features)."""
    features = parse_example(record)
    features.update({schema.FILENAME: key.encode(), schema.LABEL: label_id,
                     schema.TEXT: label.encode()})
    return records.serialize_example(features), features


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
    """(field number, bytes or int) of each field of a protobuf message."""
    i = 0
    while i < len(data):
        tag, i = _varint(data, i)
        number, wire = tag >> 3, tag & 7
        if wire == 2:
            length, i = _varint(data, i)
            if i + length > len(data):
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
