"""Everything before the job, as stages: each takes a small frozen config (built here from the
options) and returns a typed value.

    history.find                  -> History (the previous version, as a DatasetInfo)
    listing.list_inputs           -> Listing (deduplicated, fingerprinted, spilled by key)
    "up to date"?                 -> UpToDate
    identity.resolve_listing      -> Resolved (splits, what is unchanged)
    resume.take                   -> Resumed (failed runs' finished shards taken as they are)
    incremental.incremental_plan  -> ShardPlan, or None: then plan.full_plan -> ShardPlan
    versions.claim_version        -> the version this build writes (its VDIR is its own)
    shard_index.write_shard_listings  one listing file per shard task under VDIR/.tmp/

The rules they apply are in rules.py, the reuse policy in policy.py, the input checks in
checks.py. Memory stays flat: every sort is on disk (algorithms/spill.py).
"""

import dataclasses
import os
import sys
import tempfile

from beam_pipeline.job import attempts
from beam_pipeline.job.contracts import CommitSpec, Dedup, Listed, Retention
from beam_pipeline.launcher import (checks, history, identity, incremental, listing, manifests,
                                    plan, policy, resume)
from beam_pipeline.launcher import options as opts
from beam_pipeline.launcher.rules import label_ids, parse_splits
from beam_pipeline.launcher.shard_index import write_shard_listings
from beam_pipeline.store import files, lock, retention, versions
from dataset_format import fields, layout


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

    spec: CommitSpec
    shards_index: str     # path of the shard index (one line per shard task)
    images: int           # images in the new version's plan
    bytes: int
    rejected: int         # listing errors (errors.jsonl lines so far)
    to_convert: int       # images the job decodes (the rest are reused records)
    notes: tuple = ()     # lines for the user about options that apply in part


def prepare(build, root):
    """-> UpToDate, or Planned after claiming a version and writing its shard listings."""
    past = history.find(history.HistoryConfig(root, build.resplit))
    for note in past.notes:
        print(f"note: {note}", file=sys.stderr, flush=True)
    previous = past.manifest
    versions.check_clock(root, past.version)
    checks.refuse_catalogless(build, root, previous)
    for v in retention.clean_leftovers(root):
        print(f"{root}: version {v} was never published (a run killed before LATEST): "
              "its manifest removed, its finished shards resumed")
    label_file = checks.read_label_file(build.label_file) if build.label_file else None
    schema = field_schema(build)
    reuse_policy = policy.ReusePolicy(build.build_config(), build.splits, build.resplit,
                                      build.full_rebuild, build.transform,
                                      schema.to_json() if schema else None)
    with tempfile.TemporaryDirectory(prefix="image-tfrecords-") as scratch:
        errors_path = os.path.join(scratch, layout.LISTING_ERRORS)
        listed = listing.list_inputs(_listing_config(build, label_file, schema), scratch,
                                     errors_path)
        same = (previous and previous.input_fingerprint == listed.fingerprint
                and not build.force and not build.resplit
                and not past.notes)  # a damaged root is rebuilt, which repairs it
        if same and not build.verify_inputs:
            return UpToDate(past.version)
        reuse = policy.can_reuse(reuse_policy, previous) and past.catalog is not None
        resolved = identity.resolve_listing(listed, past, identity.IdentityConfig(
            parse_splits(build.splits), reuse, build.verify_inputs, build.resplit,
            policy.stale_fields(reuse_policy, previous)), scratch)
        listed.by_key.close()  # joined: its scratch (~250 bytes an image) is free again
        if same and not resolved.changed():
            return UpToDate(past.version, "every input's bytes verified")
        labels = label_ids(listed.labels_present, previous.labels if previous else (),
                           label_file)
        schema = with_vocabularies(schema, listed.classes_present, previous)
        resumed = _resumable(build, root, labels, resolved, scratch, schema)
        rest = resumed.remainder  # the images no failed run's finished shard holds as listed
        shard_plan = None
        if reuse and policy.can_increment(reuse_policy, previous, labels, schema):
            shard_plan = incremental.incremental_plan(
                rest, previous,
                incremental.IncrementConfig(build.target_shard_mb, build.max_delta_share), scratch)
        held = {}
        if shard_plan is None:  # a full build: stored records re-framed unless --full_rebuild
            config = plan.FullPlanConfig(
                build.num_shards, build.target_shard_mb, policy.reframes(reuse_policy, reuse),
                previous.version_dir if previous else None)
            if resumed.taken:  # the whole listing's cut; taken shards keep their slots
                held = resumed.held(build.name, plan.cut(resolved.per_split, config))
                config = dataclasses.replace(config, listed=resolved.per_split, held={
                    split: frozenset(slots) for split, slots in held.items()})
            shard_plan = plan.full_plan(rest, config, scratch)
        shard_plan = resume.with_resumed(shard_plan, resumed, held)
        version = versions.claim_version(root)  # this build's version, unique in the root
        spec = _commit_spec(build, root, version, listed=listed, labels=labels,
                            shard_plan=shard_plan, past=past, schema=schema)
        files.copy_local_file(errors_path, spec.listed.errors_path)
        shards_index = write_shard_listings(spec.tmp_dir, shard_plan.shards)
    return Planned(spec, shards_index, images=resolved.num_images, bytes=resolved.num_bytes,
                   rejected=listed.errors, to_convert=shard_plan.to_convert,
                   notes=policy.splits_note(reuse_policy, previous, resolved.counts["stored"]))


