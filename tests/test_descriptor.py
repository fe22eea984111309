"""dedup/descriptor.py: the second opinion on a near-duplicate candidate, on seeded pixels (no
Beam): near copies are confirmed, the hash's known false pairs are not."""

import io

import numpy as np
import pytest
import simplejpeg
from PIL import Image, ImageEnhance

from beam_pipeline.dedup import descriptor, perceptual


def photo_like(seed, h=240, w=320):
    """Smooth random blobs plus fine seeded texture: a stand-in photo."""
    rng = np.random.default_rng(seed)
    blobs = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8), "RGB")
    base = np.asarray(blobs.resize((w, h), Image.Resampling.BICUBIC), np.int16)
    return Image.fromarray(np.clip(base + rng.integers(-12, 13, (h, w, 1)), 0, 255)
                           .astype(np.uint8))


def jpeg_small(img, quality=90):
    """What the writer describes a pass-through JPEG from: a strict DCT-scaled RGB decode."""
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality)
    return simplejpeg.decode_jpeg(buf.getvalue(), "RGB", min_width=perceptual.MIN_SIDE,
                                  min_height=perceptual.MIN_SIDE, strict=True)


def test_the_probes_are_the_corner_crops_hashes_and_older_descriptors_still_compare():
    """The first 32 bytes: pHashes of the four 95% corner crops, so a copy cut to one of
    them has a probe 0 bits from its whole hash; a descriptor written before the colour grid
    (291 bytes: no grid) and one written before the probes (the last 259 bytes alone) give
    the same measures as each other, of the whole means."""
    rng = np.random.default_rng(3)
    img = np.clip(rng.normal(128, 40, (48, 64)).cumsum(1) / 8 % 256, 0, 255).astype(np.uint8)
    d = descriptor.describe(img)
    h, w = img.shape
    dh, dw = (h + 10) // 20, (w + 10) // 20
    crops = [img[:h - dh, :w - dw], img[:h - dh, dw:], img[dh:, :w - dw], img[dh:, dw:]]
    assert descriptor.probes(d) == tuple(perceptual.phash(c) for c in crops)
    assert len(set(descriptor.probes(d))) == 4 and descriptor.probes(d[80:]) == ()
    assert descriptor.probes(d[:32] + d[80:]) == descriptor.probes(d)
    other = descriptor.describe(crops[3])
    s_new, c_new = descriptor.distances([d], [other])
    s_291, c_291 = descriptor.distances([d[:32] + d[80:]], [other[:32] + other[80:]])
    s_259, c_259 = descriptor.distances([d[80:]], [other[80:]])
    s_mix, c_mix = descriptor.distances([d], [other[80:]])  # one side without the grid
    assert s_new.tolist() == s_291.tolist() == s_259.tolist() == s_mix.tolist()
    assert c_291.tolist() == c_259.tolist() == c_mix.tolist()
    assert descriptor.gridded([d, d, d[:32] + d[80:]], [other, other[80:], other]).tolist() == [
        True, False, False]


def png(img):
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def verdict(a, b):
    s, c = descriptor.distances([descriptor.describe(np.asarray(a))],
                                [descriptor.describe(np.asarray(b))])
    return float(s[0]), float(c[0]), bool(descriptor.confirmed(s, c)[0])


