"""Serialized records -> (image, label): decode only the crop needed, resize, flip, scale.

Pure per-element functions, tested without a dataset. Speed: the JPEG is decoded straight to
its crop window (`decode_and_crop_jpeg`); the crop is cast to float32 before the resize (the
uint8 resize kernel is slower; the output is bit-identical) and flipped after it (fewer pixels).
"""

import tensorflow as tf

from dataset_format import schema

CROP_FRACTION = 0.875  # eval center crop, as the TPU ImageNet reference (224 of 256)
_SPEC = {schema.ENCODED: tf.io.FixedLenFeature([], tf.string),
         schema.LABEL: tf.io.FixedLenFeature([], tf.int64)}
_KEY_SPEC = {schema.FILENAME: tf.io.FixedLenFeature([], tf.string, default_value="")}


def parse(record):
    ex = tf.io.parse_single_example(record, _SPEC)
    return ex[schema.ENCODED], ex[schema.LABEL]


def parse_key(record):
    """The record's key (image/filename: catalog.parquet's key), "" when it has none."""
    return tf.io.parse_single_example(record, _KEY_SPEC)[schema.FILENAME]


def train_crop(jpeg, seed):
    """Random-resized crop (Inception style) decoded from the JPEG -> (uint8 crop, flip seed)."""
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.io.extract_jpeg_shape(jpeg), bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
        seed=crop_seed, min_object_covered=0.1, aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=(0.08, 1.0), max_attempts=10, use_image_if_no_bounding_boxes=True)
    window = tf.stack([begin[0], begin[1], size[0], size[1]])
    return tf.io.decode_and_crop_jpeg(jpeg, window, channels=3), flip_seed


def center_crop(jpeg, crop_fraction):
    """A square center crop of `crop_fraction` of the shorter side, decoded from the JPEG."""
    shape = tf.io.extract_jpeg_shape(jpeg)
    side = tf.cast(crop_fraction * tf.cast(tf.minimum(shape[0], shape[1]), tf.float32),
                   tf.int32)
    side = tf.maximum(side, 1)
    window = tf.stack([(shape[0] - side + 1) // 2, (shape[1] - side + 1) // 2, side, side])
    return tf.io.decode_and_crop_jpeg(jpeg, window, channels=3)


def example_fn(training, size, output, label_shift, crop_fraction=CROP_FRACTION):
    """A map function (record[, seed]) -> (image [H, W, 3], label int32).

    output: an `Output` (dtype and value mapping). Training takes a per-element [2] seed for
    the stateless crop and flip.
    """
    height, width = size

    def to_example(record, *seed):
        jpeg, label = parse(record)
        if training:
            crop, flip_seed = train_crop(jpeg, seed[0])
        else:
            crop = center_crop(jpeg, crop_fraction)
        image = tf.image.resize(tf.cast(crop, tf.float32), [height, width], method="bilinear")
        if training:
            image = tf.image.stateless_random_flip_left_right(image, flip_seed)
        return output.apply(image), tf.cast(label + label_shift, tf.int32)

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
