"""Where things live in a dataset root (docs/format.md, "Layout"); the one module that owns file names.

Reads through dataset_format/storage.py, so local paths and gs:// behave the same without
TensorFlow or Apache Beam.
"""

import json
import posixpath
import re

from dataset_format import storage

LATEST = "LATEST"
VERSIONS = "versions"
MANIFEST = "manifest.json"
ERRORS = "errors.jsonl"
INDEX_SUFFIX = ".index"
CATALOG = "catalog.parquet"
TMP = ".tmp"  # a version's work files while it is built (deleted once it is published)
FRAGMENT_SUFFIX = ".catalog.parquet"  # in TMP: a shard attempt's catalog fragment
COMMIT_FAILED = "commit_failed.json"  # in TMP: a commit's deterministic failure, which its
                                      # retries raise again
# 2: keys relative to their input (manifest["key_scheme"]) and catalog.parquet.
FORMAT_VERSION = 2
READABLE_FORMAT_VERSIONS = (1, 2)
KEY_SCHEME = "relative/1"  # image/filename = path relative to its input root


def join(*parts):
    """Join path parts with '/', which is right for both local paths and gs://."""
    return posixpath.join(*parts)


def shard_name(name, split, shard, num_shards):
    """TFDS file naming: NAME-SPLIT.tfrecord-SSSSS-of-NNNNN."""
    return f"{name}-{split}.tfrecord-{shard:05d}-of-{num_shards:05d}"


_SHARD_NAME = re.compile(r"(.+)-([^-]+)\.tfrecord-(\d+)-of-(\d+)")


def parse_shard_name(path):
    """A shard file's path or name -> (name, split, shard, num_shards); ValueError if not one."""
    match = _SHARD_NAME.fullmatch(posixpath.basename(path))
    if not match:
        raise ValueError(f"{path}: not a shard name (NAME-SPLIT.tfrecord-SSSSS-of-NNNNN)")
    name, split, shard, num_shards = match.groups()
    return name, split, int(shard), int(num_shards)


def index_name(shard_file):
    """The DALI / `tfrecord`-package index that sits next to a shard."""
    return shard_file + INDEX_SUFFIX


def version_dir(root, version):
    return join(root, VERSIONS, version)


def latest_record(version):
    """The content of ROOT/LATEST for `version`."""
    return {"version": version, "manifest": join(VERSIONS, version, MANIFEST)}


def resolve(path, version=None):
    """The version directory for a dataset root (via LATEST, read once; or `version`, an id
    under ROOT/versions/) or a version directory itself."""
    path = str(path).rstrip("/")
    if version:
        vdir = version_dir(path, version)
        if storage.exists(join(vdir, MANIFEST)):
            return vdir
        if storage.exists(join(path, MANIFEST)) and posixpath.basename(path) == version:
            return path  # already that version's directory
        raise FileNotFoundError(
            f"{vdir}: no {MANIFEST}: version {version!r} does not exist under {path} "
            f"(pruned, or not published yet?); the versions are the directories in "
            f"{join(path, VERSIONS)}/")
    if storage.exists(join(path, MANIFEST)):
        return path
    latest = join(path, LATEST)
    if storage.exists(latest):
        record = json.loads(storage.read_text(latest))
        return posixpath.dirname(join(path, record["manifest"]))
    raise FileNotFoundError(
        f"{path}: not a dataset (no {MANIFEST} and no {LATEST}); "
        "pass the --output root of a finished build or one of its versions/ directories")


def load_manifest(path, version=None):
    """(version_dir, manifest dict) for a dataset root or version directory."""
    vdir = resolve(path, version)
    manifest = json.loads(storage.read_text(join(vdir, MANIFEST)))
    if manifest.get("format_version") not in READABLE_FORMAT_VERSIONS:
        raise ValueError(f"{vdir}/{MANIFEST}: format_version {manifest.get('format_version')!r} "
                         f"is newer than this reader knows ({FORMAT_VERSION}); upgrade it")
    return vdir, manifest
