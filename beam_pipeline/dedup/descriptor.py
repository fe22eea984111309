"""The second opinion on a near-duplicate candidate: a 16x16 luma thumbnail and the image's mean
colour, compared after aligning for a crop (no Beam, no TensorFlow).

The 64-bit pHash (dedup/perceptual.py) sees a grey 32x32 thumbnail's lowest frequencies: on
images with little texture (a smooth gradient, a disc on black, a flat field with faint
texture) it is one bright region on a dark background and little else, so unrelated images
pair up. This descriptor looks at what the hash throws away:

- structure: the 16x16 thumbnail's finer layout, as the best normalised correlation between
  one image's thumbnail (resampled to 12x12) and 49 windows of the other's (each side on its
  own the whole, or 95% or 90% of it at 3 positions: a crop of up to 10% off either side
  lines up with one of them, aspect changed or not), both ways. Two crops of a lunar texture
  or two low-texture medical crops share the hash's coarse shape but not this;
- colour: the chroma (Cb, Cr) of one image's whole against the other's window that
  structure lined up best (a 4x4 grid of mean Y, Cb, Cr, averaged over the window), scaled
  by the two means' luma so brightness +/-10% cancels. A grey gradient and a red retina disc
  share the shape but not the colour; a crop that moves the mean colour (a flower cut from
  its leaves: 5.03 levels as whole means) lines up again (2.08 over its window).

A pair is confirmed when both are within their limits (`MAX_STRUCTURE`, `MAX_CHROMA`), chosen
on one half of the near-duplicate precision benchmark (benchmarks/
bench_near_duplicate_precision.py: of the limits keeping precision >= 99.5% there, those
confirming the most positives with the fewest false pairs, the middle of that range) and
reported on the other half (docs/near_duplicates.md has both); a pair with a descriptor
without the grid is held to `MAX_MEAN_CHROMA`, the limit chosen for the whole means before
the grid, so rows kept from such a catalog get the verdicts they got. An image with almost no
texture (a thumbnail whose luma varies by < `FLAT` levels) has no structure to confirm with,
so no pair of it is confirmed: two plain walls can't be told apart by their pixels.

Stored as `SIZE` bytes in the catalog (column near_descriptor): first the `PROBES` extra
hashes the search uses (perceptual.corner_hashes_of_grey, 8 bytes each, big-endian: more
hashes per image let the search use a smaller radius, docs/near_duplicates.md), then the
`GRID` x `GRID` colour grid (row-major, Y Cb Cr per cell), then the thumbnail row-major,
then mean Y, Cb, Cr (Cb and Cr offset by 128, as JPEG stores them). Catalogs written before
the grid hold `PROBED_SIZE` bytes (no grid), before the probes the last `CONFIRM_SIZE` bytes
alone; all compare, an image without a grid by its mean colour (as its whole everywhere).
The stored bytes don't depend on the windows or the limits: changing those changes only the
verdicts at commit (dedup/leaks.py `CONFIRM` names the comparison), never a record. The
thumbnail also gives the search a seventh hash, made at commit (`thumbnail_probes`).
"""

import functools
import struct

import numpy as np
from PIL import Image

from beam_pipeline.dedup import perceptual

SIDE = 16                 # the luma thumbnail's side
WINDOW = 12               # windows are compared at this side
PROBES = 4                # corner pHashes stored first
GRID = 4                  # the colour grid's side: 4x4 cells of mean Y, Cb, Cr
CONFIRM_SIZE = SIDE * SIDE + 3  # the thumbnail and the means: the last bytes of every form
PROBED_SIZE = 8 * PROBES + CONFIRM_SIZE  # the form written before the grid (291 bytes)
SIZE = PROBED_SIZE + GRID * GRID * 3  # bytes stored per image (339)
_PROBES = struct.Struct(f">{PROBES}Q")
MAX_STRUCTURE = 0.31      # 1 - best normalised correlation (0.29 before the grid, 0.25 before
                          # the 49 windows; the same verdicts for descriptors without a grid)
MAX_CHROMA = 2.5          # levels of Cb/Cr (of 255) over the lined-up window, luma-scaled
MAX_MEAN_CHROMA = 4.4     # of the whole means, when a descriptor has no grid (as before it)
FLAT = 2.0                # luma std (levels) below which a thumbnail is flat
_SCALES = (1.0, 0.95, 0.9)


