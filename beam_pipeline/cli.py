"""`python -m beam_pipeline`: cheap checks and listing, then the Beam job, then a summary.

Everything that must happen for a version to exist (commit, manifest, LATEST) runs inside
the job; this launcher only prepares, submits and, for runners that wait, reports.
"""

import json
import logging
import os
import sys
import tempfile
import threading
import time

from beam_pipeline import __version__
from beam_pipeline.store import lock
from beam_pipeline.errors import UserError
from beam_pipeline.refs import split_order


@lock.release_on_exit  # the lock taken below is released however run() ends
def run(argv=None):
    """Build one dataset version. Returns a dict describing what happened."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import (DirectOptions, SetupOptions,
                                                      StandardOptions)

    from beam_pipeline.launcher import options as opts
    from beam_pipeline.job import tfds_metadata
    from beam_pipeline.store import files
    from beam_pipeline.job.pipeline import ImagesToTFRecords
    from readers import layout

    pipeline_options, build = opts.parse(argv)
    _require_tensorflow(build)
    root = build.output.rstrip("/")
    _check_writable(root)
    lock.acquire(root, wait=build.wait)  # one build per root: exit 2 (or --wait) if held

    prepared = _prepare(build, root, pipeline_options)
    if prepared["status"] == "up_to_date":
        if pipeline_options.get_all_options().get("template_location"):
            _write_no_op_job(pipeline_options, prepared["version"])
        return prepared
    spec, shards_index = prepared["spec"], prepared["shards_index"]
    version, num_shards = spec.version, spec.num_shards

    pipeline_options.view_as(SetupOptions).save_main_session = False
    standard = pipeline_options.view_as(StandardOptions)
    # No --runner: the DirectRunner's batch engine, named directly. Plain DirectRunner
    # first tries to download and start Prism, whose workers and memory behave differently.
    standard.runner = runner = standard.runner or "FnApiRunner"
    waits = runner.split(".")[-1] in ("DirectRunner", "BundleBasedDirectRunner", "FnApiRunner",
                                      "SwitchingDirectRunner", "PrismRunner")
    waits = waits or _workers_in_launcher(pipeline_options, runner.split(".")[-1])
    progress_dir = layout.join(spec.tmp_dir, "progress") if waits else None
    direct = pipeline_options.view_as(DirectOptions)
    if (runner.split(".")[-1] in ("FnApiRunner", "DirectRunner")
            and direct.direct_num_workers == 0 and prepared["to_convert"] < SMALL_JOB):
        # "One worker per core" (configs/local.yaml), but starting and stopping worker
        # processes (~5 s) costs more than converting this few images on one core: a small
        # (typically incremental) job runs in process. An explicit worker count is kept.
        direct.direct_running_mode, direct.direct_num_workers = "in_memory", 1
    n_images = prepared["images"]
    print(f"Building {root} version {version}: {n_images} images "
          f"({prepared['bytes'] / 2**20:.1f} MiB) in "
          f"{', '.join(f'{s}: {n} shard(s)' for s, n in sorted(num_shards.items()))}; "
          f"{prepared['rejected']} rejected while listing, {spec.duplicates} duplicate(s).",
          flush=True)

    start = time.monotonic()
    p = beam.Pipeline(options=pipeline_options)
    _ = p | "ImagesToTFRecords" >> ImagesToTFRecords(
        shards_index, spec, build.encode_options(), sink=build.sink, progress_dir=progress_dir,
        extra_files=(tfds_metadata.write,),  # TFDS dataset_info.json etc. beside the manifest
        transform_image_size=build.transform_image_size if build.transform else 0)
    if not waits:
        if not pipeline_options.get_all_options().get("template_location"):  # a job starts:
            lock.hand_off(root, version)  # it outlives us; its commit stage releases the lock
        result = p.run()
        template = pipeline_options.get_all_options().get("template_location")
        if template:  # Dataflow wrote the job file and started nothing: there is no job id
            print(f"Wrote the {runner} job file {template} (no job started). Launching it "
                  f"builds version {version} of {root} from the listing taken now.")
            return {"status": "submitted", "version": version, "result": result,
                    "template": template, "job_id": None}
        job_id = _job_id(result)
        print(f"Submitted to {runner}: version {version} is published to {root}/LATEST by the "
              f"job's last step. Job id: {job_id}")
        return {"status": "submitted", "version": version, "result": result, "job_id": job_id}
    with _ProgressPrinter(progress_dir, n_images):
        p.run().wait_until_finish()
    seconds = time.monotonic() - start
    vdir = layout.version_dir(root, version)
    manifest = files.read_json(layout.join(vdir, layout.MANIFEST))
    _print_summary(root, vdir, manifest, seconds)
    return {"status": "published", "version": version, "manifest": manifest,
            "version_dir": vdir, "seconds": seconds}


SMALL_JOB = 2000  # images to convert below which a local job runs in process


def _prepare(build, root, pipeline_options):
    """List, fingerprint and plan in flat memory; write the shard listings and their index.

    listing (stream) -> sorted by uri on disk (dedupe, fingerprint) -> refs by key on disk
    -> "up to date"? -> incremental plan (join with the previous catalog) or full plan
    (sorted by shard hash) -> one listing file per shard task under VDIR/.tmp/.
    """
    from beam_pipeline.launcher import incremental, listing, options as opts, plan
    from beam_pipeline.store import files, versions
    from beam_pipeline.job.commit import CommitSpec
    from readers import layout

    config = build.build_config()
    previous_version, previous = versions.latest(root)
    fingerprint_config = {k: v for k, v in config.items() if k not in opts.NOT_FINGERPRINTED}
    label_file = _read_label_file(build.label_file) if build.label_file else None
    fingerprint_config["label_file"] = label_file
    with tempfile.TemporaryDirectory(prefix="image-tfrecords-") as scratch:
        errors_path = os.path.join(scratch, "listing_errors.jsonl")
        with open(errors_path, "w") as errors_file:
            planned = plan.plan_listing(
                listing.iter_inputs(build.input, build.encode_options().max_bytes),
                plan.parse_splits(build.splits),
                versions.Fingerprint(fingerprint_config, __version__),
                set(label_file) if label_file else None, scratch,
                lambda e: errors_file.write(json.dumps(e) + "\n"))
        if (previous and previous.get("input_fingerprint") == planned.fingerprint
                and not build.force):
            print(f"{root}: up to date (version {previous_version}, fingerprint unchanged); "
                  "nothing written. Use --force to rebuild.")
            return {"status": "up_to_date", "version": previous_version}

        labels = plan.label_ids(planned.labels_present, previous["labels"] if previous else (),
                                label_file)
        increment = None
        if _can_increment(build, previous, labels):
            increment = incremental.plan_increment(
                planned.by_key, layout.version_dir(root, previous_version), previous, scratch,
                build.target_shard_mb, build.max_delta_share)
        if increment:
            num_shards = increment.num_shards
            tasks = incremental.task_listings(increment)
        else:  # a full build: every image converted, shards cut by hash
            num_shards = _num_shards(planned.per_split, build)
            by_position = plan.by_shard_position((line for _, line in planned.by_key), scratch)
            tasks = ((split, shard, "images", incremental.HASH, lines)
                     for split, shard, lines in plan.iter_shards(by_position, num_shards))
        version = versions.claim_version(root)  # unique even when two runs start in one second
        tmp_dir = layout.join(layout.version_dir(root, version), ".tmp")  # = CommitSpec.tmp_dir
        spec = CommitSpec(
            root=root, version=version, name=build.name, labels=tuple(labels),
            num_shards=num_shards, listed=planned.listed, duplicates=planned.duplicates,
            listing_errors_path=layout.join(tmp_dir, "listing_errors.jsonl"),
            input_fingerprint=planned.fingerprint, config=config,
            generator=_generator(), max_error_rate=build.max_error_rate,
            keep_versions=build.keep_versions, write_index=build.write_index,
            increment=increment and dict(increment.counts, **{"from": increment.previous}),
            drop_content_duplicates=build.drop_content_duplicates)
        files.copy_local_file(errors_path, spec.listing_errors_path)
        shards_index = _write_shard_listings(spec.tmp_dir, tasks)
    return {"status": "planned", "spec": spec, "shards_index": shards_index,
            "images": planned.num_images, "bytes": planned.num_bytes,
            "rejected": planned.errors,
            "to_convert": len(increment.fresh) if increment else planned.num_images}


def _can_increment(build, previous, labels):
    """Reuse the previous version when it has a catalog, was built with the same options
    by the same software (stored bytes depend on the codecs), and its label ids still hold
    (a changed --label_file may renumber them)."""
    from beam_pipeline.launcher import options as opts
    from readers import layout

    if previous is None or build.full_rebuild or build.transform or "catalog" not in previous:
        return False  # (--transform needs every train image's pixels: a full build)
    def same(config):
        return {k: v for k, v in config.items() if k not in opts.NOT_FINGERPRINTED}

    before, now = same(previous.get("config", {})), same(build.build_config())
    return (before == now and previous.get("key_scheme") == layout.KEY_SCHEME
            and previous.get("generator") == _generator()
            and list(labels[:len(previous["labels"])]) == list(previous["labels"]))


def _workers_in_launcher(pipeline_options, runner):
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


def _job_id(result):
    """The runner's job id, or None when it has none (e.g. DataflowPipelineResult without a job)."""
    try:
        job_id = getattr(result, "job_id", None)
        return job_id() if callable(job_id) else job_id
    except Exception:
        return None


