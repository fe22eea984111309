"""A nightly Dataflow run under the service's retries, zombies and kills, offline.

tests/dataflow_sim.py plays the Dataflow service (which attempts of which work items run,
concurrently or again, and which one is committed): that is the only stand-in. The plan,
the shard writer DoFn, commit and the lock are the real code, against the GCS emulator
behind tests/faults.py's proxy (generation preconditions and generation reads enforced,
faults injected where a test says).
"""

import concurrent.futures
import re
import threading
import time

import pytest
from google.api_core import exceptions

from beam_pipeline.job import commit, reuse
from beam_pipeline.job.contracts import Kind
from beam_pipeline.store import gcs as gcs_store, lock, retention
from dataset_format import layout
from tests.dataflow_sim import finish, plan, release
from tests.faults import FaultProxy
from tests.helpers import build, image_bytes, make_images

ARGS = ["--name", "night", "--num_shards", "1", "--splits", "train=1.0", "--no_transform",
        "--max_error_rate", "0.5"]


@pytest.fixture(scope="module")
def proxy(gcs):
    with FaultProxy(gcs.endpoint) as fault_proxy, pytest.MonkeyPatch.context() as mp:
        mp.setenv("STORAGE_EMULATOR_HOST", fault_proxy.url)
        yield fault_proxy
        fault_proxy.fail_clear()


@pytest.fixture
def inputs(proxy, gcs, tmp_path):
    """Six images on gs:// and a dataset root beside them -> (input prefix, root)."""
    bucket = gcs.create_bucket()
    make_images(tmp_path / "in", {"cat": 3, "dog": 3})
    src = f"gs://{bucket}/in"
    gcs.upload_tree(tmp_path / "in", src)
    yield src, f"gs://{bucket}/out"
    proxy.fail_clear()


def test_storage_errors_are_told_from_faults_of_the_image():
    transient = [exceptions.TooManyRequests("slow down"), exceptions.ServiceUnavailable("503"),
                 exceptions.RetryError("deadline", cause=exceptions.TooManyRequests("429")),
                 ConnectionResetError(104, "reset"), TimeoutError("read timed out")]
    image_faults = [exceptions.NotFound("gone"), exceptions.Forbidden("403"),
                    gcs_store.GenerationGone("gs://b/x: generation 7 is gone"), ValueError("x")]
    assert [gcs_store.is_transient(e) for e in transient] == [True] * len(transient)
    assert [gcs_store.is_transient(e) for e in image_faults] == [False] * len(image_faults)


@pytest.mark.slow
def test_an_input_rewritten_after_listing_is_rejected_as_changed_and_the_next_night_takes_it(
        inputs, gcs):
    src, root = inputs
    job = plan(["--input", src, "--output", root, *ARGS])
    changed = f"{src}/cat/001.jpg"
    gcs.upload_bytes(changed, image_bytes((230, 30, 30)))  # a new generation; the listed one is gone
    results = [job.attempt(task) for task in job.tasks]
    errors = [e for r in results for e in r.errors]
    assert [(e.uri, e.reason) for e in errors] == [(changed, "changed_during_build")]
    assert "it changed during the build (the next build reads it)" in errors[0].detail
    manifest = job.commit(results)
    assert manifest["accounting"]["written"] == 5 and manifest["errors"]["by_reason"] == {
        "changed_during_build": 1}
    night2 = build(src, root, *ARGS)  # lists the new generation and stores it
    assert night2["manifest"]["accounting"]["written"] == 6
    assert night2["manifest"]["errors"]["count"] == 0


@pytest.mark.slow
def test_429s_past_the_retry_deadline_fail_the_bundle_and_its_retry_writes_every_image(
        inputs, proxy, monkeypatch):
    src, root = inputs
    job = plan(["--input", src, "--output", root, *ARGS])
    (task,) = job.tasks
    monkeypatch.setattr(gcs_store, "READ_DEADLINE", 1.0)  # GCS's is 120 s
    proxy.fail("in/dog/001.jpg", 429)  # throttled for longer than the deadline
    with pytest.raises(Exception) as failed:
        job.attempt(task)
    assert gcs_store.is_transient(failed.value), failed.value  # not an "unreadable" image
    proxy.fail_clear()
    retried = job.attempt(task)  # the runner retries the bundle once GCS answers again
    assert (retried.written.num_examples, retried.errors) == (6, ())
    manifest = job.commit([retried])
    assert manifest["accounting"]["written"] == 6 and manifest["errors"]["count"] == 0


