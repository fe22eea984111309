"""Transient is never damage: a read that fails without proving the file damaged (503, 429,
403, a timeout; EIO on a local root) stops the build with exit 1 and one line, nothing
published; a blip shorter than the retries gives the right version. Only proven damage
(missing, not parseable) is gone around. Faults come from tests/faults.py's proxy in front
of the GCS emulator, on each read the launcher makes, with the retry deadline and the
request timeout cut to a second so each failed build takes seconds.
"""

import errno
import json
import os
import re

import pytest
from google.api_core import exceptions
from google.auth import exceptions as auth_exceptions

from beam_pipeline import cli
from beam_pipeline.store import gcs as gcs_store
from beam_pipeline.store import transient, versions
from dataset_format import dataset_info, layout, storage
from tests.faults import FaultProxy
from tests.helpers import image_bytes, noise_image

ARGS = ["--name", "pets", "--target_shard_mb", "0.002", "--no_transform",
        "--splits", "train=0.6,validation=0.2,test=0.2", "--max_error_rate", "0.5",
        "--max_delta_share", "1"]  # every night an increment: unchanged shards shared


# --- the classifier ---------------------------------------------------------------------------

@pytest.mark.parametrize("error, is_transient, is_damage", [
    (exceptions.ServiceUnavailable("503"), True, False),
    (exceptions.TooManyRequests("429"), True, False),
    (exceptions.Forbidden("403"), True, False),           # credentials: not the file's fault
    (exceptions.Unauthorized("401"), True, False),
    (auth_exceptions.RefreshError("401, then no new token"), True, False),
    (auth_exceptions.InvalidOperation("Anonymous credentials cannot be refreshed."), True,
     False),  # a ValueError, but the credentials'
    (exceptions.RetryError("deadline", exceptions.ServiceUnavailable("503")), True, False),
    (TimeoutError("timed out"), True, False),
    (OSError(errno.EIO, "Input/output error"), True, False),
    (OSError(errno.ESTALE, "Stale file handle"), True, False),
    (OSError(errno.ENOTCONN, "Transport endpoint is not connected"), True, False),
    (PermissionError(errno.EACCES, "Permission denied"), True, False),
    (FileNotFoundError(errno.ENOENT, "No such file"), False, True),
    (exceptions.NotFound("404"), False, True),
    (json.JSONDecodeError("Expecting value", "{", 1), False, True),
    (KeyError("version"), False, True),
    (OSError("Parquet magic bytes not found in footer"), False, True),  # pyarrow, no errno
])
def test_the_classifier_tells_transient_from_damage(error, is_transient, is_damage):
    assert transient.is_transient(error) is is_transient
    assert transient.is_damage(error) is is_damage


def test_a_cause_that_is_transient_is_never_damage():
    try:
        try:
            raise exceptions.ServiceUnavailable("503")
        except Exception as e:
            raise ValueError("could not parse") from e
    except ValueError as wrapped:
        assert transient.is_transient(wrapped) and not transient.is_damage(wrapped)


def test_local_outages_are_retried_with_backoff_then_fail_naming_the_file():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise OSError(errno.ESTALE, "Stale file handle")
        return b"ok"

    assert transient.retrying(flaky, "/nfs/root/LATEST", seconds=5) == b"ok"
    assert len(calls) == 3

    def down():
        raise OSError(errno.EIO, "Input/output error")

    with pytest.raises(transient.StorageUnavailable, match=r"cannot read /nfs/root/LATEST "
                       r"\(OSError: \[Errno 5\] Input/output error\)"):
        transient.retrying(down, "/nfs/root/LATEST", seconds=0.3)
    with pytest.raises(FileNotFoundError):  # damage: the caller goes around it
        transient.retrying(lambda: open("/nonexistent/LATEST"), "LATEST", seconds=5)


def test_a_local_input_that_is_not_ours_to_read_is_rejected_by_the_job_not_the_night(tmp_path):
    from beam_pipeline.launcher import same_bytes

    assert same_bytes.input_sha256(str(tmp_path / "gone.jpg")) is None  # vanished
    if os.geteuid() == 0:
        return  # root reads a mode-000 file: no EACCES to see
    path = tmp_path / "x.jpg"
    path.write_bytes(b"abc")
    path.chmod(0)
    assert same_bytes.input_sha256(str(path)) is None  # EACCES: the shard writer rejects it


# --- through the emulator: every read the launcher makes --------------------------------------

@pytest.fixture(scope="module")
def proxy(gcs):
    with FaultProxy(gcs.endpoint) as fault_proxy, pytest.MonkeyPatch.context() as mp:
        mp.setenv("STORAGE_EMULATOR_HOST", fault_proxy.url)
        yield fault_proxy


