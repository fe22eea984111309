"""Dataflow submission, proven offline.

The CLI runs with `--runner DataflowRunner … --template_location gs://…` against the storage
emulator (tests/gcs_emulator.py). That makes Beam do everything a real submission does up to
the service call: build the Runner v2 job description, build the sdist from setup.py, stage it
and the pipeline proto to --staging_location, and write the job file to the template location;
with a template location Beam does not call the Dataflow API at all (nothing is stubbed). The
Dataflow service itself cannot run here, so what is checked is what it would receive. The
CLI takes --template_location only inside the Flex Template launcher (whose image sets
FLEX_TEMPLATE_PYTHON_PY_FILE; the `flex_launcher` fixture sets it as the image does);
anywhere else it is a classic template, refused (tests/test_edges.py).
"""

import hashlib
import io
import re
import shutil
import sys
import tarfile

import pytest

from tests.helpers import REPO

PROJECT, REGION = "demo-project", "us-central1"
IMAGE = "us-central1-docker.pkg.dev/demo-project/images/image-tfrecords-worker:2.77.0"


@pytest.fixture
def source_copy(tmp_path):
    """setup.py + the packages, copied: the sdist build writes egg-info next to setup.py, and
    the shared working tree is not ours to litter."""
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for package in ("beam_pipeline", "dataset_format", "tf_quiet", "readers"):
        shutil.copytree(REPO / package, src / package, ignore=ignore)
    shutil.copy(REPO / "setup.py", src / "setup.py")
    return src


@pytest.fixture
def flex_launcher(monkeypatch):
    """The Flex Template launcher image's environment (configs/flex_template/Dockerfile)."""
    monkeypatch.setenv("FLEX_TEMPLATE_PYTHON_PY_FILE", "/template/main.py")


def _upload_images(gcs, bucket, tmp_path, make_images):
    make_images(tmp_path / "in", {"daisy": 2, "rose": 2})
    gcs.upload_tree(tmp_path / "in", f"gs://{bucket}/in")
    return f"gs://{bucket}/in"


def _cloud_args(bucket):
    return ["--project", PROJECT, "--region", REGION,
            "--temp_location", f"gs://{bucket}/dataflow/tmp",
            "--staging_location", f"gs://{bucket}/dataflow/staging",
            "--template_location", f"gs://{bucket}/templates/flowers.json"]


def _staged(gcs, location):
    """'storage.googleapis.com/bucket/path' (as in a job file) -> bytes from the emulator."""
    return gcs.read("gs://" + location.split("storage.googleapis.com/", 1)[1])


def _pipeline_proto(data):
    from apache_beam.portability.api import beam_runner_api_pb2

    proto = beam_runner_api_pb2.Pipeline()
    proto.ParseFromString(data)
    return proto


@pytest.mark.slow
def test_dataflow_job_with_setup_file(gcs, gcs_bucket, tmp_path, make_images,
                                      source_copy, capsys, flex_launcher):
    from beam_pipeline import cli

    source = _upload_images(gcs, gcs_bucket, tmp_path, make_images)
    root = f"gs://{gcs_bucket}/datasets/flowers"
    code = cli.main(["--config", str(REPO / "configs" / "dataflow.yaml"),
                     "--input", source, "--output", root, "--name", "flowers",
                     "--num_shards", "3", "--no_transform",
                     "--setup_file", str(source_copy / "setup.py")] + _cloud_args(gcs_bucket))
    assert code == 0
    assert "no job started" in capsys.readouterr().out

    job = gcs.read_json(f"gs://{gcs_bucket}/templates/flowers.json")
    env = job["environment"]
    options = env["sdkPipelineOptions"]["options"]
    # Where and how it runs: from the command line and configs/dataflow.yaml
    assert (options["project"], options["region"]) == (PROJECT, REGION)
    assert options["runner"] == "DataflowRunner"
    pool = env["workerPools"][0]
    assert pool["machineType"] == "n2-standard-4"
    assert pool["diskSizeGb"] == 50
    assert pool["autoscalingSettings"]["maxNumWorkers"] == 20
    assert "use_runner_v2" in env["experiments"]
    # The build options travel with the job (the workers and the commit step read them)
    assert options["input"] == [source] and options["output"] == root
    assert (options["name"], options["num_shards"], options["transform"]) == ("flowers", 3, False)
    assert options["max_error_rate"] == 0.01 and options["write_index"] is True

    # Staged: the sdist built from setup.py, and the pipeline proto the job file points to.
    packages = {p["name"]: p["location"] for p in pool["packages"]}
    assert "workflow.tar.gz" in packages
    with tarfile.open(fileobj=io.BytesIO(_staged(gcs, packages["workflow.tar.gz"]))) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
        pkg_info = sdist.extractfile(next(n for n in sdist.getnames()
                                          if n.endswith("/PKG-INFO") and n.count("/") == 1))
        assert "Name: image-tfrecords" in pkg_info.read().decode()
    assert {"setup.py", "beam_pipeline/job/shards.py", "beam_pipeline/job/commit.py",
            "readers/dataset.py", "dataset_format/layout.py", "tf_quiet/__init__.py"} <= names
    proto_bytes = gcs.read(options["pipelineUrl"])
    assert hashlib.sha256(proto_bytes).hexdigest() == options["pipelineProtoHash"]
    proto = _pipeline_proto(proto_bytes)

    steps = {t.unique_name for t in proto.components.transforms.values()}
    for step in ("ShardIndex", "ReadShardIndex", "ToWorkers", "WriteShards", "Commit/AllShards",
                 "Commit/WriteManifest"):
        assert f"ImagesToTFRecords/{step}" in steps, step
    # The workers' environment: the default Beam image for this SDK, plus the staged sdist
    (environment,) = proto.components.environments.values()
    assert any(d.role_urn.endswith("staging_to:v1") and b"workflow.tar.gz" in d.role_payload
               for d in environment.dependencies)
    _assert_graph_scales(proto)

    # The launcher wrote the listing the job reads; nothing is published until the job runs.
    listings = [u for u in gcs.list(f"{root}/") if "/.tmp/listing/" in u]
    assert 1 <= len(listings) <= 4  # one file per non-empty shard, 4 images in all
    assert sum(len(gcs.read(u).decode().splitlines()) for u in listings) == 4
    assert not gcs.exists(f"{root}/LATEST")
    assert not [r for r in gcs.proxy.refused if "google" in r], gcs.proxy.refused


