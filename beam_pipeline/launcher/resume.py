"""Resume whatever changed: a failed run's finished shards taken into the new plan by content.

A run killed, failed or cancelled leaves finished shards under their final names, each
with a fragment recording its settings and result (job/attempts.py). The next run's plan
need not be the failed one's: images may have been added or deleted since, which moves
every hash cut and every delta shard's number. So a finished shard is matched by its own
listing, not by its name:

    failed runs' finished shards (attempts.finished), with this build's settings
      -> their listing lines spilled by key
      -> joined with this run's resolved listing (identity.Resolved, key order), each key
         given to one shard at most (the newest failed run's):
         every line listed again unchanged (key, uri, label, split, size, stamp, md5)
           -> taken whole: shared where the failed run wrote it (../VERSION/NAME)
         some lines gone or changed, no input rejected
           -> taken for the rest: those records' frames copied (the lost keys spilled)
      -> Resumed: the taken shards (`resume` tasks) and the remainder, a Resolved of the
         other images that the full or incremental plan cuts.

A full plan cuts the whole listing as the failed run did; a taken shard named as a slot of
that cut keeps the slot (`Resumed.held`), and images of the remainder hashing into it go
to new shards after the cut (launcher/plan.py). `with_resumed` places the taken shards
(held slots, else after the plan's own). Each image is in exactly one shard and its record
is the one a full build stores (conversion is deterministic; the settings and code build
are the same), so the version holds a full build's examples; the cut differs only as
docs/guarantees.md says.
"""

import collections
import dataclasses
import itertools
import json
from json.encoder import encode_basestring_ascii as json_string

from beam_pipeline.algorithms.read_ahead import threaded
from beam_pipeline.algorithms.spill import SortedSpill, join_sorted
from beam_pipeline.job import attempts
from beam_pipeline.job.contracts import Kind, Origin, PlannedShard
from beam_pipeline.launcher import identity
from beam_pipeline.refs import LINE_KEY, LINE_MD5, LINE_SIZE, LINE_STAMP, ImageRef
from beam_pipeline.store import files
from dataset_format import layout

SAME = slice(LINE_KEY, LINE_STAMP + 1)  # key, uri, label, split, size, stamp (then md5)


def identity_of(fields):
    """The fields of a listing line that say "the same input": key, uri, label, split,
    size, stamp and the listed md5 (not the sha256 or stored frame: how the launcher
    found out, not what the image is)."""
    md5 = fields[LINE_MD5] if len(fields) > LINE_MD5 else None
    return fields[SAME] + [md5]


@dataclasses.dataclass(frozen=True)
class Taken:
    """A failed run's finished shard this version takes: shared as it is (`whole`), or its
    records but those of the keys it lost (deleted, changed since, or another taken shard's)
    copied."""

    split: str
    finished: attempts.Finished
    whole: bool = True
    number: int = 0      # its place among the candidates (the losses spill's order)


@dataclasses.dataclass
class Resumed:
    """What `take` found: the shards taken, and a Resolved of every other image."""

    taken: list          # [Taken], in the order attempts.finished found them
    remainder: object    # identity.Resolved, or the same interface (Remainder)
    losses: object = None  # SortedSpill ("number key", key JSON): the keys each one lost

    def held(self, name, num_shards):
        """{split: {slot: Taken}}: the taken shards a hash cut of `num_shards` ({split: N})
        names as the failed run did (the same slot of the same N): they keep their slot."""
        held = {}
        for t in self.taken:
            r = t.finished.result
            n = num_shards.get(t.split)
            if (n and r.shard < n and r.origin == Origin.HASH
                    and r.files.path == layout.shard_name(name, t.split, r.shard, n)
                    and r.shard not in held.get(t.split, {})):
                held.setdefault(t.split, {})[r.shard] = t
        return held