@pytest.fixture
def short_retries(monkeypatch):
    """Retries give up after ~1 s, a request after 0.5 s (google-cloud-storage: 120 s, 60 s)."""
    for module in (gcs_store, storage):
        monkeypatch.setattr(module, "READ_DEADLINE", 1.0)
        monkeypatch.setattr(module, "REQUEST_TIMEOUT", 0.5)
    monkeypatch.setattr(transient, "RETRY_SECONDS", 1.0)


@pytest.fixture(scope="module")
def night(proxy, gcs, tmp_path_factory):
    """24 images on gs:// built into V1 -> (input prefix, root, V1's {sha256: split})."""
    bucket = gcs.create_bucket()
    src, root = f"gs://{bucket}/in", f"gs://{bucket}/ds"
    for i in range(24):
        gcs.upload_bytes(f"{src}/{'cat' if i % 2 else 'dog'}/{i:03d}.jpg",
                         image_bytes((9 * i % 256, 40, 200 - 5 * i), (40, 32)))
    assert cli.main(["--input", src, "--output", root, *ARGS]) == 0
    latest = gcs.read_json(f"{root}/{layout.LATEST}")["version"]
    return src, root, _splits(gcs, f"{root}/versions/{latest}")


_added = iter(range(100, 200))


def add_image(gcs, src):
    """One more image tonight (each test its own, so each build has work to do)."""
    import io

    i = next(_added)
    data = io.BytesIO()
    noise_image((40, 32), 40, seed=i).save(data, "JPEG", quality=90)  # bytes like no other
    gcs.upload_bytes(f"{src}/cat/{i:03d}.jpg", data.getvalue())


def latest_of(gcs, root):
    return gcs.read_json(f"{root}/{layout.LATEST}")["version"]


def _splits(gcs, vdir):
    """{input sha256: split} of a version's catalog, read straight from the bucket."""
    import io

    import pyarrow.parquet as pq

    table = pq.read_table(io.BytesIO(gcs.read(f"{vdir}/{layout.CATALOG}")))
    return dict(zip(table["input_sha256"].to_pylist(), table["split"].to_pylist()))


def _target(what, v1):
    """The text in the request path of each read the launcher makes (`v1`: the version
    LATEST names)."""
    return {"LATEST": "ds/LATEST",
            "manifest": f"ds/versions/{v1}/{layout.MANIFEST}",
            "catalog": f"ds/versions/{v1}/{layout.CATALOG}",
            "split map": f"ds/versions/{v1}/{layout.SPLIT_MAP}",
            "an input's hash": "in/cat/005.jpg",
            "an index": ".index"}[what]


CASES = [("LATEST", 503), ("manifest", 429), ("catalog", 403), ("split map", "timeout"),
         ("catalog", 503), ("split map", 403), ("LATEST", "timeout"), ("manifest", 403),
         ("an input's hash", 503), ("an input's hash", 403), ("an index", 429),
         ("an index", "timeout")]


@pytest.mark.slow
@pytest.mark.parametrize("what, status", CASES)
def test_a_storage_outage_on_a_read_of_the_root_fails_the_night_with_exit_1(
        night, proxy, gcs, short_retries, capsys, what, status):
    """Before: a 503 or 403 on V1's catalog for longer than the retries published a full
    rebuild (every image converted again); on the split map, exit 2; on an input's hash, a
    renamed image could move to its key's split; on an index, a shared shard was copied."""
    src, root, _ = night
    v1 = latest_of(gcs, root)
    if what == "an index":  # read only by an incremental build's reuse tasks
        add_image(gcs, src)
    verify = ["--verify_inputs"] if what == "an input's hash" else []
    proxy.fail(_target(what, v1), status, method="GET")
    try:
        code = cli.main(["--input", src, "--output", root, *ARGS, *verify])
        hits = list(proxy.forced_hits)
    finally:
        proxy.fail_clear()
    assert hits and {h[0] for h in hits} == {status}, hits  # the fault was met
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error")]
    assert code == 1, err
    assert len(lines) == 1 and lines[0].startswith("error: build failed: "), err
    if what != "an index":  # the launcher names what it read (the versions' listing reads
        # each manifest's metadata first)
        named = _target(what, v1)
        assert "cannot read gs://" in lines[0], lines[0]
        assert named in lines[0] or named.replace("/", "%2F") in lines[0], lines[0]
    assert "Traceback" not in err and "converted again" not in err
    assert latest_of(gcs, root) == v1  # nothing published


