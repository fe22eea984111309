"""Fast checks of what the reader tells tf.distribute and how it treats a pinned version
(the multi-worker runs themselves are in test_reader_multihost.py)."""

import tensorflow as tf

import readers
from tests.test_reader import VERSION, write_dataset

AUTO, OFF = tf.data.experimental.AutoShardPolicy.AUTO, tf.data.experimental.AutoShardPolicy.OFF


def _policy(ds):
    return ds.options().experimental_distribute.auto_shard_policy


def test_auto_shard_is_off_only_when_the_reader_split_the_records(tmp_path):
    write_dataset(tmp_path)
    root = str(tmp_path)
    # one host as far as the reader can tell (e.g. a resolver's strategy not in scope): it
    # reads everything, so tf.distribute's auto-shard must stay on to cut it
    assert _policy(readers.make_dataset(root, "train", batch_size=4, image_size=8)) == AUTO
    split = readers.make_dataset(root, "train", batch_size=4, image_size=8, version=VERSION,
                                 input_context=tf.distribute.InputContext(2, 1, 2))
    assert _policy(split) == OFF
    assert split.plan.records == 15


def test_a_correct_pin_through_info_is_accepted_on_several_hosts(tmp_path):
    write_dataset(tmp_path)
    meta = readers.info(str(tmp_path))  # followed LATEST
    ds = readers.make_dataset(meta, "train", batch_size=4, image_size=8, version=meta.version,
                              input_context=tf.distribute.InputContext(2, 0, 2))
    assert ds.dataset_info.version == VERSION
    try:
        readers.make_dataset(meta, "train", batch_size=4, image_size=8,
                             input_context=tf.distribute.InputContext(2, 0, 2))
    except ValueError as e:
        assert "followed LATEST" in str(e)
    else:
        raise AssertionError("an unpinned multi-host read was accepted")


def test_evaluation_reads_manifest_order(tmp_path):
    write_dataset(tmp_path)
    meta = readers.info(str(tmp_path))
    ds = readers.make_dataset(meta, "validation", batch_size=4, image_size=8)
    labels = [int(x) for _, b in ds for x in b.numpy()]
    # validation: 9 records in 2 shards, record r in shard r % 2 with label r % 3: the
    # manifest's order is shard 0 (records 0, 2, 4, 6, 8), then shard 1 (1, 3, 5, 7)
    assert labels == [r % 3 for r in (0, 2, 4, 6, 8, 1, 3, 5, 7)]
