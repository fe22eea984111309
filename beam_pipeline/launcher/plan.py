"""The full plan: every image cut into shards by its key hash, one listing per shard.

identity.Resolved (every image with its split and the previous record it may reuse)
-> sorted on disk by (split, shard hash) -> one run per shard -> ShardPlan. A stored
record is re-framed (its listing line carries it) unless the build re-converts everything.
"""

import collections
import dataclasses
import itertools
import json
import math
from typing import Optional

from beam_pipeline.algorithms.spill import SortedSpill
from beam_pipeline.job.contracts import Kind, Origin, PlannedShard, ShardPlan
from beam_pipeline.launcher import identity
from beam_pipeline.launcher.rules import position_of, shard_counts, shard_sort_key
from beam_pipeline.refs import LINE_KEY, LINE_SIZE, LINE_SPLIT, ImageRef


@dataclasses.dataclass(frozen=True)
class FullPlanConfig:
    """What the full plan needs of the build options and the previous version."""

    num_shards: int                       # --num_shards (0: auto by size)
    target_shard_mb: float                # --target_shard_mb
    reframe: bool                         # re-frame stored records (not --full_rebuild)
    previous_vdir: Optional[str] = None   # where the stored records are
    # A resumed build (launcher/resume.py): the whole listing's {split: [count, bytes]}, which
    # the shard counts come from (the plan's own images are the rest), and {split: slots}
    # that a failed run's finished shard holds as it is. Images of the rest that hash into
    # a held slot (added since) go to new shards after the cut: no other shard moves.
    listed: Optional[dict] = None
    held: dict = dataclasses.field(default_factory=dict)


def cut(per_split, config):
    """split -> N of the hash cut (rules.shard_counts of the listing's counts and bytes)."""
    return shard_counts(per_split, config.num_shards, config.target_shard_mb)


def full_plan(resolved, config, spill_dir):
    """identity.Resolved -> ShardPlan of a full build (shards cut by hash)."""
    num_shards = cut(config.listed or resolved.per_split, config)
    lines = _full_build_lines(resolved, config.reframe, config.previous_vdir)
    by_position = by_shard_position(lines, spill_dir)
    to_convert = resolved.num_images - (resolved.counts["stored"] if config.reframe else 0)
    if not config.held:
        shards = (PlannedShard(split, shard, Kind.IMAGES, Origin.HASH, lines)
                  for split, shard, lines in iter_shards(by_position, num_shards))
        return ShardPlan(num_shards, shards, to_convert)
    around, extra = _around_held(by_position, num_shards, config, spill_dir)
    return ShardPlan({split: n + extra.get(split, 0) for split, n in num_shards.items()},
                     around, to_convert)


def _around_held(by_position, num_shards, config, spill_dir):
    """The cut with the held slots left out -> (PlannedShard stream, {split: new shards}).

    Images hashing into a held slot are spilled aside (one pass) and cut into new shards
    of ~--target_shard_mb numbered from N, after the cut's own slots, which keep theirs."""
    held = config.held
    aside, sizes = SortedSpill(spill_dir), collections.defaultdict(lambda: [0, 0])
    for sort_key, line in by_position:
        split, position = position_of(sort_key)
        if _slot(position, num_shards[split]) in held.get(split, ()):
            aside.add(sort_key, line)
            sizes[split][0] += 1
            sizes[split][1] += json.loads(line)[LINE_SIZE]
    extra = {split: min(count, max(1, math.ceil(size / (config.target_shard_mb * 2**20))))
             for split, (count, size) in sizes.items()}

    def outside():
        for sort_key, line in by_position:
            split, position = position_of(sort_key)
            if _slot(position, num_shards[split]) not in held.get(split, ()):
                yield sort_key, line

    def shards():
        for split, shard, lines in iter_shards(outside(), num_shards):
            yield PlannedShard(split, shard, Kind.IMAGES, Origin.HASH, lines)
        for split, shard, lines in iter_shards(aside, extra):
            yield PlannedShard(split, num_shards[split] + shard, Kind.IMAGES, Origin.DELTA,
                               lines)
        aside.close()

    return shards(), extra


def _slot(position, n):
    return min(int(position * n), n - 1)


def _full_build_lines(resolved, reframe, previous_vdir):
    """A full build's listing lines: with the stored record to re-frame when there is one
    (and `reframe`); the others as they were spilled."""
    for line, row in resolved.ref_lines(identity.FRAME_COLUMNS if reframe else ("file",)):
        if row is not None and reframe:
            ref = ImageRef.from_json(line)
            line = dataclasses.replace(
                ref, source=identity.stored_frame(previous_vdir, row)).to_json()
        yield line


def by_shard_position(ref_lines, spill_dir):
    """ImageRef JSON lines (with splits) -> a SortedSpill in (split, shard hash) order."""
    spill = SortedSpill(spill_dir)
    for line in ref_lines:
        fields = json.loads(line)  # the key and split are all it needs: no ImageRef built
        spill.add(shard_sort_key(fields[LINE_SPLIT], fields[LINE_KEY]), line)
    return spill


def iter_shards(by_position, num_shards):
    """Refs sorted by shard hash -> (split, shard, iterator of ImageRef JSON lines).

    shard = floor(position × N) is monotone in the position, so each shard is one run of
    the sorted stream; its lines are streamed too (consume each before the next shard).
    """
    def shard_of_line(item):
        split, position = position_of(item[0])
        n = num_shards[split]
        return split, min(int(position * n), n - 1)

    for (split, shard), run in itertools.groupby(by_position, key=shard_of_line):
        yield split, shard, (line for _, line in run)
