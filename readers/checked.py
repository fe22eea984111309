"""Decoding (record, id) elements one by one in a parallel map, naming every record that fails.

The map is the plain one a tf.data user writes (one record a call, `num_parallel_calls`
AUTOTUNE, order kept), followed by `ignore_errors`: a record that does not parse or decode
drops out. Upstream reading errors never reach that `ignore_errors`: readers/shards.py turns
them into in-band elements (a decodable stand-in record with a negative id).

How a dropped record is named without a branch or a nested dataset per record: elements are
numbered (`enumerate`) before the map, and the map stores number -> id in a hash table
(number mod TABLE, so it stays small; ~1 us a record). A scan after the map compares each
number with the one it expects; on a gap (or a negative id) it looks the missing numbers up
and calls Python, which names shard, position and key, then fails (or, with skip_corrupt,
warns and goes on). The happy path is one comparison a record.
"""

import sys

import numpy as np
import tensorflow as tf

from dataset_format import layout
from readers import shards

TABLE = 1 << 16  # numbers remembered: far more than records between the map and the check
END = -(1 << 62)  # the id of the end marker that lets the check see a failed last record


def decoded(ds, fn, names, seeded):
    """(record, id) elements, or ((record, id), seed) when `seeded` -> (image, label)
    elements, checked. fn: (record[, seed]) -> (image, label); names: a `Names`."""
    table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=END)

    @tf.autograph.experimental.do_not_convert
    def decode(number, element):
        (record, rid), seed = element if seeded else (element, None)
        stored = table.insert(number % TABLE, rid)
        with tf.control_dependencies([stored]):
            record = tf.identity(record)
        image, label = fn(record, seed) if seeded else fn(record)
        return image, label, number, rid

    @tf.autograph.experimental.do_not_convert
    def check(expected, element):
        image, label, number, rid = element
        ok = tf.logical_and(tf.equal(number, expected),
                            tf.logical_or(rid >= 0, tf.equal(rid, END)))

        def report():
            missing = table.lookup(tf.range(expected, number) % TABLE)
            return tf.reshape(tf.numpy_function(names.report, [missing, rid], tf.int64,
                                                stateful=True), [])

        done = tf.cond(ok, lambda: number, report)
        with tf.control_dependencies([done]):
            return number + 1, (image, label, rid)

    end = (tf.constant(names.sentinel), tf.constant(END, tf.int64))
    if seeded:
        spec = ds.element_spec[1]
        end = (end, tf.zeros(spec.shape, spec.dtype))
    ds = ds.concatenate(tf.data.Dataset.from_tensors(end)).enumerate()
    ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.ignore_errors(log_warning=True)  # TensorFlow's reason, in its log
    ds = ds.scan(tf.constant(0, tf.int64), check)
    return ds.filter(lambda image, label, rid: rid >= 0).map(
        lambda image, label, rid: (image, label))


class Names:
    """Python side of the check: names records by id (this host's records in plan order)
    and failed pieces, then raises or warns."""

    def __init__(self, pieces, skip_corrupt, sentinel):
        self.pieces, self.skip_corrupt, self.sentinel = pieces, skip_corrupt, sentinel
        self._firsts = np.cumsum([0] + [p.count for p in pieces])

    def report(self, missing, rid):
        names = [self.record(int(r)) for r in missing if int(r) != END]
        fatal = False
        if int(rid) < 0 and int(rid) != END:
            piece, fatal = shards.failure_of(int(rid))
            names.append(self.file(piece) if fatal else self.piece(piece))
        if fatal:
            raise ValueError("; ".join(names))
        if names and not self.skip_corrupt:
            raise ValueError("; ".join(names) + ". Rebuild the dataset, or pass "
                             "skip_corrupt=True to skip such records")
        for name in names:
            print(f"WARNING readers: skip_corrupt: {name}; skipped", file=sys.stderr)
        return np.int64(0)

    def record(self, rid):
        p = int(np.searchsorted(self._firsts, rid, side="right")) - 1
        piece = self.pieces[p]
        position = piece.start + rid - int(self._firsts[p])
        return (f"{piece.path}: record {position} (key {_key(piece.path, position)}) is not "
                "a decodable image record (TensorFlow logged why above)")

    def file(self, p):
        return (f"{self.pieces[p].path}: shard file missing, unreadable, or not the size "
                "manifest.json gives it (truncated, overwritten or removed since the dataset "
                "was opened; TensorFlow logged why above): rebuild the dataset or read "
                "another version")

    def piece(self, p):
        piece = self.pieces[p]
        return (f"{piece.path}: could not read all of records {piece.start}.."
                f"{piece.start + piece.count - 1} (of the {piece.file_records} manifest.json "
                "gives the file): the shard is corrupt (bad CRC), truncated, or was removed "
                "or made unreadable since the dataset was opened (TensorFlow logged the "
                "reason and offset above)")


def _key(path, position):
    """The key of record `position` of a shard (read again: only when it failed), or "?"."""
    from dataset_format import examples, frames, schema

    try:
        offset = _offset(path, position)
        with tf.io.gfile.GFile(path, "rb") as f:
            f.seek(offset)
            record, _ = frames.read_frame(f, offset)
        return examples.parse_example(record).get(schema.FILENAME, b"?").decode(
            errors="replace")
    except Exception:  # naming is best effort: the position already says where
        return "?"


def _offset(path, position):
    from dataset_format import frames

    index = layout.index_name(path)
    if tf.io.gfile.exists(index):
        with tf.io.gfile.GFile(index, "rb") as f:
            return frames.parse_index(f.read().decode())[position][0]
    offset = 0
    with tf.io.gfile.GFile(path, "rb") as f:
        for _ in range(position):
            f.seek(offset)
            _, length = frames.read_frame(f, offset, check_crc=False)
            offset += length
    return offset