def test_layout_and_size():
    d = descriptor.describe(np.full((40, 50, 3), (200, 100, 50), np.uint8))
    assert len(d) == descriptor.SIZE == 4 * 8 + 4 * 4 * 3 + 259
    assert descriptor.parse([d[80:]])[0].tolist() == descriptor.parse([d])[0].tolist()
    thumb, means = descriptor.parse([d])
    assert thumb.shape == (1, 16, 16) and np.all(thumb == thumb[0, 0, 0])
    # Pillow's YCbCr of (200, 100, 50): Y 124, Cb 86, Cr 182 (Cb, Cr offset by 128)
    assert means[0].tolist() == [124, 86, 182]
    assert list(d[32:80]) == [124, 86, 182] * 16  # the grid: the same in every cell
    assert descriptor.grids([d], means)[0].tolist() == [[[124, 86, 182]] * 4] * 4
    grey = descriptor.describe(np.full((40, 50), 77, np.uint8))
    assert descriptor.parse([grey])[1][0].tolist() == [77, 128, 128]
    assert list(grey[32:80]) == [77, 128, 128] * 16
    # left half red, right half blue: the grid's left and right columns, each cell's Y Cb Cr
    halves = np.zeros((40, 48, 3), np.uint8)
    halves[:, :24], halves[:, 24:] = (200, 0, 0), (0, 0, 200)
    cells = np.frombuffer(descriptor.describe(halves), np.uint8, 48, 32).reshape(4, 4, 3)
    assert cells[:, 0].tolist() == [[60, 94, 228]] * 4 and cells[:, 3].tolist() == [
        [23, 228, 112]] * 4
    with pytest.raises(ValueError, match="empty"):
        descriptor.describe(np.zeros((0, 5, 3), np.uint8))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_near_copies_are_confirmed(seed):
    img = photo_like(seed)
    w, h = img.size
    copies = {
        "re-encoded q40": jpeg_small(img, 40),
        "resized 45%": np.asarray(img.resize((w * 45 // 100, h * 45 // 100),
                                             Image.Resampling.LANCZOS)),
        "brighter 10%": np.asarray(ImageEnhance.Brightness(img).enhance(1.1)),
        "brighter 8%, saved as PNG": np.asarray(Image.open(io.BytesIO(png(
            ImageEnhance.Brightness(img).enhance(1.08))))),
        "darker 10%": np.asarray(ImageEnhance.Brightness(img).enhance(0.9)),
        "cropped 10% off one corner": np.asarray(img.crop((w // 10, h // 10, w, h))),
        "cropped 5% off each edge": np.asarray(img.crop((w // 20, h // 20, w - w // 20,
                                                         h - h // 20))),
    }
    original = jpeg_small(img)
    for name, copy in copies.items():
        s, c, ok = verdict(original, copy)
        assert ok, (name, s, c)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_copy_cut_off_one_side_only_lines_up(seed):
    """8% off one side (the aspect changes), then downscaled to 45% or darkened 8%: a window
    cut on that side alone matches it (structure 0.005-0.013 measured; windows cutting
    both sides alike gave 0.013-0.043)."""
    img = photo_like(seed)
    w, h = img.size
    right = img.crop((0, 0, w - w * 8 // 100, h))
    copies = [right.resize((right.width * 45 // 100, right.height * 45 // 100),
                           Image.Resampling.LANCZOS),
              ImageEnhance.Brightness(img.crop((0, h * 8 // 100, w, h))).enhance(0.92)]
    for copy in copies:
        s, c, ok = verdict(jpeg_small(img), copy)
        assert ok and s < 0.015, (s, c)


@pytest.mark.parametrize("seed", [1, 3])
def test_a_crop_that_moves_the_mean_colour_lines_up_by_its_window(seed):
    """A photo reddening to the right, cut 10% off the right: the whole means differ (the
    crop took the reddest part: 2.98 and 3.26 levels measured), the colour over the window
    structure lined up does not (0.70, 1.03); without the grid, the means as before."""
    img = np.asarray(photo_like(seed)).astype(np.float64)
    ramp = np.linspace(0, 1, img.shape[1])[None, :, None] ** 2
    red = np.clip(img * (1 - 0.6 * ramp) + 0.6 * ramp * np.array([230, 40, 40]), 0, 255)
    red = red.astype(np.uint8)
    a = descriptor.describe(jpeg_small(Image.fromarray(red)))
    b = descriptor.describe(red[:, :red.shape[1] * 90 // 100])
    s, c = descriptor.distances([a], [b])
    _, c_means = descriptor.distances([a[:32] + a[80:]], [b[:32] + b[80:]])
    assert c[0] < c_means[0] / 2 and c_means[0] > 2.5, (c, c_means)
    assert descriptor.confirmed(s, c, descriptor.gridded([a], [b]))[0]


def disc(colour, centre=(0.5, 0.5), radius=0.35, side=200, blur=False):
    """A disc of `colour` on black, brightest at its centre (a retina photo's shape)."""
    y, x = np.mgrid[0:side, 0:side] / side
    d = np.hypot(x - centre[0], y - centre[1]) / radius
    shade = np.clip(1 - 0.5 * d, 0, 1) * (d < 1)
    return (np.asarray(colour, np.float64)[None, None] * shade[..., None]).astype(np.uint8)


def test_a_grey_gradient_and_a_red_disc_share_the_hash_not_the_colour():
    grey, red = disc((200, 200, 200)), disc((220, 60, 40))
    assert perceptual.hamming(perceptual.phash(grey), perceptual.phash(red)) <= 4
    s, c, ok = verdict(grey, red)
    assert s < descriptor.MAX_STRUCTURE and c > 3 * descriptor.MAX_CHROMA and not ok


def test_two_crops_of_one_texture_are_not_confirmed():
    """Seeded grain of one kind: crops that overlap nowhere (a lunar surface, a wall)."""
    rng = np.random.default_rng(7)
    grain = Image.fromarray(rng.integers(90, 160, (120, 240), dtype=np.uint8), "L")
    texture = np.asarray(grain.resize((480, 240), Image.Resampling.BICUBIC))
    s, _, ok = verdict(texture[:, :240], texture[:, 240:])
    assert s > 2 * descriptor.MAX_STRUCTURE and not ok


def test_flat_fields_are_never_confirmed():
    """No texture, no structure to confirm with: two plain walls (or one wall twice) can't
    be told apart by their pixels, so no pair of them is confirmed."""
    wall = np.full((100, 100, 3), (180, 170, 150), np.uint8)
    s, c, ok = verdict(wall, wall)
    assert c == 0 and s == pytest.approx(1.0) and not ok


def test_distances_are_symmetric_and_batched():
    imgs = [np.asarray(photo_like(k)) for k in range(4)]
    ds = [descriptor.describe(i) for i in imgs]
    s1, c1 = descriptor.distances(ds[:2] + ds[2:3], ds[1:4])
    s2, c2 = descriptor.distances(ds[1:4], ds[:2] + ds[2:3])
    assert np.allclose(s1, s2) and np.allclose(c1, c2)
    one = [descriptor.distances([a], [b]) for a, b in zip(ds[:3], ds[1:4])]
    assert np.allclose(s1, [o[0][0] for o in one], atol=1e-6)
    assert descriptor.distances([], [])[0].shape == (0,)
