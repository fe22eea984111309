"""Exact Hamming-radius join of 64-bit hashes on local disk: every pair of rows within
`radius` bits (except pairs of two old rows), in time near-linear in the rows while the plan
can keep buckets small, and in memory bounded by chunk sizes, not by the rows.

Multi-index hashing: the informative bits (bits constant over all rows are left out: pHash's
top bit is always 1, a band holding it would have half the values) are cut into bands of
about equal entropy. Two hashes within `radius` bits are within the sub-radius
ceil((radius + 1) / bands) - 1 in some band (pigeonhole), so per band the pairs to compare
are those of buckets (equal band values) whose values differ in at most sub-radius bits.
A pair is kept only in the first band where its band values are that close: reported once.

The bands and their count are the plan, chosen by a cost model (dedup/band_plan.py). No
plan keeps both look-ups and compared pairs linear in n forever (the compared pairs are
~n**2 / 2**width per band), so the per-row cost grows slowly with n at large radii
(docs/measurements.md).

Memory: per band, the rows are cut by the top `piece bits` of the band value into pieces of
about TABLE_ROWS rows, each sorted once and kept on disk; a piece's buckets are compared
with the buckets of the pieces its values can reach within the sub-radius (piece P ^ d for
the top parts d of the masks), two pieces in memory at a time. Comparisons run a bucket pair
at a time as blocks of XOR + popcount, bucket pairs of equal sizes batched together,
PAIR_CHUNK hashes at a time.
"""

import itertools
import math
import os

import numpy as np

from beam_pipeline.dedup import band_plan
from beam_pipeline.dedup.band_plan import BITS, Stats, ones, piece_bits, shift_right

SCAN_ROWS = 1 << 16    # hashes read from the spill at a time (0.5 MB)
PAIR_CHUNK = 1 << 18   # candidate pairs (or look-ups) computed at a time (~8 MB of temporaries)
_REC = np.dtype([("h", "<u8"), ("i", "<u8")])  # compressed hash, row id << 1 | old


class Spill:
    """Hashes (uint64) and old flags in row order on local disk, with per-bit counts."""

    def __init__(self, scratch):
        self.scratch = scratch
        self.paths = [os.path.join(scratch, n) for n in ("hashes.u64", "old.u8")]
        self._files = [open(p, "wb") for p in self.paths]
        self.n = self.n_old = 0
        self._ones = np.zeros(BITS, np.int64)

    def add(self, hashes, olds):
        h, old = np.asarray(hashes, np.uint64), np.asarray(olds, np.bool_)
        h.tofile(self._files[0])
        old.tofile(self._files[1])
        self.n += len(h)
        self.n_old += int(old.sum())
        bits = np.unpackbits(h.view(np.uint8).reshape(-1, 8), axis=1, bitorder="little")
        self._ones += bits.sum(0, dtype=np.int64)  # little-endian uint64: byte k = bits 8k..

    def close(self):
        for f in self._files:
            f.close()
        self.hashes = np.memmap(self.paths[0], np.uint64, "r") if self.n else \
            np.zeros(0, np.uint64)
        self.old = np.memmap(self.paths[1], np.bool_, "r") if self.n else np.zeros(0, np.bool_)

    def stats(self):
        return Stats(self.n - self.n_old, self.n_old, tuple(self._ones.tolist()))

    def chunks(self):
        """(first row id, hashes, old flags), SCAN_ROWS rows at a time."""
        for lo in range(0, self.n, SCAN_ROWS):
            yield lo, np.array(self.hashes[lo:lo + SCAN_ROWS]), \
                np.array(self.old[lo:lo + SCAN_ROWS])


def join(spill, p):
    """Yields (ids a, ids b, distances) for every pair within p.radius but old-old pairs."""
    if spill.n - spill.n_old == 0:
        return
    for band in range(len(p.widths)):
        yield from _Band(spill, p, band).pairs()