@pytest.mark.slow
def test_an_exceeded_error_budget_fails_every_retry_the_same_way_and_frees_the_root(
        inputs, gcs):
    src, root = inputs
    gcs.upload_bytes(f"{src}/dog/broken.jpg", b"not an image")
    job = plan(["--input", src, "--output", root, *ARGS, "--max_error_rate", "0"])
    results = [job.attempt(task) for task in job.tasks]
    messages = []
    for _ in range(4):  # Dataflow runs a failing work item four times
        with pytest.raises(commit.ErrorRateExceeded) as failed:
            job.commit(results)
        messages.append(str(failed.value))
    assert messages == [messages[0]] * 4  # not LockLost from the second try on
    assert messages[0].startswith("1 of 7 inputs rejected (14.3%) exceeds --max_error_rate 0;")
    assert not gcs.exists(lock.lock_path(root))  # released: the next night is not blocked
    plan(["--input", src, "--output", root, *ARGS])  # ... and takes the lock at once


@pytest.mark.slow
def test_a_cleanup_the_bucket_refuses_is_a_warning_in_the_summary_not_a_failed_build(
        inputs, gcs, proxy, capsys):
    src, root = inputs
    keep = ["--keep_versions", "1", "--keep_superseded_hours", "0"]
    first = build(src, root, *ARGS)  # the third build's cleanup deletes this one
    gcs.upload_bytes(f"{src}/owl/000.jpg", image_bytes((200, 200, 40)))
    second = build(src, root, *ARGS)  # keeps every version
    gcs.upload_bytes(f"{src}/owl/001.jpg", image_bytes((201, 200, 40)))
    for held in (first, second):  # retained objects (a retention policy): deletes refused
        proxy.fail(f"out/versions/{held['version']}/", 403, method="DELETE")
    capsys.readouterr()
    third = build(src, root, *ARGS, *keep)  # published, though its cleanup was refused
    assert gcs.read_json(f"{root}/LATEST")["version"] == third["version"]
    out = capsys.readouterr().out
    assert (f"warning: the cleanup could not delete version(s) {first['version']} (a retention "
            "policy, or no delete permission?); published anyway") in out
    proxy.fail_clear()
    assert first["version"] in retention.prune(root, third["version"], 1, 0)


def both_at_once(job, task, mine_storage, zombie_storage, gate):
    """One shard's DoFn in this process (through `mine_storage`) and in another, a zombie on
    another worker (through `zombie_storage`), truly concurrent: the zombie starts once it
    has imported Beam and set up, and each attempt's shard upload is held until both have
    begun theirs -> (mine, theirs)."""
    barrier = threading.Barrier(2, timeout=120)
    name = layout.shard_name(job.spec.name, task.split, task.shard,
                             job.spec.num_shards[task.split])
    upload = re.escape(name) + r'(\.[0-9a-f]{12})?"'  # the file at NAME or NAME.ATTEMPT,
    for storage in (mine_storage, zombie_storage):    # not its index or catalog fragment
        storage.hold(upload, barrier)
    zombie = job.attempt_elsewhere(task, {"STORAGE_EMULATOR_HOST": zombie_storage.url}, gate)
    release(zombie, gate)
    mine = job.attempt(task)
    theirs = finish(zombie)
    ((mine_in, mine_out, _),), ((their_in, their_out, _),) = (mine_storage.held,
                                                              zombie_storage.held)
    assert mine_out is not None and their_out is not None, "an attempt never uploaded"
    assert max(mine_in, their_in) < min(mine_out, their_out)  # both writing at one moment
    return mine, theirs


