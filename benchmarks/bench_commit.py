"""The commit step at 100, 1k and 10k shards against the storage emulator: seconds, CPU,
requests and peak RSS, in total and per shard (the cost curve).

    python benchmarks/bench_commit.py [--shards 100 1000 10000]
    python benchmarks/bench_commit.py --shards 1000 --code DIR   # another checkout's commit

For each size: a fresh bucket holding what the writers leave for commit (per shard: its
one-row catalog fragment and, for a commit that renames shards, a tiny temp shard, one
TFRecord frame; the listing's errors), and
synthetic typed ShardResults (1,000 classes, a label per shard, an error record every tenth
shard). Then `commit.commit` runs in a fresh process (so its peak RSS is its own), timed
from the call to the published LATEST, its CPU seconds (all threads) beside. Every request
goes through the counting proxy (tests/gcs_counting.py): requests by kind per shard, and
how many times each catalog fragment was read (its media and metadata GETs).

This checkout's commit gets what the job hands it: slim results (ShardResult.slim), the
label counts combined (SumLabelCounts) and the error records as one file (WriteErrors), and
shards already under their final names. A checkout from before (`--code DIR`, whose
commit takes full results and renames temp shards) gets full results and shards under
temp names; the script notices which by whether ShardResult has `slim`.

The emulator is one Python process on loopback (a request costs ~1-5 ms, not GCS's tens
of ms) and the machine is shared: compare per-shard figures across sizes and versions,
not absolute ones.
"""

import argparse
import concurrent.futures
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from common import Record, add_record_argument  # noqa: E402
LABELS = 1000
NAME = "bench"
EMPTY_RESULT = json.loads(  # ShardResult(None, None).to_json()
    '{"split": null, "shard": null, "path": null, "temp": null, "num_examples": 0, '
    '"num_bytes": 0, "crc32c": null, "sha256": null, "label_counts": {}, "errors": [], '
    '"passed_through": 0, "converted": 0, "reframed": 0, "repaired": 0, "kind": null, '
    '"origin": "hash", "writer": null, "catalog_temp": null, "index_temp": null, '
    '"pixel_moments": null, "resumed": false, "shared": null, "build": null}')


def shard_name(shard, n):
    return f"{NAME}-train.tfrecord-{shard:05d}-of-{n:05d}"


def stored_sha256(i):
    """A distinct, evenly spread stored-image hash per shard, as real ones are (the hex of i
    itself gave every row the same 8-byte prefix: the duplicates scan then read every
    fragment a second time to compare full hashes)."""
    import hashlib

    return hashlib.sha256(str(i).encode()).hexdigest()