# JPEG's RGB -> YCbCr (JFIF): the means of Y, Cb, Cr are this matrix times the mean RGB.
_YCC = np.array([[0.299, 0.587, 0.114], [-0.168736, -0.331264, 0.5],
                 [0.5, -0.418688, -0.081312]])


def describe(pixels):
    """HxW or HxWx3 uint8 pixels (any size; a DCT-scaled decode is enough) -> SIZE bytes."""
    return describe_reduced(*perceptual.reduced(pixels))


def describe_reduced(small, grey):
    """`describe` of perceptual.reduced's (box-averaged pixels, their grey), which the
    hashes take too: the writer reduces once. Small products of cached matrices, no Pillow
    image: ~1/3 the time of Pillow's resize on a 63x47 decode."""
    h, w = grey.shape
    thumb = _box(h) @ grey @ _box(w).T
    if small.ndim == 2:
        means = (float(thumb.mean()), 128.0, 128.0)
        cells = np.stack([_box(h, GRID) @ grey @ _box(w, GRID).T,
                          np.full((GRID, GRID), 128.0), np.full((GRID, GRID), 128.0)], 2)
    else:  # two small products (a three-operand einsum cost ~500 us); RGB -> YCbCr is
        # linear: averaged first, it converts 16 cells, not every pixel, and the cells' mean
        # is the image's (equal areas)
        rows = (_box(h, GRID) @ small.reshape(h, w * 3)).reshape(GRID, w, 3)
        cells = (_box(w, GRID) @ rows) @ _YCC.T + (0, 128, 128)
        means = cells.mean((0, 1)).tolist()
    return (_PROBES.pack(*perceptual.corner_hashes_of_grey(grey))
            + np.round(np.clip(cells, 0, 255)).astype(np.uint8).tobytes()
            + np.round(thumb).astype(np.uint8).tobytes()
            + bytes(int(round(min(max(m, 0), 255))) for m in means))


def probes(desc):
    """The extra hashes a stored descriptor carries: PROBES ints, or () for a descriptor
    written before them (or none)."""
    if desc is None or len(desc) not in (SIZE, PROBED_SIZE):
        return ()
    return _PROBES.unpack_from(desc)


THUMB_CUT = 0.075  # the probe made at commit hashes the thumbnail's central 85% (7.5% off a side)


@functools.lru_cache(maxsize=None)
def linear_resampling(lo, hi, side=SIDE):
    """side x side: linear sampling of the span [lo, hi) px of a side-px axis (a crop of the
    thumbnail, resampled back to its size)."""
    m = np.zeros((side, side))
    for o in range(side):
        x = min(max(lo + (o + 0.5) * (hi - lo) / side - 0.5, 0.0), side - 1.0)
        k = int(x)
        m[o, k] += 1 - (x - k)
        m[o, min(k + 1, side - 1)] += x - k
    return m


def _thumb_probe_side():
    """8 x SIDE: the 8 lowest DCT-II frequencies of the thumbnail's central span, linearly
    resampled back to SIDE px (a 16-px thumbnail holds the frequencies a 32-px pHash reads,
    box- rather than Lanczos-filtered)."""
    out = perceptual._dct_rows(SIDE, 8) @ linear_resampling(THUMB_CUT * SIDE,
                                                           (1 - THUMB_CUT) * SIDE)
    out.flags.writeable = False
    return out


