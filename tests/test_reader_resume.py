"""The resumable order (readers/order.py, readers/resumable.py): training that is killed and
resumed, on another number of hosts or with another batch size, sees exactly the records an
uninterrupted run sees, in the same order, each once per epoch.

Hosts are simulated in one process: n datasets, each built with its own
`tf.distribute.InputContext(n, h, n)`, read in lockstep (one per-host batch each per global
step), which is what n workers under `distribute_datasets_from_function` do.
"""

import json
import os

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import readers
from dataset_format import frames
from readers import order as order_lib
from tests.test_reader import write_dataset

NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)  # a shrink re-reads for minutes
N = 30  # train records in write_dataset's default split (4 shards)
LONG = os.environ.get("READER_RESUME_PROFILE") == "long"


def write_indexes(vdir):
    """The `.index` beside every shard, as the build writes it (offset, frame length)."""
    for name in os.listdir(vdir):
        if ".tfrecord-" in name and not name.endswith(".index"):
            data = (vdir / name).read_bytes()
            entries, offset = [], 0
            while offset < len(data):
                length = int.from_bytes(data[offset:offset + 8], "little") + 16
                entries.append((offset, length))
                offset += length
            (vdir / (name + ".index")).write_bytes(frames.index_bytes(entries))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    write_indexes(write_dataset(root))
    return str(root)


def host_datasets(root, hosts, global_batch, start, seed=7):
    return [iter(readers.make_dataset(
        root, "train", batch_size=global_batch // hosts, image_size=8, seed=seed,
        start=start, repeat=True, with_keys=True, version=readers.info(root).version,
        input_context=tf.distribute.InputContext(hosts, h, hosts))) for h in range(hosts)]


def keys_of(batch):
    return [k.decode() for k in batch[2].numpy().tolist()]


def uninterrupted(root, epochs, global_batch, seed=7):
    """epoch -> the keys one host reads in that epoch, in order."""
    ds = readers.make_dataset(root, "train", batch_size=global_batch, image_size=8, seed=seed,
                              start=0, repeat=epochs, with_keys=True)
    steps = N // global_batch
    seq = [k for batch in ds for k in keys_of(batch)]
    return {e: seq[e * steps * global_batch:(e + 1) * steps * global_batch]
            for e in range(epochs)}


# --- the pure order: no TensorFlow ---------------------------------------------------------

@settings(max_examples=200 if LONG else 30, deadline=None)
@given(counts=st.lists(st.integers(0, 40), min_size=1, max_size=6).filter(lambda c: sum(c)),
       seed=st.integers(0, 2**40), epoch=st.integers(0, 5))
