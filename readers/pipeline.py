"""A DatasetSpec (readers/spec.py) -> the tf.data pipeline: the stream order (training), the
manifest's order (evaluation) or the resumable order (start=).

Which records a host reads: readers/hosts.py; in which order: readers/records.py and
readers/order.py; how files are checked and read: readers/shards.py; how a failed record is
named: readers/checked.py; pixels: readers/images.py.
"""

import logging

import tensorflow as tf

from readers import (checked, fields as fields_lib, hosts as hosts_lib, images, native,
                     order as order_lib, records as records_lib, resumable, shards)
from readers.spec import FOREVER

log = logging.getLogger(__name__)

SHUFFLE_MIN_RECORDS = 1024  # ...and at least records.SHUFFLE_BUFFER_BYTES' worth


def build(spec):
    """The dataset `spec` describes, carrying `.dataset_info`, `.plan`, `.class_names`,
    `.steps_per_epoch` and `.skips` (records skip_corrupt replaced or dropped, counted)."""
    ds = _resumable(spec) if spec.resumable else _ordered(spec)
    ds.dataset_info = spec.info
    ds.class_names = list(spec.info.labels)
    return ds


def _ordered(spec):
    """The stream order (training) or the manifest's order (evaluation)."""
    split_info, training, batches = spec.split, spec.training, spec.batches
    plan = hosts_lib.plan(split_info, spec.hosts, training, (spec.window.start,
                                                              spec.window.stop))
    steps = _batches(plan, training, 1, batches)
    if batches.size and not steps:
        raise ValueError(
            f"make_dataset: batch_size={batches.size}: this host reads {_records(plan, training)}"
            f" records of split {spec.window.split!r} an epoch, fewer than one batch (0 steps)"
            "; pass a smaller batch_size, or drop_remainder=False for one partial batch")
    shards.check_files(plan.pieces)
    reading = spec.reading
    host_seed = hosts_lib.seed_for(spec.seed, spec.hosts)
    skips = checked.Skips()
    ds, pieces = records_lib.records(
        plan, split_info, training, host_seed, cache=reading.cache,
        cycle_length=reading.cycle_length, deterministic=reading.deterministic,
        read_buffer_bytes=reading.read_buffer_bytes, skip_corrupt=reading.skip_corrupt,
        skips=skips)
    if training:
        buffer = shuffle_buffer(reading.shuffle_buffer, split_info, plan.records)
        if buffer > 1:
            ds = ds.shuffle(buffer, seed=host_seed, reshuffle_each_iteration=True)
        if plan.per_epoch < plan.records:  # the common minimum: equal steps on every host
            ds = ds.take(plan.per_epoch)
    if spec.epochs != 1:
        ds = ds.repeat() if spec.epochs == FOREVER else ds.repeat(spec.epochs)
    ds = _decode(ds, spec, plan, pieces, host_seed, skips)
    if spec.fields is not None:
        ds = fields_lib.to_dicts(ds, spec.fields, padded_images=(
            spec.pixels.size is None and batches.size is not None
            and batches.native == "padded"))
    if not reading.skip_corrupt or training:  # one image per record (skips padded, _padded)
        ds = ds.apply(tf.data.experimental.assert_cardinality(
            _batches(plan, training, spec.epochs, batches)))
    if spec.hosts.count > 1 and (spec.input_context is None or not training):
        # Without input_context, tf.distribute splits each of this host's global batches
        # among all workers' replicas, so an epoch is `hosts.count` times more steps than
        # batches here; in evaluation the hosts' ranges differ by a record, so their batch
        # counts may differ by one, and a known, unequal length makes Keras refuse or
        # abort its collectives. Unknown: fit()/evaluate() run until every host is done.
        ds = ds.filter(lambda *batch: True)  # -> unknown cardinality
    ds = ds.prefetch(tf.data.AUTOTUNE)
    ds = ds.with_options(options(reading.deterministic, split_here=spec.hosts.count > 1))
    _log_plan(spec, plan)
    ds.plan, ds.steps_per_epoch, ds.skips = plan, steps, skips
    return ds


def _decode(ds, spec, plan, pieces, seed, skips):
    """(record, id) -> (image, label[, key]) elements or batches, naming any record that
    fails."""
    training, batches, skip_corrupt = spec.training, spec.batches, spec.reading.skip_corrupt
    if spec.fields is not None:  # (image, {"label", fields}): readers/fields.py
        fn = fields_lib.example_fn(training, spec.pixels, spec.fields)
    else:
        fn = images.example_fn(training, spec.pixels)
    if spec.pixels.size is None:
        batch = native.batching(batches.size, batches.drop_remainder, batches.native)
    else:
        batch = (lambda d: d.batch(batches.size, drop_remainder=batches.drop_remainder)) if (
            batches.size) else (lambda d: d)
    if training:
        # per-element [2] seeds for the stateless crop and flip; the same seed gives the
        # same seed stream, and each epoch (iteration) draws fresh ones.
        seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(
            2, drop_remainder=True)
        ds = tf.data.Dataset.zip(ds, seeds)
    names = checked.Names(pieces, skip_corrupt, shards.sentinel_record(), skips,
                          spec.info.version_dir)
    total = None if spec.epochs == FOREVER else _batches(plan, training, spec.epochs, None)
    if skip_corrupt and training and total is not None:
        batch = _padded(batch, total)
    if (not training and spec.pixels.size is not None and batches.size and not skip_corrupt
            and spec.fields is None):
        # evaluation: checked once a batch (~100 us of CPU a record less). Training keeps
        # the per-record check: once a batch cost the same CPU there (checked.decoded)
        return checked.decoded_batches(ds, fn, names, training, batches.size,
                                       drop_remainder=batches.drop_remainder, total=total)
    return checked.decoded(ds, fn, names, training, batch, total)


