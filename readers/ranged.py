"""Records of a split by number, read through the `.index` files in coalesced ranged reads.

The resumable order (readers/order.py) asks for records anywhere in the split; the `.index`
beside each shard gives every record's offset, so a window of the order is fetched as a few
dozen sequential ranges (one read each; on gs:// one ranged request each, in parallel), never
by reading a shard from its start. Every frame is checked here (both TFRecord CRCs, and its
length against the index): a damaged record is named by file, record and offset, or with
skip_corrupt dropped alone, the next record read from its own offset.
"""

import bisect
import concurrent.futures
import os
import struct
import sys
from typing import NamedTuple

import numpy as np

from dataset_format import frames, layout, removal

MAX_GAP = 1 << 20  # bytes read through rather than starting another range (one request)
LOCAL_GAP = 64 << 10  # the same on local disk, where a range costs an open, not a round trip
MAX_BUFFER = 16 << 20  # a C++ range's read buffer: its bytes (one read, one GET), up to this
GCS_THREADS = 16  # ranged requests in flight on gs:// (each one a round trip)


def size_problem(path, size, expected):
    """The error naming a shard file that is missing (`size` None) or not the size manifest.json
    gives it (`expected`, None: unknown), else None. The one wording of both checks: every
    file when a dataset is made (readers/shards.py), and each chunk's files while reading."""
    if size is None:
        owner = path.rsplit("/", 1)[0]  # a version removed by retention is said so
        if removal.removed(owner):
            return removal.error(owner)
        return FileNotFoundError(
            f"{path}: shard file missing (manifest.json lists it): the version was pruned "
            "or only partly copied; rebuild it or read another version")
    if expected is not None and size != expected:
        return ValueError(
            f"{path}: {size} bytes, but manifest.json says {expected}: the file is "
            "truncated or was overwritten; rebuild the dataset or read another version")
    return None


class Shard(NamedTuple):
    path: str
    first: int  # number of its first record in the split (manifest order)
    count: int
    num_bytes: int  # -1: not in the manifest


class Skips:
    """What skip_corrupt skipped, counted (a dataset's `.skips`): each skip is also one
    warning line on stderr naming the record and what happened to it."""

    def __init__(self):
        self.names = []

    @property
    def count(self):
        return len(self.names)

    def add(self, name, outcome="skipped"):
        self.names.append(name)
        print(f"WARNING readers: skip_corrupt: {name}; {outcome} (skip {self.count})",
              file=sys.stderr)

    def __repr__(self):
        return f"Skips(count={self.count})"


class CorruptRecord(ValueError):
    """A frame whose CRC or length does not check out, named by file, record and offset."""


