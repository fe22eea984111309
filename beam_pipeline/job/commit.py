"""The job's last stage: finalize the shards -> build the manifest -> publish.

The writers already put every shard under its final name, the label counts arrive summed
across workers (label_counts.py) and the error records as one JSONL file (WriteErrors), so
the one process that commits holds one small entry per shard and makes no request per
shard but its catalog fragment's read.

Runs once, inside the Beam job, after every shard is written (a launcher line after
run() is not guaranteed to execute on Dataflow). Idempotent, so a retry is safe.
"""

import datetime
import json
import logging

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from beam_pipeline.algorithms.read_ahead import threaded
from beam_pipeline.dedup import duplicates, leaks
from beam_pipeline.errors import RetryWontHelp
from beam_pipeline.job import beam_sink, code_build, errors_file, rewrite
from beam_pipeline.job.contracts import Origin, ShardResult
from beam_pipeline.job.label_counts import SumLabelCounts, minus_dropped, sum_label_counts
from beam_pipeline.job.manifest import Finalized, build_manifest
from beam_pipeline.store import (catalog, files, lock, retention, split_map, split_map_file,
                                 versions)
from dataset_format import frames, layout
from dataset_format.manifest import Manifest


class PublishRefused(RuntimeError):
    """A newer version was published while this one was being built."""


class ErrorRateExceeded(RetryWontHelp):
    """Too many rejected inputs: the version is written but not published (the CLI exits
    3: the next run fails the same way until the inputs or --max_error_rate change)."""


class MixedBuilds(RuntimeError):
    """The shards were written by two code builds (job/code_build.py)."""


DETERMINISTIC = (ErrorRateExceeded, PublishRefused, MixedBuilds)  # a retry fails the same way


def commit(results, spec, extra_files=(), manifest_parts=(), label_counts=None,
           error_files=()):
    """All ShardResults -> the published Manifest. Raises to fail the job.

    `extra_files` are callables (version_dir, manifest) that write files beside the
    manifest and return its section for them ({name: value}) or None; `manifest_parts` are
    sections produced by other branches of the job (e.g. the transform analysis).

    In the job, `results` are slim (ShardResult.slim): `label_counts` ({split: {class: n}})
    and `error_files` (JSONL of the shards' error records) carry what they left out.
    Called with full results (tests, benchmarks) it sums them itself.
    """
    _raise_earlier_failure(spec)  # a runner's retry fails as the first attempt did
    lock.keep_alive(spec.root, spec.version)  # the job's lock stays alive while this runs
    done_path = layout.join(spec.vdir, layout.MANIFEST)
    if files.exists(done_path):  # run again after it wrote the manifest (a runner's retry):
        return _publish(spec, Manifest.from_json(files.read_bytes(done_path).decode()))  # publish only
    lock.check_token(spec.root, spec.lock_token)  # a lost build completes nothing either
    done = finalize(results, spec, label_counts, error_files)
    manifest = build_manifest(spec, done, datetime.datetime.now(datetime.timezone.utc),
                              manifest_parts)
    return _publish(spec, _write_manifest(spec, manifest, extra_files))