def _write_shard_listings(tmp_dir, shards):
    """(split, shard, kind, origin, listing lines) stream -> one listing file per shard -> the
    path of the shard index the job reads (Dataflow rejects job graphs over ~10 MB, so the list of
    shards is not inlined). Small files are written 16 at a time (gs:// latency); a shard
    of many tiny images is streamed, so memory stays flat either way.
    """
    import concurrent.futures

    from apache_beam.io.filesystems import FileSystems

    from beam_pipeline.job.contracts import ShardTask
    from beam_pipeline.store import files
    from readers import layout

    index, in_flight = [], []
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        for split, shard, kind, origin, lines in shards:
            path = layout.join(tmp_dir, "listing", f"{split}-{shard:05d}.jsonl")
            index.append(ShardTask(split, shard, path, kind, origin).to_json() + "\n")
            buffer, size, out = [], 0, None
            for line in lines:
                buffer.append(line + "\n")
                size += len(line) + 1
                if size > 4 << 20:  # a big shard: write it as it comes
                    out = out or FileSystems.create(path)
                    out.write("".join(buffer).encode())
                    buffer, size = [], 0
            if out:
                out.write("".join(buffer).encode())
                out.close()
                continue
            in_flight.append(pool.submit(files.write_bytes, path, "".join(buffer).encode()))
            if len(in_flight) >= 32:
                in_flight.pop(0).result()
        for future in in_flight:
            future.result()
    index_path = layout.join(tmp_dir, "shards.jsonl")
    files.write_bytes(index_path, "".join(index).encode())
    return index_path


