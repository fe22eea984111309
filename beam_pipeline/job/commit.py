"""The job's last stage: rename temp shards, write errors.jsonl and manifest.json, publish.

Runs once, inside the Beam job, after every shard is written (a launcher line after
run() is not guaranteed to execute on Dataflow). Idempotent, so a retry is safe.
"""

import dataclasses
import datetime
import json
import logging

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from beam_pipeline.store import catalog, files, versions
from beam_pipeline.job import duplicates, rewrite
from readers import layout, schema


class PublishRefused(RuntimeError):
    """A newer version was published while this one was being built."""


class ErrorRateExceeded(RuntimeError):
    """Too many rejected inputs: the version is written but not published."""


@dataclasses.dataclass(frozen=True)
class CommitSpec:
    """What the launcher knew: everything the manifest needs besides the shard stats."""

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

    @property
    def previous_vdir(self):
        return layout.version_dir(self.root, self.increment["from"]) if self.increment else None

    @property
    def vdir(self):
        return layout.version_dir(self.root, self.version)

    @property
    def tmp_dir(self):
        return layout.join(self.vdir, ".tmp")


def commit(shard_stats, spec, extra_files=(), manifest_parts=()):
    """All shard stats -> the published manifest (a dict). Raises to fail the job.

    `extra_files` are callables (version_dir, manifest) that write files beside the
    manifest and may add keys to it; `manifest_parts` are dicts produced by other branches
    of the job (e.g. the transform analysis) merged into the manifest.
    """
    vdir = spec.vdir
    done = layout.join(vdir, layout.MANIFEST)
    if files.exists(done):  # run again after it wrote the manifest (a runner's retry):
        return _publish(spec, files.read_json(done))  # publish only, rewrite nothing
    # Shards with a catalog fragment (not --sink beam), in split and shard order.
    cataloged = sorted((s for s in shard_stats if s.get("catalog_temp")),
                       key=lambda s: (s["split"], s["shard"]))
    content_duplicates, dropped = _content_duplicates(cataloged, spec)
    listing_errors = [json.loads(l) for l in _read_lines(spec.listing_errors_path)]
    errors = listing_errors + [e for s in shard_stats for e in s["errors"]]
    written = sum(s["num_examples"] for s in shard_stats)
    _write_errors(layout.join(vdir, layout.ERRORS), errors)
    rate = len(errors) / max(spec.listed, 1)
    if rate > spec.max_error_rate:
        _release_lock(spec)
        raise ErrorRateExceeded(
            f"{len(errors)} of {spec.listed} inputs rejected ({rate:.1%}) exceeds --max_error_rate "
            f"{spec.max_error_rate:g}; nothing published; see {layout.join(vdir, layout.ERRORS)}")

    splits = {}
    by_shard = {(s["split"], s["shard"]): s for s in shard_stats}
    for split, n in sorted(spec.num_shards.items()):
        shards = [_commit_shard(by_shard.get((split, i)), spec, split, i) for i in range(n)]
        counts = {}
        for i in range(n):
            for label, c in by_shard.get((split, i), {}).get("label_counts", {}).items():
                counts[label] = counts.get(label, 0) + c
        splits[split] = {
            "num_examples": sum(s["num_examples"] for s in shards),
            "num_bytes": sum(s["num_bytes"] for s in shards),
            "label_counts": {label: counts.get(label, 0) for label in spec.labels},
            "shards": shards,
        }
    catalog_rows, sides = _merge_catalog(cataloged, spec)
    for label in spec.labels:
        if not any(s["label_counts"].get(label) for s in splits.values()):
            logging.warning("class %r has no images in this version; its id is kept", label)

    reasons = {}
    for e in errors:
        reasons[e["reason"]] = reasons.get(e["reason"], 0) + 1
    now = datetime.datetime.now(datetime.timezone.utc)
    manifest = {
        "format_version": layout.FORMAT_VERSION,
        "name": spec.name,
        "version": spec.version,
        "created_at": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "generator": spec.generator,
        "input_fingerprint": spec.input_fingerprint,
        "config": spec.config,
        "labels": list(spec.labels),
        "label_offset": 0,
        "features": dict(schema.FEATURES),
        "key_scheme": layout.KEY_SCHEME,
        "splits": splits,
        "accounting": {"listed": spec.listed, "duplicates": spec.duplicates + dropped,
                       "failed": len(errors), "written": written,
                       "passed_through": sum(s.get("passed_through", 0) for s in shard_stats)},
        "errors": {"path": layout.ERRORS, "count": len(errors), "by_reason": reasons},
    }
    if catalog_rows is not None:
        manifest["catalog"] = {"path": layout.CATALOG, "rows": catalog_rows}
    if sides:
        manifest["stored_images"] = {"median_longer_side": catalog.median(sides),
                                     "max_longer_side": max(sides)}
    if content_duplicates is not None:
        manifest["content_duplicates"] = dict(content_duplicates, dropped=dropped)
    if spec.increment:
        manifest["incremental"] = increment_summary(spec.increment, shard_stats)
    # Distinct processes that ran the shard writer (0 with --sink beam, which does not say).
    manifest["build"] = {"writer_processes": len({s["writer"] for s in shard_stats
                                                  if s.get("writer")})}
    for part in manifest_parts:
        manifest.update(part)
    for extra in extra_files:  # hooks that add files next to the manifest (TFDS, TFT, …)
        extra(vdir, manifest)
    files.write_json(layout.join(vdir, layout.MANIFEST), manifest)  # now it is complete
    # Only now: a retried commit (say the manifest write failed) must still find the
    # listing errors in .tmp/, or its errors.jsonl and accounting would silently lose them.
    files.delete_tree(spec.tmp_dir)
    return _publish(spec, manifest)


