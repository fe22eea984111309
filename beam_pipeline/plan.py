"""Pure planning: what each listed image becomes (label id, split, shard), no bytes read.

These decisions must be stable across runs (DESIGN §5): an image never changes split,
an existing class never changes id, and the same inputs give the same shards.
"""

import dataclasses
import hashlib
import json
import math
from typing import Optional

SPLIT_NAMES = ("train", "validation", "test")


@dataclasses.dataclass(frozen=True, order=True)
class ImageRef:
    """One listed input: small enough to group and shuffle by the million."""

    key: str                      # identity: the input's full uri
    uri: str
    filename: str                 # relative to its input root (image/filename)
    label: str
    split: Optional[str] = None   # fixed by layout or manifest column, else hashed
    size: int = 0
    mtime: float = 0.0            # mtime or GCS update time; only for the fingerprint

    def to_json(self):
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, line):
        return cls(**json.loads(line))


def unit_hash(*parts):
    """A stable float in [0, 1) from strings (not Python's salted hash())."""
    digest = hashlib.sha256("\0".join(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def parse_splits(text):
    """'train=0.8,validation=0.2' -> (('train', 0.8), ('validation', 0.2)), checked."""
    pairs = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, sep, value = item.partition("=")
        try:
            fraction = float(value)
        except ValueError:
            fraction = -1.0
        if not sep or not name.strip().isidentifier() or not 0 < fraction <= 1:
            raise ValueError(f"--splits: bad item {item!r}; expected NAME=FRACTION "
                             "like train=0.8,validation=0.1,test=0.1")
        pairs.append((name.strip(), fraction))
    names = [n for n, _ in pairs]
    if not pairs or len(set(names)) != len(names):
        raise ValueError(f"--splits: {text!r} must name each split once")
    if abs(sum(f for _, f in pairs) - 1.0) > 1e-6:
        raise ValueError(f"--splits: fractions in {text!r} add up to "
                         f"{sum(f for _, f in pairs):g}, not 1")
    return tuple(pairs)


def assign_split(key, splits):
    """The split for an image with no fixed split: its key's hash on the cumulative fractions."""
    u = unit_hash("split", key)
    edge = 0.0
    for name, fraction in splits:
        edge += fraction
        if u < edge:
            return name
    return splits[-1][0]


def shard_position(split, key):
    """The (split, key) hash: picks the shard and orders records inside it."""
    return unit_hash("shard", split, key)


def shard_of(split, key, num_shards):
    return min(int(shard_position(split, key) * num_shards), num_shards - 1)


def partition(refs, num_shards):
    """refs with splits -> {(split, shard): [ImageRef in shard order]}; only non-empty shards."""
    shards = {}
    for ref in refs:
        position = shard_position(ref.split, ref.key)
        shard = min(int(position * num_shards[ref.split]), num_shards[ref.split] - 1)
        shards.setdefault((ref.split, shard), []).append((position, ref))
    return {k: [ref for _, ref in sorted(v, key=lambda item: item[0])]
            for k, v in sorted(shards.items())}


def auto_num_shards(total_bytes, target_mb, multiple_of=1):
    """Shards of ~target_mb each, rounded up to a multiple of the worker count for balance."""
    n = max(1, math.ceil(total_bytes / (target_mb * 2**20)))
    return math.ceil(n / multiple_of) * multiple_of


def label_ids(present, previous=(), label_file=None):
    """Ordered class list: a label file's order, else earlier ids kept and new classes appended."""
    if label_file is not None:
        return list(label_file)
    known = list(previous)
    return known + sorted(set(present) - set(known))
