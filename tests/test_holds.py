"""Versions a team can hold: tags (named, until deleted) and holds (a reader's lease, renewed
while it reads, lapsing after it stops) keep a version through retention; a prune killed at
any step leaves every version with a manifest whole; a version reads through a link and, once
materialized, from a copy; a removed version is said so in one line."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from dataset_format import layout
from tests.helpers import build, image_bytes, make_images

ARGS = ["--name", "pets", "--target_shard_mb", "0.01", "--no_transform"]


def _read_all(path, version=None):
    """{key: (split, stored JPEG)} through the TensorFlow-free loader."""
    from loaders import SequentialRecords, records

    out = {}
    for split in records.open_info(path, version).splits:
        for ex in SequentialRecords(path, split, version=version, decode=False):
            out[ex.key] = (split, bytes(ex.image))
    return out


def _complete(root):
    from beam_pipeline.store import versions

    return sorted(v for v, done in versions.list_versions(root).items() if done)


@pytest.fixture(scope="module")
def three_nights(tmp_path_factory):
    """V1; V2 adds an image (it shares V1's shards); V3 deletes ten (it rewrites some):
    the history in which a prune killed part way used to break V2. Built once, read-only."""
    base = tmp_path_factory.mktemp("holds")
    make_images(base / "src", {"cat": 30, "dog": 30, "owl": 20})
    v1 = build([base / "src"], base / "root", *ARGS)
    make_images(base / "src", {"cat": {"new_a.jpg": image_bytes((1, 2, 3))}})
    v2 = build([base / "src"], base / "root", *ARGS, "--keep_versions", "0")
    for name in sorted(os.listdir(base / "src" / "dog"))[:10]:
        os.remove(base / "src" / "dog" / name)
    v3 = build([base / "src"], base / "root", *ARGS, "--keep_versions", "0")
    versions = [v["version"] for v in (v1, v2, v3)]
    content = {v: _read_all(str(base / "root"), v) for v in versions}
    return base, versions, content


@pytest.fixture
def nights(three_nights, tmp_path):
    """three_nights' root copied for one test to change: (root, [v1, v2, v3], content)."""
    base, versions, content = three_nights
    shutil.copytree(base / "root", tmp_path / "root", symlinks=True)
    return str(tmp_path / "root"), versions, content


def _whole(root, version, content):
    """Every file the manifest names is there at its size, and every record reads as it
    did: without TensorFlow, so a check after each of a hundred kills stays fast."""
    from dataset_format import dataset_info

    info = dataset_info.info(root, version)
    for split in info.splits.values():
        for shard in split.shards:
            assert os.path.getsize(shard.path) == shard.num_bytes, shard.path
    assert _read_all(root, version) == content[version], version


# --- crash-safe retention --------------------------------------------------------------------

class Killed(BaseException):
    """The process dies here: nothing after it runs (no `except Exception` catches it)."""


def test_a_prune_killed_at_any_step_leaves_every_version_with_a_manifest_whole(
        nights, tmp_path, monkeypatch):
    """V1 and V2 dropped (--keep_versions 1, superseded 0 h ago), V2 naming V1's shards.
    The prune is killed before its k-th delete, for every k until it finishes; after each
    kill every version that still has a manifest is whole, and a second prune finishes."""
    from beam_pipeline.store import retention
    from beam_pipeline.tools import verify

    root, (v1, v2, v3), content = nights
    pristine = tmp_path / "pristine"
    shutil.copytree(root, pristine, symlinks=True)
    real = {name: getattr(os, name) for name in ("remove", "unlink", "rmdir")}
    budget = {"left": None}

    def dying(name):
        def call(*args, **kwargs):
            if budget["left"] is not None:
                if budget["left"] == 0:
                    raise Killed(name)
                budget["left"] -= 1
            return real[name](*args, **kwargs)
        return call

    for name in real:
        monkeypatch.setattr(os, name, dying(name))
    retention.prune(root, v3, keep=1, keep_superseded_hours=0)  # unkilled: what is left
    after = os.listdir(os.path.join(root, layout.VERSIONS))
    kills = 0
    for k in range(10_000):
        shutil.rmtree(root)
        shutil.copytree(pristine, root, symlinks=True)
        budget["left"] = k
        try:
            retention.prune(root, v3, keep=1, keep_superseded_hours=0)
            finished = True
        except Killed:
            finished, kills = False, kills + 1
        budget["left"] = None
        for v in _complete(root):
            _whole(root, v, content)
        if finished:
            break
        retention.prune(root, v3, keep=1, keep_superseded_hours=0)  # finishes the job
        assert _complete(root) == [v3]
        assert sorted(os.listdir(os.path.join(root, layout.VERSIONS))) == sorted(after)
        _whole(root, v3, content)
    assert kills > 20, kills  # the drop of two versions is that many deletes
    assert _complete(root) == [v3]
    assert verify.check(root)["problems"] == []


# --- tags ------------------------------------------------------------------------------------

def test_tags_from_the_command_line_and_python(nights, capsys):
    import readers
    from beam_pipeline.store import tags
    from beam_pipeline.tools import tag
    from loaders import RecordSource

    root, (v1, v2, v3), content = nights
    assert tag.main([root, "create", "paper", v1]) == 0
    assert capsys.readouterr().out == f"paper -> version {v1} of {root}\n"
    assert tag.main([root, "create", "release"]) == 0  # LATEST's
    meta = readers.info(root, version="paper")
    assert (meta.version, meta.tag) == (v1, "paper")
    assert len(RecordSource(root, "train", version="release")) == sum(
        1 for split, _ in content[v3].values() if split == "train")
    assert _read_all(root, "paper") == content[v1]
    capsys.readouterr()
    assert tag.main([root, "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[:2] for line in lines] == [["paper", v1], ["release", v3]]
    # One line for each mistake, exit 2.
    assert tag.main([root, "create", "paper", v2]) == 2
    assert capsys.readouterr().err == (
        f"error: {root}: tag 'paper' names version {v1} already; move it (tag ROOT move NAME "
        "VERSION) or delete it first\n")
    assert tag.main([root, "create", "20261201T000000Z"]) == 2
    assert "looks like a version id" in capsys.readouterr().err
    assert tag.main([root, "create", "x", "nope"]) == 2
    assert f"no version or tag named 'nope'" in capsys.readouterr().err
    assert tag.main([root, "move", "paper", v2]) == 0
    assert readers.info(root, version="paper").version == v2
    with pytest.raises(ValueError, match=f"is version {v3}, not paper .tag paper names {v2}"):
        RecordSource(readers.info(root), "train", version="paper")
    from beam_pipeline.tools import inspect_dataset, verify

    assert inspect_dataset._tags(layout.version_dir(root, v2)) == (
        f"paper (this version), release -> {v3}")
    capsys.readouterr()
    assert verify.main([layout.version_dir(root, v2)]) == 0
    assert capsys.readouterr().out.rstrip().endswith("; tagged paper")
    assert tags.delete(root, "paper").version == v2
    assert tag.main([root, "delete", "paper"]) == 2
    assert sorted(tags.list_tags(root)) == ["release"]
    with open(layout.tag_file(root, "release")) as f:
        assert json.load(f)["manifest"] == f"versions/{v3}/manifest.json"


def test_writers_take_the_roots_lock(nights, capsys):
    """Tagging and materialize wait for (or refuse) a build holding the root, as a second
    build does: a build's retention never runs beside them."""
    from beam_pipeline.store import lock
    from beam_pipeline.tools import materialize, tag

    root, (v1, v2, v3), _ = nights
    held = lock.acquire(root)  # a build running
    try:
        assert tag.main([root, "create", "paper", v1]) == 2
        assert materialize.main([root, "--version", v2]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 2 and all(f"{root} is being built by host" in e for e in err), err
        assert all("Pass --wait to wait for it" in e for e in err)
        assert not os.path.exists(layout.tag_file(root, "paper"))
    finally:
        held.release()
    assert tag.main([root, "create", "paper", v1]) == 0
    assert materialize.main([root, "--version", v2]) == 0


def test_retention_keeps_tagged_and_held_versions_and_their_files(nights):
    from beam_pipeline.store import retention, tags
    from dataset_format import holds

    root, (v1, v2, v3), content = nights
    tags.create(root, "paper", v1)
    hold = holds.Hold(root, v2, seconds=60)
    assert retention.prune(root, v3, keep=1, keep_superseded_hours=0) == []
    assert _complete(root) == [v1, v2, v3]
    _whole(root, v1, content)
    _whole(root, v2, content)
    hold.release()
    assert retention.prune(root, v3, keep=1, keep_superseded_hours=0) == [v2]
    tags.delete(root, "paper")
    assert retention.prune(root, v3, keep=1, keep_superseded_hours=0) == [v1]
    assert _complete(root) == [v3]
    _whole(root, v3, content)
    assert not os.listdir(layout.holds_dir(root, v2))  # released: no lease left


def test_a_lease_written_while_a_prune_runs_gets_its_version_back(nights, monkeypatch):
    """A reader writes its lease, then looks for the manifest; the prune deletes manifests,
    then reads the leases again: a lease it missed at first brings the manifest back."""
    from beam_pipeline.store import retention
    from dataset_format import holds

    root, (v1, v2, v3), content = nights
    real, taken = retention._retire_manifests, []

    def retire_then_a_reader_comes(root_, drops):
        saved, stays = real(root_, drops)
        # a reader that saw V2's manifest just before it went: its lease is already written
        taken.append(holds.leases(root_))
        path = layout.join(layout.holds_dir(root_, v2), "late-reader")
        from dataset_format import storage

        storage.write_bytes(path, holds.body(v2, "late-reader", 60))
        return saved, stays

    monkeypatch.setattr(retention, "_retire_manifests", retire_then_a_reader_comes)
    assert retention.prune(root, v3, keep=1, keep_superseded_hours=0) == [v1]
    assert taken == [[]]
    assert _complete(root) == [v2, v3]
    _whole(root, v2, content)


def test_a_lapsed_lease_no_longer_holds_and_is_deleted(nights):
    """Liveness is the storage's stamp of the lease's last write against the storage's clock
    now: the holder's clock (in the body) and the cleaner's (`now`) do not count."""
    from beam_pipeline.store import protected, retention
    from dataset_format import holds, storage

    root, (v1, v2, v3), _ = nights
    path = layout.join(layout.holds_dir(root, v1), "host-1-dead")
    body = json.loads(holds.body(v1, "host-1-dead", 30))
    body["renewed"] = "2000-01-01T00:00:00Z"  # a holder whose clock is years behind
    storage.write_bytes(path, json.dumps(body).encode())
    import datetime

    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=10)
    assert protected.read(root).held == {v1: ("host-1-dead",)}
    from beam_pipeline.tools import tag

    assert tag.listing(root) == [f"(held)\t{v1}\t1 live lease(s): host-1-dead"]
    assert retention.prune(root, v3, keep=1, keep_superseded_hours=0, now=later) == [v2]
    assert _complete(root) == [v1, v3]
    stamp = time.time() - 31  # its last renewal 31 s ago, by the storage's clock
    os.utime(path, (stamp, stamp))
    assert protected.read(root).held == {}
    assert retention.prune(root, v3, keep=1, keep_superseded_hours=0) == [v1]
    assert not os.path.exists(path)


HOLDER = """
import sys, time
from loaders import RecordSource
source = RecordSource(sys.argv[1], "train", version=sys.argv[2], hold=float(sys.argv[3]))
print("held", flush=True)
time.sleep(120)
"""


def _holder(root, version, seconds):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, root, version, str(seconds)],
                            stdout=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert proc.stdout.readline() == "held\n"
    return proc


def test_killed_holders_leases_lapse_and_the_next_retention_removes_the_version(nights):
    """Two hosts hold V1 (2 s leases, renewed every 0.5 s). One is SIGKILLed: the other's
    lease still holds V1. Then the other too: V1 stays until its lease lapses, and the next
    retention removes V1 and both leases."""
    from beam_pipeline.store import protected, retention

    root, (v1, v2, v3), content = nights
    first, second = _holder(root, v1, 2), _holder(root, v1, 2)
    try:
        assert len(protected.read(root).held[v1]) == 2
        first.send_signal(signal.SIGKILL)
        first.wait()
        time.sleep(2.5)
        assert len(protected.read(root).held[v1]) == 1  # the live host renews its own
        assert retention.prune(root, v3, keep=1, keep_superseded_hours=0) == [v2]
        second.send_signal(signal.SIGKILL)
        second.wait()
        assert retention.prune(root, v3, keep=1, keep_superseded_hours=0) == []
        _whole(root, v1, content)
        time.sleep(2.5)
        assert retention.prune(root, v3, keep=1, keep_superseded_hours=0) == [v1]
        assert _complete(root) == [v3]
        assert not os.listdir(layout.holds_dir(root, v1))
    finally:
        for proc in (first, second):
            proc.kill()
            proc.wait()


def test_a_hold_renews_and_ends_with_its_reader(nights):
    import gc

    from dataset_format import holds, storage
    from loaders import RecordSource

    root, (v1, _, _), _ = nights
    source = RecordSource(root, "train", version=v1, hold=0.4)
    hold = holds.held()[(root, v1)]
    time.sleep(0.5)
    assert hold.renewals >= 3  # written, then every 0.1 s
    [(path, _)] = storage.stamped(layout.holds_dir(root, v1))
    assert json.loads(storage.read_bytes(path))["seconds"] == 0.4
    del source
    gc.collect()
    assert holds.held() == {} and storage.stamped(layout.holds_dir(root, v1)) == []


# --- a removed version, in one line ----------------------------------------------------------

def test_a_removed_version_is_said_so_in_one_line(nights):
    import readers
    from beam_pipeline.store import retention
    from dataset_format.removal import VersionRemoved
    from loaders import RecordSource, SequentialRecords

    root, (v1, v2, v3), content = nights
    early = readers.info(root, version=v1)  # opened before retention ran
    stream = iter(SequentialRecords(early, "train", decode=False, read_bytes=1))
    next(stream)
    retention.prune(root, v3, keep=1, keep_superseded_hours=0)
    said = (f"version {v1} of {root} was removed by retention (--keep_versions); to keep a "
            "version a job reads, hold it while reading")
    with pytest.raises(VersionRemoved) as e:
        readers.info(root, version=v2)  # retired: its directory holds shared shards
    assert str(e.value).startswith(said.replace(v1, v2)) and "\n" not in str(e.value)
    with pytest.raises(VersionRemoved, match=f"^version '{v1}' does not exist under {root}: "
                       r"retention removed it \(--keep_versions\), or it was never published; "
                       "to keep a version a job reads, hold it"):
        readers.info(root, version=v1)  # gone whole
    with pytest.raises(VersionRemoved, match=r"^" + said.replace("(", r"\(").replace(")", r"\)")):
        RecordSource(early, "train")  # before any record is read
    with pytest.raises(VersionRemoved, match=f"version {v1} of"):
        list(stream)  # mid-read
    with pytest.raises(VersionRemoved, match="hold it while reading"):
        RecordSource(root, "train", version=v1, hold=True)
    from beam_pipeline.tools import verify

    assert verify.main([layout.version_dir(root, v1)]) == 2


@pytest.mark.slow  # TensorFlow
def test_make_dataset_on_a_removed_version_or_tag_fails_before_reading(nights):
    import readers
    from beam_pipeline.store import retention
    from dataset_format.removal import VersionRemoved

    root, (v1, v2, v3), _ = nights
    meta = readers.info(root, version=v1)
    retention.prune(root, v3, keep=1, keep_superseded_hours=0)
    with pytest.raises(VersionRemoved, match=f"^version {v1} of {root} was removed"):
        readers.make_dataset(meta, "train", batch_size=4, image_size=8)
    os.makedirs(os.path.join(root, layout.TAGS))
    with open(layout.tag_file(root, "old"), "w") as f:
        f.write(json.dumps({"version": v2}))
    with pytest.raises(VersionRemoved, match=f"^tag 'old' names version {v2}, which was removed"):
        readers.make_dataset(root, "train", version="old", batch_size=4, image_size=8)


# --- shipping and linking --------------------------------------------------------------------

def test_a_version_reads_through_a_link_and_from_a_copy_once_materialized(
        nights, tmp_path, capsys):
    from beam_pipeline.tools import materialize, verify

    root, (v1, v2, v3), content = nights
    link = tmp_path / "current"
    os.symlink(layout.version_dir(root, v2), link)
    assert _read_all(str(link)) == content[v2]
    # A copy without the shards it shares: verify says so, and what to do.
    early = tmp_path / "early-copy"
    shutil.copytree(layout.version_dir(root, v2), early)
    assert verify.main([str(early)]) == 1
    err = capsys.readouterr().err
    assert "is a copy without the" in err and f"shares with version(s) {v1}" in err
    assert f"materialize ROOT --version {v2}" in err and "--force" not in err
    # Self-contained: the manifest and catalog name only its own files, which are V1's
    # shards hard-linked; a copy of the directory reads anywhere and verifies.
    assert materialize.main([root, "--version", v2]) == 0
    manifest = json.load(open(os.path.join(root, "versions", v2, layout.MANIFEST)))
    paths = [sh["path"] for s in manifest["splits"].values() for sh in s["shards"]]
    assert not [p for p in paths if p.startswith("../")] and manifest["tfds"]["shared_shards"] == 0
    assert materialize.materialize(root, v2)[1:] == (0, 0)  # nothing left to place
    shipped = tmp_path / "shipped"
    shutil.copytree(layout.version_dir(root, v2), shipped)
    assert _read_all(str(shipped)) == content[v2]
    assert verify.main([str(shipped)]) == 0
    assert verify.check(root)["problems"] == [] and verify.check(str(link))["problems"] == []
    # A partial copy: one of its own shards left out.
    os.remove(shipped / paths[0])
    capsys.readouterr()
    assert verify.main([str(shipped)]) == 1
    assert "is a partial copy (1 of its own shard(s) missing)" in capsys.readouterr().err


# --- through real builds, and on gs:// -------------------------------------------------------

@pytest.mark.slow  # five builds
def test_a_reader_holding_a_version_reads_all_of_it_after_five_nightly_builds(tmp_path):
    """A training job holds V (the loader's lease, renewed in the background) while five
    nightly builds with --keep_versions 1 --keep_superseded_hours 0 each rewrite the data
    and retire what they can: on the last night the job still reads every record of V."""
    from loaders import SequentialRecords

    make_images(tmp_path / "src", {"cat": 12, "dog": 12})
    root = str(tmp_path / "root")
    first = build([tmp_path / "src"], root, *ARGS)
    want = _read_all(root)
    job = SequentialRecords(root, "train", version=first["version"], decode=False, hold=30)
    args = [*ARGS, "--keep_versions", "1", "--keep_superseded_hours", "0"]
    for night in range(5):
        make_images(tmp_path / "src", {"cat": {f"n{night}.jpg": image_bytes((night, 9, 9))}})
        if night % 2:
            victim = sorted(os.listdir(tmp_path / "src" / "dog"))[0]
            os.remove(tmp_path / "src" / "dog" / victim)
        latest = build([tmp_path / "src"], root, *args)
    assert _complete(root) == [first["version"], latest["version"]]  # the rest retired
    got = {ex.key: bytes(ex.image) for ex in job}
    assert got == {k: data for k, (split, data) in want.items() if split == "train"}
    del job
    import gc

    gc.collect()  # the job ends: its lease is deleted, the next night retires V
    make_images(tmp_path / "src", {"owl": 2})
    build([tmp_path / "src"], root, *args)
    assert first["version"] not in _complete(root)


@pytest.mark.slow  # the GCS emulator
def test_tags_and_holds_on_gcs_cost_one_request_a_renewal(gcs, gcs_bucket, tmp_path,
                                                          gcs_counter):
    from beam_pipeline import cli
    from beam_pipeline.store import protected, retention, tags, versions
    from dataset_format import holds
    from loaders import RecordSource

    make_images(tmp_path / "in", {"cat": 4, "dog": 4})
    base = f"gs://{gcs_bucket}"
    gcs.upload_tree(tmp_path / "in", f"{base}/in")
    root = f"{base}/ds"
    opts = ["--name", "pets", "--num_shards", "2", "--no_transform", "--keep_versions", "1",
            "--keep_superseded_hours", "0"]

    def night(extra):
        gcs.upload_bytes(f"{base}/in/cat/{extra}.jpg", image_bytes((len(extra), 200, 9)))
        result = cli.run(["--input", f"{base}/in", "--output", root, *opts])
        assert result.status == "published", result
        return result.version

    v1 = night("a")
    tags.create(root, "paper", v1)
    v2 = night("b")
    assert gcs.read_json(f"{root}/tags/paper")["version"] == v1
    source = RecordSource(root, "train", version=v2, hold=4)
    hold = holds.held()[(root, v2)]
    time.sleep(0.2)
    gcs_counter.reset()
    before = hold.renewals
    time.sleep(2.2)  # two renewals, one a second
    renewals = hold.renewals - before
    assert renewals >= 2
    totals = gcs_counter.totals()
    assert (totals.get("upload"), totals["requests"]) == (renewals, renewals), totals  # O(1)
    assert protected.read(root).held.keys() == {v2}
    v3 = night("c")
    v4 = night("d")
    from tests.test_shared_shards import _read_all as read_gcs

    assert sorted(v for v, done in versions.list_versions(root).items() if done) == [v1, v2, v4]
    assert len(source) and read_gcs(root, v2) and read_gcs(root, "paper")
    del source
    import gc

    gc.collect()
    assert not gcs.list(f"{root}/holds/{v2}/")  # released
    tags.delete(root, "paper")
    assert retention.prune(root, v4, keep=1, keep_superseded_hours=0) == [v1, v2]
    assert v3


@pytest.mark.slow  # builds in processes, killed
def test_a_build_killed_at_random_points_leaves_every_version_with_a_manifest_whole(
        three_nights, nights):
    """The same promise end to end: a nightly build with --keep_versions 1
    --keep_superseded_hours 0 SIGKILLed at seeded random times (before, during and after
    its publish and prune); every version that has a manifest then verifies, and the
    next build publishes."""
    import random

    from beam_pipeline.tools import verify

    root, (v1, v2, v3), _ = nights
    src = os.path.join(os.path.dirname(root), "src")
    shutil.copytree(three_nights[0] / "src", src)
    rng = random.Random(7)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = [sys.executable, "-m", "beam_pipeline", "--input", src, "--output", root, *ARGS,
           "--keep_versions", "1", "--keep_superseded_hours", "0"]
    for night in range(4):
        make_images(src, {"owl": {f"k{night}.jpg": image_bytes((night, 50, 50))}})
        proc = subprocess.Popen(cmd, cwd=repo, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(2.0, 9.0))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for v in _complete(root):
            assert verify.check(layout.version_dir(root, v))["problems"] == [], v
    done = subprocess.run(cmd, cwd=repo, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for v in _complete(root):
        assert verify.check(layout.version_dir(root, v))["problems"] == [], v


FOUR_READERS = """
import sys
import tf_quiet
tf_quiet.install(False)
import readers
from beam_pipeline.store import retention
root, v1, v3 = sys.argv[1:4]
opened = []
for i in range(4):  # two training, two evaluation readers, each one batch in
    ds = readers.make_dataset(root, "train", version=v1, batch_size=4, image_size=16,
                              training=i % 2 == 0, seed=1, shuffle_buffer=2)
    it = iter(ds)
    next(it)
    opened.append(it)
retention.prune(root, v3, keep=1, keep_superseded_hours=0)
for it in opened:
    try:
        for _ in it:
            pass
        print("read to the end", flush=True)
    except Exception as e:
        print("failed:", " ".join(str(e).split()), flush=True)
"""


@pytest.mark.slow  # TensorFlow in a process
def test_readers_whose_version_is_removed_mid_read_say_so_and_the_process_goes_on(nights):
    """Four readers open on V1 when retention removes it: each reads on (an open file
    outlives its deletion locally) or fails with the one line saying retention removed the
    version; never "not a decodable image record", and the process ends normally."""
    root, (v1, v2, v3), _ = nights
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", FOUR_READERS, root, v1, v3], cwd=repo,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 4, done.stdout
    failed = [line for line in lines if line.startswith("failed:")]
    assert failed, lines  # the training readers had files to open after the prune
    for line in failed:
        assert f"version {v1} of {root} was removed by retention (--keep_versions)" in line
    assert "not a decodable image record" not in done.stdout + done.stderr


@pytest.mark.slow  # a build in a process
def test_tagging_and_materialize_beside_a_build_with_retention(three_nights, nights, capsys):
    """A build with --keep_versions 1 --keep_superseded_hours 0 runs (it will drop V1 and
    V2); tagging V2 and materializing it with --wait wait for its lock, then find V2 gone and
    say so (exit 2), or, had they come first, keep it whole: never a tag or a materialized
    manifest naming a version whose files retention deleted."""
    from beam_pipeline.tools import materialize, tag, verify

    root, (v1, v2, v3), _ = nights
    src = os.path.join(os.path.dirname(root), "src")
    shutil.copytree(three_nights[0] / "src", src)
    make_images(src, {"owl": {"late.jpg": image_bytes((5, 50, 50))}})
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen([sys.executable, "-m", "beam_pipeline", "--input", src, "--output",
                             root, *ARGS, "--keep_versions", "1", "--keep_superseded_hours",
                             "0"], cwd=repo, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:  # the build holds the root
            try:
                with open(layout.lock_file(root)) as f:
                    if json.load(f).get("pid") == proc.pid:
                        break
            except (FileNotFoundError, ValueError):
                pass
            time.sleep(0.05)
        else:
            raise AssertionError("the build never took the lock")
        capsys.readouterr()
        tagged = tag.main([root, "create", "paper", v2, "--wait"])
        placed = materialize.main([root, "--version", v2, "--wait"])
        out = capsys.readouterr()
    finally:
        assert proc.wait(timeout=300) == 0
    assert "waiting: " in out.err  # they waited for the build
    assert (tagged, placed) == (2, 2), out
    assert f"version {v2} is not a published version" in out.err
    assert (f"version {v2} of {root} was removed by retention" in out.err
            or f"version '{v2}' does not exist under {root}: retention removed it" in out.err)
    assert not os.path.exists(layout.tag_file(root, "paper"))
    assert _complete(root) and v2 not in _complete(root)
    for v in _complete(root):
        assert verify.check(layout.version_dir(root, v))["problems"] == [], v
