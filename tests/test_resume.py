"""A build after a killed one reuses every shard the killed one finished, also when the
inputs changed in between.

The kill is real: the CLI runs in its own process group and gets SIGKILL once a given share
of its shards sit under their final names. The rebuild must take exactly those shards whose
own listing is unchanged (verified by size and crc32c against their catalog fragments),
share them where the killed run wrote them (the manifest names ../VERSION/NAME: nothing
copied), convert only the rest, and store what a full build of the same files stores:
the same shards when nothing changed; the same examples when images were added or deleted
(docs/guarantees.md).
"""

import io
import os
import re
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
from tests.helpers import REPO, build, check_invariants, examples

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
    """{split: [(file name, examples, bytes, crc32c)]}: a shared shard by its own name."""
    return {split: [(os.path.basename(s["path"]), s["num_examples"], s["num_bytes"],
                     s["crc32c"]) for s in info["shards"]]
            for split, info in result["manifest"]["splits"].items()}


def shared_from(result, killed):
    """The shard names the version shares from the killed run's directory."""
    prefix = f"../{os.path.basename(killed)}/"
    return sorted(s["path"][len(prefix):] for info in result["manifest"]["splits"].values()
                  for s in info["shards"] if s["path"].startswith(prefix))


def retired(killed):
    """What is left of the killed run's directory once a later version was published: the
    shards that version shares, and their indexes."""
    return sorted(os.listdir(killed)) if os.path.isdir(killed) else []


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
    # What a full build publishes, shard for shard in the same slots; the finished ones
    # shared where the killed run wrote them, not copied.
    assert published_shards(again) == published_shards(full)
    assert shared_from(again, killed) == sorted(done)
    assert not set(done) & set(os.listdir(again["version_dir"]))
    assert again["manifest"]["accounting"] == full["manifest"]["accounting"]
    assert versions.list_versions(str(root))[os.path.basename(killed)] is False  # retired:
    assert retired(killed) == sorted(done + [layout.index_name(n) for n in done])  # shared only


