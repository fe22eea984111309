"""The job's last stage: finalize the shards -> build the manifest -> publish.

Runs once, inside the Beam job, after every shard is written (a launcher line after
run() is not guaranteed to execute on Dataflow). Idempotent, so a retry is safe.
"""

import dataclasses
import datetime
import json
import logging

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from beam_pipeline.store import catalog, files, lock, versions
from beam_pipeline.store.near_duplicates import DEFAULT_RADIUS
from beam_pipeline.job import duplicates, leaks, rewrite
from beam_pipeline.job.manifest import Finalized, build_manifest
from readers import layout


class PublishRefused(RuntimeError):
    """A newer version was published while this one was being built."""


class ErrorRateExceeded(RuntimeError):
    """Too many rejected inputs: the version is written but not published."""


@dataclasses.dataclass(frozen=True)
class CommitSpec:
    """What the launcher knew: everything the manifest needs besides the ShardResults."""

    root: str
    version: str
    name: str
    labels: tuple
    num_shards: dict          # split -> N
    listed: int
    duplicates: int
    listing_errors_path: str  # errors found while listing, a JSONL file in the temp dir
    input_fingerprint: str
    config: dict
    generator: dict
    max_error_rate: float
    keep_versions: int
    write_index: bool
    increment: dict = None    # incremental: {"from": version, "removed": n, "changed": n, …}
    drop_content_duplicates: bool = False
    lock_token: str = None    # the launcher's ROOT/.lock token, checked before publishing
    keep_superseded_hours: float = versions.KEEP_SUPERSEDED_HOURS
    near_duplicates: bool = False          # group the catalog's perceptual hashes
    near_duplicate_radius: int = DEFAULT_RADIUS  # Hamming bits
    drop_near_duplicate_leaks: bool = False

    @property
    def previous_vdir(self):
        return layout.version_dir(self.root, self.increment["from"]) if self.increment else None

    @property
    def vdir(self):
        return layout.version_dir(self.root, self.version)

    @property
    def tmp_dir(self):
        return layout.join(self.vdir, ".tmp")


def commit(results, spec, extra_files=(), manifest_parts=()):
    """All ShardResults -> the published manifest (a dict). Raises to fail the job.

    `extra_files` are callables (version_dir, manifest) that write files beside the
    manifest and may add keys to it; `manifest_parts` are dicts produced by other branches
    of the job (e.g. the transform analysis) merged into the manifest.
    """
    from beam_pipeline.store import lock

    lock.keep_alive(spec.root, spec.version)  # the job's lock stays alive while this runs
    done_path = layout.join(spec.vdir, layout.MANIFEST)
    if files.exists(done_path):  # run again after it wrote the manifest (a runner's retry):
        return _publish(spec, files.read_json(done_path))  # publish only, rewrite nothing
    lock.check_token(spec.root, spec.lock_token)  # a lost build completes nothing either
    done = finalize(results, spec)
    manifest = build_manifest(spec, done, datetime.datetime.now(datetime.timezone.utc),
                              manifest_parts)
    _write_manifest(spec, manifest, extra_files)
    return _publish(spec, manifest)


def finalize(results, spec):
    """Everything but the manifest: dedupe, errors.jsonl and the error budget, the shards
    renamed to their final names, the catalog merged. -> Finalized."""
    # Shards with a catalog fragment (not --sink beam), in split and shard order.
    cataloged = sorted((r for r in results if r.catalog_temp),
                       key=lambda r: (r.split, r.shard))
    cataloged, content_duplicates, dropped = _content_duplicates(cataloged, spec)
    cataloged, near_duplicates, leaked = _near_duplicates(cataloged, spec)
    rewritten = {(r.split, r.shard): r for r in cataloged}
    results = tuple(rewritten.get((r.split, r.shard), r) if r.catalog_temp else r
                    for r in results)
    errors = _write_errors(results, spec)
    _check_error_budget(len(errors), spec)
    by_shard = {(r.split, r.shard): r for r in results}
    shards = {split: [_commit_shard(spec, split, i, by_shard.get((split, i))) for i in range(n)]
              for split, n in sorted(spec.num_shards.items())}
    catalog_rows, sides = _merge_catalog(cataloged, spec)
    _warn_empty_classes(spec.labels, results)
    return Finalized(results=results, shards=shards, errors=errors, catalog_rows=catalog_rows,
                     longer_sides=sides, content_duplicates=content_duplicates, dropped=dropped,
                     near_duplicates=near_duplicates, leaks=leaked)


def _write_manifest(spec, manifest, extra_files):
    """Files beside the manifest, then the manifest: its presence marks a complete version."""
    for extra in extra_files:  # hooks that add files next to the manifest (TFDS, TFT, …)
        extra(spec.vdir, manifest)
    files.write_json(layout.join(spec.vdir, layout.MANIFEST), manifest)  # now it is complete
    # Only now: a retried commit (say the manifest write failed) must still find the
    # listing errors in .tmp/, or its errors.jsonl and accounting would silently lose them.
    files.delete_tree(spec.tmp_dir)


def _publish(spec, manifest):
    """Move LATEST forward to this complete version, prune, release a handed-off lock.

    Only while this build still holds the root's lock: one whose lock was taken over (its
    heartbeat stalled past the TTL) raises LockLost and publishes nothing; a retried commit
    of a version LATEST already names has nothing left to check.
    """
    if versions.latest_id(spec.root) != spec.version:
        lock.check_token(spec.root, spec.lock_token)
    published = versions.publish(spec.root, spec.version)
    if published != spec.version:
        _release_lock(spec)
        raise PublishRefused(f"version {published} was published while {spec.version} was "
                             f"being built; {spec.version} is complete but not published")
    versions.prune(spec.root, spec.version, spec.keep_versions, spec.keep_superseded_hours)
    _release_lock(spec)
    return manifest


