"""manifest.json as one typed value: the job builds it, commit writes it, `DatasetInfo` wraps
it, and verify, the launcher and the readers read it (fields: docs/format.md).

    Manifest
      splits: {split: SplitEntry}     num_examples, num_bytes, label_counts, shards
        shards: (ShardEntry, ...)     path (relative to the version dir), num_examples,
                                      num_bytes, crc32c | sha256, origin
      accounting: Accounting          listed = written + duplicates + failed (+ leaks)
      errors: ErrorsEntry             errors.jsonl: path, count, by_reason
      fields: dict | None             --schema's declared fields (dataset_format/fields.py)
      catalog: CatalogEntry | None    catalog.parquet: path, rows (None: --sink beam)
      incremental: Increment | None   what an incremental version built on and reused
      build: BuildEntry | None        writer processes, images converted, reframed, resumed
      sections: {name: dict}          the optional parts (split_map, stored_images,
                                      content_duplicates, near_duplicates, transform, tfds, …)

A field this module does not model (a section, or a key a newer writer added) is kept as
read, in place: `Manifest.from_json(text).to_json() == text` for every manifest a build
wrote, so a reader that rewrites one (materialize) loses nothing. The value is read-only and
answers `manifest["splits"]`, `.get` and `in` as the JSON object would.
"""

import collections.abc
import dataclasses
import json
from typing import Mapping, Optional, Tuple

# The top-level keys in the order a build writes them; `sections` fill the gaps in order.
_ORDER = ("format_version", "name", "version", "created_at", "generator", "input_fingerprint",
          "config", "labels", "label_offset", "features", "key_scheme", "splits",
          "accounting", "errors", "fields", "catalog")
_TAIL = ("incremental", "build")  # after the sections a build writes before them


def _omit_none(pairs):
    return {k: v for k, v in pairs if v is not None}


class _Entry:
    """A typed JSON object: its fields in order, then the keys it keeps as read (`extra`)."""

    _KEYS: Tuple[str, ...] = ()

    def to_dict(self):
        known = _omit_none((k, _plain(getattr(self, k))) for k in self._KEYS)
        return {**known, **self.extra}

    @classmethod
    def from_dict(cls, d):
        fields = {k: d[k] for k in cls._KEYS if k in d}
        return cls(**cls._typed(fields), extra={k: v for k, v in d.items() if k not in cls._KEYS})

    @classmethod
    def _typed(cls, fields):
        return fields


def _plain(value):
    if isinstance(value, _Entry):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


@dataclasses.dataclass(frozen=True)
class ShardEntry(_Entry):
    """One shard file: where (`../V/NAME` when shared with the version V that wrote it)."""

    path: str
    num_examples: int
    num_bytes: Optional[int] = None
    crc32c: Optional[str] = None   # base64, as Cloud Storage reports it (format 2 on)
    sha256: Optional[str] = None   # hex: a shard reused from a version before format 2
    origin: Optional[str] = None   # "hash" or "delta"
    extra: Mapping = dataclasses.field(default_factory=dict)
    _KEYS = ("path", "num_examples", "num_bytes", "crc32c", "sha256", "origin")


@dataclasses.dataclass(frozen=True)
class SplitEntry(_Entry):
    num_examples: int
    num_bytes: Optional[int] = None
    label_counts: Optional[Mapping] = None  # {class: examples}, every class in label order
    shards: Tuple[ShardEntry, ...] = ()
    extra: Mapping = dataclasses.field(default_factory=dict)
    _KEYS = ("num_examples", "num_bytes", "label_counts", "shards")

    @classmethod
    def _typed(cls, fields):
        return dict(fields, shards=tuple(ShardEntry.from_dict(s) for s in fields.get("shards", ())))


@dataclasses.dataclass(frozen=True)
class Accounting(_Entry):
    """Every listed input, once: written, a duplicate, failed, or a dropped leak."""

    listed: int
    duplicates: int
    failed: int
    written: int
    leaks: Optional[int] = None
    passed_through: Optional[int] = None  # JPEGs stored byte for byte
    extra: Mapping = dataclasses.field(default_factory=dict)
    _KEYS = ("listed", "duplicates", "failed", "written", "leaks", "passed_through")


@dataclasses.dataclass(frozen=True)
class ErrorsEntry(_Entry):
    path: str
    count: int
    by_reason: Mapping
    extra: Mapping = dataclasses.field(default_factory=dict)
    _KEYS = ("path", "count", "by_reason")


@dataclasses.dataclass(frozen=True)
class CatalogEntry(_Entry):
    path: str
    rows: int
    extra: Mapping = dataclasses.field(default_factory=dict)
    _KEYS = ("path", "rows")


