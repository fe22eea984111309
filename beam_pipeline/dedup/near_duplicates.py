"""Near-duplicate pairs: every pair of stored images whose perceptual hashes differ in at most
`radius` bits (the candidates), confirmed by a second, independent descriptor
(dedup/descriptor.py), without comparing everything with everything and without holding the
catalog.

The rows go to local disk once (hashes as uint64, descriptors as fixed-size records, keys as
text lines); the exact join of the hashes (dedup/multi_index.py: multi-index hashing, a band
plan chosen for the number of rows, sorted band pieces on disk) yields row ids of candidate
pairs, and keys and descriptors are read back only for those. A candidate is confirmed when
the descriptors agree (structure and colour): the hash proposes, the descriptor disposes. On
the benchmark's hard negatives (smooth gradients, discs on black, textures, flat fields) the
hash alone paired unrelated images (docs/near_duplicates.md).

Seven hashes per image: the whole and central 90% (dedup/perceptual.phash_pair; a row's
`center`), the four 95% corner crops its descriptor carries (descriptor.probes) and one
made here from its stored thumbnail's central 85% (descriptor.thumbnail_probes, batched as
the rows are spilled; none for a flat thumbnail, or a descriptor without stored probes).
All go to the join as hashes of the same row; a pair's distance is the least of its (up to
49) hash pairs, a row never pairs with itself, and each pair of rows is yielded once. Rows
from catalogs written before the corner or centre hashes take part with the hashes they
have.

Incremental: rows are `old` (already in the previous catalog, paired before) or new; only new
rows look for partners, so a nightly run costs the new rows' buckets, not the catalog's.

near_duplicates.jsonl lists the confirmed pairs, one a line, ordered by their keys:

    {"keys": ["a.jpg", "b.jpg"], "splits": ["train", "test"], "hash_distance": 6,
     "structure": 0.031, "chroma": 0.8}

near_duplicates_rejected.jsonl lists the other candidates in the same form, with "why". Pairs,
not groups: near-duplication is not transitive, so every report and the leak rule act on
measured pairs; `components` (connected sets of confirmed pairs) serve only the summary.
"""

import dataclasses
import itertools
import json
import os
import tempfile

import numpy as np

from beam_pipeline import defaults
from beam_pipeline.dedup import band_plan, descriptor, multi_index

BITS = 64
DEFAULT_RADIUS = defaults.NEAR_DUPLICATE_RADIUS
_U64 = (1 << BITS) - 1


@dataclasses.dataclass(frozen=True, slots=True)  # slots: one per found row, ~1/5 the memory
class Row:
    key: str
    split: str
    hash: int          # unsigned 64-bit (a signed int64 from a catalog column is accepted)
    old: bool = False  # in the previous catalog: never compared with another old row
    center: int | None = None  # a second hash (the central 90%'s); None: the whole one only
    descriptor: bytes | None = None  # dedup/descriptor.py's; None: a catalog from before it


@dataclasses.dataclass(frozen=True, slots=True)
class NearPair:
    """One candidate pair and the descriptor's verdict on it."""

    keys: tuple            # (a, b), a < b
    splits: tuple          # their splits, in the same order
    hash_distance: int     # the least Hamming distance of their hashes
    structure: float | None = None  # job/descriptor.distances; None: a row has no descriptor
    chroma: float | None = None
    confirmed: bool = False
    mean_colour: bool = False  # chroma of the whole means (a descriptor without the grid)

    @property
    def why(self):
        """Why a candidate was not confirmed ("" when it was): each measure past its limit,
        with its value and the limit, e.g. "structure differs (0.3412 > 0.31)"."""
        return "" if self.confirmed else self.reason()

    def reason(self, max_structure=None, max_chroma=None, max_mean_chroma=None):
        """`why`, against the given limits (default: the descriptor's; a version records
        the ones it was built with)."""
        if self.structure is None:
            return "no descriptor (a catalog row from before it)"
        over = [f"{name} differs ({value:g} > {limit:g})" for name, value, limit in (
            ("structure", self.structure, max_structure or descriptor.MAX_STRUCTURE),
            ("colour", self.chroma, self._chroma_limit(max_chroma, max_mean_chroma)))
            if value > limit]
        return ", ".join(over) or "within the limits"

    def excess(self, max_structure=None, max_chroma=None, max_mean_chroma=None):
        """How far the pair is past the limits (default: the descriptor's), as the larger of
        its measures' ratios to their limits: <= 1 confirms, just over 1 is a borderline
        rejection; None without a descriptor."""
        if self.structure is None:
            return None
        return max(self.structure / (max_structure or descriptor.MAX_STRUCTURE),
                   self.chroma / self._chroma_limit(max_chroma, max_mean_chroma))

    def _chroma_limit(self, max_chroma, max_mean_chroma):
        """The colour limit this pair's chroma is held to: of the whole means without the
        grid (a version from before it recorded only `max_chroma`, of the means)."""
        if self.mean_colour:
            return max_mean_chroma or descriptor.MAX_MEAN_CHROMA
        return max_chroma or descriptor.MAX_CHROMA

    @property
    def spans_splits(self):
        return self.splits[0] != self.splits[1]

    def leak(self, train="train"):
        """The evaluation key of a confirmed pair with a train image, else None."""
        if self.confirmed and self.spans_splits and train in self.splits:
            return self.keys[1] if self.splits[0] == train else self.keys[0]
        return None

    def to_json(self, excluded=()):
        """One near_duplicates(_rejected).jsonl line; `excluded`: keys left out of the version."""
        line = {"keys": list(self.keys), "splits": list(self.splits),
                "hash_distance": self.hash_distance,
                "structure": self.structure, "chroma": self.chroma}
        if self.mean_colour:
            line["mean_colour"] = True
        if not self.confirmed:
            line["why"] = self.why
        if excluded:
            line["excluded"] = list(excluded)
        return json.dumps(line)

    @classmethod
    def from_json(cls, line):
        d = json.loads(line)
        return cls(tuple(d["keys"]), tuple(d["splits"]), d["hash_distance"], d["structure"],
                   d["chroma"], "why" not in d, d.get("mean_colour", False))


