"""The manifest as a pure function of what commit finalized: no I/O, so tests build it from
typed values alone and a retried commit that finds the same files writes the same manifest."""

import dataclasses
from typing import Optional

from beam_pipeline.kinds import Kind
from beam_pipeline.store import catalog
from dataset_format import layout, schema
from dataset_format.manifest import (Accounting, BuildEntry, CatalogEntry, ErrorsEntry,
                                     Increment, Manifest, ShardEntry, SplitEntry)


@dataclasses.dataclass(frozen=True)
class Finalized:
    """What commit found and wrote before the manifest (shards renamed, catalog merged)."""

    results: tuple                       # ShardResults, after dropping content duplicates
    shards: dict                         # split -> [manifest shard entries], in shard order
    errors: tuple = ()                   # the listing's error records, then the shards'
    catalog_rows: Optional[int] = None   # None: no catalog (--sink beam)
    longer_sides: dict = dataclasses.field(default_factory=dict)  # longer side -> images
    content_duplicates: Optional[dict] = None  # duplicates.jsonl's manifest entry
    dropped: int = 0                     # content duplicates dropped
    near_duplicates: Optional[dict] = None  # near_duplicates.jsonl's manifest entry
    leaks: int = 0                       # evaluation images dropped as near-copies of train
    # Commit in a job: the sums the workers combined, instead of summing the results' own
    # (which commit's list of every shard no longer carries: ShardResult.slim).
    label_counts: Optional[dict] = None  # split -> {class: images}
    error_reasons: Optional[dict] = None  # reason -> errors, for errors.jsonl's records
    split_map: Optional[dict] = None     # split_map.parquet's manifest entry

    def counts_of(self, split):
        """{class: images} in `split`."""
        if self.label_counts is not None:
            return self.label_counts.get(split, {})
        counts = {}
        for r in self.results:
            if r.split == split:
                for label, c in r.sums.label_counts.items():
                    counts[label] = counts.get(label, 0) + c
        return counts

    def reasons(self):
        """{reason: errors} over errors.jsonl."""
        return self.error_reasons if self.error_reasons is not None else by_reason(self.errors)


def build_manifest(spec, done, created_at, parts=()):
    """CommitSpec + Finalized -> the Manifest; `created_at` a UTC datetime. `parts` are
    other branches' sections (e.g. the transform analysis), written after the build's."""
    reasons = done.reasons()
    sections = {}
    if done.split_map is not None:
        sections["split_map"] = done.split_map
    if done.longer_sides:
        sections["stored_images"] = {"median_longer_side": catalog.median(done.longer_sides),
                                     "max_longer_side": max(done.longer_sides)}
    if done.content_duplicates is not None:
        sections["content_duplicates"] = dict(done.content_duplicates, dropped=done.dropped)
    if done.near_duplicates is not None:
        sections["near_duplicates"] = done.near_duplicates
    manifest = Manifest(
        format_version=layout.FORMAT_VERSION, name=spec.name, version=spec.version,
        created_at=created_at.strftime("%Y-%m-%dT%H:%M:%SZ"), generator=spec.generator,
        input_fingerprint=spec.input_fingerprint, config=spec.config, labels=tuple(spec.labels),
        label_offset=0, features=dict(schema.FEATURES), key_scheme=layout.KEY_SCHEME,
        splits=split_summaries(spec, done), accounting=accounting(spec, done),
        errors=ErrorsEntry(path=layout.ERRORS, count=sum(reasons.values()), by_reason=reasons),
        fields=spec.fields or None,
        catalog=(CatalogEntry(path=layout.CATALOG, rows=done.catalog_rows)
                 if done.catalog_rows is not None else None),
        incremental=increment_summary(spec.increment, done.results) if spec.increment else None,
        # Distinct processes that ran the shard writer (0 with --sink beam, which does not
        # say). Images decoded and converted, and stored records re-framed under a new key
        # or label; shards taken finished from a failed run (job/attempts.py).
        build=BuildEntry(writer_processes=len({r.writer.process for r in done.results
                                               if r.writer.process}),
                         converted=sum(r.made.converted for r in done.results),
                         reframed=sum(r.made.reframed for r in done.results),
                         resumed_shards=sum(r.made.resumed for r in done.results),
                         repaired=sum(r.made.repaired for r in done.results),
                         # the one build every shard recorded (commit checked)
                         workers=next((r.writer.build for r in done.results if r.writer.build),
                                      None)),
        sections=sections)
    return manifest.with_sections(*parts)


def split_summaries(spec, done):
    """{split: SplitEntry}: examples, bytes, label counts (every class, in label order),
    shard entries."""
    splits = {}
    for split, shards in done.shards.items():
        counts = done.counts_of(split)
        label_counts = {label: counts.get(label, 0) for label in spec.labels}
        if counts.get(""):  # records without a class label (a manifest with fields)
            label_counts[""] = counts[""]
        splits[split] = SplitEntry(
            num_examples=sum(s["num_examples"] for s in shards),
            num_bytes=sum(s["num_bytes"] for s in shards),
            label_counts=label_counts,
            shards=tuple(ShardEntry.from_dict(s) for s in shards))
    return splits


def accounting(spec, done):
    """Every listed input: written, a duplicate (by path, or by content when dropped), failed,
    or a leak (an evaluation image near a train image, when dropped)."""
    return Accounting(listed=spec.listed.listed,
                      duplicates=spec.listed.duplicates + done.dropped,
                      failed=sum(done.reasons().values()),
                      written=sum(r.written.num_examples for r in done.results),
                      leaks=done.leaks,
                      passed_through=sum(r.made.passed_through for r in done.results))


def by_reason(errors):
    reasons = {}
    for e in errors:
        reasons[e.reason] = reasons.get(e.reason, 0) + 1
    return reasons


def increment_summary(increment, results):
    """What an incremental version reused, rewrote and added, and from which version."""
    done = {}
    for kind in (Kind.REUSE, Kind.COPY, Kind.IMAGES):
        of_kind = [r for r in results if r.kind == kind]
        done[kind] = {"shards": len(of_kind),
                      "examples": sum(r.written.num_examples for r in of_kind),
                      "bytes": sum(r.written.num_bytes for r in of_kind)}
    total = sum(r.written.num_bytes for r in results) or 1
    return Increment(reused=done[Kind.REUSE], rewritten=done[Kind.COPY],
                     added_shards=done[Kind.IMAGES],
                     bytes_reused_share=round(done[Kind.REUSE]["bytes"] / total, 4),
                     extra=dict(increment))