@pytest.mark.slow
@pytest.mark.parametrize("what", ["LATEST", "manifest", "catalog", "split map", "an index"])
def test_a_blip_shorter_than_the_retries_builds_the_right_version(night, proxy, gcs, monkeypatch,
                                                                  what):
    src, root, before = night
    v1 = latest_of(gcs, root)
    published = _splits(gcs, f"{root}/versions/{v1}")
    add_image(gcs, src)
    for module in (gcs_store, storage):  # long enough for two 503s, then the answer
        monkeypatch.setattr(module, "READ_DEADLINE", 20.0)
    proxy.fail(_target(what, v1), 503, times=2, method="GET")
    try:
        result = cli.run(["--input", src, "--output", root, *ARGS])
        hits = list(proxy.forced_hits)
    finally:
        proxy.fail_clear()
    assert len(hits) == 2, hits  # both 503s met, then retried
    assert result.status == "published"
    after = _splits(gcs, result.version_dir)
    assert {s: after[s] for s in before} == before  # no split changed
    new = len(after) - len(published)
    assert new >= 1 and result.manifest["build"]["converted"] == new  # no full rebuild
    shared = [sh["path"] for s in result.manifest["splits"].values() for sh in s["shards"]
              if sh["path"].startswith(layout.SHARED_PREFIX)]
    assert shared, "unchanged shards are shared, not copied"
    assert not result.manifest["split_map"]["notes"]  # nothing was gone around


@pytest.mark.slow
def test_proven_damage_is_still_gone_around_loudly(night, gcs, capsys):
    """A catalog that is not Parquet is damage: named, and the build goes on without reuse
    (its splits still hold), as before."""
    src, root, before = night
    vdir = f"{root}/versions/{latest_of(gcs, root)}"
    good = gcs.read(f"{vdir}/{layout.CATALOG}")
    gcs.upload_bytes(f"{vdir}/{layout.CATALOG}", b"PAR1 not really")
    try:
        result = cli.run(["--input", src, "--output", root, *ARGS, "--force"])
    finally:
        gcs.upload_bytes(f"{vdir}/{layout.CATALOG}", good)
    err = capsys.readouterr().err
    assert f"{vdir}/{layout.CATALOG}: unreadable" in err and "converted again" in err
    after = _splits(gcs, result.version_dir)
    assert {s: after[s] for s in before} == before


@pytest.mark.slow
def test_a_latest_naming_a_missing_version_on_gcs_is_replaced(night, gcs, capsys):
    """The compare-and-swap publish replaces a LATEST whose version has no manifest (an id
    from a clock that ran ahead), as the local one does."""
    src, root, before = night
    previous = latest_of(gcs, root)
    gcs.upload_bytes(f"{root}/{layout.LATEST}",
                     json.dumps(layout.latest_record("29991231T235959Z")).encode())
    add_image(gcs, src)
    result = cli.run(["--input", src, "--output", root, *ARGS])
    assert "LATEST names version 29991231T235959Z" in capsys.readouterr().err
    assert latest_of(gcs, root) == result.version > previous
    after = _splits(gcs, result.version_dir)
    assert {s: after[s] for s in before} == before


# --- the job's reads, listings and checks: a failure that proves nothing fails the night -----

@pytest.fixture
def patient_retries(monkeypatch):
    """Retries give up after 3 s, a request after 2 s: past a "timeout" answer (5 s), but
    not so short that a build's many parallel reads on a busy 2-core machine time out."""
    for module in (gcs_store, storage):
        monkeypatch.setattr(module, "READ_DEADLINE", 3.0)
        monkeypatch.setattr(module, "REQUEST_TIMEOUT", 2.0)
    monkeypatch.setattr(transient, "RETRY_SECONDS", 3.0)


def _raises_naming(proxy, target, status, named, attempt):
    """`attempt()` while GETs of `target` answer `status`: StorageUnavailable, its line
    "cannot read NAMED (...STATUS...)"."""
    proxy.fail(target, status, method="GET")
    try:
        with pytest.raises(transient.StorageUnavailable,
                           match=rf"^cannot read {re.escape(named)} \(.*{status}"):
            attempt()
    finally:
        proxy.fail_clear()

def _failed_night(proxy, gcs, capsys, argv, target, status, code=1):
    """Run a build with requests whose target holds `target` answered `status` -> its one
    error line (asserted: the exit `code`, one line, no traceback, the fault met). The
    failed build's version is deleted after (its finished shards would be the next
    night's to look into, and that is not what these tests are about)."""
    root = argv[argv.index("--output") + 1]
    before = latest_of(gcs, root)
    proxy.fail(target, status, method="GET")
    try:
        got = cli.main(argv)
        hits = list(proxy.forced_hits)
    finally:
        proxy.fail_clear()
        for version in _unpublished(gcs, root, before):
            for uri in gcs.list(f"{root}/versions/{version}/"):
                _delete(gcs, uri)
    assert hits and {h[0] for h in hits} == {status}, hits
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error")]
    assert got == code, err
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _unpublished(gcs, root, since):
    """The version directories under `root` newer than `since` (a failed build's)."""
    names = {uri[len(f"{root}/versions/"):].split("/")[0]
             for uri in gcs.list(f"{root}/versions/")}
    return sorted(v for v in names if v > since)


