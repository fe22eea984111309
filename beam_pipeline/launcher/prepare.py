"""Everything before the job: list, fingerprint, plan, and write the shard listings.

listing (stream) -> sorted by uri on disk (dedupe, fingerprint) -> refs by key on disk
-> "up to date"? -> identity (joined with the previous catalog: splits, what is unchanged)
-> incremental plan or full plan (sorted by shard hash) -> one listing file per shard
task under VDIR/.tmp/.
Memory stays flat: every sort is on disk (algorithms/spill.py).
"""

import dataclasses
import json
import os
import sys
import tempfile
import typing

from beam_pipeline import __version__
from beam_pipeline.errors import UserError
from dataset_format import layout

if typing.TYPE_CHECKING:
    from beam_pipeline.job.contracts import CommitSpec


@dataclasses.dataclass(frozen=True)
class UpToDate:
    """The inputs and options match the latest version: nothing to build."""

    version: str
    why: str = "fingerprint unchanged"
    status: str = dataclasses.field(default="up_to_date", init=False)


@dataclasses.dataclass(frozen=True)
class Planned:
    """A claimed version with its shard listings written: what the job needs, and the figures
    the launcher prints before it starts."""

    spec: "CommitSpec"
    shards_index: str     # path of the shard index (one line per shard task)
    images: int           # images in the new version's plan
    bytes: int
    rejected: int         # listing errors (errors.jsonl lines so far)
    to_convert: int       # images the job decodes (the rest are reused records)
    notes: tuple = ()     # lines for the user about options that apply in part


def prepare(build, root):
    """-> UpToDate, or Planned after claiming a version and writing its shard listings."""
    from beam_pipeline.launcher import history, plan
    from beam_pipeline.launcher.shard_index import write_shard_listings
    from beam_pipeline.store import files, versions

    past = history.find(root, build.resplit)
    for note in past.notes:
        print(f"note: {note}", file=sys.stderr, flush=True)
    previous_version, previous = past.version, past.manifest
    versions.check_clock(root, previous_version)
    refuse_catalogless(build, root, previous)
    for v in versions.clean_leftovers(root):
        print(f"{root}: version {v} was never published (a run killed before LATEST): "
              "its manifest removed, its finished shards resumed")
    label_file = read_label_file(build.label_file) if build.label_file else None
    with tempfile.TemporaryDirectory(prefix="image-tfrecords-") as scratch:
        errors_path = os.path.join(scratch, layout.LISTING_ERRORS)
        planned = _plan_listing(build, label_file, scratch, errors_path)
        same = (previous and previous.input_fingerprint == planned.fingerprint
                and not build.force and not build.resplit
                and not past.notes)  # a damaged root is rebuilt, which repairs it
        if same and not build.verify_inputs:
            return UpToDate(previous_version)
        reuse = can_reuse(build, previous) and past.catalog is not None
        resolved = _resolve(build, planned, past, reuse, scratch)
        if same and not resolved.changed():
            return UpToDate(previous_version, "every input's bytes verified")
        labels = plan.label_ids(planned.labels_present, previous.labels if previous else (),
                                label_file)
        shard_plan = _shard_plan(
            build, root, resolved, labels, (previous_version, previous), reuse, scratch)
        spec = _commit_spec(build, root, planned, labels, shard_plan, past)
        files.copy_local_file(errors_path, spec.listing_errors_path)
        shards_index = write_shard_listings(spec.tmp_dir, shard_plan.shards)
    return Planned(spec, shards_index, images=resolved.num_images, bytes=resolved.num_bytes,
                   rejected=planned.errors, to_convert=shard_plan.to_convert,
                   notes=_splits_note(build, previous, resolved.counts["stored"]))


def _splits_note(build, previous, published):
    """Changed --splits move no published image (a split is kept for life): say so."""
    from beam_pipeline.launcher import plan

    before = previous.config.get("splits") if previous else None
    if (not before or build.resplit or not published
            or plan.parse_splits(before) == plan.parse_splits(build.splits)):
        return ()
    return (f"--splits changed from {before} to {build.splits}: it applies to new images "
            f"only; the {published} published image(s) listed keep their splits (--resplit "
            "splits every image again)",)


def _plan_listing(build, label_file, scratch, errors_path):
    """One streaming pass over the listing -> plan.Plan; listing errors go to errors_path."""
    from beam_pipeline.launcher import listing, options as opts, plan
    from beam_pipeline.store import versions

    fingerprint_config = {k: v for k, v in build.build_config().items()
                          if k not in opts.NOT_FINGERPRINTED}
    fingerprint_config["label_file"] = label_file
    with open(errors_path, "w") as errors_file:
        return plan.plan_listing(
            listing.iter_inputs(build.input, build.encode_options().max_bytes),
            versions.Fingerprint(fingerprint_config, __version__),
            set(label_file) if label_file else None, scratch,
            lambda e: errors_file.write(json.dumps(e) + "\n"))


def _resolve(build, planned, past, reuse, scratch):
    """Splits and reuse: the root's split map (unless --resplit) and, when the previous
    version was built the same way and its catalog is intact, its records.
    -> identity.Resolved"""
    from beam_pipeline.launcher import identity, plan
    from beam_pipeline.store import catalog

    rows = None
    if past.catalog and not build.resplit:
        rows = catalog.iter_rows(past.catalog)
    return identity.resolve(planned.by_key, rows, plan.parse_splits(build.splits), scratch,
                            reuse=reuse, verify=build.verify_inputs, split_map=past.split_map)


