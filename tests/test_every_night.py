"""No input or root state stops every night, and every run ends.

* Special files (a FIFO, a unix socket, a symlink to a FIFO) are rejected at listing with
  a reason, never opened: opening a FIFO blocks until something writes to it.
* A LATEST naming a missing version (an id from a clock that ran ahead, a restore) is
  damage, like a cut-short one: the build goes on from the newest intact version, says so,
  and publishes over it.
* A split decided by a `--sink beam --resplit` build stays decided in the plain builds
  after it.
* --max_hours bounds a local run: past it the run stops, frees the lock, exits 1.
* Exit status: 1 when running again may help, 3 when it will fail the same way.
"""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from beam_pipeline import cli
from beam_pipeline.launcher import walk
from beam_pipeline.store import lock
from dataset_format import layout
from tests.helpers import REPO, build, check_invariants, errors_of, make_images
from tests.model_tree import tiny_image

ARGS = ["--name", "pets", "--target_shard_mb", "0.01", "--no_transform",
        "--splits", "train=0.6,validation=0.2,test=0.2", "--max_error_rate", "1"]


def specials(directory):
    """A FIFO, a unix socket and a symlink to the FIFO, all with image names, in
    `directory` -> {path: kind}; the socket stays bound until the test ends."""
    directory.mkdir(parents=True, exist_ok=True)
    fifo, sock, link = directory / "pipe.png", directory / "sock.jpg", directory / "link.jpg"
    os.mkfifo(fifo)
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock))
    os.symlink(fifo, link)
    return {str(fifo): "a FIFO (named pipe)", str(sock): "a socket",
            str(link): "a FIFO (named pipe)"}, server


def test_special_files_are_rejected_at_listing_never_opened(tmp_path):
    from beam_pipeline.launcher import listing
    from beam_pipeline.refs import ImageRef
    from dataset_format.error_record import ErrorRecord

    src = tmp_path / "in"
    make_images(src, {"cat": {"a.jpg": tiny_image(1, "jpg")}})
    kinds, server = specials(src / "cat")
    manifest = tmp_path / "list.csv"
    manifest.write_text("uri,label\n" + "".join(f"{p},cat\n" for p in kinds)
                        + f"{src}/cat/a.jpg,cat\n")
    try:
        for spec in (src, manifest):
            items = list(listing.iter_inputs([str(spec)]))
            errors = sorted((e.uri, e.reason, e.detail) for e in items
                            if isinstance(e, ErrorRecord))
            assert errors == sorted(
                (p, walk.SPECIAL_FILE, f"{k}, not a regular file: never opened")
                for p, k in kinds.items())
            assert [r.uri for r in items if isinstance(r, ImageRef)] == [f"{src}/cat/a.jpg"]
    finally:
        server.close()


@pytest.mark.slow
def test_a_fifo_socket_or_link_to_a_fifo_in_the_inputs_does_not_hang_the_build(tmp_path):
    """Before: `mkfifo IN/dog/x.png` hung the build for ever at "1/47 images, 0 img/s",
    holding the root's lock, so every later night exited 2. In a child process with a
    timeout, so a regression fails here instead of hanging the suite."""
    src, root = tmp_path / "in", tmp_path / "root"
    make_images(src, {"cat": {f"c{i}.jpg": tiny_image(i, "jpg") for i in range(4)},
                      "dog": {"d.jpg": tiny_image(9, "jpg")}})
    kinds, server = specials(src / "dog")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "beam_pipeline", "--input", str(src), "--output", str(root),
             *ARGS], cwd=REPO, capture_output=True, text=True, timeout=240)
    finally:
        server.close()
    assert proc.returncode == 0, proc.stderr
    vdir = root / layout.VERSIONS / json.loads((root / layout.LATEST).read_text())["version"]
    rows = sorted((e["uri"], e["reason"]) for e in errors_of(str(vdir)))
    assert rows == sorted((p, walk.SPECIAL_FILE) for p in kinds)
    manifest = json.loads((vdir / layout.MANIFEST).read_text())
    assert manifest["accounting"]["written"] == 5 and manifest["accounting"]["failed"] == 3


@pytest.mark.slow
def test_a_latest_naming_a_missing_future_version_is_damage_not_a_wall(tmp_path, capsys):
    """Before: every build exited 1 ("version X was published while Y was being built") and
    left one more complete, unpublished version behind."""
    src, root = tmp_path / "in", tmp_path / "root"
    make_images(src, {"cat": {f"c{i}.jpg": tiny_image(i, "jpg") for i in range(6)}})
    v1 = build([src], root, *ARGS)
    future = "29991231T235959Z"
    (root / layout.LATEST).write_text(json.dumps(layout.latest_record(future)))
    make_images(src, {"cat": {"late.jpg": tiny_image(40, "jpg")}})
    capsys.readouterr()
    v2 = build([src], root, *ARGS)
    err = capsys.readouterr().err
    assert (f"versions/{future}/{layout.MANIFEST}: missing (LATEST names version {future})"
            in err and f"building on version {v1['version']}" in err), err
    assert json.loads((root / layout.LATEST).read_text())["version"] == v2["version"]
    assert v2["manifest"]["build"]["converted"] == 1  # built on v1: the new image only
    make_images(src, {"cat": {"later.jpg": tiny_image(41, "jpg")}})
    v3 = build([src], root, *ARGS)  # the night after: an ordinary incremental build
    assert json.loads((root / layout.LATEST).read_text())["version"] == v3["version"]
    assert sorted(os.listdir(root / layout.VERSIONS)) == sorted(
        [v1["version"], v2["version"], v3["version"]])  # nothing left unpublished
    check_invariants(v3)


