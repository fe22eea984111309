"""make_dataset's arguments are checked before anything is read (one line naming the
parameter and what it accepts), keys come with every order and mode, and the resumable
order is a function of the split's content, not of the version id."""

import shutil

import numpy as np
import pytest
import tensorflow as tf

import readers
from readers import order as order_lib
from tests.test_reader import SIZE, VERSION, Ctx, write_dataset
from tests.test_reader_resume import write_indexes

N = 30  # write_dataset's train split


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("arguments")
    write_indexes(write_dataset(root))
    return str(root)


@pytest.mark.parametrize("kwargs,message", [
    (dict(batch_size="64"), "batch_size='64': an int >= 1, or None (unbatched elements)"),
    (dict(batch_size=64.0), "batch_size=64.0: an int >= 1, or None (unbatched elements)"),
    (dict(batch_size=0), "batch_size=0: an int >= 1, or None (unbatched elements)"),
    (dict(batch_size=True), "batch_size=True: an int >= 1"),
    (dict(image_size="224"), "image_size='224': an int >= 1, a (height, width) pair of "
                             "them, or None (stored size)"),
    (dict(image_size=(224, 0)), "image_size=(224, 0): an int >= 1"),
    (dict(seed="abc"), "seed='abc': an int, or None (the global seed, if any)"),
    (dict(seed=1.5), "seed=1.5: an int"),
    (dict(repeat=0), "repeat=0: False or 1 (one epoch), an epoch count >= 1, or True or -1 "
                     "(forever)"),
    (dict(repeat=-2), "repeat=-2: False or 1"),
    (dict(repeat="2"), "repeat='2': False or 1"),
    (dict(training="yes"), "training='yes': True or False, or None (split == 'train')"),
    (dict(dtype="int32"), "dtype='int32': uint8 or a float dtype"),
    (dict(dtype="pixels"), "dtype='pixels': uint8 or a float dtype"),
    (dict(value_range=(1, 0)), "value_range=(1, 0): None or (low, high) numbers with low < "
                               "high"),
    (dict(crop_fraction=1.5), "crop_fraction=1.5: a number in (0, 1]"),
    (dict(label_offset="1"), "label_offset='1': an int"),
    (dict(shuffle_buffer=0), "shuffle_buffer=0: an int >= 1, or None"),
    (dict(cache=""), "cache='': False, True (memory) or a file prefix"),
    (dict(start=-1), "start=-1: a global step (an int >= 0)"),
    (dict(start="0"), "start='0': a global step"),
    (dict(dct_method="fast"), "dct_method='fast': use one of ('INTEGER_ACCURATE', "
                              "'INTEGER_FAST')"),
    (dict(native_batching="dense"), "native_batching='dense': use one of"),
    (dict(input_context=2), "input_context=2: a tf.distribute.InputContext, or None"),
    (dict(skip_corrupt="no"), "skip_corrupt='no': True or False"),
    (dict(split=3), "split=3: a split name or a TFDS slice of one"),
])
def test_a_bad_argument_is_one_line_naming_it_before_any_read(tmp_path, kwargs, message):
    """`tmp_path` holds no dataset: the argument is refused before the path is looked at."""
    with pytest.raises(ValueError) as e:
        readers.make_dataset(str(tmp_path / "none"), **kwargs)
    assert str(e.value).startswith(f"make_dataset: {message}") and "\n" not in str(e.value)


def test_accepted_forms(root):
    ds = readers.make_dataset(root, "validation", batch_size=np.int64(4), image_size=[SIZE, 8],
                              seed=np.int32(2), dtype=np.float16, value_range=[0, 255])
    images, labels = next(iter(ds))
    assert images.shape == (4, SIZE, 8, 3) and images.dtype == tf.float16


def test_repeat_minus_one_is_forever(root):
    ds = readers.make_dataset(root, batch_size=8, image_size=SIZE, repeat=-1, seed=1)
    assert ds.cardinality().numpy() == tf.data.INFINITE_CARDINALITY
    batches = list(ds.take(9))  # more than an epoch's 3 steps: no corruption error
    assert [b[0].shape[0] for b in batches] == [8] * 9
    resumable = readers.make_dataset(root, batch_size=8, image_size=SIZE, repeat=-1, start=0)
    assert resumable.cardinality().numpy() == tf.data.INFINITE_CARDINALITY
    assert len(list(resumable.take(7))) == 7


