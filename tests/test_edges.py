"""Nothing silent at the edges: listing, manifest input, locks, storage schemes, retention.

Each test is one way a build used to run on as if nothing had happened: an unreadable
folder counted as removed, a 503 or 403 turned into `not_found`, an object name read as a
glob, a symlink loop listing the tree again and again, manifest values written into paths,
a lost lock that still published, a cleanup that deleted too much. Unreadable folders are
real: a folder with mode 000, read as an unprivileged user (when the tests run as root,
the effective uid is switched to `nobody` for that block). GCS errors come from
tests/faults.py answering chosen requests with 503 or 403.
"""

import contextlib
import json
import os
import random
import re
import shutil
import tempfile

import pytest

from beam_pipeline.errors import UserError
from beam_pipeline.launcher import listing, walk
from beam_pipeline.refs import ImageRef
from tests.helpers import FAST, build, errors_of, image_bytes, make_images

NOBODY = 65534


@pytest.fixture
def open_dir():
    """A fresh folder every user can traverse (pytest's tmp_path is root's alone)."""
    path = tempfile.mkdtemp(prefix="edges-")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def unreadable(folder, mode=0):
    """`folder` cannot be listed inside this block: mode 000 (or `mode`), and for root (who
    reads anything) the block runs with the effective uid and gid of nobody."""
    os.chmod(folder, mode)
    as_root = os.geteuid() == 0
    try:
        if as_root:
            os.setegid(NOBODY)
            os.seteuid(NOBODY)
        yield
    finally:
        if as_root:
            os.seteuid(0)
            os.setegid(0)
        os.chmod(folder, 0o755)


def listed(*specs, **kw):
    items = list(listing.iter_inputs([str(s) for s in specs], **kw))
    return ([i for i in items if isinstance(i, ImageRef)],
            [i for i in items if not isinstance(i, ImageRef)])


# --- no silent listing ------------------------------------------------------------------------

def test_an_unreadable_folder_stops_the_listing_naming_it(open_dir):
    make_images(os.path.join(open_dir, "in"), {"cat": 2, "dog": 2})
    dog = os.path.join(open_dir, "in", "dog")
    with unreadable(dog), pytest.raises(walk.ListingFailed,
                                        match=f"cannot list {dog}: Permission denied"):
        listed(os.path.join(open_dir, "in"))


def test_a_failed_stat_stops_the_listing_naming_the_file(open_dir):
    """A folder with read but no search permission: its names list, its files cannot be
    stat'ed. Before: each such file silently dropped out of the listing."""
    make_images(os.path.join(open_dir, "in"), {"cat": 2, "dog": 2})
    dog = os.path.join(open_dir, "in", "dog")
    with unreadable(dog, mode=0o444):
        with pytest.raises(walk.ListingFailed,
                           match=f"cannot stat {dog}/000.jpg: Permission denied"):
            listed(os.path.join(open_dir, "in"))


@pytest.mark.slow
def test_an_incremental_run_that_cannot_list_a_folder_exits_1_and_publishes_nothing(
        open_dir, capsys):
    """Before: the unreadable folder's images were counted as removed and a version
    without them was published."""
    from beam_pipeline import cli
    from beam_pipeline.store import versions

    src, root = os.path.join(open_dir, "in"), os.path.join(open_dir, "ds")
    make_images(src, {"cat": 2, "dog": 2})
    first = build(src, root, *FAST)["version"]
    make_images(src, {"cat": {"new.jpg": image_bytes((1, 2, 3))}})  # something changed
    for d, _, files in os.walk(root):
        for name in [d] + [os.path.join(d, f) for f in files]:
            os.chown(name, NOBODY, NOBODY)
    with unreadable(os.path.join(src, "dog")):
        code = cli.main(["--input", src, "--output", root] + FAST)
    assert code == 1
    err = capsys.readouterr().err
    assert f"cannot list {src}/dog: Permission denied" in err, err
    assert versions.latest(root)[0] == first
    assert versions.list_versions(root) == {first: True}  # no version even claimed