def _check_writable(root):
    from apache_beam.io.filesystems import FileSystems

    from beam_pipeline.store import files

    probe = f"{root}/.write-check-{os.getpid()}"
    try:
        if not root.startswith("gs://"):
            os.makedirs(root, exist_ok=True)
        files.write_bytes(probe, b"ok")
        FileSystems.delete([probe])
    except Exception as e:
        raise UserError(f"--output {root}: not writable ({type(e).__name__}: {e})") from e


def _read_label_file(path):
    from apache_beam.io.filesystems import FileSystems

    try:
        with FileSystems.open(path) as f:
            names = [l.strip() for l in f.read().decode().splitlines() if l.strip()]
    except Exception as e:
        raise UserError(f"--label_file {path}: cannot read it ({e})") from e
    if not names or len(set(names)) != len(names):
        raise UserError(f"--label_file {path}: needs one unique class name per line")
    return names


def _num_shards(per_split, build):
    """Per split: --num_shards, or auto by size; never more shards than images. Nothing
    about the machine that launches it: the same inputs give the same shards anywhere."""
    from beam_pipeline.launcher import plan

    shards = {}
    for split, (count, size) in per_split.items():
        n = build.num_shards or plan.auto_num_shards(size, build.target_shard_mb)
        shards[split] = max(1, min(n, count))
    return shards


