"""make_dataset's native-size mode (`image_size=None`) and unbatched output (`batch_size=None`).

Native size: each image is decoded whole at its stored size, flipped at random in training
(no crop, no resize), scaled like the fixed-size output; batches are ragged
(`tf.RaggedTensor` [B, None, None, 3]) or padded with zeros to the batch's largest image.
A record that does not decode fails with TensorFlow's error (skip_corrupt: skipped with
its warning); the fixed-size path's per-record naming needs static shapes.
"""

import tensorflow as tf

from readers import images

UNBATCHED_GROUP = 32  # batch_size=None: records decoded per group before unbatching
NATIVE_BATCHING = ("ragged", "padded")


def native_fn(training, output, label_shift):
    """(record[, seed]) -> (uint8-or-float image [H, W, 3] at its stored size, label int32)."""

    def to_example(record, *seed):
        jpeg, label = images.parse(record)
        image = tf.io.decode_jpeg(jpeg, channels=3)
        if training:
            image = tf.image.stateless_random_flip_left_right(image, seed[0])
        return output.apply(tf.cast(image, tf.float32)), tf.cast(label + label_shift, tf.int32)

    return to_example


def decode_native(ds, fn, skip_corrupt, deterministic, batch_size, drop_remainder, batching):
    """(record, path, position[, seed]) -> images at their own size, batched as `batching`."""
    if batching not in NATIVE_BATCHING:
        raise ValueError(f"native_batching={batching!r}: use one of {NATIVE_BATCHING}")
    ds = ds.map(lambda record, path, position, *seed: fn(record, *seed),
                num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
    if skip_corrupt:
        ds = ds.ignore_errors(log_warning=True)
    if batch_size is None:
        return ds
    if batching == "ragged":
        return ds.ragged_batch(batch_size, drop_remainder=drop_remainder)
    return ds.padded_batch(batch_size, drop_remainder=drop_remainder)

