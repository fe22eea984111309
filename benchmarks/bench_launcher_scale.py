"""The launcher at 1M and 10M listed gs:// objects, night after night: CPU seconds, peak RSS,
scratch disk and the objects a night would download.

    python benchmarks/bench_launcher_scale.py [--objects 1000000 10000000] [--nights 3]

No objects exist: a stub listing (the gs:// walk replaced by a generator) yields fake
objects with names (1,000 class folders), sizes (40-160 KB), md5s and generations, as a
GCS listing would. Night 1 lists N objects, every one new. Each later night lists the
night before's objects with 1% new ones added, 0.5% deleted and 0.5% renamed (same bytes,
same md5, a new name and generation), chosen by a seeded hash of the object.

Each night runs `prepare.prepare` in a fresh process into a local root, as a Flex Template
launcher does before it submits the job: history, listing, fingerprint, identity, the
incremental or full plan, one listing file per shard. Measured per night: CPU seconds of
that process (user + system) and of each of those stages (`timed_stages`), its peak RSS,
the peak bytes of its scratch directory (TMPDIR, polled every 0.2 s: the launcher's disk
when the root is on gs://), the same with what it writes under the local root (the new
version's shard listings, which a gs:// root keeps in the bucket), and the objects it
would download (`Planned.to_convert`: images the job decodes, read from gs://; the rest
are stored records reused or re-framed).

Between nights, outside the measured process, a stand-in for the job publishes the
version the night planned: a catalog.parquet with one row per planned image (frames
numbered as a writer would, digests derived from the md5), its split map and manifest,
then LATEST. No shard bytes exist, so the next night's plan is what a real night plans.
Targets at 10M, every night: peak scratch <= 8 GiB, peak RSS <= 1 GiB, CPU <= 1.2x the
first night's.
"""

import argparse
import base64
import contextlib
import datetime
import hashlib
import io
import json
import os
import pickle
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from common import Record, add_record_argument  # noqa: E402

CLASSES = 1000
ADDED, DELETED, RENAMED = 0.01, 0.005, 0.005  # of N, per night after the first


def _fate(content, night):
    """A seeded draw per (object, night) in [0, 1000): < 5 deleted, 5..9 renamed."""
    x = ((content + 1) * 0x9E3779B1 + night * 0x85EBCA77) & 0xFFFFFFFF
    x ^= x >> 15
    return ((x * 0x2C1B3C6D) & 0xFFFFFFFF) % 1000


def objects(n, night):
    """Night `night`'s objects (1-based): (content, renamed at night or 0), content the
    object's bytes (its size and md5 follow from it)."""
    added = int(n * ADDED)
    for first, count, born in [(0, n, 1)] + [(n + (j - 2) * added, added, j)
                                              for j in range(2, night + 1)]:
        for content in range(first, first + count):
            renamed = 0
            for j in range(born + 1, night + 1):
                fate = _fate(content, j)
                if fate < DELETED * 1000:
                    break
                if fate < (DELETED + RENAMED) * 1000:
                    renamed = j
            else:
                yield content, renamed


def fake_listing(n, night=1):
    """What a gs:// walk yields for night `night` of N objects: (rel, uri, size, stamp, md5)."""
    def walk(root):
        base = root.rstrip("/")
        for content, renamed in objects(n, night):
            name = f"{content:09d}-r{renamed}" if renamed else f"{content:09d}"
            rel = f"class{content % CLASSES:04d}/{name}.jpg"
            md5 = base64.b64encode(hashlib.md5(content.to_bytes(8, "big")).digest()).decode()
            generation = renamed * 10**10 + content + 1
            yield rel, f"{base}/{rel}", 40_000 + (content * 7919) % 120_000, f"gen:{generation}", md5
    return walk


STAGES = (("history", "find"), ("listing", "list_inputs"), ("identity", "resolve_listing"),
          ("incremental", "incremental_plan"), ("plan", "full_plan"))


