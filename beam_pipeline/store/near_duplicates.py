"""Near-duplicate groups: every pair of stored images whose perceptual hashes differ in at most
`radius` bits, without comparing everything with everything and without holding the catalog.

Multi-index hashing: the 64 bits are cut into `bands` contiguous bands. If two hashes differ in
at most `radius` bits, one band differs in at most ceil((radius + 1) / bands) - 1 bits
(pigeonhole); with bands = radius + 1 that is 0, an exact band match. Each row is written to a
`SortedSpill` once per band under (band, band value) - and, when the sub-radius is above 0, a
new row also under every band value within the sub-radius - so rows that may be close meet in
one sorted run, and only they are compared (by full distance). A pair is kept in the first band
where it qualifies, so it is reported once. Memory is one bucket plus the pairs found.

Incremental: rows are `old` (already in the previous catalog, grouped before) or new; pairs of
two old rows are never formed, so a nightly run costs the new rows' buckets, not the catalog's.

near_duplicates.jsonl, one group per line, groups ordered by their first key:

    {"keys": ["a.jpg", "b.jpg"], "splits": ["train", "test"], "distances": [[0, 1, 6]]}

`keys` sorted; `splits[i]` is the split of `keys[i]`; `distances` the verified pairs
[i, j, hamming bits] (i < j, indices into `keys`) that joined the group - near-duplication is
not transitive, so a group is the connected set, and a pair not listed may be further apart.
"""

import dataclasses
import itertools
import json

import numpy as np

from beam_pipeline.store.spill import SortedSpill

BITS = 64
DEFAULT_RADIUS = 10  # chosen by measurement (README, Measured): launcher/flags.py agrees


@dataclasses.dataclass(frozen=True)
class Row:
    key: str
    split: str
    hash: int          # unsigned 64-bit (a signed int64 from a catalog column is accepted)
    old: bool = False  # in the previous catalog: never compared with another old row


@dataclasses.dataclass(frozen=True, order=True)
class Pair:
    a: int             # indices into the group's keys, a < b
    b: int
    distance: int


@dataclasses.dataclass(frozen=True)
class Group:
    keys: tuple
    splits: tuple
    pairs: tuple       # of Pair

    @property
    def spans_splits(self):
        return len(set(self.splits)) > 1

    def leaks(self, train="train"):
        """Keys outside `train` in a group with a train member: what evaluation must not see."""
        if train not in self.splits:
            return ()
        return tuple(k for k, s in zip(self.keys, self.splits) if s != train)

    def to_json(self, excluded=()):
        """One near_duplicates.jsonl line; `excluded`: keys left out of the version."""
        line = {"keys": list(self.keys), "splits": list(self.splits),
                "distances": [[p.a, p.b, p.distance] for p in self.pairs]}
        if excluded:
            line["excluded"] = list(excluded)
        return json.dumps(line)


@dataclasses.dataclass(frozen=True)
class Plan:
    """Band layout: band i is bits [starts[i], starts[i] + widths[i]) counted from the LSB."""
    radius: int
    widths: tuple
    sub_radius: int

    @property
    def starts(self):
        return tuple(itertools.accumulate((0,) + self.widths[:-1]))

    def masks(self):
        return [((1 << w) - 1) << s for w, s in zip(self.widths, self.starts)]


