"""The training input pipeline: manifest shards -> tf.data.Dataset of (images, labels).

Memory stays bounded because only serialized records (~40 KB JPEGs) sit in the shuffle
buffer and cache; pixels exist only between decode and batch. Speed comes from
decoding just the crop window (`decode_and_crop_jpeg`) and parallel interleaved reads.
"""

import logging
import random
import sys

import tensorflow as tf

from readers import dataset_info as info_lib
from readers import schema

log = logging.getLogger(__name__)

READ_BUFFER_BYTES = 8 << 20  # per open shard; large reads keep gs:// throughput up
SHUFFLE_BUFFER_BYTES = 128 << 20  # default shuffle buffer: ~this many serialized bytes
CROP_FRACTION = 0.875  # eval center crop, as the TPU ImageNet reference (224 of 256)
_KEYS = (schema.ENCODED, schema.LABEL)


def make_dataset(path, split="train", batch_size=128, image_size=224, training=None,
                 seed=None, input_context=None, dtype=tf.float32, shuffle_buffer=None,
                 repeat=False, drop_remainder=None, cycle_length=None, deterministic=None,
                 cache=False, label_offset=0, skip_corrupt=False, transform=False,
                 crop_fraction=CROP_FRACTION, read_buffer_bytes=READ_BUFFER_BYTES):
    """A `tf.data.Dataset` of `(images [B, H, W, 3], labels [B] int32)` for `model.fit`.

    path: dataset root (LATEST is resolved once, now), version dir, or a `readers.info()`
      result (pins the version).
    training: random-resized crop + flip and shuffling; default `split == "train"`.
      Otherwise a center crop of `crop_fraction` and the manifest's order.
    seed: makes the training stream (file order, shuffle, crops, flips) the same on every
      run; every call with the same seed yields the same sequence of epochs.
    input_context: a `tf.distribute.InputContext`; `batch_size` is then per replica.
      Each input pipeline reads a disjoint subset of the shard files; with fewer files
      than pipelines, every pipeline reads all files and keeps every n-th record.
    dtype: uint8 keeps 0..255; a float dtype is scaled to [0, 1].
    shuffle_buffer: records (serialized) to shuffle over; default ~128 MiB worth (>= 1024).
    repeat: False (one epoch, known cardinality), True (forever) or an epoch count.
    drop_remainder: default `training`, so every training batch has a static shape.
    deterministic: default: order is fixed unless training without a seed.
    cache: True (memory) or a file prefix: caches serialized records, never pixels.
    label_offset: labels come out as 0-based id + label_offset, whatever the manifest's
      own offset is (e.g. 1 for a model with a background class 0).
    skip_corrupt: a corrupt or truncated shard loses its remaining records (a TFRecord
      stream cannot resync) with a logged count, instead of failing; cardinality is then
      unknown.
    transform: apply the version's saved tf.Transform graph (readers/transform.py) instead
      of crop/flip/resize: `(images [B, S, S, 3] float32, normalized; labels [B] int64)`,
      S = the build's --transform_image_size; image_size, dtype and crop_fraction are unused.
    """
    ds_info = path if isinstance(path, info_lib.DatasetInfo) else info_lib.info(path)
    split_info = ds_info.split(split)
    training = (split == "train") if training is None else bool(training)
    if deterministic is None:
        deterministic = not training or seed is not None
    if drop_remainder is None:
        drop_remainder = training
    height, width = (image_size, image_size) if isinstance(image_size, int) else image_size
    dtype = tf.as_dtype(dtype)
    if not (dtype == tf.uint8 or dtype.is_floating):
        raise ValueError(f"dtype={dtype.name}: use uint8 or a float dtype")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")

    files, counts, record_shard = _host_files(split_info, input_context, seed)
    num_records = sum(counts)
    label_shift = label_offset - ds_info.label_offset

    # (path, expected records) per shard file this pipeline reads
    ds = tf.data.Dataset.from_tensor_slices((files, tf.constant(counts, tf.int64)))
    if training:
        ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    read = _shard_reader(record_shard, skip_corrupt, read_buffer_bytes)
    ds = ds.interleave(read, cycle_length=cycle_length or min(len(files), 16) or 1,
                       block_length=1, num_parallel_calls=tf.data.AUTOTUNE,
                       deterministic=deterministic)
    # -> serialized tf.train.Example bytes
    if not skip_corrupt:
        ds = ds.apply(tf.data.experimental.assert_cardinality(num_records))
    if cache:
        ds = ds.cache("" if cache is True else cache)
    if training:
        buffer = _shuffle_buffer(shuffle_buffer, split_info, num_records)
        if buffer > 1:
            ds = ds.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)
    if repeat is True:
        ds = ds.repeat()
    elif repeat:
        ds = ds.repeat(int(repeat))

    if training:
        # per-element [2] seeds for the stateless crop and flip; the same seed gives the
        # same seed stream, and each epoch (iteration) draws fresh ones.
        seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2)
        ds = tf.data.Dataset.zip((ds, seeds))  # -> (record, seed[2])
        decode = _train_decoder(height, width)
    else:
        decode = _eval_decoder(height, width, crop_fraction)

    if transform:
        to_example = _transform_fn(ds_info, label_shift)
    else:
        to_example = _resized(decode, height, width, dtype, label_shift)

    ds = ds.map(to_example, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
    if skip_corrupt:  # records that frame fine but fail to parse or decode
        ds = ds.ignore_errors(log_warning=True)
    ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    ds = ds.prefetch(tf.data.AUTOTUNE)

    options = tf.data.Options()
    options.deterministic = deterministic
    if input_context is not None:  # already sharded here; don't let tf.distribute redo it
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.OFF)
    return ds.with_options(options)