def timed_stages(prepare):
    """prepare's stages wrapped to add up their CPU seconds: {"history", "listing",
    "identity", "plan" (incremental or full), "write" (the shard listings, which the
    incremental plan streams into)}."""
    import importlib

    cpu = {}

    def wrap(owner, name, stage):
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.process_time()
            try:
                return inner(*args, **kwargs)
            finally:
                cpu[stage] = cpu.get(stage, 0) + time.process_time() - start

        setattr(owner, name, timed)

    for module, name in STAGES:
        wrap(importlib.import_module(f"beam_pipeline.launcher.{module}"), name,
             "plan" if module in ("incremental", "plan") else module)
    wrap(prepare, "write_shard_listings", "write")
    return cpu


def child(n, night, root, spec_path):
    from beam_pipeline.launcher import options, prepare, walk

    stages = timed_stages(prepare)
    walk._walk_gcs = fake_listing(n, night)
    _, build = options.parse(["--input", "gs://fake-bucket/images", "--output", root,
                              "--name", "scale"])
    start = time.perf_counter()
    planned = prepare.prepare(build, root)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with open(spec_path, "wb") as f:
        pickle.dump(planned.spec, f)
    print(json.dumps({"images": planned.images, "download": planned.to_convert,
                      "kind": "incremental" if planned.spec.increment else "full",
                      "wall": time.perf_counter() - start,
                      "cpu": usage.ru_utime + usage.ru_stime, "stages": stages,
                      "peak_rss": usage.ru_maxrss * 1024}))


