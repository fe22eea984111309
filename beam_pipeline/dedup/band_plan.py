"""The plan of the Hamming-radius join (dedup/multi_index.py): which bits make each band, and
the band count of lowest estimated cost for these rows.

Cost per band, n rows: bucket look-ups ~ buckets * V(width, sub-radius) (values within the
sub-radius, at most 2**width buckets) plus compared pairs ~ n**2 / 2 * P(band within the
sub-radius) ~ n**2 * V / 2**(width + 1). Wide bands cost look-ups, narrow ones comparisons;
`choose_plan` picks the band count whose estimate (the bits' measured frequencies, the
constants below) is lowest for this n. Pure arithmetic: no files, no hashes.
"""

import dataclasses
import itertools
import math

import numpy as np

BITS = 64
TABLE_ROWS = 1 << 16   # rows of one band piece in memory (~1.5 MB with its indexes)
DIRECT_BITS = 20       # pieces with values this wide or narrower find buckets by offset table
MAX_PIECE_BITS = 10    # at most 1024 piece files per band (open at once while cutting)
MAX_VALUES = 1 << 20   # band values within the sub-radius a plan may enumerate per band
# Seconds per unit, fitted on runs of 50k-400k rows on the loaded 2-core machine of docs/measurements.md's
# figures (only their ratios choose the plan): one bucket look-up, one pair of non-empty
# buckets compared, one compared pair of rows, one row per band (cut, sort, write, read).
COST_LOOKUP = 11e-9
COST_BUCKETS = 62e-9
COST_PAIR = 13e-9
COST_ROW = 540e-9
COST_PIECE_JOIN = 300e-6  # one piece's buckets against one other piece (load, index, calls)
COST_OFFSET = 1e-9        # one entry of a piece's offset table
SEARCH_FACTOR = 10        # a look-up by binary search instead of offset table
# Estimated join seconds per spilled hash that exact search may cost before a multi-probe
# plan replaces it. Exact radius-8 search over six hashes an image costs this at ~450k
# images and grows with n (compared pairs ~ n**2 per band); past it, a plan with a smaller
# sub-radius keeps the cost and gives up the pairs beyond its exact radius that no band
# holds within it (docs/near_duplicates.md: the benchmark's recall under such plans).
BUDGET = 20e-6
BUDGET_FLOOR = 2.0  # estimated seconds any search may take: a small catalog is searched exactly


def ones(width):
    return (1 << width) - 1


def shift_right(x, s):
    return x >> np.uint64(s) if s < BITS else np.zeros_like(x)


