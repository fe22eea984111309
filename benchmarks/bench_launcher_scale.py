"""The launcher at 1M and 10M listed gs:// objects: CPU seconds, peak RSS and scratch disk.

    python benchmarks/bench_launcher_scale.py [--objects 1000000 10000000]

No objects exist: a stub listing (the gs:// walk replaced by a generator) yields N fake
objects with names (1,000 class folders), sizes (40-160 KB), md5s and generations, as a
GCS listing would. Each size runs in a fresh process `prepare.prepare` of a first night
(every image new: listing, fingerprint, the key and shard-hash spills, one listing file per
shard) into a local root, as a Flex Template launcher does before it submits the job.
Measured: CPU seconds of the process (user + system), its peak RSS, and the peak bytes of
its scratch directory (TMPDIR, polled every 0.2 s) plus the shard listings it writes.
"""

import argparse
import base64
import hashlib
import json
import os
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


def fake_listing(n):
    """What a gs:// walk yields for N objects: (rel, uri, size, stamp, md5)."""
    def walk(root):
        base = root.rstrip("/")
        for i in range(n):
            rel = f"class{i % 1000:04d}/{i:09d}.jpg"
            md5 = base64.b64encode(hashlib.md5(i.to_bytes(8, "big")).digest()).decode()
            yield rel, f"{base}/{rel}", 40_000 + (i * 7919) % 120_000, f"gen:{i + 1}", md5
    return walk


def child(n, root):
    from beam_pipeline.launcher import options, prepare, walk

    walk._walk_gcs = fake_listing(n)
    _, build = options.parse(["--input", "gs://fake-bucket/images", "--output", root,
                              "--name", "scale"])
    start = time.perf_counter()
    planned = prepare.prepare(build, root)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"images": planned.images, "wall": time.perf_counter() - start,
                      "cpu": usage.ru_utime + usage.ru_stime,
                      "peak_rss": usage.ru_maxrss * 1024}))


def du(path):
    total = 0
    for directory, _, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(directory, name)).st_blocks * 512
            except OSError:
                pass
    return total


def measure(n):
    work = tempfile.mkdtemp(prefix="bench-launcher-scale-")
    scratch, root = os.path.join(work, "tmp"), os.path.join(work, "root")
    os.makedirs(scratch)
    env = dict(os.environ, TMPDIR=scratch, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    peak, done = [0], threading.Event()

    def poll():
        while not done.wait(0.2):
            peak[0] = max(peak[0], du(scratch) + du(root))

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        out = subprocess.run([sys.executable, __file__, "--child", str(n), root], env=env,
                             capture_output=True, text=True, cwd=REPO)
        done.set()
        poller.join()
        if out.returncode:
            raise SystemExit(out.stderr[-3000:])
        figures = json.loads(out.stdout.strip().splitlines()[-1])
        figures["scratch_peak"] = peak[0]
        figures["listings"] = du(root)
        return figures
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    add_record_argument(parser)
    args = parser.parse_args()
    if args.child:
        return child(int(args.child[0]), args.child[1])
    record = Record("bench_launcher_scale", {"objects": args.objects, "record": args.record})
    runs = []
    print(f"load {os.getloadavg()[0]:.1f}; stub gs:// listing, first night, local root")
    print("| listed objects | CPU s | us/object | wall s | peak RSS | peak scratch disk | "
          "shard listings |")
    print("|---|---|---|---|---|---|---|")
    for n in args.objects:
        f = measure(n)
        runs.append(dict(f, objects=n))
        print(f"| {n:,} | {f['cpu']:,.0f} | {f['cpu'] / n * 1e6:.0f} | {f['wall']:,.0f} | "
              f"{f['peak_rss'] / 2**20:,.0f} MiB | {f['scratch_peak'] / 2**30:.2f} GiB | "
              f"{f['listings'] / 2**30:.2f} GiB |", flush=True)
    print(f"load {os.getloadavg()[0]:.1f}")
    print(f"record: {record.save({'runs': runs})}")


if __name__ == "__main__":
    main()