def child(args):
    """Runs in a fresh process: rebuild the results, commit, print seconds and RSS."""
    import dataclasses
    import resource

    sys.path.insert(0, args.code)
    from beam_pipeline.job import commit as commit_module
    from beam_pipeline.job import label_counts
    from beam_pipeline.store import catalog, gcs

    # The emulator queues at most 5 connections it has not accepted yet, and answers a batch
    # request slowly: fewer in flight (GCS takes the defaults, 8 batches and 8 reads).
    try:  # deletes moved out of gcs.py; older code under --code has them there
        from beam_pipeline.store import gcs_delete as deletes
    except ImportError:
        deletes = gcs
    deletes.DELETE_PARALLEL, catalog.FRAGMENTS_AHEAD = 1, 4
    from beam_pipeline.job.contracts import CommitSpec, Listed, ShardResult
    from dataset_format import frames, layout

    new = hasattr(ShardResult, "slim")
    root, n = args.root, args.n
    vdir = layout.version_dir(root, "20260101T000000Z")
    frame = frames.tfrecord_frame(b"x" * 8)
    results = []
    for i in range(n):
        final = shard_name(i, n)
        temp = f"{vdir}/{final}" if new else f"{vdir}/.tmp/{final}.attempt"
        # From its JSON: one flat object in this checkout and in those before (--code).
        results.append(ShardResult.from_json(json.dumps(dict(
            EMPTY_RESULT, split="train", shard=i, path=final, temp=temp, num_examples=1,
            num_bytes=len(frame), sha256=f"{i:064x}", label_counts={f"c{i % LABELS}": 1},
            errors=[{"uri": f"gs://in/{i}.jpg", "stage": "read", "reason": "truncated",
                     "detail": "x"}] if i % 10 == 0 else [],
            kind="images", writer=f"w{i % 32}:1",
            catalog_temp=f"{vdir}/.tmp/{final}.attempt.catalog.parquet"))))
    spec = CommitSpec(
        root=root, version="20260101T000000Z", name=NAME,
        labels=tuple(f"c{i}" for i in range(LABELS)), num_shards={"train": n},
        listed=Listed(n, 0, f"{vdir}/.tmp/listing_errors.jsonl"),
        input_fingerprint="sha256:b", config={}, generator={}, max_error_rate=1.0,
        write_index=False)
    kwargs = {}
    if new:  # what the job's other commit steps would hand over
        counts = label_counts.SumLabelCounts()
        kwargs = {"label_counts": counts.extract_output(
                      counts.merge_accumulators([counts.add_input(counts.create_accumulator(),
                                                                  r) for r in results])),
                  "error_files": (f"{vdir}/.tmp/shard_errors.jsonl",)}
        results = [r.slim() for r in results]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    before, cpu = usage.ru_maxrss, usage.ru_utime + usage.ru_stime
    start = time.perf_counter()
    manifest = commit_module.commit(results, spec, **kwargs)
    seconds = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    peak, cpu = usage.ru_maxrss, usage.ru_utime + usage.ru_stime - cpu
    assert manifest["accounting"]["written"] == n and manifest["catalog"]["rows"] == n
    assert manifest["errors"]["count"] == (n + 9) // 10 + 1
    print(json.dumps({"seconds": seconds, "cpu_seconds": cpu, "rss_before_mib": before / 1024,
                      "peak_rss_mib": peak / 1024, "new": new}))