class _Band:
    def __init__(self, spill, p, band):
        self.p, self.band, self.spill = p, band, spill
        self.width = p.widths[band]
        self.t = piece_bits(self.width, max(spill.n - spill.n_old, spill.n_old))
        self.low = self.width - self.t
        self.prefix = os.path.join(spill.scratch, f"band{band}")

    def pairs(self):
        try:
            has_new = self._cut()
            by_top = _masks_by_top(self.width, self.p.sub_radius, self.low)
            for piece in np.flatnonzero(has_new).tolist():
                new = self._load(piece, "new")
                for d, masks in by_top:
                    other = piece ^ d
                    if d == 0:
                        yield from _join(new, new, masks, self, same=True)
                    elif other > piece:
                        yield from _join(new, self._load(other, "new"), masks, self)
                    if self.spill.n_old:
                        yield from _join(new, self._load(other, "old"), masks, self)
        finally:
            for name in os.listdir(self.spill.scratch):
                if name.startswith(f"band{self.band}-"):
                    os.remove(os.path.join(self.spill.scratch, name))

    def _cut(self):
        """Rows -> one file per piece, then each piece sorted by band value and split into
        new and old rows; returns which pieces hold new rows."""
        pieces = 1 << self.t
        files = {}
        try:
            for first, h, old in self.spill.chunks():
                rec = np.empty(len(h), _REC)
                rec["h"] = self.p.compress(h)
                rec["i"] = (np.arange(first, first + len(h), dtype=np.uint64) << np.uint64(1)) \
                    | old.astype(np.uint64)
                piece = shift_right(self.p.band_value(rec["h"], self.band), self.low).astype(np.int64)
                order = np.argsort(piece, kind="stable")
                bounds = np.concatenate([[0], np.cumsum(np.bincount(piece, minlength=pieces))])
                for k in np.flatnonzero(np.diff(bounds)).tolist():
                    if k not in files:
                        files[k] = open(f"{self.prefix}-{k}.rec", "wb")
                    rec[order[bounds[k]:bounds[k + 1]]].tofile(files[k])
        finally:
            for f in files.values():
                f.close()
        has_new = np.zeros(pieces, np.bool_)
        for k in files:
            path = f"{self.prefix}-{k}.rec"
            rec = np.fromfile(path, _REC)
            os.remove(path)
            rec = rec[np.argsort(self._local(rec["h"]), kind="stable")]
            old = (rec["i"] & np.uint64(1)).astype(np.bool_)
            rec[~old].tofile(f"{self.prefix}-{k}.new")
            rec[old].tofile(f"{self.prefix}-{k}.old")
            has_new[k] = not old.all()
        return has_new

    def _local(self, c):
        return self.p.band_value(c, self.band) & np.uint64(ones(self.low))

    def _load(self, piece, kind):
        path = f"{self.prefix}-{piece}.{kind}"
        rec = np.fromfile(path, _REC) if os.path.exists(path) else np.zeros(0, _REC)
        return _Table(np.ascontiguousarray(rec["h"]), rec["i"] >> np.uint64(1),
                      self._local(rec["h"]), self.low)


class _Table:
    """Rows of one piece sorted by local band value: their buckets (value, start, count)."""

    def __init__(self, h, ids, v, low):
        self.h, self.ids = h, ids
        edge = np.flatnonzero(v[1:] != v[:-1]) + 1 if len(v) else np.zeros(0, np.int64)
        self.starts = np.concatenate([[0], edge]).astype(np.int64) if len(v) else edge
        self.counts = np.diff(np.concatenate([self.starts, [len(v)]])).astype(np.int64)
        self.values = v[self.starts]
        self.direct = None
        if low <= band_plan.DIRECT_BITS and len(v):
            self.direct = np.full(1 << low, -1, np.int32)
            self.direct[self.values.astype(np.int64)] = np.arange(len(self.values))

    def bucket(self, values):
        """Bucket index of each value, -1 where there is none."""
        if self.direct is not None:
            return self.direct[values.astype(np.int64)]
        at = np.searchsorted(self.values, values)
        found = at < len(self.values)
        found[found] = self.values[at[found]] == values[found]
        return np.where(found, at, -1)


def _masks_by_top(width, sub_radius, low):
    """[(top part d, low parts)] of the XOR masks of at most sub_radius bits in a band."""
    masks = [sum(1 << b for b in bits) for k in range(min(sub_radius, width) + 1)
             for bits in itertools.combinations(range(width), k)]
    groups = {}
    for m in masks:
        groups.setdefault(m >> low, []).append(m & ones(low))
    return [(d, np.array(v, np.uint64)) for d, v in sorted(groups.items())]