def _publish(spec, manifest):
    """Move LATEST forward to this complete version, prune, release a handed-off lock."""
    published = versions.publish(spec.root, spec.version)
    if published != spec.version:
        _release_lock(spec)
        raise PublishRefused(f"version {published} was published while {spec.version} was "
                             f"being built; {spec.version} is complete but not published")
    versions.prune(spec.root, spec.version, spec.keep_versions)
    _release_lock(spec)
    return manifest


def _release_lock(spec):
    """A job submitted by a launcher that did not wait holds ROOT/.lock: done with it now.
    (A waiting launcher's lock is its own to release; this leaves it alone.)"""
    from beam_pipeline.store import lock

    lock.release_submitted(spec.root, spec.version)


def _commit_shard(stats, spec, split, shard):
    final_name = layout.shard_name(spec.name, split, shard, spec.num_shards[split])
    final = layout.join(spec.vdir, final_name)
    if stats is None:  # no image hashed into this shard: an empty, valid TFRecord file
        files.write_bytes(final, b"")
        if spec.write_index:
            files.write_bytes(layout.index_name(final), b"")
        return {"path": final_name, "num_examples": 0, "num_bytes": 0,
                "sha256": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                "origin": "hash"}
    _rename(stats["temp"], final)
    if spec.write_index and stats.get("index_temp"):
        _rename(stats["index_temp"], layout.index_name(final))
    return {"path": final_name, "num_examples": stats["num_examples"],
            "num_bytes": stats["num_bytes"], "sha256": stats["sha256"],
            "origin": stats.get("origin", "hash")}


def _content_duplicates(ordered, spec):
    """Report groups of identical stored images; with --drop_content_duplicates, rewrite the
    shards that hold the extra copies. -> (manifest entry or None, number dropped)."""
    if not ordered:
        return None, 0
    entry, extras = duplicates.report([s["catalog_temp"] for s in ordered], spec.vdir,
                                      collect_extras=spec.drop_content_duplicates)
    dropped = 0
    if spec.drop_content_duplicates:
        for s in ordered:
            if s["path"] in extras:
                before = s["num_examples"]
                rewrite.keep_rows(s, extras[s["path"]], spec.write_index)
                dropped += before - s["num_examples"]
    return entry, dropped


def increment_summary(increment, shard_stats):
    """What an incremental version reused, rewrote and added, and from which version."""
    summary = dict(increment)
    for kind, name in (("reuse", "reused"), ("copy", "rewritten"), ("images", "added_shards")):
        done = [s for s in shard_stats if s.get("kind") == kind]
        summary[name] = {"shards": len(done),
                         "examples": sum(s["num_examples"] for s in done),
                         "bytes": sum(s["num_bytes"] for s in done)}
    total = sum(s["num_bytes"] for s in shard_stats) or 1
    summary["bytes_reused_share"] = round(summary["reused"]["bytes"] / total, 4)
    return summary


def _merge_catalog(ordered, spec):
    """The shards' catalog fragments, in order -> VDIR/catalog.parquet.

    Returns (its row count, {longer side: count}), or (None, {}) when the sink wrote no
    fragments (--sink beam).
    """
    if not ordered:
        return None, {}
    return catalog.merge([s["catalog_temp"] for s in ordered],
                         layout.join(spec.vdir, layout.CATALOG))


def _rename(temp, final):
    if FileSystems.exists(temp):
        if FileSystems.exists(final):  # a retried commit: replace what an earlier try left
            FileSystems.delete([final])
        FileSystems.rename([temp], [final])
    elif not FileSystems.exists(final):
        raise FileNotFoundError(f"shard temp file {temp} is missing")


def _write_errors(path, errors):
    files.write_bytes(path, "".join(json.dumps(e, sort_keys=True) + "\n"
                                       for e in errors).encode())


def _read_lines(path):
    if not path or not FileSystems.exists(path):
        return []
    with FileSystems.open(path) as f:
        return [l for l in f.read().decode().splitlines() if l.strip()]


class Commit(beam.PTransform):
    """PCollection of shard stats -> one published manifest (the job's final stage)."""

    def __init__(self, spec, extra_files=(), manifest_parts=()):
        super().__init__()
        self.spec, self.extra_files = spec, tuple(extra_files)
        self.manifest_parts = tuple(manifest_parts)  # PCollections of dicts, waited for

    def expand(self, shard_stats):
        parts = [beam.pvalue.AsList(p) for p in self.manifest_parts]
        return (shard_stats
                | "AllShards" >> beam.combiners.ToList()        # -> [shard stats], one per shard
                | "WriteManifest" >> beam.Map(_commit_with_parts, self.spec,
                                              self.extra_files, *parts))


def _commit_with_parts(shard_stats, spec, extra_files, *part_lists):
    return commit(shard_stats, spec, extra_files, [d for part in part_lists for d in part])