def finalize(results, spec, label_counts=None, error_files=()):
    """Everything but the manifest: dedupe, errors.jsonl and the error budget, the shards
    a writer left under a temp name renamed, the catalog merged. -> Finalized.

    Per shard this costs only what the merged catalog needs (its fragment, read 8 at a
    time): shards are already under their final names, and the counts and errors arrive
    combined."""
    _check_one_build(results, spec)
    # Shards with a catalog fragment (not --sink beam), in split and shard order.
    cataloged = sorted((r for r in results if r.files.catalog_temp),
                       key=lambda r: (r.split, r.shard))
    original = cataloged
    cataloged, content_duplicates, dropped = _content_duplicates(cataloged, spec)
    cataloged, near_duplicates, leaked = _near_duplicates(cataloged, spec)
    rewritten = {(r.split, r.shard): r for r in cataloged}
    results = tuple(rewritten.get((r.split, r.shard), r) if r.files.catalog_temp else r
                    for r in results)
    if label_counts is None:
        label_counts = sum_label_counts(results)
    else:  # combined before commit: take the rewritten shards' dropped rows off
        label_counts = minus_dropped(label_counts, original, cataloged)
    reasons = errors_file.write_errors(results, spec, error_files)
    _check_error_budget(sum(reasons.values()), spec)
    by_shard = {(r.split, r.shard): r for r in results}
    shards = _commit_shards(spec, by_shard)
    catalog_rows, sides = _merge_catalog(cataloged, spec)
    map_entry = _write_split_map(spec, catalog_rows)
    _warn_empty_classes(spec.labels, label_counts)
    return Finalized(results=results, shards=shards, catalog_rows=catalog_rows,
                     longer_sides=sides, content_duplicates=content_duplicates, dropped=dropped,
                     near_duplicates=near_duplicates, leaks=leaked, label_counts=label_counts,
                     error_reasons=reasons, split_map=map_entry)


def _commit_shards(spec, by_shard):
    """split -> manifest entries in shard order; the renames and empty shards (rare) 16 at
    a time (algorithms/read_ahead.py)."""
    shards = [(split, i) for split, n in sorted(spec.num_shards.items()) for i in range(n)]
    entries = {split: [] for split in sorted(spec.num_shards)}
    for (split, _), entry in threaded(
            shards, lambda shard: _commit_shard(spec, *shard, by_shard.get(shard)), 16):
        entries[split].append(entry)
    return entries


def _write_manifest(spec, manifest, extra_files):
    """Files beside the manifest, then the manifest: its presence marks a complete version.
    -> the Manifest as written."""
    for extra in extra_files:  # hooks that add files next to the manifest (TFDS, TFT, …)
        part = extra(spec.vdir, manifest)
        manifest = manifest.with_sections(part) if part else manifest
    files.write_whole(layout.join(spec.vdir, layout.MANIFEST), manifest.to_json().encode())
    return manifest
    # .tmp/ stays until published (_publish): a retried commit (say the manifest write
    # failed) must still find the listing errors there, or errors.jsonl would lose them.


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
        _fail(spec, PublishRefused(f"version {published} was published while {spec.version} "
                                   f"was being built; {spec.version} is complete but not "
                                   "published"))
    # Never fails a published job: a delete refused (a retention policy) is logged, and the
    # launcher's summary names what is left (report.print_summary).
    retention.prune(spec.root, spec.version, spec.retention.keep_versions,
                    spec.retention.keep_superseded_hours)
    _release_lock(spec)
    try:  # after LATEST moved: readers need not wait for it
        files.delete_tree(spec.tmp_dir)
    except Exception as e:  # refused (a retention policy): published all the same
        logging.warning("could not delete %s (%s); published anyway", spec.tmp_dir,
                        " ".join(str(e).split())[:300])
    return manifest


def _fail(spec, error):
    """A deterministic failure: recorded in the version's .tmp/ (so each of the runner's
    retries raises the same error, not LockLost), the lock released, `error` raised."""
    with files.create_final(layout.join(spec.tmp_dir, layout.COMMIT_FAILED)) as out:
        out.write(json.dumps({"error": type(error).__name__, "message": str(error)}).encode())
    _release_lock(spec)
    raise error


def _raise_earlier_failure(spec):
    """Raise the deterministic failure an earlier attempt of this commit recorded."""
    path = layout.join(spec.tmp_dir, layout.COMMIT_FAILED)
    if files.exists(path):
        record = files.read_json(path)
        raise {kind.__name__: kind for kind in DETERMINISTIC}[record["error"]](
            record["message"])


def _release_lock(spec):
    """A job submitted by a launcher that did not wait holds ROOT/.lock: done with it now.
    (A waiting launcher's lock is its own to release; this leaves it alone.)"""
    lock.release_submitted(spec.root, spec.version)