def _transform_fn(ds_info, label_shift):
    """Hook for the tf.Transform stage: a map fn (record[, seed]) -> (features, label) that
    replaces decode/crop/resize; reading, sharding, shuffling and batching stay as they are."""
    from readers import transform as transform_lib

    return transform_lib.record_fn(transform_lib.load(ds_info), label_shift)


def _host_files(split_info, input_context, seed):
    """(files, records expected from each, record_shard) for this input pipeline.

    record_shard is None, or (num_pipelines, index) when there are too few files to give
    each pipeline its own; then expected counts are this pipeline's share of each file.
    """
    shards = [s for s in split_info.shards if s.num_examples > 0]
    if not shards:
        raise ValueError(f"split {split_info.name!r} has no records")
    n = input_context.num_input_pipelines if input_context else 1
    index = input_context.input_pipeline_id if input_context else 0
    if n <= 1:
        return [s.path for s in shards], [s.num_examples for s in shards], None
    # Same order on every host (same seed, same manifest), so the slices are disjoint.
    random.Random(0 if seed is None else seed).shuffle(shards)
    if len(shards) >= n:
        mine = shards[index::n]
        return [s.path for s in mine], [s.num_examples for s in mine], None
    log.warning("split %r has %d shard files for %d input pipelines: every pipeline reads "
                "all files and keeps every %d-th record (more shards would read faster)",
                split_info.name, len(shards), n, n)
    counts = [len(range(index, s.num_examples, n)) for s in shards]
    return [s.path for s in shards], counts, (n, index)


def _resized(decode, height, width, dtype, label_shift):
    """(record[, seed]) -> (image [H, W, 3] in dtype, label): decode, resize, scale."""

    def to_example(*args):
        image, label = decode(*args)
        image = tf.image.resize(image, [height, width], method="bilinear")  # float32 0..255
        if dtype == tf.uint8:
            image = tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
        else:
            image = tf.cast(image * (1.0 / 255.0), dtype)
        return image, tf.cast(label + label_shift, tf.int32)

    return to_example