@pytest.mark.slow
@pytest.mark.parametrize("status", [403, 401, 503, 429, "timeout"])
def test_an_input_the_job_cannot_read_fails_the_night_and_blames_no_image(
        night, proxy, gcs, patient_retries, capsys, status):
    """Before: a 403 on an input was that image's row in errors.jsonl, counted against
    --max_error_rate (a wrong credential on a whole bucket ended as exit 3, "retry won't
    help", after writing its rows). A credential, an outage or a timeout says nothing about
    the image: exit 1, one line naming the object and the status, nothing published."""
    src, root, _ = night
    v1 = latest_of(gcs, root)
    add_image(gcs, src)
    new = sorted(gcs.list(f"{src}/cat/"))[-1]  # the image only tonight's job reads
    line = _failed_night(proxy, gcs, capsys, ["--input", src, "--output", root, *ARGS],
                         new[len("gs://"):].split("/", 1)[1], status)
    assert line.startswith(f"error: build failed: cannot read {new} ("), line
    if status == 401:  # the client asks for new credentials first: the emulator's are
        assert "credentials" in line, line  # anonymous (InvalidOperation), GCS's RefreshError
    elif status != "timeout":
        assert str(status) in line, line
    assert latest_of(gcs, root) == v1  # nothing published
    for version in _unpublished(gcs, root, v1):  # ... and no row blames the image
        for uri in gcs.list(f"{root}/versions/{version}/"):
            if "errors" in uri.rsplit("/", 1)[-1]:
                assert new.encode() not in gcs.read(uri), uri


@pytest.mark.slow
@pytest.mark.parametrize("status", [403])  # (503s: each of 8 tasks retries; index cases above)
def test_a_stored_shard_the_job_cannot_read_fails_the_night_instead_of_copying_it(
        night, proxy, gcs, patient_retries, capsys, status):
    """An incremental night reads each unchanged shard's metadata (is it the manifest's?)
    and index: a failure that proves nothing fails the task, naming the file; it does not
    copy (or convert) the shard's records as if it were damaged."""
    src, root, _ = night
    v1 = latest_of(gcs, root)
    add_image(gcs, src)
    line = _failed_night(proxy, gcs, capsys, ["--input", src, "--output", root, *ARGS],
                         ".tfrecord-", status)
    assert line.startswith(f"error: build failed: cannot read {root}/versions/"), line
    assert ".tfrecord-" in line and str(status) in line, line
    assert latest_of(gcs, root) == v1


@pytest.mark.slow
@pytest.mark.parametrize("status", [503, 403])
def test_a_failed_runs_shards_that_cannot_be_listed_fail_the_night_not_its_resume(
        night, proxy, gcs, patient_retries, capsys, caplog, status):
    """Before: the listing of a failed run's finished shards answered "none" on any error,
    so the night converted every image that run had finished again."""
    src, root, _ = night
    v1 = latest_of(gcs, root)
    published = _splits(gcs, f"{root}/versions/{v1}")
    failed = versions.new_version_id()  # an unpublished version newer than LATEST
    junk = f"{root}/versions/{failed}/.tmp/{ARGS[1]}-train-00000.0{layout.FRAGMENT_SUFFIX}"
    gcs.upload_bytes(junk, b"not Parquet")  # damage: "not resumable", once it is listed
    add_image(gcs, src)
    try:
        line = _failed_night(proxy, gcs, capsys, ["--input", src, "--output", root, *ARGS],
                             f"versions/{failed}/.tmp/", status)
        assert line.startswith("error: build failed: cannot read the listing of "
                               f"{root}/versions/{failed}/.tmp/*{layout.FRAGMENT_SUFFIX} ("), line
        assert latest_of(gcs, root) == v1
        gcs.upload_bytes(junk, b"not Parquet")  # (_failed_night deleted the failed version)
        result = cli.run(["--input", src, "--output", root, *ARGS])  # storage answers again
        new = len(_splits(gcs, result.version_dir)) - len(published)
        assert result.status == "published" and result.manifest["build"]["converted"] == new
        assert f"{junk}: not resumable" in caplog.text  # the damaged fragment, named
    finally:
        _delete(gcs, junk)


