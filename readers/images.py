"""Serialized records -> (image, label): decode only the crop needed, resize, flip, scale.

Pure per-element functions, tested without a dataset. Speed: the JPEG is decoded straight to
its crop window (`decode_and_crop_jpeg`); the crop is cast to float32 before the resize (the
uint8 resize kernel is slower; the output is bit-identical) and flipped after it (fewer pixels).
"""

import sys

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


def decode_batches(fn, skip_corrupt, element_spec, batch_size, drop_remainder):
    """A dataset transformation: (record, path, position, ...) -> batches of fn's
    (image, label), where a record fn cannot parse or decode names its shard file, position
    and key: an error (or, with skip_corrupt, a warning and no element).

    Each batch's records are decoded inside their own small dataset with `ignore_errors`, so
    it sees that batch's decoding only, never reading or the checks upstream; batches are
    decoded in parallel by the outer map. A batch that comes out short is decoded again
    record by record to find which record failed: that costs only when one did.
    """
    image_spec, label_spec = element_spec
    empty = (tf.zeros([0] + image_spec.shape.as_list(), image_spec.dtype),
             tf.zeros([0], label_spec.dtype))

    def per_batch(records, paths, positions, *rest):
        done = tf.data.Dataset.from_tensor_slices((records,) + rest).map(fn).ignore_errors(
            log_warning=True)  # TensorFlow's reason, in its log
        images, labels = done.batch(batch_size).concatenate(
            tf.data.Dataset.from_tensors(empty)).take(1).get_single_element()
        short = tf.shape(images)[0] < tf.shape(records)[0]
        report = tf.cond(short, lambda: _report(fn, records, paths, positions, rest,
                                                skip_corrupt), tf.no_op)
        with tf.control_dependencies([report]):
            return tf.identity(images), tf.identity(labels)

    def apply(ds, deterministic=None):
        ds = ds.batch(batch_size, drop_remainder=drop_remainder).map(
            per_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
        if skip_corrupt:  # batches that lost records: batch again
            return ds.unbatch().batch(batch_size, drop_remainder=drop_remainder)
        if drop_remainder:  # full or failed: the batch dimension is static
            shapes = [batch_size] + image_spec.shape.as_list()
            return ds.map(lambda images, labels: (tf.ensure_shape(images, shapes),
                                                  tf.ensure_shape(labels, [batch_size])))
        return ds

    return apply


def _report(fn, records, paths, positions, rest, skip_corrupt):
    """Decode a short group's records one by one; fail (or warn) naming each that fails."""
    def failed(i):
        one = tf.data.Dataset.from_tensors(
            (records[i],) + tuple(r[i] for r in rest)).map(fn).ignore_errors()
        return one.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1) == 0

    def name(i):
        where = _where(records[i], paths[i], positions[i])
        if skip_corrupt:
            return tf.print(tf.strings.join([
                "WARNING readers: skip_corrupt: ", where, " is not a decodable image record; "
                "skipped"]), output_stream=sys.stderr)
        return tf.debugging.Assert(False, [tf.strings.join([
            where, ": cannot parse it or decode its image (TensorFlow logged why above); "
            "rebuild the dataset, or pass skip_corrupt=True to skip such records"])])

    def step(count, i):
        with tf.control_dependencies([tf.cond(failed(i), lambda: name(i), tf.no_op)]):
            return count + 1

    n = tf.data.Dataset.range(tf.shape(records, out_type=tf.int64)[0]).reduce(
        tf.constant(0, tf.int64), step)
    return tf.group(n)


def _where(record, path, position):
    key = tf.data.Dataset.from_tensors(record).map(
        lambda r: tf.io.parse_single_example(r, _KEY_SPEC)[schema.FILENAME]).ignore_errors()
    key = key.concatenate(tf.data.Dataset.from_tensors(tf.constant("?"))).take(1)
    return tf.strings.join([path, ": record ", tf.strings.as_string(position), " (key ",
                            key.get_single_element(), ")"])
