"""Pure planning: what each listed image becomes (label id, split, shard), no bytes read.

These decisions must be stable across runs: an image never changes split,
an existing class never changes id, and the same inputs give the same shards.
"""

import collections
import dataclasses
import hashlib
import itertools
import json
import math
from json.encoder import encode_basestring_ascii as json_string  # = json.dumps(a str)
from typing import Optional

from beam_pipeline.refs import LINE_KEY, LINE_SPLIT, ImageRef
from beam_pipeline.algorithms.spill import SortedSpill


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


@dataclasses.dataclass
class Plan:
    """What one streaming pass over the listing learned; refs wait on disk in key order."""

    fingerprint: str
    labels_present: set
    listed: int = 0
    duplicates: int = 0
    errors: int = 0
    num_images: int = 0
    by_key: Optional[SortedSpill] = None  # (key JSON, ImageRef JSON; split only where fixed)


# ImageRef.to_json's fields, read without building an ImageRef (a frozen dataclass: ~3 us)
Listed = collections.namedtuple("Listed", "key uri label split size stamp sha256 source md5")


def plan_listing(items, fingerprint, known_labels, spill_dir, write_error):
    """Listed items (ImageRef or error dict) -> Plan, in flat memory.

    Sorts by uri on disk to drop duplicates (the same file listed again, by any input:
    same label and split, counted; otherwise a `conflicting_duplicate` error) and to
    fingerprint in a stable order (keys are then unique: each input's keys are distinct
    paths under its own prefix), then spills the refs again by key for identity.resolve,
    which gives every image its split. `fingerprint` has add(ref) and hexdigest();
    `write_error` takes each errors.jsonl record; `known_labels` (a --label_file's
    classes) or None.
    """
    from beam_pipeline.errors import error_record

    plan = Plan(fingerprint="", labels_present=set(), by_key=SortedSpill(spill_dir))
    with SortedSpill(spill_dir) as by_uri:
        for item in items:
            plan.listed += 1
            if isinstance(item, ImageRef):
                by_uri.add(json_string(item.uri), item.to_json())
            else:
                plan.errors += 1
                write_error(item)
        first = None
        for _, line in by_uri:
            ref = Listed._make(json.loads(line))  # no ImageRef: the line is passed on as is
            if first is not None and ref.uri == first.uri:
                if (ref.label, ref.split) == (first.label, first.split):
                    plan.duplicates += 1
                else:
                    plan.errors += 1
                    write_error(error_record(
                        ref.uri, "read", "conflicting_duplicate",
                        f"listed again with label {ref.label!r}, split {ref.split!r}; kept "
                        f"label {first.label!r}, split {first.split!r}"))
                continue
            first = ref
            fingerprint.add(ref)
            if known_labels is not None and ref.label not in known_labels:
                plan.errors += 1
                write_error(error_record(ref.uri, "read", "unknown_label",
                                         f"class {ref.label!r} is not in --label_file"))
                continue
            plan.labels_present.add(ref.label)
            plan.num_images += 1
            plan.by_key.add(json_string(ref.key), line)
    plan.fingerprint = fingerprint.hexdigest()
    return plan


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