def test_a_symlink_loop_is_listed_once_under_the_right_classes(tmp_path):
    """Before: `cat/up -> ..` listed a 301-file tree as 12,341 files."""
    src = tmp_path / "in"
    make_images(src, {"cat": 150, "dog": 151})
    os.symlink("..", src / "cat" / "up")
    refs, errors = listed(src)
    assert len(refs) == 301 and errors == []
    assert {r.label for r in refs} == {"cat", "dog"}
    assert sorted(r.key for r in refs) == sorted(
        f"{c}/{i:03d}.jpg" for c, n in (("cat", 150), ("dog", 151)) for i in range(n))


def test_linked_folders_are_followed_once_and_real_folders_keep_their_keys(tmp_path):
    outside = tmp_path / "elsewhere"
    make_images(outside, {"fox": 2})
    src = tmp_path / "in"
    make_images(src, {"cat": 1, "dog": 1})
    os.symlink(outside / "fox", src / "fox")            # a folder outside: followed
    os.symlink(outside / "fox", src / "fox_again")      # the same folder again: once
    os.symlink(src / "dog", src / "a_link_to_dog")      # sorts first; dog keeps its keys
    refs, errors = listed(src)
    assert sorted(r.key for r in refs) == ["cat/000.jpg", "dog/000.jpg", "fox/000.jpg",
                                           "fox/001.jpg"]
    assert errors == []


def test_a_broken_link_is_an_error_record_not_a_silent_skip(tmp_path):
    src = tmp_path / "in"
    make_images(src, {"cat": 2})
    os.symlink(tmp_path / "gone.jpg", src / "cat" / "broken.jpg")
    refs, errors = listed(src)
    assert len(refs) == 2
    assert [(e.uri, e.reason) for e in errors] == [(str(src / "cat" / "broken.jpg"),
                                                      "not_found")]


# --- inputs checked before any work ----------------------------------------------------------

def manifest(tmp_path, rows, name="list.csv"):
    path = tmp_path / name
    with open(path, "w", newline="") as f:
        f.write("uri,label,split\n")
        for row in rows:
            f.write(",".join(f'"{v}"' for v in row) + "\n")
    return path


@pytest.mark.parametrize("split, line", [("../../escape", 3), ("tr\tain", 3), ("Train", 3),
                                         ("9lives", 3)])
def test_a_split_that_is_not_a_plain_name_exits_2_with_file_and_line(tmp_path, split, line):
    make_images(tmp_path, {"cat": 2})
    path = manifest(tmp_path, [("cat/000.jpg", "cat", "train"), ("cat/001.jpg", "cat", split)])
    with pytest.raises(UserError, match=rf"^{path}:{line}: split .* must match \[a-z\]"):
        listed(path)


@pytest.mark.parametrize("label", ["ca\nt", "ca\tt", "c\x00at", "ca\u2028t"])
def test_a_label_with_a_control_character_exits_2_with_file_and_line(tmp_path, label):
    make_images(tmp_path, {"cat": 2})
    path = manifest(tmp_path, [("cat/000.jpg", "cat", ""), ("cat/001.jpg", label, "")])
    with pytest.raises(UserError, match=rf"^{path}:3: label .* control character"):
        listed(path)


def test_a_class_folder_with_a_control_character_exits_2(tmp_path):
    make_images(tmp_path / "in", {"ca\tt": 1})
    with pytest.raises(UserError, match="class folder 'ca\\\\tt'"):
        listed(tmp_path / "in")


def test_two_rows_with_one_key_and_different_files_exit_2_with_file_and_line(tmp_path):
    """A relative uri `R` (beside the manifest) and an absolute one `/R` outside the
    manifest's folder are two files; both used to get the key `R`."""
    lists = tmp_path / "lists"
    outside = tmp_path / "abs" / "other" / "a.jpg"
    key = str(outside).lstrip("/")
    make_images(outside.parent, {"": {"a.jpg": image_bytes((1, 1, 1))}})
    make_images((lists / key).parent, {"": {"a.jpg": image_bytes((2, 2, 2))}})
    same = manifest(lists, [(key, "cat", ""), (key, "cat", "")], name="same.csv")
    refs, _ = listed(same)  # one file listed twice is a duplicate, counted by the planner
    assert len(refs) == 2 and len({r.uri for r in refs}) == 1
    clash = manifest(lists, [(key, "cat", ""), (str(outside), "dog", "")])
    with pytest.raises(UserError, match=re.escape(
            f"{clash}:3: {outside} gets the key '{key}', as {lists / key} (line 2) does")):
        listed(clash)


