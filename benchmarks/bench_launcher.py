"""Launcher memory at scale: peak RSS and time of a default build of N tiny JPEGs (issue 11).

    .venv/bin/python benchmarks/bench_launcher.py [--sizes 50000,400000] [--also 1000000]

Tiny images (100 classes, hard links of a few 16x16 JPEGs, so a million inputs cost no
disk) make the listing and planning dominate: the default command (no --config: the
in-process FnApiRunner) runs listing, fingerprint, plan, the job and commit in one process,
so its peak RSS is what a Flex Template launcher VM must hold. Target: peak RSS at
400,000 inputs <= 1.15x that at 50,000 (the old launcher held ~0.9 KB per listed image).
"""

import argparse
import io
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from common import DATA, run_measured  # noqa: E402

PY = sys.executable
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
CLASSES = 100


def tiny_tree(n):
    """DATA/tiny-N/classNN/IIIIIII.jpg: hard links to a few distinct 16x16 JPEGs (one per
    50,000 files: ext4 allows 65,000 links to a file)."""
    from PIL import Image

    root = os.path.join(DATA, f"tiny-{n}")
    if os.path.exists(os.path.join(root, ".complete")):
        return root
    seeds = os.path.join(DATA, "tiny-seeds")
    os.makedirs(seeds, exist_ok=True)
    sources = []
    for i in range(max(8, n // 50_000 + 1)):
        path = os.path.join(seeds, f"{n}-{i}.jpg")
        out = io.BytesIO()
        Image.new("RGB", (16, 16), (i % 256, 255 - i % 256, 128)).save(out, "JPEG", quality=90)
        open(path, "wb").write(out.getvalue())
        sources.append(path)
    for c in range(CLASSES):
        os.makedirs(os.path.join(root, f"class{c:02d}"), exist_ok=True)
    for i in range(n):
        dst = os.path.join(root, f"class{i % CLASSES:02d}", f"{i:07d}.jpg")
        if not os.path.exists(dst):
            os.link(sources[i % len(sources)], dst)
    open(os.path.join(root, ".complete"), "w").close()
    return root


def measure(n):
    src = tiny_tree(n)
    tmp = tempfile.mkdtemp(prefix="bench-launcher-")
    try:
        cmd = [PY, "-m", "beam_pipeline", "--input", src, "--output", os.path.join(tmp, "out"),
               "--force"]
        seconds, proc_rss, tree_rss, _ = run_measured(cmd, env=ENV)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return seconds, proc_rss


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="50000,400000", help="the two sizes compared")
    ap.add_argument("--also", default="", help="more sizes to report, e.g. 1000000")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    extra = [int(s) for s in args.also.split(",") if s]
    rows = []
    for n in sizes + extra:
        seconds, rss = measure(n)
        rows.append((n, seconds, rss))
        print(f"{n:>10,} inputs: {seconds:7.1f} s, peak RSS {rss / 2**20:6.0f} MB "
              f"({n / seconds:,.0f} inputs/s)", flush=True)
    if len(rows) < 2:
        return
    (n0, _, r0), (n1, _, r1) = rows[0], rows[1]
    ratio = r1 / r0
    print(f"\npeak RSS {n1:,} vs {n0:,} inputs: {ratio:.2f}x "
          f"(target <= 1.15x: {'PASS' if ratio <= 1.15 else 'FAIL'}); "
          f"before this change: 570 vs 261 MB = 2.18x")


if __name__ == "__main__":
    main()
