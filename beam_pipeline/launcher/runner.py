"""Which runner, whether the launcher waits for it, and starting the job.

Runners that execute in this process (the DirectRunner family, and Flink/Spark with
LOOPBACK workers) are waited for and reported on; the others (Dataflow) are submitted and
the job's last step publishes, so the launcher may exit.
"""

import dataclasses
import time

from beam_pipeline.job.pipeline import ImagesToTFRecords
from beam_pipeline.launcher.report import ProgressPrinter
from beam_pipeline.store import files, lock
from dataset_format import layout
from dataset_format.manifest import Manifest

SMALL_JOB = 2000  # images to convert below which local worker processes are not started
# Images to convert from which worker threads give way to worker processes: processes cost
# ~1.5-1.9 s more to start, threads lose to the GIL as the job grows (20,000 photographs,
# wall seconds threads / processes: --validate header 9.3 / 7.2, default 12.6 / 12.2,
# --reencode always 22.7 / 22.7; at 5,000: 4.3 / 5.7, 5.1 / 7.0, 7.9 / 9.5).
PROCESSES_FROM = {"header": 6_000, "decode": 15_000}
IN_PROCESS = ("DirectRunner", "BundleBasedDirectRunner", "FnApiRunner", "SwitchingDirectRunner",
              "PrismRunner")


@dataclasses.dataclass(frozen=True)
class Published:
    """A waited-for build: the version is published (LATEST names it)."""

    version: str
    manifest: object  # dataset_format.manifest.Manifest
    version_dir: str
    seconds: float
    status: str = dataclasses.field(default="published", init=False)


@dataclasses.dataclass(frozen=True)
class Submitted:
    """A job handed to a remote runner (or a template written): its commit step publishes."""

    version: str
    result: object            # the runner's PipelineResult
    job_id: object = None     # None for a template, or a runner without job ids
    template: str = None      # the job file written instead of starting a job
    status: str = dataclasses.field(default="submitted", init=False)


def choose(pipeline_options, to_convert, build):
    """Sets the runner (FnApiRunner by default) and, with a per-core worker count, the local
    engine for the job's size; returns (runner name, whether the launcher waits for it)."""
    from apache_beam.options.pipeline_options import DirectOptions, StandardOptions

    standard = pipeline_options.view_as(StandardOptions)
    # No --runner: the DirectRunner's batch engine, named directly. Plain DirectRunner
    # first tries to download and start Prism, whose workers and memory behave differently.
    standard.runner = runner = standard.runner or "FnApiRunner"
    name = runner.split(".")[-1]
    waits = name in IN_PROCESS or workers_in_launcher(pipeline_options, name)
    direct = pipeline_options.view_as(DirectOptions)
    if name in ("FnApiRunner", "DirectRunner") and direct.direct_num_workers == 0:
        # An explicit worker count pins the engine; one per core lets the job's size pick.
        direct.direct_running_mode = local_engine(direct.direct_running_mode, to_convert, build)
        if direct.direct_running_mode == "in_memory":
            direct.direct_num_workers = 1
    return runner, waits


def local_engine(mode, to_convert, build=None):
    """The DirectRunner mode for `to_convert` images, given the configured one and the build's
    options (None: the defaults).

    Processes for a small job (typically incremental) are not worth starting (~5 s, more than
    converting those images on one core): in process. Threads for a large job give way to
    processes: the writer's Python (header walk, Example, framing) holds the GIL, so two
    threads run ~1.3 cores; processes each pay a Beam import but then run a core each.
    A --transform build keeps threads: its analysis stages would import TensorFlow and
    tensorflow-transform in every worker process.
    """
    if mode == "multi_processing" and to_convert < SMALL_JOB:
        return "in_memory"
    validate = getattr(build, "validate", "decode")
    if (mode == "multi_threading" and not getattr(build, "transform", False)
            and to_convert >= PROCESSES_FROM[validate]):
        return "multi_processing"
    return mode


def workers_in_launcher(pipeline_options, runner):
    """Flink/Spark with a local master default to LOOPBACK: the SDK workers live in this
    process, so the launcher must wait (its exit would kill the job)."""
    options = pipeline_options.get_all_options()
    if options.get("environment_type"):
        return options["environment_type"].upper() == "LOOPBACK"
    if runner == "FlinkRunner":
        return options.get("flink_master") in ("[auto]", "[local]")
    if runner == "SparkRunner":
        return str(options.get("spark_master_url") or "").startswith("local")
    return False