def test_an_input_over_the_size_limit_is_never_read(tmp_path):
    """A 3 GiB file (sparse: no disk used) is an error record before anything opens it."""
    src = tmp_path / "in"
    make_images(src, {"cat": 2})
    huge = src / "cat" / "huge.jpg"
    with open(huge, "wb") as f:
        f.truncate(3 << 30)
    refs, errors = listed(src, max_bytes=1 << 30)
    assert len(refs) == 2
    [error] = errors
    assert (error.uri, error.reason) == (str(huge), "too_large")
    assert "3221225472 bytes, over --max_image_mb (1024 MiB)" in error.detail


# --- gs:// listings: retried, literal, and a 403 is the user's -------------------------------

@pytest.fixture(scope="module")
def proxy(gcs):
    """Every google-cloud-storage request of this module goes through a FaultProxy that
    answers chosen requests with a chosen status (`proxy.fail`)."""
    from tests.faults import FaultProxy

    with FaultProxy(gcs.endpoint) as fault_proxy, pytest.MonkeyPatch.context() as mp:
        mp.setenv("STORAGE_EMULATOR_HOST", fault_proxy.url)
        yield fault_proxy


@pytest.fixture
def gcs_objects(proxy, gcs, gcs_bucket):
    """gs://BUCKET/in/cat/{000.jpg, a[1].jpg, b?.jpg, c*.jpg} and a CSV manifest of them."""
    base = f"gs://{gcs_bucket}"
    names = ["000.jpg", "a[1].jpg", "b?.jpg", "c*.jpg"]
    for i, name in enumerate(names):
        gcs.upload_bytes(f"{base}/in/cat/{name}", image_bytes((10 * i, 0, 0)))
    rows = ["uri,label"] + [f"{base}/in/cat/{n},cat" for n in names]
    gcs.upload_bytes(f"{base}/lists/cats.csv", ("\n".join(rows) + "\n").encode())
    yield base, names
    proxy.fail_clear()


@pytest.mark.slow
def test_gcs_manifest_names_are_literal_and_503s_are_retried(proxy, gcs_objects):
    """Before: `a[1].jpg` was matched as a glob (-> not_found), and a 503 on a stat
    became not_found."""
    base, names = gcs_objects
    proxy.fail("in/cat/000.jpg", 503, times=2)
    refs, errors = listed(f"{base}/lists/cats.csv")
    assert errors == []
    assert sorted(r.uri for r in refs) == sorted(f"{base}/in/cat/{n}" for n in names)
    assert all(r.size > 0 and r.stamp.startswith("gen:") for r in refs)
    assert proxy.forced[0][2] == 0  # both 503s were answered, and retried


@pytest.mark.slow
def test_gcs_403_on_a_manifest_object_exits_2_naming_it(proxy, gcs_objects, capsys):
    from beam_pipeline import cli

    base, _ = gcs_objects
    proxy.fail("in/cat/b?.jpg", 403)
    proxy.fail("prefix=in/cat/", 403)  # no list permission either: each row is read
    with pytest.raises(UserError, match=re.escape(
            f"{base}/lists/cats.csv:4: {base}/in/cat/b?.jpg: permission denied (403)")):
        listed(f"{base}/lists/cats.csv")
    assert cli.main(["--input", f"{base}/lists/cats.csv", "--output", f"{base}/ds"]
                    + FAST) == 2
    assert "in/cat/b?.jpg: permission denied (403)" in capsys.readouterr().err


@pytest.mark.slow
def test_gcs_folder_listing_retries_503_and_names_a_403(proxy, gcs_objects):
    base, names = gcs_objects
    proxy.fail("prefix=in/", 503, times=2)
    refs, errors = listed(f"{base}/in")
    assert len(refs) == len(names) and errors == []
    proxy.fail("prefix=in/cat/", 403)
    with pytest.raises(UserError, match=re.escape(f"{base}/in/cat/: permission denied (403) "
                                                  "to list it")):
        listed(f"{base}/in")
    proxy.fail_clear()
    proxy.fail("prefix=in/cat/", 500)  # still failing after the retries: exit 1, named
    with pytest.MonkeyPatch.context() as mp:
        from google.api_core.retry import Retry
        mp.setattr(walk, "gcs_retry", lambda: Retry(deadline=2.0, initial=0.1))
        with pytest.raises(walk.ListingFailed, match=re.escape(f"cannot list {base}/in/cat/")):
            listed(f"{base}/in")


