"""Near-duplicate groups: every pair of stored images whose perceptual hashes differ in at most
`radius` bits, without comparing everything with everything and without holding the catalog.

Multi-index hashing: the 64 bits are cut into `bands` contiguous bands. If two hashes differ in
at most `radius` bits, one band differs in at most ceil((radius + 1) / bands) - 1 bits, the
sub-radius (pigeonhole). The rows go to local disk once (hashes as uint64, keys as text).
Per band, the rows are sorted by band value in numpy, a value range at a time (TABLE_ROWS
rows in memory, however many rows there are); each new row is compared, by full distance
(XOR and popcount), with the rows of its own bucket after it and - when the sub-radius is
above 0 - with the buckets of the band values within the sub-radius. A pair is kept only in
the first band where its two band values are within the sub-radius, so it is reported once;
keys are read back only for the rows of found pairs.

Incremental: rows are `old` (already in the previous catalog, grouped before) or new; only new
rows look for partners, so a nightly run costs the new rows' buckets, not the catalog's.

near_duplicates.jsonl, one group per line, groups ordered by their first key:

    {"keys": ["a.jpg", "b.jpg"], "splits": ["train", "test"], "distances": [[0, 1, 6]]}

`keys` sorted; `splits[i]` is the split of `keys[i]`; `distances` the verified pairs
[i, j, hamming bits] (i < j, indices into `keys`) that joined the group - near-duplication is
not transitive, so a group is the connected set, and a pair not listed may be further apart.
"""

import dataclasses
import itertools
import json
import os
import tempfile

import numpy as np

BITS = 64
DEFAULT_RADIUS = 10  # chosen by measurement (README, Measured): launcher/flags.py agrees
SCAN_ROWS = 1 << 16   # hashes read from the spill at a time (0.5 MB; per-mask temporaries alike)
TABLE_ROWS = 1 << 19  # rows of one band's sorted table in memory (~20 MB with its indexes)
PAIR_CHUNK = 1 << 18  # candidate pairs compared at a time (~15 MB of temporaries)
BLOCK_ROWS = 64       # buckets larger than this compared as blocks of a distance matrix
DIRECT_BITS = 20      # bands this wide or narrower find a value's bucket by offset table
_U64 = (1 << BITS) - 1


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
    """The band count the build uses, by measurement (README, Measured): exact bands while
    they are ~11 bits or wider (radius <= 5), else four 16-bit bands searched within their
    sub-radius (at radius 10, 2 bits: 137 bucket look-ups per band, buckets of ~n / 65536)
    - radius + 1 exact bands of 5-6 bits would compare ~n / 64 rows per row and band."""
    return radius + 1 if radius <= 5 else 4


def find_pairs(rows, radius=DEFAULT_RADIUS, bands=None, directory=None):
    """Yields (row a, row b, distance) for every pair within `radius`, except old-old pairs;
    `bands` None: default_bands. The scratch files live in a temporary directory under
    `directory`."""
    p = plan(radius, bands or default_bands(radius))
    with tempfile.TemporaryDirectory(prefix="near-duplicates-", dir=directory) as scratch:
        data = _Spilled(rows, scratch)
        found = [f for band in range(len(p.widths)) for f in _band_pairs(data, p, band)]
        if not found:
            return
        a, b, d = (np.concatenate(col) for col in zip(*found))
        rows_by_id = data.rows(np.unique(np.concatenate([a, b])))
        for i, j, dist in zip(a.tolist(), b.tolist(), d.tolist()):
            yield rows_by_id[i], rows_by_id[j], dist


