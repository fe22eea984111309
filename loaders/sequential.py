"""Sequential reads of a split, split among hosts and workers: each record read exactly once.

The records (manifest order) are cut into host_count x worker_count contiguous parts whose
sizes differ by at most one; part (host, worker) is read front to back in large ranged reads
(8 MiB: one GET each on gs://, not one per record), located by the .index offsets. A shuffle
buffer and a per-epoch order of the parts' pieces are optional (`seed`, `set_epoch`).
"""

import random

from loaders import records

READ_BYTES = 8 << 20  # per ranged read; whole frames only


class SequentialRecords:
    """An iterable of Example over this (host, worker)'s part of `split`.

    path, split, version, decode, transform, label_offset, hold, fields: as `RecordSource`.
    host_index, host_count: this host among the training hosts (JAX: jax.process_index(),
      jax.process_count(); torch.distributed: rank, world size).
    worker_index, worker_count: this worker among the host's loader workers
      (`loaders.pytorch.IterableRecords` takes them from the DataLoader).
    shuffle_buffer, seed: with a seed, each epoch reads its pieces in an order drawn from
      (seed, epoch, part) and shuffles records through a buffer of `shuffle_buffer`.
    """

    def __init__(self, path, split="train", version=None, decode=True, transform=None,
                 label_offset=0, host_index=0, host_count=1, worker_index=0, worker_count=1,
                 shuffle_buffer=0, seed=None, read_bytes=READ_BYTES, hold=False, fields=None):
        self.info = records.open_info(path, version, hold)
        self.split = split
        self.spans = records.spans_of(self.info, split)
        if not 0 <= host_index < host_count:
            raise ValueError(f"host_index={host_index} is not in [0, host_count={host_count})")
        self.host_index, self.host_count = host_index, host_count
        self.worker_index, self.worker_count = worker_index, worker_count
        self.shuffle_buffer, self.seed, self.epoch = int(shuffle_buffer), seed, 0
        self.read_bytes = read_bytes
        self._offsets = records.Offsets(records.file_records(self.info, self.spans))
        self._decoder = records.Decoder(decode, records.label_shift(self.info, label_offset),
                                        transform, records.declared(self.info, fields))

    @property
    def class_names(self):
        return list(self.info.labels)

    def set_epoch(self, epoch):
        """The epoch whose order the next iteration reads (with a seed)."""
        self.epoch = int(epoch)

    def part(self, worker_index=None, worker_count=None):
        """The Spans this host and worker read."""
        workers = worker_count or self.worker_count
        worker = self.worker_index if worker_index is None else worker_index
        if not 0 <= worker < workers:
            raise ValueError(f"worker_index={worker} is not in [0, worker_count={workers})")
        slot = self.host_index * workers + worker
        return records.part(self.spans, slot, self.host_count * workers)

    def __len__(self):
        """Records this host and worker read an epoch."""
        return sum(s.count for s in self.part())

    def __iter__(self):
        return self.iterate()

    def iterate(self, worker_index=None, worker_count=None):
        """This host's part for a worker (default: the one given at construction)."""
        worker = self.worker_index if worker_index is None else worker_index
        spans = list(self.part(worker, worker_count))
        if self.seed is None:
            found = self._frames(spans)
        else:  # shuffled as bytes: decoded pixels never wait in the buffer
            rng = random.Random(f"{self.seed}/{self.epoch}/{self.host_index}/{worker}")
            rng.shuffle(spans)
            found = _shuffled(self._frames(spans), self.shuffle_buffer, rng)
        return (self._decoder(*frame) for frame in found)

    def _frames(self, spans):
        """(frame bytes, shard path, position, offset) of `spans`, in large reads."""
        try:
            yield from self._read(spans)
        except FileNotFoundError as e:
            raise records.explained(self.info, e) from None

    def _read(self, spans):
        for span in spans:
            entries = self._offsets.of(span.path)[span.first:span.first + span.count]
            file = records.open_shard(span.path)
            try:
                for first, chunk in _chunks(entries, self.read_bytes):
                    base = chunk[0][0]
                    data = file.read_range(base, chunk[-1][0] + chunk[-1][1] - base)
                    for k, (offset, length) in enumerate(chunk):
                        yield (data[offset - base:offset - base + length], span.path,
                               span.first + first + k, offset)
            finally:
                file.close()

    def __repr__(self):
        return (f"SequentialRecords({self.info.version_dir!r}, split={self.split!r}, "
                f"host {self.host_index} of {self.host_count})")


def _chunks(entries, limit):
    """(index of its first entry, entries) runs of consecutive frames of at most `limit`
    bytes (one frame when it alone is larger)."""
    start, size = 0, 0
    for i, (_, length) in enumerate(entries):
        if i > start and size + length > limit:
            yield start, entries[start:i]
            start, size = i, 0
        size += length
    if start < len(entries):
        yield start, entries[start:]


def _shuffled(stream, buffer, rng):
    """`stream` through a shuffle buffer of `buffer` records (0 or 1: as it comes)."""
    if buffer <= 1:
        yield from stream
        return
    held = []
    for item in stream:
        if len(held) < buffer:
            held.append(item)
            continue
        k = rng.randrange(buffer)
        yield held[k]
        held[k] = item
    rng.shuffle(held)
    yield from held
