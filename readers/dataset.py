"""The training input pipeline: manifest shards -> tf.data.Dataset of (images, labels).

Memory stays bounded because only serialized records (~40 KB JPEGs) sit in the shuffle
buffer and cache; pixels exist only between decode and batch. Speed comes from decoding just
the crop window, one record per call of a parallel map (the pipeline a tf.data user writes),
and parallel interleaved reads. Which records a host reads: readers/hosts.py; in which order
they are read: readers/records.py; how files are checked and read: readers/shards.py; how a
failed record is named: readers/checked.py; pixels: readers/images.py.
"""

import dataclasses
import logging

import tensorflow as tf

from dataset_format import dataset_info as info_lib
from dataset_format import holds, removal, slices
from readers import checked
from readers import fields as fields_lib
from readers import hosts as hosts_lib
from readers import images
from readers import order as order_lib
from readers import records as records_lib
from readers import resumable
from readers import native
from readers import shards

log = logging.getLogger(__name__)

SHUFFLE_MIN_RECORDS = 1024  # ...and at least records.SHUFFLE_BUFFER_BYTES' worth
CROP_FRACTION = images.CROP_FRACTION


def make_dataset(path, split="train", batch_size=128, image_size=224, training=None,
                 seed=None, input_context=None, dtype=tf.float32, value_range=None,
                 shuffle_buffer=None, repeat=False, drop_remainder=None, cycle_length=None,
                 deterministic=None, cache=False, label_offset=0, skip_corrupt=False,
                 transform=False, crop_fraction=CROP_FRACTION, version=None,
                 read_buffer_bytes=None, start=None, with_keys=False,
                 native_batching="ragged", hold=False, fields=None):
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
    repeat: False (one epoch), True (forever) or an epoch count.
    drop_remainder: default `training`, so every training batch has a static shape.
    deterministic: default: order is fixed unless training without any seed.
    cache: True (memory) or a file prefix: caches serialized records, never pixels; with a
      file, memory stays that of no cache (chunks reshuffled in a bounded buffer).
    label_offset: labels come out as 0-based id + label_offset, whatever the manifest's
      own offset is (e.g. 1 for a model with a background class 0).
    skip_corrupt: a damaged record (bad CRC) and a record that does not decode are skipped
      with a warning naming them, instead of failing; cardinality is then unknown. With
      `.index` files (the build's default) only the damaged record is lost; without them
      the rest of its shard is (a TFRecord stream cannot resync). Missing or wrong-sized
      files always fail.
    transform: normalize with the version's tf.Transform statistics, (v - mean) / std per
      channel, instead of value_range: the same values its saved graph gives, after this
      reader's crops, flips and image_size.

    start: resume training here (docs/reader.md, "Preemptible training"): a global step (an
      int, e.g. `int(optimizer.iterations)`), a `readers.Position(epoch, records)`, or a
      callable returning either, read as each iteration begins (`lambda:
      int(model.optimizer.iterations)` follows Keras' BackupAndRestore). Training then reads
      the resumable order: each epoch's order is a function of (version, split, seed,
      epoch), every host takes its part of each global batch, and any position is reached
      without reading what comes before it. Without start, training reads the stream
      order (not resumable; needs no .index files, and takes Model.fit/
      experimental_distribute_dataset on several hosts without an input_context).
    with_keys: (resumable order) yield (images, labels, keys), keys the records'
      `image/filename` (catalog.parquet's key).
    fields: declared fields to read (names, or a `readers.Fields`): elements become dicts
      {"image", "label", name: ...}, boxes moved with the crop and flip (readers/fields.py).

    The dataset carries `.dataset_info` (the version read: `.dataset_info.version`),
    `.plan` (readers.hosts.HostPlan: this host's share), `.class_names` and
    `.steps_per_epoch` (this host's batches an epoch). Attributes do not survive `.map()`:
    take `readers.info(ROOT).class_names`, and `ds.cardinality()` for the steps.
    """
    given = isinstance(path, info_lib.DatasetInfo)
    ds_info = path if given else info_lib.info(path, version)
    info_lib.check_ref(ds_info, version)
    if version:  # pinned by the caller, whichever way the DatasetInfo found it
        ds_info = dataclasses.replace(ds_info, followed_latest=False)
    if hold:  # looks at the manifest again after writing the lease
        holds.hold(ds_info, hold)
    elif given:  # read earlier: a version removed since fails here, before any reading
        removal.check_present(ds_info.version_dir)
    wanted = fields_lib.requested(fields, ds_info, start, with_keys, image_size)
    window = _window(ds_info, split)
    split_info = ds_info.split(window.split)
    training = (window.split == "train") if training is None else bool(training)
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1, or None (unbatched)")
    size = (image_size, image_size) if isinstance(image_size, int) else (
        image_size and tuple(image_size))
    output = _output(ds_info, dtype, value_range, transform)
    hosts = hosts_lib.detect(input_context)
    _check_pinned(ds_info, hosts)
    plan = hosts_lib.plan(split_info, hosts, training, (window.start, window.stop))
    shards.check_files(plan.pieces)
    seed = _seed(seed, training)
    if deterministic is None:
        deterministic = not training or seed is not None
    host_seed = hosts_lib.seed_for(seed, hosts)
    if start is not None or with_keys:
        if not training:
            raise ValueError("start= and with_keys= read the resumable training order; "
                             "evaluation reads the manifest's order from the start")
        if len(window) != sum(s.num_examples for s in split_info.shards) or (
                batch_size is None or size is None):
            raise ValueError("start= and with_keys= read a whole split in fixed-size batches: "
                             "no split slice, batch_size=None or image_size=None")
        return _resumable(ds_info, split_info, hosts, input_context, batch_size, size, output,
                          label_offset - ds_info.label_offset, crop_fraction, seed or 0,
                          0 if start is None else start, repeat, skip_corrupt, with_keys)

    ds, pieces = records_lib.records(plan, split_info, training, host_seed, cache,
                                     cycle_length, deterministic, read_buffer_bytes,
                                     skip_corrupt)  # (record, id), the pieces read
    if training:
        buffer = _shuffle_buffer(shuffle_buffer, split_info, plan.records)
        if buffer > 1:
            ds = ds.shuffle(buffer, seed=host_seed, reshuffle_each_iteration=True)
        if plan.per_epoch < plan.records:  # the common minimum: equal steps on every host
            ds = ds.take(plan.per_epoch)
    if repeat is True:
        ds = ds.repeat()
    elif repeat:
        ds = ds.repeat(int(repeat))
    drop_remainder = training if drop_remainder is None else drop_remainder
    ds = _decode(ds, plan, pieces, training, host_seed, size, output,
                 label_offset - ds_info.label_offset, crop_fraction, skip_corrupt, batch_size,
                 drop_remainder, native_batching, repeat, ds_info.version_dir, wanted)
    if wanted is not None:
        ds = fields_lib.to_dicts(ds, wanted)
    if not skip_corrupt:  # one image per record: the filter after the check hides that
        ds = ds.apply(tf.data.experimental.assert_cardinality(
            _batches(plan, training, repeat, batch_size, drop_remainder)))
    if hosts.count > 1 and (input_context is None or not training):
        # Without input_context, tf.distribute splits each of this host's global batches
        # among all workers' replicas, so an epoch is `hosts.count` times more steps than
        # batches here; in evaluation the hosts' ranges differ by a record, so their batch
        # counts may differ by one, and a known, unequal length makes Keras refuse or
        # abort its collectives. Unknown: fit()/evaluate() run until every host is done.
        ds = ds.filter(lambda *batch: True)  # -> unknown cardinality
    ds = ds.prefetch(tf.data.AUTOTUNE)
    ds = ds.with_options(_options(deterministic, split_here=hosts.count > 1))
    _log_plan(ds_info, split, plan, training)
    ds.dataset_info, ds.plan = ds_info, plan
    ds.class_names = list(ds_info.labels)
    ds.steps_per_epoch = _batches(plan, training, False, batch_size, drop_remainder)
    return ds


def _window(ds_info, split):
    """The one slices.Window a split spec reads (make_dataset reads one split)."""
    found = slices.windows_of(split, ds_info)
    if len(found) != 1:
        raise ValueError(f"split {split!r}: make_dataset reads one split (or a slice of one); "
                         "concatenate datasets to read several")
    return found[0]


def _decode(ds, plan, pieces, training, seed, size, output, label_shift, crop_fraction,
            skip_corrupt, batch_size, drop_remainder, native_batching, repeat,
            version_dir=None, wanted=None):
    """(record, id) -> (image, label) elements or batches, naming any record that fails
    (with `wanted` fields: (image, {"label", fields}), readers/fields.py)."""
    if wanted is not None:
        fn = fields_lib.example_fn(training, size, output, label_shift, crop_fraction, wanted)
        batch = (lambda d: d.batch(batch_size, drop_remainder=drop_remainder)) if (
            batch_size) else (lambda d: d)
    elif size is None:
        fn = native.native_fn(training, output, label_shift)
        batch = native.batching(batch_size, drop_remainder, native_batching)
    else:
        fn = images.example_fn(training, size, output, label_shift, crop_fraction)
        batch = (lambda d: d.batch(batch_size, drop_remainder=drop_remainder)) if (
            batch_size) else (lambda d: d)
    if training:
        # per-element [2] seeds for the stateless crop and flip; the same seed gives the
        # same seed stream, and each epoch (iteration) draws fresh ones.
        seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(
            2, drop_remainder=True)
        ds = tf.data.Dataset.zip(ds, seeds)
    names = checked.Names(pieces, skip_corrupt, shards.sentinel_record(), version_dir)
    total = None if repeat is True else _batches(plan, training, repeat, None, False)
    if not training and size is not None and batch_size and not skip_corrupt and not wanted:
        # evaluation: checked once a batch (~100 us of CPU a record less). Training keeps
        # the per-record check: once a batch cost the same CPU there (checked.decoded)
        return checked.decoded_batches(ds, fn, names, training, batch_size, drop_remainder,
                                       total)
    return checked.decoded(ds, fn, names, training, batch, total)


def _batches(plan, training, repeat, batch_size, drop_remainder):
    if repeat is True:
        return tf.data.INFINITE_CARDINALITY
    records = (plan.per_epoch if training else plan.records) * (int(repeat) if repeat else 1)
    if batch_size is None:
        return records
    return records // batch_size if drop_remainder else -(-records // batch_size)


def _output(ds_info, dtype, value_range, transform):
    if not transform:
        return images.Output(dtype, value_range)
    from readers import transform as transform_lib

    mean, std = transform_lib.statistics_of(ds_info)
    return images.Output(dtype, mean=mean, std=std)


def _check_pinned(ds_info, hosts):
    """Several hosts must read one version: each following LATEST could land on another."""
    if hosts.count > 1 and ds_info.followed_latest:
        raise ValueError(
            f"{hosts.count} hosts read this dataset and this one followed LATEST to "
            f"{ds_info.version}: pin one version for all of them, e.g. "
            f"make_dataset(ROOT, ..., version={ds_info.version!r}) or readers.info(ROOT, "
            "version=...), with the id passed to every host (a flag, an environment variable)")


def _seed(seed, training):
    """The user's seed, else the global one (tf.random.set_seed), else None."""
    if seed is not None or not training:
        return seed
    from tensorflow.python.framework import random_seed

    global_seed, _ = random_seed.get_seed(None)
    return global_seed


def _shuffle_buffer(shuffle_buffer, split_info, num_records):
    if shuffle_buffer is not None:
        return int(shuffle_buffer)
    return int(min(num_records, max(
        SHUFFLE_MIN_RECORDS, records_lib.SHUFFLE_BUFFER_BYTES // records_lib.mean_bytes(
            split_info))))


def _options(deterministic, split_here):
    options = tf.data.Options()
    options.deterministic = deterministic
    if split_here:
        # This reader split the records among hosts itself (readers/hosts.py): tf.distribute
        # must not shard again (AUTO would cut the already-cut stream, and the seeds too).
        # Otherwise auto-shard stays on: a host that saw no cluster (a resolver's strategy
        # not in scope) reads everything, and tf.distribute's AUTO policy cuts it.
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.OFF)
    return options


def _resumable(ds_info, split_info, hosts, input_context, batch_size, size, output,
               label_shift, crop_fraction, seed, start, repeat, skip_corrupt, with_keys):
    """The resumable order (readers/resumable.py): this host's part of each global batch."""
    if hosts.count > 1 and input_context is None:
        raise ValueError(
            f"start= on {hosts.count} hosts ({hosts.source}) needs input_context: build the "
            "dataset in strategy.distribute_datasets_from_function (or pass an InputContext "
            "from jax.process_count()/process_index()); a dataset given to "
            "experimental_distribute_dataset or Model.fit is re-batched by tf.distribute, "
            "which the resumable order cannot follow")
    replicas = input_context.num_replicas_in_sync if input_context is not None else 1
    batching = order_lib.Batching(batch_size * replicas, hosts.count, hosts.index)
    epoch_order = order_lib.EpochOrder(tuple(s.num_examples for s in split_info.shards),
                                       int(seed), ds_info.version, split_info.name)
    steps = batching.steps(epoch_order.records)
    stream = resumable.Stream(epoch_order, batching, _position(start, steps, batching),
                              0 if repeat is True else int(repeat or 1))
    if not callable(stream.start):
        stream.position()  # a position off the global batch boundaries fails here, at once
    source = resumable.make_source(split_info, skip_corrupt)
    ds = resumable.decoded(stream, source, size, output, label_shift, crop_fraction,
                           skip_corrupt, with_keys)
    if not skip_corrupt and not callable(start) and stream.epochs:
        first = steps - stream.position().records // batching.global_batch
        ds = ds.apply(tf.data.experimental.assert_cardinality(
            first + (stream.epochs - 1) * steps))
    ds = ds.prefetch(tf.data.AUTOTUNE)
    ds = ds.with_options(_options(True, split_here=hosts.count > 1))
    log.info("readers: %s version %s, split %s, resumable order, host %d of %d, global batch "
             "%d, %d steps an epoch", ds_info.version_dir, ds_info.version, split_info.name,
             hosts.index, hosts.count, batching.global_batch, steps)
    ds.dataset_info, ds.plan, ds.steps_per_epoch = ds_info, None, steps
    ds.class_names = list(ds_info.labels)
    return ds


def _position(start, steps, batching):
    """start= -> a Position (or a callable returning one, for a start read at iteration)."""
    if callable(start):
        return lambda: _position(start(), steps, batching)
    if isinstance(start, order_lib.Position):
        return start
    if hasattr(start, "numpy"):  # a tf.Variable such as optimizer.iterations: read it late
        return lambda: _position(int(start.numpy()), steps, batching)
    return order_lib.position_of_step(int(start), steps, batching.global_batch)


def _log_plan(ds_info, split, plan, training):
    hosts = plan.hosts
    share = (f"host {hosts.index} of {hosts.count} ({hosts.source}): records "
             f"{plan.records} of {plan.split_records}, {plan.per_epoch} an epoch"
             if hosts.count > 1 else f"{plan.records} records")
    log.info("readers: %s version %s, split %s, %s (%s)", ds_info.version_dir,
             ds_info.version, split, share, "training" if training else "evaluation")
