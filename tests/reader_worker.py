"""One worker of tests/test_reader_multihost.py: a real MultiWorkerMirroredStrategy process.

    python tests/reader_worker.py ROOT VERSION PATHS BATCH   (TF_CONFIG set by the test)

Reads the hand-made dataset of tests/test_reader.py (each image's red channel encodes its
record id) through each of PATHS (comma-separated: fit, distribute, from_function, eval) and
prints one JSON line: per path, the record ids every step of this worker saw, and the shapes.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import readers  # noqa: E402

SIZE = 8


def ids_of(images):
    """Record ids from the red channel (red = 6 * id), float images in [0, 1]."""
    images = np.asarray(images, np.float64)
    if images.size == 0:
        return []
    return np.round(images[..., 0].mean(axis=(1, 2)) * 255 / 6).astype(int).tolist()


def via_fit(strategy, root, version, batch):
    """Model.fit of tf_keras (Keras 2): Keras 3.15's fit under this strategy fails before
    reading anything (it calls strategy.reduce on the (x, y) batch)."""
    import tf_keras as keras

    seen = []

    def record(images):
        seen.append(ids_of(images.numpy()))
        return 0

    class Recorder(keras.Model):
        def train_step(self, data):
            images, _ = data
            tf.py_function(record, [images], tf.int64)
            return super().train_step(data)

    with strategy.scope():
        inputs = keras.Input((SIZE, SIZE, 3))
        outputs = keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(inputs))
        model = Recorder(inputs, outputs)
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ds = readers.make_dataset(root, "train", batch_size=batch, image_size=SIZE, seed=5,
                              version=version)
    model.fit(ds, epochs=1, verbose=0)
    return seen


def via_distribute(strategy, root, version, batch):
    ds = readers.make_dataset(root, "train", batch_size=batch, image_size=SIZE, seed=5,
                              version=version)
    return [sum((ids_of(x) for x in strategy.experimental_local_results(images)), [])
            for images, _ in strategy.experimental_distribute_dataset(ds)]


def via_from_function(strategy, root, version, batch, split="train"):
    def dataset_fn(ctx):
        return readers.make_dataset(root, split, image_size=SIZE, seed=5, version=version,
                                    batch_size=ctx.get_per_replica_batch_size(batch),
                                    input_context=ctx)

    dist = strategy.distribute_datasets_from_function(dataset_fn)
    return [sum((ids_of(x) for x in strategy.experimental_local_results(images)), [])
            for images, _ in dist]


def main():
    root, version, paths, batch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    out = {"workers": strategy.num_replicas_in_sync}
    for path in paths.split(","):
        if path == "fit":
            out[path] = via_fit(strategy, root, version, batch)
        elif path == "distribute":
            out[path] = via_distribute(strategy, root, version, batch)
        elif path == "from_function":
            out[path] = via_from_function(strategy, root, version, batch)
        elif path == "eval":
            out[path] = via_from_function(strategy, root, version, batch, "validation")
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