@pytest.mark.slow
@pytest.mark.parametrize("status", [403, 401])
def test_gcs_credentials_refused_before_anything_is_read_exit_2_for_401_as_for_403(
        proxy, gcs_objects, capsys, status):
    """Listing --input, checking that it exists, stat'ing a manifest's objects: the first
    reads of what the command names. A 401 (credentials refused; the emulator's anonymous
    ones cannot be refreshed) is the command's as a 403 is: exit 2. Before: 403 exit 2,
    401 exit 1 ("cannot list ...")."""
    from beam_pipeline import cli

    base, _ = gcs_objects
    said = "permission denied (403)" if status == 403 else "credentials refused (401"
    proxy.fail("prefix=in/cat/", status)
    with pytest.raises(UserError, match=re.escape(f"{base}/in/cat/: {said}")):
        listed(f"{base}/in")
    assert cli.main(["--input", f"{base}/in", "--output", f"{base}/ds"] + FAST) == 2
    err = capsys.readouterr().err
    assert f"error: {base}/in/cat/: {said}" in err and err.count("\nerror") == 0, err
    proxy.fail_clear()
    proxy.fail("in/cat/b?.jpg", status)  # a manifest's object, read one by one
    proxy.fail("prefix=in/cat/", 403)
    with pytest.raises(UserError, match=re.escape(
            f"{base}/lists/cats.csv:4: {base}/in/cat/b?.jpg: {said}")):
        listed(f"{base}/lists/cats.csv")
    proxy.fail_clear()
    proxy.fail("prefix=in", status)  # --input's existence, checked before the output root
    assert cli.main(["--input", f"{base}/in", "--output", f"{base}/ds"] + FAST) == 2
    assert f"{base}/in: {said}" in capsys.readouterr().err
    proxy.fail_clear()
    proxy.fail("lists/cats.csv", status)  # the manifest file itself
    assert cli.main(["--input", f"{base}/lists/cats.csv", "--output", f"{base}/ds"]
                    + FAST) == 2
    assert f"{base}/lists/cats.csv: {said}" in capsys.readouterr().err


# --- the shard writer never holds more than it should ------------------------------------------

class CountingPool:
    """A real thread pool that remembers which listed sizes were submitted."""

    def __init__(self, sizes):
        import concurrent.futures

        self.pool, self.sizes, self.submitted = concurrent.futures.ThreadPoolExecutor(4), sizes, 0

    def submit(self, fn, ref, *args):
        self.submitted += self.sizes[ref.uri]
        return self.pool.submit(fn, ref, *args)


class _AskedFor:
    """An open file that records the byte counts each read asked for; `fileno` may name
    another (smaller) file: a size that went stale as the file grew."""

    def __init__(self, f, fileno_of=None):
        self.f, self.asked, self.fileno_of = f, [], fileno_of or f

    def read(self, n=-1):
        self.asked.append(n)
        return self.f.read(n)

    def fileno(self):
        return self.fileno_of.fileno()


def test_an_input_is_read_asking_for_its_size_not_the_limit(tmp_path):
    """Before: f.read(max_bytes + 1) asked for 1 GiB + 1 (the default --max_image_mb), and
    a read of n bytes allocates n first: 46 µs of CPU a 700-byte image, now 14."""
    from beam_pipeline.job import inputs

    data = random.Random(4).randbytes(700)
    (tmp_path / "a.jpg").write_bytes(data)
    limit = 1 << 30
    with open(tmp_path / "a.jpg", "rb") as f:
        asked = _AskedFor(f)
        assert inputs.read_at_most(asked, limit) == data and asked.asked == [701]
    with open(tmp_path / "a.jpg", "rb") as f:  # over the limit: limit + 1 bytes, as before
        assert inputs.read_at_most(f, 40) == data[:41]
    (tmp_path / "small").write_bytes(b"x" * 100)
    with open(tmp_path / "a.jpg", "rb") as f, open(tmp_path / "small", "rb") as small:
        grew = _AskedFor(f, fileno_of=small)  # fstat said 100 bytes; it holds 700 now
        assert inputs.read_at_most(grew, limit) == data and grew.asked[0] == 101
        grew = _AskedFor(open(tmp_path / "a.jpg", "rb"), fileno_of=small)
        assert inputs.read_at_most(grew, 300) == data[:301]  # grew past the limit
        grew.f.close()
    assert inputs.read_bytes(str(tmp_path / "a.jpg"), 600) is None  # too large
    assert inputs.read_bytes(str(tmp_path / "a.jpg"), 700) == data
    assert inputs._LocalRead(str(tmp_path / "a.jpg"), limit).result() == (data, None)


