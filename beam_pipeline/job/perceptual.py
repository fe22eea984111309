"""Perceptual hash of an image's pixels: 64 bits that move little when the photo is resized,
re-compressed, lightly cropped or brightened (no Beam, no TensorFlow).

The hash is pHash as the `imagehash` library defines it (grey 32x32 LANCZOS thumbnail, 2-D
DCT-II, the 8x8 lowest frequencies, each bit "above the median"), bit for bit except where a
coefficient is float noise around zero (flat images: here they hash alike), as an int
whose most significant bit is the top-left coefficient (``int(str(imagehash.phash(img)), 16)``).
Computed here in numpy from a small image the writer can have for free: a strict libjpeg
decode DCT-scaled to >= `MIN_SIDE` px refused exactly the corrupted JPEGs the full strict
decode refused (320 of 320 verdicts agreed) at ~0.77x its cost, and 8x8 box averages are what
1/8 scaling yields. On that thumbnail `imagehash.phash` gives the same bits (so the same
accuracy: the best of the library's hashes measured) at ~1.3x the cost, and would bring scipy
onto every worker (benchmarks/bench_near_duplicates.py).
"""

import numpy as np
from PIL import Image

BITS = 64
HASH_SIDE = 32      # the DCT runs on a HASH_SIDE x HASH_SIDE grey thumbnail
MIN_SIDE = 32       # a decode scaled down to at least this many px per side is enough
_LOW = 8            # 8x8 lowest frequencies -> 64 bits


def _dct_rows(n, k):
    """The first k rows of the unnormalised DCT-II matrix of size n (scipy's `dct` type 2 up
    to a factor 2, which no "above the median" test sees)."""
    x = np.arange(n)
    return np.cos(np.pi * (2 * x[None, :] + 1) * np.arange(k)[:, None] / (2 * n))


_DCT = _dct_rows(HASH_SIDE, _LOW)


def grey(pixels):
    """HxW grey uint8 from HxW, HxWx1 or HxWx3 uint8 (ITU-R 601 luma, as JPEG's Y and
    Pillow's "L" compute it)."""
    a = np.asarray(pixels)
    if a.dtype != np.uint8:
        raise ValueError(f"pixels must be uint8, not {a.dtype}")
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[:, :, 0]
    if a.ndim == 2:
        return a
    if a.ndim == 3 and a.shape[2] == 3:
        return np.asarray(Image.fromarray(np.ascontiguousarray(a), "RGB").convert("L"))
    raise ValueError(f"pixels must be HxW, HxWx1 or HxWx3, not {a.shape}")


def shrink_factor(height, width):
    """The box-average factor (1..8) a JPEG decode scaled to >= MIN_SIDE px would apply: the
    same thumbnail whether the pixels came from a scaled decode or from a full one."""
    return max(1, min(8, min(height, width) // MIN_SIDE))


def thumbnail(pixels):
    """The HASH_SIDE x HASH_SIDE float grey image the hash is taken of."""
    g = grey(pixels)
    if g.size == 0:
        raise ValueError("cannot hash an empty image")
    img = Image.fromarray(np.ascontiguousarray(g), "L")
    factor = shrink_factor(*g.shape)
    if factor > 1:
        img = img.reduce(factor)
    img = img.resize((HASH_SIDE, HASH_SIDE), Image.Resampling.LANCZOS)
    return np.asarray(img, dtype=np.float64)


def phash_bits(thumb):
    """64 booleans, row-major over the 8x8 lowest DCT frequencies of a 32x32 thumbnail."""
    # Rounded: float noise around a zero coefficient (flat areas) must not pick the bit.
    low = np.round(_DCT @ thumb @ _DCT.T, 6).ravel()
    ranked = np.sort(low)  # np.median costs 5x more on 64 values
    return low > (ranked[BITS // 2 - 1] + ranked[BITS // 2]) / 2


def phash(pixels):
    """The 64-bit perceptual hash (an int in [0, 2**64)) of uint8 pixels of any size."""
    return int.from_bytes(np.packbits(phash_bits(thumbnail(pixels))).tobytes(), "big")


def hamming(a, b):
    """Number of differing bits between two hashes."""
    return (a ^ b).bit_count()


def hamming_many(a, b):
    """Elementwise Hamming distances of two broadcastable uint64 arrays."""
    return np.bitwise_count(np.bitwise_xor(np.asarray(a, np.uint64), np.asarray(b, np.uint64)))


def to_signed(h):
    """The int64 a 64-bit hash is stored as (Parquet and Arrow have no cheaper exact type)."""
    return h - (1 << 64) if h >= 1 << 63 else h


def from_signed(v):
    return v + (1 << 64) if v < 0 else v