@pytest.mark.slow
@pytest.mark.parametrize("status", [503, 403])
def test_the_versions_a_build_resumes_from_are_listed_or_it_fails(night, proxy, gcs,
                                                                  patient_retries, status):
    """versions.failed_runs: before, any listing error was "no failed run" (no resume)."""
    _, root, _ = night
    proxy.fail("prefix=ds/versions/", status, method="GET")
    try:
        with pytest.raises(transient.StorageUnavailable,
                           match=rf"^cannot read {root}/versions \(.*{status}"):
            versions.failed_runs(root, latest_of(gcs, root), None)
    finally:
        proxy.fail_clear()
    latest = latest_of(gcs, root)
    assert versions.failed_runs(root, latest, None) == tuple(
        f"{root}/versions/{v}" for v in reversed(_unpublished(gcs, root, latest)))[:3]


@pytest.mark.slow
@pytest.mark.parametrize("status, code", [(503, 1), ("timeout", 1), (403, 2), (401, 2)])
def test_a_label_file_out_of_reach_is_an_outage_not_a_wrong_command(
        night, proxy, gcs, patient_retries, capsys, status, code):
    """Before: any failure to read --label_file was exit 2 ("the command is wrong"), so a
    scheduler would not retry a night that met a 503. A 403 stays the command's."""
    src, root, _ = night
    labels = f"{src.rsplit('/', 1)[0]}/labels.txt"
    gcs.upload_bytes(labels, b"cat\ndog\n")
    line = _failed_night(proxy, gcs, capsys, ["--input", src, "--output", root, *ARGS,
                                         "--label_file", labels], "labels.txt", status, code)
    assert labels in line, line
    if status == 403:
        assert line.startswith(f"error: --label_file {labels}: cannot read it (403 "), line
    if status == 401:  # the emulator's anonymous credentials cannot be refreshed
        assert line.startswith(f"error: --label_file {labels}: cannot read it (Anonymous "
                               "credentials cannot be refreshed"), line


@pytest.mark.slow
@pytest.mark.parametrize("status", [503, 403])
def test_the_jobs_reads_of_the_previous_version_fail_naming_the_file(night, proxy, gcs,
                                                                      short_retries, tmp_path,
                                                                      status):
    """Before: a reuse task's kept rows, a fragment's rows and LATEST's id raised the storage
    client's own error (its text, not the file's name; a local EIO not retried)."""
    from beam_pipeline.job import reuse
    from beam_pipeline.store import catalog

    _, root, _ = night
    v1 = latest_of(gcs, root)
    vdir = f"{root}/versions/{v1}"
    listing = tmp_path / "listing.jsonl"
    listing.write_text('{"task": "reuse"}\n[0, "gs://elsewhere/0.jpg", 7, "s", null, null]\n')
    path = f"{vdir}/{layout.CATALOG}"
    reads = [(lambda: reuse.read_task(str(listing), vdir), _target("catalog", v1), path),
             (lambda: list(catalog.read_rows(path)), _target("catalog", v1), path),
             (lambda: versions.latest_id(root), _target("LATEST", v1), f"{root}/LATEST")]
    for read, target, named in reads:
        catalog._FOOTERS.clear()  # (a footer read before is not read again)
        _raises_naming(proxy, target, status, named, read)
    header, (row,) = reuse.read_task(str(listing), vdir)  # storage answers again
    assert header == {"task": "reuse"} and (row.uri, row.input_size) == ("gs://elsewhere/0.jpg", 7)
    assert row.input_sha256 in _splits(gcs, vdir) and versions.latest_id(root) == v1
    assert len(list(catalog.read_rows(path))) == len(_splits(gcs, vdir))


