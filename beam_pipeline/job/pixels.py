"""The options, the rejection and the size rules that both decode paths share.

A module of its own so that `jpeg.py` (libjpeg-turbo) and `images.py` (the entry, Pillow)
both import these one way, without a cycle.
"""

import dataclasses

import numpy as np
from PIL import Image


class ImageError(ValueError):
    """A rejected input; `stage` and `reason` are the errors.jsonl fields."""

    def __init__(self, stage, reason, detail):
        super().__init__(f"{reason}: {detail}")
        self.stage, self.reason, self.detail = stage, reason, detail


@dataclasses.dataclass(frozen=True)
class EncodeOptions:
    max_side: int = 0            # resize when the longer side exceeds this; 0 = never
    reencode: str = "auto"       # auto: keep good JPEGs byte for byte; always: re-encode
    validate: str = "decode"     # decode: strict decode of every input; header: trust it
    jpeg_quality: int = 90
    max_pixels: int = Image.MAX_IMAGE_PIXELS  # decompression-bomb limit
    max_bytes: int = 0           # inputs larger than this are never read whole; 0 = no limit

    def __post_init__(self):
        if self.reencode not in ("auto", "always"):
            raise ValueError(f"reencode must be 'auto' or 'always', not {self.reencode!r}")
        if self.validate not in ("decode", "header"):
            raise ValueError(f"validate must be 'decode' or 'header', not {self.validate!r}")
        if not 1 <= self.jpeg_quality <= 100:
            raise ValueError(f"jpeg_quality must be in 1..100, not {self.jpeg_quality}")
        if self.max_side < 0:
            raise ValueError(f"max_side must be >= 0, not {self.max_side}")


def check_size(w, h, opts):
    if w * h > opts.max_pixels:
        raise ImageError("decode", "decompression_bomb",
                         f"{w}x{h} = {w * h} pixels exceeds the limit of {opts.max_pixels}")
    if w < 1 or h < 1:
        raise ImageError("decode", "corrupt", f"image has size {w}x{h}")


def fit_size(width, height, max_side):
    """(width, height) shrunk to fit a max_side square, rounded as ImageOps.contain rounds."""
    if not max_side or max(width, height) <= max_side:
        return width, height
    if width > height:
        return max_side, max(1, round(height / width * max_side))
    if width < height:
        return max(1, round(width / height * max_side)), max_side
    return max_side, max_side


def resize(rgb, size):
    if (rgb.shape[1], rgb.shape[0]) == size:
        return rgb
    return np.asarray(Image.fromarray(rgb).resize(size, Image.Resampling.LANCZOS))
