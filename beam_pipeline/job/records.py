"""Pure record work: one stored image -> serialized tf.train.Example -> TFRecord frame, and back."""

import functools
import hashlib
import struct

from readers import schema


def make_example(encoded, label, text, filename, sha256=None):
    """Serialized tf.train.Example with the DESIGN §3 keys; byte-identical for equal inputs.

    `sha256`: the hex digest of encoded.data when the caller already has it (the catalog).
    """
    features = {
        schema.ENCODED: encoded.data,
        schema.FORMAT: b"JPEG",
        schema.HEIGHT: encoded.height,
        schema.WIDTH: encoded.width,
        schema.CHANNELS: 3,
        schema.COLORSPACE: b"RGB",
        schema.LABEL: label,
        schema.TEXT: text.encode(),
        schema.FILENAME: filename.encode(),
        schema.SHA256: (sha256 or hashlib.sha256(encoded.data).hexdigest()).encode(),
    }
    return serialize_example(features)


def serialize_example(features):
    """{key: bytes | int} -> the bytes of `tf.train.Example.SerializeToString(deterministic=True)`.

    Encoded here, not with TensorFlow's protos, so shard writers never import TensorFlow:
    that import costs each worker ~3 s and ~0.5 GB, more than writing a shard of JPEGs
    takes. Deterministic protobuf order is map entries sorted by key; a test checks
    equality with TensorFlow's own serialization.
    """
    entries = []
    for key in sorted(features):
        value = features[key]
        if isinstance(value, bytes):
            feature = _field(1, _field(1, value))                    # bytes_list.value
        else:
            feature = _field(3, _field(1, _varint(value & _U64)))    # int64_list.value, packed
        entries.append(_field(1, _key_field(key) + _field(2, feature)))
    return _field(1, b"".join(entries))                               # Example.features


_U64 = (1 << 64) - 1
_SMALL = [bytes((n,)) for n in range(0x80)]  # one-byte varints: most tags and lengths


def _varint(n):
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_TAGS = {number: _varint(number << 3 | 2) for number in (1, 2, 3)}


def _field(number, payload):
    """A length-delimited protobuf field (wire type 2)."""
    return _TAGS[number] + _varint(len(payload)) + payload


@functools.lru_cache(maxsize=64)
def _key_field(key):
    return _field(1, key.encode())


def tfrecord_frame(record):
    """One TFRecord frame: length, masked crc32c of length, data, masked crc32c of data.

    Framed here rather than by tf.io.TFRecordWriter so the bytes can go to any Beam
    FileSystems stream (gs:// included) while offsets for the index are known.
    """
    length = struct.pack("<Q", len(record))
    return b"".join((length, struct.pack("<I", masked_crc(length)),
                     record, struct.pack("<I", masked_crc(record))))


def masked_crc(data):
    """TFRecord's masked CRC-32C of `data`."""
    import google_crc32c

    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class FrameError(ValueError):
    """A TFRecord frame that is cut short or fails a CRC; `offset` is where the frame starts.

    `frame_length` and `record` are set when only the record bytes are bad (the length was
    intact), so reading can go on with the next frame.
    """

    def __init__(self, offset, message, frame_length=None, record=None):
        super().__init__(f"offset {offset}: {message}")
        self.offset, self.frame_length, self.record = offset, frame_length, record


def read_frame(f, offset, check_crc=True):
    """The record of the frame starting at `offset` of the open file `f`, or None at EOF.

    Returns (record bytes, frame length). Raises FrameError when the frame is damaged.
    """
    header = f.read(12)
    if not header:
        return None
    if len(header) < 12:
        raise FrameError(offset, f"truncated frame header ({len(header)} of 12 bytes)")
    length_bytes, (length_crc,) = header[:8], struct.unpack("<I", header[8:])
    if check_crc and masked_crc(length_bytes) != length_crc:
        raise FrameError(offset, "length CRC mismatch (frame header is corrupt)")
    (length,) = struct.unpack("<Q", length_bytes)
    body = f.read(length + 4)
    if len(body) < length + 4:
        raise FrameError(offset, f"truncated record: {length + 4} bytes expected, "
                                 f"{len(body)} left in the file")
    record, (data_crc,) = body[:length], struct.unpack("<I", body[length:])
    if check_crc and masked_crc(record) != data_crc:
        raise FrameError(offset, "data CRC mismatch (record bytes are corrupt)",
                         frame_length=12 + length + 4, record=record)
    return record, 12 + length + 4