def _shuffle_buffer(shuffle_buffer, split_info, num_records):
    if shuffle_buffer is not None:
        return int(shuffle_buffer)
    mean_bytes = (split_info.num_bytes or 0) / max(split_info.num_examples, 1) or 100_000
    return int(min(num_records, max(1024, SHUFFLE_BUFFER_BYTES // mean_bytes)))


def _shard_reader(record_shard, skip_corrupt, read_buffer_bytes):
    """A function (path, expected) -> Dataset of that file's records.

    TFRecordDataset's DataLossError names no file, and the interleave hides which one failed.
    So each file is read with ignore_errors (which ends the file at the first bad frame) and
    compared with the record count in the manifest: a short file raises an error naming it,
    or with skip_corrupt, logs how many records were lost. The strict check costs nothing per
    record: the failing tail is only pulled if the file runs out before `expected`.
    """

    def read(path, expected):
        records = tf.data.TFRecordDataset(path, buffer_size=read_buffer_bytes)
        records = records.ignore_errors(log_warning=True)  # logs TF's own reason + offset
        if record_shard:
            records = records.shard(*record_shard)
        if not skip_corrupt:
            fail = tf.data.Dataset.from_tensors(path).map(lambda p: _short_file(p, expected))
            return records.concatenate(fail).take(expected)
        marked = records.map(lambda r: (r, False)).concatenate(
            tf.data.Dataset.from_tensors((tf.constant(b""), True)))
        # -> (index in file, (record, is_end_marker))

        def keep(i, item):
            is_end = item[1]
            with tf.control_dependencies([tf.cond(
                    is_end & (i < expected), lambda: _log_lost(path, i, expected), tf.no_op)]):
                return tf.logical_not(is_end)

        return marked.enumerate().filter(keep).map(lambda i, item: item[0])

    return read


def _short_file(path, expected):
    check = tf.debugging.Assert(False, [tf.strings.join([
        path, ": fewer records than the ", tf.strings.as_string(expected), " in manifest.json; "
        "the shard is corrupt (bad CRC), truncated or missing (TensorFlow logged the reason above). "
        "Rebuild the dataset, or pass skip_corrupt=True to read past it."])])
    with tf.control_dependencies([check]):
        return tf.constant(b"")


def _log_lost(path, got, expected):
    return tf.print("WARNING readers: skip_corrupt: ", path, ": read ", got, " of ", expected,
                    " records, skipped ", expected - got, " (corrupt, truncated or missing)",
                    sep="", output_stream=sys.stderr)  # not via logging: data loss is never muted


def _decode_fields(record):
    ex = tf.io.parse_single_example(record, schema.feature_spec(_KEYS))
    return ex[schema.ENCODED], ex[schema.LABEL]


def _train_decoder(height, width):
    """Random-resized crop (Inception style) decoded straight from the JPEG, then a flip."""

    def decode(record, seed):
        jpeg, label = _decode_fields(record)
        crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
        begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
            tf.io.extract_jpeg_shape(jpeg), bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
            seed=crop_seed, min_object_covered=0.1, aspect_ratio_range=(3 / 4, 4 / 3),
            area_range=(0.08, 1.0), max_attempts=10, use_image_if_no_bounding_boxes=True)
        window = tf.stack([begin[0], begin[1], size[0], size[1]])
        image = tf.io.decode_and_crop_jpeg(jpeg, window, channels=3)
        image = tf.image.stateless_random_flip_left_right(image, flip_seed)
        return image, label

    return decode


def _eval_decoder(height, width, crop_fraction):
    """Center crop of `crop_fraction` of the shorter side, decoded straight from the JPEG."""

    def decode(record):
        jpeg, label = _decode_fields(record)
        shape = tf.io.extract_jpeg_shape(jpeg)
        side = tf.cast(crop_fraction * tf.cast(tf.minimum(shape[0], shape[1]), tf.float32),
                       tf.int32)
        side = tf.maximum(side, 1)
        window = tf.stack([(shape[0] - side + 1) // 2, (shape[1] - side + 1) // 2, side, side])
        return tf.io.decode_and_crop_jpeg(jpeg, window, channels=3), label

    return decode
