"""Near-duplicate groups: every pair of stored images whose perceptual hashes differ in at most
`radius` bits, without comparing everything with everything and without holding the catalog.

The rows go to local disk once (hashes as uint64, keys as text lines); the exact join of the
hashes (dedup/multi_index.py: multi-index hashing, a band plan chosen for the number of rows,
sorted band pieces on disk) yields row ids of pairs, and keys are read back only for those.

Two hashes per image (whole and central 90%, dedup/perceptual.phash_pair): a row's `center`
goes to the join as a second hash of the same row; a pair's distance is the least of its
(up to four) hash pairs, a row never pairs with itself, and each pair of rows is yielded once.

Incremental: rows are `old` (already in the previous catalog, grouped before) or new; only new
rows look for partners, so a nightly run costs the new rows' buckets, not the catalog's.

near_duplicates.jsonl, one group per line, groups ordered by their first key:

    {"keys": ["a.jpg", "b.jpg"], "splits": ["train", "test"], "distances": [[0, 1, 6]]}

`keys` sorted; `splits[i]` is the split of `keys[i]`; `distances` the verified pairs
[i, j, hamming bits] (i < j, indices into `keys`) that joined the group - near-duplication is
not transitive, so a group is the connected set, and a pair not listed may be further apart.
"""

import dataclasses
import json
import os
import tempfile

import numpy as np

from beam_pipeline.dedup import multi_index

BITS = 64
DEFAULT_RADIUS = 10  # chosen by measurement (docs/measurements.md): launcher/flags.py agrees
_U64 = (1 << BITS) - 1


@dataclasses.dataclass(frozen=True, slots=True)  # slots: one per found row, ~1/5 the memory
class Row:
    key: str
    split: str
    hash: int          # unsigned 64-bit (a signed int64 from a catalog column is accepted)
    old: bool = False  # in the previous catalog: never compared with another old row
    center: int | None = None  # a second hash (the central 90%'s); None: the whole one only


@dataclasses.dataclass(frozen=True, order=True, slots=True)
class Pair:
    a: int             # indices into the group's keys, a < b
    b: int
    distance: int


@dataclasses.dataclass(frozen=True, slots=True)
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


def find_pairs(rows, radius=DEFAULT_RADIUS, bands=None, directory=None):
    """Yields (row a, row b, distance) for every pair within `radius`, except old-old pairs;
    `bands` None: the band count of lowest estimated cost for these rows
    (multi_index.choose_plan). The scratch files live in a temporary directory under
    `directory`."""
    if not 0 <= radius < BITS:
        raise ValueError(f"radius must be in 0..{BITS - 1}, not {radius}")
    with tempfile.TemporaryDirectory(prefix="near-duplicates-", dir=directory) as scratch:
        data = _Spilled(rows, scratch)
        p = multi_index.choose_plan(radius, data.spill.stats(), bands)
        found = [data.of_rows(*f) for f in multi_index.join(data.spill, p)]
        if not found:
            return
        a, b, d = _least((np.concatenate(col) for col in zip(*found)), data.two)
        if not len(a):
            return
        rows_by_id = data.rows(np.unique(np.concatenate([a, b])))
        for i, j, dist in zip(a.tolist(), b.tolist(), d.tolist()):
            yield rows_by_id[i], rows_by_id[j], dist


def _least(columns, two):
    """Pairs of rows (a < b) once each, at the least distance any of their hashes gave."""
    a, b, d = columns
    if not two or not len(a):  # none left once each row's pairs with itself are dropped
        return a, b, d
    a, b = np.minimum(a, b), np.maximum(a, b)
    order = np.lexsort((d, b, a))
    a, b, d = a[order], b[order], d[order]
    first = np.concatenate([[True], (a[1:] != a[:-1]) | (b[1:] != b[:-1])])
    return a[first], b[first], d[first]


