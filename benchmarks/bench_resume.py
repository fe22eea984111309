"""What a build after a killed one costs, against a full build of the same files.

    python benchmarks/bench_resume.py [--images 4000] [--shards 32] [--rounds 1]

Each round, alternating: a full build into a fresh root (the baseline); then, for each
share (50%, 90%), a build SIGKILLed once that share of its shards is finished, and the
build after it (timed), which copies the finished shards (hard links here) and converts
only the rest. Printed: wall seconds, the ratio to the full build of that round, images
converted and shards resumed (manifest "build"), the machine's load.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import (ENV, Record, add_record_argument, build_command,  # noqa: E402
                               jpeg_tree)
from dataset_format import layout  # noqa: E402


def finished(vdir):
    """Shards with their index beside them: what a resume takes."""
    try:
        names = set(os.listdir(vdir))
    except FileNotFoundError:
        return 0
    return sum(1 for n in names if ".tfrecord-" in n and layout.index_name(n) in names)


def killed_at(cmd, root, share, shards):
    """Run `cmd`; SIGKILL its process group once `share` of the shards are finished.
    -> (seconds until the kill, shards finished then)."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    versions_dir = os.path.join(root, layout.VERSIONS)
    try:
        while proc.poll() is None:
            vdirs = sorted(os.listdir(versions_dir)) if os.path.isdir(versions_dir) else []
            done = finished(os.path.join(versions_dir, vdirs[-1])) if vdirs else 0
            if done >= share * shards:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return time.monotonic() - start, done
            time.sleep(0.01)
        raise RuntimeError(f"the build ended before {share:.0%}: "
                           f"{proc.stderr.read().decode()[-2000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def timed_build(cmd, root):
    start = time.monotonic()
    subprocess.run(cmd, env=ENV, check=True, stdout=subprocess.DEVNULL)
    seconds = time.monotonic() - start
    with open(os.path.join(root, layout.LATEST)) as f:
        manifest_path = os.path.join(root, json.load(f)["manifest"])
    with open(manifest_path) as f:
        return seconds, json.load(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=4000)
    parser.add_argument("--shards", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=1)
    add_record_argument(parser)
    args = parser.parse_args()
    record = Record("bench_resume", args)
    src = jpeg_tree(args.images)
    extra = ["--name", "bench", "--num_shards", str(args.shards), "--splits", "train=1.0",
             "--no_transform"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as scratch:
        for r in range(args.rounds):
            root = os.path.join(scratch, f"full{r}")
            full, manifest = timed_build(build_command(src, root, *extra), root)
            rows.append(("full build", full, 1.0, manifest["build"]["converted"], 0, ""))
            shutil.rmtree(root)
            for share in (0.5, 0.9):
                root = os.path.join(scratch, f"kill{r}-{share}")
                cmd = build_command(src, root, *extra)
                until, done = killed_at(cmd, root, share, args.shards)
                seconds, manifest = timed_build(cmd, root)
                rows.append((f"after a kill at {done}/{args.shards} shards", seconds,
                             seconds / full, manifest["build"]["converted"],
                             manifest["build"]["resumed_shards"],
                             f"(killed after {until:.1f} s)"))
                shutil.rmtree(root)
    load = os.getloadavg()
    print(f"{args.images} images, {args.shards} shards, local FnApiRunner "
          f"(configs/local.yaml); load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    print(f"{'run':<32} {'wall s':>7} {'x full':>7} {'converted':>10} {'resumed':>8}")
    for name, seconds, ratio, converted, resumed, note in rows:
        print(f"{name:<32} {seconds:7.1f} {ratio:7.2f} {converted:10d} {resumed:8d} {note}")
    record.save({"runs": [dict(zip(("run", "seconds", "vs_full", "converted", "resumed_shards",
                                    "note"), row)) for row in rows]})


if __name__ == "__main__":
    main()
