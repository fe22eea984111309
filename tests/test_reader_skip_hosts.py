"""skip_corrupt in the resumable order on several hosts: a damaged or undecodable record in
one host's part is replaced by a copy of another record, so every host runs the same steps
and every step reads the records the step -> records mapping (readers/order.py) names; the
skip is counted on `.skips` and named on stderr.

Hosts are simulated in one process (one dataset per `InputContext(n, h, n)`, read in
lockstep), as in tests/test_reader_resume.py.
"""

import json

import numpy as np
import pytest
import tensorflow as tf

import loaders
import readers
from dataset_format import frames
from readers import order as order_lib
from tests.test_reader import write_dataset
from tests.test_reader_resume import write_indexes

GLOBAL_BATCH, SEED, EPOCHS, START = 6, 7, 2, 1  # N = 30: 5 steps an epoch; resume at step 1


def damage(vdir, how):
    """Damage record 3 of the second train shard; its key."""
    shard = sorted(p for p in vdir.iterdir() if p.name.endswith("-of-00004"))[1]
    records = [tf.train.Example.FromString(r) for r in
               tf.data.TFRecordDataset(str(shard)).as_numpy_iterator()]
    key = records[3].features.feature["image/filename"].bytes_list.value[0].decode()
    if how == "crc":  # a flipped byte inside the record: its data CRC fails
        entries = frames.parse_index((vdir / (shard.name + ".index")).read_text())
        data = bytearray(shard.read_bytes())
        data[entries[3][0] + 100] ^= 0xFF
        shard.write_bytes(bytes(data))
    else:  # an intact frame whose image does not decode
        records[3].features.feature["image/encoded"].bytes_list.value[0] = b"not a JPEG"
        shard.write_bytes(b"".join(frames.tfrecord_frame(r.SerializeToString())
                                   for r in records))
        manifest = json.loads((vdir / "manifest.json").read_text())
        for s in manifest["splits"]["train"]["shards"]:
            s["num_bytes"] = (vdir / s["path"]).stat().st_size
        (vdir / "manifest.json").write_text(json.dumps(manifest))
        write_indexes(vdir)
    return key


def expected_steps(root, keys, hosts):
    """[host][step] -> the keys the order names, from step START for EPOCHS epochs."""
    info = readers.info(root)
    split = info.split("train")
    order = order_lib.EpochOrder(tuple(s.num_examples for s in split.shards), SEED,
                                 order_lib.content_id(split), "train")
    out = []
    for h in range(hosts):
        batching = order_lib.Batching(GLOBAL_BATCH, hosts, h)
        ids = np.concatenate([batching.host_records(order.records_of(e),
                                                    START * GLOBAL_BATCH if e == 0 else 0)
                              for e in range(EPOCHS)])
        out.append([[keys[i] for i in step] for step in ids.reshape(-1, batching.host_batch)])
    return out


@pytest.mark.parametrize("how", ["crc", "undecodable"])
@pytest.mark.parametrize("hosts", [2, 3])
def test_every_host_runs_every_step_with_the_records_the_order_names(tmp_path, hosts, how,
                                                                      capfd):
    vdir = write_dataset(tmp_path)
    write_indexes(vdir)
    keys = [ex.key for ex in loaders.RecordSource(str(tmp_path), "train", decode=False)]
    bad = damage(vdir, how)
    want = expected_steps(str(tmp_path), keys, hosts)
    datasets = [readers.make_dataset(
        str(tmp_path), "train", batch_size=GLOBAL_BATCH // hosts, image_size=8, seed=SEED,
        start=START, repeat=EPOCHS, with_keys=True, skip_corrupt=True,
        version=readers.info(str(tmp_path)).version,
        input_context=tf.distribute.InputContext(hosts, h, hosts)) for h in range(hosts)]
    got = [[[k.decode() for k in batch[2].numpy()] for batch in ds] for ds in datasets]
    steps = 5 * EPOCHS - START
    assert [len(g) for g in got] == [steps] * hosts  # equal steps, none lost
    assert [ds.cardinality().numpy() for ds in datasets] == [steps] * hosts
    replaced = 0
    for h in range(hosts):
        for step, (mine, named) in enumerate(zip(got[h], want[h])):
            for slot, (k, w) in enumerate(zip(mine, named)):
                if w == bad:  # a copy of a good record of this host stands in for it
                    assert k != bad and k in {x for s in want[h] for x in s}
                    replaced += 1
                else:
                    assert k == w, (h, step, slot)
    appearances = sum(w == bad for h in range(hosts) for s in want[h] for w in s)
    assert appearances and replaced == appearances  # each epoch it comes, it is replaced
    # counted on the host whose part held it (each epoch, one host's)
    assert [ds.skips.count for ds in datasets] == [
        sum(w == bad for s in want[h] for w in s) for h in range(hosts)]
    err = capfd.readouterr().err
    assert err.count("WARNING readers: skip_corrupt:") == appearances
    assert ("data CRC mismatch" if how == "crc" else "is not a decodable image record") in err


@pytest.mark.parametrize("hosts", [2, 3])
def test_the_stream_order_pads_a_skip_so_hosts_run_equal_steps(tmp_path, hosts):
    """Without start= there is no step -> records mapping to keep, only the step count: the
    host that skipped makes its epoch up with other readable records of its range."""
    vdir = write_dataset(tmp_path)
    write_indexes(vdir)
    keys = [ex.key for ex in loaders.RecordSource(str(tmp_path), "train", decode=False)]
    bad = damage(vdir, "crc")
    datasets = [readers.make_dataset(
        str(tmp_path), "train", batch_size=2, image_size=8, seed=SEED, repeat=EPOCHS,
        with_keys=True, skip_corrupt=True, version=readers.info(str(tmp_path)).version,
        input_context=tf.distribute.InputContext(hosts, h, hosts)) for h in range(hosts)]
    got = [[k.decode() for batch in ds for k in batch[2].numpy()] for ds in datasets]
    steps = EPOCHS * (30 // hosts) // 2  # repeat comes before batch: batches cross epochs
    assert [len(g) for g in got] == [2 * steps] * hosts
    assert [ds.cardinality().numpy() for ds in datasets] == [steps] * hosts
    damaged = [h for h in range(hosts) if datasets[h].skips.count]
    assert len(damaged) == 1 and all(bad not in g for g in got)
    assert datasets[damaged[0]].skips.count >= EPOCHS and set(got[damaged[0]]) < set(keys)
