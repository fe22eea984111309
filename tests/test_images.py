"""Unit tests for beam_pipeline.job.images with known pixels (no Beam, no TensorFlow)."""

import io
import random
import struct
import zlib

import numpy as np
import pytest
import simplejpeg
from PIL import Image

from beam_pipeline.job import images
from beam_pipeline.tools import sample_data
from beam_pipeline.job.images import EncodeOptions, ImageError
from beam_pipeline.job.jpeg import EXIF_ORIENTATION, exif_orientation, read_jpeg_header
from beam_pipeline.job.pixels import fit_size
from tests.helpers import noise_image

RED, BLUE, WHITE = (255, 0, 0), (0, 0, 255), (255, 255, 255)


# --- helpers ----------------------------------------------------------------------------------

def save(img, fmt, **kw):
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def jpeg(img, **kw):
    kw.setdefault("quality", 95)
    return save(img, "JPEG", **kw)


def opened(encoded):
    return Image.open(io.BytesIO(encoded.data))


def jpeg_markers(data):
    """JPEG marker codes up to the first SOS (start of scan)."""
    assert data[:2] == b"\xff\xd8", "not a JPEG"
    markers, i = [], 2
    while i < len(data):
        assert data[i] == 0xFF
        marker = data[i + 1]
        markers.append(marker)
        if marker == 0xDA:
            break
        i += 2 + struct.unpack(">H", data[i + 2:i + 4])[0]
    return markers


def assert_stored_form(encoded):
    """What every stored image must be: a complete baseline RGB JPEG of the declared size."""
    markers = jpeg_markers(encoded.data)
    assert 0xC0 in markers, f"no baseline SOF0 marker: {[hex(m) for m in markers]}"
    assert not {0xC1, 0xC2, 0xC3} & set(markers), "not baseline"
    assert encoded.data.endswith(b"\xff\xd9")
    img = opened(encoded)
    assert img.format == "JPEG" and img.mode == "RGB"
    assert not img.info.get("progressive") and not img.info.get("progression")
    assert img.size == (encoded.width, encoded.height)
    img.load()
    assert np.asarray(img).shape == (encoded.height, encoded.width, 3)
    assert img.getexif().get(EXIF_ORIENTATION, 1) == 1  # never rotated twice by viewers


def close(actual, expected, tol):
    return all(abs(a - e) <= tol for a, e in zip(actual, expected))


def assert_close(actual, expected, tol=6):
    assert close(actual, expected, tol), f"{actual} != {expected} (±{tol})"


def convert(data, **opts):
    encoded = images.convert(data, EncodeOptions(**opts))
    assert_stored_form(encoded)
    return encoded


# --- EXIF orientation -------------------------------------------------------------------------
# Stored image: 48 wide x 32 high, blue, with a red 16x16 block in its top-left corner.
# Where that corner lands in the upright image follows the EXIF spec's definition of each value
# ("row 0 is the visual …, column 0 is the visual …"), not Pillow's implementation.
W, H = 48, 32
EXPECTED_CORNER = {  # orientation -> (corner of the red block when viewed, size swapped?)
    1: ("top-left", False),
    2: ("top-right", False),     # mirrored horizontally
    3: ("bottom-right", False),  # rotated 180
    4: ("bottom-left", False),   # mirrored vertically
    5: ("top-left", True),       # transposed (mirror + rotate 270 CW)
    6: ("top-right", True),      # rotate 90 CW to view
    7: ("bottom-right", True),   # transverse
    8: ("bottom-left", True),    # rotate 90 CCW to view
}


def oriented_jpeg(orientation, size=(W, H)):
    img = Image.new("RGB", size, BLUE)
    img.paste(RED, (0, 0, 16, 16))
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = orientation
    return jpeg(img, exif=exif)


def corner_pixels(img, inset=4):
    w, h = img.size
    return {"top-left": img.getpixel((inset, inset)),
            "top-right": img.getpixel((w - 1 - inset, inset)),
            "bottom-left": img.getpixel((inset, h - 1 - inset)),
            "bottom-right": img.getpixel((w - 1 - inset, h - 1 - inset))}