def _padded(batch, total):
    """skip_corrupt in training: the checked stream made up to `total` records with the
    first records of another pass over it (freshly shuffled), so a host that skipped a
    record runs the same steps as the others (under a synchronous all-reduce, one step
    fewer is a hang). The second pass starts only when the first came out short."""
    return lambda ds: batch(ds.concatenate(ds).take(total))


def _records(plan, training):
    return plan.per_epoch if training else plan.records


def _batches(plan, training, epochs, batches):
    """Elements an iteration yields (batches, or records when `batches` is None/unbatched)."""
    if epochs == FOREVER:
        return tf.data.INFINITE_CARDINALITY
    n = _records(plan, training) * epochs
    if batches is None or batches.size is None:
        return n
    return n // batches.size if batches.drop_remainder else -(-n // batches.size)


def shuffle_buffer(requested, split_info, num_records):
    if requested is not None:
        return int(requested)
    return int(min(num_records, max(
        SHUFFLE_MIN_RECORDS, records_lib.SHUFFLE_BUFFER_BYTES // records_lib.mean_bytes(
            split_info))))


def options(deterministic, split_here):
    result = tf.data.Options()
    result.deterministic = deterministic
    if split_here:
        # This reader split the records among hosts itself (readers/hosts.py): tf.distribute
        # must not shard again (AUTO would cut the already-cut stream, and the seeds too).
        # Otherwise auto-shard stays on: a host that saw no cluster (a resolver's strategy
        # not in scope) reads everything, and tf.distribute's AUTO policy cuts it.
        result.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.OFF)
    return result


def _resumable(spec):
    """The resumable order (readers/resumable.py): this host's part of each global batch."""
    split_info, hosts, context = spec.split, spec.hosts, spec.input_context
    replicas = context.num_replicas_in_sync if context is not None else 1
    batching = order_lib.Batching(spec.batches.size * replicas, hosts.count, hosts.index)
    epoch_order = order_lib.EpochOrder(tuple(s.num_examples for s in split_info.shards),
                                       spec.seed or 0, order_lib.content_id(split_info),
                                       split_info.name)
    steps = batching.steps(epoch_order.records)
    if not steps:
        raise ValueError(
            f"make_dataset: batch_size={spec.batches.size}: a global batch of "
            f"{batching.global_batch} records is more than split {split_info.name!r} holds "
            f"({epoch_order.records}): the resumable order reads full global batches only; "
            "pass a smaller batch_size")
    shards.check_files(hosts_lib.plan(split_info, hosts_lib.Hosts(1, 0, "single"),
                                      True).pieces)
    stream = resumable.Stream(epoch_order, batching, _position(spec.start, steps, batching),
                              spec.epochs)
    if not callable(stream.start):
        stream.position()  # a position off the global batch boundaries fails here, at once
    source = resumable.make_source(split_info, spec.reading.skip_corrupt)
    ds = resumable.decoded(stream, source, spec.pixels, spec.reading.skip_corrupt, spec.fields)
    if spec.fields is not None:  # flat tuples through the checks (fields_lib.flat_fn)
        ds = fields_lib.to_dicts(ds.map(fields_lib.nested(spec.fields, spec.pixels.with_keys)),
                                 spec.fields)
    # every step comes, skip_corrupt or not (a skipped record is replaced)
    if stream.epochs == FOREVER:
        ds = ds.apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY))
    elif not callable(stream.start):
        first = steps - stream.position().records // batching.global_batch
        ds = ds.apply(tf.data.experimental.assert_cardinality(
            first + (stream.epochs - 1) * steps))
    ds = ds.prefetch(tf.data.AUTOTUNE)
    ds = ds.with_options(options(True, split_here=hosts.count > 1))
    log.info("readers: %s version %s, split %s, resumable order, host %d of %d, global batch "
             "%d, %d steps an epoch", spec.info.version_dir, spec.info.version,
             split_info.name, hosts.index, hosts.count, batching.global_batch, steps)
    ds.plan, ds.steps_per_epoch, ds.skips = None, steps, source.skips
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


def _log_plan(spec, plan):
    hosts = plan.hosts
    share = (f"host {hosts.index} of {hosts.count} ({hosts.source}): records "
             f"{plan.records} of {plan.split_records}, {plan.per_epoch} an epoch"
             if hosts.count > 1 else f"{plan.records} records")
    log.info("readers: %s version %s, split %s, %s (%s)", spec.info.version_dir,
             spec.info.version, spec.window.split, share,
             "training" if spec.training else "evaluation")