def _assert_graph_scales(proto):
    """No step gathers images, records or even per-image refs. The groupings: one spreads
    the shard tasks over workers; commit's list of every shard is fed slim results (no
    label counts, no error records); the label counts are combined, and the error records
    written, by their own steps."""
    transforms = proto.components.transforms
    producer = {}
    for t in transforms.values():
        if not t.subtransforms:
            for pcoll in t.outputs.values():
                producer[pcoll] = t
    groupings = sorted(
        (t.unique_name, producer[next(iter(t.inputs.values()))].unique_name)
        for t in transforms.values() if t.spec.urn == "beam:transform:group_by_key:v1")
    assert groupings == [
        ("ImagesToTFRecords/Commit/AllShards/AllShards/CombinePerKey/GroupByKey",
         "ImagesToTFRecords/Commit/AllShards/AllShards/KeyWithVoid"),
        ("ImagesToTFRecords/Commit/LabelCounts/CombinePerKey/GroupByKey",
         "ImagesToTFRecords/Commit/LabelCounts/KeyWithVoid"),
        ("ImagesToTFRecords/Commit/WriteErrors/Write/WriteImpl/GroupByKey",
         "ImagesToTFRecords/Commit/WriteErrors/Write/WriteImpl/WindowInto(WindowIntoFn)"),
        ("ImagesToTFRecords/ToWorkers/ReshufflePerKey/GroupByKey",
         "ImagesToTFRecords/ToWorkers/ReshufflePerKey/Map(reify_metadata_default_window)"),
    ]
    # ... the list is fed slim results, the combine and the error lines the writers' own.
    def fed_by(suffix):
        t = next(t for t in transforms.values() if t.unique_name.endswith(suffix))
        return producer[next(iter(t.inputs.values()))].unique_name

    assert fed_by("AllShards/KeyWithVoid") == "ImagesToTFRecords/Commit/Slim"
    for step in ("Commit/Slim", "LabelCounts/KeyWithVoid", "Commit/ErrorLines"):
        assert fed_by(step) == "ImagesToTFRecords/WriteShards", step


@pytest.mark.slow
def test_dataflow_job_with_custom_container(gcs, gcs_bucket, tmp_path, make_images,
                                            flex_launcher):
    """--sdk_container_image instead of --setup_file: the job names the image, stages no sdist."""
    from beam_pipeline import cli

    source = _upload_images(gcs, gcs_bucket, tmp_path, make_images)
    result = cli.run(["--runner", "DataflowRunner", "--input", source,
                      "--output", f"gs://{gcs_bucket}/ds", "--no_transform",
                      "--machine_type", "n2-standard-4", "--max_num_workers", "5",
                      "--sdk_container_image", IMAGE] + _cloud_args(gcs_bucket))
    assert result.status == "submitted" and result.job_id is None
    assert result.template == f"gs://{gcs_bucket}/templates/flowers.json"

    env = gcs.read_json(result.template)["environment"]
    pool = env["workerPools"][0]
    assert [i["containerImage"] for i in pool["sdkHarnessContainerImages"]] == [IMAGE]
    assert _worker_installs(pool) == [], "workers would pip-install at start-up"
    assert pool["autoscalingSettings"]["maxNumWorkers"] == 5


