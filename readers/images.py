"""Serialized records -> (image, label[, key]): decode only the crop needed, resize, flip, scale.

Pure per-element functions, tested without a dataset. Speed: the JPEG is decoded straight to
its crop window (`decode_and_crop_jpeg`); the crop is cast to float32 before the resize (the
uint8 resize kernel is slower; the output is bit-identical) and flipped after it (fewer pixels).

Pixels: libjpeg-turbo's accurate integer IDCT (`dct_method="INTEGER_ACCURATE"`), the one
simplejpeg (the TensorFlow-free loaders) and Pillow use, so every path gives the same uint8
pixels for a record; TensorFlow's default IDCT differs from them by up to 16 levels on
photographs. A crop is decoded with MARGIN more columns either side, then sliced: libjpeg's
cropped decode upsamples chroma as if the crop's right edge, and an MCU-aligned left edge,
were the image's, which put up to 11 levels into those columns. Fancy upsampling reads one
chroma sample beyond an output pixel, so one column is enough: 480 random crops of 60
photographs (aligned and unaligned edges) all equal the whole image's decode sliced, with
a margin of 1, 2 or 16 columns.
"""

import dataclasses
from typing import Any, Optional, Tuple

import tensorflow as tf

from dataset_format import schema

CROP_FRACTION = 0.875  # eval center crop, as the TPU ImageNet reference (224 of 256)
EXACT_IDCT = "INTEGER_ACCURATE"  # libjpeg-turbo's islow: simplejpeg's and Pillow's pixels
FAST_IDCT = "INTEGER_FAST"  # libjpeg-turbo's ifast: the opt-out (up to 16 levels off)
DCT_METHODS = (EXACT_IDCT, FAST_IDCT)
MARGIN = 1  # columns decoded beyond each side of a crop: the chroma upsampler's reach
_SPEC = {schema.ENCODED: tf.io.FixedLenFeature([], tf.string),
         schema.LABEL: tf.io.FixedLenFeature([], tf.int64)}
_KEY_SPEC = {schema.FILENAME: tf.io.FixedLenFeature([], tf.string, default_value="")}


@dataclasses.dataclass(frozen=True)
class Pixels:
    """What one record becomes: `size` (height, width), or None for the stored size (no crop
    or resize); `output` an Output; labels 0-based + `label_shift` applied to the stored id;
    the evaluation center crop's `crop_fraction`; the IDCT; and whether the key comes too."""
    size: Optional[Tuple[int, int]]
    output: Any
    label_shift: int = 0
    crop_fraction: float = CROP_FRACTION
    dct_method: str = EXACT_IDCT
    with_keys: bool = False


def parse(record):
    ex = tf.io.parse_single_example(record, _SPEC)
    return ex[schema.ENCODED], ex[schema.LABEL]


def parse_key(record):
    """The record's key (image/filename: catalog.parquet's key), "" when it has none."""
    return tf.io.parse_single_example(record, _KEY_SPEC)[schema.FILENAME]


def decode(jpeg, dct_method=EXACT_IDCT):
    """The whole image, uint8 [H, W, 3]."""
    return tf.io.decode_jpeg(jpeg, channels=3, dct_method=dct_method)


def decode_window(jpeg, window, dct_method=EXACT_IDCT, shape=None):
    """The pixels of `window` (y, x, height, width) of the JPEG: the same uint8 values as
    decoding it whole and slicing, decoding only about the window (see MARGIN)."""
    shape = tf.io.extract_jpeg_shape(jpeg) if shape is None else shape
    y, x, height, width = tf.unstack(window)
    left = tf.maximum(x - MARGIN, 0)
    right = tf.minimum(x + width + MARGIN, shape[1])
    wide = tf.io.decode_and_crop_jpeg(jpeg, tf.stack([y, left, height, right - left]),
                                      channels=3, dct_method=dct_method)
    return wide[:, x - left:x - left + width]