@pytest.mark.parametrize("orientation", sorted(EXPECTED_CORNER))
def test_exif_orientation_applied(orientation):
    corner, swapped = EXPECTED_CORNER[orientation]
    encoded = convert(oriented_jpeg(orientation))
    assert (encoded.width, encoded.height) == ((H, W) if swapped else (W, H))
    assert encoded.passed_through == (orientation == 1)
    corners = corner_pixels(opened(encoded))
    for name, pixel in corners.items():
        assert_close(pixel, RED if name == corner else BLUE, tol=40)


def test_exif_orientation_with_draft_resize():
    # A big rotated JPEG shrunk through draft mode is still turned upright.
    encoded = convert(oriented_jpeg(6, size=(800, 400)), max_side=100)
    assert (encoded.width, encoded.height) == (50, 100)
    # The red block (16/800 of the width) is now tiny; the far corner must be blue.
    assert_close(corner_pixels(opened(encoded), inset=2)["bottom-left"], BLUE, tol=40)


# --- colour modes -----------------------------------------------------------------------------

@pytest.mark.parametrize("cmyk, rgb", [
    ((0, 255, 255, 0), (255, 0, 0)),        # pure red
    ((0, 0, 0, 255), (0, 0, 0)),            # black
    ((0, 0, 0, 0), (255, 255, 255)),        # white
    ((0, 128, 255, 64), (191, 95, 0)),      # (255 - C)(255 - K)/255
])
def test_cmyk_jpeg_to_rgb(cmyk, rgb):
    data = jpeg(Image.new("CMYK", (16, 16), cmyk))
    assert Image.open(io.BytesIO(data)).mode == "CMYK"
    encoded = convert(data)
    assert not encoded.passed_through
    assert_close(opened(encoded).getpixel((8, 8)), rgb, tol=8)


def test_grayscale_to_rgb():
    img = Image.new("L", (32, 16), 30)
    img.paste(220, (16, 0, 32, 16))
    for data in (jpeg(img), save(img, "PNG")):
        out = opened(convert(data))
        assert_close(out.getpixel((4, 8)), (30, 30, 30), tol=4)
        assert_close(out.getpixel((28, 8)), (220, 220, 220), tol=4)


def test_bilevel_to_rgb():
    img = Image.new("1", (16, 16), 0)
    img.paste(1, (8, 0, 16, 16))
    out = opened(convert(save(img, "PNG")))
    assert_close(out.getpixel((2, 8)), (0, 0, 0), tol=8)
    assert_close(out.getpixel((13, 8)), (255, 255, 255), tol=8)


def test_palette_with_transparency_composited_on_white():
    # Palette: 0 = red fully transparent, 1 = blue opaque, 2 = black at alpha 128.
    img = Image.new("P", (48, 16), 0)
    img.putpalette([255, 0, 0, 0, 0, 255, 0, 0, 0] + [0] * (253 * 3))
    img.paste(1, (16, 0, 32, 16))
    img.paste(2, (32, 0, 48, 16))
    data = save(img, "PNG", transparency=bytes([0, 255, 128]))
    assert Image.open(io.BytesIO(data)).mode == "P"
    out = opened(convert(data))
    assert_close(out.getpixel((8, 8)), WHITE)          # transparent red -> white, not red
    assert_close(out.getpixel((24, 8)), BLUE)
    grey = round(255 * (1 - 128 / 255))                # black over white at alpha 128
    assert_close(out.getpixel((40, 8)), (grey,) * 3)


def test_palette_single_transparent_index():
    img = Image.new("P", (32, 16), 0)
    img.putpalette([0, 255, 0, 0, 0, 255] + [0] * (254 * 3))
    img.paste(1, (16, 0, 32, 16))
    out = opened(convert(save(img, "GIF", transparency=0)))
    assert_close(out.getpixel((8, 8)), WHITE)
    assert_close(out.getpixel((24, 8)), BLUE)


@pytest.mark.parametrize("alpha", [0, 128, 255])
def test_rgba_composited_on_white(alpha):
    colour = (200, 0, 40)
    data = save(Image.new("RGBA", (16, 16), colour + (alpha,)), "PNG")
    a = alpha / 255
    expected = tuple(round(c * a + 255 * (1 - a)) for c in colour)
    assert_close(opened(convert(data)).getpixel((8, 8)), expected, tol=5)


def test_grey_with_alpha_composited_on_white():
    data = save(Image.new("LA", (16, 16), (0, 64)), "PNG")
    expected = round(255 * (1 - 64 / 255))
    assert_close(opened(convert(data)).getpixel((8, 8)), (expected,) * 3, tol=5)