@dataclasses.dataclass(frozen=True)
class Plan:
    """Bands over the compressed hash (the informative bits, `runs` of (shift, width) of
    the original, packed LSB first): band i is its bits [starts[i], starts[i] + widths[i])."""
    radius: int
    widths: tuple
    runs: tuple = ((0, BITS),)
    probe: int | None = None  # a sub-radius below the pigeonhole one: multi-probe, not exact

    @property
    def sub_radius(self):
        exact = -(-(self.radius + 1) // len(self.widths)) - 1
        return exact if self.probe is None else min(self.probe, exact)

    @property
    def exact_radius(self):
        """Every pair within this many bits is found; beyond it (up to `radius`) a pair is
        found when some band differs in at most the sub-radius (`found_share`)."""
        return min(self.radius, (self.sub_radius + 1) * len(self.widths) - 1)

    @property
    def starts(self):
        return tuple(itertools.accumulate((0,) + self.widths[:-1]))

    def masks(self):
        return [ones(w) << s for w, s in zip(self.widths, self.starts)]

    def compress(self, h):
        if self.runs == ((0, BITS),):
            return h
        out, dst = np.zeros_like(h), 0
        for src, width in self.runs:
            out |= (shift_right(h, src) & np.uint64(ones(width))) << np.uint64(dst)
            dst += width
        return out

    def band_value(self, c, band):
        return shift_right(c, self.starts[band]) & np.uint64(ones(self.widths[band]))


@dataclasses.dataclass(frozen=True)
class Stats:
    """What the plan is chosen from: rows new and old, and how often each bit is 1."""
    new: int
    old: int
    ones: tuple  # 64 counts, bit 0 = LSB

    @property
    def rows(self):
        return self.new + self.old

    def informative(self):
        """Bit positions not constant over the rows, LSB first."""
        return [b for b in range(BITS) if 0 < self.ones[b] < self.rows]


def _runs(bits):
    runs = []
    for b in bits:
        if runs and runs[-1][0] + runs[-1][1] == b:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((b, 1))
    return tuple(runs)


def _entropy(p):
    p = min(max(p, 1e-12), 1 - 1e-12)
    return -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


def make_plan(radius, bands, stats=None):
    """`bands` bands over the informative bits (all 64 without stats), cut at equal entropy."""
    if not 0 <= radius < BITS:
        raise ValueError(f"radius must be in 0..{BITS - 1}, not {radius}")
    if not 1 <= bands <= BITS:
        raise ValueError(f"bands must be in 1..{BITS}, not {bands}")
    bits = stats.informative() if stats else list(range(BITS))
    if not bits:  # every row has the same hash: one bucket
        return Plan(radius, (0,), ((0, 0),))
    bands = min(bands, len(bits))
    h = [_entropy(stats.ones[b] / stats.rows) if stats else 1.0 for b in bits]
    total, cum = sum(h), list(itertools.accumulate(h))
    cuts = [0]
    for k in range(1, bands):
        at = next(i + 1 for i, c in enumerate(cum) if c >= total * k / bands - 1e-9)
        cuts.append(min(max(at, cuts[-1] + 1), len(bits) - (bands - k)))
    cuts.append(len(bits))
    return Plan(radius, tuple(b - a for a, b in zip(cuts, cuts[1:])), _runs(bits))


def _within(pdiff, s):
    """P(at most s of the bits differ), bit i differing with probability pdiff[i]."""
    dist = [1.0] + [0.0] * s
    for q in pdiff:
        dist = [dist[k] * (1 - q) + (dist[k - 1] * q if k else 0.0) for k in range(s + 1)]
    return sum(dist)


def estimate(p, stats):
    """Estimated seconds of the join with plan `p` (independent bits at measured rates)."""
    if not stats.new:
        return 0.0
    bits = stats.informative()
    prob = [stats.ones[b] / stats.rows for b in bits] or [0.0]
    s, total = p.sub_radius, 0.0
    for w, start in zip(p.widths, p.starts):
        band = prob[start:start + w]
        values = sum(math.comb(w, k) for k in range(min(s, w) + 1))
        t = piece_bits(w, max(stats.new, stats.old))
        tops = sum(math.comb(t, k) for k in range(min(s, t) + 1))
        joins = min(2 ** t, stats.new) * tops * (1 + bool(stats.old))
        total += joins * (COST_PIECE_JOIN + COST_OFFSET * 2 ** min(w - t, DIRECT_BITS))
        space = 2.0 ** sum(_entropy(q) for q in band)
        new, old = (space * -math.expm1(-n / space) for n in (stats.new, stats.old))
        lookups = new * values * (0.5 + bool(stats.old))
        buckets = new * values * (new / 2 + old) / space
        pairs = (stats.new ** 2 / 2 + stats.new * stats.old) * _within(
            [2 * q * (1 - q) for q in band], s)
        search = SEARCH_FACTOR if w - t > DIRECT_BITS else 1
        total += COST_LOOKUP * search * lookups + COST_BUCKETS * buckets + COST_PAIR * pairs \
            + COST_ROW * stats.rows
    return total


def values_within(p):
    """Band values within the sub-radius of one value, in the widest band."""
    w = max(p.widths)
    return sum(math.comb(w, k) for k in range(min(p.sub_radius, w) + 1))


def found_share(p, distance):
    """Share of the pairs `distance` bits apart that plan `p` finds, the differing bits
    spread uniformly over the informative ones: 1.0 up to p.exact_radius. A pair is found
    unless every band differs in more than the sub-radius (counted band by band)."""
    if distance > p.radius:
        return 0.0
    total, s = sum(p.widths), p.sub_radius
    if distance > total:
        return 1.0 if distance <= p.exact_radius else 0.0
    missed = {0: 1}  # differing bits placed so far -> ways with every band over s
    for w in p.widths:
        step = {}
        for used, ways in missed.items():
            for k in range(s + 1, min(w, distance - used) + 1):
                step[used + k] = step.get(used + k, 0) + ways * math.comb(w, k)
        missed = step
    return 1.0 - missed.get(distance, 0) / math.comb(total, distance)


def found_by(p, x):
    """Which hash pairs, given as their XORs (uint64 array), plan p's join finds: within
    its radius and within the sub-radius in some band (for tests and benchmarks)."""
    x = np.asarray(x, np.uint64)
    c = p.compress(x)
    near = np.stack([np.bitwise_count(p.band_value(c, k)) <= p.sub_radius
                     for k in range(len(p.widths))])
    return (np.bitwise_count(x) <= p.radius) & near.any(0)


def choose_plan(radius, stats, bands=None):
    """The plan with `bands` bands; else the exact plan of lowest estimated cost while it
    stays within BUDGET per row; else (many rows: exact search is not linear, see
    multi_index) the multi-probe plan within BUDGET that finds the most pairs at `radius`."""
    if bands:
        p = make_plan(radius, bands, stats)
        if values_within(p) > MAX_VALUES:
            raise ValueError(f"{bands} bands at radius {radius}: {values_within(p):,} values "
                             f"within the sub-radius per band; use more bands")
        return p
    exact = {make_plan(radius, b, stats) for b in range(1, radius + 2)}
    exact = [p for p in exact if values_within(p) <= MAX_VALUES]
    cost = {p: estimate(p, stats) for p in exact}
    best = min(exact, key=lambda p: (cost[p], len(p.widths)))
    budget = max(BUDGET * stats.rows, BUDGET_FLOOR)
    if cost[best] <= budget:
        return best
    probes = [dataclasses.replace(p, probe=s) for p in exact for s in range(p.sub_radius)]
    cost.update((p, estimate(p, stats)) for p in probes)
    affordable = [p for p in probes if cost[p] <= budget]
    if not affordable:
        return min(cost, key=lambda p: (cost[p], len(p.widths)))
    return max(affordable, key=lambda p: (found_share(p, radius), -cost[p]))


def piece_bits(width, rows):
    """Top bits of the band value that cut a band into pieces: pieces of at most ~TABLE_ROWS
    rows, narrow enough for an offset table (a search per look-up costs ~10x more)."""
    return min(width, MAX_PIECE_BITS, max(0, math.ceil(math.log2(max(1, rows) / TABLE_ROWS)),
                                          width - DIRECT_BITS))
