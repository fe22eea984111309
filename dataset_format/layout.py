"""Where things live in a dataset root (docs/format.md, "Layout"); the one module that owns file names.

Names only; the one I/O is the real path of a local version directory (dataset_info.py
finds and reads a version's manifest). Every file or directory name the writer, the tools
and the readers use is spelt here, once.
"""

import os
import posixpath
import re

# The root
LATEST = "LATEST"
VERSIONS = "versions"
LOCK = ".lock"                         # present while a build holds the root
TAGS = "tags"                          # ROOT/tags/NAME: a version a user named (refs.py)
HOLDS = "holds"                        # ROOT/holds/VERSION/HOLDER: a reader's lease (holds.py)
CLOCK_PROBE = ".clock-"                # a file retention writes to read the storage's clock

# A version directory
MANIFEST = "manifest.json"
ERRORS = "errors.jsonl"
INDEX_SUFFIX = ".index"
CATALOG = "catalog.parquet"
SPLIT_MAP = "split_map.parquet"  # the split of every content published under the root
DUPLICATES = "duplicates.jsonl"        # --drop_content_duplicates or not: always reported
NEAR_DUPLICATES = "near_duplicates.jsonl"  # with --near_duplicates: confirmed pairs
NEAR_DUPLICATES_REJECTED = "near_duplicates_rejected.jsonl"  # candidates not confirmed
# TFDS metadata beside the manifest; the ClassLabel names file is LABEL key + LABELS_SUFFIX
TFDS_DATASET_INFO = "dataset_info.json"
TFDS_FEATURES = "features.json"
TFDS_METADATA = "metadata.json"
TFDS_FILES = (TFDS_DATASET_INFO, TFDS_FEATURES, TFDS_METADATA)
TFDS_LABELS_SUFFIX = ".labels.txt"
# --transform: tf.Transform's output directory, and our assets in its assets/
TRANSFORM_FN = "transform_fn"
TRANSFORM_ASSETS = "assets"
TRANSFORM_LABEL_VOCABULARY = "label_vocabulary"  # "<count> <name>", by id
TRANSFORM_STATISTICS = "pixel_statistics.json"   # the train pixel statistics

# A build's work files, under VDIR/.tmp/ until commit deletes it
TMP = ".tmp"
COMMIT_FAILED = "commit_failed.json"  # a commit's deterministic failure, which its
                                      # retries raise again
SHARD_INDEX = "shards.jsonl"           # one ShardTask a line
LISTING = "listing"                    # one listing file per shard task
LISTING_ERRORS = "listing_errors.jsonl"
SHARD_ERRORS = "shard_errors"          # + JSONL: the writers' error records (--sink beam)
JSONL = ".jsonl"
TRANSFORM_TEMP = "tft"                 # --transform: tf.Transform's temp directory
PROGRESS = "progress"                  # the writers' progress files (local runs)
CLAIM_PREFIX = "claim-"                # a gs:// version's claim objects
FRAGMENT_SUFFIX = ".catalog.parquet"   # a shard attempt's catalog fragment
REWRITE_SUFFIX = ".dedup"              # a temp shard rewritten without dropped records
REPLACING_SUFFIX = ".tmp"              # a local file being replaced atomically (LATEST)

# 2: keys relative to their input (manifest["key_scheme"]) and catalog.parquet.
# 3: a shard's path may name a file another version of the root wrote (shared_file).
FORMAT_VERSION = 3
READABLE_FORMAT_VERSIONS = (1, 2, 3)
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


SHARED_PREFIX = "../"  # a manifest or catalog path into a sibling version: ../VERSION/NAME


def shard_file(vdir, rel):
    """Where the file a manifest (or catalog) path `rel` names is: `rel` in the version
    directory `vdir`, or, for `../VERSION/NAME` (format 3: a shard an earlier version wrote
    and this one shares), NAME in that sibling version's directory. The `..` is resolved
    here, not left to the filesystem: object stores have no directories to climb. A local
    `vdir` is taken at its real path first, so a symbolic link to a version directory
    (`ln -s ROOT/versions/V current`) finds the siblings of the version it links to (the
    only I/O here: one readlink per component, for shared paths alone)."""
    if not rel.startswith(SHARED_PREFIX):
        return join(vdir, rel)
    version, name = shared_parts(rel)
    vdir = str(vdir).rstrip("/")
    if "://" not in vdir:
        vdir = os.path.realpath(vdir)
    return join(posixpath.dirname(vdir), version, name)


def shared_parts(rel):
    """`../VERSION/NAME` -> (VERSION, NAME); ValueError naming `rel` for any other form (a
    path that climbs further, or into a subdirectory, is not one this format writes)."""
    parts = rel.split("/")
    if (len(parts) != 3 or parts[0] != ".." or not all(parts[1:])
            or {parts[1], parts[2]} & {".", ".."}):
        raise ValueError(f"{rel}: not a file of this version nor ../VERSION/NAME")
    return parts[1], parts[2]


def shared_path(version, rel):
    """The path, relative to any version directory of the root, of the file that version
    `version` names `rel` (a file of its own, or one it shares already: the same ref)."""
    return rel if rel.startswith(SHARED_PREFIX) else f"{SHARED_PREFIX}{version}/{rel}"


def version_dir(root, version):
    return join(root, VERSIONS, version)


def tmp_dir(vdir):
    """A build's work directory inside its version directory."""
    return join(vdir, TMP)


def listing_file(tmp, split, shard):
    """The listing of one shard task under a build's work directory."""
    return join(tmp, LISTING, f"{split}-{shard:05d}{JSONL}")


def tag_file(root, name):
    """ROOT/tags/NAME: the version the tag `name` names (dataset_format/refs.py)."""
    return join(str(root).rstrip("/"), TAGS, name)


def holds_dir(root, version=None):
    """ROOT/holds/, or ROOT/holds/VERSION/: the leases readers hold (dataset_format/holds.py)."""
    base = join(str(root).rstrip("/"), HOLDS)
    return join(base, version) if version else base


def root_of(vdir):
    """The dataset root a version directory is in (ROOT for ROOT/versions/V, a local link
    to one followed), or None for a directory elsewhere (a copy shipped on its own)."""
    vdir = str(vdir).rstrip("/")
    if "://" not in vdir:
        vdir = os.path.realpath(vdir)
    parent = posixpath.dirname(vdir)
    if posixpath.basename(parent) != VERSIONS:
        return None
    return posixpath.dirname(parent)


def lock_file(root):
    return f"{root.rstrip('/')}/{LOCK}"


def latest_record(version):
    """The content of ROOT/LATEST for `version`."""
    return {"version": version, "manifest": join(VERSIONS, version, MANIFEST)}
