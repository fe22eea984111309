"""What a shard task does and where a shard comes from: the words the launcher's plan, the
job's writers, commit's manifest and dedup's leak report share.

A leaf below `job/contracts.py` and `dedup/`, so neither imports the other for them.
"""

import enum


class _Text(str, enum.Enum):
    """A str-valued enum: equal to, printed and JSON-encoded as its value, so the shard
    index, the ShardResult JSON and the manifest read exactly as with bare strings."""

    def __str__(self):
        return self.value

    def __format__(self, spec):
        return format(self.value, spec)


class Kind(_Text):
    """What a shard task does."""

    IMAGES = "images"  # convert the listed images
    REUSE = "reuse"    # incremental: take a previous shard as it is (job/reuse.py)
    COPY = "copy"      # incremental: copy a previous shard's surviving records
    RESUME = "resume"  # a failed run's finished shard, shared where it is (job/attempts.py)


class Origin(_Text):
    """Where a shard comes from (the manifest's shard "origin")."""

    HASH = "hash"    # a shard of the full plan, cut by key hash
    DELTA = "delta"  # new inputs of an incremental build (launcher/incremental.py)
