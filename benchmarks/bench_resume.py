"""What a build after a killed one costs, against a full build of the same files.

    python benchmarks/bench_resume.py [--images 4000] [--shards 32] [--rounds 1] [--changes 0.01]

Each round, alternating: a full build into a fresh root (the baseline); then, for each
share (50%, 90%), a build SIGKILLed once that share of its shards is finished, and the
build after it (timed), which shares the finished shards where the killed run wrote them
and converts only the rest. Then the changed-inputs case: a build killed at 50%, then
`--changes` of the images deleted and as many new ones added (seeded), the build after it
(timed), and a full build of those same changed files (its baseline). Printed: wall
seconds, the ratio to the full build of the same files, images converted (and their share
of the images listed) and shards resumed (manifest "build"), the machine's load.
"""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import (ENV, Record, _make, add_record_argument,  # noqa: E402
                               build_command, files_of, jpeg_tree)
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


def change(tree, share, seed=0):
    """Delete `share` of the images under `tree` (hard links: the cached tree keeps them)
    and add as many new ones (seeded JPEGs like the tree's) -> how many of each."""
    images = files_of(tree)
    n = max(1, round(share * len(images)))
    for path in random.Random(seed).sample(images, n):
        os.remove(path)
    for i in range(n):
        _make((os.path.join(os.path.dirname(images[i]), f"new{i:06d}.jpg"), 10_000_000 + i))
    return n


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=4000)
    parser.add_argument("--shards", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--changes", type=float, default=0.01,
                        help="share of the images deleted, and added, after the kill at 50%%")
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
            rows.append(("full build", full, 1.0, manifest["build"]["converted"], 0,
                         manifest["accounting"]["listed"], ""))
            shutil.rmtree(root)
            for share in (0.5, 0.9):
                root = os.path.join(scratch, f"kill{r}-{share}")
                cmd = build_command(src, root, *extra)
                until, done = killed_at(cmd, root, share, args.shards)
                seconds, manifest = timed_build(cmd, root)
                rows.append((f"after a kill at {done}/{args.shards} shards", seconds,
                             seconds / full, manifest["build"]["converted"],
                             manifest["build"]["resumed_shards"],
                             manifest["accounting"]["listed"],
                             f"(killed after {until:.1f} s)"))
                shutil.rmtree(root)
            # The inputs change between the kill and the rebuild (a copy of the tree, hard
            # links: the kill and the rebuild list the same paths).
            tree = os.path.join(scratch, f"in{r}")
            shutil.copytree(src, tree, copy_function=os.link)
            root = os.path.join(scratch, f"kill{r}-changed")
            cmd = build_command(tree, root, *extra)
            until, done = killed_at(cmd, root, 0.5, args.shards)
            n = change(tree, args.changes, seed=r)
            seconds, manifest = timed_build(cmd, root)
            base_root = os.path.join(scratch, f"full{r}-changed")
            base, base_manifest = timed_build(build_command(tree, base_root, *extra), base_root)
            rows.append((f"full build, -{n} +{n} images", base, 1.0,
                         base_manifest["build"]["converted"], 0,
                         base_manifest["accounting"]["listed"], ""))
            rows.append((f"kill at {done}/{args.shards}, then -{n} +{n}", seconds,
                         seconds / base, manifest["build"]["converted"],
                         manifest["build"]["resumed_shards"],
                         manifest["accounting"]["listed"], f"(killed after {until:.1f} s)"))
            for path in (root, base_root, tree):
                shutil.rmtree(path)
    load = os.getloadavg()
    print(f"{args.images} images, {args.shards} shards, local FnApiRunner "
          f"(configs/local.yaml); load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    print(f"{'run':<32} {'wall s':>7} {'x full':>7} {'converted':>10} {'share':>6} "
          f"{'resumed':>8}")
    for name, seconds, ratio, converted, resumed, listed, note in rows:
        print(f"{name:<32} {seconds:7.1f} {ratio:7.2f} {converted:10d} "
              f"{converted / listed:6.1%} {resumed:8d} {note}")
    record.save({"runs": [dict(zip(("run", "seconds", "vs_full", "converted", "resumed_shards",
                                    "listed", "note"), row)) for row in rows]})


if __name__ == "__main__":
    main()