def take(resolved, finished, shard_settings, spill_dir, copies=True):
    """identity.Resolved + attempts.finished's shards -> Resumed. Only shards whose settings
    are `shard_settings` (attempts.settings of this build) are looked at. A shard whose
    every listed image is listed again unchanged is taken whole (shared); one that lost
    some (deleted or changed since, ~70% of 125-image shards when 1% of the images are
    deleted) is taken for the rest, its frames copied, when it rejected none (a rejected
    input's error record belongs to the whole shard) and `copies` (not with --transform:
    copied records carry no pixel moments)."""
    candidates = [f for f in finished if f.settings == shard_settings]
    if not candidates:
        return Resumed([], resolved)
    with SortedSpill(spill_dir) as old:
        sizes = []
        listings = threaded(candidates, lambda f: files.read_bytes(f.listing), 16)
        for i, (_, data) in enumerate(listings):  # 16 reads at a time (gs:// round trips)
            n = 0
            for line in data.decode().splitlines():
                if line.strip():
                    fields = json.loads(line)
                    old.add(json_string(fields[LINE_KEY]), json.dumps([i, identity_of(fields)]))
                    n += 1
            sizes.append(n)
        owner = SortedSpill(spill_dir)  # (key, shard i) of each key a candidate matches
        dropped = SortedSpill(spill_dir)  # ("i key", key) of the keys a candidate loses
        matched = collections.Counter()
        moved = collections.defaultdict(lambda: [0, 0, 0])  # i -> [images, bytes, stored]
        keyed = _keyed(resolved.numbered_lines(("file",)), spill_dir)  # a row: stored or not
        for key, line, row, olds in _join(((k, line, row) for k, line, _, row in keyed), old):
            i = None
            if line is not None and olds:
                fields = json.loads(line)
                same = identity_of(fields)
                i = min((i for i, ident in olds if ident == same), default=None)
            for j, _ in olds:  # deleted, changed, or the key another shard takes
                if j != i:
                    dropped.add(f"{j:09d} {key}", key)
            if i is None:
                continue
            owner.add(key, str(i))  # one shard per key: the newest failed run's first
            matched[i] += 1
            counts = moved[i]
            counts[0] += 1
            counts[1] += fields[LINE_SIZE]
            counts[2] += row is not None
    taken_ids = {i for i, n in enumerate(sizes)
                 if matched[i] and (matched[i] == n
                                    or (copies and not candidates[i].result.errors))}
    if not taken_ids:
        owner.close()
        dropped.close()
        return Resumed([], resolved)
    taken = [Taken(candidates[i].result.split, candidates[i], matched[i] == sizes[i], i)
             for i in sorted(taken_ids)]
    remainder = Remainder(resolved, owner, taken_ids, spill_dir)
    for i in taken_ids:
        split = candidates[i].result.split
        images, size, stored = moved[i]
        counts = remainder.per_split[split]
        counts[0] -= images
        counts[1] -= size
        remainder.counts["stored"] -= stored
    remainder.per_split = {s: c for s, c in remainder.per_split.items() if c[0] > 0}
    return Resumed(taken, remainder, dropped)


class Remainder(identity.Sized):
    """A Resolved without the images of the taken shards: what the plans read (refs,
    ref_lines, plan_fields, per_split, counts, num_images, num_bytes)."""

    def __init__(self, resolved, owner, taken_ids, spill_dir=None):
        self.resolved, self.owner, self.taken_ids = resolved, owner, frozenset(taken_ids)
        self.spill_dir = spill_dir  # where the images are sorted by key again (_keyed)
        self.per_split = {s: list(c) for s, c in resolved.per_split.items()}
        self.counts = collections.Counter(resolved.counts)

    def _kept(self, keyed):
        """(key, item) in key order -> the items of keys no taken shard holds."""
        taken = ((key, True) for key, i in self.owner if int(i) in self.taken_ids)
        for _, item, gone in join_sorted(keyed, taken):
            if item is not None and gone is None:
                yield item

    def numbered_lines(self, columns=None):
        """(ImageRef JSON, previous catalog row number or None, row or None) of the images
        no taken shard holds, in key order."""
        return self._kept((key, item) for key, *item
                          in _keyed(self.resolved.numbered_lines(columns), self.spill_dir))

    def ref_lines(self, columns=None):
        """(ImageRef JSON, row) of the images no taken shard holds, in key order."""
        for line, _, row in self.numbered_lines(columns):
            yield line, row

    def plan_fields(self, columns):
        """(parsed ImageRef JSON, row number, row, None) of the images no taken shard holds:
        every stored row read with `columns` (the plan decides what is kept from it)."""
        for line, number, row in self.numbered_lines(columns):
            yield json.loads(line), number, row, None

    def refs(self, columns=None):
        """(ImageRef, row) of the images no taken shard holds, in key order."""
        for line, row in self.ref_lines(columns):
            yield ImageRef.from_json(line), row

    def close(self):
        self.owner.close()