def test_a_local_shard_listing_is_streamed_not_held_whole(tmp_path):
    """Before: the listing of the shard being written was held whole (~170 bytes an image;
    a shard of tiny images lists up to ~180,000) for as long as the shard was written."""
    import tracemalloc

    from beam_pipeline.job import inputs

    refs = [ImageRef(f"class{i % 100:02d}/{i:07d}.jpg", f"/data/in/class{i % 100:02d}/"
                     f"{i:07d}.jpg", f"class{i % 100:02d}", None, 700 + i % 97,
                     f"{1_700_000_000_000_000_000 + i}:{1_700_000_000_000_000_000 + i}")
             for i in range(25_000)]
    listing = tmp_path / "listing.jsonl"
    listing.write_text("".join(ref.to_json() + "\n" for ref in refs))
    assert listing.stat().st_size > 3 << 20
    tracemalloc.start()
    try:
        read = inputs.read_listing(str(listing))
        first = next(read)
        count, last = 1, first
        for last in read:
            count += 1
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (first, last, count) == (refs[0], refs[-1], len(refs))
    assert peak < 1 << 20, peak  # the file's buffer and a ref, not the file


def test_read_ahead_is_bounded_in_bytes(tmp_path):
    """Reads that go to the thread pool (gs:// objects, stored records: the latter here,
    each record in its own shard file) hold at most the budget."""
    from beam_pipeline.job import inputs
    from beam_pipeline.refs import StoredFrame
    from dataset_format import frames

    sizes = {}
    refs = []
    for i, mib in enumerate([3, 3, 3, 9, 1, 1, 1, 1, 3]):
        path = tmp_path / f"{i}.tfrecord"
        frame = frames.tfrecord_frame(bytes([i]) * (mib << 20))
        path.write_bytes(frame)
        uri = f"gs://bucket/cat/{i}.jpg"
        sizes[uri] = mib << 20
        refs.append(ImageRef(f"cat/{i}.jpg", uri, "cat", None, mib << 20,
                             source=StoredFrame(str(path), 0, len(frame))))
    pool, consumed, most = CountingPool(sizes), 0, 0
    for ref, data, error in inputs.read_ahead(pool, iter(refs), budget=8 << 20):
        assert error is None and data == bytes([int(ref.key[4])]) * ref.size
        most = max(most, pool.submitted - consumed)  # fetched or fetching, not yet written
        consumed += ref.size
    assert consumed == sum(sizes.values())
    assert most == 9 << 20  # the 9 MiB image alone; otherwise never over the 8 MiB budget


def test_local_reads_ahead_give_what_fetch_gives_in_listing_order(tmp_path):
    """Local inputs are read in the writer's loop, not by the pool: same bytes and errors
    as fetch (missing, a folder, over the limit), in order, mixed with pooled reads."""
    import concurrent.futures

    from beam_pipeline.job import inputs
    from beam_pipeline.refs import StoredFrame
    from dataset_format import frames

    (tmp_path / "a.jpg").write_bytes(b"a" * 10)
    (tmp_path / "big.jpg").write_bytes(b"b" * 5000)
    (tmp_path / "folder.jpg").mkdir()
    (tmp_path / "s.tfrecord").write_bytes(frames.tfrecord_frame(b"stored"))
    frame_length = (tmp_path / "s.tfrecord").stat().st_size
    names = ["a.jpg", "missing.jpg", "big.jpg", "folder.jpg", "a.jpg"]
    refs = [ImageRef(f"cat/{i}", str(tmp_path / n), "cat", None, 10) for i, n in enumerate(names)]
    refs.insert(2, ImageRef("cat/s", "gs://bucket/s.jpg", "cat", None, 6,
                            source=StoredFrame(str(tmp_path / "s.tfrecord"), 0, frame_length)))
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        got = list(inputs.read_ahead(pool, iter(refs), max_bytes=1000))
    assert [r.key for r, _, _ in got] == [r.key for r in refs]
    for ref, data, error in got:
        if ref.source:
            assert (data, error) == (b"stored", None)
            continue
        want, want_error = inputs.fetch(ref.uri, 1000)
        assert data == want
        assert type(error) is type(want_error) and str(error) == str(want_error)
    assert [type(e).__name__ for _, _, e in got] == [
        "NoneType", "FileNotFoundError", "NoneType", "ImageError", "IsADirectoryError",
        "NoneType"]