def test_an_epoch_is_a_permutation_made_of_runs(counts, seed, epoch):
    order = order_lib.EpochOrder(tuple(counts), seed, "v1", "train", run=4, window=16)
    ids = order.records_of(epoch)
    assert sorted(ids.tolist()) == list(range(sum(counts)))
    assert np.array_equal(ids, order.records_of(epoch))  # a pure function
    # runs (4 consecutive records of one shard) are read together: each lies in at most
    # two neighbouring windows of the order
    starts = np.cumsum([0] + counts)
    shard = np.searchsorted(starts, ids, side="right") - 1
    run = (shard, (ids - starts[shard]) // 4)
    windows = {}
    for position, key in enumerate(zip(*run)):
        windows.setdefault(key, set()).add(position // 16)
    assert all(max(w) - min(w) <= 1 for w in windows.values())


@settings(max_examples=300 if LONG else 60, deadline=None)
@given(data=st.data())
def test_host_parts_make_the_global_batches(data):
    counts = tuple(data.draw(st.lists(st.integers(1, 30), min_size=1, max_size=5)))
    ids = order_lib.EpochOrder(counts, 3).records_of(data.draw(st.integers(0, 3)))
    global_batch = data.draw(st.sampled_from([1, 2, 4, 6, 12]))
    if global_batch > len(ids):
        return
    hosts = data.draw(st.sampled_from([h for h in (1, 2, 3, 4, 6) if global_batch % h == 0]))
    steps = len(ids) // global_batch
    start = data.draw(st.integers(0, steps)) * global_batch
    parts = [order_lib.Batching(global_batch, hosts, h).host_records(ids, start)
             for h in range(hosts)]
    assert len({len(p) for p in parts}) == 1  # equal steps on every host
    rebuilt = np.stack([p.reshape(-1, global_batch // hosts) for p in parts], 1).ravel()
    assert np.array_equal(rebuilt, ids[start:steps * global_batch])
    assert len(ids) - steps * global_batch < global_batch  # at most the N mod G tail left out


def test_position_arithmetic():
    assert order_lib.position_of_step(7, 3, 8) == readers.Position(2, 8)
    assert readers.Position(0, 16).after(1, 8, 30) == readers.Position(1, 0)
    assert readers.Position(0, 8).after(4, 8, 30) == readers.Position(1, 16)
    assert readers.Position(0, 8).after(5, 8, 30) == readers.Position(2, 0)
    assert readers.Position(1, 0).after(0, 8, 30) == readers.Position(1, 0)
    with pytest.raises(ValueError, match="does not divide among 4 hosts"):
        order_lib.Batching(6, 4)


# --- the reader: kill and resume, elastic ----------------------------------------------------

TOTALS = {"runs": 0, "segments": 0, "resumes": 0, "refused batch sizes": 0, "steps": 0,
          "epochs crossed": 0}  # printed per run (-s): the long profile's figures
PLANS = st.lists(st.tuples(st.integers(1, 9), st.sampled_from([1, 2, 3]),
                           st.sampled_from([6, 12])), min_size=2, max_size=4)


def test_a_read_plan_gathers_the_records_it_names(root):
    """The C++ read (readers/resumable.read_window) takes ranges of consecutive frames from
    their `.index` offsets, then gathers: read here frame by frame in Python, the plan gives
    the same records as reading each id on its own, in the ids' order."""
    from readers import ranged, resumable

    source = resumable.make_source(readers.info(root).split("train"), skip_corrupt=False)
    rng = np.random.default_rng(5)
    for ids in (np.arange(N), rng.permutation(N), rng.permutation(N)[:7], np.array([N - 1])):
        paths, offsets, counts, sizes, gather = source.plan(ids)
        read = []
        for path, offset, count, size in zip(paths, offsets, counts, sizes):
            data = open(path, "rb").read()
            assert 0 < size <= len(data) - offset
            for _ in range(count):
                n = int.from_bytes(data[offset:offset + 8], "little")
                read.append(data[offset + 12:offset + 12 + n])
                offset += n + 16
        assert [read[g] for g in gather] == source.read(ids)
        assert len(paths) <= len({source.where(i)[0] for i in ids})  # one range a shard here
    assert ranged.LOCAL_GAP < ranged.MAX_GAP  # gs:// reads through more: a range is a GET


@pytest.mark.slow  # ~18 s of tf.data pipelines; fast: the two resume tests below
@settings(max_examples=12 if LONG else 3, deadline=None, phases=NO_SHRINK,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(plan=PLANS)
def test_killed_and_resumed_runs_read_what_one_run_reads(root, plan):
    """Each segment: (steps, hosts, global batch). A segment starts from the saved Position of
    the last; a batch size whose boundary the position is not on is refused, clearly."""
    order = uninterrupted(root, 3, 6)  # G = 6 divides N = 30: each epoch's whole order
    seen, position, batch = {}, readers.Position(0, 0), plan[0][2]
    for steps, hosts, global_batch in plan:
        TOTALS["segments"] += 1
        TOTALS["resumes"] += position != readers.Position(0, 0)
        if position.records % global_batch:
            with pytest.raises(ValueError, match="not a global batch boundary"):
                next(host_datasets(root, hosts, global_batch, position)[0])
            TOTALS["refused batch sizes"] += 1
            global_batch = batch
        its = host_datasets(root, hosts, global_batch, position)
        for _ in range(steps):
            if position.records + global_batch > N:  # no full batch left: the next epoch
                position = readers.Position(position.epoch + 1, 0)
            if position.epoch >= 3:
                break
            step_keys = [k for it in its for k in keys_of(next(it))]
            want = order[position.epoch][position.records:position.records + global_batch]
            assert step_keys == want  # the uninterrupted order, whatever the host count
            seen.setdefault(position.epoch, []).extend(step_keys)
            after = position.after(1, global_batch, N)
            TOTALS["steps"] += 1
            TOTALS["epochs crossed"] += after.epoch != position.epoch
            position = after
        batch = global_batch
    TOTALS["runs"] += 1
    print("RESUME PROFILE", TOTALS)
    for epoch, keys in seen.items():
        assert len(keys) == len(set(keys))  # each record at most once per epoch
        if epoch < position.epoch:  # finished: all but the tail that fills no global batch
            assert N - len(keys) < max(g for _, _, g in plan)


def test_resume_is_exact_for_one_batch_size(root):
    truth = uninterrupted(root, 2, 6)
    its = host_datasets(root, 2, 6, 0)
    first = [k for _ in range(3) for it in its for k in keys_of(next(it))]
    its = host_datasets(root, 3, 6, 3)  # killed after 3 steps, resumed on 3 hosts
    rest = [k for _ in range(4) for it in its for k in keys_of(next(it))]
    assert first + rest[:12] == truth[0]
    assert rest[12:] == truth[1][:12]
    assert sorted(truth[0]) == sorted(set(truth[0])) and len(truth[0]) == 30


def test_order_is_pixel_exact_after_resume(root):
    """Crops and flips are seeded by (seed, epoch, record): a resumed run sees the same
    pixels, whatever the host count."""
    one = readers.make_dataset(root, "train", batch_size=6, image_size=8, seed=3, start=0,
                               with_keys=True)
    want = [b[0].numpy() for b in one][2:]
    its = host_datasets(root, 2, 6, 2, seed=3)
    got = [np.concatenate([next(it)[0].numpy() for it in its]) for _ in range(len(want))]
    for w, g in zip(want, got):
        np.testing.assert_array_equal(w, g)


def test_start_needs_the_index_files(tmp_path):
    write_dataset(tmp_path)
    ds = readers.make_dataset(str(tmp_path), "train", batch_size=6, image_size=8, start=0)
    with pytest.raises(tf.errors.OpError, match=r"\.index: no index file"):
        next(iter(ds))
    with pytest.raises(ValueError, match="evaluation reads the manifest's order"):
        readers.make_dataset(str(tmp_path), "validation", start=0)


def test_a_damaged_record_is_named_or_skipped_alone(tmp_path):
    vdir = write_dataset(tmp_path)
    write_indexes(vdir)
    shard = sorted(p for p in vdir.iterdir() if p.name.endswith("-of-00004"))[1]
    entries = frames.parse_index((vdir / (shard.name + ".index")).read_text())
    data = bytearray(shard.read_bytes())
    data[entries[3][0] + 100] ^= 0xFF  # inside record 3's bytes: its data CRC fails
    shard.write_bytes(bytes(data))
    ds = readers.make_dataset(str(tmp_path), "train", batch_size=1, image_size=8, start=0,
                              with_keys=True)
    with pytest.raises(tf.errors.OpError, match=rf"{shard.name}: record 3 \(offset "
                                                rf"{entries[3][0]}: data CRC mismatch"):
        list(ds)
    ds = readers.make_dataset(str(tmp_path), "train", batch_size=1, image_size=8, start=0,
                              with_keys=True, skip_corrupt=True)
    keys = [k for b in ds for k in keys_of(b)]
    # only the damaged record lost, its step kept: a copy of a neighbour stands in for it
    assert len(keys) == N and len(set(keys)) == N - 1 and ds.skips.count == 1
    assert f"{shard.name}: record 3 " in ds.skips.names[0]


def test_a_shard_gone_after_make_dataset_is_named_at_once(tmp_path, monkeypatch):
    """A shard pruned or cut mid-training is one error naming it, never a hang (TensorFlow's
    reader, asked again under `ignore_errors`, retries a file it cannot open for ever). Each
    planned chunk stats its shards; "unchecked": a shard gone between that stat and the C++
    read fails its window, which Python reads again and names."""
    import threading

    from readers import ranged

    vdir = write_dataset(tmp_path)
    write_indexes(vdir)
    shards = sorted(p for p in vdir.iterdir() if p.name.endswith("-of-00004"))
    data = shards[1].read_bytes()
    for damage in ("delete", "truncate", "unchecked"):
        if damage == "unchecked":
            monkeypatch.setattr(ranged.RangedRecords, "check_file", lambda self, shard: None)
        shards[1].write_bytes(data)
        ds = readers.make_dataset(str(tmp_path), "train", batch_size=2, image_size=8, start=0)
        if damage in ("delete", "unchecked"):
            shards[1].unlink()
        else:
            shards[1].write_bytes(data[:-5])
        outcome = []

        def read(ds=ds):
            try:
                list(ds)
                outcome.append("no error")
            except tf.errors.OpError as e:
                outcome.append(e.message)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(60)
        assert outcome, "reading a split with a shard gone hung"
        want = {"delete": "shard file missing", "truncate": "the file is truncated",
                "unchecked": ": missing"}[damage]
        assert f"{shards[1].name}: " in outcome[0] and want in outcome[0], outcome[0]


def test_an_undecodable_record_is_named_or_skipped(tmp_path):
    """A record whose frame is intact but whose image does not decode (a dataset written by
    another tool, or a --validate header build): named by shard and position."""
    vdir = write_dataset(tmp_path)
    shard = sorted(p for p in vdir.iterdir() if p.name.endswith("-of-00004"))[2]
    records = [tf.train.Example.FromString(r) for r in
               tf.data.TFRecordDataset(str(shard)).as_numpy_iterator()]
    records[4].features.feature["image/encoded"].bytes_list.value[0] = b"not a JPEG"
    shard.write_bytes(b"".join(frames.tfrecord_frame(r.SerializeToString()) for r in records))
    manifest = json.loads((vdir / "manifest.json").read_text())
    for s in manifest["splits"]["train"]["shards"]:
        s["num_bytes"] = (vdir / s["path"]).stat().st_size
    (vdir / "manifest.json").write_text(json.dumps(manifest))
    write_indexes(vdir)
    ds = readers.make_dataset(str(tmp_path), "train", batch_size=2, image_size=8, start=0)
    with pytest.raises(tf.errors.OpError, match=rf"{shard.name}: record 4: cannot parse it "
                                                "or decode its image"):
        list(ds)
    ds = readers.make_dataset(str(tmp_path), "train", batch_size=1, image_size=8, start=0,
                              with_keys=True, skip_corrupt=True)
    keys = [k for b in ds for k in keys_of(b)]
    assert len(keys) == N and len(set(keys)) == N - 1 and ds.skips.count == 1
    assert ds.skips.names[0].endswith(f"{shard.name}: record 4 is not a decodable image record")
