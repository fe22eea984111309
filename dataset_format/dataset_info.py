"""What a built dataset holds, read from its manifest (docs/format.md) without touching the shards.

Finding a version (LATEST, or a pinned id) and reading its manifest go through
dataset_format/storage.py, so local paths and gs:// behave the same without TensorFlow or
Apache Beam.
"""

import dataclasses
import json
import posixpath
from typing import Dict, Optional, Tuple

from dataset_format import holds, layout, refs, removal, storage
from dataset_format.manifest import Manifest
from dataset_format.layout import (FORMAT_VERSION, LATEST, MANIFEST, READABLE_FORMAT_VERSIONS,
                                   VERSIONS, join, version_dir)


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    path: str  # absolute: the manifest's path resolved (layout.shard_file)
    num_examples: int
    num_bytes: Optional[int] = None
    sha256: Optional[str] = None  # hex, shards written before format 2 carried crc32c
    crc32c: Optional[str] = None  # the file's CRC-32C, base64 as Cloud Storage reports it
    name: Optional[str] = None    # the manifest's path, relative to the version dir
    origin: Optional[str] = None  # "hash" (a full plan's) or "delta" (new inputs, incremental)


@dataclasses.dataclass(frozen=True)
class SplitInfo:
    name: str
    num_examples: int
    num_bytes: Optional[int]
    label_counts: Dict[str, int]
    shards: Tuple[ShardInfo, ...]

    @property
    def files(self):
        return [s.path for s in self.shards]


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    name: str
    version: str
    version_dir: str
    labels: Tuple[str, ...]
    label_offset: int
    splits: Dict[str, SplitInfo]
    manifest: Manifest = dataclasses.field(repr=False, compare=False)
    # True when the version came from ROOT/LATEST (what `info(root)` without `version=` does):
    # fine on one host; several hosts each following LATEST may land on different versions.
    followed_latest: bool = False
    # What built it, for the next build deciding what it may reuse (launcher/prepare.py):
    input_fingerprint: Optional[str] = None
    config: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)
    generator: Optional[dict] = dataclasses.field(default=None, repr=False, compare=False)
    key_scheme: Optional[str] = None
    catalog_rows: Optional[int] = None  # the catalog's row count, when the manifest says
    tag: Optional[str] = None  # the tag it was opened by (refs.py), if any

    @property
    def has_catalog(self):
        """Whether the version has a catalog (a --sink beam build writes none): the splits
        its images keep for life, and the records a next build may reuse."""
        return self.manifest.catalog is not None

    @property
    def has_split_map(self):
        """Whether the manifest names its own split_map.parquet (versions before it had
        none: their catalog is their split map)."""
        return self.manifest.has_split_map

    @property
    def num_classes(self):
        return len(self.labels)

    @property
    def class_names(self):
        """The class names by 0-based id (TFDS's ClassLabel.names)."""
        return list(self.labels)

    @property
    def catalog(self):
        """Path of catalog.parquet (one row per example: key, uri, label, split, shard,
        position, sha256, …), or None for versions written before it existed."""
        entry = self.manifest.catalog
        return layout.join(self.version_dir, entry.path) if entry else None

    def split(self, name):
        """The SplitInfo for `name`, with an error that lists what exists."""
        try:
            return self.splits[name]
        except KeyError:
            raise KeyError(f"{self.version_dir}: no split {name!r}; "
                           f"this version has {sorted(self.splits)}") from None


def from_manifest(vdir, manifest, followed_latest=False):
    """The version at `vdir` from its Manifest (or the manifest's JSON object)."""
    if not isinstance(manifest, Manifest):
        manifest = Manifest.from_dict(manifest)
    splits = {}
    for name, s in manifest.splits.items():
        shards = tuple(ShardInfo(path=layout.shard_file(vdir, sh.path),
                                 num_examples=int(sh.num_examples), num_bytes=sh.num_bytes,
                                 sha256=sh.sha256, crc32c=sh.crc32c, name=sh.path,
                                 origin=sh.origin)
                       for sh in s.shards)
        splits[name] = SplitInfo(name=name, num_examples=int(s.num_examples),
                                 num_bytes=s.num_bytes, label_counts=dict(s.label_counts or {}),
                                 shards=shards)
    return DatasetInfo(name=manifest.name or "",
                       version=manifest.version or posixpath.basename(vdir),
                       version_dir=vdir, labels=manifest.labels,
                       label_offset=int(manifest.label_offset or 0), splits=splits, manifest=manifest,
                       followed_latest=followed_latest,
                       input_fingerprint=manifest.input_fingerprint, config=manifest.config or {},
                       generator=manifest.generator, key_scheme=manifest.key_scheme,
                       catalog_rows=manifest.catalog.rows if manifest.catalog else None)