def test_a_rebuild_after_a_kill_and_changed_inputs_takes_every_unchanged_shard(
        photos, tmp_path):
    """Killed at half its shards; then one image added and one deleted (1% of 64, the
    deleted one from a finished shard). The rebuild takes every finished shard in its slot:
    shared where the killed run wrote it when its own listing is unchanged, its other
    records copied (not converted) for the one that lost an image; the new image goes
    where its hash puts it (a new shard after the cut when that slot was taken). It
    converts at most 60% of the images and stores exactly the examples of a full build of
    the same files."""
    src = tmp_path / "in"
    shutil.copytree(photos, src)
    root = tmp_path / "ds"
    killed, done = build_killed_at(src, root, 0.5)
    assert 0.5 * SHARDS <= len(done) < SHARDS, done
    sharded = _keys_by_shard(killed, done)
    changed = sorted(done)[len(done) // 2]  # a finished shard loses an image
    gone = sorted(sharded[changed])[0]
    os.remove(src / gone)
    (src / "cat" / "new.jpg").write_bytes(photo(10_000))
    listed = SHARDS * 4

    again = build(src, root, *ARGS)
    kept = sorted(n for n in done if n != changed)
    assert shared_from(again, killed) == kept  # referenced, not copied:
    assert not set(kept) & set(os.listdir(again["version_dir"]))
    build_counts = again["manifest"]["build"]
    assert build_counts["resumed_shards"] == len(done)
    resumed_images = sum(len(sharded[n]) for n in done) - 1
    assert build_counts["converted"] == listed - resumed_images
    assert build_counts["converted"] <= 0.6 * listed, build_counts
    shards = again["manifest"]["splits"]["train"]["shards"]
    for i, s in enumerate(shards[:SHARDS]):  # the cut's slots: no shard renumbered
        assert re.search(rf"-{i:05d}-of-{len(shards):05d}$", s["path"]) or (
            s["path"].endswith(f"-{i:05d}-of-{SHARDS:05d}") and s["path"].startswith("../")), (
            i, s["path"])
    assert len(shards) in (SHARDS, SHARDS + 1)  # + a new shard when the new image's slot
    check_invariants(again)                      # was a taken one
    full = build(src, tmp_path / "full", *ARGS)
    assert examples(again) == examples(full)  # the same keys, splits and record bytes
    assert again["manifest"]["accounting"] == full["manifest"]["accounting"]
    assert again["manifest"]["labels"] == full["manifest"]["labels"]
    assert retired(killed) == sorted(kept + [layout.index_name(n) for n in kept])


def _keys_by_shard(vdir, names):
    """{finished shard name: [its keys]} from the killed run's catalog fragments."""
    from beam_pipeline.job import attempts

    keys = {}
    for f in attempts.finished([vdir]):
        if f.result.files.path in names:
            import pyarrow.parquet as pq

            keys[f.result.files.path] = pq.read_table(f.fragment, columns=["key"]).column(
                "key").to_pylist()
    assert sorted(keys) == sorted(names)
    return keys


def test_a_failed_dataflow_job_resumes_on_gcs_after_images_were_added_and_deleted(
        gcs, tmp_path):
    """On gs://, as Dataflow runs it (tests/dataflow_sim.py: the real plan, shard writer and
    commit against the GCS emulator): a job writes half its shards and fails; an image is
    added and one deleted; the next launch shares the unchanged finished shards where the
    failed job wrote them (no object copied) and publishes a full build's examples."""
    from beam_pipeline.job.contracts import Kind
    from beam_pipeline.store import lock
    from tests.dataflow_sim import plan
    from tests.helpers import image_bytes, make_images

    bucket = gcs.create_bucket()
    make_images(tmp_path / "in", {"cat": 8, "dog": 8})
    src, root = f"gs://{bucket}/in", f"gs://{bucket}/out"
    gcs.upload_tree(tmp_path / "in", src)
    args = ["--name", "night", "--num_shards", "4", "--splits", "train=1.0", "--no_transform"]
    failed = plan(["--input", src, "--output", root, *args])
    done = [failed.attempt(t) for t in failed.tasks[:2]]  # then the job fails
    lock.release_submitted(root, failed.spec.version)  # (its lock expires)
    gone = f"{src}/{done[0].files.path and _first_key(gcs, done[0])}"
    gcs.client.bucket(bucket).blob(gone.split("/", 3)[3]).delete()
    gcs.upload_bytes(f"{src}/cat/new.jpg", image_bytes((10, 200, 60)))

    again = plan(["--input", src, "--output", root, *args])
    kinds = [t.kind for t in again.tasks]
    assert kinds.count(Kind.RESUME) == 2  # one shared, one that lost an image copied
    manifest = again.commit([again.attempt(t) for t in again.tasks])
    shared = [s["path"] for s in manifest["splits"]["train"]["shards"]
              if s["path"].startswith("../")]
    assert shared == [f"../{failed.spec.version}/{done[1].files.path}"]
    assert manifest["build"]["resumed_shards"] == 2
    assert manifest["build"]["converted"] == 16 - done[1].written.num_examples - (
        done[0].written.num_examples - 1)
    assert not gcs.exists(  # not copied
        f"{root}/versions/{again.spec.version}/{done[1].files.path}")
    full = build(src, f"gs://{bucket}/full", *args)
    assert _examples(gcs, root, manifest) == _examples(gcs, f"gs://{bucket}/full",
                                                       full["manifest"])
    assert manifest["accounting"] == full["manifest"]["accounting"]


def _first_key(gcs, result):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(pa.BufferReader(gcs.read(result.files.catalog_temp)))
    return table.column("key").to_pylist()[0]


def _examples(gcs, root, manifest):
    """{key: (split, label id, stored image sha256, record length)} from a version's
    catalog."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    catalog = pq.read_table(pa.BufferReader(gcs.read(
        f"{root}/versions/{manifest['version']}/{layout.CATALOG}"))).to_pylist()
    return {r["key"]: (r["split"], r["label_id"], r["sha256"], r["length"]) for r in catalog}