def _by_number(spill):
    """The losses spill -> losses(number): the key JSON lines of that shard's losses (ask in
    increasing order; each one's are streamed from the one pass over the spill)."""
    groups = itertools.groupby(spill if spill is not None else (),
                               key=lambda kv: int(kv[0].split(" ", 1)[0]))
    current = [next(groups, None)]

    def losses(number):
        while current[0] is not None and current[0][0] < number:
            current[0] = next(groups, None)
        if current[0] is None or current[0][0] != number:
            return iter(())
        group, current[0] = current[0][1], (number - 0.5, iter(()))  # consumed once
        return (key for _, key in group)

    return losses


def _keyed(numbered_lines, spill_dir):
    """(ImageRef JSON, row number, row) -> (sort key, line, row number, row) in key order
    (json_string(key), as the old spill is keyed). The identity stage gives the images
    with a stored record in catalog order first (one pass over catalog.parquet), so they
    are sorted again here, on disk: only when a failed run left finished shards to take."""
    with SortedSpill(spill_dir) as spill:
        for line, number, row in numbered_lines:
            spill.add(json_string(json.loads(line)[LINE_KEY]), json.dumps([line, number, row]))
        for key, value in spill:
            line, number, row = json.loads(value)
            yield key, line, number, row


def _join(keyed, old):
    """(key, line, row) and the old spill (key, "[i, identity]") -> (key, line or None,
    row, [(i, identity)] of every candidate listing the key): every key of either."""
    grouped = ((key, [json.loads(v) for _, v in group])
               for key, group in itertools.groupby(old, key=lambda kv: kv[0]))
    for key, new, olds in join_sorted(((k, (line, row)) for k, line, row in keyed), grouped):
        line, row = new if new is not None else (None, None)
        yield key, line, row, olds or ()


def with_resumed(shard_plan, resumed, held=None):
    """The plan of the other images + the taken shards -> one ShardPlan. A taken shard in
    `held` ({split: {slot: Taken}}, Resumed.held: a full plan left that slot out) takes its
    slot; the others go after the plan's shards, in the failed runs' order. Each is a
    `resume` task whose listing is one header line."""
    if not resumed.taken:
        return shard_plan
    held = held or {}
    num_shards = dict(shard_plan.num_shards)
    placed = []
    for t in resumed.taken:
        slot = next((s for s, h in held.get(t.split, {}).items() if h is t), None)
        if slot is None:
            slot = num_shards.get(t.split, 0)
            num_shards[t.split] = slot + 1
        placed.append((t, slot))

    def shards():
        losses = _by_number(resumed.losses)
        for t, slot in placed:  # in `number` order, as the losses spill
            f = t.finished
            header = json.dumps({"source": f.source, "fragment": f.fragment,
                                 "listing_file": f.listing, "result": f.result.to_json(),
                                 "whole": t.whole})
            yield PlannedShard(t.split, slot, Kind.RESUME, Origin(f.result.origin or Origin.HASH),
                               itertools.chain([header], losses(t.number)))
        if resumed.losses is not None:
            resumed.losses.close()
        yield from shard_plan.shards

    return dataclasses.replace(shard_plan, num_shards=num_shards, shards=shards())
