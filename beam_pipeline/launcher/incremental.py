"""Regeneration that costs what changed: join the new listing with the previous catalog.

    new refs (by key) ⋈ previous catalog rows (by key), both sorted on disk
      unchanged (same label, split, size, mtime)  -> kept: its record bytes are reused
      new, or changed in place                    -> fresh: converted into delta shards
      gone, or changed                            -> removed from its old shard

    per previous shard: every member kept -> "reuse" (hard link / server-side copy)
                        some kept          -> "copy" (surviving frames copied, not decoded)
                        none kept          -> dropped
    fresh images -> "images" tasks: new delta shards of ~--target_shard_mb

The result holds exactly the examples a full build would (same keys, labels, splits and
record bytes: conversion is deterministic and ids never move); only the grouping into
shards differs. When delta shards would hold more than --max_delta_share of a split, the
plan returns None and the launcher builds in full (compaction).
"""

import collections
import dataclasses
import itertools
import json
import math

from beam_pipeline.store import catalog
from beam_pipeline.launcher import plan
from beam_pipeline.refs import ImageRef
from beam_pipeline.store.spill import SortedSpill
from readers import layout

HASH, DELTA = "hash", "delta"  # a shard's origin: a full build's hash shards, or added later


@dataclasses.dataclass
class Increment:
    """The plan of an incremental version: shard tasks and what they reuse."""

    previous: str                 # version id it builds on
    num_shards: dict              # split -> N in the new version
    tasks: list                   # [(split, shard, kind, origin, previous shard entry or None)]
    kept: SortedSpill             # ("file position", merged catalog row JSON)
    fresh: SortedSpill            # (shard sort key, ImageRef JSON): to convert
    fresh_shards: dict            # split -> (first new index, number of delta shards)
    counts: dict                  # images unchanged, changed, added, removed

    def close(self):
        self.kept.close()
        self.fresh.close()


def join_by_key(new, old):
    """Two (key, line) streams sorted by key -> (key, new line or None, old line or None)."""
    new, old = iter(new), iter(old)
    a, b = next(new, None), next(old, None)
    while a is not None or b is not None:
        if b is None or (a is not None and a[0] < b[0]):
            yield a[0], a[1], None
            a = next(new, None)
        elif a is None or b[0] < a[0]:
            yield b[0], None, b[1]
            b = next(old, None)
        else:
            yield a[0], a[1], b[1]
            a, b = next(new, None), next(old, None)


def unchanged(ref, row):
    """Same image, same place in the dataset: its stored record can be reused as is."""
    return (ref.label == row["label"] and ref.split == row["split"]
            and ref.size == row["input_size"] and ref.mtime == row["input_mtime"])


def plan_increment(by_key, previous_vdir, previous, spill_dir, target_shard_mb,
                   max_delta_share):
    """New refs (by key) + the previous version -> Increment, or None to build in full."""
    previous_rows = SortedSpill(spill_dir)
    for row in catalog.iter_rows(layout.join(previous_vdir, layout.CATALOG)):
        previous_rows.add(json.dumps(row["key"]), json.dumps(row))
    kept, fresh = SortedSpill(spill_dir), SortedSpill(spill_dir)
    kept_in = collections.Counter()             # previous shard file -> members kept
    fresh_size = collections.defaultdict(lambda: [0, 0])  # split -> [count, bytes]
    counts = collections.Counter()
    with previous_rows:
        for _, new_line, old_line in join_by_key(by_key, previous_rows):
            ref = ImageRef.from_json(new_line) if new_line else None
            row = json.loads(old_line) if old_line else None
            if ref and row and unchanged(ref, row):
                counts["unchanged"] += 1
                kept_in[row["file"]] += 1
                row.update(uri=ref.uri)  # moved with the same bytes: the catalog follows
                kept.add(f"{row['file']} {row['position']:010d}", json.dumps(row))
                continue
            if row:
                counts["removed" if ref is None else "changed"] += 1
            if ref:
                counts["added"] += row is None
                fresh.add(plan.shard_sort_key(ref.split, ref.key), new_line)
                fresh_size[ref.split][0] += 1
                fresh_size[ref.split][1] += ref.size

    tasks, num_shards, fresh_shards = [], {}, {}
    for split in sorted(set(previous["splits"]) | set(fresh_size)):
        shards = previous["splits"].get(split, {}).get("shards", [])
        kept_total = sum(kept_in[s["path"]] for s in shards)
        delta_kept = sum(kept_in[s["path"]] for s in shards if s.get("origin") == DELTA)
        count, size = fresh_size.get(split, (0, 0))
        total = kept_total + count
        if total and (delta_kept + count) / total > max_delta_share:
            for spill in (kept, fresh):
                spill.close()
            return None
        index = 0
        for s in shards:
            n = kept_in[s["path"]]
            if n:
                kind = "reuse" if n == s["num_examples"] else "copy"
                tasks.append((split, index, kind, s.get("origin", HASH), s))
                index += 1
        deltas = min(count, max(1, math.ceil(size / (target_shard_mb * 2**20)))) if count else 0
        fresh_shards[split] = (index, deltas)
        tasks += [(split, index + i, "images", DELTA, None) for i in range(deltas)]
        if index + deltas:
            num_shards[split] = index + deltas
    counts = {k: counts[k] for k in ("unchanged", "changed", "added", "removed")}
    return Increment(previous=previous["version"], num_shards=num_shards, tasks=tasks,
                     kept=kept, fresh=fresh, fresh_shards=fresh_shards, counts=counts)


def task_listings(increment):
    """Increment -> (split, shard, kind, origin, listing lines) per task, streamed.

    reuse / copy: a header line {"source": previous shard file, "sha256": its hash} then
    the kept catalog rows in shard order; images: ImageRef lines, like a full build's.
    """
    by_source = {entry["path"]: (split, shard, kind, origin, entry["sha256"])
                 for split, shard, kind, origin, entry in increment.tasks if entry}
    for source, rows in itertools.groupby(increment.kept, key=lambda item: item[0].split()[0]):
        split, shard, kind, origin, sha256 = by_source[source]
        header = json.dumps({"source": source, "sha256": sha256})
        yield split, shard, kind, origin, itertools.chain(
            [header], (line for _, line in rows))
    deltas = {split: n for split, (_, n) in increment.fresh_shards.items() if n}
    for split, shard, lines in plan.iter_shards(increment.fresh, deltas):
        first, _ = increment.fresh_shards[split]
        yield split, first + shard, "images", DELTA, lines