def _join(a, b, masks, band, same=False):
    """Pairs between table a's buckets and b's buckets whose values differ by a mask; `same`
    (a is b): each unordered bucket pair once (the lower value looks up the higher: the
    mask's top bit is 0 in it), and the pairs within a bucket."""
    if not len(a.values) or not len(b.values):
        return
    if same:
        yield from _compare_within(a, band)
        masks = masks[masks != 0]
    top = np.zeros(len(masks), np.int64) if not same else \
        np.floor(np.log2(masks.astype(np.float64))).astype(np.int64)
    pa, pb, held, rows = [], [], 0, 0
    for bit in np.unique(top).tolist():
        group = masks[top == bit]
        src = np.flatnonzero((a.values >> np.uint64(bit)) & np.uint64(1) == 0) if same \
            else np.arange(len(a.values))
        step = max(1, PAIR_CHUNK // max(1, len(src)))
        for lo in range(0, len(group), step):
            target = (a.values[src][None, :] ^ group[lo:lo + step, None]).ravel()
            hit = b.bucket(target)
            keep = np.flatnonzero(hit >= 0)
            pa.append(src[keep % len(src)])
            pb.append(hit[keep])
            rows += len(keep)
            held += int((a.counts[pa[-1]] * b.counts[pb[-1]]).sum())
            if held >= 4 * PAIR_CHUNK or rows >= PAIR_CHUNK:
                yield from _compare(a, np.concatenate(pa), b, np.concatenate(pb), band)
                pa, pb, held, rows = [], [], 0, 0
    if held:
        yield from _compare(a, np.concatenate(pa), b, np.concatenate(pb), band)


def _compare(a, ka, b, kb, band):
    """Bucket pairs (a's bucket ka[i], b's bucket kb[i]) compared as blocks, pairs of
    buckets of equal sizes together: hashes laid out [row in a][row in b][pair]."""
    if not len(ka):
        return
    ca, cb = a.counts[ka], b.counts[kb]
    key = ca * (int(cb.max()) + 1) + cb
    order = np.argsort(key.astype(np.uint16) if key.max() < 1 << 16 else key, kind="stable")
    ka, kb, ca, cb = ka[order], kb[order], ca[order], cb[order]
    edge = np.flatnonzero((ca[1:] != ca[:-1]) | (cb[1:] != cb[:-1])) + 1
    for lo, hi in zip(np.concatenate([[0], edge]).tolist(),
                      np.concatenate([edge, [len(ka)]]).tolist()):
        na, nb = int(ca[lo]), int(cb[lo])
        if na * nb > PAIR_CHUNK:
            for k in range(lo, hi):
                yield from _compare_big(a, int(a.starts[ka[k]]), na, b, int(b.starts[kb[k]]),
                                        nb, band=band)
            continue
        step = max(1, PAIR_CHUNK // (na * nb))
        for s in range(lo, hi, step):
            ia = np.arange(na)[:, None] + a.starts[ka[s:min(s + step, hi)]]
            ib = np.arange(nb)[:, None] + b.starts[kb[s:min(s + step, hi)]]
            x = a.h[ia][:, None, :] ^ b.h[ib][None, :, :]
            d = np.bitwise_count(x).ravel()
            at = np.flatnonzero(d <= band.p.radius)
            if len(at):
                i, j, k = np.unravel_index(at, x.shape)
                yield from _kept(a.ids[ia[i, k]], b.ids[ib[j, k]], x.ravel()[at], d[at], band)


def _compare_within(t, band):
    """The pairs within each bucket of table t (i < j)."""
    big = np.flatnonzero(t.counts > 1)
    if not len(big):
        return
    sizes = t.counts[big]
    order = np.argsort(sizes, kind="stable")
    big, sizes = big[order], sizes[order]
    edge = np.flatnonzero(sizes[1:] != sizes[:-1]) + 1
    for lo, hi in zip(np.concatenate([[0], edge]).tolist(),
                      np.concatenate([edge, [len(big)]]).tolist()):
        n = int(sizes[lo])
        if n * n > PAIR_CHUNK:
            for k in range(lo, hi):
                s = int(t.starts[big[k]])
                yield from _compare_big(t, s, n, t, s, n, band=band, same=True)
            continue
        upper = np.triu(np.ones((n, n), np.bool_), 1)
        step = max(1, PAIR_CHUNK // (n * n))
        for s in range(lo, hi, step):
            ix = t.starts[big[s:min(s + step, hi)], None] + np.arange(n)
            hx = t.h[ix]
            x = hx[:, :, None] ^ hx[:, None, :]
            d = np.bitwise_count(x)
            k, i, j = np.nonzero((d <= band.p.radius) & upper)
            yield from _kept(t.ids[ix[k, i]], t.ids[ix[k, j]], x[k, i, j], d[k, i, j], band)


def _compare_big(a, sa, na, b, sb, nb, *, band, same=False):
    """One large bucket pair as tiles of a distance matrix (same: one bucket, i < j)."""
    side = max(1, math.isqrt(PAIR_CHUNK))
    for i0 in range(0, na, side):
        for j0 in range(i0 if same else 0, nb, side):
            ha, hb = a.h[sa + i0:sa + min(na, i0 + side)], b.h[sb + j0:sb + min(nb, j0 + side)]
            x = ha[:, None] ^ hb[None, :]
            d = np.bitwise_count(x)
            keep = d <= band.p.radius
            if same:
                keep &= (i0 + np.arange(len(ha)))[:, None] < (j0 + np.arange(len(hb)))[None, :]
            i, j = np.nonzero(keep)
            yield from _kept(a.ids[sa + i0 + i], b.ids[sb + j0 + j], x[i, j], d[i, j], band)


def _kept(ids_a, ids_b, x, d, band):
    """The pairs whose first band within the sub-radius is this one."""
    if len(x):
        counts = np.stack([np.bitwise_count(x & np.uint64(m)) for m in band.p.masks()])
        mine = np.argmax(counts <= band.p.sub_radius, axis=0) == band.band
        if mine.any():
            yield ids_a[mine], ids_b[mine], d[mine]
