"""The resumable training order: an epoch's sequence of records as a pure function of
(the split's content, split name, seed, epoch), and each host's part of every global batch.

The content is what the manifest says the split's shards hold (`content_id`: each shard's
record count, size and checksum, in order), never the version id or a clock: a `--force`
rebuild that stores the same records byte for byte gets the same order.

No TensorFlow: the order is numpy arithmetic, so a position (epoch, records into it) maps to
the records that follow it without reading anything, and tests check it in pure Python.

How an epoch is ordered (records numbered in manifest order, shard by shard):
1. each shard is cut into runs of `RUN` consecutive records (the last run of a shard may be
   shorter); the runs are permuted over the whole split;
2. the permuted stream is cut into windows of `WINDOW` records, each shuffled on its own.
So a window holds WINDOW / RUN runs from anywhere in the split (good mixing: see
docs/reader.md for the autocorrelation figures), and a reader fetches it as ~64 sequential
runs, not 1,024 scattered records.

Batches: global step k of an epoch is records [k*G, (k+1)*G) of the order (G the global
batch); the last N mod G records of the order are left out, so every batch is full. Host h
of n takes records [k*G + h*G/n, k*G + (h+1)*G/n) of step k: the global sequence does not
depend on n, and every host runs N // G steps.
"""

import dataclasses
import hashlib
import zlib
from typing import Tuple

import numpy as np

RUN = 16  # consecutive records of one shard read together (one ranged read)
WINDOW = 1024  # records shuffled together: 64 runs from anywhere in the split


@dataclasses.dataclass(frozen=True)
class Position:
    """Where training is: `epoch` (0-based) and `records` consumed in it (a multiple of the
    global batch while the batch size stays the same). Save it with the model; pass it to
    `make_dataset(..., start=position)`. A plain int `start` is a global step instead."""
    epoch: int = 0
    records: int = 0

    def __post_init__(self):
        if self.epoch < 0 or self.records < 0:
            raise ValueError(f"{self}: epoch and records must be >= 0")

    def after(self, steps, global_batch, split_records):
        """The position `steps` global batches later (an epoch holds split_records //
        global_batch of them, counted from this position's records)."""
        left = (split_records - self.records) // global_batch  # steps left in this epoch
        if steps < left:
            return Position(self.epoch, self.records + steps * global_batch)
        per_epoch = split_records // global_batch
        epochs, steps = divmod(steps - left, per_epoch)
        return Position(self.epoch + 1 + epochs, steps * global_batch)


@dataclasses.dataclass(frozen=True)
class EpochOrder:
    """The order's inputs: which records exist (per-shard counts, manifest order) and the
    seeds. `content` (content_id) and `split` are hashed into the seed, so two splits, or
    two versions that store different records, never share an order."""
    shard_counts: Tuple[int, ...]
    seed: int
    content: str = ""
    split: str = ""
    run: int = RUN
    window: int = WINDOW

    @property
    def records(self):
        return sum(self.shard_counts)

    def records_of(self, epoch):
        """Epoch `epoch`'s record numbers (int64, length N), in the order they are read."""
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([
            int(self.seed) & (2**63 - 1), int(epoch), zlib.crc32(self.content.encode()),
            zlib.crc32(self.split.encode())])))
        starts, lengths = _runs(self.shard_counts, self.run)
        perm = rng.permutation(len(starts))
        ids = _expand(starts[perm], lengths[perm])
        keys = rng.random(len(ids)) + np.arange(len(ids)) // self.window
        return ids[np.argsort(keys, kind="stable")]


@dataclasses.dataclass(frozen=True)
class Batching:
    """How the order is cut: global batch `global_batch`, this host `host` of `hosts`."""
    global_batch: int
    hosts: int = 1
    host: int = 0

    def __post_init__(self):
        if self.global_batch < 1 or self.hosts < 1 or not 0 <= self.host < self.hosts:
            raise ValueError(f"{self}: needs global_batch >= 1 and 0 <= host < hosts")
        if self.global_batch % self.hosts:
            raise ValueError(f"global batch {self.global_batch} does not divide among "
                             f"{self.hosts} hosts: each host takes an equal part of it")

    @property
    def host_batch(self):
        return self.global_batch // self.hosts

    def steps(self, records):
        """Global steps an epoch of `records` records has (every host runs them all)."""
        return records // self.global_batch

    def host_records(self, ids, start=0):
        """This host's records of one epoch's order `ids`, from record `start` of the order
        (a multiple of the global batch) to the last full global batch."""
        if start % self.global_batch:
            raise ValueError(f"position {start} is not at a global batch boundary "
                             f"({self.global_batch} records)")
        steps = len(ids) // self.global_batch - start // self.global_batch
        if steps <= 0:
            return ids[:0]
        used = ids[start:start + steps * self.global_batch].reshape(steps, self.global_batch)
        return used[:, self.host * self.host_batch:(self.host + 1) * self.host_batch].ravel()


def content_id(split_info):
    """A split's content as the manifest gives it: sha256 over each shard's record count,
    size and checksum (crc32c, or sha256 for older shards), in shard order. Shard names and
    the version id are left out: they change with every build, the records need not."""
    digest = hashlib.sha256()
    for s in split_info.shards:
        digest.update(f"{s.num_examples}/{s.num_bytes}/{s.crc32c or s.sha256 or ''}\n"
                      .encode())
    return digest.hexdigest()[:16]


def position_of_step(step, steps_per_epoch, global_batch):
    """A global step count (e.g. `optimizer.iterations`) -> Position, for a batch size that
    never changed."""
    if step < 0:
        raise ValueError(f"step {step} must be >= 0")
    if steps_per_epoch < 1:
        raise ValueError("the split has fewer records than one global batch")
    return Position(int(step) // steps_per_epoch, int(step) % steps_per_epoch * global_batch)


def _runs(counts, run):
    """(first record, length) of every run, shard by shard."""
    starts, lengths, base = [], [], 0
    for c in counts:
        offsets = np.arange(0, c, run, dtype=np.int64)
        starts.append(base + offsets)
        lengths.append(np.minimum(run, c - offsets))
        base += c
    return np.concatenate(starts), np.concatenate(lengths)


def _expand(starts, lengths):
    """Runs -> the record numbers they hold, in run order (vectorised)."""
    if not len(starts):
        return np.zeros(0, np.int64)
    ends = np.cumsum(lengths)
    first = np.repeat(starts - (ends - lengths), lengths)
    return first + np.arange(ends[-1], dtype=np.int64)
