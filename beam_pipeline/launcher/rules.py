"""The planning rules, pinned: what each listed image becomes (label id, split, shard), as pure
functions of its key and the options' values. No I/O, no options object, no imports of the
package: every stage of the launcher takes its decisions from here.

These decisions must be stable across runs: an image never changes split, an existing class
never changes id, and the same inputs give the same shards (tests/test_records_plan.py pins
the hashes).
"""

import hashlib
import math


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


def shard_sort_key(split, key):
    """A text key that sorts like (split, shard_position): 16 hex digits of the same hash."""
    digest = hashlib.sha256("\0".join(("shard", split, key)).encode()).digest()
    return f"{split} {digest[:8].hex()}"


def position_of(sort_key):
    """shard_sort_key -> (split, shard_position)."""
    split, _, hex_position = sort_key.rpartition(" ")
    return split, int(hex_position, 16) / 2.0**64


def shard_of(split, key, num_shards):
    return min(int(shard_position(split, key) * num_shards), num_shards - 1)


def auto_num_shards(total_bytes, target_mb):
    """Shards of ~target_mb each. Only data and options count: a launcher's core count would
    make the shards (and their bytes) depend on where the build was started."""
    return max(1, math.ceil(total_bytes / (target_mb * 2**20)))


def label_ids(present, previous=(), label_file=None):
    """Ordered class list: a label file's order, else earlier ids kept and new classes appended."""
    if label_file is not None:
        return list(label_file)
    known = list(previous)
    return known + sorted(set(present) - set(known))


def shard_counts(per_split, num_shards, target_mb):
    """Per split ({split: (count, bytes)}): `num_shards` (--num_shards, 0: auto), else auto by
    size; never more shards than images. Nothing about the machine that launches it: the
    same inputs give the same shards anywhere."""
    shards = {}
    for split, (count, size) in per_split.items():
        n = num_shards or auto_num_shards(size, target_mb)
        shards[split] = max(1, min(n, count))
    return shards
