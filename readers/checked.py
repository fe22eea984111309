"""Decoding (record, id) elements one by one in a parallel map, naming every record that fails.

The map is the plain one a tf.data user writes (one record a call, `num_parallel_calls`
AUTOTUNE, order kept), followed by `ignore_errors`: a record that does not parse or decode
drops out. Upstream reading errors never reach that `ignore_errors`: readers/shards.py turns
them into in-band elements (a decodable stand-in record with a negative id).

How a dropped record is named without a branch or a nested dataset per record: elements are
numbered (`enumerate`) before the map, and the map stores number -> id in a hash table
(number mod TABLE, so it stays small; ~1 us a record). A scan after batching hands each
batch's numbers to Python (one call a batch, ~50 us), which finds a gap (or a negative id),
names shard, position and key, then fails (or, with skip_corrupt, warns and goes on; then
every element is checked before batching, and failed ones filtered out).
"""

import sys

import numpy as np
import tensorflow as tf

from dataset_format import layout
from readers import shards

TABLE = 1 << 16  # numbers remembered: far more than records between the map and the check
END = -(1 << 62)  # the id of the end marker that lets the check see a failed last record


def decoded(ds, fn, names, seeded, batch, total):
    """(record, id) elements, or ((record, id), seed) when `seeded` -> batch(elements of
    (image, label)), checked. fn: (record[, seed]) -> (image, label); names: a `Names`;
    batch: a dataset -> dataset function (batching, or none); total: the records the stream
    holds (None: endless).

    Without skip_corrupt, whole batches are checked (one call a batch): a failure raises, so
    nothing needs taking out but the end marker, which `take(total)` leaves out unless a
    record went missing before it. With skip_corrupt every element is checked, and failed
    ones are filtered out before batching.
    """
    table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=END)

    @_plain
    def decode(number, element):
        (record, rid), seed = element if seeded else (element, None)
        stored = table.insert(number % TABLE, rid)
        with tf.control_dependencies([stored]):
            record = tf.identity(record)
        image, label = fn(record, seed) if seeded else fn(record)
        return image, label, number, rid

    @_plain
    def check(expected, element):
        image, label, numbers, rids = element
        numbers, rids = tf.reshape(numbers, [-1]), tf.reshape(rids, [-1])
        # ids of the numbers from `expected` to the last: Python finds the absent ones (and
        # in-band failures); one call a batch (~50 us), no branch to trace
        span = tf.range(expected, numbers[-1])
        done = tf.numpy_function(names.report, [span, numbers, table.lookup(span % TABLE),
                                                rids], tf.int64, stateful=True)
        with tf.control_dependencies([done]):  # the state needs the check: it always runs
            return tf.identity(numbers[-1] + 1), (image, label, rids)

    if total is not None:
        end = (tf.constant(names.sentinel), tf.constant(END, tf.int64))
        if seeded:
            spec = ds.element_spec[1]
            end = (end, tf.zeros(spec.shape, spec.dtype))
        ds = ds.concatenate(tf.data.Dataset.from_tensors(end))
    ds = ds.enumerate().map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.ignore_errors(log_warning=True)  # TensorFlow's reason, in its log
    if not names.skip_corrupt:
        if total is not None:
            ds = ds.take(total)
        ds = batch(ds).scan(tf.constant(0, tf.int64), check)
        return ds.map(_plain(lambda images, labels, rids: (images, labels)))
    ds = ds.scan(tf.constant(0, tf.int64), check)
    ds = ds.filter(_plain(lambda image, label, rids: rids[0] >= 0))
    return batch(ds.map(_plain(lambda image, label, rids: (image, label))))


def _plain(fn):
    """No autograph: nothing here branches on tensors in Python, and converting costs
    tracing time."""
    return tf.autograph.experimental.do_not_convert(fn)


class Names:
    """Python side of the check: names records by id (this host's records in plan order)
    and failed pieces, then raises or warns."""

    def __init__(self, pieces, skip_corrupt, sentinel):
        self.pieces, self.skip_corrupt, self.sentinel = pieces, skip_corrupt, sentinel
        self._firsts = np.cumsum([0] + [p.count for p in pieces])

    def report(self, span, numbers, span_ids, rids):
        """Raise (or warn) naming what failed: the ids of `span`'s numbers absent from
        `numbers`, and in-band failures among `rids`. Returns 0 when nothing did."""
        if len(span) == len(numbers) - 1 and rids.min() >= 0:
            return np.int64(0)
        absent = ~np.isin(span, numbers)
        names = [self.record(int(r)) for r in span_ids[absent] if int(r) != END]
        fatal = False
        for rid in (int(r) for r in rids if r < 0 and r != END):
            piece, file_check = shards.failure_of(rid)
            fatal = fatal or file_check
            names.append(self.file(piece) if file_check else self.piece(piece))
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
