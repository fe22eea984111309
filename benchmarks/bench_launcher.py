"""Launcher memory at scale: peak RSS and time of a default build of N tiny JPEGs.

    .venv/bin/python benchmarks/bench_launcher.py [--sizes 50000,400000] [--also 1000000]

Tiny images (100 classes, distinct 16x16 JPEGs of ~0.7 KB) make the listing and planning
dominate: the default command (no --config: the
in-process FnApiRunner) runs listing, fingerprint, plan, the job and commit in one process,
so its peak RSS is what a Flex Template launcher VM must hold. Target: peak RSS at
400,000 inputs <= 1.10x that at 50,000 (the old launcher held ~0.9 KB per listed image).
"""

import argparse
import io
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from common import DATA, Record, add_record_argument, run_measured  # noqa: E402

PY = sys.executable
CLASSES = 100


def tiny_tree(n):
    """DATA/tiny-N/classNN/IIIIIII.jpg: N distinct 16x16 JPEGs (~0.7 KB each).

    One encoded image with a COM segment carrying the file's number, so every file has
    its own bytes (no content duplicates) and generating a million costs seconds.
    """
    from PIL import Image

    root = os.path.join(DATA, f"tiny-{n}")
    if os.path.exists(os.path.join(root, ".complete")):
        return root
    out = io.BytesIO()
    Image.new("RGB", (16, 16), (30, 200, 128)).save(out, "JPEG", quality=90)
    jpeg = out.getvalue()
    for c in range(CLASSES):
        os.makedirs(os.path.join(root, f"class{c:02d}"), exist_ok=True)
    for i in range(n):
        comment = f"{i:08d}".encode()
        data = jpeg[:2] + b"\xff\xfe" + (len(comment) + 2).to_bytes(2, "big") + comment + jpeg[2:]
        with open(os.path.join(root, f"class{i % CLASSES:02d}", f"{i:07d}.jpg"), "wb") as f:
            f.write(data)
    open(os.path.join(root, ".complete"), "w").close()
    return root


def measure(n):
    src = tiny_tree(n)
    tmp = tempfile.mkdtemp(prefix="bench-launcher-")
    try:
        cmd = [PY, "-m", "beam_pipeline", "--input", src, "--output", os.path.join(tmp, "out"),
               "--force"]
        seconds, proc_rss, tree_rss, _ = run_measured(cmd)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return seconds, proc_rss


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="50000,400000", help="the two sizes compared")
    ap.add_argument("--also", default="", help="more sizes to report, e.g. 1000000")
    add_record_argument(ap)
    args = ap.parse_args()
    record = Record("bench_launcher", args)
    sizes = [int(s) for s in args.sizes.split(",")]
    extra = [int(s) for s in args.also.split(",") if s]
    rows = []
    for n in sizes + extra:
        seconds, rss = measure(n)
        rows.append((n, seconds, rss))
        print(f"{n:>10,} inputs: {seconds:7.1f} s, peak RSS {rss / 2**20:6.0f} MB "
              f"({n / seconds:,.0f} inputs/s)", flush=True)
    figures = {"runs": [{"inputs": n, "seconds": s, "peak_rss_mb": rss / 2**20}
                        for n, s, rss in rows]}
    if len(rows) >= 2:
        (n0, _, r0), (n1, _, r1) = rows[0], rows[1]
        figures["peak_rss_ratio"] = ratio = r1 / r0
        print(f"\npeak RSS {n1:,} vs {n0:,} inputs: {ratio:.2f}x "
              f"(target <= 1.10x: {'PASS' if ratio <= 1.10 else 'FAIL'})")
    record.save(figures)


if __name__ == "__main__":
    main()