def test_a_file_that_grew_past_the_limit_after_listing_is_too_large_unread(tmp_path):
    from beam_pipeline.job import images, inputs

    path = tmp_path / "grown.jpg"
    path.write_bytes(b"\xff" * (3 << 20))
    data, error = inputs.fetch(str(path), max_bytes=1 << 20)
    assert data is None and isinstance(error, images.ImageError)
    assert (error.stage, error.reason) == ("read", "too_large")
    assert inputs.fetch(str(path), max_bytes=4 << 20)[0] == b"\xff" * (3 << 20)


@pytest.mark.slow
def test_a_build_rejects_an_input_over_max_image_mb_as_too_large(tmp_path):
    src = tmp_path / "in"
    make_images(src, {"cat": 3, "dog": 3})
    with open(src / "dog" / "huge.jpg", "wb") as f:
        f.truncate(5 << 20)  # sparse: it would be read whole (and fail) without the limit
    result = build(src, tmp_path / "ds", *FAST, "--max_image_mb", "2", "--max_error_rate",
                   "0.5")
    assert [(e["uri"], e["reason"]) for e in errors_of(result)] == [
        (str(src / "dog" / "huge.jpg"), "too_large")]
    assert result["manifest"]["accounting"]["written"] == 6
    assert result["manifest"]["config"]["max_image_mb"] == 2.0


# --- locks that know when they are lost ---------------------------------------------------------

@pytest.mark.slow
def test_a_client_clock_100_s_fast_takes_over_no_live_lock(proxy, gcs_bucket, monkeypatch):
    """Before: age = local clock - server `updated`, so a client 100+ s fast saw every live
    lock as expired and took it over."""
    import datetime

    from beam_pipeline.store import lock, lock_base

    root = f"gs://{gcs_bucket}/ds"
    holder = lock.acquire(root)  # alive: its heartbeat runs
    try:
        real_now = lock_base.now
        monkeypatch.setattr(lock_base, "now", lambda: real_now() + datetime.timedelta(seconds=300))
        with pytest.raises(lock.LockHeld, match="is being built by host"):
            lock.acquire(root)
        holder.check()  # still its own
    finally:
        holder.release()


def steal(root):
    """Another build takes ROOT/.lock over (what a build does with an expired lock)."""
    from beam_pipeline.store import lock_base, lock_gcs

    thief = lock_gcs.GcsLock(root)
    body, generation, _ = thief._read()
    assert thief._write(lock_base.body(thief.token, lock_base.now()), generation)
    return thief


@pytest.mark.slow
def test_a_build_that_lost_its_lock_exits_1_and_submits_nothing(proxy, gcs, gcs_bucket, tmp_path,
                                                                monkeypatch, capsys):
    """Before: the lost lock was noticed only at release, after the job had run and
    published."""
    from beam_pipeline import cli
    from beam_pipeline.store import lock_gcs, versions

    make_images(tmp_path / "in", {"cat": 2, "dog": 2})
    root = f"gs://{gcs_bucket}/ds"
    thieves, claim = [], versions.claim_version

    def claim_then_lose_the_lock(r):  # the heartbeat stalled past TTL while listing
        version = claim(r)
        thieves.append(steal(r))
        return version

    monkeypatch.setattr(versions, "claim_version", claim_then_lose_the_lock)
    assert cli.main(["--input", str(tmp_path / "in"), "--output", root] + FAST) == 1
    [line] = [l for l in capsys.readouterr().err.splitlines() if l.startswith("error:")]
    assert line.startswith(f"error: build failed: lost the lock on {root} ({root} is being "
                           "built by host ") and "; nothing published (run with --verbose" in line, line
    assert not gcs.exists(f"{root}/LATEST")
    assert not [u for u in gcs.list(f"{root}/") if ".tfrecord" in u]  # no job ran
    assert lock_gcs.GcsLock(root).holder()["token"] == thieves[0].token  # left alone


