"""List inputs: directories, globs and CSV/JSONL manifests -> a stream of ImageRefs, no bytes read.

Runs in the launcher, before any heavy work, so a bad --input fails in a second and the
listing can be fingerprinted. It streams: nothing here holds the whole listing, so the
launcher's memory does not grow with the number of inputs (the planner spills to disk).
This module is the entry: it picks each input's kind (folders.py for directories and
globs, manifests.py for CSV/JSONL; both list files through walk.py) and prefixes keys.

Keys (docs/format.md, "Keys"): an image's key is its path relative to its input root (`class/x.jpg`,
`train/class/x.jpg`), never an absolute path, so the same images under another folder or
bucket get the same splits and shards. With several inputs each key is prefixed by the
input's name (the root's last path component; a manifest's file stem).
"""

import os
import posixpath

from beam_pipeline.errors import UserError, error_record
from beam_pipeline.launcher.folders import GLOB_CHARS, glob_root, list_directory, list_glob
from beam_pipeline.launcher.manifests import list_manifest
from beam_pipeline.refs import ImageRef


def iter_inputs(specs, max_bytes=0):
    """Every --input -> a stream of ImageRef (listed image) or dict (an errors.jsonl record).

    An input larger than `max_bytes` (0: no limit) is an error record, `too_large`: it is
    never read, so one huge file cannot fill a worker's memory. A local file name that is not
    valid UTF-8 (old zip and Windows archives) is an error record, `bad_name`: keys are UTF-8
    in every file a version holds.
    """
    names = input_names(specs)
    for spec, name in zip(specs, names):
        for item in _list_spec(spec):
            if isinstance(item, ImageRef):
                if not _is_utf8(item.uri):
                    item = error_record(printable(item.uri), "read", "bad_name",
                                        "the file name is not valid UTF-8; rename it")
                elif max_bytes and item.size > max_bytes:
                    item = error_record(item.uri, "read", "too_large",
                                        f"{item.size} bytes, over --max_image_mb "
                                        f"({max_bytes / 2**20:g} MiB)")
                elif name:
                    item = item.with_key(f"{name}/{item.key}")
            yield item


def check_exist(specs):
    """Every --input exists (a manifest file, a folder, a glob's folder, a gs:// object or
    prefix with at least one object): a typo exits 2 before the output root is created."""
    for spec in specs:
        where = glob_root(spec) if GLOB_CHARS & set(spec) and not _is_manifest(spec) else spec
        if where.startswith("gs://"):
            found = _gcs_any(where, exact=_is_manifest(spec))
        elif _is_manifest(spec):
            found = os.path.isfile(where)
        else:
            found = os.path.isdir(where or ".")
        if not found:
            kind = "manifest" if _is_manifest(spec) else "directory"
            raise UserError(f"--input {spec}: no such {kind}"
                            + (f" ({where})" if where != spec else ""))


def _gcs_any(uri, exact):
    """The object `uri` exists (exact), or some object lies under the prefix."""
    from beam_pipeline.launcher import walk
    from beam_pipeline.store.gcs import gcs_blob

    bucket, name = gcs_blob(uri)
    try:
        if exact:
            return bucket.get_blob(name, retry=walk.gcs_retry()) is not None
        prefix = name.rstrip("/") + "/" if name.strip("/") else ""
        blobs = bucket.client.list_blobs(bucket, prefix=prefix, max_results=1,
                                         retry=walk.gcs_retry())
        return any(True for _ in blobs)
    except Exception as e:
        raise walk.gcs_failure(e, uri, "read" if exact else "list") from e


def _is_utf8(text):
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # os.fsdecode's surrogate escapes of undecodable bytes
        return False
    return True


def printable(path):
    """A local path with undecodable bytes -> valid UTF-8 text naming them (caf\\xe9.jpg)."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def input_names(specs):
    """The key prefix of each input: '' for one input, else a stable, unique name per input."""
    if len(specs) == 1:
        return [""]
    names = [_input_name(s) for s in specs]
    seen = {}
    for spec, name in zip(specs, names):
        if name in seen:
            raise UserError(f"--input {seen[name]} and --input {spec} would both prefix their "
                            f"keys with {name!r}; give the inputs distinct folder or file names")
        seen[name] = spec
    return names


def _input_name(spec):
    spec = spec.rstrip("/")
    if _is_manifest(spec):
        return posixpath.splitext(posixpath.basename(spec))[0]
    if GLOB_CHARS & set(spec):
        spec = glob_root(spec)
    name = posixpath.basename(spec.rstrip("/")) or spec.replace("://", "_").strip("/")
    return name or "input"


def _is_manifest(spec):
    return spec.lower().endswith((".csv", ".jsonl")) and not GLOB_CHARS & set(spec)


def _list_spec(spec):
    if _is_manifest(spec):
        return list_manifest(spec)
    if GLOB_CHARS & set(spec):
        return list_glob(spec)
    return list_directory(spec.rstrip("/") or "/")