@pytest.mark.slow
def test_a_failed_runs_shard_that_cannot_be_checked_fails_its_resume_task_naming_it(
        proxy, gcs, short_retries, tmp_path):
    """attempts.share (a `resume` task, as Dataflow runs it: tests/dataflow_sim.py): before,
    a 503 or 403 on the failed run's shard or fragment raised the client's own text. Now the
    task fails naming the file, and its retry, once storage answers, shares the shard."""
    from beam_pipeline.job.contracts import Kind
    from beam_pipeline.store import lock
    from tests.dataflow_sim import plan
    from tests.helpers import make_images

    bucket = gcs.create_bucket()
    make_images(tmp_path / "in", {"cat": 4, "dog": 4})
    src, root = f"gs://{bucket}/in", f"gs://{bucket}/out"
    gcs.upload_tree(tmp_path / "in", src)
    args = ["--input", src, "--output", root, "--name", "night", "--num_shards", "2",
            "--splits", "train=1.0", "--no_transform"]
    failed = plan(args)
    done = failed.attempt(failed.tasks[0])  # then the job fails
    lock.release_submitted(root, failed.spec.version)
    again = plan(args)
    (task,) = [t for t in again.tasks if t.kind == Kind.RESUME]
    shard = f"{root}/versions/{failed.spec.version}/{done.files.path}"
    fragment = [u for u in gcs.list(f"{root}/versions/{failed.spec.version}/.tmp/")
                if u.endswith(layout.FRAGMENT_SUFFIX)]
    for status, target, named in [(503, shard, shard), (403, fragment[0], fragment[0])]:
        _raises_naming(proxy, target.split("/", 3)[3], status, named,
                       lambda: again.attempt(task))
    taken = again.attempt(task)
    assert taken.made.resumed
    assert taken.files.shared == f"../{failed.spec.version}/{done.files.path}"
    assert taken.written.num_examples == done.written.num_examples > 0


@pytest.mark.slow
@pytest.mark.parametrize("what, status", [("manifest", 403), ("manifest", 503),
                                          ("catalog", 403), ("catalog", "timeout")])
def test_verify_tells_a_read_that_failed_from_damage_and_from_not_a_dataset(
        night, proxy, gcs, short_retries, capsys, what, status):
    """Before: any error reading the manifest was "not a dataset" (exit 2) or a traceback,
    and a 503 on the catalog was reported as its damage ("unreadable"). Now: exit 1, one line
    naming the file; "not a dataset" only for a path with no manifest."""
    from beam_pipeline.tools import verify

    _, root, _ = night
    v1 = latest_of(gcs, root)
    proxy.fail(_target(what, v1), status, method="GET")
    try:
        code = verify.main([root])
        hits = list(proxy.forced_hits)
    finally:
        proxy.fail_clear()
    err = capsys.readouterr().err
    named = (f"the manifest of {root}" if what == "manifest"
             else f"{root}/versions/{v1}/{layout.CATALOG}")
    assert hits and code == 1, err
    assert err.startswith(f"error: cannot read {named} (") and err.count("\n") == 1, err
    assert "run verify again once storage answers" in err and "FAILED" not in err, err
    if status != "timeout":
        assert str(status) in err, err
    assert verify.main([f"{root}-nothing"]) == 2  # damage, of a kind: no dataset there
    assert "not a dataset" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("what, status", [("shard", 403), ("shard", 503), ("index", 403),
                                          ("index", 503)])
def test_verify_tells_an_outage_on_a_shard_or_index_from_its_damage(
        night, proxy, gcs, short_retries, capsys, what, status):
    """Before: verify read shards and `.index` files through tf.io.gfile, outside the
    project's storage layer: a 403 or 503 there was the file's damage in the report. Now:
    exit 1, one line "cannot read FILE (...)", no report; storage back, the same version
    verifies OK. (A persisting 503: past the 1 s retries.)"""
    from beam_pipeline.tools import verify

    _, root, _ = night
    shard = _last_shard(root)
    named = shard if what == "shard" else layout.index_name(shard)
    code, hits, err = _verify_while_failing(proxy, capsys, named, status, root)
    assert hits and code == 1, err
    assert err.startswith(f"error: cannot read {named} (") and err.count("\n") == 1, err
    assert "run verify again once storage answers" in err and "FAILED" not in err, err
    assert str(status) in err, err
    assert verify.main([root]) == 0, capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("what, status", [("shard", 403), ("shard", 503), ("index", 403),
                                          ("index", 503)])
def test_inspect_tells_an_outage_on_a_shard_or_index_in_one_line(
        night, proxy, gcs, short_retries, tmp_path, capsys, what, status):
    """Before: inspect_dataset read its samples' shards and `.index` files through
    tf.io.gfile, outside the project's storage layer: a 403 or 503 there was a traceback
    (after the client's own 120 s deadline). Now: exit 1 within the configured 1 s of
    retries, one line "cannot read FILE (...)"; storage back, the same call draws its
    sheets."""
    import time

    from beam_pipeline.tools import inspect_dataset

    _, root, _ = night
    shard = _last_shard(root)
    named = shard if what == "shard" else layout.index_name(shard)
    argv = [root, "--out", str(tmp_path), "--n", "100"]  # every record: every shard read
    proxy.fail(named.split("/", 3)[3] + "?", status, method="GET")  # that object alone
    started = time.monotonic()
    try:
        code = inspect_dataset.main(argv)
        hits = list(proxy.forced_hits)
    finally:
        proxy.fail_clear()
    took = time.monotonic() - started
    err = capsys.readouterr().err
    assert hits and code == 1, err
    assert err.startswith(f"error: cannot read {named} (") and err.count("\n") == 1, err
    assert str(status) in err and "run inspect_dataset again once storage answers" in err, err
    assert took < 90, took  # the configured 1 s of retries, not the client's own 120 s
    assert inspect_dataset.main(argv) == 0, capsys.readouterr().err
    assert (tmp_path / inspect_dataset.CONTACT_SHEET).stat().st_size > 0