def _verdicts(candidates):
    """[(row a, row b, hash distance)] -> [NearPair], the descriptors compared in one batch."""
    both = [k for k, (a, b, _) in enumerate(candidates)
            if a.descriptor is not None and b.descriptor is not None]
    da, db = ([candidates[k][side].descriptor for k in both] for side in (0, 1))
    structure, chroma = descriptor.distances(da, db)
    grid = descriptor.gridded(da, db)
    ok = descriptor.confirmed(structure, chroma, grid)
    # rounded as the files keep them, so a pair read back equals the pair measured
    measured = {k: (max(round(s, 4), 0.0), round(c, 2), o, not g)
                for k, s, c, o, g in zip(both, structure.tolist(), chroma.tolist(), ok.tolist(),
                                         grid.tolist())}
    out = []
    for k, (a, b, d) in enumerate(candidates):
        if b.key < a.key:
            a, b = b, a
        out.append(NearPair((a.key, b.key), (a.split, b.split), d,
                            *measured.get(k, (None, None, False, False))))
    return out


PROBE_BATCH = 1024  # rows whose thumbnail probes are made at once (one batched product)
CONFIRM_BATCH = 1024  # candidate pairs compared at once: <= 2,048 images' 49 windows, ~58 MB


def near_pairs(rows, radius=DEFAULT_RADIUS, bands=None, directory=None, known=(), on_plan=None):
    """Every candidate pair (`find_pairs`) with the descriptor's verdict, ordered by keys.

    `known`: NearPairs an earlier run measured between two old rows (its
    near_duplicates(_rejected).jsonl); kept, with the rows' current splits, when both keys
    are still old rows and the pair is within `radius`.
    """
    known = list(known)
    wanted, old_split = {k for p in known for k in p.keys}, {}

    def noting_old(rows):
        for r in rows:
            if r.old and r.key in wanted:
                old_split[r.key] = r.split
            yield r

    out, batch = [], []
    for candidate in find_pairs(noting_old(rows), radius, bands, directory, on_plan):
        batch.append(candidate)
        if len(batch) >= CONFIRM_BATCH:
            out.extend(_verdicts(batch))
            batch = []
    out.extend(_verdicts(batch))
    for p in known:  # find_pairs has read every row by now
        if all(k in old_split for k in p.keys) and p.hash_distance <= radius:
            out.append(dataclasses.replace(p, splits=tuple(old_split[k] for k in p.keys)))
    return sorted(out, key=lambda p: p.keys)


def closest_rejected(pairs, n, max_structure=None, max_chroma=None, max_mean_chroma=None):
    """The `n` rejected cross-split pairs nearest to being confirmed (least `excess` over the
    given limits, the build's), for a user to judge a borderline case; pairs without a
    descriptor last."""
    rejected = [p for p in pairs if not p.confirmed and p.spans_splits]
    return sorted(rejected, key=lambda p: (p.structure is None,
                                           p.excess(max_structure, max_chroma,
                                                    max_mean_chroma) or 0.0,
                                           p.hash_distance, p.keys))[:max(n, 0)]


def components(pairs):
    """The connected sets of keys of the confirmed pairs (for the summary: near-duplication
    is not transitive, so a component is not a set of mutual near-duplicates)."""
    parent = {}

    def root(k):
        parent.setdefault(k, k)
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for p in pairs:
        if p.confirmed:
            ra, rb = root(p.keys[0]), root(p.keys[1])
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
    members = {}
    for k in list(parent):
        members.setdefault(root(k), []).append(k)
    return sorted(tuple(sorted(m)) for m in members.values())