def _resumable(build, root, labels, resolved, scratch, schema=None):
    """The finished shards of failed runs this build takes as they are (launcher/resume.py)
    -> resume.Resumed. None taken with options that let commit rewrite shards, or the beam
    sink (no shards of ours)."""
    if build.sink != "shards" or build.drop_content_duplicates or build.drop_near_duplicate_leaks:
        return resume.Resumed([], resolved)
    failed = versions.failed_runs(root, versions.latest_id(root), None)
    settings = attempts.settings({label: i for i, label in enumerate(labels)},
                                 build.encode_options(), build.write_index,
                                 build.near_duplicates, build.transform,
                                 schema.to_json() if schema else None)
    return resume.take(resolved, attempts.finished(failed), settings, scratch,
                       copies=not build.transform)


def _listing_config(build, label_file, schema=None):
    fingerprint_config = {k: v for k, v in build.build_config().items()
                          if k not in opts.NOT_FINGERPRINTED}
    fingerprint_config["label_file"] = label_file
    if schema:  # its content, not its path
        fingerprint_config["schema"] = schema.to_json()
    return listing.ListingConfig(tuple(build.input), build.encode_options().max_bytes,
                                 fingerprint_config, tuple(label_file) if label_file else None,
                                 schema or None)


def field_schema(build):
    """--schema's fields.Schema; with --schema infer, the one the manifests' rows fit,
    printed for the user to keep."""
    schema = build.field_schema()
    if schema is not None:
        return schema
    schema = manifests.infer_schema(build.input)
    print("# the schema inferred from the manifests (keep it, edit it, pass it as --schema "
          "FILE):\n" + fields.dump(schema), end="", flush=True)
    return schema


def with_vocabularies(schema, present, previous):
    """The schema with each classes/boxes field's ids: its declared classes when closed,
    else the previous version's ids kept and the classes seen now appended
    (rules.label_ids, as for labels)."""
    if not schema:
        return schema
    before = {}
    if previous is not None and previous.manifest.get("fields"):
        before = {f.name: f.classes or () for f in
                  fields.from_json(previous.manifest["fields"]).fields}
    vocabularies = {}
    for f in schema.fields:
        if f.has_classes:
            vocabularies[f.name] = (f.classes if f.closed else label_ids(
                present.get(f.name, ()), before.get(f.name) or f.classes or ()))
    return schema.with_classes(vocabularies)


def _commit_spec(build, root, version, *, listed, labels, shard_plan, past, schema=None):
    """What the job carries: the build's options and this plan, for `version`."""
    tmp_dir = CommitSpec.tmp_dir_of(root, version)
    return CommitSpec(
        root=root, version=version, name=build.name, labels=tuple(labels),
        num_shards=shard_plan.num_shards,
        listed=Listed(listed.listed, listed.duplicates,
                      layout.join(tmp_dir, layout.LISTING_ERRORS)),
        input_fingerprint=listed.fingerprint, config=build.build_config(),
        generator=policy.generator(), max_error_rate=build.max_error_rate,
        write_index=build.write_index,
        retention=Retention(build.keep_versions, build.keep_superseded_hours),
        dedup=Dedup(build.drop_content_duplicates, build.near_duplicates,
                    build.near_duplicate_radius, build.drop_near_duplicate_leaks),
        increment=shard_plan.increment, lock_token=lock.token(root),
        split_map_from=past.split_map and past.split_map.source, notes=past.notes,
        fields=schema.to_json() if schema else None,
        previous_build=policy.writer_build(past.manifest))
