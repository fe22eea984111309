"""One truth for pixels: the tf.data reader, the TensorFlow-free loaders (simplejpeg) and
Pillow decode a stored record to the same uint8 pixels, whole and after the evaluation
center crop; the reader's cropped decodes equal the whole decode sliced.

Images are seeded textures (gradients + noise, 4:2:0 JPEGs at quality 75-95): a solid colour
would decode alike under any IDCT, so these tests could not fail.
"""

import io

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

import loaders
import readers
from loaders import records as loader_records
from readers import images
from tests import test_reader

SHAPES = [(48, 64), (61, 47), (40, 40), (80, 57)]  # (height, width), cycled over records


def textured_jpeg(rid, label=0):
    rng = np.random.default_rng(1000 + rid)
    height, width = SHAPES[rid % len(SHAPES)]
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / width, y * 255 / height, (x + y) * 127 / (width + height)], -1)
    pixels = np.clip(base + rng.normal(0, 40, base.shape), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=int(rng.integers(75, 96)),
                                 subsampling=2)
    return out.getvalue()


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("pixels")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(test_reader, "_jpeg", textured_jpeg)
        test_reader.write_dataset(root, splits=(("train", 12, 2), ("validation", 8, 2)))
    return str(root)


def pillow(jpeg):
    return np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"))


def stored(root, split):
    """{key: stored JPEG bytes} of a split, through the loaders (no TensorFlow)."""
    return {ex.key: ex.image for ex in loaders.RecordSource(root, split, decode=False)}


def reader_images(root, split, **kwargs):
    ds = readers.make_dataset(root, split, batch_size=None, image_size=None, dtype="uint8",
                              training=False, with_keys=True, **kwargs)
    return {key.numpy().decode(): image.numpy() for image, _, key in ds}


@pytest.mark.parametrize("split", ["train", "validation"])
def test_reader_loaders_and_pillow_decode_the_same_pixels(root, split):
    jpegs = stored(root, split)
    ours = reader_images(root, split)
    loaded = {ex.key: ex.image for ex in loaders.RecordSource(root, split)}
    streamed = {ex.key: ex.image for ex in loaders.SequentialRecords(root, split)}
    assert sorted(ours) == sorted(loaded) == sorted(streamed) == sorted(jpegs)
    for key, jpeg in jpegs.items():
        want = pillow(jpeg)
        np.testing.assert_array_equal(ours[key], want, err_msg=key)
        np.testing.assert_array_equal(loaded[key], want, err_msg=key)
        np.testing.assert_array_equal(streamed[key], want, err_msg=key)
    # the opt-out is TensorFlow's default IDCT: it does differ on these textures
    fast = reader_images(root, split, dct_method="INTEGER_FAST")
    assert any(not np.array_equal(fast[k], pillow(j)) for k, j in jpegs.items())


def test_evaluation_center_crop_is_the_whole_decode_cropped(root):
    """Evaluation at the crop's own size (a resize to the same size changes nothing) gives
    the loaders' center_crop of the Pillow decode, for every shape."""
    jpegs = stored(root, "validation")
    for shape in sorted(set(SHAPES)):
        keys = [k for k, j in jpegs.items() if pillow(j).shape[:2] == shape]
        side = loader_records.center_crop(np.zeros(shape + (3,), np.uint8)).shape[0]
        ds = readers.make_dataset(root, "validation", batch_size=None, image_size=side,
                                  dtype="uint8", with_keys=True)
        got = {key.numpy().decode(): image.numpy() for image, _, key in ds}
        for key in keys:
            np.testing.assert_array_equal(
                got[key], loader_records.center_crop(pillow(jpegs[key])), err_msg=key)


def test_a_cropped_decode_equals_the_whole_decode_sliced(root):
    """Any window, MCU-aligned or not, at any edge: libjpeg's cropped decode alone differs
    in the edge columns (up to 11 levels measured), the margin makes it exact."""
    rng = np.random.default_rng(7)
    plain_differs = 0
    for jpeg in stored(root, "train").values():
        whole = pillow(jpeg)
        height, width = whole.shape[:2]
        for k in range(12):
            h, w = int(rng.integers(1, height + 1)), int(rng.integers(1, width + 1))
            y, x = int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1))
            if k < 4:
                x = x // 16 * 16
            window = tf.constant([y, x, h, w])
            got = images.decode_window(tf.constant(jpeg), window).numpy()
            np.testing.assert_array_equal(got, whole[y:y + h, x:x + w], err_msg=(y, x, h, w))
            plain = tf.io.decode_and_crop_jpeg(jpeg, window, channels=3,
                                               dct_method=images.EXACT_IDCT).numpy()
            plain_differs += not np.array_equal(plain, whole[y:y + h, x:x + w])
    assert plain_differs  # without the margin the edges differ: the margin is what fixes it


def test_training_crops_are_cut_from_the_exact_pixels(root):
    """A training crop resized to its own size is the whole decode sliced: the crop the
    stateless box picks, then the exact decode (checked at the stored size: no crop)."""
    jpegs = stored(root, "train")
    ds = readers.make_dataset(root, "train", batch_size=None, image_size=None, dtype="uint8",
                              seed=3, with_keys=True)
    for image, _, key in ds:
        want = pillow(jpegs[key.numpy().decode()])
        flipped = want[:, ::-1]
        assert np.array_equal(image.numpy(), want) or np.array_equal(image.numpy(), flipped)
