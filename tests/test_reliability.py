"""Reliability under concurrency and faults: one build per root, LATEST only
moves forward, a commit run twice changes nothing, injected faults lose nothing.

Storage faults come from tests/faults.py, a proxy in front of the GCS emulator that also
enforces generation preconditions (gcp-storage-emulator ignores them). Process faults are
real SIGKILLs; the full disk is a real tmpfs mounted in a private mount namespace. What
each test measured is in docs/guarantees.md, "Reliability".
"""

import hashlib
import io
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from beam_pipeline import cli
from beam_pipeline.job import commit, contracts, tfds_metadata
from beam_pipeline.store import files, lock, lock_base, lock_gcs, versions
from beam_pipeline.store.gcs import gcs_blob
from dataset_format import layout
from tests.faults import FaultProxy
from tests.helpers import REPO, assert_dead_run_gone_or_shared, build, image_bytes, make_images

pytestmark = pytest.mark.slow

ARGS = ["--name", "rel", "--num_shards", "1", "--splits", "train=0.5,validation=0.5",
        "--no_transform"]
SEED, RATE = 13, 0.05  # transient storage faults: fixed seed, ~5% of requests


@pytest.fixture(scope="module")
def proxy(gcs):
    """Every google-cloud-storage request of this module (and of the builds it starts)
    goes through a FaultProxy: preconditions enforced, faults off until a test turns
    them on."""
    with FaultProxy(gcs.endpoint) as fault_proxy, pytest.MonkeyPatch.context() as mp:
        mp.setenv("STORAGE_EMULATOR_HOST", fault_proxy.url)
        yield fault_proxy


@pytest.fixture
def faults(proxy):
    """Turn the proxy's faults on (RATE, SEED) for one test; off again afterwards."""
    proxy.random.seed(SEED)
    proxy.injected = dict.fromkeys(proxy.injected, 0)
    proxy.requests, proxy.refused_412, proxy.rate = 0, 0, RATE
    yield proxy
    proxy.rate = 0.0