def test_16_bit_grey_full_range_scaled():
    values = [0, 32768, 65535, 257 * 100]          # -> 0, ~128, 255, 100
    arr = np.zeros((16, 64), dtype=np.uint16)
    for i, v in enumerate(values):
        arr[:, 16 * i:16 * (i + 1)] = v
    data = save(Image.fromarray(arr), "PNG")
    assert Image.open(io.BytesIO(data)).mode.startswith("I")
    out = opened(convert(data))
    for i, expected in enumerate([0, 128, 255, 100]):
        assert_close(out.getpixel((16 * i + 8, 8)), (expected,) * 3, tol=3)


def test_16_bit_dark_image_is_not_stretched():
    # A uniformly dark 16-bit image stays dark: scaling is by the format's range, not the max.
    data = save(Image.fromarray(np.full((16, 16), 257 * 40, dtype=np.uint16)), "PNG")
    assert_close(opened(convert(data)).getpixel((8, 8)), (40, 40, 40), tol=3)


def test_16_bit_rgb_png():
    # 16 bits per channel RGB(A) PNGs: Pillow reduces them to 8-bit; colour must survive.
    arr = np.zeros((16, 16, 3), dtype=np.uint16)
    png = _png_rgb16(arr + np.array([65535, 0, 32768], dtype=np.uint16))
    assert_close(opened(convert(png)).getpixel((8, 8)), (255, 0, 128), tol=6)


def _png_chunk(kind, body):
    return (struct.pack(">I", len(body)) + kind + body
            + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))


