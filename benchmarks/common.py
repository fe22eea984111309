"""Shared by the benchmark scripts: a cached synthetic JPEG set, process-tree RSS, and the JSON
record every benchmark writes (`Record`)."""

import contextlib
import io
import multiprocessing
import os
import random
import subprocess
import sys
import threading
import time

DATA = os.path.join(os.path.dirname(__file__), "_data")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


def build_command(src, out, *extra):
    """The default local command (configs/local.yaml: one worker process per core)."""
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


# --- the JSON record every benchmark writes ----------------------------------------------------

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_results")


def add_record_argument(parser):
    """--record PATH: where this run's JSON record goes (default under benchmarks/_results/)."""
    parser.add_argument("--record", metavar="PATH",
                        help="write this run's JSON record here (default: "
                             "benchmarks/_results/NAME-UTCTIME.json; '-': no record)")


def machine():
    """Cores, RAM and CPU model: what a figure from another machine needs beside it."""
    import platform

    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), model)
    except OSError:
        pass
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"cores": os.cpu_count(), "ram_gib": round(ram / 2**30, 1), "cpu": model,
            "platform": platform.platform(), "python": platform.python_version()}


def commit(repo=REPO):
    """The checkout's commit, and whether its tree had uncommitted changes."""
    def git(*args):
        out = subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(status) if status is not None
            else None}


class Record:
    """One benchmark run: `Record(name, args)` when it starts (commit, machine, load before),
    `.save(figures)` when it ends (load after, the figures), as one JSON file."""

    def __init__(self, name, arguments):
        import datetime

        self.name = name
        self.arguments = dict(vars(arguments) if hasattr(arguments, "__dict__")
                              else arguments)
        self.path = self.arguments.pop("record", None)
        now = datetime.datetime.now(datetime.timezone.utc)
        self.started = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        self._stamp = now.strftime("%Y%m%dT%H%M%SZ")
        self.load_before = [round(v, 2) for v in os.getloadavg()]
        self.clock = time.monotonic()

    def save(self, figures):
        """Write the record; returns its path (None with --record -)."""
        import json

        if self.path == "-":
            return None
        path = self.path or os.path.join(RESULTS, f"{self.name}-{self._stamp}.json")
        record = {"benchmark": self.name, **commit(), "machine": machine(),
                  "arguments": self.arguments, "started": self.started,
                  "seconds": round(time.monotonic() - self.clock, 1),
                  "load_before": self.load_before,
                  "load_after": [round(v, 2) for v in os.getloadavg()],
                  "figures": figures}
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(record, f, indent=1, default=_plain)
            f.write("\n")
        print(f"record: {path}")
        return path


@contextlib.contextmanager
def printed():
    """The lines printed inside the block (still printed), for a benchmark whose figures are
    its printed tables."""
    lines, real = [], sys.stdout

    class Tee(io.TextIOBase):
        def write(self, text):
            real.write(text)
            lines.append(text)
            return len(text)

        def flush(self):
            real.flush()

    sys.stdout = Tee()
    try:
        yield lines
    finally:
        sys.stdout = real
        lines[:] = "".join(lines).splitlines()


def _plain(value):
    """numpy scalars and arrays, tuples as keys' values, paths: as JSON takes them."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