def plan(radius, bands=None):
    """radius + 1 bands by default (exact band matches); fewer bands make longer ones
    (smaller buckets) at the price of enumerating values within the sub-radius."""
    if not 0 <= radius < BITS:
        raise ValueError(f"radius must be in 0..{BITS - 1}, not {radius}")
    bands = bands or radius + 1
    if not 1 <= bands <= BITS:
        raise ValueError(f"bands must be in 1..{BITS}, not {bands}")
    base, extra = divmod(BITS, bands)
    widths = tuple(base + (i < extra) for i in range(bands))
    return Plan(radius, widths, -(-(radius + 1) // bands) - 1)


def default_bands(radius):
    """The band count the build uses: radius + 1 (exact band matches; see plan)."""
    return None


def _unsigned(h):
    return h + (1 << BITS) if h < 0 else h


def _variants(value, width, sub_radius):
    """Band values 1..sub_radius bits away from `value` within a `width`-bit band."""
    for d in range(1, sub_radius + 1):
        for bits in itertools.combinations(range(width), d):
            yield value ^ sum(1 << b for b in bits)


def _spill_rows(rows, p, spill):
    """Writes E (exact) lines for every row and Q (query) lines for new rows' near values."""
    digits = [-(-w // 4) for w in p.widths]
    for row in rows:
        h = _unsigned(row.hash)
        payload = f"{h:016x}{'O' if row.old else 'N'}{json.dumps([row.key, row.split])}"
        for band, (w, s) in enumerate(zip(p.widths, p.starts)):
            v = (h >> s) & ((1 << w) - 1)
            spill.add(f"{band:02d}{v:0{digits[band]}x}", "E" + payload)
            if p.sub_radius and not row.old:
                for u in _variants(v, w, p.sub_radius):
                    spill.add(f"{band:02d}{u:0{digits[band]}x}", "Q" + payload)


def _first_band(x, p):
    """Index of the first band where hashes differing by xor `x` are within the sub-radius."""
    counts = np.stack([np.bitwise_count(x & np.uint64(m)) for m in p.masks()])
    return np.argmax(counts <= p.sub_radius, axis=0)


def _bucket_pairs(band, entries, p):
    """Yields (payload a, payload b, distance) for the pairs this bucket is responsible for."""
    exact = [e[1:] for e in entries if e[0] == "E"]
    query = [e[1:] for e in entries if e[0] == "Q"]
    if not exact or (len(exact) == 1 and not query):
        return
    eh = np.array([int(e[:16], 16) for e in exact], dtype=np.uint64)
    eo = np.array([e[16] == "O" for e in exact])
    left = [(exact, eh, eo, True)]
    if query:
        left.append((query, np.array([int(q[:16], 16) for q in query], dtype=np.uint64),
                     np.array([q[16] == "O" for q in query]), False))
    for rows, h, old, same in left:
        step = max(16, (1 << 20) // len(exact))  # distance matrices of ~1M cells at most
        for lo in range(0, len(rows), step):
            a = slice(lo, lo + step)
            x = h[a, None] ^ eh[None, :]
            d = np.bitwise_count(x)
            keep = (d <= p.radius) & ~(old[a, None] & eo[None, :])
            if same:
                keep &= np.arange(lo, lo + len(rows[a]))[:, None] < np.arange(len(exact))
            i, j = np.nonzero(keep)
            if len(i):
                mine = _first_band(x[i, j], p) == band
                i, j = i[mine], j[mine]
            for ii, jj in zip(i.tolist(), j.tolist()):
                qa, eb = rows[lo + ii], exact[jj]
                if same or _query_owns(qa, eb):
                    yield qa, eb, int(d[ii, jj])


def _query_owns(q, e):
    """A pair whose band differs within the sub-radius shows up as Q(a)xE(b) and Q(b)xE(a)
    when both are new: the smaller payload's query keeps it; a new row's query owns a pair
    with an old row (old rows write no queries)."""
    return e[16] == "O" or q < e


def find_pairs(rows, radius=DEFAULT_RADIUS, bands=None, directory=None):
    """Yields (row a, row b, distance) for every pair within `radius`, except old-old pairs."""
    p = plan(radius, bands)
    with SortedSpill(directory) as spill:
        _spill_rows(rows, p, spill)
        for bucket, lines in itertools.groupby(spill, key=lambda kv: kv[0]):
            for a, b, d in _bucket_pairs(int(bucket[:2]), [line for _, line in lines], p):
                yield _row(a), _row(b), d


def _row(payload):
    key, split = json.loads(payload[17:])
    return Row(key, split, int(payload[:16], 16), payload[16] == "O")


def find_groups(rows, radius=DEFAULT_RADIUS, bands=None, directory=None, known_pairs=()):
    """Connected groups of the pairs `find_pairs` yields, ordered by first key.

    `known_pairs`: (key a, key b, distance) found by an earlier run between two old rows
    (read_pairs of its near_duplicates.jsonl); kept when both keys are still old rows.
    """
    known_pairs = list(known_pairs)
    wanted, old_split = {k for a, b, _ in known_pairs for k in (a, b)}, {}

    def noting_old(rows):
        for r in rows:
            if r.old and r.key in wanted:
                old_split[r.key] = r.split
            yield r

    edges, split = [], {}
    for a, b, d in find_pairs(noting_old(rows), radius, bands, directory):
        split[a.key], split[b.key] = a.split, b.split
        edges.append((a.key, b.key, d))
    for a, b, d in known_pairs:  # find_pairs has read every row by now
        if a in old_split and b in old_split and d <= radius:
            split[a], split[b] = old_split[a], old_split[b]
            edges.append((a, b, d))
    return _connected(edges, split)


def _connected(edges, split):
    parent = {k: k for k in split}

    def root(k):
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for a, b, _ in edges:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    members, group_edges = {}, {}
    for k in parent:
        members.setdefault(root(k), []).append(k)
    for a, b, d in edges:
        group_edges.setdefault(root(a), []).append((a, b, d))
    groups = []
    for r, keys in members.items():
        keys.sort()
        index = {k: i for i, k in enumerate(keys)}
        pairs = sorted(Pair(*sorted((index[a], index[b])), d) for a, b, d in group_edges[r])
        groups.append(Group(tuple(keys), tuple(split[k] for k in keys), tuple(pairs)))
    return sorted(groups, key=lambda g: g.keys[0])


def read_pairs(lines):
    """near_duplicates.jsonl lines -> (key a, key b, distance) of every verified pair."""
    for line in lines:
        if line.strip():
            g = json.loads(line)
            for i, j, d in g["distances"]:
                yield g["keys"][i], g["keys"][j], d


def write_jsonl(groups, f):
    """near_duplicates.jsonl (format in the module docstring); returns the number of lines."""
    n = 0
    for g in groups:
        f.write(g.to_json() + "\n")
        n += 1
    return n
