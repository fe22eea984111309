"""Regeneration that costs what changed: the resolved listing against the previous version.

    identity.resolve has matched each listed image with the previous record it may reuse:
      same key, label and split, same bytes -> kept: its record bytes are reused
      known bytes under a new key or label  -> fresh, re-framed from the stored record
      new content, or changed               -> fresh: converted into delta shards
      gone, or changed                      -> removed from its old shard

    per previous shard: every member kept -> "reuse" (hard link / server-side copy)
                        some kept          -> "copy" (surviving frames copied, not decoded)
                        none kept          -> dropped
    fresh images -> "images" tasks: new delta shards of ~--target_shard_mb

The result holds exactly the examples a full build with the same split map would (same
keys, labels, splits and record bytes: conversion is deterministic and ids never move);
only the grouping into shards differs. When delta shards would hold more than
--max_delta_share of a split, the plan returns None and the launcher builds in full
(compaction).
"""

import collections
import dataclasses
import itertools
import json
import os
import tempfile
from typing import Optional

from beam_pipeline.algorithms import fast_json
from beam_pipeline.algorithms.spill import SortedSpill
from beam_pipeline.job.contracts import Kind, Origin, PlannedShard, ShardPlan
from beam_pipeline.launcher import identity
from beam_pipeline.launcher.plan import iter_shards
from beam_pipeline.launcher.previous import fields_digest
from beam_pipeline.launcher.rules import auto_num_shards, shard_sort_key
from beam_pipeline.refs import (LINE_FIELDS, LINE_KEY, LINE_LABEL, LINE_MD5, LINE_SHA256,
                                LINE_SIZE, LINE_SPLIT, LINE_STAMP, LINE_URI, ImageRef)
from dataset_format.catalog_schema import FIELDS
from dataset_format.dataset_info import ShardInfo


@dataclasses.dataclass(frozen=True)
class IncrementConfig:
    """What the incremental plan needs of the build options."""

    target_shard_mb: float    # --target_shard_mb: the size of new delta shards
    max_delta_share: float    # --max_delta_share: above it, a full build instead


def incremental_plan(resolved, previous, config, spill_dir):
    """The incremental stage: identity.Resolved + the previous version (a DatasetInfo) ->
    ShardPlan, or None when a full build is due (too many delta images)."""
    increment = plan_increment(resolved, previous.version_dir, previous, spill_dir,
                               config.target_shard_mb, config.max_delta_share)
    return increment and shard_plan(increment)


@dataclasses.dataclass(frozen=True)
class Task:
    """A shard of the incremental version: a previous shard carried over (reuse, copy: its
    manifest entry in `previous`) or a new delta shard (images, previous None)."""

    split: str
    shard: int
    kind: Kind
    origin: Origin
    previous: Optional[ShardInfo] = None


@dataclasses.dataclass
class Increment:
    """The plan of an incremental version: shard tasks and what they reuse."""

    previous: str                 # version id it builds on
    num_shards: dict              # split -> N in the new version
    tasks: list                   # [Task]
    kept: "KeptRows"              # (previous shard file, kept_line), grouped by file
    fresh: SortedSpill            # (shard sort key, ImageRef JSON): to convert or re-frame
    fresh_shards: dict            # split -> (first new index, number of delta shards)
    counts: dict                  # images unchanged, changed, added, moved, removed
    to_convert: int = 0           # fresh images with no stored record: decoded

    def close(self):
        self.kept.close()
        self.fresh.close()


def kept_as_is(fields, row):
    """The stored record is this image's, byte for byte: same key, label, split and declared
    fields' values (another caption or box: re-framed). `fields`: ImageRef.to_json's
    parsed list (refs.LINE_* positions)."""
    if row is None or (row["key"], row["label"], row["split"]) != (
            fields[LINE_KEY], fields[LINE_LABEL], fields[LINE_SPLIT]):
        return False
    stored, listed = row.get(FIELDS), _line_fields(fields)
    # neither has fields (a root without --schema): no digest to compare (~1 µs a kept row)
    return (not stored and not listed) or fields_digest(stored) == fields_digest(listed)


def _line_fields(fields):
    return fields[LINE_FIELDS] if len(fields) > LINE_FIELDS else None


# The previous catalog's columns the plan reads for an image with a stored record: whether
# it is kept as is, its shard, and where its frame is for a re-frame. Not the other
# columns: a kept row reaches the job as its row number (KEPT_LINE), not as the row.
PLAN_COLUMNS = ("key", "label", "split", FIELDS) + identity.FRAME_COLUMNS


def kept_line(number, fields):
    """A kept image's line in a reuse/copy listing: its previous catalog row number and
    what the listing says of its input now (job/reuse.read_task: the row read from the
    previous catalog, these values replacing its uri, input_size, input_stamp and, when
    given, input_sha256 and input_md5). ~90 bytes against ~560 for the row as JSON."""
    md5 = fields[LINE_MD5] if len(fields) > LINE_MD5 else None
    return fast_json.dumps([number, fields[LINE_URI], fields[LINE_SIZE], fields[LINE_STAMP],
                       fields[LINE_SHA256], md5])