class _Spilled:
    """The rows on local disk: hashes and old flags (multi_index.Spill), and one line per row
    "key<TAB>split" (tab, newline and backslash escaped), read back only for found pairs.
    With second hashes, `owner` maps each spilled hash to its row (hash ids ascending)."""

    def __init__(self, rows, scratch):
        self.spill = multi_index.Spill(scratch)
        self.keys_path = os.path.join(scratch, "keys.txt")
        self.owner_path = os.path.join(scratch, "owner.u64")
        self.two, self.n = False, 0
        with open(self.keys_path, "w", encoding="utf-8", errors="surrogatepass",
                  newline="\n") as kf, open(self.owner_path, "wb") as of:
            hashes, olds, owners, lines, splits = [], [], [], [], {}
            add_hash, add_old, add_owner, add_line = (hashes.append, olds.append, owners.append,
                                                      lines.append)
            chunk = multi_index.SCAN_ROWS
            for row in rows:  # ~1.5 us a row: the spill is linear in the catalog
                add_hash(row.hash & _U64)
                add_old(row.old)
                add_owner(self.n)
                if row.center is not None:
                    add_hash(row.center & _U64)
                    add_old(row.old)
                    add_owner(self.n)
                self.n += 1
                key, split = row.key, row.split
                if "\\" in key or "\t" in key or "\n" in key:
                    key = _escape(key)
                if split not in splits:
                    splits[split] = _escape(split)
                add_line(f"{key}\t{splits[split]}\n")
                if len(hashes) >= chunk:
                    self._flush(hashes, olds, owners, lines, kf, of)
            self._flush(hashes, olds, owners, lines, kf, of)
        self.spill.close()
        self.two = self.spill.n > self.n
        self.owner = np.memmap(self.owner_path, np.uint64, "r") if self.two else None

    def _flush(self, hashes, olds, owners, lines, kf, of):
        if hashes:
            self.spill.add(hashes, olds)
            np.asarray(owners, np.uint64).tofile(of)
            kf.write("".join(lines))
        for buf in (hashes, olds, owners, lines):
            buf.clear()

    def of_rows(self, a, b, d):
        """Hash ids of found pairs -> row ids, a row's pairs with itself dropped."""
        if not self.two:
            return a, b, d
        a, b = self.owner[a.astype(np.int64)], self.owner[b.astype(np.int64)]
        other = a != b
        return a[other], b[other], d[other]

    def rows(self, ids):
        """{row id: Row} for the sorted unique `ids`, in one pass over the keys file (hashes
        gathered for all of them at once: per-row memmap reads cost ~5 us each)."""
        ids = ids.astype(np.int64)
        first = np.searchsorted(self.owner, ids).astype(np.int64) if self.two else ids
        hashes = self.spill.hashes[first].tolist()
        olds = self.spill.old[first].tolist()
        centers = [None] * len(ids)
        if self.two:
            after = np.minimum(first + 1, self.spill.n - 1)
            has = (first + 1 < self.spill.n) & (self.owner[after] == ids.astype(np.uint64))
            centers = [c if k else None
                       for c, k in zip(self.spill.hashes[after].tolist(), has.tolist())]
        out, wanted = {}, enumerate(ids.tolist())
        at, nxt = next(wanted)
        with open(self.keys_path, encoding="utf-8", errors="surrogatepass",
                  newline="\n") as f:
            for i, line in enumerate(f):
                if i == nxt:
                    key, split = (_unescape(s) for s in line[:-1].split("\t"))
                    out[i] = Row(key, split, hashes[at], olds[at], centers[at])
                    at, nxt = next(wanted, (None, None))
                    if nxt is None:
                        break
        return out


_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n"}
_UNESCAPES = {"\\": "\\", "t": "\t", "n": "\n"}


def _escape(text):
    return "".join(_ESCAPES.get(c, c) for c in text)


def _unescape(text):
    if "\\" not in text:
        return text
    out, chars = [], iter(text)
    for c in chars:
        out.append(_UNESCAPES[next(chars)] if c == "\\" else c)
    return "".join(out)


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
        pairs = []  # sorted as tuples: Pair's generated __lt__ costs ~10x more
        for a, b, d in group_edges[r]:
            i, j = index[a], index[b]
            pairs.append((i, j, d) if i < j else (j, i, d))
        pairs.sort()
        groups.append(Group(tuple(keys), tuple(split[k] for k in keys),
                            tuple(Pair(*p) for p in pairs)))
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
