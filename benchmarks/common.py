"""Shared by the benchmark scripts: a cached synthetic JPEG set and process-tree RSS."""

import io
import multiprocessing
import os
import random
import subprocess
import threading
import time

DATA = os.path.join(os.path.dirname(__file__), "_data")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


def build_command(src, out, *extra):
    """The default local command (configs/local.yaml: one worker process per core)."""
    import sys

    return [sys.executable, "-m", "beam_pipeline", "--config",
            os.path.join(REPO, "configs", "local.yaml"), "--input", src, "--output", out, *extra]


def _make(args):
    path, seed = args
    import numpy as np
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    # Smooth gradient + noise + a shape: ~500x375 at q90 gives ~40 KB, like photo thumbnails.
    w, h = 500, 375
    x = np.linspace(0, 1, w)[None, :, None]
    y = np.linspace(0, 1, h)[:, None, None]
    base = np.array([rng.random(), rng.random(), rng.random()])[None, None, :]
    arr = 255 * (0.5 * base + 0.3 * x * y + 0.2 * np.random.default_rng(seed).random((h, w, 3)))
    img = Image.fromarray(arr.clip(0, 255).astype("uint8"), "RGB")
    d = ImageDraw.Draw(img)
    r = rng.randrange(40, 150)
    cx, cy = rng.randrange(r, w - r), rng.randrange(r, h - r)
    d.ellipse((cx - r, cy - r, cx + r, cy + r), fill=tuple(rng.randrange(256) for _ in range(3)))
    out = io.BytesIO()
    img.save(out, "JPEG", quality=75)
    with open(path, "wb") as f:
        f.write(out.getvalue())


def cached_tree(name, n, make, classes=10, initializer=None):
    """DATA/NAME-N/<class>/<i>.jpg with make((path, i)) in a process pool, generated once
    (deterministic: file i is made from seed i) and reused."""
    root = os.path.join(DATA, f"{name}-{n}")
    done = os.path.join(root, ".complete")
    if os.path.exists(done):
        return root
    jobs = []
    for i in range(n):
        d = os.path.join(root, f"class{i % classes:02d}")
        os.makedirs(d, exist_ok=True)
        jobs.append((os.path.join(d, f"{i:06d}.jpg"), i))
    with multiprocessing.Pool(initializer=initializer) as pool:
        pool.map(make, jobs, chunksize=64)
    open(done, "w").close()
    return root


def jpeg_tree(n, classes=10):
    """DATA/jpegs-N: synthetic gradient + noise + shape JPEGs (launcher and incremental runs)."""
    return cached_tree("jpegs", n, _make, classes)
    jobs = []
    for i in range(n):
        d = os.path.join(root, f"class{i % classes:02d}")
        os.makedirs(d, exist_ok=True)
        jobs.append((os.path.join(d, f"{i:06d}.jpg"), i))
    with multiprocessing.Pool() as pool:
        pool.map(_make, jobs, chunksize=64)
    open(done, "w").close()
    return root


def files_of(root):
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
                  if f.endswith(".jpg"))


def run_measured(cmd, env=ENV):
    """Run cmd; return (seconds, peak RSS of its largest process, peak RSS of the tree), bytes."""
    import psutil

    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    peaks, tree_peak = {}, [0]
    stop = threading.Event()

    def poll():
        root = psutil.Process(proc.pid)
        while not stop.is_set():
            try:
                procs = [root] + root.children(recursive=True)
                total = 0
                for p in procs:
                    try:
                        rss = p.memory_info().rss
                    except psutil.Error:
                        continue
                    peaks[p.pid] = max(peaks.get(p.pid, 0), rss)
                    total += rss
                tree_peak[0] = max(tree_peak[0], total)
            except psutil.Error:
                pass
            stop.wait(0.1)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    out, _ = proc.communicate()
    seconds = time.monotonic() - start
    stop.set()
    t.join()
    if proc.returncode:
        raise RuntimeError(f"{cmd} failed:\n{out.decode()[-3000:]}")
    return seconds, max(peaks.values(), default=0), tree_peak[0], out.decode()
