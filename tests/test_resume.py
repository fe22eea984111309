"""A build after a killed one reuses every shard the killed one finished.

The kill is real: the CLI runs in its own process group and gets SIGKILL once a given share
of its shards sit under their final names. The rebuild must take exactly those shards
(verified by size and crc32c against their catalog fragments), convert only the rest, and
publish what a full build of the same files publishes.
"""

import io
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from PIL import Image

from beam_pipeline.store import versions
from dataset_format import layout
from tests.helpers import REPO, build, check_invariants

pytestmark = pytest.mark.slow

SHARDS = 16
ARGS = ["--name", "res", "--num_shards", str(SHARDS), "--splits", "train=1.0",
        "--no_transform", "--direct_num_workers", "1"]


def photo(seed, size=(800, 600)):
    """A seeded noise JPEG: slow enough to decode (~10 ms) that a kill lands mid-build."""
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, "JPEG", quality=90)
    return buf.getvalue()


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    src = tmp_path_factory.mktemp("resume") / "in"
    for i in range(SHARDS * 4):
        folder = src / ("cat" if i % 2 else "dog")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:03d}.jpg").write_bytes(photo(i))
    return src


def finished_shards(vdir):
    """Shards under their final names with their index beside them (placed last: a shard
    killed between the two is converted again)."""
    try:
        names = set(os.listdir(vdir))
    except FileNotFoundError:
        return []
    return [n for n in names if ".tfrecord-" in n and layout.index_name(n) in names]


def build_killed_at(src, root, share, *extra):
    """Start a build and SIGKILL it once `share` of its shards are finished -> the
    killed version's directory and its finished shard names."""
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.Popen([sys.executable, "-m", "beam_pipeline", "--input", str(src),
                             "--output", str(root), *ARGS, *extra], env=env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            vdirs = [layout.version_dir(str(root), v) for v, done
                     in sorted(versions.list_versions(str(root)).items(), reverse=True)
                     if not done] if os.path.isdir(root / layout.VERSIONS) else []
            if vdirs and len(finished_shards(vdirs[0])) >= share * SHARDS:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return vdirs[0], finished_shards(vdirs[0])
            time.sleep(0.005)
        raise AssertionError("the build did not get that far")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def published_shards(result):
    return {split: [(s["path"], s["num_examples"], s["num_bytes"], s["crc32c"])
                    for s in info["shards"]]
            for split, info in result["manifest"]["splits"].items()}


@pytest.fixture(scope="module")
def full(photos, tmp_path_factory):
    return build(photos, tmp_path_factory.mktemp("full") / "ds", *ARGS)


@pytest.mark.parametrize("share,published", [(0.5, False), (0.9, True)])
def test_a_rebuild_after_a_kill_converts_only_the_unfinished_shards(photos, full, tmp_path,
                                                                     share, published):
    """At 50% on a new root; at 90% on a root with a published version, rebuilt with
    --force --full_rebuild (the killed night's leftovers are kept for the resume, not
    deleted as a killed run's would be when nothing takes them)."""
    root, extra = tmp_path / "ds", ()
    if published:
        shutil.copytree(os.path.dirname(os.path.dirname(full["version_dir"])), root)
        extra = ("--force", "--full_rebuild")
    latest = (root / layout.LATEST).read_bytes() if published else None
    killed, done = build_killed_at(photos, root, share, *extra)
    assert share * SHARDS <= len(done) < SHARDS, done  # killed mid-build, as asked
    assert (root / layout.LATEST).read_bytes() == latest if published else not (
        root / layout.LATEST).exists()
    again = build(photos, root, *ARGS, *extra)
    assert again["manifest"]["build"]["resumed_shards"] == len(done)
    resumed_images = sum(s["num_examples"] for s in full["manifest"]["splits"]["train"]["shards"]
                         if s["path"] in done)
    assert again["manifest"]["build"]["converted"] == SHARDS * 4 - resumed_images
    check_invariants(again)  # sizes and crc32c of every shard against the files
    assert published_shards(again) == published_shards(full)  # what a full build publishes
    assert again["manifest"]["accounting"] == full["manifest"]["accounting"]
    assert os.path.basename(killed) not in versions.list_versions(str(root))  # pruned
