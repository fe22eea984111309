"""Boxes are in the upright picture (docs/format.md, "Fields"): the writer's conversion
turns every input upright, so a box written against the picture as a viewer shows it frames
the same pixels in the stored image, for all 8 EXIF orientations (the mirrored 2, 4, 5 and
7 too), through the JPEG path and Pillow's, with and without --max_side resizing."""

import io

import numpy as np
import pytest
from PIL import Image, ImageOps

from beam_pipeline.job import images
from beam_pipeline.job.pixels import EncodeOptions

SIZE = (160, 96)  # the upright picture's width, height
BOX = {"xmin": 0.25, "ymin": 0.5, "xmax": 0.5, "ymax": 0.875}  # off centre: a flip moves it
# Pillow's transpose that makes the file's pixel grid from the upright picture, per EXIF
# orientation: the inverse of what ImageOps.exif_transpose (a viewer) applies.
STORED_AS = {1: None, 2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180,
             4: Image.Transpose.FLIP_TOP_BOTTOM, 5: Image.Transpose.TRANSPOSE,
             6: Image.Transpose.ROTATE_90, 7: Image.Transpose.TRANSVERSE,
             8: Image.Transpose.ROTATE_270}


def upright():
    """Grey, a red rectangle exactly at BOX, and a blue dot in the top left corner (so a
    transposed picture of the same box would still show as wrong)."""
    w, h = SIZE
    pixels = np.full((h, w, 3), 128, np.uint8)
    pixels[int(BOX["ymin"] * h):int(BOX["ymax"] * h),
           int(BOX["xmin"] * w):int(BOX["xmax"] * w)] = (230, 20, 20)
    pixels[4:16, 4:16] = (20, 20, 230)
    return Image.fromarray(pixels)


def stored_file(orientation, fmt="JPEG"):
    """The file a camera would write: the picture's pixels in its sensor's grid, and the
    EXIF orientation a viewer turns them upright by."""
    pixels = upright()
    if STORED_AS[orientation] is not None:  # FLIP_LEFT_RIGHT is 0
        pixels = pixels.transpose(STORED_AS[orientation])
    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    pixels.save(buf, fmt, exif=exif.tobytes(), **({"quality": 95} if fmt == "JPEG" else {}))
    return buf.getvalue()


def red_box(pixels):
    """The red rectangle's extent as fractions of the width and height (pixel edges)."""
    h, w, _ = pixels.shape
    red = (pixels[..., 0] > 150) & (pixels[..., 1] < 100) & (pixels[..., 2] < 100)
    ys, xs = np.nonzero(red)
    return {"xmin": xs.min() / w, "xmax": (xs.max() + 1) / w,
            "ymin": ys.min() / h, "ymax": (ys.max() + 1) / h}


def assert_box_on_marker(pixels):
    """The red rectangle where BOX says (within a pixel and a half: JPEG blurs its edges),
    the blue dot top left."""
    h, w, _ = pixels.shape
    got = red_box(pixels)
    for side, want in BOX.items():
        assert abs(got[side] - want) <= 1.5 / (w if side[0] == "x" else h), (side, got)
    corner = pixels[:h // 5, :w // 5].reshape(-1, 3).astype(int)
    assert corner[:, 2].max() > 150 and corner[:, 0].min() < 100


@pytest.mark.parametrize("orientation", range(1, 9))
def test_the_fixture_is_what_a_viewer_shows_upright(orientation):
    """Pillow's own exif_transpose, an independent reading of the tag, shows the picture;
    the file's own grid does not (but for orientation 1)."""
    for fmt in ("JPEG", "PNG"):
        stored = Image.open(io.BytesIO(stored_file(orientation, fmt)))
        assert stored.getexif()[0x0112] == orientation
        assert_box_on_marker(np.asarray(ImageOps.exif_transpose(stored).convert("RGB")))
        if orientation != 1:
            with pytest.raises(AssertionError):
                assert_box_on_marker(np.asarray(stored.convert("RGB")))


@pytest.mark.parametrize("max_side", [0, 40])
@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
@pytest.mark.parametrize("orientation", range(1, 9))
def test_the_stored_image_has_the_box_on_its_marker(orientation, fmt, max_side):
    encoded = images.convert(stored_file(orientation, fmt), EncodeOptions(max_side=max_side))
    pixels = np.asarray(Image.open(io.BytesIO(encoded.data)).convert("RGB"))
    h, w, _ = pixels.shape
    assert (w, h) == ((40, 24) if max_side else SIZE)  # upright: landscape
    assert_box_on_marker(pixels)