@pytest.mark.slow
def test_an_outage_while_verify_writes_its_advice_is_exit_1_not_other_advice(
        night, proxy, gcs, short_retries, tmp_path, capsys):
    """After a FAILED report (a shard gone), verify's advice asks which files are missing and
    whether the version sits in its root (LATEST). A 503 on that last question used to end
    in a traceback after the client's own 120 s retry deadline. Now: exit 1 within the
    configured retries, one line "cannot read .../LATEST (...)", and no advice built on an
    unanswered question."""
    from beam_pipeline.tools import verify

    _, root, _ = night
    _delete(gcs, _last_shard(root))
    vdir, _ = dataset_info.load_manifest(root)
    latest = layout.join(root, layout.LATEST)
    code, hits, err = _verify_while_failing(proxy, capsys, latest, 503, vdir)
    assert hits and code == 1, err
    assert f"error: cannot read {latest} (" in err and "partial copy" not in err, err
    assert verify.main([vdir]) == 1
    err = capsys.readouterr().err
    assert "missing (the manifest lists it)" in err and "build again with --force" in err, err
    from beam_pipeline.tools import inspect_dataset  # the same damage, as inspect meets it

    assert inspect_dataset.main([vdir, "--out", str(tmp_path), "--n", "100"]) == 1
    err = capsys.readouterr().err  # (it was the client's NotFound, a traceback)
    assert err == (f"error: {_last_shard(root)} is missing: the version is damaged (python -m "
                   f"beam_pipeline.tools.verify names what else is)\n"), err


def test_a_local_listing_that_fails_is_not_an_empty_one(tmp_path):
    """files.objects: glob (and Beam's local match) lists a folder it cannot read as empty."""
    from beam_pipeline.store import files

    (tmp_path / "v" / ".tmp" / "sub").mkdir(parents=True)
    for name in ("a.x", "b.x", ".hidden.x", "c.y", "sub/d.x"):
        (tmp_path / "v" / ".tmp" / name).write_bytes(b"1")
    assert files.objects(f"{tmp_path}/v/.tmp/*.x") == [f"{tmp_path}/v/.tmp/{n}"
                                                       for n in ("a.x", "b.x")]
    assert files.objects(f"{tmp_path}/v/**") == [f"{tmp_path}/v/.tmp/{n}" for n in
                                                 ("a.x", "b.x", "c.y", "sub/d.x")]
    assert files.objects(f"{tmp_path}/gone/*.x") == []  # nothing there: nothing matches
    if os.geteuid() == 0:
        return  # root lists a mode-000 folder
    (tmp_path / "v" / ".tmp").chmod(0)
    try:
        with pytest.raises(transient.StorageUnavailable,
                           match=rf"cannot read the listing of {tmp_path}/v/\.tmp/\*\.x "
                                 r"\(PermissionError: \[Errno 13\]"):
            files.objects(f"{tmp_path}/v/.tmp/*.x")
    finally:
        (tmp_path / "v" / ".tmp").chmod(0o755)


def _last_shard(root):
    vdir, manifest = dataset_info.load_manifest(root)
    return sorted(sh.path for s in dataset_info.from_manifest(vdir, manifest).splits.values()
                  for sh in s.shards)[-1]


def _verify_while_failing(proxy, capsys, uri, status, path):
    """verify PATH while every GET of URI answers STATUS: (exit code, forced hits, stderr)."""
    from beam_pipeline.tools import verify

    proxy.fail(uri.split("/", 3)[3] + "?", status, method="GET")  # that object, not its index
    try:
        code = verify.main([path])
        hits = list(proxy.forced_hits)
    finally:
        proxy.fail_clear()
    return code, hits, capsys.readouterr().err


def _delete(gcs, uri):
    bucket, name = gcs.split(uri)
    if gcs.exists(uri):
        gcs.client.bucket(bucket).blob(name).delete()


