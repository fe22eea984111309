"""The resumable training stream: this host's part of each global batch, in the epoch order of
readers/order.py, starting at any position without reading what comes before it.

Records come from readers/ranged.py (coalesced reads located by the `.index` files) through
a Python generator that yields a window of records at a time (one call per ~1,024 records,
so the Python side costs ~1% of a core); decoding is a per-record parallel map. The crop and
flip of record r in epoch e are seeded by (seed, e, r), so a resumed run sees the same pixels
as an uninterrupted one, on any number of hosts.
"""

import dataclasses
import sys

import numpy as np
import tensorflow as tf

from readers import images
from readers import order as order_lib
from readers import ranged
from readers.shards import sentinel_record

CHUNK = order_lib.WINDOW  # records per generator call (about one window of the order)
FIRST_CHUNK = 128  # the first call's: the first batch waits for one small read, not 1,024


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


def chunks(stream, source):
    """Yield (records, ids, epochs, ks) windows of this host's records, in order.

    k counts this host's records within the epoch, so a gap after decoding names its record.
    A reading error (a damaged frame, a missing `.index`) is not raised here, where the
    decode map's `ignore_errors` downstream would swallow it: it is kept on `source.error`
    and one in-band element (a decodable stand-in record, epoch -1) carries it to
    check_batches, which raises it.
    """
    try:
        yield from _chunks(stream, source)
    except Exception as e:  # noqa: BLE001 - re-raised by check_batches, in order
        source.error = e
        yield (np.array([source.sentinel], dtype=object), np.array([-1], np.int64),
               np.array([-1], np.int64), np.array([-1], np.int64))


def _chunks(stream, source):
    start = stream.position()
    epoch, records = start.epoch, start.records
    source.first = (epoch, records // stream.batching.hosts)
    while not stream.epochs or epoch < start.epoch + stream.epochs:
        ids = stream.batching.host_records(stream.order.records_of(epoch), records)
        skipped = records // stream.batching.hosts
        cuts = [0, *range(min(FIRST_CHUNK, len(ids)), len(ids), CHUNK), len(ids)]
        for i, j in zip(cuts[:-1], cuts[1:]):
            part = ids[i:j]
            got = source.read(part)
            keep = [j for j, r in enumerate(got) if r is not None]
            if len(keep) < len(got):
                source.dropped.update(int(part[j]) for j in range(len(got)) if got[j] is None)
            yield (np.array([got[j] for j in keep], dtype=object), part[keep],
                   np.full(len(keep), epoch, np.int64), np.arange(skipped + i, skipped + j)[keep])
        epoch, records = epoch + 1, 0


def decoded(stream, source, size, output, label_shift, crop_fraction, skip_corrupt,
            with_keys):
    """Batches of (images, labels[, keys]) of this host's records, decoded by one parallel
    map (one record a call, as a plain tf.data pipeline); a record that does not decode is
    named (check_batches). Windows come from a Python generator, one call per ~1,024
    records; reading errors travel in-band (chunks), so the map's `ignore_errors` only ever
    drops records that did not decode."""
    fn = images.example_fn(True, size, output, label_shift, crop_fraction)
    seed = stream.order.seed  # the order and the pixels share it

    @tf.autograph.experimental.do_not_convert  # no tensor control flow: tracing stays cheap
    def decode(record, rid, epoch, k):
        image, label = fn(record, element_seed(seed, epoch, rid))
        keys = (images.parse_key(record),) if with_keys else ()
        return (image, label) + keys + (epoch, k)

    signature = (tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.int64),
                 tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.int64))
    ds = tf.data.Dataset.from_generator(lambda: chunks(stream, source),
                                        output_signature=signature)
    ds = ds.prefetch(1).unbatch()  # the next window is read while this one decodes
    ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.ignore_errors(log_warning=True)  # decoding only: TensorFlow's reason, in its log
    return check_batches(ds, stream, source, skip_corrupt)


def element_seed(seed, epoch, record_id):
    """The stateless [2] seed of one record's crop and flip: (seed, epoch, record)."""
    mixed = tf.bitwise.bitwise_xor(tf.cast(seed, tf.int64), epoch * 1_000_003)
    return tf.stack([mixed, record_id])


def check_batches(ds, stream, source, skip_corrupt):
    """Batches (…, epochs, ks) -> full batches (…) of this host's records, checked: a record
    missing after `ignore_errors` failed to decode. It is named (shard, position), then the
    read fails, or with skip_corrupt a warning is printed and the batches close up (the
    last short one is dropped). One Python call a batch (~1 us a record); records the frame
    check dropped (and named) already pass silently."""
    host_ids = _HostIds(stream)
    per_epoch = stream.steps_per_epoch * stream.batching.host_batch

    def check(state, epochs, ks):
        if len(epochs) and epochs[-1] < 0:  # a reading error, in-band (chunks)
            raise source.error
        epoch, k = (int(v) for v in (source.first if state[0] < 0 else state))
        missing = []
        for e, got in zip(epochs.tolist(), ks.tolist()):
            if e != epoch:  # the epoch ended: its tail must have come through
                missing += [(epoch, j) for j in range(k, per_epoch)]
                epoch, k = e, 0
            missing += [(e, j) for j in range(k, got)]
            k = got + 1
        if len(ks) < stream.batching.host_batch and not skip_corrupt:
            missing += [(epoch, j) for j in range(k, per_epoch)]  # the stream's last batch
        _report(missing, host_ids, source, skip_corrupt)
        return np.array([epoch, k], np.int64)

    @tf.autograph.experimental.do_not_convert
    def step(state, batch):
        state = tf.ensure_shape(tf.numpy_function(check, [state, batch[-2], batch[-1]],
                                                  tf.int64, stateful=True), [2])
        with tf.control_dependencies([state]):
            return state, tuple(tf.identity(x) for x in batch[:-2])

    ds = ds.batch(stream.batching.host_batch).scan(tf.constant([-1, 0], tf.int64), step)
    if skip_corrupt:
        ds = ds.filter(tf.autograph.experimental.do_not_convert(
            lambda *b: tf.shape(b[1])[0] == stream.batching.host_batch))
    size = stream.batching.host_batch
    return ds.map(tf.autograph.experimental.do_not_convert(
        lambda *b: tuple(tf.ensure_shape(x, [size] + x.shape.as_list()[1:]) for x in b)))


def _report(missing, host_ids, source, skip_corrupt):
    names = []
    for epoch, k in missing:
        rid = host_ids.of(epoch, k)
        if rid not in source.dropped:
            path, position = source.where(rid)
            names.append(f"{path}: record {position}")
    if names and not skip_corrupt:
        raise ValueError(f"{'; '.join(names)}: cannot parse it or decode its image "
                         "(TensorFlow logged why above); rebuild the dataset, or pass "
                         "skip_corrupt=True to skip such records")
    for name in names:
        print(f"WARNING readers: skip_corrupt: {name} is not a decodable image record; "
              "skipped", file=sys.stderr)


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
    shards, first = [], 0
    for s in split_info.shards:
        shards.append(ranged.Shard(s.path, first, s.num_examples,
                                   -1 if s.num_bytes is None else s.num_bytes))
        first += s.num_examples
    source = ranged.RangedRecords(shards, skip_corrupt)
    source.dropped, source.error = set(), None
    source.sentinel = sentinel_record()
    return source
