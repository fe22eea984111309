"""Regeneration cost: an incremental version after +1% / -1% of the images, and after the
tree moved, vs a full build.

    .venv/bin/python benchmarks/bench_incremental.py [--n 10000] [--repeat 1]

The default command (configs/local.yaml, one worker per core) with --reencode always on
N synthetic photos (benchmarks/common.py), then: 1% new images added (incremental), 1%
deleted (incremental), the tree copied elsewhere with cp -a semantics (new inodes and
ctimes, same bytes and mtimes: hashed, every record kept), and that tree built as one of
two inputs (every key changes: every record re-framed). Prints wall times beside the full
build's, the share of shard bytes reused and the images decoded. Targets: +1% <= 0.30x a
full build with >= 90% of the bytes reused; -1% <= 0.5x; a moved tree decodes nothing.
Medians over --repeat; read the ratios (shared machine).
"""

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from common import (Record, _make, add_record_argument, build_command, files_of,  # noqa: E402
                    jpeg_tree, run_measured)



def command(src, root, *extra):
    return build_command(src, root, "--reencode", "always", *extra)


def link_tree(files, base, dst):
    for path in files:
        target = os.path.join(dst, os.path.relpath(path, base))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.link(path, target)


def latest_manifest(root):
    with open(os.path.join(root, "LATEST")) as f:
        with open(os.path.join(root, json.load(f)["manifest"])) as m:
            return json.load(m)


def one_round(n, base, extra):
    tmp = tempfile.mkdtemp(prefix="bench-incremental-")
    try:
        src, root = os.path.join(tmp, "src"), os.path.join(tmp, "root")
        link_tree(files_of(base), base, src)
        full = run_measured(command(src, root))[0]
        # +1%: new files, in the same class folders
        link_tree(extra, os.path.dirname(os.path.dirname(extra[0])), src)
        add = run_measured(command(src, root))[0]
        added = latest_manifest(root)["incremental"]
        # -1%: delete as many, spread over the dataset
        victims = random.Random(0).sample(files_of(src), len(extra))
        for path in victims:
            os.remove(path)
        delete = run_measured(command(src, root))[0]
        deleted = latest_manifest(root)["incremental"]
        # moved: cp -a to another folder (same bytes and mtimes, new ctimes), old one gone
        moved_src = os.path.join(tmp, "moved", "photos")
        shutil.copytree(src, moved_src, copy_function=shutil.copy2)
        shutil.rmtree(src)
        move = run_measured(command(moved_src, root))[0]
        moved = latest_manifest(root)
        # keys change: the same tree as one of two inputs (keys gain "photos/")
        other = os.path.join(tmp, "other", "cls")
        os.makedirs(other)
        _make((os.path.join(other, "one.jpg"), 10**9))  # new content (its own seed)
        rekey = run_measured(command(moved_src, root, "--input", os.path.dirname(other)))[0]
        rekeyed = latest_manifest(root)
        return full, add, added, delete, deleted, move, moved, rekey, rekeyed
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--repeat", type=int, default=1)
    add_record_argument(ap)
    args = ap.parse_args()
    record = Record("bench_incremental", args)
    step = max(1, args.n // 100)
    base = jpeg_tree(args.n)
    bigger = jpeg_tree(args.n + step)  # the same first N files plus `step` more
    extra = [p for p in files_of(bigger) if int(os.path.basename(p)[:-4]) >= args.n]
    print(f"data: {args.n} JPEGs (500x375), --reencode always; +{len(extra)} / -{len(extra)}; "
          f"{os.cpu_count()} cores; median of {args.repeat}")
    rounds = [one_round(args.n, base, extra) for _ in range(args.repeat)]
    full = statistics.median(r[0] for r in rounds)
    add = statistics.median(r[1] for r in rounds)
    delete = statistics.median(r[3] for r in rounds)
    added, deleted = rounds[-1][2], rounds[-1][4]
    print(f"\n{'run':28}{'seconds':>9}{'vs full':>9}{'bytes reused':>14}  target")
    print(f"{'full build':28}{full:9.1f}")
    print(f"{'+1% (incremental)':28}{add:9.1f}{add / full:8.2f}x"
          f"{added['bytes_reused_share']:13.0%}  <= 0.30x, >= 90% reused: "
          f"{'PASS' if add / full <= 0.30 and added['bytes_reused_share'] >= 0.9 else 'FAIL'}")
    print(f"{'-1% (incremental)':28}{delete:9.1f}{delete / full:8.2f}x"
          f"{deleted['bytes_reused_share']:13.0%}  <= 0.5x: "
          f"{'PASS' if delete / full <= 0.5 else 'FAIL'}")
    move = statistics.median(r[5] for r in rounds)
    rekey = statistics.median(r[7] for r in rounds)
    moved, rekeyed = rounds[-1][6], rounds[-1][8]
    print(f"{'moved tree (cp -a)':28}{move:9.1f}{move / full:8.2f}x"
          f"{moved['incremental']['bytes_reused_share']:13.0%}  decoded "
          f"{moved['build']['converted']}: {'PASS' if moved['build']['converted'] == 0 else 'FAIL'}")
    print(f"{'moved, every key new':28}{rekey:9.1f}{rekey / full:8.2f}x{'-':>13}  decoded "
          f"{rekeyed['build']['converted']} (the 1 new image), re-framed "
          f"{rekeyed['build']['reframed']}: "
          f"{'PASS' if rekeyed['build']['converted'] <= 1 else 'FAIL'}")
    print(f"\n+1%: {json.dumps({k: added[k] for k in ('reused', 'rewritten', 'added_shards')})}")
    print(f"-1%: {json.dumps({k: deleted[k] for k in ('reused', 'rewritten', 'added_shards')})}")
    record.save({
        "full_s": full,
        "added": {"seconds": add, "vs_full": add / full, "incremental": added},
        "deleted": {"seconds": delete, "vs_full": delete / full, "incremental": deleted},
        "moved": {"seconds": move, "vs_full": move / full, "incremental": moved["incremental"],
                  "build": moved["build"]},
        "moved_new_keys": {"seconds": rekey, "vs_full": rekey / full,
                           "build": rekeyed["build"]}})


if __name__ == "__main__":
    main()