def _release_lock(spec):
    """A job submitted by a launcher that did not wait holds ROOT/.lock: done with it now.
    (A waiting launcher's lock is its own to release; this leaves it alone.)"""
    lock.release_submitted(spec.root, spec.version)


def _write_errors(results, spec):
    """The listing's errors and the shards' -> VDIR/errors.jsonl; returns them."""
    errors = tuple([json.loads(l) for l in _read_lines(spec.listing_errors_path)]
                   + [e for r in results for e in r.errors])
    files.write_bytes(layout.join(spec.vdir, layout.ERRORS),
                      "".join(json.dumps(e, sort_keys=True) + "\n" for e in errors).encode())
    return errors


def _check_error_budget(failed, spec):
    """Too many rejected inputs: the version stays unpublished (errors.jsonl says why)."""
    rate = failed / max(spec.listed, 1)
    if rate > spec.max_error_rate:
        _release_lock(spec)
        raise ErrorRateExceeded(
            f"{failed} of {spec.listed} inputs rejected ({rate:.1%}) exceeds --max_error_rate "
            f"{spec.max_error_rate:g}; nothing published; "
            f"see {layout.join(spec.vdir, layout.ERRORS)}")


def _warn_empty_classes(labels, results):
    seen = {label for r in results for label, n in r.label_counts.items() if n}
    for label in labels:
        if label not in seen:
            logging.warning("class %r has no images in this version; its id is kept", label)


EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def _commit_shard(spec, split, shard, result):
    """Rename one shard (and its index) to its final name -> its manifest entry."""
    final_name = layout.shard_name(spec.name, split, shard, spec.num_shards[split])
    final = layout.join(spec.vdir, final_name)
    if result is None:  # no image hashed into this shard: an empty, valid TFRecord file
        files.write_bytes(final, b"")
        if spec.write_index:
            files.write_bytes(layout.index_name(final), b"")
        return {"path": final_name, "num_examples": 0, "num_bytes": 0,
                "sha256": EMPTY_SHA256, "origin": "hash"}
    _rename(result.temp, final)
    if spec.write_index and result.index_temp:
        _rename(result.index_temp, layout.index_name(final))
    return {"path": final_name, "num_examples": result.num_examples,
            "num_bytes": result.num_bytes, "sha256": result.sha256, "origin": result.origin}


def _content_duplicates(ordered, spec):
    """Report groups of identical stored images; with --drop_content_duplicates, rewrite the
    shards that hold the extra copies. -> (results, manifest entry or None, number dropped)."""
    if not ordered:
        return ordered, None, 0
    entry, extras = duplicates.report([r.catalog_temp for r in ordered], spec.vdir,
                                      collect_extras=spec.drop_content_duplicates)
    if not spec.drop_content_duplicates:
        return ordered, entry, 0
    kept = [rewrite.keep_rows(r, extras[r.path], spec.write_index) if r.path in extras else r
            for r in ordered]
    return kept, entry, sum(a.num_examples - b.num_examples for a, b in zip(ordered, kept))


def _near_duplicates(ordered, spec):
    """Group near-duplicate stored images (near_duplicates.jsonl); with
    --drop_near_duplicate_leaks, rewrite the evaluation shards holding leaks.
    -> (results, manifest entry or None, number of leaks dropped)."""
    if not ordered or not spec.near_duplicates:
        return ordered, None, 0
    entry, drop = leaks.report(ordered, spec)
    kept = [rewrite.keep_rows(r, drop[r.path], spec.write_index) if r.path in drop else r
            for r in ordered]
    return kept, entry, sum(a.num_examples - b.num_examples for a, b in zip(ordered, kept))


def _merge_catalog(ordered, spec):
    """The shards' catalog fragments, in order -> VDIR/catalog.parquet.

    Returns (its row count, {longer side: count}), or (None, {}) when the sink wrote no
    fragments (--sink beam).
    """
    if not ordered:
        return None, {}
    return catalog.merge([r.catalog_temp for r in ordered],
                         layout.join(spec.vdir, layout.CATALOG))


def _rename(temp, final):
    if FileSystems.exists(temp):
        if FileSystems.exists(final):  # a retried commit: replace what an earlier try left
            FileSystems.delete([final])
        FileSystems.rename([temp], [final])
    elif not FileSystems.exists(final):
        raise FileNotFoundError(f"shard temp file {temp} is missing")


def _read_lines(path):
    if not path or not FileSystems.exists(path):
        return []
    with FileSystems.open(path) as f:
        return [l for l in f.read().decode().splitlines() if l.strip()]


class Commit(beam.PTransform):
    """PCollection of ShardResults -> one published manifest (the job's final stage)."""

    def __init__(self, spec, extra_files=(), manifest_parts=()):
        super().__init__()
        self.spec, self.extra_files = spec, tuple(extra_files)
        self.manifest_parts = tuple(manifest_parts)  # PCollections of dicts, waited for

    def expand(self, results):
        parts = [beam.pvalue.AsList(p) for p in self.manifest_parts]
        return (results
                | "AllShards" >> beam.combiners.ToList()        # -> [ShardResult], one per shard
                | "WriteManifest" >> beam.Map(_commit_with_parts, self.spec,
                                              self.extra_files, *parts))


def _commit_with_parts(results, spec, extra_files, *part_lists):
    return commit(results, spec, extra_files, [d for part in part_lists for d in part])
