"""Decoding (record, id) elements one by one in a parallel map, naming every record that fails.

The map is the plain one a tf.data user writes (one record a call, `num_parallel_calls`
AUTOTUNE, order kept), followed by `ignore_errors`: a record that does not parse or decode
drops out. Upstream reading errors never reach that `ignore_errors`: readers/shards.py turns
them into in-band elements (a decodable stand-in record with a negative id).

How a dropped record is named without a branch or a nested dataset per record: elements are
numbered (`enumerate`) before the map, and the map stores number -> id in a hash table
(number mod TABLE, so it stays small; ~1 us a record). A scan after the map compares each
number with the one it expects; on a gap (or a negative id) it calls Python, which names
shard, position and key, then fails (or, with skip_corrupt, warns and goes on).

Evaluation without skip_corrupt checks whole batches instead (`decoded_batches`): the scan,
filter and map after the decode cost ~100-140 us of CPU a record (bench_reader --profile),
~8% of a record's decode; once a batch they cost that a batch.
"""

import numpy as np
import tensorflow as tf

from dataset_format import examples, frames, layout, removal, schema
from readers import shards
from readers.ranged import Skips

TABLE = 1 << 16  # numbers remembered: far more than records between the map and the check
END = -(1 << 62)  # the id of the end marker that lets the check see a failed last record


def decoded(ds, fn, names, seeded, batch, total):
    """(record, id) elements, or ((record, id), seed) when `seeded` -> batch(elements of
    (image, label[, key])), checked. fn: (record[, seed]) -> (image, label[, key]); names: a
    `Names`;
    batch: a dataset -> dataset function (batching, or none); total: the records the stream
    holds (None: endless).

    Every element is checked before batching (a scan, one comparison when nothing failed),
    then the end marker (and with skip_corrupt, failed elements) filtered out. In training,
    checking whole batches instead, or taking the end marker out with take(), cost the same
    CPU on quiet cores (1.53-1.56 against 1.53-1.57 ms an image, medians of 3) and, batched
    without a map in between, 0.18 GB more RSS (see fused_batch).
    """
    table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=END)

    @_plain
    def check(expected, element):
        *values, number, rid = element
        ok = tf.logical_and(tf.equal(number, expected), rid >= 0)

        def report():
            span = tf.range(expected, number)
            return _asserted(number, tf.numpy_function(
                names.report, [table.lookup(span % TABLE), rid], tf.string, stateful=True))

        done = tf.cond(ok, lambda: number, report)
        with tf.control_dependencies([done]):  # the state needs the check: it always runs
            state = tf.identity(number + 1)
        return state, (*values, rid)

    if total is not None:
        end = (tf.constant(names.sentinel), tf.constant(END, tf.int64))
        if seeded:
            spec = ds.element_spec[1]
            end = (end, tf.zeros(spec.shape, spec.dtype))
        ds = ds.concatenate(tf.data.Dataset.from_tensors(end))
    ds = _numbered(ds, fn, seeded, table).scan(tf.constant(0, tf.int64), check)
    ds = ds.filter(_plain(lambda *element: element[-1] >= 0))
    return batch(ds.map(_plain(lambda *element: element[:-1])))


def decoded_batches(ds, fn, names, seeded, batch_size, *, drop_remainder, total):
    """`decoded` for fixed-size batches when every failure is an error (no skip_corrupt;
    make_dataset uses it in evaluation):
    the same numbering and map, but checked once a batch, not once a record.

    Batch k must hold numbers k*B .. k*B + n - 1, n = B (the last: what `total` leaves), and
    no in-band failure: a record dropped anywhere shifts every number after it, so the batch
    it fell in fails the check; a short last batch fails its length. The per-record scan and
    filter cost ~100 us of CPU a record (docs/reader.md, "What each check costs"); this costs
    as much a batch. The batch is made without drop_remainder so the last one is checked
    too, then dropped. Not seen: a last batch that vanished whole (its every record failed),
    which the dataset's asserted cardinality then reports without naming them.
    """
    table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=END)

    @_plain
    def check(k, batch):
        *values, numbers, rids = batch
        first = k * batch_size
        n = tf.size(numbers, out_type=tf.int64)
        want = tf.constant(batch_size, tf.int64) if total is None else tf.minimum(
            tf.constant(batch_size, tf.int64), total - first)
        ok = tf.logical_and(tf.equal(n, want), tf.logical_and(
            tf.reduce_all(tf.equal(numbers, first + tf.range(n))), tf.reduce_all(rids >= 0)))

        def report():
            span = tf.range(first, tf.maximum(first + want, tf.reduce_max(numbers) + 1))
            return _asserted(n, tf.numpy_function(
                names.report_batch, [span, table.lookup(span % TABLE), numbers, rids],
                tf.string, stateful=True))

        done = tf.cond(ok, lambda: n, report)
        with tf.control_dependencies([done]):
            return tuple(tf.identity(v) for v in values)

    ds = fused_batch(_numbered(ds, fn, seeded, table), batch_size).enumerate().map(check)
    if not drop_remainder:
        return ds
    ds = ds.filter(_plain(lambda *values: tf.shape(values[1])[0] == batch_size))
    return ds.map(_plain(lambda *values: tuple(
        tf.ensure_shape(v, [batch_size] + v.shape[1:]) for v in values)))


