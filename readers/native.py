"""make_dataset's native-size mode (`image_size=None`) and unbatched output (`batch_size=None`).

Native size: each image is decoded whole at its stored size, flipped at random in training
(no crop, no resize), scaled like the fixed-size output; batches are ragged
(`tf.RaggedTensor` [B, None, None, 3]) or padded with zeros to the batch's largest image.
A record that does not decode is named as on the fixed-size path (readers/checked.py).
"""

import tensorflow as tf

from readers import images

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


def batching(batch_size, drop_remainder, batching):
    """A dataset -> dataset function: images at their own size batched as `batching`."""
    if batching not in NATIVE_BATCHING:
        raise ValueError(f"native_batching={batching!r}: use one of {NATIVE_BATCHING}")
    if batch_size is None:
        return lambda ds: ds
    if batching == "ragged":
        return lambda ds: ds.ragged_batch(batch_size, drop_remainder=drop_remainder)
    return lambda ds: ds.padded_batch(batch_size, drop_remainder=drop_remainder)
