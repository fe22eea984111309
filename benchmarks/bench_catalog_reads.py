"""What the reuse and copy tasks of one worker process download of the previous catalog:
requests and bytes of `catalog.read_numbered` on a gs:// catalog.parquet, counted by the
proxy in front of the storage emulator (tests/gcs_counting.py).

    python benchmarks/bench_catalog_reads.py [--shards 50,100] [--rows 1000] [--tasks 8]
                                             [--code DIR]...

A seeded synthetic catalog (tests/helpers.catalog_bytes: the build's columns, one row group
of `--rows` rows per shard, as commit writes it) is uploaded once per size; then, for each checkout named by --code
(default: this one), a fresh process reads the rows of `--tasks` shards one task at a
time, as a worker's reuse tasks do, and checks what it got. The emulator is one Python
process on loopback: compare requests and bytes, not seconds.
"""

import argparse
import os
import random
import subprocess
import sys
import tempfile
from urllib.parse import unquote

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)
from common import Record, add_record_argument  # noqa: E402


def tasks_of(shards, tasks):
    return random.Random(3).sample(range(shards), tasks)


def read_as_tasks(path, shards, rows, tasks):
    """The child: each task's rows read by number, as job/reuse.read_task reads them."""
    from beam_pipeline.store import catalog

    for s in tasks_of(shards, tasks):
        got = catalog.read_numbered(path, range(s * rows, (s + 1) * rows))
        assert len(got) == rows and {r.shard for r in got} == {s}, s
        assert [r.position for r in got] == list(range(rows))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", default="50,100", help="catalog sizes, in shards")
    parser.add_argument("--rows", type=int, default=1000, help="rows per shard")
    parser.add_argument("--tasks", type=int, default=8, help="tasks in the one process")
    parser.add_argument("--code", action="append", help="checkouts to compare (default: this)")
    parser.add_argument("--read", help=argparse.SUPPRESS)  # the child's catalog path
    add_record_argument(parser)
    args = parser.parse_args()
    if args.read:  # the checkout's own code (its cwd) before this one's
        sys.path.insert(0, os.getcwd())
        return read_as_tasks(args.read, int(args.shards), args.rows, args.tasks)
    record = Record("bench_catalog_reads", args)
    from tests.gcs_counting import counting
    from tests.gcs_emulator import run_emulator
    from tests.helpers import catalog_bytes

    codes = [os.path.abspath(c) for c in args.code or [REPO]]
    runs = []
    with tempfile.TemporaryDirectory() as work, run_emulator(work) as emulator, \
            counting(emulator) as counter:
        bucket = emulator.create_bucket()
        for shards in (int(n) for n in args.shards.split(",")):
            data, _ = catalog_bytes(shards, args.rows, seed=7)
            path = emulator.upload_bytes(f"gs://{bucket}/ds/{shards}/catalog.parquet", data)
            for code in codes:
                counter.reset()
                subprocess.run([sys.executable, os.path.abspath(__file__), "--read", path,
                                "--shards", str(shards), "--rows", str(args.rows),
                                "--tasks", str(args.tasks)], cwd=code, check=True,
                               env=dict(os.environ, PYTHONPATH=code))
                hits = [down for _, _, target, down in counter.log
                        if f"/ds/{shards}/catalog.parquet" in unquote(target)]
                runs.append(dict(code=os.path.basename(code), shards=shards,
                                 catalog_bytes=len(data), tasks=args.tasks,
                                 requests=len(hits), bytes_down=sum(hits),
                                 mib_per_task=sum(hits) / args.tasks / 2**20))
    print(f"{args.tasks} tasks in one process, {args.rows} rows a shard; load "
          f"{os.getloadavg()[0]:.1f}")
    print("| checkout | catalog | requests | MiB downloaded | MiB a task |")
    print("|---|---|---|---|---|")
    for r in runs:
        print(f"| {r['code']} | {r['shards']} shards, {r['catalog_bytes'] / 2**20:.1f} MiB | "
              f"{r['requests']} | {r['bytes_down'] / 2**20:.2f} | {r['mib_per_task']:.3f} |")
    record.save({"runs": runs})


if __name__ == "__main__":
    main()
