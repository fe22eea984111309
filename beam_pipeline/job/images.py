"""Pure pixel work: raw file bytes -> stored JPEG (no Beam, no TensorFlow).

The entry: everything a DoFn needs to turn one input into the bytes of `image/encoded`;
every rejection is an `ImageError` whose `reason` is the short code that lands in errors.jsonl.

JPEGs go through libjpeg-turbo in strict mode (`jpeg.py`); Pillow decodes the other formats
(here). Every stored image is encoded by libjpeg-turbo: baseline, RGB, 4:2:0 like Pillow's
default, so stored pixels keep the meaning they had when Pillow encoded them.
"""

import dataclasses
import io
import struct
import warnings
import zlib

import numpy as np
import simplejpeg
from PIL import Image, ImageOps

from beam_pipeline.dedup import descriptor, perceptual
from beam_pipeline.job import jpeg
# EncodeOptions and ImageError are the entry's API too: callers import them from here.
from beam_pipeline.job.pixels import EncodeOptions, ImageError, check_size, fit_size, resize

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclasses.dataclass(frozen=True)
class Encoded:
    data: bytes   # baseline RGB JPEG
    height: int
    width: int
    passed_through: bool
    # with_moments: (pixel_count, (r, g, b) sums, (r, g, b) sums of squares)
    moments: tuple | None = None
    phash: int | None = None  # with_phash: perceptual.phash_pair of the stored pixels: whole,
    phash_center: int | None = None  # ... and central 90%
    descriptor: bytes | None = None  # with_phash: descriptor.describe, the pairs' second opinion


def pixel_moments(rgb):
    """(pixel count, per-channel sums, per-channel sums of squares) of HxWx3 uint8 pixels.

    Per-channel histograms make both sums exact integers (a float64 holds them exactly up
    to 2**53, i.e. images of over 10**11 pixels); bincount over contiguous planes is the
    fastest numpy way measured (3x einsum in float64).
    """
    planes = np.ascontiguousarray(np.asarray(rgb, dtype=np.uint8).reshape(-1, 3).T)
    hist = np.stack([np.bincount(p, minlength=256) for p in planes]).astype(np.float64)
    values = np.arange(256, dtype=np.float64)
    sums, squares = hist @ values, hist @ (values * values)
    return planes.shape[1], tuple(sums.tolist()), tuple(squares.tolist())


def encode_jpeg(rgb, quality=90):
    """Baseline RGB JPEG bytes of HxWx3 uint8 pixels, chroma 4:2:0 as Pillow's default."""
    try:
        return simplejpeg.encode_jpeg(np.ascontiguousarray(rgb), quality=quality,
                                      colorspace="RGB", colorsubsampling="420")
    except (ValueError, RuntimeError) as e:
        raise ImageError("encode", "encode_failed", f"{type(e).__name__}: {e}") from e


# --- other formats: Pillow --------------------------------------------------------------------

def _open(data, opts):
    with warnings.catch_warnings():
        # Pillow warns above its own default limit; a higher --max_pixels is checked below.
        warnings.simplefilter("error" if opts.max_pixels <= (Image.MAX_IMAGE_PIXELS or 0)
                              else "ignore", Image.DecompressionBombWarning)
        try:
            img = Image.open(io.BytesIO(data))
            w, h = img.size
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
            raise ImageError("decode", "decompression_bomb", str(e)) from e
        except Image.UnidentifiedImageError as e:
            raise ImageError("decode", "not_an_image", "not a recognised image format") from e
        except Exception as e:  # corrupt headers raise all sorts of things
            raise _pillow_failure(e) from e
    check_size(w, h, opts)
    return img


def _pillow_failure(e):
    reason = "truncated" if "truncated" in str(e).lower() else "corrupt"
    return ImageError("decode", reason, f"{type(e).__name__}: {e}")


def check_png_chunks(data):
    """Every PNG chunk complete and matching its CRC, up to IEND: Pillow checks the CRCs of
    header chunks only, so a flipped bit in the pixel data (IDAT) would pass unseen."""
    view, i, n = memoryview(data), len(PNG_SIGNATURE), len(data)
    while i + 12 <= n:
        length, kind = struct.unpack_from(">I4s", data, i)
        end = i + 12 + length
        if end > n:
            break
        if zlib.crc32(view[i + 4:end - 4]) != struct.unpack_from(">I", data, end - 4)[0]:
            raise ImageError("decode", "corrupt_data",
                             f"PNG chunk {kind!r} at byte {i} does not match its CRC")
        if kind == b"IEND":
            return
        i = end
    raise ImageError("decode", "truncated", f"PNG ends ({n} bytes) before its IEND chunk")


