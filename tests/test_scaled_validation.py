"""The cheap paths of a pass-through image keep their promises.

Validation decodes at DCT scale 1/8: it must reject exactly the JPEGs a full strict decode
rejects. Example serialization builds each field's header from lengths alone: it must still
give TensorFlow's bytes when lengths take several varint bytes.
"""

import io
import random

import numpy as np
import pytest
import simplejpeg
from PIL import Image, ImageDraw

from beam_pipeline.job import images
from dataset_format import examples


def _photo(seed, quality):
    """A seeded photo-like baseline JPEG: smooth colour gradients, fine texture, a disc."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:240, 0:320] / 320.0
    base = rng.random(3) * 0.5 + 0.25
    pixels = 255 * (base + 0.25 * np.stack([np.sin(6 * x + k) * np.cos(4 * y - k)
                                            for k in range(3)], axis=-1)
                    + 0.06 * rng.standard_normal((240, 320, 3)))
    img = Image.fromarray(pixels.clip(0, 255).astype(np.uint8))
    fill = tuple(int(v) for v in rng.integers(0, 256, 3))
    ImageDraw.Draw(img).ellipse((100, 60, 200, 160), fill=fill)
    out = io.BytesIO()
    img.save(out, "JPEG", quality=quality)
    return out.getvalue()


def _scan_start(jpeg):
    sos = jpeg.index(b"\xff\xda")
    return sos + 2 + int.from_bytes(jpeg[sos + 2:sos + 4], "big")


def _full_decode_rejects(jpeg):
    try:
        simplejpeg.decode_jpeg(jpeg, colorspace="GRAY", strict=True)
    except ValueError:
        return True
    return False


def test_scaled_validation_rejects_exactly_what_a_full_decode_rejects():
    rng = random.Random(20)
    clean = [_photo(seed, quality) for seed, quality in enumerate((75, 85, 95))]
    mutants = []
    for _ in range(150):  # 1-3 flipped bits in the entropy-coded data, where no header sees them
        data = bytearray(rng.choice(clean))
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(_scan_start(data), len(data) - 2)] ^= 1 << rng.randrange(8)
        mutants.append(bytes(data))
    for jpeg in mutants[:50]:  # and truncations
        mutants.append(jpeg[:rng.randrange(_scan_start(jpeg), len(jpeg))])
    rejected = 0
    for jpeg in clean + mutants:
        try:
            stored = images.convert(jpeg)
        except images.ImageError as e:
            assert e.reason in ("corrupt", "corrupt_data", "truncated"), e
            assert _full_decode_rejects(jpeg), f"scaled validation refused a clean decode: {e}"
            rejected += 1
            continue
        assert stored.passed_through and stored.data == jpeg
        assert not _full_decode_rejects(jpeg), "a JPEG the full decode refuses was stored"
    assert 50 < rejected < len(mutants)  # both outcomes are exercised


@pytest.mark.parametrize("size", [0, 127, 128, 16384, 2**21 + 3])
def test_serialize_example_equals_tensorflow_for_long_fields(size):
    import tensorflow as tf

    payload = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    features = {"image/encoded": payload, "n": -(2**63), "m": 2**63 - 1, "t": b"x" * (size % 300)}
    ours = examples.serialize_example(features)
    assert examples.parse_example(ours) == features  # both directions of one wire format
    assert tf.train.Example.FromString(ours).SerializeToString(deterministic=True) == ours
    parsed = tf.train.Example.FromString(ours).features.feature
    assert parsed["image/encoded"].bytes_list.value == [payload]
    assert parsed["n"].int64_list.value == [-(2**63)]