def _one_task_job(gcs, tmp_path):
    """6 seeded images in a fresh bucket, planned as one shard's task (tests/dataflow_sim.py):
    (input, root, job, its task)."""
    from tests.dataflow_sim import plan
    from tests.helpers import make_images

    bucket = gcs.create_bucket()
    make_images(tmp_path / "in", {"cat": 3, "dog": 3})
    src, root = f"gs://{bucket}/in", f"gs://{bucket}/out"
    gcs.upload_tree(tmp_path / "in", src)
    job = plan(["--input", src, "--output", root, "--name", "night", "--num_shards", "1",
                "--splits", "train=1.0", "--no_transform", "--max_error_rate", "0"])
    (task,) = job.tasks
    return src, root, job, task


@pytest.mark.slow
@pytest.mark.parametrize("status", [403, 503])
def test_a_work_item_that_cannot_read_an_input_fails_and_its_retry_writes_every_image(
        proxy, gcs, patient_retries, tmp_path, status):
    """The shard writer DoFn as Dataflow runs it (tests/dataflow_sim.py): an attempt that
    meets a 403 (or 503s past the retries) on an input raises, naming the object, instead of
    writing a shard without it and a row blaming it; the service's retry, once storage
    answers, writes every image and the version has no error."""
    src, root, job, task = _one_task_job(gcs, tmp_path)
    _raises_naming(proxy, "in/dog/001.jpg", status, f"{src}/dog/001.jpg",
                   lambda: job.attempt(task))
    retried = job.attempt(task)
    assert (retried.written.num_examples, retried.errors) == (6, ())
    manifest = job.commit([retried])
    assert manifest["accounting"]["written"] == 6 and manifest["errors"]["count"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("times", [None, 2])
def test_a_listing_read_by_ranges_fails_midway_or_is_retried_and_never_ends_early(
        proxy, gcs, patient_retries, tmp_path, monkeypatch, times):
    """A shard's listing on gs:// is streamed by ranged GETs (files.open_stream; a dozen
    here, STREAM_BYTES cut to 128). 503s from the third GET on, past the retries: the
    attempt raises, naming the listing, and places no shard (none missing the images
    after the fault); its retry reads the listing again from the start and writes every
    image. Two 503s midway: retried inside the read, every image written."""
    from beam_pipeline.store import files

    monkeypatch.setattr(files, "STREAM_BYTES", 128)
    src, root, job, task = _one_task_job(gcs, tmp_path)
    assert len(gcs.read(task.listing)) > 6 * 128  # the fault lands midway
    proxy.fail(task.listing.split("/", 3)[3], 503, times=times, method="GET", after=2)
    try:
        if times is None:
            with pytest.raises(transient.StorageUnavailable,
                               match=rf"^cannot read {re.escape(task.listing)} \(.*503"):
                job.attempt(task)
            assert not [uri for uri in gcs.list(f"{root}/")
                        if ".tfrecord-" in uri and "/.tmp/" not in uri]
        else:
            attempt = job.attempt(task)
        hits = list(proxy.forced_hits)
    finally:
        proxy.fail_clear()
    assert hits and len(hits) == (times or len(hits)), hits
    retried = job.attempt(task) if times is None else attempt
    assert (retried.written.num_examples, retried.errors) == (6, ())
    manifest = job.commit([retried])
    assert manifest["accounting"]["written"] == 6 and manifest["errors"]["count"] == 0


def test_an_input_is_rejected_only_for_what_is_its_own(tmp_path):
    """inputs.fetch and its local read-ahead: missing, a folder, a link loop, a mode that
    forbids reading are the input's rows; an outage or a credential raises, naming it."""
    from beam_pipeline.job import inputs

    (tmp_path / "folder.jpg").mkdir()
    os.symlink("loop.jpg", tmp_path / "loop.jpg")  # ELOOP
    for name, kind in [("gone.jpg", FileNotFoundError), ("folder.jpg", IsADirectoryError),
                       ("loop.jpg", OSError)]:
        path = str(tmp_path / name)
        for data, error in (inputs.fetch(path), inputs._LocalRead(path, 0).result()):
            assert data is None and isinstance(error, kind), (name, error)
    denied = PermissionError(errno.EACCES, "Permission denied")
    assert inputs.rejection(str(tmp_path / "x.jpg"), denied) is denied  # its mode: its row
    for uri, error in [("gs://b/in/x.jpg", exceptions.Forbidden("403 GET …/x.jpg")),
                       ("gs://b/in/x.jpg", exceptions.ServiceUnavailable("503")),
                       ("gs://b/in/x.jpg", auth_exceptions.RefreshError("no token")),
                       (str(tmp_path / "x.jpg"), OSError(errno.ESTALE, "Stale file handle"))]:
        with pytest.raises(transient.StorageUnavailable, match=rf"^cannot read {uri} \("):
            inputs.rejection(uri, error)
    assert inputs.rejection("gs://b/in/x.jpg", exceptions.NotFound("404")).code == 404
