"""The documented preemptible-training patterns (docs/reader.md): Keras' BackupAndRestore with
`start=` reading `optimizer.iterations`, and a custom loop with tf.train.Checkpoint. A run
is interrupted, a new model and dataset are built as a restarted job would, and the records
the resumed run reads are those an uninterrupted run reads from the restored step."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import readers
from tests.test_reader_resume import root, uninterrupted  # noqa: F401  (fixture)

G = 6  # 30 records: 5 steps an epoch


def recording(ds, seen):
    """(images, labels, keys) -> (images, labels), each batch's keys appended to `seen`."""
    def note(keys):
        seen.append([k.decode() for k in keys.numpy().tolist()])
        return 0

    def drop_keys(images, labels, keys):
        done = tf.py_function(note, [keys], tf.int32)
        with tf.control_dependencies([done]):
            return tf.identity(images), labels

    return ds.map(drop_keys)


def model_of():
    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(),
                              keras.layers.Dense(3)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


class Stop(keras.callbacks.Callback):
    def __init__(self, at):
        super().__init__()
        self.at = at

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations) == self.at:
            raise KeyboardInterrupt  # the preemption


def test_backup_and_restore_resumes_the_data_at_the_restored_step(root, tmp_path):  # noqa: F811
    order = uninterrupted(root, 3, G)
    backup = str(tmp_path / "backup")

    def fit(model, callbacks, seen, starts):
        def start():  # read as the iterator starts: after BackupAndRestore restored the model
            starts.append(int(model.optimizer.iterations))
            return starts[-1]

        ds = readers.make_dataset(root, "train", batch_size=G, image_size=8, seed=7,
                                  repeat=True, with_keys=True, start=start)
        model.fit(recording(ds, seen), epochs=3, steps_per_epoch=5, verbose=0,
                  callbacks=[keras.callbacks.BackupAndRestore(backup, save_freq=2)]
                  + callbacks)

    with pytest.raises(KeyboardInterrupt):
        fit(model_of(), [Stop(8)], [], [])  # preempted after step 8
    seen, starts = [], []
    second = model_of()
    fit(second, [], seen, starts)
    restored = starts[0]
    assert restored > 0  # the last backup's step (Keras counts it), not 0
    epoch, step = divmod(restored, 5)
    assert seen[0] == order[epoch][step * G:(step + 1) * G]  # the uninterrupted order
    if step < 4:
        assert seen[1] == order[epoch][(step + 1) * G:(step + 2) * G]


def test_a_custom_loop_restores_its_step_from_a_checkpoint(root, tmp_path):  # noqa: F811
    order = uninterrupted(root, 1, G)
    step = tf.Variable(0, dtype=tf.int64)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(step=step), str(tmp_path), 2)
    ds = readers.make_dataset(root, "train", batch_size=G, image_size=8, seed=7, repeat=True,
                              with_keys=True, start=step)
    for _, _, _ in ds.take(3):
        step.assign_add(1)
    manager.save()

    restored = tf.Variable(0, dtype=tf.int64)  # a new job
    tf.train.Checkpoint(step=restored).restore(manager.latest_checkpoint).assert_consumed()
    again = readers.make_dataset(root, "train", batch_size=G, image_size=8, seed=7,
                                 repeat=True, with_keys=True, start=restored)
    keys = next(iter(again))[2].numpy().tolist()
    assert [k.decode() for k in keys] == order[0][3 * G:4 * G]
    assert np.array_equal(int(restored.numpy()), 3)