def _worker_installs(pool):
    """Staged files a worker installs at start-up (sdist, wheels, requirements, Beam SDK).
    Not counted: the pipeline proto, and Beam's `pip freeze` of the submitting machine, which
    workers only compare with their own to log differences. None: the image is all a VM needs."""
    informational = {"pipeline.pb", "submission_environment_dependencies.txt"}
    return [p["name"] for p in pool.get("packages", []) if p["name"] not in informational]


MAIN = REPO / "configs" / "flex_template" / "main.py"


def _flex_launch(monkeypatch, argv, image=IMAGE):
    """Run configs/flex_template/main.py as the Flex launcher does: `python main.py` with the
    template parameters as --name=value, then its own options, in the launcher image's
    environment (IMAGE_TFRECORDS_WORKER_IMAGE from the Dockerfile's WORKER_IMAGE). The
    launcher then reads the job file at --template_location and submits it; that part is the
    Dataflow service (not run here)."""
    import runpy

    monkeypatch.setenv("IMAGE_TFRECORDS_WORKER_IMAGE", image)
    monkeypatch.setenv("FLEX_TEMPLATE_PYTHON_PY_FILE", str(MAIN))  # the launcher image's
    monkeypatch.setattr(sys, "argv", [str(MAIN)] + argv)
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(MAIN), run_name="__main__")
    return exit_.value.code


def _flex_argv(bucket, source, root):
    job_file = f"gs://{bucket}/staging/template_launches/2026-01-01_02_00_00-42/job_object"
    return [f"--input={source}", f"--output={root}", "--name=flowers", "--keep_versions=7",
            f"--project={PROJECT}", f"--region={REGION}", f"--temp_location=gs://{bucket}/tmp",
            f"--staging_location=gs://{bucket}/staging", f"--template_location={job_file}"]


@pytest.mark.slow
def test_flex_launch_of_an_unchanged_dataset_exits_0_with_a_no_op_job(
        gcs, gcs_bucket, tmp_path, make_images, monkeypatch, capsys):
    """An unchanged night: main.py exits 0, says "up to date" and writes a one-step job
    file (one worker, the worker image, nothing to install), because the Flex launcher fails
    a launch whose program wrote none. Nothing under the dataset root changes."""
    from tests.helpers import build

    source = _upload_images(gcs, gcs_bucket, tmp_path, make_images)
    root = f"gs://{gcs_bucket}/datasets/flowers"
    build(source, root, "--name", "flowers", "--keep_versions", "7")  # the published version
    before = sorted(gcs.list(f"{root}/"))
    capsys.readouterr()

    argv = _flex_argv(gcs_bucket, source, root)
    assert _flex_launch(monkeypatch, argv) == 0
    out = capsys.readouterr().out
    assert f"{root}: up to date (version " in out and "no-op job file" in out

    job = gcs.read_json(argv[-1].split("=", 1)[1])
    pool = job["environment"]["workerPools"][0]
    assert (pool["numWorkers"], pool["autoscalingSettings"]["maxNumWorkers"]) == (1, 1)
    assert [i["containerImage"] for i in pool["sdkHarnessContainerImages"]] == [IMAGE]
    assert _worker_installs(pool) == []
    options = job["environment"]["sdkPipelineOptions"]["options"]
    proto = _pipeline_proto(gcs.read(options["pipelineUrl"]))
    names = {t.unique_name for t in proto.components.transforms.values()}
    assert {"UpToDate", "Log"} <= names and not any("ImagesToTFRecords" in n for n in names)
    assert sorted(gcs.list(f"{root}/")) == before  # no version, no listing, no lock left


def test_worker_dockerfile_matches_pinned_versions():
    """The custom container must carry the Beam version (and Python minor) the job is built
    with, or the Dataflow workers refuse / mis-decode the pipeline."""
    import apache_beam

    dockerfile = (REPO / "docker" / "worker.Dockerfile").read_text()
    python, beam = re.search(r"^FROM apache/beam_python(\d+\.\d+)_sdk:(\S+)\s*$", dockerfile,
                             re.M).groups()
    pinned = re.search(r"^apache-beam==(\S+)$", (REPO / "constraints.txt").read_text(),
                       re.M).group(1)
    assert beam == pinned == apache_beam.__version__
    assert python == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert IMAGE.endswith(f":{pinned}")
    for source in re.findall(r"^COPY (.+) \S+$", dockerfile, re.M):
        for path in source.split():
            assert (REPO / path).exists(), path
    # The tested stack, checked at build time; no TensorFlow unless EXTRAS asks for it.
    assert 'ARG EXTRAS=""' in dockerfile
    assert '-c constraints.txt ".${EXTRAS:+[$EXTRAS]}"' in dockerfile  # offline: test_containers
    assert "python check_pins.py constraints.txt" in dockerfile