def _require_tensorflow(build):
    """The base install has no TensorFlow (workers never need it); --transform does, and so
    does the comparison sink. Say so before any work, not as an ImportError on a worker."""
    import importlib.util

    flag = "--transform" if build.transform else "--sink beam" if build.sink == "beam" else None
    needed = ["tensorflow"] + (["tensorflow_transform"] if build.transform else [])
    missing = [m for m in needed if flag and importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(f"{flag} needs {' and '.join(missing)}, which is not installed: "
                        "pip install -c constraints.txt '.[transform]' (and on Dataflow, a "
                        "worker image built with --build-arg EXTRAS=transform)")


def _write_no_op_job(pipeline_options, version):
    """Up to date under a job file location (a Flex Template launch): write a one-step job
    there anyway. The Flex launcher fails a launch whose program wrote no job file, and
    Airflow would retry it; this job starts one worker, logs the line and succeeds."""
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


def _generator():
    """What built this version. The codecs are named because stored bytes depend on them:
    an incremental run reuses records only from a version built by the same generator."""
    import importlib.metadata as md

    def version(package):
        try:
            return md.version(package)
        except md.PackageNotFoundError:
            return None

    return {"package": "image-tfrecords", "version": __version__,
            "apache_beam": version("apache-beam"), "pillow": version("pillow"),
            "simplejpeg": version("simplejpeg")}  # not TensorFlow: optional, writes no record


class _ProgressPrinter:
    """Sums the shard writers' progress files: images done of total, rate, ETA."""

    def __init__(self, directory, total, period=5.0):
        self.directory, self.total, self.period = directory, total, period
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self.start = time.monotonic()
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=2)

    def done(self):
        from apache_beam.io.filesystems import FileSystems

        try:
            paths = [m.path for m in
                     FileSystems.match([self.directory + "/*"])[0].metadata_list]
        except Exception:
            return 0
        total = 0
        for p in paths:
            try:
                with FileSystems.open(p) as f:
                    total += json.loads(f.read())["done"]
            except Exception:
                pass
        return total

    def _loop(self):
        while not self.stop.wait(self.period):
            done, elapsed = min(self.done(), self.total), time.monotonic() - self.start
            if done < max(1, self.total // 100):
                continue
            rate = done / elapsed
            eta = (self.total - done) / rate if rate else float("inf")
            print(f"  {done}/{self.total} images, {rate:.0f} img/s, ETA {eta:.0f}s",
                  file=sys.stderr, flush=True)


def _print_summary(root, vdir, manifest, seconds):
    acc = manifest["accounting"]
    print(f"\nPublished {manifest['name']} version {manifest['version']} in {seconds:.1f}s "
          f"({acc['written'] / max(seconds, 1e-9):.0f} img/s)")
    print(f"  listed {acc['listed']} = written {acc['written']} + duplicates "
          f"{acc['duplicates']} + failed {acc['failed']}")
    labels = manifest["labels"]
    width = max([len(l) for l in labels] + [5])
    splits = split_order(manifest["splits"])
    print("  " + "class".ljust(width) + "".join(f"{s:>12}" for s in splits))
    for label in labels:
        print("  " + label.ljust(width) + "".join(
            f"{manifest['splits'][s]['label_counts'].get(label, 0):>12}" for s in splits))
    print("  " + "total".ljust(width) + "".join(
        f"{manifest['splits'][s]['num_examples']:>12}" for s in splits))
    inc = manifest.get("incremental")
    if inc:
        print(f"  incremental from {inc['from']}: {inc['unchanged']} unchanged, {inc['added']} "
              f"added, {inc['changed']} changed, {inc['removed']} removed; shards: "
              f"{inc['reused']['shards']} reused, {inc['rewritten']['shards']} rewritten, "
              f"{inc['added_shards']['shards']} new; {inc['bytes_reused_share']:.0%} of the "
              "bytes reused")
    hint = big_image_hint(manifest)
    if hint:
        print(f"  hint: {hint}")
    if manifest["errors"]["count"]:
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(manifest["errors"]["by_reason"].items()))
        print(f"  rejected {manifest['errors']['count']} ({reasons}); see {vdir}/errors.jsonl")
    print(f"  files: {vdir}/ (readers take {root})")