def _check_error_budget(failed, spec):
    """Too many rejected inputs: the version stays unpublished (errors.jsonl says why)."""
    rate = failed / max(spec.listed.listed, 1)
    if rate > spec.max_error_rate:
        _fail(spec, ErrorRateExceeded(
            f"{failed} of {spec.listed.listed} inputs rejected ({rate:.1%}) exceeds "
            f"--max_error_rate {spec.max_error_rate:g}; nothing published; "
            f"see {layout.join(spec.vdir, layout.ERRORS)}"))


def one_build(results):
    """The code build every shard of `results` recorded (None: none recorded one); raises
    MixedBuilds naming two builds and a shard of each when they disagree."""
    first = None
    for r in sorted((r for r in results if r.writer.build), key=lambda r: (r.split, r.shard)):
        if first is None:
            first = r
        elif r.writer.build != first.writer.build:
            raise MixedBuilds(
                f"shards of two code builds in one version: {first.files.file} was written by "
                f"{code_build.describe(first.writer.build)}; {r.files.file} by "
                f"{code_build.describe(r.writer.build)}; nothing published (name the worker "
                "image by digest or by the tag docker/image_tag.py prints, and launch from the "
                "same build)")
    return first and first.writer.build


def _check_one_build(results, spec):
    """One version, one code build: refuse (deterministically) shards of two builds."""
    try:
        one_build(results)
    except MixedBuilds as e:
        _fail(spec, e)


def _warn_empty_classes(labels, label_counts):
    seen = {label for counts in label_counts.values() for label, n in counts.items() if n}
    for label in labels:
        if label not in seen:
            logging.warning("class %r has no images in this version; its id is kept", label)


def _commit_shard(spec, split, shard, result):
    """One shard's manifest entry; a shard written to a temp name is renamed first (the
    writers put theirs under the final name already: no request at all)."""
    final_name = layout.shard_name(spec.name, split, shard, spec.num_shards[split])
    final = layout.join(spec.vdir, final_name)
    if result is None:  # no image hashed into this shard: an empty, valid TFRecord file
        files.write_bytes(final, b"")
        if spec.write_index:
            files.write_bytes(layout.index_name(final), b"")
        return {"path": final_name, "num_examples": 0, "num_bytes": 0,
                "crc32c": frames.file_crc32c(b""), "origin": Origin.HASH}
    where, written = result.files, result.written
    if where.shared:  # an earlier version's file, reused where it is: nothing to move
        return {"path": where.shared, "num_examples": written.num_examples,
                "num_bytes": written.num_bytes, **checksum(result), "origin": result.origin}
    if where.temp != final:  # written to a temp name (--sink beam, dropped duplicates)
        _rename(where.temp, final)
    if spec.write_index and where.index_temp and where.index_temp != layout.index_name(final):
        _rename(where.index_temp, layout.index_name(final))
    return {"path": final_name, "num_examples": written.num_examples,
            "num_bytes": written.num_bytes, **checksum(result), "origin": result.origin}


def checksum(result):
    """The shard entry's checksum field: crc32c, or sha256 for a shard reused from a version
    written before shards had a CRC-32C."""
    written = result.written
    return {"crc32c": written.crc32c} if written.crc32c else {"sha256": written.sha256}


def _content_duplicates(ordered, spec):
    """Report groups of identical stored images; with --drop_content_duplicates, rewrite the
    shards that hold the extra copies. -> (results, manifest entry or None, number dropped)."""
    if not ordered:
        return ordered, None, 0
    entry, extras = duplicates.report([r.files.catalog_temp for r in ordered], spec.vdir,
                                      collect_extras=spec.dedup.drop_content_duplicates)
    if not spec.dedup.drop_content_duplicates:
        return ordered, entry, 0
    kept = [rewrite.keep_rows(r, extras[r.files.file], spec.write_index)
            if r.files.file in extras else r for r in ordered]
    return kept, entry, sum(a.written.num_examples - b.written.num_examples
                            for a, b in zip(ordered, kept))