@pytest.mark.slow
def test_a_split_decided_by_a_beam_sink_resplit_holds_in_the_plain_builds_after(tmp_path):
    """Before: the beam sink wrote no split map, so the plain build after it read the map
    from before --resplit and moved images back to their old splits."""
    from beam_pipeline.store import catalog, split_map

    src, root = tmp_path / "in", tmp_path / "root"
    make_images(src, {"cat": {f"c{i}.jpg": tiny_image(i, "jpg") for i in range(12)},
                      "dog": {f"d{i}.jpg": tiny_image(50 + i, "jpg") for i in range(12)}})
    build([src], root, *ARGS)
    other = [a if a != "train=0.6,validation=0.2,test=0.2" else "train=0.2,validation=0.2,test=0.6"
             for a in ARGS]
    beam = build([src], root, *other, "--sink", "beam", "--resplit", "--num_shards", "1")
    assert beam["manifest"]["split_map"]["contents"] == 24
    decided = split_map.read(layout.join(beam["version_dir"], layout.SPLIT_MAP))
    make_images(src, {"cat": {"new.jpg": tiny_image(99, "jpg")}})
    plain = build([src], root, *ARGS)  # the old --splits, no --resplit
    rows = list(catalog.iter_rows(layout.join(plain["version_dir"], layout.CATALOG)))
    kept = {r["key"]: (r["split"], decided.split_of(r["input_sha256"])) for r in rows}
    moved = {k: v for k, v in kept.items() if v[1] is not None and v[0] != v[1]}
    assert moved == {} and sum(v[1] is not None for v in kept.values()) == 24
    assert len({v[0] for v in kept.values()}) == 3


# --- every run has a time bound ---------------------------------------------------------------

def _cli(*args, timeout=240):
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "beam_pipeline", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - start


@pytest.mark.slow
def test_a_local_build_past_max_hours_stops_frees_the_lock_and_exits_1(tmp_path):
    src, root = tmp_path / "in", tmp_path / "root"
    make_images(src, {"cat": {f"c{i}.jpg": tiny_image(i, "jpg") for i in range(40)}})
    held = lock.acquire(str(root))  # another build holds the root: --wait waits for ever
    try:
        proc, _ = _cli("--input", src, "--output", root, *ARGS, "--wait", "--max_hours",
                       "0.0005")  # 1.8 s
    finally:
        held.release()
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error")]
    assert proc.returncode == 1, proc.stderr
    assert lines == ["error: build failed: stopped after --max_hours 0.0005 (2 s); nothing "
                     "published, the root's lock released (a hung input, or a bound too tight "
                     "for this build?) (run with --verbose for the traceback)"], proc.stderr
    # The same while the job runs, held there: an input turned into a FIFO once it is listed
    # (the listing rejects special files; the shard writer then waits on it).
    stuck = src / "cat" / "c0.jpg"
    proc = subprocess.Popen([sys.executable, "-m", "beam_pipeline", "--input", str(src),
                             "--output", str(root), *ARGS, "--max_hours", "0.003"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    for line in proc.stdout:  # the plan's line: listed, the job about to start
        if line.startswith("Building "):
            break
    else:
        raise AssertionError(f"no plan line: {proc.stderr.read()}")
    stamp = os.stat(stuck).st_mtime_ns
    stuck.unlink()
    os.mkfifo(stuck)
    os.utime(stuck, ns=(stamp, stamp))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert "stopped after --max_hours 0.003" in err
    stuck.unlink()
    stuck.write_bytes(tiny_image(0, "jpg"))
    assert not (root / layout.LATEST).exists()
    assert build([src], root, *ARGS)["status"] == "published"  # the lock is free


# --- exit status ------------------------------------------------------------------------------

def test_exit_status_tells_a_retry_that_may_help_from_one_that_will_not():
    from beam_pipeline.job.commit import ErrorRateExceeded
    from beam_pipeline.store.transient import StorageUnavailable

    assert cli.exit_status(ErrorRateExceeded("3 of 7 inputs rejected")) == 3
    wrapped = RuntimeError("Traceback ...\nErrorRateExceeded: 3 of 7 inputs rejected (42.9%) "
                           "exceeds --max_error_rate 0.01 [while running 'Commit']")
    assert cli.exit_status(wrapped) == 3  # as Beam hands it back from a worker
    assert cli.exit_status(StorageUnavailable("cannot read gs://b/ds/LATEST (503)")) == 1
    assert cli.exit_status(RuntimeError("Worker subprocess exited")) == 1