@pytest.mark.slow
@pytest.mark.parametrize("committed", ["winner", "loser"])
def test_a_zombie_attempt_with_other_bytes_overwrites_nothing_and_the_manifest_matches_the_bucket(
        inputs, gcs, proxy, tmp_path, committed):
    """One shard's DoFn twice at once: this process, and a zombie on another worker (a
    separate process) whose storage path no longer finds one image's listed generation (404:
    it changed during the build, so its shard holds one record less; a 403 would be no
    image fault: its attempt would fail, store/transient.py). The first to finish puts the shard at its final name; the
    other cannot overwrite it and keeps its own copy. Whichever attempt Dataflow commits,
    the published manifest describes the object in the bucket."""
    src, root = inputs
    job = plan(["--input", src, "--output", root, *ARGS])
    (task,) = job.tasks
    with FaultProxy(gcs.endpoint) as zombie_storage:  # open until the end: the emulator's
        zombie_storage.fail("in/dog/002.jpg", 404)     # mediaLinks name the proxy they came by
        mine, theirs = both_at_once(job, task, proxy, zombie_storage, tmp_path / "gate")
        check_zombie_outcome(job, gcs, mine, theirs, committed)


@pytest.mark.slow
@pytest.mark.parametrize("committed", ["winner", "loser"])
def test_a_copied_shard_written_by_two_attempts_at_once_publishes_what_the_bucket_holds(
        inputs, gcs, proxy, tmp_path, committed):
    """An incremental night: one input deleted, so its shard's surviving records are copied
    from the previous version (a "copy" task) and the other shard is reused. The copy task
    runs twice at once; the zombie's storage does not find the previous shard (its records
    are converted again from their inputs) and does not find one of those inputs (rejected). The reuse task
    runs twice at once too, in two threads. Whichever copy attempt is committed, every
    shard's manifest entry is the object in the bucket, and every input is written or
    rejected with a reason."""
    src, root = inputs
    args = [*ARGS[:2], "--num_shards", "2", *ARGS[4:]]
    first = build(src, root, *args)
    bucket = src[len("gs://"):].split("/")[0]
    gcs.client.bucket(bucket).blob("in/cat/000.jpg").delete()
    job = plan(["--input", src, "--output", root, *args])
    (copy_task,) = [t for t in job.tasks if t.kind == Kind.COPY]
    header, kept = reuse.read_task(copy_task.listing, job.spec.previous_vdir)
    refused = kept[0].uri.split("/", 3)[3]
    with FaultProxy(gcs.endpoint) as zombie_storage:
        # The previous shard gone for the zombie (a 403 or a 503 would be no damage: its
        # task would fail and be retried, store/transient.py)
        zombie_storage.fail(f"out/versions/{first['version']}/{header['source']}", 404)
        zombie_storage.fail(refused, 404)  # (a 403 fails the attempt: not the image's)
        mine, theirs = both_at_once(job, copy_task, proxy, zombie_storage, tmp_path / "gate")
    (reuse_task,) = [t for t in job.tasks if t is not copy_task]
    assert reuse_task.kind == Kind.REUSE
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # two attempts in one worker
        reused = list(pool.map(job.attempt, [reuse_task] * 2))
    assert reused[0].written.num_examples == reused[1].written.num_examples > 0
    assert reused[0].written == reused[1].written
    # Both attempts share the previous version's file: neither writes a shard.
    assert reused[0].files.shared == reused[1].files.shared and reused[0].files.shared.startswith(
        f"../{first['version']}/")
    others = reused[:1]
    assert (mine.written.num_examples, theirs.written.num_examples) == (len(kept), len(kept) - 1)
    assert [e.reason for e in theirs.errors] == ["damaged_record"]
    final = f"{job.spec.vdir}/{mine.files.path}"
    winner, loser = sorted((mine, theirs), key=lambda r: r.files.temp != final)
    assert winner.files.temp == final and loser.files.temp.startswith(f"{job.spec.tmp_dir}/")
    assert _object(gcs, final) == (winner.written.num_bytes,  # not overwritten
                                   winner.written.crc32c)
    chosen = winner if committed == "winner" else loser
    manifest = job.commit([chosen, *others])
    shards = manifest["splits"]["train"]["shards"]
    for entry in shards:  # the reused shard is shared: named where the first version wrote it
        assert (entry["num_bytes"], entry["crc32c"]) == _object(
            gcs, layout.shard_file(job.spec.vdir, entry["path"])), entry
    assert [e["path"].startswith(f"../{first['version']}/") for e in shards].count(True) == 1
    written, rejected = manifest["accounting"]["written"], manifest["errors"]["count"]
    assert written == sum(r.written.num_examples for r in (chosen, *others)) == manifest[
        "catalog"]["rows"]
    assert (written + rejected, rejected) == (5, len(chosen.errors))  # 6 inputs, one deleted