def test_a_commit_whose_lock_was_taken_over_publishes_nothing(tmp_path):
    import dataclasses

    from beam_pipeline.job import commit
    from beam_pipeline.store import lock, versions
    from dataset_format import layout
    from tests.test_reliability import commit_inputs

    root = str(tmp_path / "ds")
    held = lock.acquire(root)
    try:
        stats, spec = commit_inputs(root, "20260401T000000Z")
        lost = dataclasses.replace(spec, lock_token="another build's token")
        with pytest.raises(lock.LockLost, match=f"lost the lock on {root} .*nothing published"):
            commit.commit(stats, lost)
        assert not os.path.exists(os.path.join(root, layout.LATEST))
        assert not os.path.exists(os.path.join(spec.vdir, layout.MANIFEST))  # not complete
        commit.commit(stats, dataclasses.replace(spec, lock_token=held.token))
        assert versions.latest_id(root) == spec.version
    finally:
        held.release()


@pytest.mark.slow
def test_the_winners_cleanup_keeps_a_live_losers_version_and_the_loser_publishes_nothing(
        proxy, gcs, gcs_bucket, monkeypatch):
    """Build A's heartbeat stalls, B takes the lock over, publishes and cleans up; A is
    still alive. Before: B's cleanup deleted A's directory and A then published it."""
    import dataclasses
    import time

    from beam_pipeline.job import commit
    from beam_pipeline.store import lock, lock_base, versions
    from tests.test_reliability import commit_inputs

    root = f"gs://{gcs_bucket}/ds"
    a_version, b_version, dead = "20260401T000000Z", "20260401T000500Z", "20260331T100000Z"
    a = lock.acquire(root)
    a.stop.set()  # A stalls (its process is paused, say)
    a.thread.join()
    a_stats, a_spec = commit_inputs(root, a_version)
    gcs.upload_bytes(f"{root}/versions/{dead}/.tmp/listing/train-00000.jsonl", b"")  # 14 h older
    monkeypatch.setattr(lock_base, "TTL", 1.0)
    time.sleep(2.5)  # past the TTL by the server's Date header (whole seconds)
    b = lock.acquire(root)  # takes the expired lock over
    try:
        b_stats, b_spec = commit_inputs(root, b_version)
        commit.commit(b_stats, dataclasses.replace(b_spec, lock_token=b.token))
    finally:
        b.release()
    assert versions.list_versions(root) == {a_version: False, b_version: True}
    with pytest.raises(lock.LockLost):
        commit.commit(a_stats, dataclasses.replace(a_spec, lock_token=a.token))
    assert versions.latest_id(root) == b_version
    assert versions.list_versions(root) == {a_version: False, b_version: True}
    with pytest.raises(lock.LockLost):
        a.check()
    a.release()


def test_a_cleanup_that_cannot_list_a_version_deletes_nothing(open_dir, caplog):
    """Before: a version folder it could not look into counted as incomplete, and was
    deleted (or the cleanup crashed half way)."""
    from beam_pipeline.store import retention, versions
    from dataset_format import layout

    root = os.path.join(open_dir, "ds")
    ids = ["20260101T000000Z", "20260102T000000Z", "20260103T000000Z"]
    for v in ids:
        make_images(layout.version_dir(root, v), {"": {layout.MANIFEST: b"{}"}})
    make_images(layout.version_dir(root, "20250101T000000Z"), {".tmp": {"x": b""}})
    for d, dirs, names in os.walk(root):
        for name in [d] + [os.path.join(d, n) for n in names]:
            os.chown(name, NOBODY, NOBODY)
    with unreadable(layout.version_dir(root, ids[0])):
        with pytest.raises(PermissionError):
            versions.list_versions(root)
        assert retention.prune(root, ids[2], keep=1, keep_superseded_hours=0) == []
    assert "nothing deleted: cannot list its versions" in caplog.text
    assert versions.list_versions(root) == {"20250101T000000Z": False, **dict.fromkeys(ids, True)}


