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

import dataclasses
import hashlib
import json
import os
import posixpath
from json.encoder import encode_basestring_ascii as json_string  # = json.dumps(a str)
from typing import Optional

from beam_pipeline import __version__
from beam_pipeline.algorithms.spill import SortedSpill
from beam_pipeline.errors import UserError
from beam_pipeline.launcher import walk
from beam_pipeline.launcher.folders import GLOB_CHARS, glob_root, list_directory, list_glob
from beam_pipeline.launcher.manifests import is_manifest, list_manifest
from beam_pipeline.refs import ImageRef, Listed
from beam_pipeline.store.gcs import gcs_blob
from dataset_format import field_rows, fields as field_types
from dataset_format.error_record import ErrorRecord


@dataclasses.dataclass(frozen=True)
class ListingConfig:
    """What the listing stage needs of the build options."""

    inputs: tuple                  # --input specs
    max_bytes: int = 0             # --max_image_mb in bytes (0: no limit)
    fingerprint_config: dict = dataclasses.field(default_factory=dict)  # options fingerprinted
    label_file: Optional[tuple] = None  # --label_file's classes, in order
    schema: Optional[object] = None  # --schema's fields.Schema: manifests' further columns


class Fingerprint:
    """sha256 over the build options and the listing (key, uri, size, stamp, label, split), fed
    one ref at a time in key order, so the launcher never holds the listing.

    The stamp is the one change detection uses (mtime and ctime in ns; a gs:// object's
    generation), so "up to date" trusts nothing that change detection would not."""

    def __init__(self, config, package_version):
        self.h = hashlib.sha256()
        self.h.update(json.dumps({"config": config, "package": package_version},
                                 sort_keys=True).encode())

    def add(self, r):
        self.h.update(json.dumps([r.key, r.uri, r.size, r.stamp, r.label, r.split]).encode())
        if getattr(r, "fields", None) is not None:  # declared fields' values: a changed caption
            self.h.update(r.fields.encode())  # is a change (the text: keys sorted)
        self.h.update(b"\n")

    def hexdigest(self):
        return "sha256:" + self.h.hexdigest()


def list_inputs(config, spill_dir, errors_path):
    """The listing stage: every input listed, deduplicated and fingerprinted in one streaming
    pass -> Listing (refs spilled by key); listing errors go to errors_path (JSONL)."""
    tally = field_rows.ClassTally(config.schema) if config.schema else None
    with open(errors_path, "w") as errors_file:
        return plan_listing(
            iter_inputs(config.inputs, config.max_bytes, config.schema, tally),
            Fingerprint(config.fingerprint_config, __version__),
            set(config.label_file) if config.label_file else None, spill_dir,
            lambda e: errors_file.write(e.to_json() + "\n"), schema=config.schema,
            tally=tally)


def iter_inputs(specs, max_bytes=0, schema=None, tally=None):
    """Every --input -> a stream of ImageRef (listed image) or ErrorRecord (errors.jsonl's).

    An input larger than `max_bytes` (0: no limit) is an error record, `too_large`: it is
    never read, so one huge file cannot fill a worker's memory. A local file name that is not
    valid UTF-8 (old zip and Windows archives) is an error record, `bad_name`: keys are UTF-8
    in every file a version holds. `tally` (field_rows.ClassTally): manifests count their
    rows' class names in it; a row made an error record here is taken off again.
    """
    names = input_names(specs)
    for spec, name in zip(specs, names):
        for item in _list_spec(spec, schema, tally):
            if isinstance(item, ImageRef):
                dropped = item.fields
                if not _is_utf8(item.uri):
                    item = ErrorRecord(printable(item.uri), "read", "bad_name",
                                       "the file name is not valid UTF-8; rename it")
                elif max_bytes and item.size > max_bytes:
                    item = ErrorRecord(item.uri, "read", "too_large",
                                       f"{item.size} bytes, over --max_image_mb "
                                       f"({max_bytes / 2**20:g} MiB)")
                elif name:
                    item = item.with_key(f"{name}/{item.key}")
                if tally is not None and isinstance(item, ErrorRecord):
                    tally.drop(dropped)
            yield item


def check_exist(specs):
    """Every --input exists (a manifest file, a folder, a glob's folder, a gs:// object or
    prefix with at least one object): a typo exits 2 before the output root is created."""
    for spec in specs:
        where = glob_root(spec) if GLOB_CHARS & set(spec) and not is_manifest(spec) else spec
        if where.startswith("gs://"):
            found = _gcs_any(where, exact=is_manifest(spec))
        elif is_manifest(spec):
            found = os.path.isfile(where)
        else:
            found = os.path.isdir(where or ".")
        if not found:
            kind = "manifest" if is_manifest(spec) else "directory"
            raise UserError(f"--input {spec}: no such {kind}"
                            + (f" ({where})" if where != spec else ""))