@dataclasses.dataclass(frozen=True)
class BuildEntry(_Entry):
    """What the build did: distinct writer processes, images decoded, records re-framed,
    shards taken finished from a failed run, shards repaired; and the workers' code build."""

    writer_processes: int = 0
    converted: int = 0
    reframed: int = 0
    resumed_shards: int = 0
    repaired: int = 0
    workers: Optional[Mapping] = None  # the code build that wrote every shard (None: unsaid)
    extra: Mapping = dataclasses.field(default_factory=dict)
    _KEYS = ("writer_processes", "converted", "reframed", "resumed_shards", "repaired",
             "workers")


@dataclasses.dataclass(frozen=True)
class Increment(_Entry):
    """An incremental version: the version it built on ("from") and what it reused
    (`reused`, `rewritten`, `added_shards`: {shards, examples, bytes}); the planner's counts
    stay in `extra` as they were planned."""

    reused: Optional[Mapping] = None
    rewritten: Optional[Mapping] = None
    added_shards: Optional[Mapping] = None
    bytes_reused_share: Optional[float] = None
    extra: Mapping = dataclasses.field(default_factory=dict)
    _KEYS = ("reused", "rewritten", "added_shards", "bytes_reused_share")

    @property
    def previous(self):
        return self.extra.get("from")

    def to_dict(self):  # the planner's counts first, as a build writes them
        return {**self.extra, **_omit_none((k, getattr(self, k)) for k in self._KEYS)}


@dataclasses.dataclass(frozen=True, eq=False)
class Manifest(collections.abc.Mapping):
    format_version: int
    name: str
    version: str
    created_at: str
    generator: Optional[Mapping]
    input_fingerprint: Optional[str]
    config: Optional[Mapping]      # the options that made it (None: a manifest without)
    labels: Tuple[str, ...]
    label_offset: Optional[int]    # 0 since format 1 (None: not written)
    features: Optional[Mapping]
    key_scheme: Optional[str]
    splits: Mapping            # split -> SplitEntry, in the manifest's order
    accounting: Optional[Accounting]
    errors: Optional[ErrorsEntry]
    fields: Optional[Mapping] = None  # --schema's declared fields, with their class ids
    catalog: Optional[CatalogEntry] = None
    incremental: Optional[Increment] = None
    build: Optional[BuildEntry] = None
    sections: Mapping = dataclasses.field(default_factory=dict)  # the rest, kept as read
    order: Tuple[str, ...] = ()  # the keys' order as read (empty: as a build writes them)

    # -- JSON ---------------------------------------------------------------------------
    def to_dict(self):
        known = {k: _plain(getattr(self, k)) for k in _ORDER if k != "splits"}
        known["labels"] = list(self.labels)
        known["splits"] = {name: s.to_dict() for name, s in self.splits.items()}
        out = {k: known[k] for k in _ORDER if known[k] is not None}
        out.update(self.sections)
        out.update(_omit_none((k, _plain(getattr(self, k))) for k in _TAIL))
        if self.order:
            out = {**{k: out[k] for k in self.order if k in out}, **out}
        return out

    def to_json(self):
        """The file's text: two-space indent, keys in the order written."""
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, d, keep_order=True):
        def entry(kind, key):
            return kind.from_dict(d[key]) if d.get(key) is not None else None

        modelled = set(_ORDER) | set(_TAIL)
        return cls(
            format_version=d.get("format_version"), name=d.get("name", ""),
            version=d.get("version"), created_at=d.get("created_at"),
            generator=d.get("generator"), input_fingerprint=d.get("input_fingerprint"),
            config=d.get("config"), labels=tuple(d.get("labels", ())),
            label_offset=d.get("label_offset"), features=d.get("features"),
            key_scheme=d.get("key_scheme"),
            splits={n: SplitEntry.from_dict(s) for n, s in d.get("splits", {}).items()},
            accounting=entry(Accounting, "accounting"), errors=entry(ErrorsEntry, "errors"),
            fields=d.get("fields"),
            catalog=entry(CatalogEntry, "catalog"), incremental=entry(Increment, "incremental"),
            build=entry(BuildEntry, "build"),
            sections={k: v for k, v in d.items() if k not in modelled},
            order=tuple(d) if keep_order else ())

    @classmethod
    def from_json(cls, text):
        return cls.from_dict(json.loads(text))

    def with_sections(self, *parts):
        """A copy with more optional sections ({name: value} dicts, e.g. a branch's part or a
        commit hook's), written after the keys it has."""
        sections, order = dict(self.sections), list(self)
        for part in parts:
            sections.update(part)
            order += [k for k in part if k not in order]
        return dataclasses.replace(self, sections=sections, order=tuple(order))

    # -- read as the JSON object ----------------------------------------------------------
    def _dict(self):
        cached = self.__dict__.get("_as_dict")
        if cached is None:
            cached = self.to_dict()
            object.__setattr__(self, "_as_dict", cached)
        return cached

    def __getitem__(self, key):
        return self._dict()[key]

    def __iter__(self):
        return iter(self._dict())

    def __len__(self):
        return len(self._dict())

    def __repr__(self):
        return f"Manifest({self.name!r}, version={self.version!r})"

    @property
    def has_split_map(self):
        return "split_map" in self.sections
