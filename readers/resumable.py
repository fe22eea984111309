"""The resumable training stream: this host's part of each global batch, in the epoch order of
readers/order.py, starting at any position without reading what comes before it.

A Python generator plans a window of records at a time (one call per ~1,024 records): the
`.index` files give each wanted record's offset, and nearby records coalesce into ranges
(readers/ranged.py). TensorFlow's C++ TFRecord reader reads the ranges from their offsets
(one after another locally, 16 at once on gs://), checking both frame CRCs
(readers/offset_records.py); the Python reader of readers/ranged.py reads a window again
only when its C++ read failed, to name the damaged record or file.
Decoding is a per-record parallel map. The crop and
flip of record r in epoch e are seeded by (seed, e, r), so a resumed run sees the same pixels
as an uninterrupted one, on any number of hosts.
"""

import dataclasses

import numpy as np
import tensorflow as tf

from readers import fields as fields_lib, images, offset_records, order as order_lib, ranged
from readers.checked import fused_batch
from readers.shards import sentinel_record

CHUNK = order_lib.WINDOW  # records per generator call (about one window of the order)
FIRST_CHUNK = 128  # the first call's: the first batch waits for one small read, not 1,024
CYCLE = 16  # ranges of a window read at once on gs:// (requests in flight)
MAX_PENDING = 8  # windows planned but not come through before Python reads the next one


@dataclasses.dataclass(frozen=True)
class Stream:
    """What one host reads: the order, how it is batched, where it starts, how many epochs."""
    order: order_lib.EpochOrder
    batching: order_lib.Batching
    start: object  # a Position, or a callable returning one (read as each iteration begins)
    epochs: int  # epochs to run from the start's epoch (the first may be partial); 0: forever

    @property
    def steps_per_epoch(self):
        return self.batching.steps(self.order.records)

    def position(self):
        start = self.start() if callable(self.start) else self.start
        if start.records % self.batching.global_batch or (
                start.records > self.steps_per_epoch * self.batching.global_batch):
            raise ValueError(
                f"{start}: not a global batch boundary of this epoch ({self.steps_per_epoch} "
                f"steps of {self.batching.global_batch} records)")
        return start


def plans(stream, source):
    """Yield one read plan per window of this host's records, in order: its number, the C++
    ranges (ranged.RangedRecords.plan), (ids, epochs, ks) of its records and whether only
    Python reads it. Each window is also kept on `source.planned` until it has come through
    (fill_gaps).

    k counts this host's records within the epoch, so a gap after decoding names its record.
    An error planning a window (a missing or short `.index`) is not raised here, where the
    decode map's `ignore_errors` downstream would swallow it: it is kept on `source.error`,
    and a plan marked for the Python reader carries it in-band (python_read) to
    check_batches, which raises it. A finite stream ends with an empty Python plan, so a
    last window that failed in C++ is read too.
    """
    none, seq = np.zeros(0, np.int64), 0
    source.planned.clear()  # a new iteration starts from its own position
    source.error = None
    for reset in source.on_iteration:
        reset()
    try:
        for seq, (ids, epoch, ks) in enumerate(_windows(stream, source)):
            epochs, ranges = np.full(len(ids), epoch, np.int64), source.plan(ids)
            source.planned[seq] = (ids, epochs, ks)
            slow = len(source.planned) > MAX_PENDING  # C++ keeps failing: let Python say why
            yield (seq, *ranges, ids, epochs, ks, slow)
        seq += 1
        yield (seq, np.zeros(0, object), none, none, none, none, none, none, none, True)
    except Exception as e:  # noqa: BLE001 - re-raised by check_batches, in order
        source.error = e
        minus = np.array([-1], np.int64)
        yield (seq + 1, np.zeros(0, object), none, none, none, none, minus, minus, minus, True)