def find_pairs(rows, radius=DEFAULT_RADIUS, bands=None, directory=None, on_plan=None):
    """Yields (row a, row b, distance) for every pair within `radius`, except old-old pairs;
    `bands` None: the plan band_plan.choose_plan picks for these rows (past its budget,
    a multi-probe plan: exact to plan.exact_radius, pairs beyond found in part). `on_plan`
    is called with the plan. The scratch files live in a temporary directory under
    `directory`."""
    if not 0 <= radius < BITS:
        raise ValueError(f"radius must be in 0..{BITS - 1}, not {radius}")
    with tempfile.TemporaryDirectory(prefix="near-duplicates-", dir=directory) as scratch:
        data = _Spilled(rows, scratch)
        p = band_plan.choose_plan(radius, data.spill.stats(), bands)
        if on_plan:
            on_plan(p)
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
    "key<TAB>split" (tab, newline and backslash escaped), and one descriptor record per row
    (descriptor.SIZE bytes and a presence byte), read back only for found pairs.
    With second hashes, `owner` maps each spilled hash to its row (hash ids ascending)."""

    def __init__(self, rows, scratch):
        self.spill = multi_index.Spill(scratch)
        self.keys_path = os.path.join(scratch, "keys.txt")
        self.owner_path = os.path.join(scratch, "owner.u64")
        self.desc_path = os.path.join(scratch, "descriptors.bin")
        self.two, self.n = False, 0
        with open(self.keys_path, "w", encoding="utf-8", errors="surrogatepass",
                  newline="\n") as kf, open(self.owner_path, "wb") as of, \
                open(self.desc_path, "wb") as df:
            hashes, olds, owners, lines, splits, descs = [], [], [], [], {}, []
            add_hash, add_old, add_owner, add_line = (hashes.append, olds.append, owners.append,
                                                      lines.append)
            chunk = multi_index.SCAN_ROWS
            rows = iter(rows)
            while batch := list(itertools.islice(rows, PROBE_BATCH)):
                made = descriptor.thumbnail_probes([r.descriptor for r in batch])
                for row, thumb in zip(batch, made):  # ~1.5 us a row: linear in the catalog
                    add_hash(row.hash & _U64)
                    add_old(row.old)
                    add_owner(self.n)
                    d = row.descriptor
                    for extra in ((row.center,) if row.center is not None else ()) + \
                            descriptor.probes(d) + ((thumb,) if thumb is not None else ()):
                        add_hash(extra & _U64)
                        add_old(row.old)
                        add_owner(self.n)
                    self.n += 1
                    key, split = row.key, row.split
                    if "\\" in key or "\t" in key or "\n" in key:
                        key = _escape(key)
                    if split not in splits:
                        splits[split] = _escape(split)
                    add_line(f"{key}\t{splits[split]}\n")
                    descs.append(_record(d))
                    if len(hashes) >= chunk:
                        self._flush(hashes, olds, owners, lines, kf, of)
                        df.write(b"".join(descs))
                        descs.clear()
            self._flush(hashes, olds, owners, lines, kf, of)
            df.write(b"".join(descs))
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
        with open(self.desc_path, "rb") as f:  # read, not mapped: a map's fault-around
            fd = f.fileno()                    # pulled the whole file into RSS
            descs = [_descriptor(os.pread(fd, _DESC_RECORD, i * _DESC_RECORD))
                     for i in ids.tolist()]
        centers = [None] * len(ids)
        if self.two:  # a row's hashes: whole, its centre if it has one, its stored probes,
            # then the one made from its thumbnail (if any)
            count = np.searchsorted(self.owner, ids, "right").astype(np.int64) - first
            after = np.minimum(first + 1, self.spill.n - 1)
            made = [int(t is not None) for t in descriptor.thumbnail_probes(descs)]
            centers = [c if k - len(descriptor.probes(d)) - m == 2 else None
                       for c, k, d, m in zip(self.spill.hashes[after].tolist(), count.tolist(),
                                             descs, made)]
        out, wanted = {}, enumerate(ids.tolist())
        at, nxt = next(wanted)
        with open(self.keys_path, encoding="utf-8", errors="surrogatepass",
                  newline="\n") as f:
            for i, line in enumerate(f):
                if i == nxt:
                    key, split = (_unescape(s) for s in line[:-1].split("\t"))
                    out[i] = Row(key, split, hashes[at], olds[at], centers[at], descs[at])
                    at, nxt = next(wanted, (None, None))
                    if nxt is None:
                        break
        return out


_DESC_RECORD = 1 + descriptor.SIZE  # its form (_FORMS), then the descriptor, right-aligned
_FORMS = {descriptor.SIZE: 1, descriptor.CONFIRM_SIZE: 2,  # 0: none (or of no known size)
          descriptor.PROBED_SIZE: 3}
_SIZES = {form: size for size, form in _FORMS.items()}
_NO_DESCRIPTOR = bytes(_DESC_RECORD)


def _record(d):
    form = _FORMS.get(len(d)) if d is not None else None
    return bytes([form]) + bytes(descriptor.SIZE - len(d)) + d if form else _NO_DESCRIPTOR


def _descriptor(record):
    size = _SIZES.get(record[0])
    return bytes(record[-size:]) if size else None


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


def read_pairs(lines):
    """near_duplicates(_rejected).jsonl lines -> NearPairs. Lines of the earlier group form
    (a "distances" field) give none: their pairs were never confirmed, so a build after one
    compares every row again."""
    for line in lines:
        if line.strip() and '"distances"' not in line:
            yield NearPair.from_json(line)
