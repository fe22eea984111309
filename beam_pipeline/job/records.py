"""Pure record work: one stored image -> serialized tf.train.Example (dataset_format.examples;
framed by dataset_format.frames)."""

import hashlib

from dataset_format import schema
from dataset_format.examples import serialize_parts


def make_example(encoded, label, text, filename, sha256=None, fields=None):
    """Serialized tf.train.Example with the dataset_format/schema.py keys; byte-identical for equal inputs.

    `sha256`: the hex digest of encoded.data when the caller already has it (the catalog).
    `fields`: declared fields' features (dataset_format/fields.encoded or .features), beside
    the image's.
    """
    return b"".join(example_parts(encoded, label, text, filename, sha256, fields)[0])


def example_parts(encoded, label, text, filename, sha256=None, fields=None):
    """make_example's bytes as (pieces, their total length): the shard writer frames and
    writes the pieces as they are, so the image bytes are not copied into a record first."""
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
    if fields:
        features.update(fields)
    return serialize_parts(features)
