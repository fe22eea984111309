"""The resumable order: shuffle quality, time to resume, requests per record on gs://.

    python benchmarks/bench_reader_resume.py quality [--n 4096]     # no decoding
    python benchmarks/bench_reader_resume.py resume  [--n 4096]     # start= at several positions
    python benchmarks/bench_reader_resume.py gcs     [--n 512]      # the storage emulator

Data: bench_reader.write_data (photographs, 16 shards by key hash, `.index` files).

quality: the stream order (today's reader: shard files shuffled, 16 interleaved, a shuffle
buffer of ~32 MiB and at least 1,024 records) against the resumable order (runs of 16
permuted over the split, windows of 1,024 shuffled) and a full random permutation, one
epoch each, for:
P(the next record comes from the same shard), the mean of that over lags 1..128 (a batch),
distinct shards per batch of 128, P(the next record has the same label).
resume: time from make_dataset(start=step) to its first batch, at positions through an epoch
(medians of 3, alternating), against the time one global batch takes in steady state and a
fresh start of the stream order (make_dataset without start=); and what resuming at step s
costs beyond starting at step 0, which is what reading the steps before s would add.
gcs: HTTP requests TensorFlow makes for one epoch read from gs:// (the emulator behind the
tests' counting proxy), per record, stream and resumable.
"""

import argparse
import os
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

from bench_reader import write_data  # noqa: E402
from common import Record, add_record_argument, printed  # noqa: E402

BATCH = 128


def labels_and_shards(root):
    """(shard of each record, label of each record), record numbers in manifest order."""
    import tensorflow as tf

    from dataset_format import schema

    import readers

    split = readers.info(root).split("train")
    shards, labels = [], []
    for s, shard in enumerate(split.shards):
        for record in tf.data.TFRecordDataset(shard.path):
            ex = tf.io.parse_single_example(record, schema.feature_spec([schema.LABEL]))
            labels.append(int(ex[schema.LABEL]))
            shards.append(s)
    return np.array(shards), np.array(labels), split


def stream_order(root, split, seed=1):
    """Record numbers in the order today's stream reader yields them (no decoding)."""
    import readers
    from readers import hosts, pipeline, records

    plan = hosts.plan(split, hosts.Hosts(1, 0, "single"), True)
    ds, _ = records.records(plan, split, True, seed)  # (record, id)
    buffer = pipeline.shuffle_buffer(None, split, plan.records)
    ds = ds.shuffle(buffer, seed=seed).map(lambda record, rid: rid)
    del readers
    return np.array(list(ds.as_numpy_iterator())), buffer


def measures(ids, shard_of, label_of):
    s, lab = shard_of[ids], label_of[ids]
    same = [np.mean(s[lag:] == s[:-lag]) for lag in range(1, BATCH + 1)]
    batches = len(ids) // BATCH
    distinct = np.mean([len(set(s[b * BATCH:(b + 1) * BATCH])) for b in range(batches)])
    return same[0], float(np.mean(same)), distinct, float(np.mean(lab[1:] == lab[:-1]))


def quality(root):
    from readers import order as order_lib

    shard_of, label_of, split = labels_and_shards(root)
    stream, buffer = stream_order(root, split)
    counts = tuple(s.num_examples for s in split.shards)
    resumable = order_lib.EpochOrder(counts, 1, "v", "train").records_of(0)
    random = np.random.default_rng(1).permutation(len(shard_of))
    print(f"{len(shard_of)} records, {len(counts)} shards (chance of the same shard "
          f"{np.mean(np.bincount(shard_of) ** 2) * len(counts) / len(shard_of) ** 2:.3f}, "
          f"of the same label {np.sum(np.bincount(label_of) ** 2) / len(label_of) ** 2:.3f});"
          f" stream shuffle buffer {buffer} records\n")
    print(f"{'order':<12}{'same shard, lag 1':>18}{'lags 1-128':>12}{'shards/batch':>14}"
          f"{'same label, lag 1':>19}")
    for name, ids in (("stream", stream), ("resumable", resumable), ("random", random)):
        a, b, c, d = measures(ids, shard_of, label_of)
        print(f"{name:<12}{a:>18.3f}{b:>12.3f}{c:>14.1f}{d:>19.3f}")


def resume(root):
    import readers

    info = readers.info(root)
    steps = info.split("train").num_examples // BATCH
    ds = readers.make_dataset(root, "train", batch_size=BATCH, seed=1, start=0)
    it = iter(ds)
    next(it)
    t0 = time.perf_counter()
    for _ in range(5):
        next(it)
    per_batch = (time.perf_counter() - t0) / 5
    print(f"steady state: {per_batch:.2f} s a global batch of {BATCH} ({steps} steps an epoch)")

    def first_batch(**kw):
        t0 = time.perf_counter()
        ds = readers.make_dataset(root, "train", batch_size=BATCH, seed=1, **kw)
        built = time.perf_counter() - t0
        next(iter(ds))
        return built, time.perf_counter() - t0

    def line(built, took, extra=""):
        return (f"first batch after {took:.2f} s (built in {built:.2f} s; "
                f"{took / per_batch:.2f} global batches' time){extra}")

    print(f"stream, no start=: {line(*first_batch())}")  # today's reader: a fresh start
    # What resuming at step s costs beyond starting the same order at step 0 (the reads of
    # what comes before s: none, when the index files locate it), against one global batch;
    # positions alternate, medians of 3.
    positions = (0, steps // 4, steps // 2, steps - 1, steps + steps // 2)
    runs = {step: [] for step in positions}
    for _ in range(3):
        for step in positions:
            runs[step].append(first_batch(start=step))
    median = {step: sorted(r, key=lambda bt: bt[1])[1] for step, r in runs.items()}
    at_zero = median[0][1]
    for step, (built, took) in median.items():
        print(f"start={step:>4}: {line(built, took, f'; {took - at_zero:+.2f} s against start=0')}")
    extra = max(took - at_zero for _, took in median.values())
    print(f"resuming mid-epoch costs {extra:+.2f} s at most beyond starting the order at step "
          f"0: {extra / per_batch:.2f} global batches' time")
    print(f"(load average {os.getloadavg()[0]:.1f})")


def gcs(root):
    from tests.gcs_emulator import run_emulator

    import readers

    with tempfile.TemporaryDirectory() as work, run_emulator(work) as emulator:
        bucket = emulator.create_bucket()
        emulator.upload_tree(root, f"gs://{bucket}/ds")
        uri = f"gs://{bucket}/ds"
        n = readers.info(uri).split("train").num_examples
        for name, start in (("stream", None), ("resumable", 0)):
            before = emulator.proxy.relayed
            ds = readers.make_dataset(uri, "train", batch_size=32, image_size=32, seed=1,
                                      start=start)
            got = sum(int(x[0].shape[0]) for x in ds)
            requests = emulator.proxy.relayed - before
            print(f"{name:<10} {got} records read, {requests} requests: "
                  f"{requests / got:.3f} per record ({n} in the split)")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=("quality", "resume", "gcs"))
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--distinct", type=int, default=500)
    p.add_argument("--shards", type=int, default=16)
    add_record_argument(p)
    args = p.parse_args(argv)
    record = Record("bench_reader_resume", args)
    with tempfile.TemporaryDirectory(prefix="bench_resume_") as root, printed() as lines:
        write_data(root, args.n, args.shards, args.distinct)
        {"quality": quality, "resume": resume, "gcs": gcs}[args.what](root)
    record.save({"lines": lines})


if __name__ == "__main__":
    main()