def to_rgb(img):
    """8-bit RGB from any mode; alpha is composited on white, palettes expanded."""
    if img.mode == "RGB":
        return img
    if img.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        # 16/32-bit grey: scale the full range to 8 bits rather than clipping at 255.
        a = np.asarray(img, dtype=np.float64)
        top = 65535.0 if img.mode.startswith("I;16") else max(float(a.max()), 1.0)
        img = Image.fromarray(np.clip(a * (255.0 / top) + 0.5, 0, 255).astype("uint8"), "L")
    if img.mode == "P":
        img = img.convert("RGBA" if "transparency" in img.info else "RGB")
    if img.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return img.convert("RGB")  # L, CMYK (Pillow undoes Adobe inversion), YCbCr, 1, F


def _decode_with_pillow(data, opts):
    img = _open(data, opts)
    if img.format == "PNG" and opts.validate == "decode":
        check_png_chunks(data)
    try:
        img.seek(0)
        img.load()
        img = to_rgb(ImageOps.exif_transpose(img))
    except Exception as e:  # damaged pixel data raises all sorts of things too
        raise _pillow_failure(e) from e
    return resize(np.asarray(img), fit_size(*img.size, opts.max_side))


# --- the stored form --------------------------------------------------------------------------

def _encoded(pixels, opts, with_moments, with_phash=False):
    h, w, _ = pixels.shape
    return Encoded(encode_jpeg(pixels, opts.jpeg_quality), h, w, False,
                   pixel_moments(pixels) if with_moments else None,
                   *_hashes(pixels, with_phash))


def _hashes(pixels, with_phash):
    """(whole pHash, central pHash, descriptor) of the stored pixels, or Nones."""
    if not with_phash:
        return None, None, None
    small, grey = perceptual.reduced(pixels)  # once, for both hashes and the descriptor
    return (*perceptual.phash_pair_of_grey(grey), descriptor.describe_reduced(small, grey))


def _convert_jpeg(data, opts, with_moments, with_phash):
    header = jpeg.read_jpeg_header(data)
    h, w, colorspace = jpeg.frame_size(header, opts)
    if jpeg.storable_as_is(header, colorspace, h, w, opts):
        if with_moments:
            pixels = jpeg.strict_decode(header, colorspace, (w, h))
            return Encoded(data, h, w, True, pixel_moments(pixels),
                           *_hashes(pixels, with_phash))
        if with_phash:
            # A strict decode DCT-scaled to >= MIN_SIDE px validates as the full one does
            # (entropy decoding is where corruption shows) and is all the hashes need; in
            # RGB, for the descriptor's mean colour.
            small = jpeg.strict_decode(header, colorspace,
                                       (perceptual.MIN_SIDE, perceptual.MIN_SIDE), "RGB")
            return Encoded(data, h, w, True, None, *_hashes(small, True))
        if opts.validate == "header":
            return Encoded(data, h, w, True)
        # Validation only needs the entropy decoding, where corruption shows, and
        # libjpeg-turbo decodes every coefficient at any DCT scale: the smallest (1/8, GRAY:
        # one DC value per luma block, no chroma) rejects exactly what the full decode does
        # (not one difference on ~9,000 damaged and clean photographs) in ~60% of its time.
        jpeg.strict_decode(header, colorspace, (1, 1), "GRAY")
        return Encoded(data, h, w, True)
    return _encoded(jpeg.upright_pixels(header, h, w, colorspace, opts), opts, with_moments,
                    with_phash)


def decode(data, opts=EncodeOptions()):
    """File bytes -> the upright 8-bit RGB pixels (HxWx3 uint8) that would be stored."""
    if not jpeg.is_jpeg(data):
        return _decode_with_pillow(data, opts)
    header = jpeg.read_jpeg_header(data)
    h, w, colorspace = jpeg.frame_size(header, opts)
    return jpeg.upright_pixels(header, h, w, colorspace, opts)


def convert(data, opts=EncodeOptions(), with_moments=False, with_phash=False):
    """The stored form of one input: its own bytes when already good, else a new JPEG.

    with_moments adds `pixel_moments` of the stored pixels (decoding a pass-through JPEG
    that `--validate header` would otherwise not decode); with_phash their perceptual hash
    (a pass-through JPEG is then validated by a DCT-scaled decode, which the hash reuses).
    """
    if not data:
        raise ImageError("read", "empty_file", "file has zero bytes")
    if jpeg.is_jpeg(data):
        return _convert_jpeg(data, opts, with_moments, with_phash)
    return _encoded(_decode_with_pillow(data, opts), opts, with_moments, with_phash)