def train_crop(jpeg, seed, dct_method=EXACT_IDCT):
    """Random-resized crop (Inception style) decoded from the JPEG -> (uint8 crop, flip seed)."""
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    shape = tf.io.extract_jpeg_shape(jpeg)
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape, bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
        seed=crop_seed, min_object_covered=0.1, aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=(0.08, 1.0), max_attempts=10, use_image_if_no_bounding_boxes=True)
    window = tf.stack([begin[0], begin[1], size[0], size[1]])
    return decode_window(jpeg, window, dct_method, shape), flip_seed


def center_window(height, width, crop_fraction=CROP_FRACTION):
    """(y, x, side, side): the square center crop of `crop_fraction` of the shorter side (as
    tensors or ints: loaders and tests compute the same window)."""
    side = tf.cast(crop_fraction * tf.cast(tf.minimum(height, width), tf.float32), tf.int32)
    side = tf.maximum(side, 1)
    return tf.stack([(height - side + 1) // 2, (width - side + 1) // 2, side, side])


def center_crop(jpeg, crop_fraction, dct_method=EXACT_IDCT):
    """A square center crop of `crop_fraction` of the shorter side, decoded from the JPEG."""
    shape = tf.io.extract_jpeg_shape(jpeg)
    return decode_window(jpeg, center_window(shape[0], shape[1], crop_fraction), dct_method,
                         shape)


def example_fn(training, pixels):
    """A map function (record[, seed]) -> (image [H, W, 3], label int32[, key string]).

    pixels: a Pixels. Training takes a per-element [2] seed for the stateless crop and flip
    (at the stored size: the flip alone)."""

    def to_example(record, *seed):
        jpeg, label = parse(record)
        if pixels.size is None:
            image = tf.cast(decode(jpeg, pixels.dct_method), tf.float32)
            if training:
                image = tf.image.stateless_random_flip_left_right(image, seed[0])
        else:
            if training:
                crop, flip_seed = train_crop(jpeg, seed[0], pixels.dct_method)
            else:
                crop = center_crop(jpeg, pixels.crop_fraction, pixels.dct_method)
            image = tf.image.resize(tf.cast(crop, tf.float32), pixels.size, method="bilinear")
            if training:
                image = tf.image.stateless_random_flip_left_right(image, flip_seed)
        out = (pixels.output.apply(image), tf.cast(label + pixels.label_shift, tf.int32))
        return out + ((parse_key(record),) if pixels.with_keys else ())

    return to_example


class Output:
    """How 0..255 float pixels become the output: `scale * v + offset`, then `dtype`.

    value_range (lo, hi) maps 0..255 linearly onto lo..hi (default: (0, 1) for a float
    dtype, (0, 255) for uint8); `mean`/`std` (per channel,
    0..255 scale) instead give (v - mean) / std, as the tf.Transform graph does.
    """

    def __init__(self, dtype, value_range=None, mean=None, std=None):
        self.dtype = tf.as_dtype(dtype)
        if value_range is None:
            value_range = (0, 255) if self.dtype == tf.uint8 else (0, 1)
        lo, hi = (float(v) for v in value_range)
        if not (self.dtype == tf.uint8 or self.dtype.is_floating):
            raise ValueError(f"dtype={self.dtype.name}: use uint8 or a float dtype")
        if not lo < hi:
            raise ValueError(f"value_range={value_range}: needs low < high, e.g. (0, 255)")
        if self.dtype == tf.uint8 and (mean is not None or (lo, hi) != (0, 255)):
            raise ValueError("dtype=uint8 holds 0..255 pixels only: use value_range=(0, 255) "
                             "and no transform, or a float dtype")
        if mean is not None:
            std = [s if s > 0 else 1.0 for s in std]
            self.scale = [1.0 / s for s in std]
            self.offset = [-m / s for m, s in zip(mean, std)]
        else:
            self.scale, self.offset = (hi - lo) / 255.0, lo
        self.identity = self.scale == 1.0 and self.offset == 0.0

    def apply(self, image):
        if self.dtype == tf.uint8:
            return tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
        if not self.identity:
            image = image * tf.constant(self.scale, tf.float32) + tf.constant(
                self.offset, tf.float32)
        return tf.cast(image, self.dtype)