def thumbnail_probes(descriptors):
    """One more probe hash per descriptor, made at commit from its stored thumbnail (no
    bytes stored, no writer time): the pHash-like hash of the thumbnail's central 85%, for
    a copy cut further than the writer's crops (the central 90%, the 95% corners) line up
    with. Chosen on half A of the near-duplicate precision benchmark
    among thumbnail crops of 70-90%, sides and corners: of those adding no false pair there,
    the one putting the most of its positives within 6 bits (423 of 429, the six 421);
    half B: one more positive, no false pair (docs/near_duplicates.md).
    -> a list of ints; None where the descriptor holds no stored probes (none, or one from a
    catalog written before them: its rows take part with the hashes they have) or its
    thumbnail is flat (luma std < FLAT: every flat thumbnail hashes alike, and no pair of
    one is confirmed anyway)."""
    out = [None] * len(descriptors)
    at = [k for k, d in enumerate(descriptors) if d is not None and len(d) in (SIZE, PROBED_SIZE)]
    if not at:
        return out
    thumbs = parse([descriptors[k] for k in at])[0].astype(np.float64)
    side = _thumb_probe_side()
    low = (side @ thumbs @ side.T).reshape(len(at), 64)
    ranked = np.sort(low, 1)
    median = (ranked[:, 31] + ranked[:, 32]) / 2
    bits = low > (median + perceptual._NOISE * (1.0 + np.abs(median)))[:, None]
    hashes = np.packbits(bits, 1).view(">u8")[:, 0].tolist()
    flat = (thumbs.reshape(len(at), -1).std(1) < FLAT).tolist()
    for k, h, f in zip(at, hashes, flat):
        out[k] = None if f else h
    return out


@functools.lru_cache(maxsize=1024)
def _box(n, side=SIDE):
    """side x n: each output pixel the area-weighted mean of the input pixels it covers
    (Pillow's BOX filter), as a matrix per side length: two small products, no Pillow
    image (which cost ~3x more on a 63x47 decode)."""
    edges = np.arange(side + 1) * n / side
    m = np.zeros((side, n))
    for o in range(side):
        lo, hi = edges[o], edges[o + 1]
        for k in range(int(lo), min(int(np.ceil(hi)), n)):
            m[o, k] = min(hi, k + 1) - max(lo, k)
        m[o] /= m[o].sum()
    m.flags.writeable = False
    return m


def parse(descriptors):
    """A sequence of descriptors (SIZE, PROBED_SIZE or CONFIRM_SIZE bytes) -> (N x SIDE x
    SIDE float thumbnails, N x 3 means)."""
    raw = np.frombuffer(b"".join(d[-CONFIRM_SIZE:] for d in descriptors), np.uint8).reshape(
        -1, CONFIRM_SIZE)
    return (raw[:, :SIDE * SIDE].reshape(-1, SIDE, SIDE).astype(np.float32),
            raw[:, SIDE * SIDE:].astype(np.float32))


def grids(descriptors, means):
    """N x GRID x GRID x 3 float colour grids (Y, Cb, Cr) of descriptors; a descriptor
    written before the grid (no cells stored) gets its mean in every cell, so any window of
    it is its mean."""
    out = np.repeat(np.repeat(means[:, None, None, :], GRID, 1), GRID, 2)
    for k, d in enumerate(descriptors):
        if len(d) == SIZE:
            out[k] = np.frombuffer(d, np.uint8, GRID * GRID * 3, 8 * PROBES).reshape(
                GRID, GRID, 3)
    return out


def _spans():
    """The 7 spans of a side a window takes (fractions): the whole, 95% and 90% of it at 3
    positions each."""
    return [(x, x + s) for s in _SCALES for x in ((0.0,) if s == 1.0 else
                                                (0.0, (1 - s) / 2, 1 - s))]


@functools.lru_cache(maxsize=None)
def _cell_weights():
    """(rows, cols), each windows x GRID: the share of a window's span each grid cell
    covers (a window's mean colour is rows @ grid @ cols.T), in _resamplers' order."""
    def weights(lo, hi):
        v = np.array([max(0.0, min(hi * GRID, k + 1) - max(lo * GRID, k))
                      for k in range(GRID)], np.float32)
        return v / v.sum()

    spans = _spans()
    rows = [weights(*y) for y in spans for _ in spans]
    cols = [weights(*x) for _ in spans for x in spans]
    return np.stack(rows), np.stack(cols)


