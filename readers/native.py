"""make_dataset's native-size mode (`image_size=None`) and unbatched output (`batch_size=None`).

Native size: each image is decoded whole at its stored size, flipped at random in training
(no crop, no resize), scaled like the fixed-size output (readers/images.py, `size` None);
batches are ragged (`tf.RaggedTensor` [B, None, None, 3]) or padded with zeros to the
batch's largest image. A record that does not decode is named as on the fixed-size path
(readers/checked.py).
"""

NATIVE_BATCHING = ("ragged", "padded")


def batching(batch_size, drop_remainder, batching):
    """A dataset -> dataset function: images at their own size batched as `batching`."""
    if batching not in NATIVE_BATCHING:
        raise ValueError(f"native_batching={batching!r}: use one of {NATIVE_BATCHING}")
    if batch_size is None:
        return lambda ds: ds
    if batching == "ragged":
        return lambda ds: ds.ragged_batch(batch_size, drop_remainder=drop_remainder)
    return lambda ds: ds.padded_batch(batch_size, drop_remainder=drop_remainder)
