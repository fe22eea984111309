"""Stored records read back by byte range: neighbouring frames coalesced into one read.

Re-framing and copying read records that an earlier version stored. Beam's FileSystems.open
on gs:// makes a new storage client per open and reads through a 16 MiB window, so one ~40
KB record cost four requests and up to 16 MiB of download: re-framing 300 photographs
(11.6 MiB of records) downloaded 1,180 MiB. Here a run of frames is one ranged GET through
the process's one client (store/gcs.py), and two frames share a read only when the bytes
between them are at most GAP_SHARE of the frames' own: the bytes downloaded stay within
(1 + GAP_SHARE) x the records' bytes, whatever the layout. A run holds at most
MAX_RUN_BYTES (or one larger frame), which bounds the memory a shard's reads hold.
"""

import dataclasses
import os

from beam_pipeline.store import gcs

GAP_SHARE = 0.1          # bytes read between frames, at most this share of the frames' bytes
MAX_RUN_BYTES = 8 << 20  # one read holds at most this much (or one larger frame)


@dataclasses.dataclass(frozen=True)
class Run:
    """One read: bytes [start, end) of a file, holding the frames `spans` (offset, length)."""

    start: int
    end: int
    spans: tuple


def runs(spans, gap_share=GAP_SHARE, max_bytes=MAX_RUN_BYTES):
    """(offset, length) spans in file order -> Runs, each read once (see `joins`)."""
    out, current, used = [], None, 0
    for offset, length in spans:
        if current is not None and joins(current, used, offset, length, gap_share, max_bytes):
            current = Run(current.start, offset + length, current.spans + ((offset, length),))
            used += length
            continue
        if current is not None:
            out.append(current)
        current, used = Run(offset, offset + length, ((offset, length),)), length
    if current is not None:
        out.append(current)
    return out


def joins(run, used, offset, length, gap_share=GAP_SHARE, max_bytes=MAX_RUN_BYTES):
    """Whether the frame (offset, length) joins `run`, whose frames hold `used` bytes: it
    starts at or after the run's end, the run stays within max_bytes, and the bytes read
    that belong to no frame stay within gap_share of the frames' bytes."""
    end = offset + length
    return (offset >= run.end and end - run.start <= max_bytes
            and (end - run.start) - (used + length) <= gap_share * (used + length))


def read_run(path, run, generation=None):
    """A Run's frames' bytes, in order: one read (a ranged GET on gs://). A frame cut short
    (the file ends early) comes back short; the caller checks lengths."""
    data = read_range(path, run.start, run.end - run.start, generation)
    return [data[offset - run.start:offset - run.start + length] for offset, length in run.spans]


def read_spans(path, spans):
    """The bytes of each (offset, length) span of `path`, in order, streamed run by run
    (spans out of file order start a new run)."""
    for run in runs(spans):
        yield from read_run(path, run)


def read_range(path, offset, length, generation=None):
    """`length` bytes of `path` from `offset` (fewer at its end): one ranged request on gs://
    through this process's storage client, os.pread locally."""
    if length <= 0:
        return b""
    if path.startswith("gs://"):
        return gcs.read_range(path, offset, length, generation)
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, length, offset)
    finally:
        os.close(fd)
