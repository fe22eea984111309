"""Pure pixel work: raw file bytes -> stored JPEG (no Beam, no TensorFlow).

Everything a DoFn needs to turn one input into the bytes of `image/encoded`; every
rejection is an `ImageError` whose `reason` is the short code that lands in errors.jsonl.
"""

import dataclasses
import io
import warnings

from PIL import Image, ImageOps

JPEG_EOI = b"\xff\xd9"
EXIF_ORIENTATION = 0x0112


class ImageError(ValueError):
    """A rejected input; `stage` and `reason` are the errors.jsonl fields."""

    def __init__(self, stage, reason, detail):
        super().__init__(f"{reason}: {detail}")
        self.stage, self.reason, self.detail = stage, reason, detail


@dataclasses.dataclass(frozen=True)
class EncodeOptions:
    max_side: int = 0            # resize when the longer side exceeds this; 0 = never
    reencode: str = "auto"       # auto: keep good JPEGs byte for byte; always: re-encode
    validate: str = "decode"     # decode: full strict decode of every input; header: trust it
    jpeg_quality: int = 90
    max_pixels: int = Image.MAX_IMAGE_PIXELS  # decompression-bomb limit

    def __post_init__(self):
        if self.reencode not in ("auto", "always"):
            raise ValueError(f"reencode must be 'auto' or 'always', not {self.reencode!r}")
        if self.validate not in ("decode", "header"):
            raise ValueError(f"validate must be 'decode' or 'header', not {self.validate!r}")
        if not 1 <= self.jpeg_quality <= 100:
            raise ValueError(f"jpeg_quality must be in 1..100, not {self.jpeg_quality}")
        if self.max_side < 0:
            raise ValueError(f"max_side must be >= 0, not {self.max_side}")


@dataclasses.dataclass(frozen=True)
class Encoded:
    data: bytes   # baseline RGB JPEG
    height: int
    width: int
    passed_through: bool


def _open(data, opts):
    if not data:
        raise ImageError("read", "empty_file", "file has zero bytes")
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
            reason = "truncated" if "truncated" in str(e).lower() else "corrupt"
            raise ImageError("decode", reason, f"{type(e).__name__}: {e}") from e
    if w * h > opts.max_pixels:
        raise ImageError("decode", "decompression_bomb",
                         f"{w}x{h} = {w * h} pixels exceeds the limit of {opts.max_pixels}")
    if w < 1 or h < 1:
        raise ImageError("decode", "corrupt", f"image has size {w}x{h}")
    return img


def _is_storable_as_is(img, data, opts):
    """A baseline RGB JPEG, upright, within size and complete can be stored byte for byte."""
    return (opts.reencode == "auto"
            and img.format == "JPEG"
            and img.mode == "RGB"
            and not img.info.get("progressive")
            and not img.info.get("progression")
            and img.getexif().get(EXIF_ORIENTATION, 1) == 1
            and (opts.max_side == 0 or max(img.size) <= opts.max_side)
            and data.rstrip(b"\0").endswith(JPEG_EOI))  # a truncated JPEG lacks its EOI marker


def to_rgb(img):
    """8-bit RGB from any mode; alpha is composited on white, palettes expanded."""
    if img.mode == "RGB":
        return img
    if img.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        # 16/32-bit grey: scale the full range to 8 bits rather than clipping at 255.
        import numpy as np

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


def decode(data, opts=EncodeOptions()):
    """File bytes -> upright 8-bit RGB PIL image (first frame), resized to fit `max_side`."""
    img = _open(data, opts)
    try:
        if opts.max_side and img.format == "JPEG" and max(img.size) > opts.max_side:
            # Draft mode lets libjpeg decode at 1/2, 1/4 or 1/8 scale: far less work.
            # Integer ceiling: a float product like 998 * (500 / 998) can floor to 499.
            longest = max(img.size)
            img.draft("RGB", tuple(max(1, -(-side * opts.max_side // longest))
                                   for side in img.size))
        img.seek(0)
        img.load()
        img = ImageOps.exif_transpose(img)
        img = to_rgb(img)
    except ImageError:
        raise
    except (OSError, SyntaxError, ValueError) as e:
        reason = "truncated" if "truncated" in str(e).lower() else "corrupt"
        raise ImageError("decode", reason, f"{type(e).__name__}: {e}") from e
    if opts.max_side and max(img.size) > opts.max_side:
        img = ImageOps.contain(img, (opts.max_side, opts.max_side), Image.Resampling.LANCZOS)
    return img


def encode_jpeg(img, quality=90):
    """Baseline (non-progressive) RGB JPEG bytes."""
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=quality, optimize=False, progressive=False)
    return out.getvalue()


def convert(data, opts=EncodeOptions()):
    """The stored form of one input: its own bytes when already good, else a new JPEG."""
    img = _open(data, opts)
    if _is_storable_as_is(img, data, opts):
        w, h = img.size
        return Encoded(data, h, w, True)
    img = decode(data, opts)
    try:
        encoded = encode_jpeg(img, opts.jpeg_quality)
    except (OSError, ValueError) as e:
        raise ImageError("encode", "encode_failed", f"{type(e).__name__}: {e}") from e
    return Encoded(encoded, img.size[1], img.size[0], False)