def _png_rgb16(arr):
    """A 16-bit-per-channel RGB PNG written by hand (Pillow cannot save one)."""
    h, w, _ = arr.shape
    raw = b"".join(b"\0" + arr[y].astype(">u2").tobytes() for y in range(h))
    chunk = _png_chunk
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def test_animated_gif_first_frame():
    frames = [Image.new("RGB", (16, 16), RED).convert("P"),
              Image.new("RGB", (16, 16), BLUE).convert("P")]
    data = save(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    assert getattr(Image.open(io.BytesIO(data)), "n_frames", 1) == 2
    assert_close(opened(convert(data)).getpixel((8, 8)), RED, tol=8)


def test_animated_png_first_frame():
    data = save(Image.new("RGB", (16, 16), BLUE), "PNG", save_all=True,
                append_images=[Image.new("RGB", (16, 16), RED)])
    assert_close(opened(convert(data)).getpixel((8, 8)), BLUE, tol=8)


def test_progressive_jpeg_reencoded_to_baseline():
    data = jpeg(Image.new("RGB", (32, 24), (10, 120, 200)), progressive=True)
    assert 0xC2 in jpeg_markers(data)
    encoded = convert(data)  # assert_stored_form checks baseline
    assert not encoded.passed_through and encoded.data != data
    assert_close(opened(encoded).getpixel((16, 12)), (10, 120, 200), tol=6)


# --- resize -----------------------------------------------------------------------------------

def test_resize_by_max_side_png():
    encoded = convert(save(Image.new("RGB", (64, 48), RED), "PNG"), max_side=32)
    assert (encoded.width, encoded.height) == (32, 24)


def test_no_upscale_and_pass_through_when_within_max_side():
    data = jpeg(Image.new("RGB", (40, 30), RED))
    encoded = convert(data, max_side=40)
    assert encoded.passed_through and encoded.data == data


@pytest.mark.parametrize("size, max_side, expected", [
    ((2000, 1500), 100, (100, 75)),
    ((998, 400), 500, (500, 200)),    # DCT scaling must not round 500 down to 499
    ((398, 100), 200, (200, 50)),
    ((1000, 2000), 500, (250, 500)),
])
def test_resize_big_jpeg_uses_dct_scaling(monkeypatch, size, max_side, expected):
    # libjpeg-turbo decodes at 1/2, 3/8, 1/4 or 1/8 scale when that still covers the target
    # (what Pillow's draft mode did before): far less work. Spies on simplejpeg, not our code.
    decoded = []
    original = simplejpeg.decode_jpeg

    def spy(*args, **kwargs):
        pixels = original(*args, **kwargs)
        decoded.append(pixels.shape[:2][::-1])
        return pixels

    monkeypatch.setattr(simplejpeg, "decode_jpeg", spy)
    img = Image.new("RGB", size, (30, 160, 90))
    img.paste(RED, (0, 0, size[0] // 2, size[1]))
    encoded = convert(jpeg(img, quality=80), max_side=max_side)
    assert (encoded.width, encoded.height) == expected
    assert len(decoded) == 1, "decoded more than once"
    assert all(d >= e for d, e in zip(decoded[0], expected)), "scaled below the target"
    if max(size) >= 2 * max_side:
        assert max(decoded[0]) < max(size), "did not decode at a reduced scale"
    out = opened(encoded)
    assert_close(out.getpixel((2, expected[1] // 2)), RED, tol=30)
    assert_close(out.getpixel((expected[0] - 3, expected[1] // 2)), (30, 160, 90), tol=30)


@pytest.mark.parametrize("size, max_side, expected", [
    ((64, 48), 0, (64, 48)), ((64, 48), 64, (64, 48)), ((64, 48), 32, (32, 24)),
    ((48, 64), 32, (24, 32)), ((50, 50), 20, (20, 20)), ((10_000, 1), 100, (100, 1)),
])
def test_fit_size(size, max_side, expected):
    assert fit_size(*size, max_side) == expected


# --- pass-through and re-encode ---------------------------------------------------------------

def test_pass_through_keeps_bytes_under_auto():
    data = jpeg(Image.new("RGB", (32, 24), (90, 10, 200)))
    encoded = convert(data)
    assert encoded.passed_through and encoded.data == data
    assert (encoded.width, encoded.height) == (32, 24)


def test_reencode_always_changes_bytes():
    data = jpeg(Image.new("RGB", (32, 24), (90, 10, 200)), quality=95)
    encoded = convert(data, reencode="always", jpeg_quality=50)
    assert not encoded.passed_through and encoded.data != data
    assert_close(opened(encoded).getpixel((16, 12)), (90, 10, 200), tol=10)


def test_non_jpeg_never_passed_through():
    encoded = convert(save(Image.new("RGB", (16, 16), RED), "PNG"))
    assert not encoded.passed_through


@pytest.mark.parametrize("variant", sorted(set(sample_data.VARIANTS)))
def test_every_sample_variant_gives_stored_form(variant):
    data, _ = sample_data.encode(Image.new("RGB", (40, 24), (200, 100, 50)), variant)
    encoded = convert(data)
    assert (encoded.width, encoded.height) == (40, 24)  # the exif variant is stored rotated


def test_decode_returns_upright_rgb():
    assert images.decode(oriented_jpeg(8)).shape == (W, H, 3)  # turned upright: H wide, W high
    pixels = images.decode(save(Image.new("L", (W, H), 40), "PNG"))
    assert pixels.dtype == np.uint8 and pixels.shape == (H, W, 3)


# --- rejections -------------------------------------------------------------------------------

def reject(data, **opts):
    with pytest.raises(ImageError) as info:
        images.convert(data, EncodeOptions(**opts))
    return info.value


def test_zero_byte_file():
    e = reject(b"")
    assert (e.stage, e.reason) == ("read", "empty_file")


def test_truncated_jpeg():
    data = jpeg(noise_image((64, 64), 60).convert("RGB"))
    e = reject(data[: len(data) // 2])
    assert (e.stage, e.reason) == ("decode", "truncated")
    assert e.detail


def test_jpeg_truncated_inside_its_header():
    data = jpeg(noise_image((64, 64), 60).convert("RGB"))
    assert reject(data[:300]).reason == "truncated"


def test_truncated_png():
    data = save(noise_image((64, 64), 60), "PNG")
    assert reject(data[: len(data) // 2]).reason == "truncated"


def test_sample_broken_files():
    expected = {"truncated.jpg": "truncated", "empty.jpg": "empty_file",
                "not_an_image.jpg": "not_an_image"}
    for name, data in sample_data.broken_files().items():
        assert reject(data).reason == expected[name], name


def test_text_named_jpg():
    e = reject(b"this is a text file, not a JPEG\n")
    assert (e.stage, e.reason) == ("decode", "not_an_image")


def _png_header_only(width, height):
    chunk = _png_chunk
    # IHDR claims the size; one tiny IDAT so Pillow identifies it; the pixels are missing.
    return (b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 64)))


def test_decompression_bomb_header():
    # 100 bytes claiming 100,000 x 100,000 pixels: rejected from the header, nothing allocated.
    e = reject(_png_header_only(100_000, 100_000))
    assert e.reason == "decompression_bomb"


def test_decompression_bomb_just_over_pillow_limit():
    e = reject(_png_header_only(10_000, 10_000))  # 1e8 > 89,478,485 default
    assert e.reason == "decompression_bomb"


def test_max_pixels_limit():
    data = jpeg(Image.new("RGB", (20, 20), RED))
    e = reject(data, max_pixels=399)
    assert (e.stage, e.reason) == ("decode", "decompression_bomb")
    assert "400" in e.detail
    assert convert(data, max_pixels=400).passed_through


def test_encode_options_validated():
    for bad in ({"reencode": "never"}, {"jpeg_quality": 0}, {"jpeg_quality": 101},
                {"max_side": -1}):
        with pytest.raises(ValueError) as info:
            EncodeOptions(**bad)
        assert str(list(bad.values())[0]) in str(info.value)


def test_max_pixels_above_pillows_default_is_honoured():
    # --max_pixels 150M must accept a 100M-pixel header (Pillow's own default limit is ~89M);
    # this one then fails for its missing pixels, not as a bomb.
    e = reject(_png_header_only(10_000, 10_000), max_pixels=150_000_000)
    assert e.reason != "decompression_bomb", e.detail


# --- strict validation (libjpeg-turbo warnings) ------------------------------------------------

def noise_jpeg(size=(96, 64)):
    return jpeg(noise_image(size, 60).convert("RGB"))


def scan_middle(data):
    return (data.index(b"\xff\xda") + len(data)) // 2


def pillow_decodes(data):
    Image.open(io.BytesIO(data)).load()  # raises if Pillow notices anything
    return True


@pytest.mark.parametrize("mutate, message", [
    (lambda d, i: d[:i] + b"\xff\xd5" + d[i + 2:], "premature end of data segment"),
    (lambda d, i: d[:i] + b"\0" * 40 + d[i + 40:], "extraneous bytes before marker 0xd9"),
])
def test_jpeg_data_that_loses_pixels_is_rejected(mutate, message):
    data = noise_jpeg()
    damaged = mutate(data, scan_middle(data))
    assert pillow_decodes(damaged)  # Pillow decodes it silently: stored before strict decoding
    e = reject(damaged)
    assert (e.stage, e.reason) == ("decode", "corrupt_data")
    assert "Corrupt JPEG data" in e.detail and message in e.detail


def test_header_validation_trusts_the_scan():
    data = noise_jpeg()
    damaged = data[:scan_middle(data)] + b"\xff\xd5" + data[scan_middle(data) + 2:]
    encoded = images.convert(damaged, EncodeOptions(validate="header"))
    assert encoded.passed_through and encoded.data == damaged
    assert reject(damaged, reencode="always", validate="header").reason == "corrupt_data"


def test_junk_between_header_segments_is_repaired():
    # libjpeg warns "extraneous bytes before marker 0xdb" but loses no pixel: re-encode.
    data = jpeg(Image.new("RGB", (32, 24), (90, 10, 200)))
    app0_end = 4 + int.from_bytes(data[4:6], "big")
    damaged = data[:app0_end] + b"junk" + data[app0_end:]
    with pytest.raises(ValueError, match="extraneous bytes before marker 0xdb"):
        simplejpeg.decode_jpeg(damaged)
    encoded = convert(damaged)
    assert not encoded.passed_through
    assert_close(opened(encoded).getpixel((16, 12)), (90, 10, 200))


def test_junk_before_end_of_image_is_rejected():
    # Bytes the scan did not use look the same whether appended or left over by a scan that
    # lost its way (which shifts every later pixel), so they are rejected, not repaired.
    data = noise_jpeg()
    assert reject(data[:-2] + b"junk" * 8 + data[-2:]).reason == "corrupt_data"


def test_png_pixel_data_checked_against_its_crc():
    data = save(noise_image((64, 64), 60), "PNG")
    i = data.index(b"IDAT") + 40
    damaged = data[:i] + bytes([data[i] ^ 0x04]) + data[i + 1:]
    e = reject(damaged)
    assert (e.reason, "IDAT" in e.detail) == ("corrupt_data", True)


def test_png_without_iend_is_truncated():
    data = save(Image.new("RGB", (16, 16), RED), "PNG")
    assert reject(data[:-12]).reason == "truncated"


@pytest.mark.parametrize("variant", ["jpeg", "progressive", "cmyk", "exif", "png", "gif"])
def test_validate_header_stores_what_decode_stores(variant):
    data, _ = sample_data.encode(sample_data.draw("circle", random.Random(3)), variant)
    strict = convert(data)
    trusting = convert(data, validate="header")
    assert (strict.data, strict.passed_through) == (trusting.data, trusting.passed_through)


def test_reencode_is_baseline_420_rgb():
    encoded = convert(save(noise_image((64, 48), 60).convert("RGB"), "PNG"))
    assert simplejpeg.decode_jpeg_header(encoded.data)[2:] == ("YCbCr", "420")


def test_multi_picture_jpeg_is_reencoded():
    # An MPO (two images, an MPF segment) must not be stored with its second image inside.
    frames = [Image.new("RGB", (32, 24), RED), Image.new("RGB", (32, 24), BLUE)]
    data = save(frames[0], "MPO", save_all=True, append_images=frames[1:])
    encoded = convert(data)
    assert not encoded.passed_through and len(encoded.data) < len(data)
    assert_close(opened(encoded).getpixel((16, 12)), RED)


@pytest.mark.parametrize("tiff, expected", [
    (b"MM\0*\0\0\0\x08\0\x01\x01\x12\0\x03\0\0\0\x01\0\x06\0\0", 6),   # big-endian SHORT
    (b"II*\0\x08\0\0\0\x01\0\x12\x01\x04\0\x01\0\0\0\x03\0\0\0", 3),   # little-endian LONG
    (b"II*\0\x08\0\0\0\x01\0\x12\x01\x03\0\x01\0\0\0\x09\0\0\0", 1),   # out of range
    (b"II*\0\xff\0\0\0", 1),                                            # IFD past the end
    (b"XX", 1),
])
def test_exif_orientation(tiff, expected):
    assert exif_orientation(tiff) == expected


# --- pixel moments (tf.Transform statistics) -------------------------------------------------

def test_pixel_moments_exact():
    rgb = np.zeros((2, 3, 3), dtype=np.uint8)
    rgb[..., 0], rgb[0, :, 1], rgb[1, 2, 2] = 255, 10, 7
    count, sums, squares = images.pixel_moments(rgb)
    assert count == 6
    assert sums == (6 * 255.0, 30.0, 7.0)
    assert squares == (6 * 255.0 ** 2, 300.0, 49.0)
    assert all(isinstance(v, float) for v in sums + squares)


@pytest.mark.parametrize("opts", [{}, {"validate": "header"}, {"reencode": "always"},
                                  {"max_side": 16}])
def test_moments_are_those_of_the_stored_pixels(opts):
    data = jpeg(noise_image((48, 32), 40).convert("RGB"))
    encoded = images.convert(data, EncodeOptions(**opts), with_moments=True)
    assert encoded.moments == images.pixel_moments(images.decode(data, EncodeOptions(**opts)))
    count, _, _ = encoded.moments
    assert count == encoded.width * encoded.height
    assert images.convert(data, EncodeOptions(**opts)).moments is None


def test_moments_of_a_pass_through_match_its_stored_bytes():
    data = jpeg(noise_image((48, 32), 40).convert("RGB"))
    encoded = images.convert(data, with_moments=True)
    assert encoded.passed_through
    assert encoded.moments == images.pixel_moments(simplejpeg.decode_jpeg(data))


def test_jpeg_header_walk_reads_what_every_segment_says():
    """The segment walk's usual path (one unpack per segment) and its general one (fill
    bytes, junk, EXIF, a segment cut short) agree on frame, orientation and junk."""
    exif = Image.Exif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    Image.new("RGB", (16, 8), (10, 20, 30)).save(buf, "JPEG", exif=exif.tobytes(),
                                                 progressive=True)
    data = buf.getvalue()
    header = read_jpeg_header(data)
    assert (header.frame, header.orientation, header.junk, header.data) == (0xC2, 6, 0, data)
    sof = data.index(b"\xff\xc2")
    filled = data[:sof] + b"\xff\xff\xff" + data[sof + 1:]  # fill bytes before the SOF marker
    header = read_jpeg_header(filled)
    assert (header.frame, header.orientation, header.junk) == (0xC2, 6, 0)
    with pytest.raises(ImageError) as cut:
        read_jpeg_header(data[:sof + 6])
    assert cut.value.reason == "truncated" and f"0xC2 at byte {sof} runs past" in str(cut.value)