def _shard_plan(build, root, resolved, labels, latest, reuse, scratch):
    """-> ShardPlan: incremental when the previous version allows it, else full."""
    from beam_pipeline.job.contracts import Kind, Origin, PlannedShard, ShardPlan
    from beam_pipeline.launcher import incremental, plan

    previous_version, previous = latest
    previous_vdir = previous.version_dir if previous else None
    increment = None
    if reuse and can_increment(build, previous, labels):
        increment = incremental.plan_increment(
            resolved, previous_vdir, previous, scratch, build.target_shard_mb,
            build.max_delta_share)
    if increment:
        return incremental.shard_plan(increment)
    # a full build: shards cut by hash; stored records re-framed unless --full_rebuild
    sources = reuse and not build.full_rebuild and not build.transform
    num_shards = shard_counts(resolved.per_split, build)
    lines = _full_build_lines(resolved, sources, previous_vdir)
    by_position = plan.by_shard_position(lines, scratch)
    shards = (PlannedShard(split, shard, Kind.IMAGES, Origin.HASH, lines)
              for split, shard, lines in plan.iter_shards(by_position, num_shards))
    to_convert = resolved.num_images - (resolved.counts["stored"] if sources else 0)
    return ShardPlan(num_shards, shards, to_convert)


def _full_build_lines(resolved, sources, previous_vdir):
    """A full build's listing lines: with the stored record to re-frame when there is one
    (and `sources`); the others as they were spilled."""
    from beam_pipeline.launcher import identity
    from beam_pipeline.refs import ImageRef

    for line, row in resolved.ref_lines():
        if row is not None and sources:
            ref = ImageRef.from_json(line)
            line = dataclasses.replace(
                ref, source=identity.stored_frame(previous_vdir, row)).to_json()
        yield line


def _commit_spec(build, root, planned, labels, shard_plan, past):
    from beam_pipeline.job.contracts import CommitSpec
    from beam_pipeline.store import lock, versions

    version = versions.claim_version(root)  # unique even when two runs start in one second
    previous = versions.latest_id(root)
    tmp_dir = CommitSpec.tmp_dir_of(root, version)
    return CommitSpec(
        root=root, version=version, name=build.name, labels=tuple(labels),
        num_shards=shard_plan.num_shards, listed=planned.listed, duplicates=planned.duplicates,
        listing_errors_path=layout.join(tmp_dir, layout.LISTING_ERRORS),
        input_fingerprint=planned.fingerprint, config=build.build_config(),
        generator=generator(), max_error_rate=build.max_error_rate,
        keep_versions=build.keep_versions, write_index=build.write_index,
        increment=shard_plan.increment,
        drop_content_duplicates=build.drop_content_duplicates,
        near_duplicates=build.near_duplicates,
        near_duplicate_radius=build.near_duplicate_radius,
        drop_near_duplicate_leaks=build.drop_near_duplicate_leaks,
        lock_token=lock.token(root), keep_superseded_hours=build.keep_superseded_hours,
        resume_from=versions.failed_runs(root, previous, version),
        split_map_from=past.split_map and past.split_map.source, notes=past.notes)


def can_reuse(build, previous):
    """The previous version's records are what this build would store (the same
    options.RECORD_OPTIONS, the same software: stored bytes depend on the codecs), so they may
    be reused or re-framed."""
    from beam_pipeline.launcher import options as opts

    if previous is None or build.resplit or not previous.has_catalog:
        return False
    return (not opts.changed(previous.config, build.build_config(), opts.RECORD_OPTIONS)
            and previous.key_scheme == layout.KEY_SCHEME
            and previous.generator == generator())


def can_increment(build, previous, labels):
    """Build on the previous version's shards (when can_reuse says its records can be
    reused) unless a full build is asked for, the shard layout's options changed
    (options.LAYOUT_OPTIONS: then a full build re-frames the stored records), or its label
    ids no longer hold (a changed --label_file may renumber them)."""
    from beam_pipeline.launcher import options as opts

    if build.full_rebuild or build.transform:
        return False  # (--transform needs every train image's pixels: a full build)
    if opts.changed(previous.config, build.build_config(), opts.LAYOUT_OPTIONS):
        return False
    return list(labels[:len(previous.labels)]) == list(previous.labels)


def shard_counts(per_split, build):
    """Per split: --num_shards, or auto by size; never more shards than images. Nothing
    about the machine that launches it: the same inputs give the same shards anywhere."""
    from beam_pipeline.launcher import plan

    shards = {}
    for split, (count, size) in per_split.items():
        n = build.num_shards or plan.auto_num_shards(size, build.target_shard_mb)
        shards[split] = max(1, min(n, count))
    return shards


def generator():
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


def require_tensorflow(build):
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


def has_split_map(previous):
    """Whether the latest version holds the splits its images keep for life (its catalog)."""
    return bool(previous) and previous.has_catalog


def refuse_catalogless(build, root, previous):
    """`--sink beam` writes no catalog: published over a root with a split map, it would
    leave the next build none, and every image would be split again by its key hash."""
    if build.sink == "beam" and has_split_map(previous) and not build.resplit:
        raise UserError(f"--sink beam writes no catalog, so it would erase the split map of "
                        f"{root} (the splits its published images keep for life); build the "
                        "comparison into another --output, or add --resplit to start the "
                        "split map over")


def check_writable(root):
    """Fail before any listing when --output can't take a file."""
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


def read_label_file(path):
    from apache_beam.io.filesystems import FileSystems

    try:
        with FileSystems.open(path) as f:
            names = [l.strip() for l in f.read().decode().splitlines() if l.strip()]
    except Exception as e:
        raise UserError(f"--label_file {path}: cannot read it ({e})") from e
    if not names or len(set(names)) != len(names):
        raise UserError(f"--label_file {path}: needs one unique class name per line")
    return names