def _near_duplicates(ordered, spec):
    """Group near-duplicate stored images (near_duplicates.jsonl); with
    --drop_near_duplicate_leaks, rewrite the evaluation shards holding leaks.
    -> (results, manifest entry or None, number of leaks dropped)."""
    if not ordered or not spec.dedup.near_duplicates:
        return ordered, None, 0
    entry, drop = leaks.report(ordered, spec)
    kept = [rewrite.keep_rows(r, drop[r.files.path], spec.write_index)
            if r.files.path in drop else r for r in ordered]
    return kept, entry, sum(a.written.num_examples - b.written.num_examples
                            for a, b in zip(ordered, kept))


def _merge_catalog(ordered, spec):
    """The shards' catalog fragments, in order -> VDIR/catalog.parquet.

    Returns (its row count, {longer side: count}), or (None, {}) when the sink wrote no
    fragments (--sink beam).
    """
    if not ordered:
        return None, {}
    return catalog.merge([r.files.catalog_temp for r in ordered],
                         layout.join(spec.vdir, layout.CATALOG))


def _write_split_map(spec, catalog_rows):
    """VDIR/split_map.parquet: the map this version was planned with plus its own new
    contents (store/split_map.py) -> its manifest entry. Without a catalog (--sink beam)
    the contents come from the file the sink wrote (job/beam_sink.py), so the splits it
    decided hold in later builds; None when there is neither."""
    contents = layout.join(spec.vdir, layout.CATALOG)
    if catalog_rows is None:
        contents = layout.join(spec.tmp_dir, beam_sink.CONTENTS)
        if not files.exists(contents):
            return None
    old = None
    if spec.split_map_from:
        if spec.split_map_from.endswith("/" + layout.CATALOG):  # written before split maps
            old = split_map.read_catalog(spec.split_map_from)
        else:  # read a row group at a time, never whole
            old = split_map_file.open_stored(spec.split_map_from)
    new = split_map_file.build(old, contents, layout.join(spec.vdir, layout.SPLIT_MAP))
    root = spec.root.rstrip("/") + "/"
    since = spec.split_map_from
    return {"path": layout.SPLIT_MAP, "contents": new,
            "added": new - (len(old) if old is not None else 0),
            "from": since[len(root):] if since and since.startswith(root) else since,
            "notes": list(spec.notes)}


def _rename(temp, final):
    if FileSystems.exists(temp):
        if FileSystems.exists(final):  # a retried commit: replace what an earlier try left
            FileSystems.delete([final])
        FileSystems.rename([temp], [final])
    elif not FileSystems.exists(final):
        raise FileNotFoundError(f"shard temp file {temp} is missing")


class Commit(beam.PTransform):
    """PCollection of ShardResults -> one published manifest (the job's final stage)."""

    def __init__(self, spec, extra_files=(), manifest_parts=()):
        super().__init__()
        self.spec, self.extra_files = spec, tuple(extra_files)
        self.manifest_parts = tuple(manifest_parts)  # PCollections of dicts, waited for

    def expand(self, results):
        parts = [beam.pvalue.AsList(p) for p in self.manifest_parts]
        counts = results | "LabelCounts" >> beam.CombineGlobally(SumLabelCounts())
        error_files = (results
                       | "ErrorLines" >> beam.FlatMap(
                           lambda r: [e.to_json() for e in r.errors])
                       | "WriteErrors" >> beam.io.WriteToText(
                           layout.join(self.spec.tmp_dir, layout.SHARD_ERRORS),
                           file_name_suffix=layout.JSONL, shard_name_template="", num_shards=1))
        return (results
                | "Slim" >> beam.Map(lambda r: r.slim()).with_output_types(ShardResult)
                | "AllShards" >> beam.combiners.ToList()   # -> [slim ShardResult], one per shard
                | "WriteManifest" >> beam.Map(_commit_with_parts, self.spec, self.extra_files,
                                              beam.pvalue.AsSingleton(counts),
                                              beam.pvalue.AsList(error_files), *parts))


def _commit_with_parts(results, spec, extra_files, label_counts, error_files, *part_lists):
    return commit(results, spec, extra_files, [d for part in part_lists for d in part],
                  label_counts, tuple(error_files))
