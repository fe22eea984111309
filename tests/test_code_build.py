"""One version, one code build: every shard records the build that wrote it, commit refuses
a version whose shards disagree, and reuse compares the build that wrote the previous
version's shards (not the launcher's)."""


import pytest

from beam_pipeline.job import code_build, commit
from beam_pipeline.launcher import policy
from beam_pipeline.store import versions
from dataset_format import layout
from dataset_format.dataset_info import from_manifest
from tests.dataflow_sim import plan
from tests.helpers import make_images

ARGS = ["--name", "mixed", "--num_shards", "2", "--splits", "train=1.0", "--no_transform",
        "--direct_num_workers", "1"]
OTHER = dict(code_build.worker_build(), pillow="0.0.1", libjpeg_turbo="0.0.1")


def _inputs(gcs, tmp_path, spec):
    """Images on gs:// (the emulator) and a root beside them -> (input prefix, root)."""
    bucket = gcs.create_bucket()
    make_images(tmp_path / "in", spec)
    gcs.upload_tree(tmp_path / "in", f"gs://{bucket}/in")
    return f"gs://{bucket}/in", f"gs://{bucket}/out"


def other_worker(monkeypatch):
    """From here on this process is a worker of another build (a re-pushed image)."""
    monkeypatch.setattr(code_build, "worker_build", lambda: dict(OTHER))


@pytest.mark.slow
def test_a_doubled_bundle_on_a_worker_of_another_build_is_refused_naming_both(
        gcs, tmp_path, monkeypatch):
    """Shard 1 runs twice, once per build (a zombie on a worker whose image was re-pushed
    under the same tag); Dataflow commits the other build's attempt. Commit refuses: one
    line naming both builds and a shard of each; nothing published, and a retried commit
    fails the same way. Committing the attempts of one build publishes it, and the manifest
    names that build."""
    src, root = _inputs(gcs, tmp_path, {"cat": 4, "dog": 4})
    job = plan(["--input", src, "--output", root, *ARGS])
    first, second = job.tasks
    mine = [job.attempt(first), job.attempt(second)]
    assert [r.writer.build for r in mine] == [code_build.worker_build()] * 2
    with monkeypatch.context() as m:
        other_worker(m)
        zombie = job.attempt(second)  # same shard, same bytes, another build
    assert zombie.writer.build == OTHER and zombie.written.crc32c == mine[1].written.crc32c
    names = sorted(r.files.path for r in mine)
    expected = (f"shards of two code builds in one version: {names[0]} was written by "
                f"{code_build.describe(code_build.worker_build())}; {names[1]} by "
                f"{code_build.describe(OTHER)}; nothing published (name the worker image by "
                "digest or by the tag docker/image_tag.py prints, and launch from the same "
                "build)")
    for _ in range(2):  # the runner's retry of the commit fails the same way
        with pytest.raises(commit.MixedBuilds) as refused:
            job.commit([mine[0], zombie])
        assert str(refused.value) == expected
    assert "pillow 0.0.1" in expected and "libjpeg_turbo 0.0.1" in expected
    assert versions.latest_id(root) is None


@pytest.mark.slow
def test_the_manifest_names_the_one_build_that_wrote_every_shard(gcs, tmp_path):
    src, root = _inputs(gcs, tmp_path, {"cat": 3, "dog": 3})
    job = plan(["--input", src, "--output", root, *ARGS])
    manifest = job.commit([job.attempt(t) for t in job.tasks])
    assert manifest["build"]["workers"] == code_build.worker_build()
    assert set(code_build.worker_build()) == set(code_build.FIELDS)
    assert code_build.worker_build()["image_tfrecords"] == "0.1.0"


def _previous(workers, generator=None):
    manifest = {"version": "20260101T000000Z", "catalog": {"path": layout.CATALOG, "rows": 1},
                "key_scheme": layout.KEY_SCHEME, "config": {},
                "generator": generator or {"package": "image-tfrecords", "version": "0.0.9"},
                "build": {"converted": 1} if workers is None else {"converted": 1,
                                                                   "workers": workers}}
    return from_manifest("/root/versions/20260101T000000Z", manifest)


def test_reuse_compares_the_build_that_wrote_the_shards_not_the_launchers():
    """The previous launcher's generator differs from this one's, but its shards were
    written by this build: reusable. The same generator with shards of another build: not.
    A version written before builds were recorded is judged by its generator, as before."""
    reuse = policy.ReusePolicy(config={}, splits="train=1.0")
    assert policy.can_reuse(reuse, _previous(code_build.worker_build()))
    assert not policy.can_reuse(reuse, _previous(OTHER, generator=policy.generator()))
    assert policy.can_reuse(reuse, _previous(None, generator=policy.generator()))
    assert not policy.can_reuse(reuse, _previous(None))
    assert policy.writer_build(_previous(OTHER)) == OTHER
    assert policy.writer_build(None) is None


def test_one_build_ignores_shards_that_recorded_none():
    from beam_pipeline.job.contracts import ShardFiles, ShardResult, Writer

    def result(shard, path, build=None):
        return ShardResult("train", shard, files=ShardFiles(path), writer=Writer(build=build))

    build = code_build.worker_build()
    results = [result(0, "a", build), result(1, "b"), ShardResult(None, None)]
    assert commit.one_build(results) == build
    assert commit.one_build([result(0, "a")]) is None
    with pytest.raises(commit.MixedBuilds, match=r"^shards of two code builds in one version: "
                       r"a was written by .*; b by .*pillow 0\.0\.1"):
        commit.one_build(results + [result(1, "b", OTHER)])