def test_a_batch_larger_than_the_split_is_an_error_unless_partial(root):
    with pytest.raises(ValueError, match=r"^make_dataset: batch_size=64: this host reads 30 "
                                         r"records of split 'train' an epoch, fewer than one "
                                         r"batch \(0 steps\); pass a smaller batch_size, or "
                                         r"drop_remainder=False for one partial batch$"):
        readers.make_dataset(root, batch_size=64, image_size=SIZE)
    with pytest.raises(ValueError, match="this host reads 15 records"):
        readers.make_dataset(root, batch_size=16, image_size=SIZE, input_context=Ctx(2, 0),
                             version=VERSION)
    with pytest.raises(ValueError, match=r"batch_size=64: a global batch of 64 records is "
                                         r"more than split 'train' holds \(30\)"):
        readers.make_dataset(root, batch_size=64, image_size=SIZE, start=0)
    partial = readers.make_dataset(root, batch_size=64, image_size=SIZE, drop_remainder=False)
    assert [b[0].shape[0] for b in partial] == [N] and partial.steps_per_epoch == 1
    evaluation = readers.make_dataset(root, "validation", batch_size=64, image_size=SIZE)
    assert [b[0].shape[0] for b in evaluation] == [9]  # evaluation keeps its remainder


def keys_of(ds):
    return [k.decode() for batch in ds for k in np.atleast_1d(batch[2].numpy()).tolist()]


def test_keys_on_every_path(root):
    """Evaluation (manifest order, batched or not, native size), slices, the stream order
    and the resumable order yield each record's key, and the loaders' Example.key agrees."""
    import loaders

    manifest_order = [ex.key for ex in loaders.RecordSource(root, "train", decode=False)]
    evaluation = dict(training=False, with_keys=True)
    assert keys_of(readers.make_dataset(root, "train", batch_size=7, image_size=SIZE,
                                        **evaluation)) == manifest_order
    assert keys_of(readers.make_dataset(root, "train", batch_size=None, image_size=SIZE,
                                        **evaluation)) == manifest_order
    assert keys_of(readers.make_dataset(root, "train", batch_size=4, image_size=None,
                                        **evaluation)) == manifest_order
    assert keys_of(readers.make_dataset(root, "train[5:20]", batch_size=5, image_size=SIZE,
                                        **evaluation)) == manifest_order[5:20]
    assert [ex.key for ex in loaders.SequentialRecords(root, "train[5:20]", decode=False)] == (
        manifest_order[5:20])
    stream = keys_of(readers.make_dataset(root, "train", batch_size=6, image_size=SIZE, seed=1,
                                          with_keys=True))
    assert len(stream) == N and sorted(stream) == sorted(manifest_order)
    ds = readers.make_dataset(root, "train", batch_size=6, image_size=SIZE, seed=1,
                              with_keys=True, start=0)
    assert sorted(keys_of(ds)) == sorted(manifest_order)
    # each key comes with its own image: the red channel encodes the record id
    for images, labels, keys in readers.make_dataset(root, "train", batch_size=6,
                                                     image_size=SIZE, dtype="uint8",
                                                     **evaluation):
        rids = np.round(images.numpy()[..., 0].mean(axis=(1, 2)) / 6).astype(int)
        assert [k.decode() for k in keys.numpy()] == [
            f"{['daisy', 'rose', 'tulip'][r % 3]}/{r}.jpg" for r in rids]


def test_the_order_is_a_function_of_content_not_of_the_version_id(root, tmp_path):
    """A rebuild that stores the same records (here: the version copied under another id,
    as a --force rebuild reproduces it) reads the same order; other content another."""
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    old = copy / "versions" / VERSION
    new_version = "20300101T000000Z"
    manifest = (old / "manifest.json").read_text().replace(VERSION, new_version)
    old.rename(copy / "versions" / new_version)
    (copy / "versions" / new_version / "manifest.json").write_text(manifest)

    def order(path, version):
        ds = readers.make_dataset(str(path), batch_size=6, image_size=SIZE, seed=5, start=0,
                                  with_keys=True, version=version)
        return keys_of(ds)

    assert order(copy, new_version) == order(root, VERSION)
    info = readers.info(root, VERSION)
    same = order_lib.content_id(info.split("train"))
    assert same == order_lib.content_id(readers.info(str(copy), new_version).split("train"))
    assert same != order_lib.content_id(info.split("validation"))
    shards = list(info.split("train").shards)
    shards[0] = type(shards[0])(**dict(vars(shards[0]), sha256="0" * 64))
    changed = type(info.split("train"))(**dict(vars(info.split("train")), shards=tuple(shards)))
    assert order_lib.content_id(changed) != same