class KeptRows:
    """The kept images' lines, grouped by previous shard file and in row order within it:
    (file, line) back. They come in previous catalog row order (identity.Resolved gives
    stored images so), which holds each shard's rows together, so they are appended to a
    file as they come: no sort (~3 µs a kept row). Out of order (resume's Remainder gives
    key order) they are sorted on disk by (file, row number) instead."""

    def __init__(self, spill_dir):
        self.spill_dir, self.spill, self.seen, self.last = spill_dir, None, set(), (None, -1)
        fd, self.path = tempfile.mkstemp(prefix="kept-", suffix=".txt", dir=spill_dir)
        self.out = os.fdopen(fd, "w", encoding="utf-8")

    def add(self, file, number, line):
        if self.spill is not None:
            self.spill.add(f"{file} {number:012d}", line)
            return
        last_file, last_number = self.last
        if file != last_file:
            if file in self.seen:  # a shard's rows apart: sort instead
                self._to_spill().add(f"{file} {number:012d}", line)
                return
            self.seen.add(file)
        elif number < last_number:
            self._to_spill().add(f"{file} {number:012d}", line)
            return
        self.last = (file, number)
        self.out.write(f"{file}\t{line}\n")

    def _to_spill(self):
        spill = SortedSpill(self.spill_dir)
        for file, line in self:
            number = int(line[1:line.index(",")])  # kept_line starts with the row number
            spill.add(f"{file} {number:012d}", line)
        self.spill = spill
        self.out.close()
        os.remove(self.path)
        self.path = None
        return self.spill

    def __iter__(self):
        if self.spill is not None:
            for key, line in self.spill:
                yield key.rsplit(" ", 1)[0], line
            return
        self.out.flush()
        with open(self.path, encoding="utf-8") as f:
            for text in f:
                file, _, line = text[:-1].partition("\t")
                yield file, line

    def close(self):
        if self.spill is not None:
            self.spill.close()
        if self.path is not None:
            self.out.close()
            os.remove(self.path)
            self.path = None


def plan_increment(resolved, previous_vdir, previous, spill_dir, target_shard_mb,
                   max_delta_share):
    """identity.Resolved + the previous version (a DatasetInfo) -> Increment, or None to
    build in full."""
    kept, fresh = KeptRows(spill_dir), SortedSpill(spill_dir)
    kept_in = collections.Counter()             # previous shard file -> members kept
    fresh_size = collections.defaultdict(lambda: [0, 0])  # split -> [count, bytes]
    to_convert = 0
    for fields, number, row, file in resolved.plan_fields(PLAN_COLUMNS):
        if file is not None or kept_as_is(fields, row):  # file: identity found it unchanged
            # Moved or touched with the same bytes: the catalog follows the file, which the
            # job does (its row read again by number, the input's values replaced).
            file = file or row["file"]
            kept_in[file] += 1
            kept.add(file, number, kept_line(number, fields))
            continue
        ref = ImageRef.from_fields(fields)
        if row is not None:
            ref = dataclasses.replace(ref, source=identity.stored_frame(previous_vdir, row))
        to_convert += row is None
        fresh.add(shard_sort_key(ref.split, ref.key), ref.to_json())
        fresh_size[ref.split][0] += 1
        fresh_size[ref.split][1] += ref.size

    tasks, num_shards, fresh_shards = [], {}, {}
    for split in sorted(set(previous.splits) | set(fresh_size)):
        shards = previous.splits[split].shards if split in previous.splits else ()
        kept_total = sum(kept_in[s.name] for s in shards)
        delta_kept = sum(kept_in[s.name] for s in shards if s.origin == Origin.DELTA)
        count, size = fresh_size.get(split, (0, 0))
        total = kept_total + count
        if total and (delta_kept + count) / total > max_delta_share:
            for spill in (kept, fresh):
                spill.close()
            return None
        index = 0
        for s in shards:
            n = kept_in[s.name]
            if n:
                kind = Kind.REUSE if n == s.num_examples else Kind.COPY
                tasks.append(Task(split, index, kind, Origin(s.origin or Origin.HASH), s))
                index += 1
        deltas = min(count, auto_num_shards(size, target_shard_mb)) if count else 0
        fresh_shards[split] = (index, deltas)
        tasks += [Task(split, index + i, Kind.IMAGES, Origin.DELTA) for i in range(deltas)]
        if index + deltas:
            num_shards[split] = index + deltas
    counts = {k: resolved.counts[k] for k in identity.KINDS}
    return Increment(previous=previous.version, num_shards=num_shards, tasks=tasks,
                     kept=kept, fresh=fresh, fresh_shards=fresh_shards, counts=counts,
                     to_convert=to_convert)


def shard_plan(increment):
    """Increment -> the ShardPlan the launcher writes, as a full plan's."""
    return ShardPlan(increment.num_shards, task_listings(increment), increment.to_convert,
                     increment=dict(increment.counts, **{"from": increment.previous}))


def task_listings(increment):
    """Increment -> a PlannedShard per task, with its listing lines, streamed.

    reuse / copy: a header line {"source": previous shard file, "num_bytes", "crc32c" (or,
    from a version written before shards had one, "sha256"): its size and checksum} then
    a kept_line per kept image, in shard order (its row number in the previous catalog:
    the job reads the row there); images: ImageRef lines, like a full build's.
    """
    by_source = {t.previous.name: t for t in increment.tasks if t.previous}
    for source, rows in itertools.groupby(increment.kept, key=lambda item: item[0]):
        task = by_source[source]
        checksum = {k: getattr(task.previous, k) for k in ("crc32c", "sha256", "num_bytes")
                    if getattr(task.previous, k) is not None}
        header = json.dumps({"source": source, **checksum})
        yield PlannedShard(task.split, task.shard, task.kind, task.origin, itertools.chain(
            [header], (line for _, line in rows)))
    deltas = {split: n for split, (_, n) in increment.fresh_shards.items() if n}
    for split, shard, lines in iter_shards(increment.fresh, deltas):
        first, _ = increment.fresh_shards[split]
        yield PlannedShard(split, first + shard, Kind.IMAGES, Origin.DELTA, lines)