# TensorFlow decodes a 4032x3024 JPEG in 31.7 ms here (19.5 ms even at ratio=8: entropy
# decoding dominates), so reader decode time follows the stored pixel count.
DECODE_NS_PER_PIXEL = 31.7e6 / (4032 * 3024)
BIG_SIDE, SUGGESTED_MAX_SIDE = 1024, 512


def big_image_hint(manifest):
    """A line for the summary when stored images are far larger than a training input."""
    side = (manifest.get("stored_images") or {}).get("median_longer_side")
    config = manifest.get("config") or {}
    if not side or side <= BIG_SIDE or config.get("max_side"):
        return None
    shrink = (SUGGESTED_MAX_SIDE / side) ** 2  # pixels, and roughly JPEG bytes, scale so
    total = sum(s["num_bytes"] for s in manifest["splits"].values())
    pixels = side * side * 3 / 4  # a 4:3 image
    before = pixels * DECODE_NS_PER_PIXEL / 1e6
    return (f"stored images are large (median longer side {side} px); --max_side "
            f"{SUGGESTED_MAX_SIDE} would store ~{1 / shrink:.0f}x fewer bytes "
            f"(~{total * shrink / 2**30:.2f} GiB instead of {total / 2**30:.2f} GiB) and cut "
            f"TensorFlow's decode from ~{before:.1f} ms to ~{before * shrink:.1f} ms per image "
            f"(estimated; decoding at a lower ratio saves little)")


def main(argv=None):
    """Console entry point: exit 0 only when a version was published (or was up to date)."""
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:  # answer before Beam and TensorFlow load
        from beam_pipeline.launcher.flags import help_parser

        help_parser().print_help()
        return 0
    from beam_pipeline.launcher.flags import wants_verbose
    from readers import _quiet

    verbose = wants_verbose(argv)
    _quiet.install(verbose)  # before TensorFlow loads anywhere (readers/_quiet.py says why)
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not verbose:
        for name in ("apache_beam", "absl", "tensorflow"):
            logging.getLogger(name).setLevel(logging.ERROR)
        # Beam logs a failed bundle's traceback at ERROR; main prints its cause in one line.
        logging.getLogger("apache_beam").setLevel(logging.CRITICAL)
        # So do Beam's own threads when an SDK worker process dies (issue 13): same line.
        threading.excepthook = lambda a: logging.debug("thread %s: %r", a.thread, a.exc_value)
    try:
        result = run(argv)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: nothing published", file=sys.stderr)
        return 130
    except Exception as e:  # the job failed: one line, the cause, and where to look
        if verbose:
            raise
        print(f"error: build failed: {_root_cause(e)} (run with --verbose for the traceback)",
              file=sys.stderr)
        return 1
    return 0 if result["status"] in ("published", "up_to_date", "submitted") else 1


def console(argv=None):
    """`python -m beam_pipeline`, the console script and the Flex Template: main(), then exit.

    After a --transform build has published, interpreter teardown with TensorFlow's and
    tensorflow-transform's C++ threads still running segfaults (exit 139, seen every time
    with configs/local.yaml). Everything is written by then, so flush and skip the teardown,
    but only when this call loaded TensorFlow: a process that had it before (a test runner)
    exits as usual.
    """
    loaded_before = "tensorflow" in sys.modules  # e.g. a test runner calling this in-process
    code = main(argv)
    if "tensorflow" in sys.modules and not loaded_before:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def _root_cause(e):
    """The innermost message of a Beam-wrapped worker exception, on one line."""
    text = str(e)
    if "Channel closed prematurely" in text or "Worker subprocess exited" in text:
        return "a Beam worker process died mid-job (killed, or out of memory?)"
    for marker in ("ErrorRateExceeded: ", "PublishRefused: "):
        if marker in text:
            return text.split(marker)[-1].splitlines()[0].split(" [while running")[0]
    lines = [l.strip() for l in text.strip().splitlines() if l.strip()]
    return (lines[-1] if lines else type(e).__name__).split(" [while running")[0]
