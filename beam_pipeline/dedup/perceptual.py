"""Perceptual hash of an image's pixels: 64 bits that move little when the photo is resized,
re-compressed, lightly cropped or brightened (no Beam, no TensorFlow).

The hash is pHash as the `imagehash` library defines it (grey 32x32 LANCZOS thumbnail, 2-D
DCT-II, the 8x8 lowest frequencies, each bit "above the median"), as an int whose most
significant bit is the top-left coefficient (``int(str(imagehash.phash(img)), 16)``).
Thumbnail and DCT are folded into one cached 8 x n matrix per side length, so an HxW image
costs two small matrix products (~15 us on a 63x47 decode against ~90 us through Pillow's
resize); the thumbnail stays in floats where Pillow rounds to uint8, so a coefficient next
to the median can swap sides: on the benchmark's 924 photos 87% of hashes equal
imagehash's, the rest are 2 bits apart (one 4), and the ROC is the same.
The pixels are what the writer has for free: a strict libjpeg decode DCT-scaled to >=
`MIN_SIDE` px refused exactly the corrupted JPEGs the full strict decode refused (320 of
320 verdicts agreed), and 8x8 box averages are what 1/8 scaling yields
(benchmarks/bench_near_duplicates.py).
"""

import functools

import numpy as np
from PIL import Image

BITS = 64
HASH_SIDE = 32      # the DCT runs on a HASH_SIDE x HASH_SIDE grey thumbnail
MIN_SIDE = 32       # a decode scaled down to at least this many px per side is enough
_LOW = 8            # 8x8 lowest frequencies -> 64 bits
_NOISE = 1e-9       # relative: a coefficient this close to the median is not above it


def _dct_rows(n, k):
    """The first k rows of the unnormalised DCT-II matrix of size n (scipy's `dct` type 2 up
    to a factor 2, which no "above the median" test sees)."""
    x = np.arange(n)
    return np.cos(np.pi * (2 * x[None, :] + 1) * np.arange(k)[:, None] / (2 * n))


_DCT = _dct_rows(HASH_SIDE, _LOW)


def _lanczos(x):
    return np.where((x >= -3) & (x < 3), np.sinc(x) * np.sinc(x / 3), 0.0)


def resample_rows(n, out=HASH_SIDE):
    """Pillow's LANCZOS resampling n -> out px as an out x n matrix (its coefficients, in
    floats: Pillow rounds each pass to uint8, so its thumbnails differ by fractions of a
    grey level)."""
    scale = n / out
    stretch = max(scale, 1.0)  # downscaling widens the kernel: antialiasing
    support = 3.0 * stretch
    m = np.zeros((out, n))
    for o in range(out):
        centre = (o + 0.5) * scale
        lo, hi = max(int(centre - support + 0.5), 0), min(int(centre + support + 0.5), n)
        w = _lanczos((np.arange(lo, hi) - centre + 0.5) / stretch)
        m[o, lo:hi] = w / w.sum() if w.sum() else w
    return m


# One entry per side length seen (~0.2-1.3 ms to make); lengths after DCT scaling rarely pass
# 1,024, where all of them together take 34 MB.
@functools.lru_cache(maxsize=1024)
def _side(n):
    """The 8 x n matrix taking n px straight to the 8 lowest DCT frequencies of the thumbnail:
    the hash of an HxW image is two small matrix products, _side(H) @ grey @ _side(W).T."""
    m = _DCT @ resample_rows(n)
    m.flags.writeable = False
    return m


def _checked(pixels):
    """HxW or HxWx3 uint8 (an HxWx1 image as HxW), or ValueError."""
    a = np.asarray(pixels)
    if a.dtype != np.uint8:
        raise ValueError(f"pixels must be uint8, not {a.dtype}")
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[:, :, 0]
    if a.ndim == 3 and a.shape[2] == 3:
        return np.ascontiguousarray(a)
    if a.ndim != 2:
        raise ValueError(f"pixels must be HxW, HxWx1 or HxWx3, not {a.shape}")
    return a