def info(path, version=None, hold=False):
    """Labels, splits (counts and shard files) and version of a dataset root or version dir.

    A root is resolved through LATEST once, here, unless `version` (an id under
    ROOT/versions/, e.g. "20261201T101500Z", or a tag's name) pins one. Pass the result to
    `make_dataset` so later reads see this version while a new one is being published.
    hold: True (or a lease length in seconds) keeps retention from removing the version
    while the result, or a dataset or loader made from it, is alive (dataset_format/holds.py).
    """
    vdir, manifest = load_manifest(path, version)
    followed = version is None and vdir.rstrip("/") != str(path).rstrip("/")
    found = from_manifest(vdir, manifest, followed_latest=followed)
    if version and not refs.is_version_id(version) and found.version != version:
        found = dataclasses.replace(found, tag=version)
    if hold:
        holds.hold(found, hold)
    return found


def check_ref(ds_info, ref):
    """ValueError unless `ref` (a version id or a tag of its root) names the version
    `ds_info` holds: make_dataset and the loaders, given both."""
    if not ref or ref in (ds_info.version, ds_info.tag):
        return
    root = layout.root_of(ds_info.version_dir)
    named = refs.version_of(root, ref) if root and not refs.is_version_id(ref) else ref
    if named != ds_info.version:
        raise ValueError(f"{ds_info.version_dir}: is version {ds_info.version}, not {ref}"
                         + (f" (tag {ref} names {named})" if named != ref else ""))


def resolve(path, version=None):
    """The version directory for a dataset root (via LATEST, read once; or `version`, an id
    under ROOT/versions/ or a tag) or a version directory itself."""
    path = str(path).rstrip("/")
    if version:
        tag = None if refs.is_version_id(version) else version
        try:
            named = refs.version_of(path, version)
        except FileNotFoundError:
            named = None
        vdir = version_dir(path, named or version)
        if named and storage.exists(join(vdir, MANIFEST)):
            return vdir
        if storage.exists(join(path, MANIFEST)) and posixpath.basename(path) == version:
            return path  # already that version's directory
        if named is None:
            refs.version_of(path, version)  # raises: no such tag
        raise _missing(path, named, tag)
    if storage.exists(join(path, MANIFEST)):
        return path
    if layout.root_of(path) is not None and storage.exists(
            join(layout.root_of(path), LATEST)):  # ROOT/versions/V without its manifest
        raise _missing(layout.root_of(path), posixpath.basename(path), None)
    latest = join(path, LATEST)
    if storage.exists(latest):
        record = json.loads(storage.read_text(latest))
        return posixpath.dirname(join(path, record["manifest"]))
    raise FileNotFoundError(
        f"{path}: not a dataset (no {MANIFEST} and no {LATEST}); "
        "pass the --output root of a finished build or one of its versions/ directories")


def _missing(root, version, tag):
    """The error for a version of ROOT without a manifest: removed by retention when it is
    older than LATEST's, else not published (yet)."""
    named = f"tag {tag!r} names version {version}, which" if tag else f"version {version!r}"
    try:
        latest = json.loads(storage.read_text(join(root, LATEST)))["version"]
    except Exception:  # no LATEST, or unreadable: nothing more is known
        latest = None
    if latest and version < latest:
        said = removal.message(root, version, certain=storage.exists(version_dir(root, version))
                               if "://" not in root else True)
        return removal.VersionRemoved(f"{named} was removed: {said}" if tag else said)
    return FileNotFoundError(
        f"{version_dir(root, version)}: no {MANIFEST}: {named} does not exist under {root} "
        f"(not published yet?); the versions are the directories in {join(root, VERSIONS)}/")


def load_manifest(path, version=None):
    """(version_dir, Manifest) for a dataset root or version directory."""
    vdir = resolve(path, version)
    manifest = Manifest.from_json(storage.read_text(join(vdir, MANIFEST)))
    if manifest.format_version not in READABLE_FORMAT_VERSIONS:
        raise ValueError(f"{vdir}/{MANIFEST}: format_version {manifest.format_version!r} "
                         f"is newer than this reader knows ({FORMAT_VERSION}); upgrade it")
    return vdir, manifest
