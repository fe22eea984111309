"""Everything before the job, as stages: each takes a small frozen config (built here from the
options) and returns a typed value.

    history.find                  -> History (the previous version, as a DatasetInfo)
    listing.list_inputs           -> Listing (deduplicated, fingerprinted, spilled by key)
    "up to date"?                 -> UpToDate
    identity.resolve_listing      -> Resolved (splits, what is unchanged)
    incremental.incremental_plan  -> ShardPlan, or None: then plan.full_plan -> ShardPlan
    shard_index.write_shard_listings  one listing file per shard task under VDIR/.tmp/

The rules they apply are in rules.py, the reuse policy in policy.py, the input checks in
checks.py. Memory stays flat: every sort is on disk (algorithms/spill.py).
"""

import dataclasses
import os
import sys
import tempfile

from beam_pipeline.job.contracts import CommitSpec
from beam_pipeline.launcher import checks, history, identity, incremental, listing, plan, policy
from beam_pipeline.launcher import options as opts
from beam_pipeline.launcher.rules import label_ids, parse_splits
from beam_pipeline.launcher.shard_index import write_shard_listings
from beam_pipeline.store import files, lock, retention, versions
from dataset_format import layout


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
    reuse_policy = policy.ReusePolicy(build.build_config(), build.splits, build.resplit,
                                      build.full_rebuild, build.transform)
    with tempfile.TemporaryDirectory(prefix="image-tfrecords-") as scratch:
        errors_path = os.path.join(scratch, layout.LISTING_ERRORS)
        listed = listing.list_inputs(_listing_config(build, label_file), scratch, errors_path)
        same = (previous and previous.input_fingerprint == listed.fingerprint
                and not build.force and not build.resplit
                and not past.notes)  # a damaged root is rebuilt, which repairs it
        if same and not build.verify_inputs:
            return UpToDate(past.version)
        reuse = policy.can_reuse(reuse_policy, previous) and past.catalog is not None
        resolved = identity.resolve_listing(listed, past, identity.IdentityConfig(
            parse_splits(build.splits), reuse, build.verify_inputs, build.resplit), scratch)
        listed.by_key.close()  # joined: its scratch (~250 bytes an image) is free again
        if same and not resolved.changed():
            return UpToDate(past.version, "every input's bytes verified")
        labels = label_ids(listed.labels_present, previous.labels if previous else (),
                           label_file)
        shard_plan = None
        if reuse and policy.can_increment(reuse_policy, previous, labels):
            shard_plan = incremental.incremental_plan(
                resolved, previous,
                incremental.IncrementConfig(build.target_shard_mb, build.max_delta_share), scratch)
        if shard_plan is None:  # a full build: stored records re-framed unless --full_rebuild
            shard_plan = plan.full_plan(resolved, plan.FullPlanConfig(
                build.num_shards, build.target_shard_mb, policy.reframes(reuse_policy, reuse),
                previous.version_dir if previous else None), scratch)
        resolved.by_key.close()  # both plans took what they need into their own spills
        spec = _commit_spec(build, root, listed, labels, shard_plan, past)
        files.copy_local_file(errors_path, spec.listing_errors_path)
        shards_index = write_shard_listings(spec.tmp_dir, shard_plan.shards)
    return Planned(spec, shards_index, images=resolved.num_images, bytes=resolved.num_bytes,
                   rejected=listed.errors, to_convert=shard_plan.to_convert,
                   notes=policy.splits_note(reuse_policy, previous, resolved.counts["stored"]))


def _listing_config(build, label_file):
    fingerprint_config = {k: v for k, v in build.build_config().items()
                          if k not in opts.NOT_FINGERPRINTED}
    fingerprint_config["label_file"] = label_file
    return listing.ListingConfig(tuple(build.input), build.encode_options().max_bytes,
                                 fingerprint_config, tuple(label_file) if label_file else None)


def _commit_spec(build, root, listed, labels, shard_plan, past):
    version = versions.claim_version(root)  # unique even when two runs start in one second
    previous = versions.latest_id(root)
    tmp_dir = CommitSpec.tmp_dir_of(root, version)
    return CommitSpec(
        root=root, version=version, name=build.name, labels=tuple(labels),
        num_shards=shard_plan.num_shards, listed=listed.listed, duplicates=listed.duplicates,
        listing_errors_path=layout.join(tmp_dir, layout.LISTING_ERRORS),
        input_fingerprint=listed.fingerprint, config=build.build_config(),
        generator=policy.generator(), max_error_rate=build.max_error_rate,
        keep_versions=build.keep_versions, write_index=build.write_index,
        increment=shard_plan.increment,
        drop_content_duplicates=build.drop_content_duplicates,
        near_duplicates=build.near_duplicates,
        near_duplicate_radius=build.near_duplicate_radius,
        drop_near_duplicate_leaks=build.drop_near_duplicate_leaks,
        lock_token=lock.token(root), keep_superseded_hours=build.keep_superseded_hours,
        resume_from=versions.failed_runs(root, previous, version),
        split_map_from=past.split_map and past.split_map.source, notes=past.notes)