class _Spilled:
    """The rows on local disk: hashes (uint64) and old flags in row order, [key, split] as
    JSON lines; strings are read back only for the rows of found pairs."""

    def __init__(self, rows, scratch):
        self.n = 0
        paths = [os.path.join(scratch, name) for name in ("hashes.u64", "old.u8", "keys.jsonl")]
        with open(paths[0], "wb") as hf, open(paths[1], "wb") as of, \
                open(paths[2], "w", encoding="utf-8") as kf:
            hashes, olds = [], []
            for row in rows:
                hashes.append(row.hash & _U64)
                olds.append(row.old)
                kf.write(json.dumps([row.key, row.split]) + "\n")
                if len(hashes) >= SCAN_ROWS:
                    self._flush(hashes, olds, hf, of)
            self._flush(hashes, olds, hf, of)
        self.keys_path = paths[2]
        self.hashes = np.memmap(paths[0], np.uint64, "r") if self.n else np.zeros(0, np.uint64)
        self.old = np.memmap(paths[1], np.bool_, "r") if self.n else np.zeros(0, np.bool_)

    def _flush(self, hashes, olds, hf, of):
        np.array(hashes, dtype=np.uint64).tofile(hf)
        np.array(olds, dtype=np.bool_).tofile(of)
        self.n += len(hashes)
        hashes.clear()
        olds.clear()

    def chunks(self):
        """(first row id, hashes, old flags), SCAN_ROWS rows at a time."""
        for lo in range(0, self.n, SCAN_ROWS):
            yield lo, np.array(self.hashes[lo:lo + SCAN_ROWS]), \
                np.array(self.old[lo:lo + SCAN_ROWS])

    def rows(self, ids):
        """{row id: Row} for the sorted unique `ids`, in one pass over the keys file."""
        out, wanted = {}, iter(ids.tolist())
        nxt = next(wanted)
        with open(self.keys_path, encoding="utf-8") as f:
            for i, line in enumerate(f):
                if i == nxt:
                    key, split = json.loads(line)
                    out[i] = Row(key, split, int(self.hashes[i]), bool(self.old[i]))
                    nxt = next(wanted, None)
                    if nxt is None:
                        break
        return out


def _band_value(h, p, band):
    w, s = p.widths[band], p.starts[band]
    return (h >> np.uint64(s)) & np.uint64((1 << w) - 1)


def _band_pairs(data, p, band):
    """Yields (ids a, ids b, distances) of the pairs this band is responsible for, the sorted
    table a piece (range of band values, at most ~TABLE_ROWS rows) at a time."""
    shift = max(0, p.widths[band] - DIRECT_BITS)  # pieces are cut on the top bits
    counts = np.zeros(1 << (p.widths[band] - shift), np.int64)
    for _, h, _ in data.chunks():
        coarse = (_band_value(h, p, band) >> np.uint64(shift)).astype(np.int64)
        counts += np.bincount(coarse, minlength=len(counts))
    offsets = np.concatenate([[0], np.cumsum(counts)])
    direct = offsets if shift == 0 else None  # band value -> first sorted position
    for c0, c1 in _pieces(offsets):
        table = _Table(data, p, band, c0 << shift, (c1 << shift) - 1)
        yield from table.own_buckets()
        if p.sub_radius:
            yield from table.near_buckets(data, direct, offsets[c0] if shift == 0 else 0)


def _pieces(offsets):
    """Ranges [c0, c1) of coarse band values holding at most TABLE_ROWS rows (or one value)."""
    start, end = 0, len(offsets) - 1
    while start < end:
        stop = int(np.searchsorted(offsets, offsets[start] + TABLE_ROWS, "right")) - 1
        stop = min(max(stop, start + 1), end)
        if offsets[stop] > offsets[start]:
            yield start, stop
        start = stop