def shrink_factor(height, width):
    """The box-average factor (1..8) a JPEG decode scaled to >= MIN_SIDE px would apply: the
    same thumbnail whether the pixels came from a scaled decode or from a full one."""
    return max(1, min(8, min(height, width) // MIN_SIDE))


def _small_grey(pixels):
    """Grey pixels box-averaged as a scaled JPEG decode would have them. A scaled decode
    arrives small and grey (no Pillow); full-size RGB is averaged before its luma is taken
    (luma is linear: the same to rounding, and 1/64 of the conversions)."""
    return reduced(pixels)[1]


def reduced(pixels):
    """(box-averaged pixels as a scaled decode would have them: HxW or HxWx3 uint8, their
    grey): what both hashes and the descriptor (dedup/descriptor.py) are taken of, made once."""
    a = _checked(pixels)
    if a.size == 0:
        raise ValueError("cannot hash an empty image")
    factor = shrink_factor(*a.shape[:2])
    if factor == 1 and a.ndim == 2:
        return a, a
    if factor == 1:  # a scaled decode: its luma as Pillow's convert("L") rounds it, without
        return a, _luma(a)  # making a Pillow image (~2x faster on a 63x47 decode)
    img = Image.fromarray(a, "L" if a.ndim == 2 else "RGB")
    if factor > 1:
        img = img.reduce(factor)
    return np.asarray(img), np.asarray(img.convert("L"))


def thumbnail(pixels):
    """The HASH_SIDE x HASH_SIDE float grey image the hash is taken of (for tests and
    pictures: the hash itself never builds it)."""
    g = _small_grey(pixels)
    return resample_rows(g.shape[0]) @ g @ resample_rows(g.shape[1]).T


def low_frequencies(pixels):
    """The 8x8 lowest DCT-II frequencies of the thumbnail, row-major (64 floats)."""
    return _low(_small_grey(pixels))


def _low(g):
    return (_side(g.shape[0]) @ g.astype(np.float64) @ _side(g.shape[1]).T).ravel()


def bits_of(low):
    """64 booleans: each coefficient above the median of the 64. A coefficient within float
    noise of the median (a flat image's zero frequencies) is not above it."""
    ranked = np.sort(low)  # np.median costs 5x more on 64 values
    median = (ranked[BITS // 2 - 1] + ranked[BITS // 2]) / 2
    return low > median + _NOISE * (1.0 + abs(median))


def phash_bits(thumb):
    """64 booleans, row-major over the 8x8 lowest DCT frequencies of a 32x32 thumbnail."""
    return bits_of((_DCT @ thumb @ _DCT.T).ravel())


def phash(pixels):
    """The 64-bit perceptual hash (an int in [0, 2**64)) of uint8 pixels of any size."""
    return _packed(bits_of(low_frequencies(pixels)))


def phash_pair(pixels):
    """(hash of the whole image, hash of its central 90%): a crop of up to 10% lies between
    the two, so the least of a pair's four distances stays small where the whole images'
    hashes drift apart (docs/measurements.md: recall 92% -> 96-97% at radius 10, no false pair).
    The centre is cut from the same box-averaged grey pixels, so it costs a second pair of
    small matrix products (the matrices cached per side length, as the whole image's are)."""
    return phash_pair_of_grey(_small_grey(pixels))


def _luma(rgb):
    """Pillow's RGB -> L, bit for bit: (19595 R + 38470 G + 7471 B + 2**15) >> 16."""
    c = rgb.astype(np.uint32)
    return ((c[..., 0] * 19595 + c[..., 1] * 38470 + c[..., 2] * 7471 + 32768) >> 16).astype(
        np.uint8)


def phash_pair_of_grey(g):
    """phash_pair of pixels already box-averaged and grey (`reduced`'s second value)."""
    return _packed(bits_of(_low(g))), _packed(bits_of(_low(central(g))))


def corner_hashes_of_grey(g):
    """pHashes of the four crops of 95% of each side anchored at the corners of grey pixels
    (`reduced`'s second value). A crop of up to 10% off one side or corner lines up with one
    of them, or with the whole or the centre, where the whole images' hashes drift apart:
    on the near-duplicate benchmark, the least of a pair's distances over the six hashes
    puts 97% of all-transforms-at-once copies within 8 bits, against 71% with two
    (docs/near_duplicates.md). One product for the four (one shape)."""
    h, w = g.shape[:2]
    dh, dw = _margin(h), _margin(w)
    crops = np.stack([g[:h - dh, :w - dw], g[:h - dh, dw:], g[dh:, :w - dw], g[dh:, dw:]])
    low = _side(h - dh) @ crops.astype(np.float64) @ _side(w - dw).T
    return tuple(_packed(bits_of(c.ravel())) for c in low)


def central(grey_pixels):
    """The central 90% of an HxW array: 5% of each side's length (rounded half up) cut off
    every edge; an image under 10 px a side keeps that side whole."""
    h, w = grey_pixels.shape[:2]
    dh, dw = _margin(h), _margin(w)
    return grey_pixels[dh:h - dh, dw:w - dw]


def _margin(n):
    return (n + 10) // 20


def _packed(bits):
    return int.from_bytes(np.packbits(bits).tobytes(), "big")


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