def launch(tmp_path, tag, *argv, python=("-m", "beam_pipeline")):
    """`python -m beam_pipeline ARGV` in its own session -> (Popen, stdout file, stderr file)."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TF_CPP_MIN_LOG_LEVEL="2")
    out, err = tmp_path / f"{tag}.out", tmp_path / f"{tag}.err"
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen([sys.executable, *python] + [str(a) for a in argv],
                                cwd=tmp_path, env=env, stdout=o, stderr=e,
                                start_new_session=True)
    return proc, out, err


def finish(run, timeout=180):
    proc, out, err = run
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out.read_text(), err.read_text()


def error_lines(stderr):
    return [l for l in stderr.splitlines() if l.startswith("error:")]


def version_id(created_at):
    """manifest created_at '2026-11-29T22:01:02Z' -> the version id of that second."""
    return created_at.replace("-", "").replace(":", "")


def lock_exists(root):
    if root.startswith("gs://"):
        bucket, name = gcs_blob(lock.lock_path(root))
        return bucket.get_blob(name) is not None
    return os.path.exists(lock.lock_path(root))


def fifo_after_listing(path, runs, timeout=120):
    """Once one of `runs` (launch()'s) has listed its inputs ("Building …" on its stdout),
    replace the regular file at `path` by a FIFO: the listing rejects special files
    (`special_file`), but the shard writer opens the listed path and then waits on the FIFO,
    which holds that build mid-shard. -> the run that listed it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for run in runs:
            if "Building " in run[1].read_text():
                mtime = os.stat(path).st_mtime_ns
                os.unlink(path)
                os.mkfifo(path)
                os.utime(path, ns=(mtime, mtime))
                return run
        assert any(run[0].poll() is None for run in runs), "every build ended before listing"
        time.sleep(0.01)
    raise AssertionError(f"no build listed its inputs in {timeout} s")


def hold_until_opened(fifo, proc, log, timeout=120):
    """Open the FIFO's write end once the build opens it to read: the build is then inside
    a shard writer, mid-shard. Returns the write end (keep it open: the read blocks)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the build ended early:\n{log.read_text()[-3000:]}"
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: no reader yet
            time.sleep(0.05)
    raise AssertionError(f"no shard writer opened {fifo} in {timeout} s")


# --- one build per root ---------------------------------------------------------------------

def feed(fifo, alive, data):
    """Once a shard writer opens the FIFO, hand it `data` (one image) and EOF; the FIFO keeps
    its mtime, so a later build lists the same inputs. False if `alive()` turned false
    first (a build that reused the shard instead of reading it)."""
    mtime = os.stat(fifo).st_mtime_ns
    while alive():
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: no reader yet
            time.sleep(0.05)
            continue
        os.set_blocking(fd, True)
        os.write(fd, data)
        os.close(fd)
        os.utime(fifo, ns=(mtime, mtime))
        return True
    return False


def wait_for(predicate, what, timeout=120):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} in {timeout} s"
        time.sleep(0.05)


class Stderr:
    """What in-process code printed to stderr so far (capsys, read as it grows)."""

    def __init__(self, capsys):
        self.capsys, self.text = capsys, ""

    def __str__(self):
        self.text += self.capsys.readouterr().err
        return self.text


def race(src, root, tmp_path, capsys):
    """Two builds started together (two processes, as two cron runs); while the winner
    runs, a third with --wait --force (in this process: it has Beam and TF loaded already).

    Exactly one of the two publishes; the other exits 2 at once with one line naming the
    winner; the third waits, takes the root after the winner has published, and publishes
    after it. An input turned into a FIFO once the winner has listed it holds the winner
    mid-shard until the third is seen waiting, whatever the machine's speed.
    """
    fifo, image = src / "cat" / "fifo.jpg", image_bytes((200, 40, 40))
    fifo.write_bytes(image)
    argv = ["--input", str(src), "--output", root] + ARGS
    pair = [launch(tmp_path, tag, *argv) for tag in ("a", "b")]
    fifo_after_listing(fifo, pair)
    wait_for(lambda: any(run[0].poll() is not None for run in pair), "build exiting")
    loser = next(run for run in pair if run[0].poll() is not None)
    winner = next(run for run in pair if run is not loser)
    waited, stderr = {}, Stderr(capsys)
    waiter = threading.Thread(
        target=lambda: waited.update(code=cli.main(argv + ["--force", "--wait"])))
    waiter.start()

    code, out, err = finish(loser)
    assert code == 2, err
    assert err.strip().splitlines() == error_lines(err), err  # one line, nothing else
    [line] = error_lines(err)
    assert line.startswith(f"error: {root} is being built by host {socket.gethostname()} "
                           f"pid {winner[0].pid} since "), line
    assert line.endswith("nothing done. Pass --wait to wait for it"), line
    assert out == ""

    wait_for(lambda: "waiting: " in str(stderr), "'waiting:' line")
    assert (f"waiting: {root} is being built by host {socket.gethostname()} "
            f"pid {winner[0].pid}") in str(stderr)
    assert feed(fifo, lambda: winner[0].poll() is None, image), winner[2].read_text()
    fifo.unlink()  # a file again (the winner has the FIFO open) for the --wait build,
    fifo.write_bytes(image)  # which lists once the root is free
    code, out, err = finish(winner)
    assert code == 0, err
    first = versions.latest(root)
    waiter.join(timeout=180)
    assert waited == {"code": 0}, str(stderr)
    second = versions.latest(root)[0]
    assert second > first[0]
    assert second >= version_id(first[1]["created_at"]), "the --wait build overlapped"
    assert versions.list_versions(root) == {first[0]: True, second: True}
    assert not lock_exists(root)


def test_two_builds_on_a_local_root_one_publishes_one_exits_2_and_wait_serializes(
        tmp_path, capsys):
    make_images(tmp_path / "in", {"cat": 4, "dog": 4})
    race(tmp_path / "in", str(tmp_path / "ds"), tmp_path, capsys)


def test_two_builds_on_gcs_one_publishes_one_exits_2_and_wait_serializes(
        proxy, gcs_bucket, tmp_path, capsys):
    make_images(tmp_path / "in", {"cat": 4, "dog": 4})
    race(tmp_path / "in", f"gs://{gcs_bucket}/ds", tmp_path, capsys)


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_a_killed_build_never_blocks_the_next_for_long(where, request, tmp_path, monkeypatch,
                                                       capsys):
    """A launcher SIGKILLed while holding the lock (what a killed build leaves behind: it
    takes the lock first). Local: the flock died with it; the file it leaves names it and
    blocks nothing. gs://: its lock object stays until its heartbeat is TTL old; until
    then a new build exits 2 naming it, then takes it over."""
    if where == "gcs":
        request.getfixturevalue("proxy")
        root = f"gs://{request.getfixturevalue('gcs_bucket')}/ds"
    else:
        root = str(tmp_path / "ds")
    make_images(tmp_path / "in", {"cat": 2, "dog": 2})
    argv = ["--input", str(tmp_path / "in"), "--output", root] + ARGS
    holder = launch(tmp_path, "holder", f"import time; from beam_pipeline.store import lock; "
                    f"lock.acquire({root!r}); print('held', flush=True); time.sleep(600)",
                    python=("-c",))
    proc, out, _ = holder
    wait_for(lambda: "held" in out.read_text() or proc.poll() is not None, "lock holder")
    assert proc.poll() is None, holder[2].read_text()
    assert cli.main(argv) == 2  # alive: the root is taken
    [line] = error_lines(capsys.readouterr().err)
    assert f"pid {proc.pid} since " in line and "(last heartbeat " in line, line

    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if where == "gcs":
        reader = lock_gcs.GcsLock(root)
        body, _, updated = reader._read()
        age = reader._age(updated)
        assert body["pid"] == proc.pid and body["state"] == "running"
        monkeypatch.setattr(lock_base, "TTL", age + 3.0)  # expires 3 s from now
        monkeypatch.setattr(lock_base, "HEARTBEAT", 0.5)
        assert cli.main(argv) == 2  # dead, but not expired yet
        [line] = error_lines(capsys.readouterr().err)
        assert f"pid {proc.pid} since " in line, line
        wait_for(lambda: reader._age(reader._read()[2]) > lock_base.TTL, "expiry")
    else:
        with open(lock.lock_path(root)) as f:
            assert f'"pid": {proc.pid}' in f.read()  # what it left: no flock, no block
    assert cli.main(argv) == 0  # takes the root at once (local) or the expired lock (gs://)
    assert versions.latest(root)[0] and not lock_exists(root)


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_an_expired_lock_is_taken_over_by_exactly_one_of_many(where, request, tmp_path,
                                                               monkeypatch):
    """Six builds find the same dead lock at once: one compare-and-swap wins (on gs://,
    with transient faults on, so retried requests that already took effect are in play)."""
    if where == "gcs":
        request.getfixturevalue("faults")
        root = f"gs://{request.getfixturevalue('gcs_bucket')}/ds"
        dead = lock.acquire(root)
        dead.stop.set()  # its heartbeat stops, as when the process is killed
        dead.thread.join()
        monkeypatch.setattr(lock_base, "TTL", 1.0)
        monkeypatch.setattr(lock_base, "HEARTBEAT", 0.2)  # the winner's stays fresh
        time.sleep(2.5)  # past the TTL by the server's Date header, which has whole seconds
    else:
        root = str(tmp_path / "ds")
    barrier, won, refused = threading.Barrier(6), [], []

    def take():
        barrier.wait()
        try:
            won.append(lock.acquire(root))
        except lock.LockHeld as e:
            refused.append(str(e))

    threads = [threading.Thread(target=take) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(won) == 1 and len(refused) == 5, (won, refused)
    won[0].release()
    assert not lock_exists(root)


def test_a_submitted_job_holds_the_lock_until_its_commit_stage_releases_it(
        proxy, gcs_bucket):
    """Dataflow: the launcher returns after submitting; the job's commit stage releases
    the lock it was handed. A submission that fails releases it at once."""
    root, version = f"gs://{gcs_bucket}/ds", "20260401T000000Z"

    @lock.release_on_exit
    def launcher(fail):
        lock.acquire(root)
        lock.hand_off(root, version)
        if fail:
            raise RuntimeError("submission failed")
        return "submitted"

    with pytest.raises(RuntimeError):
        launcher(fail=True)
    assert not lock_exists(root)

    assert launcher(fail=False) == "submitted"
    with pytest.raises(lock.LockHeld, match=f"locked by version {version}, submitted to a "
                                            "runner by host .* not committed yet"):
        lock.acquire(root)
    stats, spec = commit_inputs(root, "20260331T000000Z")  # another version's commit:
    commit.commit(stats, spec)                              # not its lock to release
    assert lock_exists(root)
    stats, spec = commit_inputs(root, version)
    commit.commit(stats, spec)  # the job's own last stage
    assert not lock_exists(root)
    assert versions.latest(root)[0] == version


def _handed_off(root, version):
    """A launcher that handed ROOT's lock to a submitted job and exited (the Flex path)."""

    @lock.release_on_exit
    def launcher():
        lock.acquire(root)
        lock.hand_off(root, version)

    launcher()
    holder = lock_gcs.GcsLock(root).holder()
    assert (holder["state"], holder["version"]) == ("submitted", version)


def test_a_job_that_never_starts_frees_the_root_after_submitted_ttl(proxy, gcs_bucket,
                                                                    monkeypatch):
    """Submitted (or its job file written for the Flex launcher) but no worker ever beat
    the lock, e.g. the launch failed: the lock expires SUBMITTED_TTL after the hand-off."""
    root, version = f"gs://{gcs_bucket}/ds", "20260401T000000Z"
    monkeypatch.setattr(lock_base, "SUBMITTED_TTL", 2.0)
    _handed_off(root, version)
    with pytest.raises(lock.LockHeld, match="no job heartbeat yet.*after submission unless "
                                            "its workers start"):
        lock.acquire(root)
    reader = lock_gcs.GcsLock(root)
    wait_for(lambda: reader._age(reader._read()[2]) > lock_base.SUBMITTED_TTL, "expiry")
    held = lock.acquire(root)  # taken over
    assert lock_gcs.GcsLock(root).holder()["token"] == held.token
    held.release()


def test_a_failed_or_cancelled_job_frees_the_root_job_ttl_after_its_last_beat(
        proxy, gcs_bucket, monkeypatch):
    """While the job's workers live they beat the lock (any number of them: about one
    write per JOB_HEARTBEAT), so it outlives JOB_TTL; once they are gone (the job failed or
    was cancelled) it expires JOB_TTL after the last beat. A late worker of that job beats
    nothing, and its late commit releases nothing, once another build holds the root."""
    from google.cloud import storage

    root, version = f"gs://{gcs_bucket}/ds", "20260401T000000Z"
    monkeypatch.setattr(lock_base, "JOB_HEARTBEAT", 0.5)
    monkeypatch.setattr(lock_base, "JOB_TTL", 2.0)
    _handed_off(root, version)
    writes, upload = [], storage.Blob.upload_from_string

    def counted(self, data, *args, **kwargs):
        upload(self, data, *args, **kwargs)  # a 412 (another worker was first) raises
        writes.append(data)

    monkeypatch.setattr(storage.Blob, "upload_from_string", counted)
    workers = [lock_gcs.JobBeat(root.rstrip("/"), version) for _ in range(8)]  # 8 processes'
    for worker in workers:
        worker.start()
    try:
        wait_for(lambda: "job_heartbeat" in lock_gcs.GcsLock(root).holder(), "a job heartbeat")
        start = time.monotonic()
        while time.monotonic() - start < 2 * lock_base.JOB_TTL:  # beaten: never expires
            with pytest.raises(lock.LockHeld, match="its job's last heartbeat .* s ago.*expires "
                                                    "0.0333333 min after"):
                lock.acquire(root)
            time.sleep(0.25)
        beats = sum("job_heartbeat" in w for w in writes)
        elapsed = time.monotonic() - start
        assert 1 <= beats <= elapsed / lock_base.JOB_HEARTBEAT + 2, (beats, elapsed)
    finally:
        for worker in workers:  # the job fails: its workers go
            worker.stop.set()
            worker.join()
    with pytest.raises(lock.LockHeld):
        lock.acquire(root)  # its last beat is fresh still
    reader = lock_gcs.GcsLock(root)
    wait_for(lambda: reader._age(reader._read()[2]) > lock_base.JOB_TTL, "expiry")
    held = lock.acquire(root)
    assert not lock_gcs.GcsLock(root).beat_for_job(version)  # a zombie worker: stops, no write
    lock.release_submitted(root, version)  # the dead job's late commit: not its lock now
    assert lock_gcs.GcsLock(root).holder()["token"] == held.token
    held.release()
    assert not lock_exists(root)


def test_the_commit_releases_the_lock_while_workers_beat_it(proxy, gcs_bucket, monkeypatch):
    """A beat between the commit's read of the lock and its delete changes the generation:
    the release reads again and deletes; a beat after that recreates nothing."""
    root, version = f"gs://{gcs_bucket}/ds", "20260401T000000Z"
    monkeypatch.setattr(lock_base, "JOB_HEARTBEAT", 0.0)  # every look writes a beat
    _handed_off(root, version)
    workers = [lock_gcs.JobBeat(root.rstrip("/"), version) for _ in range(4)]
    for worker in workers:
        worker.start()
    wait_for(lambda: "job_heartbeat" in lock_gcs.GcsLock(root).holder(), "a job heartbeat")
    stats, spec = commit_inputs(root, version)
    commit.commit(stats, spec)
    for worker in workers:
        worker.join(timeout=30)
        assert not worker.is_alive()  # each found the lock gone and stopped
    lock.stop_keep_alive()
    assert not lock_exists(root) and versions.latest(root)[0] == version


# --- LATEST only moves forward; a commit run twice changes nothing ------------------------

@pytest.mark.parametrize("where", ["local", "gcs"])
def test_concurrent_publishers_leave_latest_on_the_newest(where, request, tmp_path):
    if where == "gcs":
        proxy = request.getfixturevalue("faults")
        root = f"gs://{request.getfixturevalue('gcs_bucket')}/ds"
    else:
        proxy, root = None, str(tmp_path / "ds")
        os.makedirs(root)
    ids = [f"2026010{d}T00000{s}Z" for d in range(1, 5) for s in range(3)]
    random.Random(SEED).shuffle(ids)
    for v in ids:  # as commit does: a version's manifest is written before LATEST names it
        vdir = layout.version_dir(root, v)
        if proxy is None:
            os.makedirs(vdir)
        files.write_json(layout.join(vdir, layout.MANIFEST), {})
    barrier, got = threading.Barrier(len(ids)), {}

    def publish(v):
        barrier.wait()
        got[v] = versions.publish(root, v)

    threads = [threading.Thread(target=publish, args=(v,)) for v in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert files.read_json(layout.join(root, layout.LATEST)) == \
        layout.latest_record(max(ids))
    assert all(got[v] >= v for v in ids), got  # never moved back, never refused wrongly
    assert versions.publish(root, min(ids)) == max(ids)
    if proxy is None:
        assert sorted(os.listdir(root)) == [layout.LATEST, layout.VERSIONS]  # no temp file
    else:
        assert proxy.refused_412, "no compare-and-swap ever lost: the race did not happen"


def commit_inputs(root, version):
    """What the job hands its commit stage: temp shards and listing errors in .tmp/."""
    from beam_pipeline.job.contracts import Made, ShardFiles, ShardResult, Sums, Written
    from dataset_format.frames import file_crc32c, tfrecord_frame

    vdir = layout.version_dir(root, version)
    tmp = layout.join(vdir, ".tmp")
    listing_errors = layout.join(tmp, "listing_errors.jsonl")
    files.write_bytes(listing_errors, b'{"uri": "x/a.jpg", "stage": "read", '
                                         b'"reason": "not_found", "detail": "gone"}\n')
    stats = []
    for shard in range(2):
        frame = tfrecord_frame(b"record %d" % shard)
        temp = layout.join(tmp, f"rel-train.tfrecord-0000{shard}-of-00002.abc")
        files.write_bytes(temp, frame)
        files.write_bytes(temp + layout.INDEX_SUFFIX, b"0 %d\n" % len(frame))
        stats.append(ShardResult(
            split="train", shard=shard,
            files=ShardFiles(temp=temp, index_temp=temp + layout.INDEX_SUFFIX),
            written=Written(1, len(frame), crc32c=file_crc32c(frame)),
            made=Made(passed_through=1), sums=Sums({"cat": 1})))
    spec = contracts.CommitSpec(
        root=root, version=version, name="rel", labels=("cat",), num_shards={"train": 2},
        listed=contracts.Listed(3, 0, listing_errors), input_fingerprint="sha256:x",
        config={}, generator={}, max_error_rate=1.0, write_index=True)
    return stats, spec


def stored(root, vdir):
    """{file: bytes} of LATEST, manifest.json and errors.jsonl, plus generations on gs://."""
    paths = [layout.join(root, layout.LATEST), layout.join(vdir, layout.MANIFEST),
             layout.join(vdir, layout.ERRORS)]
    out = {}
    for p in paths:
        with versions.FileSystems.open(p) as f:
            out[p] = f.read()
        if p.startswith("gs://"):
            bucket, name = gcs_blob(p)
            out[p + "#generation"] = bucket.get_blob(name).generation
        else:
            out[p + "#mtime"] = os.stat(p).st_mtime_ns
    return out


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_commit_stage_run_again_after_publishing_changes_nothing(where, request, tmp_path):
    """Dataflow retries a failed bundle, the commit one included: the second run finds the
    manifest, rewrites nothing, and LATEST, manifest.json and errors.jsonl stay
    byte-identical (on gs://, not even rewritten: same generations)."""
    if where == "gcs":
        request.getfixturevalue("proxy")
        root = f"gs://{request.getfixturevalue('gcs_bucket')}/ds"
    else:
        root = str(tmp_path / "ds")
    version = "20260301T000000Z"
    stats, spec = commit_inputs(root, version)
    first = commit.commit(stats, spec, extra_files=(tfds_metadata.write,))
    before = stored(root, spec.vdir)
    time.sleep(1.1)  # a rewritten created_at would differ
    again = commit.commit(stats, spec, extra_files=(tfds_metadata.write,))
    assert again == first
    assert stored(root, spec.vdir) == before
    assert first["accounting"] == dict(first["accounting"], listed=3, failed=1, written=2)


# --- injected faults --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gcs_inputs(proxy, gcs, tmp_path_factory):
    """Images on gs:// (one of them broken) and a fault-free build of them to a local root
    (keys are relative to the input root: where the output goes changes no byte)."""
    bucket = gcs.create_bucket()
    local = tmp_path_factory.mktemp("gcs_inputs")
    make_images(local / "in", {"cat": 6, "dog": 6, "owl": 4,
                               "dog/": {"broken.jpg": b"not an image"}})
    src = f"gs://{bucket}/in"
    gcs.upload_tree(local / "in", src)
    clean = build(src, local / "clean", *ARGS, "--max_error_rate", "0.2")
    return src, bucket, clean


def version_files(result):
    """{file name: bytes} of every shard, index and errors.jsonl of a built version."""
    vdir, manifest = result["version_dir"], result["manifest"]
    names = [layout.ERRORS] + [n for info in manifest["splits"].values()
                               for s in info["shards"]
                               for n in (s["path"], layout.index_name(s["path"]))]
    out = {}
    for name in names:
        with versions.FileSystems.open(layout.join(vdir, name)) as f:
            out[name] = f.read()
    return out


def test_transient_gcs_errors_publish_the_same_shards(gcs, gcs_inputs, faults):
    """~5% of requests get a 503, a 429, a reset before or a reset after the server acted:
    the build publishes shards byte-identical to a fault-free build, and the reader reads
    them."""
    import readers

    src, bucket, clean = gcs_inputs
    root = f"gs://{bucket}/faulty"
    faulty = build(src, root, *ARGS, "--max_error_rate", "0.2")
    faults.rate = 0.0
    print(f"\ntransient faults: {faults.requests} requests, injected {faults.injected}, "
          f"{faults.refused_412} precondition failures")
    assert sum(faults.injected.values()) >= 3, faults.injected

    assert version_files(faulty) == version_files(clean)
    for key in ("splits", "accounting", "errors", "labels", "input_fingerprint"):
        assert faulty["manifest"][key] == clean["manifest"][key], key
    assert versions.list_versions(root) == {faulty["version"]: True}
    assert not [u for u in gcs.list(f"{root}/") if "/.tmp/" in u or u.endswith("/.lock")]
    for split, info in faulty["manifest"]["splits"].items():
        ds = readers.make_dataset(root, split=split, batch_size=8, image_size=8,
                                  training=False, dtype="uint8")
        assert sum(int(labels.shape[0]) for _, labels in ds) == info["num_examples"]


def test_shard_deleted_or_truncated_on_gcs_is_named_by_verify_and_reader(
        gcs, gcs_inputs):
    import tensorflow as tf

    import readers
    from beam_pipeline.tools import verify

    src, bucket, clean = gcs_inputs
    root = f"gs://{bucket}/damaged"
    gcs.upload_tree(clean["root"], root)  # a published dataset, now on gs://
    vdir = layout.version_dir(root, clean["version"])
    train = clean["manifest"]["splits"]["train"]["shards"][0]
    val = clean["manifest"]["splits"]["validation"]["shards"][0]
    bucket_obj, name = gcs_blob(f"{vdir}/{train['path']}")
    bucket_obj.delete_blob(name)
    data = gcs.read(f"{vdir}/{val['path']}")
    gcs.upload_bytes(f"{vdir}/{val['path']}", data[:len(data) // 2])

    problems = verify.verify(root)
    assert any(p.startswith(f"{train['path']}: missing") for p in problems), problems
    assert any(p.startswith(f"{val['path']}: ") and "crc32c" in p for p in problems), problems
    for split, shard in (("train", train), ("validation", val)):
        # The reader checks each shard against the manifest before reading (missing, or
        # the wrong size): the error names the file, at make_dataset or while reading.
        with pytest.raises((tf.errors.OpError, OSError, ValueError), match=shard["path"]):
            for _ in readers.make_dataset(root, split=split, batch_size=8, image_size=8,
                                          training=False, dtype="uint8"):
                pass


def test_worker_process_killed_mid_shard_fails_cleanly_and_the_next_run_succeeds(tmp_path):
    src, root = tmp_path / "in", str(tmp_path / "ds")
    make_images(src, {"cat": 4, "dog": 4})
    fifo = src / "cat" / "stuck.jpg"
    fifo.write_bytes(image_bytes((10, 200, 10)))
    run = launch(tmp_path, "workers", "--input", src, "--output", root, *ARGS,
                 "--direct_running_mode", "multi_processing", "--direct_num_workers", "2")
    fifo_after_listing(fifo, [run])
    writer = hold_until_opened(fifo, run[0], run[2])
    victims = []  # the SDK worker reading the FIFO (its open() returns just after ours)
    wait_for(lambda: victims.extend(p for p in descendants(run[0].pid)
                                    if str(fifo) in open_files(p)) or victims, "FIFO reader")
    assert len(victims) == 1, victims
    victim = victims[0]
    started = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    code, out, err = finish(run, timeout=120)
    os.close(writer)
    print(f"\nworker {victim} killed: the launcher exited {code} after "
          f"{time.monotonic() - started:.1f} s")
    assert code == 1, err
    assert "Traceback" not in err, err
    [line] = error_lines(err)
    assert line.startswith("error: build failed: a Beam worker process died"), line
    assert not os.path.exists(layout.join(root, layout.LATEST))  # nothing published
    assert not any(versions.list_versions(root).values())
    assert not lock_exists(root)

    fifo.unlink()
    result = build(src, root, *ARGS)
    killed = [v for v in versions.list_versions(root) if v != result["version"]]
    assert_dead_run_gone_or_shared(root, {result["version"]}, killed[0] if killed else None)


def descendants(pid):
    """Every live process below `pid` (from /proc: Linux)."""
    children = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def open_files(pid):
    paths = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                paths.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                pass
    except OSError:
        pass
    return paths


def noise_jpeg(seed, size=(320, 240)):
    from PIL import Image

    rng = random.Random(seed)
    pixels = bytes(rng.getrandbits(8) for _ in range(size[0] * size[1] * 3))
    buf = io.BytesIO()
    Image.frombytes("RGB", size, pixels).save(buf, "JPEG", quality=95)
    return buf.getvalue()


def test_output_disk_full_fails_with_one_line_and_keeps_the_previous_version(tmp_path):
    """A 256 KiB tmpfs holds the first version; the second (~1 MB of incompressible JPEGs)
    fills it mid-shard."""
    import readers
    from beam_pipeline.tools import verify

    if not shutil.which("unshare"):
        pytest.skip("needs unshare(1) to mount a tmpfs in a private mount namespace")
    probe = subprocess.run(["unshare", "--mount", "--map-root-user", "sh", "-c",
                            f"mount -t tmpfs -o size=64k tmpfs {tmp_path}"],
                           capture_output=True, text=True)
    if probe.returncode:
        pytest.skip(f"cannot mount a tmpfs here (unshare --mount --map-root-user: "
                    f"{probe.stderr.strip()}); the disk-full test needs one")
    src, seed_root = tmp_path / "in", tmp_path / "v1"
    make_images(src, {"cat": 3, "dog": 3})
    v1 = build(src, seed_root, *ARGS)["version"]
    make_images(src, {"cat": {f"big{i}.jpg": noise_jpeg(i) for i in range(8)}})
    mnt, after = tmp_path / "mnt", tmp_path / "after"
    mnt.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    script = (f"set -e; mount -t tmpfs -o size=256k tmpfs {mnt}; cp -a {seed_root} {mnt}/ds; "
              f"set +e; {sys.executable} -m beam_pipeline --input {src} --output {mnt}/ds "
              f"{' '.join(ARGS)} 2> {tmp_path}/full.err; echo $? > {tmp_path}/full.rc; "
              f"cp -a {mnt}/ds {after}")
    subprocess.run(["unshare", "--mount", "--map-root-user", "sh", "-c", script], env=env,
                   cwd=tmp_path, check=True, timeout=300)
    code = int((tmp_path / "full.rc").read_text())
    err = (tmp_path / "full.err").read_text()
    assert code == 1, err
    [line] = error_lines(err)
    assert "No space left on device" in line and f"{mnt}/ds/versions/" in line, line
    assert err.strip() == line, err

    root = str(after)  # what the full disk held afterwards, copied out
    assert files.read_json(layout.join(root, layout.LATEST)) == layout.latest_record(v1)
    assert not [p for p in os.listdir(root) if p.startswith(".LATEST")]  # no partial LATEST
    assert verify.verify(root) == []
    info = readers.info(root)
    assert info.version == v1
    for split, s in info.splits.items():
        ds = readers.make_dataset(root, split=split, batch_size=8, image_size=8,
                                  training=False, dtype="uint8")
        assert sum(int(labels.shape[0]) for _, labels in ds) == s.num_examples
