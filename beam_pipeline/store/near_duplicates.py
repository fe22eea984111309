"""Near-duplicate groups: every pair of stored images whose perceptual hashes differ in at most
`radius` bits, without comparing everything with everything and without holding the catalog.

The rows go to local disk once (hashes as uint64, keys as text lines); the exact join of the
hashes (store/multi_index.py: multi-index hashing, a band plan chosen for the number of rows,
sorted band pieces on disk) yields row ids of pairs, and keys are read back only for those.

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

from beam_pipeline.store import multi_index

BITS = 64
DEFAULT_RADIUS = 10  # chosen by measurement (README, Measured): launcher/flags.py agrees
_U64 = (1 << BITS) - 1


@dataclasses.dataclass(frozen=True, slots=True)  # slots: one per found row, ~1/5 the memory
class Row:
    key: str
    split: str
    hash: int          # unsigned 64-bit (a signed int64 from a catalog column is accepted)
    old: bool = False  # in the previous catalog: never compared with another old row


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
        found = list(multi_index.join(data.spill, p))
        if not found:
            return
        a, b, d = (np.concatenate(col) for col in zip(*found))
        rows_by_id = data.rows(np.unique(np.concatenate([a, b])))
        for i, j, dist in zip(a.tolist(), b.tolist(), d.tolist()):
            yield rows_by_id[i], rows_by_id[j], dist


class _Spilled:
    """The rows on local disk: hashes and old flags (multi_index.Spill), and one line per row
    "key<TAB>split" (tab, newline and backslash escaped), read back only for found pairs."""

    def __init__(self, rows, scratch):
        self.spill = multi_index.Spill(scratch)
        self.keys_path = os.path.join(scratch, "keys.txt")
        with open(self.keys_path, "w", encoding="utf-8", errors="surrogatepass",
                  newline="\n") as kf:
            hashes, olds, lines = [], [], []
            for row in rows:
                hashes.append(row.hash & _U64)
                olds.append(row.old)
                lines.append(f"{_escape(row.key)}\t{_escape(row.split)}\n")
                if len(hashes) >= multi_index.SCAN_ROWS:
                    self._flush(hashes, olds, lines, kf)
            self._flush(hashes, olds, lines, kf)
        self.spill.close()

    def _flush(self, hashes, olds, lines, kf):
        if hashes:
            self.spill.add(hashes, olds)
            kf.write("".join(lines))
        for buf in (hashes, olds, lines):
            buf.clear()

    def rows(self, ids):
        """{row id: Row} for the sorted unique `ids`, in one pass over the keys file."""
        out, wanted = {}, iter(ids.tolist())
        nxt = next(wanted)
        with open(self.keys_path, encoding="utf-8", errors="surrogatepass",
                  newline="\n") as f:
            for i, line in enumerate(f):
                if i == nxt:
                    key, split = (_unescape(s) for s in line[:-1].split("\t"))
                    h, old = int(self.spill.hashes[i]), bool(self.spill.old[i])
                    out[i] = Row(key, split, h, old)
                    nxt = next(wanted, None)
                    if nxt is None:
                        break
        return out


_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n"}
_UNESCAPES = {"\\": "\\", "t": "\t", "n": "\n"}


def _escape(text):
    if "\\" in text or "\t" in text or "\n" in text:
        return "".join(_ESCAPES.get(c, c) for c in text)
    return text


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
