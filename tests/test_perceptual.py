"""beam_pipeline.dedup.perceptual with known pixels (no Beam, no TensorFlow)."""

import io

import numpy as np
import pytest
import simplejpeg
from PIL import Image

from beam_pipeline.dedup import perceptual


def gradient(h=64, w=64):
    y, x = np.mgrid[0:h, 0:w]
    return ((x * 255) // (w - 1)).astype(np.uint8)


def photo_like(seed, h=256, w=320):
    """Smooth random blobs: a deterministic stand-in for a photo."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
    return np.asarray(Image.fromarray(small, "RGB").resize((w, h), Image.Resampling.BICUBIC))


def test_constant_image_hashes_to_the_dc_bit_only():
    # A flat image has energy in the DC coefficient alone: only the top-left bit is above
    # the median (0) of the 64 low frequencies, and it is the most significant bit.
    assert perceptual.phash(np.full((40, 40), 128, np.uint8)) == 1 << 63


def test_horizontal_gradient_sets_the_first_row_bits():
    # Brightness rising left to right: the DC term and the first horizontal frequencies are
    # non-zero, every vertical frequency is zero; the odd horizontal ones are negative.
    bits = perceptual.phash_bits(perceptual.thumbnail(gradient()))
    assert bits.reshape(8, 8)[1:].sum() == 0
    assert bits[0]


def test_bits_pack_most_significant_first():
    h = perceptual.phash(gradient())
    bits = perceptual.phash_bits(perceptual.thumbnail(gradient()))
    assert h == int("".join("1" if b else "0" for b in bits), 2)
    assert 0 <= h < 1 << 64


def textured(seed):
    """A grey image of seeded size (20-119 px a side) with blobs and noise: the sizes take
    every path (upscaled, as is, box-averaged first)."""
    rng = np.random.default_rng(seed)
    h, w = (int(v) for v in rng.integers(20, 120, 2))
    base = rng.integers(0, 256, tuple(int(v) for v in rng.integers(3, 12, 2)), dtype=np.uint8)
    img = np.asarray(Image.fromarray(base).resize((w, h), Image.Resampling.BICUBIC), int)
    return np.clip(img + rng.integers(-20, 21, img.shape), 0, 255).astype(np.uint8)


def pillow_thumbnail(grey):
    img = Image.fromarray(grey, "L")
    factor = perceptual.shrink_factor(*grey.shape)
    return img.reduce(factor) if factor > 1 else img


def test_golden_hashes_of_seeded_images():
    # The hash is stored in catalogs and compared across nights: these values must not move.
    assert [hex(perceptual.phash(photo_like(s))) for s in range(4)] == [
        "0xfc9848e313c4ae3b", "0x8ce3d8b83acbc534", "0xfc6c8d47db2420da", "0xdd79e29cd5ee0011"]
    assert hex(perceptual.phash(gradient())) == "0xaa00000000000000"


def test_golden_hash_pairs_of_seeded_images():
    # Whole image first (the same bits as phash), then its central 90%: both are stored.
    assert [tuple(map(hex, perceptual.phash_pair(photo_like(s)))) for s in range(4)] == [
        ("0xfc9848e313c4ae3b", "0xfc1848f313e413bb"), ("0x8ce3d8b83acbc534", "0x8ce1d8b832ca3bbc"),
        ("0xfc6c8d47db2420da", "0xec6c8d43db25db02"), ("0xdd79e29cd5ee0011", "0xcd79e09cd5ced500")]
    flat = np.full((40, 50), 77, np.uint8)
    assert perceptual.phash_pair(flat) == (1 << 63, 1 << 63)  # the DC bit only, both


def test_central_cuts_five_percent_of_each_side_rounded_half_up():
    assert perceptual.central(np.zeros((100, 200))).shape == (90, 180)
    assert perceptual.central(np.zeros((48, 64))).shape == (44, 58)  # 2.4 -> 2, 3.2 -> 3
    assert perceptual.central(np.zeros((30, 10))).shape == (26, 8)   # 1.5 -> 2, 0.5 -> 1
    assert perceptual.central(np.zeros((9, 1))).shape == (9, 1)      # too small to cut
    g = np.arange(20 * 40, dtype=np.uint8).reshape(20, 40)
    assert np.array_equal(perceptual.central(g), g[1:19, 2:38])


def least(x, y):
    return min(perceptual.hamming(a, b) for a in x for b in y)


def test_a_ten_percent_crop_moves_the_pairs_least_distance_less_than_the_whole_hash():
    # 5% off every edge: the crop's whole image is the original's central 90%.
    whole, pair = [], []
    for s in range(1, 8):
        rgb = photo_like(s, 384, 512)
        crop = rgb[19:-19, 26:-26]
        x, y = perceptual.phash_pair(rgb), perceptual.phash_pair(crop)
        whole.append(perceptual.hamming(x[0], y[0]))
        pair.append(least(x, y))
    assert whole == [12, 8, 8, 12, 14, 14, 14]
    assert pair == [4, 4, 2, 2, 4, 4, 2]
    assert min(whole) > 4 >= max(pair)


def test_thumbnail_is_pillows_lanczos_within_rounding():
    # Pillow rounds (and clips) to uint8 after each of its two passes; the matrices do not.
    for seed in range(20):
        grey = textured(seed)
        pil = np.asarray(pillow_thumbnail(grey).resize((32, 32), Image.Resampling.LANCZOS), float)
        ours = np.clip(perceptual.thumbnail(grey), 0, 255)
        assert np.abs(ours - pil).max() < 5, seed


def test_close_to_imagehash_phash_on_the_same_thumbnail():
    # imagehash.phash takes its median of Pillow's uint8 thumbnail: a coefficient next to the
    # median can swap sides, which moves two bits. The benchmark's 924 photos: 808 equal,
    # 115 two bits apart, one four.
    imagehash = pytest.importorskip("imagehash")
    distances = []
    for seed in range(40):
        grey = textured(seed)
        lib = int(str(imagehash.phash(pillow_thumbnail(grey))), 16)
        distances.append(perceptual.hamming(lib, perceptual.phash(grey)))
    assert max(distances) <= 2
    assert distances.count(0) >= 34
    for seed in range(5):
        grey = np.asarray(Image.fromarray(photo_like(seed)).convert("L").reduce(8))
        assert perceptual.phash(grey) == int(str(imagehash.phash(Image.fromarray(grey))), 16)


def test_rgb_grey_and_single_channel_agree():
    rgb = photo_like(1)
    grey = np.asarray(Image.fromarray(rgb).convert("L"))
    assert perceptual.phash(rgb) == perceptual.phash(grey) == perceptual.phash(grey[:, :, None])


def test_scaled_jpeg_decode_and_full_pixels_hash_alike():
    # The writer hashes a JPEG from a 1/8-scaled decode and other formats from full pixels.
    rgb = photo_like(2, 384, 512)
    jpeg = simplejpeg.encode_jpeg(rgb, quality=90, colorspace="RGB")
    small = simplejpeg.decode_jpeg(jpeg, "GRAY", min_width=perceptual.MIN_SIDE,
                                   min_height=perceptual.MIN_SIDE, strict=True)
    assert small.shape == (48, 64, 1)
    assert perceptual.hamming(perceptual.phash(small), perceptual.phash(rgb)) <= 4


def test_near_copies_are_near_and_different_photos_are_far():
    rgb = photo_like(3)
    img = Image.fromarray(rgb)
    buf = io.BytesIO()
    img.resize((160, 128), Image.Resampling.LANCZOS).save(buf, "JPEG", quality=50)
    copy = np.asarray(Image.open(buf))
    h = perceptual.phash(rgb)
    assert perceptual.hamming(h, perceptual.phash(copy)) <= 4
    assert all(perceptual.hamming(h, perceptual.phash(photo_like(s))) > 16 for s in (4, 5, 6))


def test_hamming():
    assert perceptual.hamming(0b1011, 0b0001) == 2
    assert perceptual.hamming((1 << 64) - 1, 0) == 64
    a = np.array([0, 1 << 63, 7], np.uint64)
    assert perceptual.hamming_many(a, np.uint64(0)).tolist() == [0, 1, 3]


def test_signed_round_trip():
    for h in (0, 1, (1 << 63) - 1, 1 << 63, (1 << 64) - 1):
        v = perceptual.to_signed(h)
        assert -(1 << 63) <= v < 1 << 63
        assert perceptual.from_signed(v) == h


@pytest.mark.parametrize("pixels, message", [
    (np.zeros((4, 4), np.float32), "uint8"),
    (np.zeros((4, 4, 4), np.uint8), "HxW"),
    (np.zeros((0, 5), np.uint8), "empty"),
])
def test_rejects_what_is_not_an_image(pixels, message):
    with pytest.raises(ValueError, match=message):
        perceptual.phash(pixels)