def _gcs_any(uri, exact):
    """The object `uri` exists (exact), or some object lies under the prefix."""
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
    if is_manifest(spec):
        return posixpath.splitext(posixpath.basename(spec))[0]
    if GLOB_CHARS & set(spec):
        spec = glob_root(spec)
    name = posixpath.basename(spec.rstrip("/")) or spec.replace("://", "_").strip("/")
    return name or "input"


def _list_spec(spec, schema=None, tally=None):
    if is_manifest(spec):
        return list_manifest(spec, schema, tally)
    if GLOB_CHARS & set(spec):
        return list_glob(spec)
    return list_directory(spec.rstrip("/") or "/")


# --- the listing pass: dedupe, fingerprint, labels; refs spilled by key ---------------------

@dataclasses.dataclass
class Listing:
    """What one streaming pass over the listing learned; refs wait on disk in key order."""

    fingerprint: str
    labels_present: set
    listed: int = 0
    duplicates: int = 0
    errors: int = 0
    num_images: int = 0
    by_key: Optional[SortedSpill] = None  # (key JSON, ImageRef JSON; split only where fixed)
    classes_present: dict = dataclasses.field(default_factory=dict)  # classes/boxes field ->
    # the class names its values use (their ids: rules.label_ids, as for labels)


def plan_listing(items, fingerprint, known_labels, spill_dir, write_error, schema=None,
                 tally=None):
    """Listed items (ImageRef or ErrorRecord) -> Listing, in flat memory.

    Sorts by uri on disk to drop duplicates (the same file listed again, by any input:
    same label and split, counted; otherwise a `conflicting_duplicate` error) and to
    fingerprint in a stable order (keys are then unique: each input's keys are distinct
    paths under its own prefix), then spills the refs again by key for identity.resolve,
    which gives every image its split. `fingerprint` has add(ref) and hexdigest();
    `write_error` takes each errors.jsonl record; `known_labels` (a --label_file's
    classes) or None; `schema` (fields.Schema): which fields' class names to collect (an
    open vocabulary's: a closed one's ids are its declared classes). `tally`
    (field_rows.ClassTally, or None): the class names the items' rows were counted with
    as they were checked; the rows dropped here are taken off, and the names left are
    the kept images' (without it, each kept line's values are parsed again for them).
    """
    class_fields = [f for f in (schema.fields if schema else ())
                    if f.has_classes and not f.closed]
    drop = tally.drop if tally is not None and class_fields else (lambda text: None)
    if tally is not None:
        class_fields = []
    plan = Listing(fingerprint="", labels_present=set(), by_key=SortedSpill(spill_dir))
    with SortedSpill(spill_dir) as by_uri:
        for item in items:
            plan.listed += 1
            if isinstance(item, ImageRef):
                by_uri.add(json_string(item.uri), item.to_json())
            else:
                plan.errors += 1
                write_error(item)
        first = None
        for _, line in by_uri:
            ref = Listed._make(json.loads(line))  # no ImageRef: the line is passed on as is
            if first is not None and ref.uri == first.uri:
                drop(ref.fields)
                if (ref.label, ref.split) == (first.label, first.split):
                    plan.duplicates += 1
                else:
                    plan.errors += 1
                    write_error(ErrorRecord(
                        ref.uri, "read", "conflicting_duplicate",
                        f"listed again with label {ref.label!r}, split {ref.split!r}; kept "
                        f"label {first.label!r}, split {first.split!r}"))
                continue
            first = ref
            fingerprint.add(ref)
            if known_labels is not None and ref.label not in known_labels:
                plan.errors += 1
                write_error(ErrorRecord(ref.uri, "read", "unknown_label",
                                        f"class {ref.label!r} is not in --label_file"))
                drop(ref.fields)
                continue
            if ref.label:  # "": a manifest row with fields and no class
                plan.labels_present.add(ref.label)
            values = field_types.values_from_text(ref.fields) if class_fields else None
            for f in class_fields:
                value = values.get(f.name)
                if value:
                    plan.classes_present.setdefault(f.name, set()).update(
                        field_types.class_names(f, value))
            plan.num_images += 1
            plan.by_key.add(json_string(ref.key), line)
    if tally is not None:
        plan.classes_present = tally.present()
    plan.fingerprint = fingerprint.hexdigest()
    return plan