def _object(gcs, uri):
    """(size, crc32c) of a bucket object, from its metadata."""
    bucket, name = uri[len("gs://"):].split("/", 1)
    blob = gcs.client.bucket(bucket).get_blob(name)
    return blob.size, blob.crc32c


def check_zombie_outcome(job, gcs, mine, theirs, committed):
    assert (mine.written.num_examples, theirs.written.num_examples) == (6, 5)
    assert [e.reason for e in theirs.errors] == ["changed_during_build"]
    final = f"{job.spec.vdir}/{mine.files.path}"
    winner, loser = sorted((mine, theirs), key=lambda r: r.files.temp != final)
    assert winner.files.temp == final and loser.files.temp.startswith(f"{job.spec.tmp_dir}/")
    bucket, name = final[len("gs://"):].split("/", 1)
    in_bucket = gcs.client.bucket(bucket).get_blob(name)
    assert (in_bucket.size, in_bucket.crc32c) == (winner.written.num_bytes,  # untouched
                                                  winner.written.crc32c)
    chosen = winner if committed == "winner" else loser
    manifest = job.commit([chosen])
    (entry,) = manifest["splits"]["train"]["shards"]
    in_bucket = gcs.client.bucket(bucket).get_blob(name)  # commit renamed the loser's over it
    assert (entry["num_bytes"], entry["crc32c"]) == (in_bucket.size, in_bucket.crc32c)
    assert (entry["num_examples"], manifest["catalog"]["rows"]) == (
        chosen.written.num_examples,) * 2
    assert manifest["errors"]["count"] == len(chosen.errors)


@pytest.mark.slow
def test_a_hung_job_past_max_hours_loses_the_lock_to_the_next_nights_launch(inputs, gcs):
    """The job's workers keep beating the lock (a hung job: alive, never finishing). Before
    its --max_hours the next launch exits with LockHeld; after it, the next launch takes
    the lock, and the hung job, should it ever reach its commit, publishes nothing."""
    src, root = inputs
    bound = 6.0  # seconds: --max_hours 6/3600
    hung = plan(["--input", src, "--output", root, *ARGS, "--max_hours", str(bound / 3600)])
    started = time.monotonic()
    lock.keep_alive(root, hung.spec.version)  # what its workers do while they live
    try:
        gcs.upload_bytes(f"{src}/owl/000.jpg", image_bytes((200, 200, 40)))  # the next night
        with pytest.raises(lock.LockHeld) as held:
            plan(["--input", src, "--output", root, *ARGS])
        assert f"locked by version {hung.spec.version}" in str(held.value)
        assert "(--max_hours) in any case" in str(held.value)
        time.sleep(max(0.0, bound + 1 - (time.monotonic() - started)))
        night2 = plan(["--input", src, "--output", root, *ARGS])  # takes the lock over
        with pytest.raises(lock.LockLost):
            hung.commit([hung.attempt(task) for task in hung.tasks])
        manifest = night2.commit([night2.attempt(task) for task in night2.tasks])
    finally:
        lock.stop_keep_alive()
    assert gcs.read_json(f"{root}/LATEST")["version"] == night2.spec.version
    assert manifest["accounting"]["written"] == 7