@pytest.mark.parametrize("argv, waits", [
    (["--runner", "FlinkRunner"], True),                    # embedded Flink: LOOPBACK
    (["--runner", "FlinkRunner", "--flink_master", "jm:8081",
      "--environment_type", "DOCKER"], False),
    (["--runner", "FlinkRunner", "--flink_master", "jm:8081"], False),
    (["--runner", "SparkRunner"], True),                    # local[4]: LOOPBACK
    (["--runner", "SparkRunner", "--spark_master_url", "spark://m:7077"], False),
    (["--runner", "PortableRunner", "--environment_type", "LOOPBACK"], True),
    (["--runner", "DataflowRunner"], False),
])
def test_launcher_waits_when_workers_live_in_it(argv, waits):
    """A non-waiting launcher returns after submission; with LOOPBACK workers (Beam's default
    for a local Flink/Spark master) that would kill the job, so the CLI waits instead."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_pipeline.launcher.runner import workers_in_launcher

    assert workers_in_launcher(PipelineOptions(argv), argv[1]) is waits



def _run_job_file(gcs, job_file):
    """What the Dataflow service would run, run here: the pipeline proto the job file points
    to, on Beam's FnApiRunner, with its environments swapped for in-process workers (the
    service and the worker image are what is not run)."""
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.portability import python_urns
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    options = gcs.read_json(job_file)["environment"]["sdkPipelineOptions"]["options"]
    proto = _pipeline_proto(gcs.read(options["pipelineUrl"]))
    for environment in proto.components.environments.values():
        environment.urn = python_urns.EMBEDDED_PYTHON
        environment.payload = b""
    FnApiRunner().run_via_runner_api(proto, PipelineOptions([])).wait_until_finish()


@pytest.fixture
def preconditions(gcs, monkeypatch):
    """google-cloud-storage through tests/faults.py's proxy, with no faults: it enforces the
    generation preconditions the emulator ignores (the lock and LATEST depend on them)."""
    from tests.faults import FaultProxy

    with FaultProxy(gcs.endpoint) as proxy:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        yield proxy


@pytest.mark.slow
def test_flex_launch_hands_the_lock_to_its_job_which_keeps_it_and_releases_it(
        gcs, gcs_bucket, preconditions, tmp_path, make_images, monkeypatch, capsys):
    """The Flex launcher runs main.py with --template_location and submits the job file
    after main.py exits. The lock must outlive main.py: handed to the job (state
    "submitted", the version), a second launch exits 2 naming it, the job's workers beat
    it, and the job's commit stage releases it after publishing."""
    from beam_pipeline.store import lock, lock_gcs, versions

    source = _upload_images(gcs, gcs_bucket, tmp_path, make_images)
    root = f"gs://{gcs_bucket}/datasets/flowers"
    argv = _flex_argv(gcs_bucket, source, root)
    assert _flex_launch(monkeypatch, argv) == 0
    assert "no job started" in capsys.readouterr().out
    holder, _, _ = lock_gcs.GcsLock(root)._read()
    assert holder["state"] == "submitted" and "job_heartbeat" not in holder
    # configs/dataflow.yaml applied: workers at start, disk, and the run's bound (max_hours
    # 20) both in the job and on the lock
    job = gcs.read_json(argv[-1].split("=", 1)[1])
    pool = job["environment"]["workerPools"][0]
    assert (pool["numWorkers"], pool["diskSizeGb"]) == (10, 50)
    assert "max_workflow_runtime_walltime_seconds=72000" in job["environment"]["serviceOptions"]
    assert holder["deadline"] > holder["started"]
    version = holder["version"]
    assert gcs.exists(f"{root}/versions/{version}/.tmp/shards.jsonl")
    assert not gcs.exists(f"{root}/LATEST")

    # The next night's launch while that job runs (or waits for workers): exit 2, one line.
    again = argv[:-1] + [argv[-1].replace("-42/", "-43/")]
    assert _flex_launch(monkeypatch, again) == 2
    err = capsys.readouterr().err
    assert f"locked by version {version}, submitted to a runner" in err
    assert "no job heartbeat yet" in err and "60 min after submission" in err
    assert not gcs.exists(again[-1].split("=", 1)[1])  # no second job file

    beats = []
    real_beat = lock_gcs.GcsLock.beat_for_job
    monkeypatch.setattr(lock_gcs.GcsLock, "beat_for_job",
                        lambda self, v: beats.append(self.holder()) or real_beat(self, v))
    try:
        _run_job_file(gcs, argv[-1].split("=", 1)[1])
    finally:
        lock.stop_keep_alive()
    assert beats and beats[0]["version"] == version  # the workers beat the job's lock
    assert versions.latest(root)[0] == version
    assert not gcs.exists(lock.lock_path(root))  # released by the job's commit stage
