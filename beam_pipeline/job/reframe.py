"""A stored record under a new key or label, without decoding its image.

An image that moved, was renamed or relabelled, or whose bytes reappear under a new name,
already has its converted JPEG in an earlier version. A full build would store exactly
those bytes again (conversion is deterministic), so the record is rebuilt around them:
parse the stored tf.train.Example, set the key and label, serialize it again. The result
is byte-identical to what converting the input would give.
"""

import io

from beam_pipeline.store import ranges, transient
from dataset_format import frames, schema
from dataset_format.examples import parse_example, parse_features, serialize_example


def read_stored(source):
    """A StoredFrame -> the record bytes of that TFRecord frame (CRCs checked): one ranged
    read of exactly the frame."""
    return record_of(source, ranges.read_range(source.path, source.offset, source.length))


def read_stored_run(sources):
    """StoredFrames of one shard file that store/ranges.py reads as one run -> [(record
    bytes, None) or (None, the error)], in order: one read for all of them."""
    run = ranges.Run(sources[0].offset, sources[-1].offset + sources[-1].length,
                     tuple((s.offset, s.length) for s in sources))
    try:
        frames_read = ranges.read_run(sources[0].path, run)
    except Exception as e:  # each is converted from its input instead ...
        if transient.is_transient(e):  # ... unless storage is only busy: the task retries
            raise transient.unavailable(e, sources[0].path) from e
        return [(None, e)] * len(sources)
    out = []
    for source, frame in zip(sources, frames_read):
        try:
            out.append((record_of(source, frame), None))
        except Exception as e:
            out.append((None, e))
    return out


def record_of(source, frame):
    """The bytes read for a StoredFrame -> its record (the frame's CRCs checked)."""
    if len(frame) != source.length:
        raise IOError(f"{source.path}: frame at {source.offset} is cut short "
                      f"({len(frame)} of {source.length} bytes)")
    found = frames.read_frame(io.BytesIO(frame), source.offset)
    if found is None or found[1] != source.length:
        raise IOError(f"{source.path}: no whole frame at offset {source.offset}")
    return found[0]


def reframe(record, key, label_id, label, fields=None):
    """A stored Example's bytes -> (the Example for `key` and `label`, its features).

    `fields`: in a build declaring fields, the image's field features
    (dataset_format/fields.encoded): they replace whatever fields the stored record had,
    so a changed caption, tag or box, or a field removed or retyped, costs a parse and a
    serialization, not a decode."""
    if fields is None:  # a build without fields: any a previous version declared left out
        features = parse_example(record)
        if len(features) != len(schema.FEATURES):
            features = {k: v for k, v in features.items() if k in schema.FEATURES}
    else:  # every value of every list: the image's own features back to scalars
        features = {k: v.values[0] for k, v in parse_features(record).items()
                    if k in schema.FEATURES}
        features.update(fields)
    features.update({schema.FILENAME: key.encode(), schema.LABEL: label_id,
                     schema.TEXT: label.encode()})
    return serialize_example(features), features