def publish(spec_path):
    """The job's stand-in: the version `spec` planned, published with a catalog of every
    planned image and no shard bytes (see the module docstring)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from beam_pipeline.job import commit, reuse
    from beam_pipeline.job.contracts import Kind, ShardTask
    from beam_pipeline.job.manifest import Finalized, build_manifest
    from beam_pipeline.store import catalog, files, versions
    from dataset_format import layout

    with open(spec_path, "rb") as f:
        spec = pickle.load(f)
    label_ids = {label: i for i, label in enumerate(spec.labels)}
    names = list(catalog.SCHEMA.names)
    shards = {split: [] for split in spec.num_shards}
    label_counts = {split: {} for split in spec.num_shards}
    rows = 0
    with open(layout.join(spec.tmp_dir, layout.SHARD_INDEX)) as index, \
            pq.ParquetWriter(layout.join(spec.vdir, layout.CATALOG), catalog.SCHEMA) as out:
        tasks = sorted((ShardTask.from_json(line) for line in index),
                       key=lambda t: (t.split, t.shard))
        for task in tasks:
            name = layout.shard_name(spec.name, task.split, task.shard,
                                     spec.num_shards[task.split])
            columns = {c: [] for c in names}
            offset = 0
            if task.kind == Kind.IMAGES:  # ImageRef lists (refs.LINE_* positions)
                with open(task.listing) as listing:
                    values = [json.loads(line) for line in listing]
            else:  # kept images: their previous rows, read as the job reads them
                values = [r.to_dict() for r in reuse.read_task(task.listing,
                                                               spec.previous_vdir)[1]]
            for position, value in enumerate(values):
                if task.kind == Kind.IMAGES:
                    key, uri, label, split, size, stamp, sha, _, md5 = value
                    row = {"key": key, "uri": uri, "label": label,
                           "label_id": label_ids[label], "split": split, "sha256": sha,
                           "height": 1, "width": 1, "input_size": size,
                           "input_stamp": stamp, "input_md5": md5,
                           "input_sha256": sha or hashlib.sha256(md5.encode()).hexdigest()}
                    row["sha256"] = row["input_sha256"]
                else:  # a kept image's row, its input's values updated
                    row = value
                row.update(shard=task.shard, file=name, position=position, offset=offset,
                           length=row["input_size"] + 16)
                offset += row["length"]
                for c in names:
                    columns[c].append(row.get(c))
                counts = label_counts[task.split]
                counts[row["label"]] = counts.get(row["label"], 0) + 1
            out.write_table(pa.table(columns, schema=catalog.SCHEMA))
            shards[task.split].append({"path": name, "num_examples": len(columns["key"]),
                                       "num_bytes": offset, "crc32c": "AAAAAA==",
                                       "origin": task.origin})
            rows += len(columns["key"])
    map_entry = commit._write_split_map(spec, rows)
    files.write_bytes(layout.join(spec.vdir, layout.ERRORS), b"")
    done = Finalized(results=(), shards=shards, catalog_rows=rows, label_counts=label_counts,
                     error_reasons={}, split_map=map_entry)
    manifest = build_manifest(spec, done, datetime.datetime.now(datetime.timezone.utc))
    files.write_whole(layout.join(spec.vdir, layout.MANIFEST), manifest.to_json().encode())
    versions.publish(spec.root, spec.version)
    shutil.rmtree(spec.tmp_dir)


def du(path):
    total = 0
    for directory, _, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(directory, name)).st_blocks * 512
            except OSError:
                pass
    return total


def run(args, env):
    out = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True,
                         text=True, cwd=REPO)
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return out.stdout


def night(n, k, work):
    """Night k (1-based) of N objects in `work`: its figures."""
    scratch, root = os.path.join(work, "tmp"), os.path.join(work, "root")
    os.makedirs(scratch, exist_ok=True)
    spec_path = os.path.join(work, "spec.pickle")
    env = dict(os.environ, TMPDIR=scratch, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    before = du(root)  # the published versions: not this night's scratch
    peak, done = [0, 0], threading.Event()  # TMPDIR; TMPDIR + what the night wrote to root

    def poll():
        while not done.wait(0.2):
            tmp = du(scratch)
            peak[0] = max(peak[0], tmp)
            peak[1] = max(peak[1], tmp + du(root) - before)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        stdout = run(["--child", str(n), str(k), root, spec_path], env)
    finally:
        done.set()
        poller.join()
    figures = json.loads(stdout.strip().splitlines()[-1])
    figures["scratch_peak"], figures["disk_peak"] = peak
    figures["listings"] = du(root) - before
    start = time.perf_counter()
    run(["--publish", spec_path], env)
    figures["publish_wall"] = time.perf_counter() - start
    return figures


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--nights", type=int, default=3,
                        help="a first night, then K-1 nights of +1%% / -0.5%% / 0.5%% renamed")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--publish", help=argparse.SUPPRESS)
    add_record_argument(parser)
    args = parser.parse_args()
    if args.child:
        n, k, root, spec_path = args.child
        return child(int(n), int(k), root, spec_path)
    if args.publish:
        return publish(args.publish)
    record = Record("bench_launcher_scale", {"objects": args.objects, "nights": args.nights,
                                             "record": args.record})
    runs = []
    print(f"load {os.getloadavg()[0]:.1f}; stub gs:// listing, local root; nights after the "
          "first: +1% new, -0.5% deleted, 0.5% renamed")
    print("| listed objects | night | plan | CPU s | x night 1 | us/object | wall s | peak RSS "
          "| peak scratch (TMPDIR) | with the root's growth | shard listings | would download |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in args.objects:
        work = tempfile.mkdtemp(prefix="bench-launcher-scale-")
        try:
            first = None
            for k in range(1, args.nights + 1):
                f = night(n, k, work)
                first = first or f["cpu"]
                runs.append(dict(f, objects=n, night=k))
                print(f"| {n:,} | {k} | {f['kind']} | {f['cpu']:,.0f} | {f['cpu'] / first:.2f} "
                      f"| {f['cpu'] / f['images'] * 1e6:.0f} | {f['wall']:,.0f} | "
                      f"{f['peak_rss'] / 2**20:,.0f} MiB | {f['scratch_peak'] / 2**30:.2f} GiB | "
                      f"{f['disk_peak'] / 2**30:.2f} GiB | "
                      f"{f['listings'] / 2**30:.2f} GiB | {f['download']:,} |", flush=True)
                with contextlib.redirect_stdout(io.StringIO()):  # a long run keeps the
                    record.save({"runs": runs})                  # nights it finished
        finally:
            shutil.rmtree(work, ignore_errors=True)
    print("\nCPU s by stage (the rest of a night's CPU: imports, claiming the version)")
    print("| listed objects | night | history | listing | identity | plan | write |")
    print("|---|---|---|---|---|---|---|")
    for f in runs:
        cpu = f["stages"]
        print(f"| {f['objects']:,} | {f['night']} | " + " | ".join(
            f"{cpu.get(stage, 0):,.1f}" for stage in ("history", "listing", "identity", "plan",
                                                     "write")) + " |")
    print(f"load {os.getloadavg()[0]:.1f}")
    record.save({"runs": runs})


if __name__ == "__main__":
    main()
