"""Pure record work: one stored image -> serialized tf.train.Example -> TFRecord frame."""

import hashlib
import struct

from readers import schema


def make_example(encoded, label, text, filename):
    """Serialized tf.train.Example with the DESIGN §3 keys; byte-identical for equal inputs."""
    from tensorflow.core.example import example_pb2, feature_pb2

    def b(v):
        return feature_pb2.Feature(bytes_list=feature_pb2.BytesList(value=[v]))

    def i(v):
        return feature_pb2.Feature(int64_list=feature_pb2.Int64List(value=[v]))

    features = {
        schema.ENCODED: b(encoded.data),
        schema.FORMAT: b(b"JPEG"),
        schema.HEIGHT: i(encoded.height),
        schema.WIDTH: i(encoded.width),
        schema.CHANNELS: i(3),
        schema.COLORSPACE: b(b"RGB"),
        schema.LABEL: i(label),
        schema.TEXT: b(text.encode()),
        schema.FILENAME: b(filename.encode()),
        schema.SHA256: b(hashlib.sha256(encoded.data).hexdigest().encode()),
    }
    example = example_pb2.Example(features=feature_pb2.Features(feature=features))
    # Map fields serialize in a per-process order unless asked not to (DESIGN §5).
    return example.SerializeToString(deterministic=True)


def _masked_crc(data):
    import google_crc32c

    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord_frame(record):
    """One TFRecord frame: length, masked crc32c of length, data, masked crc32c of data.

    Framed here rather than by tf.io.TFRecordWriter so the bytes can go to any Beam
    FileSystems stream (gs:// included) while offsets for the index are known.
    """
    length = struct.pack("<Q", len(record))
    return b"".join((length, struct.pack("<I", _masked_crc(length)),
                     record, struct.pack("<I", _masked_crc(record))))