def fused_batch(ds, batch_size):
    """ds.batch(batch_size) of (image, label, ...) elements, after a map tf.data fuses with
    it (map_and_batch_fusion): each element is copied into its batch as it comes, instead of
    held until the batch is full. Batching an `ignore_errors` output directly held 0.18 GB
    more peak RSS (1.19 against 1.01 GB, evaluation, 4k records, medians of 3) at the same
    CPU. An identity map would be optimized away, so this one asserts the label's shape."""
    return ds.map(_plain(lambda image, label, *rest: (image, tf.ensure_shape(label, []),
                                                      *rest))).batch(batch_size)


def _numbered(ds, fn, seeded, table):
    """Elements numbered in turn, decoded in a parallel map that first stores number -> id
    in `table`; a record that does not decode drops out -> (image, label[, key], number,
    id)."""

    @_plain
    def decode(number, element):
        (record, rid), seed = element if seeded else (element, None)
        stored = table.insert(number % TABLE, rid)
        with tf.control_dependencies([stored]):
            record = tf.identity(record)
        values = fn(record, seed) if seeded else fn(record)
        return (*values, number, rid)

    ds = ds.enumerate().map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.ignore_errors(log_warning=True)  # TensorFlow's reason, in its log


def _asserted(value, message):
    """`value` once `message` (a string tensor from Python) is empty; else an error carrying
    it: an assertion, not a raise in Python (TensorFlow logs that with its traceback, even in
    a CLI)."""
    message = tf.reshape(message, [])
    failed = tf.debugging.Assert(tf.equal(message, ""), [message], summarize=1)
    with tf.control_dependencies([failed]):
        return tf.identity(value)


def _plain(fn):
    """No autograph: nothing here branches on tensors in Python, and converting costs
    tracing time."""
    return tf.autograph.experimental.do_not_convert(fn)


class Names:
    """Python side of the check: names records by id (this host's records in plan order)
    and failed pieces, then raises or warns."""

    def __init__(self, pieces, skip_corrupt, sentinel, skips=None, version_dir=None):
        self.pieces, self.skip_corrupt, self.sentinel = pieces, skip_corrupt, sentinel
        self.skips = Skips() if skips is None else skips
        self.version_dir = version_dir  # said removed, not damaged, once its manifest is gone
        self._firsts = np.cumsum([0] + [p.count for p in pieces])

    def report(self, span_ids, rid):
        """The error naming what failed (b"" when nothing, or when skip_corrupt only warns):
        the records of the gap before this element (their ids `span_ids`), and this element
        when it is an in-band failure."""
        if self.version_dir and removal.removed(self.version_dir):  # not damage: retention
            return str(removal.error(self.version_dir)).encode()
        names = [self.record(int(r)) for r in span_ids if int(r) != END]
        fatal = False
        for rid in [int(rid)] if rid < 0 and rid != END else []:
            piece, file_check = shards.failure_of(rid)
            fatal = fatal or file_check
            names.append(self.file(piece) if file_check else self.piece(piece))
        if fatal:
            return "; ".join(names).encode()
        if names and not self.skip_corrupt:
            return ("; ".join(names) + ". Rebuild the dataset, or pass skip_corrupt=True to "
                    "skip such records").encode()
        for name in names:
            self.skips.add(name)
        return b""

    def report_batch(self, span, span_ids, numbers, rids):
        """report() for a batch that failed its check: the numbers of `span` it lacks (their
        ids `span_ids`), and its in-band failures (negative `rids`)."""
        seen = set(numbers.tolist())
        missing = [r for n, r in zip(span.tolist(), span_ids.tolist()) if n not in seen]
        failures = [int(r) for r in rids if r < 0]
        messages = [self.report(np.array(missing if i == 0 else [], np.int64), rid)
                    for i, rid in enumerate(failures or [END])]
        return b"; ".join(m for m in messages if m) or (
            b"readers: a batch failed its check, but no record could be named")

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
