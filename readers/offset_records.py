"""Consecutive records of a TFRecord file from a byte offset, read in C++.

`tf.data.TFRecordDataset` always starts at a file's first byte; TensorFlow's
`TFRecordDatasetV2` kernel takes a byte offset and seeks to it (2 ms at a 500 MB offset,
against a read-through), checking both frame CRCs as the plain dataset does. The offsets come
from the `.index` files. The op has no public Python wrapper, and serializing it at the top
of a pipeline fails in TF 2.21 (the kernel writes 3 of its 4 inputs into the graph), so it is
only ever made inside a map or interleave function, where it is a plain function node.
"""

import functools

import tensorflow as tf


def records_from(path, offset, count, buffer_size, log_warning=False):
    """A dataset of `count` serialized records of `path` from byte `offset` (tensors, so it
    can be built per element inside an interleave). A damaged frame ends it early (its error
    is dropped, or with log_warning logged by TensorFlow with its offset): the caller compares
    the count it got with `count`."""
    return _from_offset()(path, offset, buffer_size).ignore_errors(log_warning).take(count)


def exact_records(path, offset, count, buffer_size):
    """`count` records of `path` from byte `offset`, or an error: a frame that does not check
    out, a file missing or cut. No `ignore_errors` here: on a file it cannot open,
    TensorFlow's reader would be asked again for ever."""
    return _from_offset()(path, offset, buffer_size).take(count)


@functools.cache
def _from_offset():
    # TensorFlow's private modules, imported at first use: `import readers` stays cheap
    from tensorflow.python.data.ops import dataset_ops
    from tensorflow.python.ops import gen_dataset_ops

    class FromOffset(dataset_ops.DatasetSource):
        def __init__(self, path, offset, buffer_size):
            self._spec = tf.TensorSpec([], tf.string)
            super().__init__(gen_dataset_ops.tf_record_dataset_v2(
                tf.reshape(path, [1]), "", tf.cast(buffer_size, tf.int64),
                tf.reshape(tf.cast(offset, tf.int64), [1])))

        @property
        def element_spec(self):
            return self._spec

    return FromOffset