def launch(pipeline_options, build, planned, runner, waits):
    """Builds the pipeline and runs it: -> Published (waited for) or Submitted."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import SetupOptions


    spec = planned.spec
    pipeline_options.view_as(SetupOptions).save_main_session = False
    bound_runtime(pipeline_options, runner)
    progress_dir = layout.join(spec.tmp_dir, layout.PROGRESS) if waits else None
    start = time.monotonic()
    p = beam.Pipeline(options=pipeline_options)
    _ = p | "ImagesToTFRecords" >> ImagesToTFRecords(
        planned.shards_index, spec, build.encode_options(), sink=build.sink,
        progress_dir=progress_dir,
        transform_image_size=build.transform_image_size if build.transform else 0,
        writers_per_process=pipeline_options.get_all_options().get(
            "number_of_worker_harness_threads"))
    lock.check_held(spec.root)  # a build whose lock was taken over runs and submits nothing
    if not waits:
        return _submit(p, pipeline_options, spec, runner)
    with ProgressPrinter(progress_dir, planned.images):
        p.run().wait_until_finish()
    seconds = time.monotonic() - start
    vdir = layout.version_dir(spec.root, spec.version)
    # The job's commit ran on a worker: what it published comes back through its file.
    manifest = Manifest.from_json(files.read_bytes(layout.join(vdir, layout.MANIFEST)).decode())
    return Published(spec.version, manifest, vdir, seconds)


def _submit(p, pipeline_options, spec, runner):
    root, version = spec.root, spec.version
    template = pipeline_options.get_all_options().get("template_location")
    # The job outlives us, whether it starts now or from the job file written at
    # --template_location (the Flex launcher submits that file once we exit): hand it the
    # lock; its workers keep it alive and its commit stage releases it.
    lock.hand_off(root, version, max_seconds=_max_seconds(pipeline_options))
    result = p.run()
    if template:  # Dataflow wrote the job file and started nothing: there is no job id
        print(f"Wrote the {runner} job file {template} (no job started). Launching it "
              f"builds version {version} of {root} from the listing taken now.")
        return Submitted(version, result, None, template)
    job_id = _job_id(result)
    print(f"Submitted to {runner}: version {version} is published to {root}/LATEST by the "
          f"job's last step. Job id: {job_id}")
    return Submitted(version, result, job_id)


def _max_seconds(pipeline_options):
    """--max_hours in seconds (None: unbounded)."""
    hours = pipeline_options.get_all_options().get("max_hours") or 0
    return round(hours * 3600) if hours > 0 else None


def bound_runtime(pipeline_options, runner):
    """--max_hours on Dataflow: the service cancels the job after that long (a hung job
    would otherwise run, and keep the root's lock alive, for as long as its workers live)."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions

    seconds = _max_seconds(pipeline_options)
    if seconds and runner.split(".")[-1] == "DataflowRunner":
        cloud = pipeline_options.view_as(GoogleCloudOptions)
        cloud.dataflow_service_options = [
            o for o in (cloud.dataflow_service_options or [])
            if not o.startswith("max_workflow_runtime_walltime_seconds=")
        ] + [f"max_workflow_runtime_walltime_seconds={seconds}"]


def write_no_op_job(pipeline_options, version):
    """Up to date under a job file location (a Flex Template launch): write a one-step job
    there anyway. The Flex launcher fails a launch whose program wrote no job file, and
    Airflow would retry it; this job starts one worker, logs the line and succeeds."""
    import logging

    import apache_beam as beam
    from apache_beam.options.pipeline_options import SetupOptions, WorkerOptions

    line = f"up to date (version {version}); no new version built"
    pipeline_options.view_as(SetupOptions).save_main_session = False
    workers = pipeline_options.view_as(WorkerOptions)
    workers.num_workers = workers.max_num_workers = 1
    p = beam.Pipeline(options=pipeline_options)
    _ = p | "UpToDate" >> beam.Create([line]) | "Log" >> beam.Map(logging.warning)
    p.run()
    print(f"Wrote a no-op job file to {pipeline_options.get_all_options()['template_location']} "
          "(one worker logs 'up to date' and succeeds).")


def _job_id(result):
    """The runner's job id, or None when it has none (e.g. DataflowPipelineResult without a job)."""
    try:
        job_id = getattr(result, "job_id", None)
        return job_id() if callable(job_id) else job_id
    except Exception:
        return None