# --- only what is tested is accepted -------------------------------------------------------------

@pytest.mark.parametrize("output", ["s3://bucket/ds", "hdfs://nn/ds", "file:///tmp/ds"])
def test_an_untested_output_scheme_exits_2_before_anything_is_created(tmp_path, monkeypatch,
                                                                      capsys, output):
    """Before: `--output s3://…` exited 2, but first made a folder `s3:` in the working
    directory."""
    from beam_pipeline import cli

    make_images(tmp_path / "in", {"cat": 1})
    monkeypatch.chdir(tmp_path)
    assert cli.main(["--input", "in", "--output", output]) == 2
    assert f"--output {output}: only local paths and gs:// are supported" in \
        capsys.readouterr().err
    assert os.listdir(tmp_path) == ["in"]


def test_a_classic_template_is_refused_with_a_pointer_to_the_flex_template(tmp_path, capsys,
                                                                           monkeypatch):
    """Before: the job file was written, and the next build's cleanup deleted the listing it
    reads, so launching it later failed."""
    from beam_pipeline import cli

    monkeypatch.delenv("FLEX_TEMPLATE_PYTHON_PY_FILE", raising=False)
    make_images(tmp_path / "in", {"cat": 1})
    code = cli.main(["--input", str(tmp_path / "in"), "--output", str(tmp_path / "ds"),
                     "--runner", "DataflowRunner", "--project", "p", "--region", "r",
                     "--temp_location", "gs://b/tmp", "--template_location", "gs://b/t.json"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--template_location gs://b/t.json: classic templates are not supported" in err
    assert "configs/flex_template/" in err
    assert not (tmp_path / "ds").exists()


# --- retention -------------------------------------------------------------------------------------

def fake_complete(root, version, created_at):
    from dataset_format import layout

    make_images(layout.version_dir(root, version),
                {"": {layout.MANIFEST: json.dumps({"version": version,
                                                   "created_at": created_at}).encode()}})


def test_retention_keeps_a_version_superseded_less_than_48_h_ago(tmp_path):
    """Before: `--keep_versions 1` deleted the version a training job had pinned a minute
    before it was superseded."""
    import datetime

    from beam_pipeline.store import retention, versions

    root = str(tmp_path / "ds")

    def ago(hours):
        t = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=hours)
        return t.strftime("%Y-%m-%dT%H:%M:%SZ")

    fake_complete(root, "20260101T000000Z", ago(100))
    fake_complete(root, "20260102T000000Z", ago(50))  # superseded #1 50 h ago
    fake_complete(root, "20260103T000000Z", ago(1))   # superseded #2 1 h ago
    fake_complete(root, "20260104T000000Z", ago(0))   # published now: superseded #3
    assert retention.prune(root, "20260104T000000Z", keep=1) == ["20260101T000000Z"]
    assert retention.prune(root, "20260104T000000Z", keep=1, keep_superseded_hours=0.5) == [
        "20260102T000000Z"]
    assert retention.prune(root, "20260104T000000Z", keep=1, keep_superseded_hours=0) == [
        "20260103T000000Z"]
    assert versions.list_versions(root) == {"20260104T000000Z": True}


@pytest.mark.slow
def test_keep_versions_1_keeps_the_version_just_superseded(tmp_path):
    src, root = tmp_path / "in", tmp_path / "ds"
    make_images(src, {"cat": 2, "dog": 2})
    first = build(src, root, *FAST, "--keep_versions", "1")["version"]
    make_images(src, {"cat": {"new.jpg": image_bytes((1, 2, 3))}})
    second = build(src, root, *FAST, "--keep_versions", "1")["version"]
    from beam_pipeline.store import versions

    assert versions.list_versions(str(root)) == {first: True, second: True}
    third = build(src, root, *FAST, "--keep_versions", "1", "--force",
                  "--keep_superseded_hours", "0")["version"]
    # first and second are no longer versions: what is left of them is the shards third
    # shares (docs/format.md, "Shared shards").
    assert {v for v, done in versions.list_versions(str(root)).items() if done} == {third}
    from beam_pipeline.store import shared
    from dataset_format import layout

    held = shared.referenced(str(root), [third])
    for v in (first, second):
        assert set(os.listdir(root / layout.VERSIONS / v)) == held.get(v, set())