def prepare(emulator, n, new, local=None):
    """The objects the writers leave for commit -> the dataset root (gs://, or a fresh
    directory under `local`)."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    sys.path.insert(0, REPO)
    from beam_pipeline.store import catalog
    from dataset_format import frames

    if local:
        base = tempfile.mkdtemp(dir=local)
        root = f"{base}/ds"

        class Blob:
            def __init__(self, name):
                self.path = os.path.join(base, name)

            def upload_from_string(self, data):
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
                with open(self.path, "wb" if isinstance(data, bytes) else "w") as f:
                    f.write(data)

        bucket = type("Dir", (), {"blob": staticmethod(Blob)})()
    else:
        bucket = emulator.client.bucket(emulator.create_bucket())
        root = f"gs://{bucket.name}/ds"
    vdir = "ds/versions/20260101T000000Z"
    frame = frames.tfrecord_frame(b"x" * 8)

    def one(i):
        final = shard_name(i, n)
        row = {"key": f"{i}.jpg", "uri": f"gs://in/{i}.jpg", "label": f"c{i % LABELS}",
               "label_id": i % LABELS, "split": "train", "shard": i, "file": final,
               "position": 0, "offset": 0, "length": len(frame), "sha256": stored_sha256(i),
               "height": 8, "width": 8, "input_size": 1, "input_mtime": 0.0}
        out = io.BytesIO()
        pq.write_table(pa.Table.from_pylist([row], schema=catalog.SCHEMA), out)
        bucket.blob(f"{vdir}/.tmp/{final}.attempt.catalog.parquet").upload_from_string(
            out.getvalue())
        if not new:  # the old commit renames each temp shard; the new one never reads them
            bucket.blob(f"{vdir}/.tmp/{final}.attempt").upload_from_string(frame)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # the emulator's accept queue is 5
        list(pool.map(one, range(n)))
    error = {"uri": "gs://in/x.jpg", "stage": "list", "reason": "not_found", "detail": "x"}
    bucket.blob(f"{vdir}/.tmp/listing_errors.jsonl").upload_from_string(
        json.dumps(error) + "\n")
    if new:  # what WriteErrors leaves: the shards' error records, one file
        lines = "".join(json.dumps({"uri": f"gs://in/{i}.jpg", "stage": "read",
                                    "reason": "truncated", "detail": "x"}, sort_keys=True)
                        + "\n" for i in range(0, n, 10))
        bucket.blob(f"{vdir}/.tmp/shard_errors.jsonl").upload_from_string(lines)
    return root


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--code", default=REPO, help="checkout whose commit is measured")
    parser.add_argument("--local", metavar="DIR",
                        help="a local root under DIR instead of the emulator (CPU and memory "
                        "only: no requests; sizes the emulator takes hours to set up)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    add_record_argument(parser)
    args = parser.parse_args()
    if args.child:
        return child(args)
    record = Record("bench_commit", {k: v for k, v in vars(args).items()
                                    if k not in ("child", "root", "n")})
    sys.path.insert(0, REPO)
    from tests.gcs_counting import counting
    from tests.gcs_emulator import run_emulator

    new = subprocess.run(
        [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
         "from beam_pipeline.job.contracts import ShardResult; "
         "print(hasattr(ShardResult, 'slim'))", args.code],
        capture_output=True, text=True, check=True).stdout.strip() == "True"
    print(f"commit of {args.code} ({'slim results, shards final' if new else 'full results, temp shards renamed'}); "
          "storage emulator on loopback, loaded 2-core machine")
    print(f"{'shards':>8} {'setup s':>8} {'commit s':>9} {'ms/shard':>9} {'CPU ms/shard':>12} "
          f"{'req/shard':>9} {'GETs/shard':>10} {'reads/fragment':>14} {'peak RSS':>9} "
          f"{'KiB/shard':>10}")
    rows = []
    with tempfile.TemporaryDirectory() as work, (
            contextlib.nullcontext() if args.local else run_emulator(work)) as emulator:
        if emulator:
            emulator.client  # made before the proxy: the setup's uploads are not counted
        with contextlib.nullcontext() if args.local else counting(emulator) as counter:
            for n in args.shards:
                start = time.perf_counter()
                root = prepare(emulator, n, new, args.local)
                setup = time.perf_counter() - start
                if counter:
                    counter.reset()
                out = subprocess.run(
                    [sys.executable, __file__, "--child", "--code", args.code, "--root", root,
                     "--n", str(n)], capture_output=True, text=True, env=dict(os.environ))
                if out.returncode:
                    sys.exit(out.stderr[-3000:])
                got = json.loads(out.stdout.strip().splitlines()[-1])
                got.update(requests(counter, n) if counter else
                           {"requests": 0, "gets": 0, "by_kind": {},
                            "reads_per_fragment": {"mean": 0, "max": 0}})
                growth = got["peak_rss_mib"] - got["rss_before_mib"]
                print(f"{n:>8} {setup:>8.1f} {got['seconds']:>9.1f} "
                      f"{1000 * got['seconds'] / n:>9.2f} {1000 * got['cpu_seconds'] / n:>12.2f} "
                      f"{got['requests'] / n:>9.2f} {got['gets'] / n:>10.2f} "
                      f"{got['reads_per_fragment']['mean']:>8.2f} (max {got['reads_per_fragment']['max']}) "
                      f"{got['peak_rss_mib']:>7.0f}Mi {1024 * growth / n:>10.2f}", flush=True)
                print(f"         requests by kind: {got['by_kind']}; load {os.getloadavg()[0]:.1f}")
                rows.append({"shards": n, "setup_s": setup, **got,
                             "kib_per_shard": 1024 * growth / n,
                             "load": os.getloadavg()[0]})
    record.save({"slim_results": new, "runs": rows})


def requests(counter, n):
    """The commit's requests (the proxy's log) -> counts, GETs, reads per fragment."""
    import collections
    from urllib.parse import unquote

    totals = counter.totals()
    reads = collections.Counter(
        unquote(target).split("?")[0] for kind, _, target, _ in counter.log
        if kind in ("media_get", "metadata_get") and ".catalog.parquet" in unquote(target))
    per = list(reads.values()) + [0] * (n - len(reads))
    by_kind = {k: v for k, v in sorted(totals.items())
               if k not in ("requests", "bytes_down", "bytes_up", "media_bytes")}
    return {"requests": totals.get("requests", 0), "by_kind": by_kind,
            "gets": sum(totals.get(k, 0) for k in ("media_get", "metadata_get", "bucket_get",
                                                     "list")),
            "reads_per_fragment": {"mean": sum(per) / n, "max": max(per), "min": min(per)}}


if __name__ == "__main__":
    main()
