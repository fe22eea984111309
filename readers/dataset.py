"""The training input pipeline: manifest shards -> tf.data.Dataset of (images, labels).

Memory stays bounded because only serialized records (~40 KB JPEGs) sit in the shuffle
buffer and cache; pixels exist only between decode and batch. Speed comes from decoding just
the crop window, one record per call of a parallel map (the pipeline a tf.data user writes),
and parallel interleaved reads.

`make_dataset` checks its arguments (readers/arguments.py), resolves them into one frozen
readers.spec.DatasetSpec, and readers/pipeline.py builds the pipeline from it.
"""

import dataclasses

import tensorflow as tf

from dataset_format import dataset_info as info_lib, holds, removal
from readers import (arguments as args, fields as fields_lib, hosts as hosts_lib, images, native,
                     pipeline, spec as spec_lib, transform as transform_lib)

CROP_FRACTION = images.CROP_FRACTION


def make_dataset(path, split="train", batch_size=128, image_size=224, training=None,
                 seed=None, input_context=None, dtype=tf.float32, value_range=None,
                 shuffle_buffer=None, repeat=False, drop_remainder=None, cycle_length=None,
                 deterministic=None, cache=False, label_offset=0, skip_corrupt=False,
                 transform=False, crop_fraction=CROP_FRACTION, version=None,
                 read_buffer_bytes=None, start=None, with_keys=False,
                 native_batching="ragged", dct_method=images.EXACT_IDCT, hold=False,
                 fields=None):
    """A `tf.data.Dataset` of `(images [B, H, W, 3], labels [B] int32)` for `model.fit`.

    path: dataset root, version dir, or a `readers.info()` result (pins the version).
    split: a split name or a TFDS slice of one: "train[:10%]", "train[5000:]" (counts from
      the manifest, rounded as TFDS rounds them).
    batch_size: None gives unbatched (image, label) elements.
    image_size: an int, (height, width), or None: each image whole at its stored size (no
      crop or resize; a random flip in training), batched as `native_batching`: "ragged"
      (tf.RaggedTensor) or "padded" (zeros to the batch's largest image).
    version: a version id under ROOT/versions/, or a tag, to read instead of following LATEST.
    hold: True (or a lease length in seconds): retention keeps the version while the dataset
      is alive, and for the lease's length after the job stops (dataset_format/holds.py).
    fields: declared fields to read (names, or a `readers.Fields`): elements become dicts
      {"image", "label", name: ...}, boxes moved with the crop and flip (readers/fields.py).
    training: random-resized crop + flip and shuffling; default `split == "train"`.
      Otherwise a center crop of `crop_fraction` and the manifest's order.
    seed: makes the training stream (file order, shuffle, crops, flips) the same on every
      run. Without it, `tf.random.set_seed` / `keras.utils.set_random_seed` seed it.
    input_context: a `tf.distribute.InputContext`; `batch_size` is then per replica.
      Without one, a multi-worker cluster (the strategy in scope, else TF_CONFIG) is
      detected and `batch_size` is the global batch. See docs/reader.md for what every host
      reads; several hosts need a pinned version (`version=` or a version dir).
    dtype, value_range: float pixels map 0..255 onto value_range: (0, 1) by default,
      (0, 255) for Keras models with their own preprocessing (EfficientNet, ConvNeXt, …),
      (-1, 1) for MobileNetV2/Inception style; uint8 keeps 0..255.
    shuffle_buffer: records (serialized) to shuffle over; default ~32 MiB worth, at least
      1,024 records (the shard files are also shuffled and 16 read interleaved).
    repeat: False (one epoch), True or -1 (forever), or an epoch count.
    drop_remainder: default `training`, so every training batch has a static shape. A
      batch larger than what a host reads an epoch is an error (0 steps), unless
      drop_remainder=False asks for one partial batch.
    deterministic: default: order is fixed unless training without any seed.
    cache: True (memory) or a file prefix: caches serialized records, never pixels; with a
      file, memory stays that of no cache (chunks reshuffled in a bounded buffer).
    label_offset: labels come out as 0-based id + label_offset, whatever the manifest's
      own offset is (e.g. 1 for a model with a background class 0).
    skip_corrupt: a damaged record (bad CRC) and a record that does not decode are skipped
      with a warning naming them, instead of failing, and counted on `.skips`; cardinality
      is then unknown. With `.index` files (the build's default) only the damaged record
      is lost; without them the rest of its shard is (a TFRecord stream cannot resync). In
      the resumable order (start=) a skipped record is replaced by another of its batch,
      so every host runs the same steps and every step reads the records the order names.
      Missing or wrong-sized files always fail.
    transform: normalize with the version's tf.Transform statistics, (v - mean) / std per
      channel, instead of value_range: the same values its saved graph gives, after this
      reader's crops, flips and image_size.

    start: resume training here (docs/reader.md, "Preemptible training"): a global step (an
      int, e.g. `int(optimizer.iterations)`), a `readers.Position(epoch, records)`, or a
      callable returning either, read as each iteration begins (`lambda:
      int(model.optimizer.iterations)` follows Keras' BackupAndRestore). Training then reads
      the resumable order: each epoch's order is a function of (the split's content, split,
      seed, epoch), never of the version id; every host takes its part of each global
      batch, and any position is reached without reading what comes before it. Without start, training reads the stream
      order (not resumable; needs no .index files, and takes Model.fit/
      experimental_distribute_dataset on several hosts without an input_context).
    with_keys: yield (images, labels, keys) (every order, evaluation, slices, unbatched
      and native size), keys the records' `image/filename` (catalog.parquet's key).
    dct_method: "INTEGER_ACCURATE" (default): the same uint8 pixels as the loaders
      (simplejpeg) and Pillow; "INTEGER_FAST": TensorFlow's default IDCT, up to 16 levels
      off (docs/reader.md, "Pixels").

    The dataset carries `.dataset_info` (the version read: `.dataset_info.version`),
    `.plan` (readers.hosts.HostPlan: this host's share), `.class_names` and
    `.steps_per_epoch` (this host's batches an epoch) and `.skips` (what skip_corrupt
    skipped: `.count`, `.names`). Attributes do not survive `.map()`:
    take `readers.info(ROOT).class_names`, and `ds.cardinality()` for the steps.
    """
    # Every argument is checked before anything is read: one line naming what is wrong.
    version, split = args.text("version", version, "follow LATEST"), args.split(split)
    training = args.flag("training", training, "split == 'train'")
    drop_remainder = args.flag("drop_remainder", drop_remainder, "the value of training")
    deterministic = args.flag("deterministic", deterministic,
                              "fixed unless training without a seed")
    batch_size = args.positive_int("batch_size", batch_size, "unbatched elements")
    size, dtype = args.image_size(image_size), args.dtype(dtype)
    value_range, transform = args.value_range(value_range), args.flag("transform", transform)
    label_offset, crop_fraction = args.label_offset(label_offset), args.crop_fraction(
        crop_fraction)
    dct_method = args.choice("dct_method", dct_method, images.DCT_METHODS)
    reading = dict(cache=args.cache(cache),
                   cycle_length=args.positive_int("cycle_length", cycle_length, "automatic"),
                   read_buffer_bytes=args.positive_int("read_buffer_bytes", read_buffer_bytes,
                                                       "automatic"),
                   shuffle_buffer=args.positive_int("shuffle_buffer", shuffle_buffer,
                                                    "~32 MiB of records"),
                   skip_corrupt=args.flag("skip_corrupt", skip_corrupt))
    native_batching = args.choice("native_batching", native_batching, native.NATIVE_BATCHING)
    epochs, start, seed = args.repeat(repeat), args.start(start), args.seed(seed)
    with_keys, input_context = args.flag("with_keys", with_keys), args.input_context(
        input_context)

    ds_info = _version(path, version, hold)
    wanted = fields_lib.requested(fields, ds_info)
    window = spec_lib.window_of(ds_info, split)
    training = window.split == "train" if training is None else training
    seed = spec_lib.global_seed(seed, training)
    hosts = hosts_lib.detect(input_context)
    spec_lib.check_pinned(ds_info, hosts)
    spec = spec_lib.DatasetSpec(
        info=ds_info, window=window, hosts=hosts, input_context=input_context,
        training=training, seed=seed, epochs=epochs, start=start,
        pixels=images.Pixels(
            size=size, output=_output(ds_info, dtype, value_range, transform),
            label_shift=label_offset - ds_info.label_offset, crop_fraction=crop_fraction,
            dct_method=dct_method, with_keys=with_keys),
        batches=spec_lib.Batches(
            size=batch_size, native=native_batching,
            drop_remainder=training if drop_remainder is None else drop_remainder),
        reading=spec_lib.Reading(
            deterministic=(not training or seed is not None) if deterministic is None
            else deterministic, **reading),
        fields=wanted)
    spec_lib.check_resumable(spec)
    return pipeline.build(spec)


def _version(path, version, hold):
    """The DatasetInfo read: `path`'s, pinned when `version` (an id or a tag) is given, held
    when `hold` is; a version removed since it was read fails here, before any reading."""
    given = isinstance(path, info_lib.DatasetInfo)
    ds_info = path if given else info_lib.info(path, version)
    info_lib.check_ref(ds_info, version)
    if version:  # pinned by the caller, whichever way the DatasetInfo found it
        ds_info = dataclasses.replace(ds_info, followed_latest=False)
    if hold:  # looks at the manifest again after writing the lease
        holds.hold(ds_info, hold)
    elif given:
        removal.check_present(ds_info.version_dir)
    return ds_info


def _output(ds_info, dtype, value_range, transform):
    if not transform:
        return images.Output(dtype, value_range)

    mean, std = transform_lib.statistics_of(ds_info)
    return images.Output(dtype, mean=mean, std=std)