def _windows(stream, source):
    """(ids, epoch, ks) of each window of this host's records, from the stream's start."""
    start = stream.position()
    epoch, records = start.epoch, start.records
    source.first = (epoch, records // stream.batching.hosts)
    while not stream.epochs or epoch < start.epoch + stream.epochs:
        ids = stream.batching.host_records(stream.order.records_of(epoch), records)
        skipped = records // stream.batching.hosts
        cuts = [0, *range(min(FIRST_CHUNK, len(ids)), len(ids), CHUNK), len(ids)]
        for i, j in zip(cuts[:-1], cuts[1:]):
            if j > i:
                yield ids[i:j], epoch, np.arange(skipped + i, skipped + j, dtype=np.int64)
        epoch, records = epoch + 1, 0


def read_window(source, python):
    """plan -> (number, records, ids, epochs, ks) of one window, read by TFRecordDatasetV2
    from the `.index` offsets (readers/offset_records.py), on gs:// CYCLE ranges at once
    (`python`, a python_read, takes the windows planned for Python). A frame that does not
    check out, or a file that cannot be read, fails the window, which the `ignore_errors`
    after this map drops: fill_gaps then reads it in Python, which names the record (or,
    with skip_corrupt, drops it alone). TensorFlow's own errors are never ignored inside a
    file (it retries a file it cannot open forever)."""
    remote = any(s.path.startswith("gs://") for s in source.shards)

    @tf.autograph.experimental.do_not_convert
    def read(seq, paths, offsets, counts, buffers, gather, ids, epochs, ks, slow):
        def fast():
            ranges = tf.data.Dataset.from_tensor_slices((paths, offsets, counts, buffers))
            if remote:
                records = ranges.interleave(
                    offset_records.exact_records, cycle_length=CYCLE,
                    num_parallel_calls=CYCLE, block_length=tf.reduce_max(counts),
                    deterministic=True)
            else:  # one after another: 16 threads cost ~35% more CPU a record on local disk
                records = ranges.flat_map(offset_records.exact_records)
            got = records.batch(tf.reduce_sum(counts)).get_single_element()
            return tf.gather(got, gather), ids, epochs, ks

        return (seq,) + tuple(tf.cond(slow, lambda: python(ids, epochs, ks), fast))

    return read


def fill_gaps(source, python):
    """(number, window) -> the window, after any windows before it that failed in C++ (read
    in Python now by `python`, a python_read, in order). One Python call a window; nothing
    is copied unless a window failed."""

    def missing_before(seq):
        parts = []
        for s in sorted(k for k in source.planned if k <= seq):
            window = source.planned.pop(s)
            if s < seq:
                parts.append(python.read(*window))
        if not parts:
            return np.zeros(0, object), *(np.zeros(0, np.int64),) * 3
        return tuple(np.concatenate(column) for column in zip(*parts))

    @tf.autograph.experimental.do_not_convert
    def fill(seq, records, ids, epochs, ks):
        gap = tf.numpy_function(missing_before, [seq],
                                [tf.string, tf.int64, tf.int64, tf.int64], stateful=True)
        gap = [tf.ensure_shape(x, [None]) for x in gap]
        window = (records, ids, epochs, ks)
        return tf.cond(tf.size(gap[1]) > 0,
                       lambda: tuple(tf.concat([g, w], 0) for g, w in zip(gap, window)),
                       lambda: window)

    return fill


def substituted(records):
    """skip_corrupt: each damaged record (None) of a window replaced by a copy of the
    nearest good one before it (else after it), so the window keeps its length and every
    later step its records; None stays only when the whole window is damaged."""
    good = [j for j, r in enumerate(records) if r is not None]
    if not good or len(good) == len(records):
        return records
    out = list(records)
    for j, record in enumerate(records):
        if record is None:
            before = [g for g in good if g < j]
            out[j] = records[before[-1] if before else good[0]]
    return out


def python_read(source):
    """(ids, epochs, ks) -> the same, read by readers/ranged.py in Python: each frame is
    checked against the index, a damaged one is named (or, with skip_corrupt, replaced by
    a copy of a good one: `substituted`). An error travels in-band: one decodable stand-in
    record with epoch -1."""
    def read(ids, epochs, ks):
        if not (len(epochs) and epochs[0] < 0):
            try:
                got = source.read(ids)
            except Exception as e:  # noqa: BLE001 - re-raised by check_batches, in order
                source.error = source.error or e  # the first error is the one to name
            else:
                got = substituted(got)
                keep = [j for j, r in enumerate(got) if r is not None]
                source.dropped.update(int(ids[j]) for j in range(len(got)) if got[j] is None)
                return (np.array([got[j] for j in keep], dtype=object), ids[keep],
                        epochs[keep], ks[keep])
        minus = np.array([-1], np.int64)
        return np.array([source.sentinel], dtype=object), minus, minus, minus

    def in_tf(ids, epochs, ks):
        out = tf.numpy_function(read, [ids, epochs, ks],
                                [tf.string, tf.int64, tf.int64, tf.int64], stateful=True)
        return tuple(tf.ensure_shape(x, [None]) for x in out)

    in_tf.read = read
    return in_tf


def decoded(stream, source, pixels, skip_corrupt, fields=None):
    """Batches of (images, labels[, keys]) of this host's records, decoded by one parallel
    map (one record a call, as a plain tf.data pipeline); a record that does not decode is
    named (check_batches) or, with skip_corrupt, replaced (realigned). Windows are planned
    by a Python generator (one call per ~1,024 records, ~0.2 ms) and read in C++
    (read_window), two windows at once; reading errors travel in-band, so the map's
    `ignore_errors` only ever drops records that did not decode. `fields` (a readers.Fields):
    their values come after the label, flat (readers/fields.flat_fn)."""
    fn = (images.example_fn(True, pixels) if fields is None
          else fields_lib.flat_fn(True, pixels, fields))
    seed = stream.order.seed  # the order and the pixels share it

    @tf.autograph.experimental.do_not_convert  # no tensor control flow: tracing stays cheap
    def decode(record, rid, epoch, k):
        return fn(record, element_seed(seed, epoch, rid)) + (epoch, k)

    vector = tf.TensorSpec([None], tf.int64)
    signature = (tf.TensorSpec([], tf.int64), tf.TensorSpec([None], tf.string), vector, vector,
                 vector, vector, vector, vector, vector, tf.TensorSpec([], tf.bool))
    ds = tf.data.Dataset.from_generator(lambda: plans(stream, source),
                                        output_signature=signature)
    # the next window is read while this one decodes; a window that failed is read again
    python = python_read(source)
    ds = ds.map(read_window(source, python), num_parallel_calls=2, deterministic=True)
    ds = ds.ignore_errors().map(fill_gaps(source, python)).unbatch()
    ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.ignore_errors(log_warning=True)  # decoding only: TensorFlow's reason, in its log
    if skip_corrupt:
        return realigned(ds, stream, source)
    return check_batches(ds, stream, source)


def element_seed(seed, epoch, record_id):
    """The stateless [2] seed of one record's crop and flip: (seed, epoch, record)."""
    mixed = tf.bitwise.bitwise_xor(tf.cast(seed, tf.int64), epoch * 1_000_003)
    return tf.stack([mixed, record_id])


def check_batches(ds, stream, source):
    """Batches (…, epochs, ks) -> full batches (…) of this host's records, checked: a record
    missing after `ignore_errors` failed to decode; it is named (shard, position), then the
    read fails. One Python call a batch (~1 us a record)."""
    host_ids = _HostIds(stream)
    per_epoch = stream.steps_per_epoch * stream.batching.host_batch

    def check(state, epochs, ks):
        if len(epochs) and epochs.min() < 0:  # a reading error, in-band (python_read)
            raise source.error
        epoch, k = (int(v) for v in (source.first if state[0] < 0 else state))
        missing = []
        for e, got in zip(epochs.tolist(), ks.tolist()):
            if e != epoch:  # the epoch ended: its tail must have come through
                missing += [(epoch, j) for j in range(k, per_epoch)]
                epoch, k = e, 0
            missing += [(e, j) for j in range(k, got)]
            k = got + 1
        if len(ks) < stream.batching.host_batch:
            missing += [(epoch, j) for j in range(k, per_epoch)]  # the stream's last batch
        _report(missing, host_ids, source)
        return np.array([epoch, k], np.int64)

    @tf.autograph.experimental.do_not_convert
    def step(state, batch):
        state = tf.ensure_shape(tf.numpy_function(check, [state, batch[-2], batch[-1]],
                                                  tf.int64, stateful=True), [2])
        with tf.control_dependencies([state]):
            return state, tuple(tf.identity(x) for x in batch[:-2])

    ds = fused_batch(ds, stream.batching.host_batch).scan(tf.constant([-1, 0], tf.int64), step)
    return _full(ds, stream.batching.host_batch)


def realigned(ds, stream, source):
    """check_batches for skip_corrupt: a record that did not decode is replaced by a copy of
    another record of its batch (counted on `source.skips`, named on stderr), so this host
    still yields every step, and each step the records the order gives it: the same step
    count on every host, whatever any of them skipped.

    While nothing has failed, one Python call a batch compares its (epoch, k)s with the
    step's: nothing is copied. From the first failure on, records come one earlier than
    their step, so every batch is rebuilt in Python from the records held over (a copy of
    the batch: measured in docs/reader.md); a finite stream's last steps come from what is
    held at its end."""
    host_batch = stream.batching.host_batch
    steps = _Steps(stream, source)
    specs = tuple(tf.TensorSpec([host_batch] + spec.shape.as_list(), spec.dtype)
                  for spec in ds.element_spec[:-2])

    @tf.autograph.experimental.do_not_convert
    def step(*batch):
        fix = tf.ensure_shape(tf.numpy_function(steps.misaligned, list(batch[-2:]), tf.bool,
                                                stateful=True), [])
        out = tf.cond(fix, lambda: tuple(tf.numpy_function(
            steps.rebuild, list(batch), [s.dtype for s in specs], stateful=True)),
            lambda: tuple(batch[:-2]))
        return tuple(tf.ensure_shape(x, s.shape) for x, s in zip(out, specs))

    ds = fused_batch(ds, host_batch).map(step)
    if stream.epochs:  # the steps whose records came in earlier batches: from the held ones
        ds = ds.concatenate(tf.data.Dataset.from_generator(steps.rest, output_signature=specs))
    return ds


def _full(ds, size):
    return ds.map(tf.autograph.experimental.do_not_convert(
        lambda *b: tuple(tf.ensure_shape(x, [size] + x.shape.as_list()[1:]) for x in b)))


class _Steps:
    """Python side of `realigned`: which step comes next, and the records held over."""

    def __init__(self, stream, source):
        self.stream, self.source = stream, source
        self.host_batch = stream.batching.host_batch
        self.per_epoch = stream.steps_per_epoch * self.host_batch
        self.host_ids = _HostIds(stream)
        source.on_iteration.append(self.reset)
        self.reset()

    def reset(self):
        self.next, self.held, self.emitted = None, [], 0  # next: (epoch, k) of the next step

    def _start(self):
        if self.next is None:
            epoch, k = self.source.first
            self.next = (int(epoch), int(k))
        return self.next

    def misaligned(self, epochs, ks):
        """Whether this batch is not exactly the next step's records (or records are held)."""
        if len(epochs) and epochs.min() < 0:  # a reading error, in-band (python_read)
            raise self.source.error
        epoch, k = self._start()
        aligned = (not self.held and len(ks) == self.host_batch and (epochs == epoch).all()
                   and (ks == np.arange(k, k + self.host_batch)).all())
        if aligned:
            self._advance()
        return not aligned

    def rebuild(self, *batch):
        """The next step's batch from the held records and this batch's; the rest held."""
        *values, epochs, ks = batch
        self.held += [(int(e), int(k), [v[j] for v in values])
                      for j, (e, k) in enumerate(zip(epochs.tolist(), ks.tolist()))]
        return self._emit()

    def rest(self):
        """The steps left once the decoded stream has ended (a finite stream)."""
        epoch, k = self._start()
        first = self.stream.steps_per_epoch - self.source.first[1] // self.host_batch
        total = first + (self.stream.epochs - 1) * self.stream.steps_per_epoch
        while self.emitted < total:
            yield tuple(self._emit())

    def _emit(self):
        epoch, k = self._start()
        want = {(epoch, j): None for j in range(k, k + self.host_batch)}
        later = []
        for e, j, value in self.held:
            if (e, j) in want:
                want[e, j] = value
            elif (e, j) > (epoch, k):
                later.append((e, j, value))
        self.held = later
        got = [v for v in want.values() if v is not None] or [v for _, _, v in later[:1]]
        if not got:
            raise ValueError(f"readers: skip_corrupt: no record of epoch {epoch}, records "
                             f"{k}..{k + self.host_batch - 1} of this host could be read")
        rows, last = [], None
        for (e, j), value in want.items():
            if value is None:
                rid = self.host_ids.of(e, j)
                if rid not in self.source.dropped:  # a damaged frame was named as it was read
                    path, position = self.source.where(rid)
                    self.source.skips.add(f"{path}: record {position} is not a decodable image "
                                          "record", "replaced by a copy of another record of "
                                          "its batch (equal steps on every host)")
                value = last if last is not None else got[0]
            rows.append(value)
            last = value
        self._advance()
        return [np.stack([row[c] for row in rows]) for c in range(len(rows[0]))]

    def _advance(self):
        epoch, k = self.next
        k += self.host_batch
        self.next = (epoch + 1, 0) if k >= self.per_epoch else (epoch, k)
        self.emitted += 1


def _report(missing, host_ids, source):
    names = []
    for epoch, k in missing:
        rid = host_ids.of(epoch, k)
        if rid not in source.dropped:
            path, position = source.where(rid)
            names.append(f"{path}: record {position}")
    if names:
        raise ValueError(f"{'; '.join(names)}: cannot parse it or decode its image "
                         "(TensorFlow logged why above); rebuild the dataset, or pass "
                         "skip_corrupt=True to skip such records")


class _HostIds:
    """k -> record number, per epoch, computed on demand (only when a record failed)."""

    def __init__(self, stream):
        self.stream, self._epoch, self._ids = stream, None, None

    def of(self, epoch, k):
        if epoch != self._epoch:
            self._epoch = epoch
            self._ids = self.stream.batching.host_records(self.stream.order.records_of(epoch))
        return int(self._ids[k])


def make_source(split_info, skip_corrupt):
    """The split's records by number (ranged.RangedRecords), with the state one iteration
    of the resumable stream keeps on it."""
    shards, first = [], 0
    for s in split_info.shards:
        shards.append(ranged.Shard(s.path, first, s.num_examples,
                                   -1 if s.num_bytes is None else s.num_bytes))
        first += s.num_examples
    source = ranged.RangedRecords(shards, skip_corrupt)
    source.skipped = ("replaced by a copy of a nearby record (equal steps on every host)")
    source.dropped, source.error, source.planned = set(), None, {}
    source.on_iteration = []  # called as each iteration starts (plans)
    source.sentinel = sentinel_record()
    return source
