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
from dataset_format.examples import parse_example


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
