"""Reuse policy: what a build may take from the previous version, decided from the options'
values and the previous manifest (a DatasetInfo) alone.

    can_reuse     its records are what this build would store (reuse or re-frame them)
    can_increment build on its shards (reuse, copy, delta shards) rather than in full
    splits_note   changed --splits apply to new images only: say so
"""

import dataclasses
import importlib.metadata as md
from typing import Optional

from beam_pipeline import __version__
from beam_pipeline.job import code_build
from beam_pipeline.launcher import options as opts
from beam_pipeline.launcher.rules import parse_splits
from dataset_format import fields, layout


@dataclasses.dataclass(frozen=True)
class ReusePolicy:
    """What the reuse decisions need of the build options."""

    config: dict            # the build's config (BuildOptions.build_config())
    splits: str             # --splits
    resplit: bool = False
    full_rebuild: bool = False
    transform: bool = False
    fields: Optional[dict] = None  # the declared fields (fields.Schema.to_json()), or None


def stale_fields(policy, previous):
    """The previous version's fields its records must leave (fields.stale_fields)."""
    return fields.stale_fields(previous.manifest.get("fields") if previous else None,
                               policy.fields)


def can_reuse(policy, previous):
    """The previous version's records are what this build would store (the same
    options.RECORD_OPTIONS, the same software: stored bytes depend on the codecs), so they may
    be reused or re-framed. The software compared is the build that wrote its shards (its
    manifest's build.workers) against the one this build's shards will be written with
    (this process's: launch from the worker image's build; commit refuses a version whose
    shards disagree); a version written before workers' builds were recorded is compared
    by its launcher's `generator`, as it was then. Declared fields never stop reuse: a
    record whose values changed, or that holds a field removed or retyped since, is
    re-framed (fields.stale_fields)."""
    if previous is None or policy.resplit or not previous.has_catalog:
        return False
    written_by = writer_build(previous)
    same_code = (written_by == code_build.worker_build() if written_by is not None
                 else previous.generator == generator())
    return (not opts.changed(previous.config, policy.config, opts.RECORD_OPTIONS)
            and previous.key_scheme == layout.KEY_SCHEME and same_code)


def writer_build(previous):
    """The code build that wrote the shards of `previous` (a DatasetInfo): its manifest's
    build.workers, or None (written before builds were recorded, or no previous version)."""
    if previous is None:
        return None
    return (previous.manifest.get("build") or {}).get("workers")


def can_increment(policy, previous, labels, schema=None):
    """Build on the previous version's shards (when can_reuse says its records can be
    reused) unless a full build is asked for, the shard layout's options changed
    (options.LAYOUT_OPTIONS: then a full build re-frames the stored records), or its label
    ids no longer hold (a changed --label_file may renumber them)."""
    if policy.full_rebuild or policy.transform:
        return False  # (--transform needs every train image's pixels: a full build)
    if opts.changed(previous.config, policy.config, opts.LAYOUT_OPTIONS):
        return False
    if not fields.ids_kept(previous.manifest.get("fields"), schema):
        return False  # a class of a classes/boxes field changed id: every record re-framed
    return list(labels[:len(previous.labels)]) == list(previous.labels)


def reframes(policy, reuse):
    """Whether a full build re-frames stored records (else --full_rebuild or --transform
    converts every image again)."""
    return reuse and not policy.full_rebuild and not policy.transform


def splits_note(policy, previous, published):
    """Changed --splits move no published image (a split is kept for life): say so."""
    before = previous.config.get("splits") if previous else None
    if (not before or policy.resplit or not published
            or parse_splits(before) == parse_splits(policy.splits)):
        return ()
    return (f"--splits changed from {before} to {policy.splits}: it applies to new images "
            f"only; the {published} published image(s) listed keep their splits (--resplit "
            "splits every image again)",)


def generator():
    """What built this version. The codecs are named because stored bytes depend on them:
    an incremental run reuses records only from a version built by the same generator."""
    def version(package):
        try:
            return md.version(package)
        except md.PackageNotFoundError:
            return None

    return {"package": "image-tfrecords", "version": __version__,
            "apache_beam": version("apache-beam"), "pillow": version("pillow"),
            "simplejpeg": version("simplejpeg")}  # not TensorFlow: optional, writes no record