class RangedRecords:
    """`read(ids)`: the serialized records with those numbers (manifest order), in that order.

    `skip_corrupt`: a damaged record comes back as None (counted on `skips`, with a warning
    on stderr naming it) instead of raising CorruptRecord.
    """

    SKIPPED = "skipped this record only"

    def __init__(self, shards, skip_corrupt=False, skips=None):
        self.shards = [s for s in shards if s.count > 0]
        self._firsts = [s.first for s in self.shards]
        self.skip_corrupt = skip_corrupt
        self.skips = Skips() if skips is None else skips
        self.skipped = self.SKIPPED  # what a skip's warning says happened to the record
        self._index, self._files = {}, {}
        self._pool = None

    def read(self, ids):
        ids = np.asarray(ids, np.int64)
        out = [None] * len(ids)
        jobs = []
        for shard, positions, slots in self._by_shard(ids):
            offsets, lengths = self.index(shard)
            for lo, hi in _coalesce(offsets, lengths, positions):
                jobs.append((shard, positions[lo:hi], slots[lo:hi], offsets, lengths))
        results = self._map(self._read_range, jobs)
        for (_, _, slots, _, _), records in zip(jobs, results):
            for slot, record in zip(slots, records):
                out[slot] = record
        return out

    def plan(self, ids):
        """The C++ read of records `ids` (readers/resumable.py): consecutive ranges
        (paths, byte offsets, record counts, buffer sizes) and `gather`, where the ranges'
        records, concatenated, indexed by `gather`, are the records of `ids` in their order.
        Wanted records closer than the gap are read through, as one range."""
        ids = np.asarray(ids, np.int64)
        paths, starts, counts, sizes = [], [], [], []
        gather, base = np.zeros(len(ids), np.int64), 0
        for shard, positions, slots in self._by_shard(ids):
            offsets, lengths = self.index(shard)
            self.check_file(shard)
            gap = MAX_GAP if shard.path.startswith("gs://") else LOCAL_GAP
            for lo, hi in _coalesce(offsets, lengths, positions, gap):
                first, last = positions[lo], positions[hi - 1]
                paths.append(shard.path)
                starts.append(offsets[first])
                counts.append(last - first + 1)
                sizes.append(min(offsets[last] + lengths[last] - offsets[first], MAX_BUFFER))
                gather[slots[lo:hi]] = base + positions[lo:hi] - first
                base += last - first + 1
        return (np.array(paths, dtype=object), np.array(starts, np.int64),
                np.array(counts, np.int64), np.array(sizes, np.int64), gather)

    def check_file(self, shard):
        """Raise, naming the shard, if it is missing or not its manifest size. Checked each
        time a chunk is planned, so a shard pruned or cut mid-training is named as such:
        one stat a shard a chunk (on gs://, one metadata request)."""
        try:
            size = self._file(shard.path).size()
        except FileNotFoundError:
            size = None
        error = size_problem(shard.path, size, None if shard.num_bytes < 0 else shard.num_bytes)
        if error:
            raise error

    def index(self, shard):
        """(offsets, frame lengths) of a shard's records, from its `.index` file (read once)."""
        if shard.path not in self._index:
            path = layout.index_name(shard.path)
            try:
                text = self._file(path).read_all().decode()
            except FileNotFoundError:
                raise FileNotFoundError(
                    f"{path}: no index file: the resumable order (start=) reads records by "
                    "offset; rebuild with --write_index true (the default), or read without "
                    "start=") from None
            entries = np.array(frames.parse_index(text), np.int64).reshape(-1, 2)
            if len(entries) != shard.count:
                raise ValueError(f"{path}: {len(entries)} lines, but manifest.json gives "
                                 f"{shard.path} {shard.count} records")
            self._index[shard.path] = entries[:, 0].copy(), entries[:, 1].copy()
        return self._index[shard.path]

    def where(self, record_id):
        """(shard path, position in it) of record number `record_id`."""
        shard = self.shards[bisect.bisect_right(self._firsts, int(record_id)) - 1]
        return shard.path, int(record_id) - shard.first

    def _by_shard(self, ids):
        which = np.searchsorted(self._firsts, ids, side="right") - 1
        order = np.lexsort((ids, which))
        bounds = np.flatnonzero(np.diff(which[order])) + 1
        for group in np.split(order, bounds):
            if len(group):
                shard = self.shards[which[group[0]]]
                yield shard, ids[group] - shard.first, group

    def _read_range(self, job):
        shard, positions, _, offsets, lengths = job
        start = int(offsets[positions[0]])
        end = int(offsets[positions[-1]] + lengths[positions[-1]])
        data = self._file(shard.path).read_range(start, end - start)
        return [self._frame(shard, int(p), data, int(offsets[p]) - start, int(lengths[p]),
                            int(offsets[p])) for p in positions]

    def _frame(self, shard, position, data, at, length, offset):
        try:
            if at + length > len(data):
                raise frames.FrameError(offset, f"file ends inside the record ({len(data) - at}"
                                                f" of {length} bytes)")
            (n,) = struct.unpack_from("<Q", data, at)
            if n + 16 != length:
                raise frames.FrameError(offset, f"frame length {n + 16} is not the index's "
                                                f"{length}")
            head, record = data[at:at + 12], data[at + 12:at + 12 + n]
            if frames.masked_crc(head[:8]) != struct.unpack("<I", head[8:])[0]:
                raise frames.FrameError(offset, "length CRC mismatch")
            if frames.masked_crc(record) != struct.unpack_from("<I", data, at + 12 + n)[0]:
                raise frames.FrameError(offset, "data CRC mismatch (record bytes are corrupt)")
            return record
        except frames.FrameError as e:
            what = f"{shard.path}: record {position} ({e})"
            if not self.skip_corrupt:
                raise CorruptRecord(f"{what}: the shard is damaged; rebuild the dataset, or "
                                    "pass skip_corrupt=True to skip such records") from None
            self.skips.add(what, self.skipped)
            return None

    def _map(self, fn, jobs):
        if len(jobs) < 2 or not any(j[0].path.startswith("gs://") for j in jobs):
            return [fn(j) for j in jobs]
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(GCS_THREADS)
        return list(self._pool.map(fn, jobs))

    def _file(self, path):
        if path not in self._files:
            self._files[path] = _GcsFile(path) if path.startswith("gs://") else _LocalFile(path)
        return self._files[path]


def _coalesce(offsets, lengths, positions, max_gap=MAX_GAP):
    """[lo, hi) slices of the sorted `positions` read as one range: a gap of more than
    `max_gap` bytes between two wanted records starts a new range."""
    if not len(positions):
        return []
    ends = offsets[positions] + lengths[positions]
    gaps = offsets[positions[1:]] - ends[:-1]
    cuts = np.flatnonzero(gaps > max_gap) + 1
    edges = [0, *cuts.tolist(), len(positions)]
    return list(zip(edges[:-1], edges[1:]))


class _LocalFile:
    def __init__(self, path):
        self.path = path
        try:
            self._fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}: missing") from None

    def read_range(self, offset, length):
        return os.pread(self._fd, length, offset)

    def read_all(self):
        return self.read_range(0, os.fstat(self._fd).st_size)

    def size(self):
        try:
            return os.stat(self.path).st_size  # the path, not the open descriptor: deleted?
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.path}: missing") from None

    def __del__(self, _close=os.close):  # os may be gone at interpreter exit
        fd, self._fd = getattr(self, "_fd", None), None
        if fd is not None:
            _close(fd)


class _GcsFile:
    """One ranged read per call through tf.io.gfile (TensorFlow's own gs:// client). Whether
    the object exists with its size was checked when the dataset was made (check_files)."""

    def __init__(self, path):
        import tensorflow as tf

        self.path, self._gfile = path, tf.io.gfile

    def read_range(self, offset, length):
        with self._gfile.GFile(self.path, "rb") as f:
            f.seek(offset)
            return f.read(length)

    def read_all(self):
        with self._gfile.GFile(self.path, "rb") as f:
            return f.read()

    def size(self):
        import tensorflow as tf

        try:
            return self._gfile.stat(self.path).length
        except tf.errors.NotFoundError:
            raise FileNotFoundError(f"{self.path}: missing") from None