@functools.lru_cache(maxsize=None)
def _resamplers():
    """(rows, cols), each windows x WINDOW x SIDE: Pillow's bilinear resampling of each
    window of a thumbnail (a window is rows @ thumb @ cols.T), the whole image first. Two
    small products per window: 1/14 of the work of one WINDOW**2 x SIDE**2 matrix. Each
    side is cut on its own (7 x 7 windows): with both cut alike (19 windows) a copy cropped
    off one side only stayed misaligned; on the precision benchmark's candidate positives
    the structure's 95th percentile went 0.082 -> 0.066, the 99th 0.156 -> 0.134."""
    def matrix(lo, hi):
        m = np.zeros((WINDOW, SIDE), np.float32)
        for k in range(SIDE):
            basis = np.zeros((1, SIDE), np.float32)
            basis[0, k] = 1.0
            out = Image.fromarray(basis, "F").resize(
                (WINDOW, 1), Image.Resampling.BILINEAR, box=(lo, 0, hi, 1))
            m[:, k] = np.asarray(out, np.float32)[0]
        return m

    spans = _spans()
    rows, cols = [], []
    for y0, y1 in spans:  # each side on its own: a crop off one side changes the aspect
        for x0, x1 in spans:
            rows.append(matrix(y0 * SIDE, y1 * SIDE))
            cols.append(matrix(x0 * SIDE, x1 * SIDE))
    return np.stack(rows), np.stack(cols)


def _windows(thumbs):
    """N thumbnails -> (N, windows, WINDOW*WINDOW) zero-mean windows scaled to unit variance
    (variance floored at FLAT**2, so a flat window correlates weakly with anything)."""
    rows, cols = _resamplers()
    w = (rows[None] @ thumbs[:, None] @ cols.transpose(0, 2, 1)[None]).reshape(
        len(thumbs), len(rows), WINDOW * WINDOW)
    w -= w.mean(2, keepdims=True)
    return w / np.maximum(w.std(2, keepdims=True), FLAT)


def distances(a, b):
    """Descriptors a[i] vs b[i] (two equal-length sequences of bytes) -> (structure, chroma)
    arrays: structure 1 - the best correlation of either image's whole thumbnail with a
    window of the other's; chroma the larger of the Cb, Cr differences between that whole's
    mean colour and the mean colour of that window (from the grid) once one's are scaled by
    the lumas' ratio (the less of the two ways round: symmetric). Without grids (descriptors
    written before them) the window's colour is the image's mean, as before."""
    if not len(a):
        return np.zeros(0, np.float32), np.zeros(0, np.float32)
    # Each distinct descriptor's windows once: in a dense set one image is in many pairs.
    index = {}
    ia = np.array([index.setdefault(d, len(index)) for d in a])
    ib = np.array([index.setdefault(d, len(index)) for d in b])
    distinct = list(index)
    thumbs, means = parse(distinct)
    cells = grids(distinct, means)
    windows = _windows(thumbs)
    n = WINDOW * WINDOW
    r_ab = np.einsum("nk,nwk->nw", windows[ia, 0], windows[ib]) / n  # a's whole, b's windows
    r_ba = np.einsum("nk,nwk->nw", windows[ib, 0], windows[ia]) / n
    ab = r_ab.max(1) >= r_ba.max(1)
    structure = 1.0 - np.where(ab, r_ab.max(1), r_ba.max(1))
    whole = np.where(ab[:, None], means[ia], means[ib])  # the whole's side, the window's side
    other, at = np.where(ab, ib, ia), np.where(ab, r_ab.argmax(1), r_ba.argmax(1))
    rows, cols = _cell_weights()
    window = np.einsum("na,nabc,nb->nc", rows[at], cells[other], cols[at])
    window = np.where(gridded(a, b)[:, None], window, means[other])  # no grid: whole means
    return structure, np.minimum(_chroma(whole, window), _chroma(window, whole))


def _chroma(ma, mb):
    scale = (mb[:, 0] + 1) / (ma[:, 0] + 1)
    return np.abs((ma[:, 1:] - 128) * scale[:, None] - (mb[:, 1:] - 128)).max(1)


def gridded(a, b):
    """Per pair of descriptors, whether both hold the colour grid: their chroma is over the
    lined-up window (limit MAX_CHROMA), else of the whole means (MAX_MEAN_CHROMA)."""
    return np.array([len(x) == SIZE and len(y) == SIZE for x, y in zip(a, b)], bool)


def confirmed(structure, chroma, grid=True):
    """Which candidate pairs the descriptor confirms (arrays from `distances`; `grid`:
    `gridded` of the same pairs)."""
    return (structure <= MAX_STRUCTURE) & (chroma <= np.where(grid, MAX_CHROMA,
                                                              MAX_MEAN_CHROMA))
