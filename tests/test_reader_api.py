"""make_dataset as a tfds.load user expects it: TFDS split slices, unbatched elements, images at
their stored size (ragged or padded), class names and steps per epoch.

Records come from tests/tiny_dataset.py: record `rid`'s red is 6 * rid, green 100 * label;
evaluation with one file open at a time reads manifest order, so the output's reds spell out
which records were read.
"""

import numpy as np
import pytest
import tensorflow as tf

import readers
from tests import tiny_dataset

TRAIN = tiny_dataset.rids_in_order("train")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(tiny_dataset.write(tmp_path_factory.mktemp("api") / "ds"))


@pytest.fixture(scope="module")
def sizes_root(tmp_path_factory):
    """Image rid is (8 + rid) x (6 + rid // 2) pixels: every size different."""
    return str(tiny_dataset.write(tmp_path_factory.mktemp("sizes") / "ds",
                                  size_of=lambda rid: (8 + rid, 6 + rid // 2)))


def _rid(image):
    image = np.asarray(image, np.float32)
    return int(round(image[..., 0].mean() / 6))


def _eval(root, split, **kw):
    """Evaluation in manifest order (one file open at a time)."""
    return readers.make_dataset(root, split, training=False, dtype=tf.uint8, cycle_length=1,
                                **kw)


# The windows' arithmetic for every boundary: tests/test_slices.py (pure Python); here the
# reader reads them: two fast, the rest slow (one tf.data pipeline each, ~1 s)
@pytest.mark.parametrize("spec,window", [
    pytest.param("train[:10%]", (0, 4), marks=pytest.mark.slow), ("train[33%:67%]", (12, 25)),
    pytest.param("train[30:]", (30, 37), marks=pytest.mark.slow),
    pytest.param("train[-5:-2]", (32, 35), marks=pytest.mark.slow),
    ("train[1shard:2shard]", (10, 19))])
def test_split_slices_read_the_tfds_window(root, spec, window):
    ds = _eval(root, spec, batch_size=None, image_size=8)
    assert [_rid(image) for image, _ in ds] == TRAIN[window[0]:window[1]]
    assert int(ds.cardinality()) == ds.steps_per_epoch == window[1] - window[0]


def test_a_slice_split_between_hosts_reads_each_record_once(root):
    got = []
    for index in range(2):
        ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=index)
        ds = readers.make_dataset(root, "train[10:30]", batch_size=3, image_size=8,
                                  version=tiny_dataset.VERSION,
                                  training=False, input_context=ctx, dtype=tf.uint8,
                                  cycle_length=1)
        got += [_rid(image) for images, _ in ds for image in images]
    assert got == TRAIN[10:30]


def test_slice_errors_name_the_spec(root):
    with pytest.raises(ValueError, match=r"slice \[0:40\] is outside its 37 records"):
        _eval(root, "train[:40]")
    with pytest.raises(ValueError, match="reads one split"):
        _eval(root, "train+validation")
    with pytest.raises(ValueError, match=r"no records in \[5:5\]"):
        _eval(root, "train[5:5]")
    with pytest.raises(KeyError, match="no split 'test'"):
        _eval(root, "test[:10%]")


def test_unbatched_training_elements(root):
    ds = readers.make_dataset(root, "train", batch_size=None, image_size=16, seed=1)
    elements = list(ds)
    assert len(elements) == ds.steps_per_epoch == int(ds.cardinality()) == 37
    image, label = elements[0]
    assert image.shape == (16, 16, 3) and image.dtype == tf.float32 and label.shape == ()
    assert sorted(int(label) for _, label in elements) == sorted(r % 3 for r in TRAIN)


def test_native_size_ragged_and_padded(sizes_root):
    want = [(6 + r // 2, 8 + r) for r in TRAIN[:5]]  # (height, width) in manifest order
    ragged = _eval(sizes_root, "train[:5]", batch_size=4, image_size=None)
    batches = list(ragged)
    assert [b[0].shape[0] for b in batches] == [4, 1] and ragged.steps_per_epoch == 2
    assert all(isinstance(b[0], tf.RaggedTensor) for b in batches)
    images = [image.to_tensor() for b in batches for image in b[0]]
    assert [tuple(i.shape[:2]) for i in images] == want
    assert [_rid(i) for i in images] == TRAIN[:5]
    padded = _eval(sizes_root, "train[:5]", batch_size=4, image_size=None,
                   native_batching="padded")
    first, labels = next(iter(padded))
    tallest, widest = max(h for h, _ in want[:4]), max(w for _, w in want[:4])
    assert first.shape == (4, tallest, widest, 3)
    for image, (h, w), rid in zip(first.numpy(), want, TRAIN):
        assert _rid(image[:h, :w]) == rid and not image[h:].any() and not image[:, w:].any()
    assert labels.numpy().tolist() == [r % 3 for r in TRAIN[:4]]
    with pytest.raises(ValueError, match=r"native_batching='dense': use one of \('ragged'"):
        _eval(sizes_root, "train", batch_size=4, image_size=None, native_batching="dense")
    unbatched = _eval(sizes_root, "train[:3]", batch_size=None, image_size=None)
    assert [tuple(i.shape) for i, _ in unbatched] == [h_w + (3,) for h_w in want[:3]]


def test_native_training_flips_whole_images(sizes_root):
    ds = readers.make_dataset(sizes_root, "train[:6]", batch_size=None, image_size=None,
                              seed=3)
    shapes = sorted(tuple(i.shape) for i, _ in ds)
    assert shapes == sorted((6 + r // 2, 8 + r, 3) for r in TRAIN[:6])


def test_class_names_and_steps(root):
    ds = readers.make_dataset(root, "train", batch_size=8, image_size=8, seed=0)
    assert ds.class_names == tiny_dataset.LABELS == readers.info(root).class_names
    assert ds.steps_per_epoch == 37 // 8 == int(ds.cardinality())
    mapped = ds.map(lambda images, labels: (images * 2, labels))
    assert int(mapped.cardinality()) == ds.steps_per_epoch  # what survives .map()
    ev = _eval(root, "validation", batch_size=4, image_size=8)
    assert ev.steps_per_epoch == 3 == len(list(ev))