class _Table:
    """The rows whose band value is in [lo, hi], sorted by band value, new rows before old
    within a value."""

    def __init__(self, data, p, band, lo, hi):
        self.p, self.band = p, band
        parts = []
        for first, h, old in data.chunks():
            v = _band_value(h, p, band)
            sel = np.flatnonzero((v >= np.uint64(lo)) & (v <= np.uint64(hi)))
            parts.append((sel + first, h[sel], v[sel], old[sel]))
        ids, h, v, old = (np.concatenate(col) for col in zip(*parts))
        order = np.lexsort((old, v))
        self.ids, self.h, self.v, self.old = ids[order], h[order], v[order], old[order]
        self.lo, self.hi = lo, hi
        self.new_before = np.concatenate([[0], np.cumsum(~self.old)])

    def own_buckets(self):
        """New rows against the rest of their own bucket: later new rows and all old rows.
        Small buckets as one list of candidates, large ones as blocks of a distance matrix."""
        ends = np.flatnonzero(self.v[1:] != self.v[:-1]) + 1
        bounds = np.concatenate([[0], ends, [len(self.v)]])
        bucket_end = np.repeat(bounds[1:], np.diff(bounds))
        small = np.repeat(np.diff(bounds) <= BLOCK_ROWS, np.diff(bounds))
        q = np.flatnonzero(~self.old & small)
        yield from _compare(self.ids[q], self.h[q], q + 1, bucket_end[q], self)
        for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            if hi - lo > BLOCK_ROWS:
                yield from self._block(lo, hi)

    def _block(self, lo, hi):
        h, after = self.h[lo:hi], np.arange(lo, hi)
        queries = lo + np.flatnonzero(~self.old[lo:hi])
        step = max(1, PAIR_CHUNK // (hi - lo))
        for s in range(0, len(queries), step):
            q = queries[s:s + step]
            x = self.h[q][:, None] ^ h[None, :]
            d = np.bitwise_count(x)
            i, j = np.nonzero((d <= self.p.radius) & (after[None, :] > q[:, None]))
            if len(i):
                mine = _first_band(x[i, j], self.p) == self.band
                i, j = i[mine], j[mine]
                yield self.ids[q[i]], self.ids[lo + j], d[i, j]

    def near_buckets(self, data, direct, base):
        """New rows whose band value is within the sub-radius (but not equal) of a value in
        this table: against all the bucket's rows when their own value is lower, else its
        old rows only, so a pair of new rows is compared once."""
        masks = _variant_masks(self.p.widths[self.band], self.p.sub_radius)
        whole = self.lo == 0 and self.hi == (1 << self.p.widths[self.band]) - 1
        for first, h, old in data.chunks():
            q = np.flatnonzero(~old)
            hq = h[q]
            v = _band_value(hq, self.p, self.band)
            found, held = [], 0
            for k, m in enumerate(masks):
                near = v ^ m
                sel = slice(None) if whole else np.flatnonzero(
                    (near >= np.uint64(self.lo)) & (near <= np.uint64(self.hi)))
                near = near[sel]
                if direct is not None:
                    at = near.astype(np.int64)
                    start, stop = direct[at] - base, direct[at + 1] - base
                else:
                    start = np.searchsorted(self.v, near, "left")
                    stop = np.searchsorted(self.v, near, "right")
                lower = near < v[sel]  # the other row queries this pair, unless it is old
                start = np.where(lower, start + self.new_before[stop] - self.new_before[start],
                                 start)
                hit = np.flatnonzero(stop > start)
                found.append((q[sel][hit], start[hit], stop[hit]))
                held += len(hit)
                if held >= PAIR_CHUNK or k == len(masks) - 1:
                    qs, start, stop = (np.concatenate(col) for col in zip(*found))
                    yield from _compare(qs + first, h[qs], start, stop, self)
                    found, held = [], 0


def _compare(q_ids, q_hash, start, stop, table):
    """Yields (ids a, ids b, distances) of the candidates (q_ids[i], table rows start[i] to
    stop[i]) within the radius whose first band within the sub-radius is the table's;
    PAIR_CHUNK candidates at a time."""
    counts = np.maximum(stop - start, 0)
    total = np.cumsum(counts)
    p, done, i = table.p, 0, 0
    while i < len(counts):
        j = max(int(np.searchsorted(total, done + PAIR_CHUNK, "right")), i + 1)
        c = counts[i:j]
        rep = np.repeat(np.arange(i, j), c)
        pos = start[rep] + np.arange(len(rep)) - np.repeat(total[i:j] - c - done, c)
        x = q_hash[rep] ^ table.h[pos]
        d = np.bitwise_count(x)
        keep = np.flatnonzero(d <= p.radius)
        if len(keep):
            keep = keep[_first_band(x[keep], p) == table.band]
            yield q_ids[rep[keep]], table.ids[pos[keep]], d[keep]
        done, i = int(total[j - 1]), j


def _first_band(x, p):
    """Index of the first band where hashes differing by xor `x` are within the sub-radius."""
    counts = np.stack([np.bitwise_count(x & np.uint64(m)) for m in p.masks()])
    return np.argmax(counts <= p.sub_radius, axis=0)


def _variant_masks(width, sub_radius):
    """XOR masks of 1..sub_radius bits within a `width`-bit band value."""
    return np.array([sum(1 << b for b in bits) for d in range(1, sub_radius + 1)
                     for bits in itertools.combinations(range(width), d)], dtype=np.uint64)


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
