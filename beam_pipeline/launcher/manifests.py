"""CSV/JSONL manifest inputs -> ImageRefs: rows checked with file:line errors, each uri
stat'ed (gs:// ones by listing the folders they name), keys checked unique on disk. Apart
from directory inputs because a manifest names its files: nothing is walked, every row can
be wrong on its own."""

import csv
import dataclasses
import difflib
import io
import itertools
import json
import os
import posixpath
import re
import stat

from beam_pipeline.errors import UserError
from beam_pipeline.launcher import stamps, walk
from beam_pipeline.launcher.folders import GLOB_CHARS, has_control
from beam_pipeline.refs import ImageRef
from beam_pipeline.algorithms.read_ahead import threaded
from beam_pipeline.algorithms.spill import SortedSpill
from beam_pipeline.store import transient
from beam_pipeline.store.gcs import client, gcs_blob
from dataset_format import field_rows, fields as field_types
from dataset_format.error_record import ErrorRecord

STAT_THREADS = 32          # manifest uris on gs:// checked at once
BATCH_ROWS = 1000          # rows stat'ed together, in uri order: one folder listing a batch
BATCHES_AHEAD = 4          # batches stat'ed at once (each lists its folders in parallel)
ROWS_PER_PAGE = 100        # a folder's listing may take a page (1,000 names) per 100 rows
SPLIT_PATTERN = re.compile(r"[a-z][a-z0-9_]*")  # split names become file and folder names
_VALUES = "\x1e"  # in a spilled row, before its fields' JSON text (JSON escapes it: never raw)



def is_manifest(spec):
    """Whether an --input names a CSV or JSONL manifest (not a folder or a glob)."""
    return spec.lower().endswith((".csv", ".jsonl")) and not GLOB_CHARS & set(spec)

def _manifest_rows(path, schema=None):
    """(row number, dict) per row, streamed from a local or gs:// CSV/JSONL file. A CSV's
    header names only uri, label, split and `schema`'s fields, when one is declared."""
    from apache_beam.io.filesystems import FileSystems


    try:
        raw = FileSystems.open(path)
    except Exception as e:  # a wrong path or permission: the command's; an outage: exit 1
        if transient.is_transient(e) and not transient.is_denied(e):
            raise transient.unavailable(e, f"--input {path}") from e
        raise UserError(f"--input {path}: cannot read manifest ({e})") from e
    with raw, io.TextIOWrapper(raw, encoding="utf-8-sig", newline="") as text:
        if path.lower().endswith(".jsonl"):
            for n, line in enumerate(text, 1):
                if line.strip():
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise UserError(f"{path}:{n}: not valid JSON ({e.msg})") from e
                    row = row if isinstance(row, dict) else {}
                    _check_strings(path, n, row)
                    yield n, row
            return
        reader = csv.DictReader(text)
        needed = {"uri"} if schema else {"uri", "label"}  # with fields, the label is optional
        if not reader.fieldnames or not needed <= set(reader.fieldnames):
            raise UserError(f"{path}: a manifest needs a header with columns uri,label[,split]; "
                            f"found {reader.fieldnames}")
        if schema:
            extra = [c for c in reader.fieldnames
                     if c not in ("uri", "label", "split") and c not in schema.names]
            if extra:
                raise UserError(undeclared(path, extra[0], schema))
        for n, row in enumerate(reader, 2):
            yield n, row


def undeclared(where, column, schema):
    """The line that stops a build whose manifest has a column its --schema does not
    declare: one line, not a bad_field row per image (a field removed from the schema while
    the manifest keeps its column would reject every row)."""
    hint = difflib.get_close_matches(column, schema.names, n=1)
    named = f"--schema {schema.source}" if schema.source else "the schema"
    fix = ("no row has a value to infer its type from: write a schema file for it, or drop "
           "the column" if schema.source == "infer" else
           "declare it in the schema, or drop the column from the manifest")
    return (f"{where}: column {column!r} is not a field of {named} "
            f"(fields: {', '.join(schema.names)})"
            + (f"; did you mean {hint[0]!r}?" if hint else "") + f"; {fix}")


def _check_strings(path, n, row):
    """JSON values that are not strings are refused: str() would make a label ["dog"] the
    class "['dog']", and 1 and "1" one class."""
    for column in ("uri", "label", "split"):
        value = row.get(column)
        if value is not None and not isinstance(value, str):
            raise UserError(f"{path}:{n}: {column} must be a JSON string, not "
                            f"{json.dumps(value)}")


def infer_schema(specs):
    """The fields.Schema the rows of the manifests among `specs` fit (fields.infer): what
    --schema infer builds with and prints. Exit 2 when there are none, or no type fits."""
    manifests = [spec for spec in specs if is_manifest(spec)]
    if not manifests:
        raise UserError("--schema infer reads the further columns of .csv/.jsonl manifests; "
                        "no --input is one")

    def rows():
        for path in manifests:
            text = not path.lower().endswith(".jsonl")
            for _, row in _manifest_rows(path):
                yield ({k: field_types.cell_value(v) for k, v in row.items() if v}
                       if text else row)

    try:  # named "infer" where a column it left out (no value to type) stops the build
        return dataclasses.replace(field_types.infer(rows()), source="infer")
    except ValueError as e:
        raise UserError(f"--schema infer: {e}") from e


def manifest_key(uri, full, base):
    """A manifest row's key: the uri as written when relative, else relative to the
    manifest's folder where it lies under it, else the full uri (a local one without its
    leading '/': keys are never absolute paths)."""
    if "://" not in uri and not uri.startswith("/"):
        return posixpath.normpath(uri)
    prefix = base.rstrip("/") + "/"
    return full[len(prefix):] if full.startswith(prefix) else full.lstrip("/")


def _absolute(path):
    return path if "://" in path else os.path.abspath(path)


def list_manifest(path, schema=None, tally=None):
    """A manifest -> ImageRefs and error records. Rows are checked as read, then stat'ed in
    uri order (a spill on disk): a batch of BATCH_ROWS neighbouring names is one or two
    folder listings whatever the row order. In file order, 200k shuffled rows over 20
    folders of 10k objects cost ~0.9 requests a row (each batch held ~50 rows of every
    folder, spread over its names); sorted, ~0.001. With a `schema` (fields.Schema) each
    row's further columns are checked: a bad value is an error record (bad_field) naming the
    column and the value; the ref carries the checked values. `tally`
    (field_rows.ClassTally): counts the class names of the rows checked, less those of
    rows found missing here."""
    base = posixpath.dirname(_absolute(path)) if "://" not in path else posixpath.dirname(path)
    any_row = False
    text = not path.lower().endswith(".jsonl")
    # one key, two uris: found after the last row
    with SortedSpill() as by_key, SortedSpill() as by_uri:
        for n, row in _manifest_rows(path, schema):
            any_row = True
            uri, label = str(row.get("uri") or "").strip(), str(row.get("label") or "").strip()
            split = str(row.get("split") or "").strip() or None
            if not uri or not (label or schema):  # with fields, "": an image without a class
                yield ErrorRecord(uri or f"{path}:{n}", "read", "bad_manifest_row",
                                  f"{path} row {n} needs both uri and label")
                continue
            _check_row(path, n, uri, label, split)
            full = uri if "://" in uri or uri.startswith("/") else posixpath.join(base, uri)
            if "://" not in full:  # one key per local file: data/./a.jpg, x/../data/a.jpg
                full = posixpath.normpath(full)
            values = None
            if schema:
                try:
                    values, classes = field_rows.row_text(schema, row, text)
                except field_types.UndeclaredColumn as e:
                    raise UserError(undeclared(f"{path}:{n}", e.column, schema)) from None
                except field_types.FieldError as e:
                    yield ErrorRecord(full, "read", "bad_field", f"{path}:{n}: {e}")
                    continue
                if tally is not None and classes:
                    tally.add(classes)
            key = manifest_key(uri, full, base)
            by_key.add(json.dumps(key), json.dumps([full, n]))
            # the values' text after a separator JSON never holds raw, not in the JSON list:
            # dumped there it was escaped and unescaped again (~1.5 µs a row)
            by_uri.add(json.dumps(full), json.dumps([key, label, split, n])
                       + (_VALUES + values if values is not None else ""))
        if not any_row:
            raise UserError(f"--input {path}: manifest has no rows")
        with SortedSpill() as errors:  # not_found records, yielded in the manifest's order
            for (batch, values), items in threaded(_batches(path, by_uri),
                                                   lambda b: list(_stat_batch(*b)),
                                                   BATCHES_AHEAD):
                for (*_, where), fields, item in zip(batch, values, items):  # one a row
                    if isinstance(item, ErrorRecord):
                        errors.add(f"{int(where.rsplit(':', 1)[1]):012d}", item.to_json())
                        if tally is not None:
                            tally.drop(fields)
                    else:
                        yield item
            yield from (ErrorRecord.from_json(line) for _, line in errors)
        _check_unique_keys(path, by_key)


def _batches(path, by_uri):
    """The rows in uri order -> (BATCH_ROWS (key, uri, label, split, "file:line"), their
    rows' checked field values or None)."""
    batch, values = [], []
    for full, line in by_uri:
        line, _, fields = line.partition(_VALUES)
        key, label, split, n = json.loads(line)
        batch.append((key, json.loads(full), label, split, f"{path}:{n}"))
        values.append(fields or None)
        if len(batch) >= BATCH_ROWS:
            yield batch, values
            batch, values = [], []
    if batch:
        yield batch, values


def _check_row(path, n, uri, label, split):
    """Values that become paths or lines: refused with file:line before any work."""
    if split is not None and not SPLIT_PATTERN.fullmatch(split):
        raise UserError(f"{path}:{n}: split {split!r} must match [a-z][a-z0-9_]* (it names "
                        "files and folders)")
    if has_control(label):
        raise UserError(f"{path}:{n}: label {label!r} has a control character")
    if has_control(uri):
        raise UserError(f"{path}:{n}: uri {uri!r} has a control character")


def _check_unique_keys(path, by_key):
    for key, group in itertools.groupby(by_key, key=lambda item: item[0]):
        rows = sorted((n, full) for full, n in (json.loads(line) for _, line in group))
        first = rows[0]
        other = next((row for row in rows if row[1] != first[1]), None)
        if other:
            raise UserError(f"{path}:{other[0]}: {other[1]} gets the key {json.loads(key)!r}, "
                            f"as {first[1]} (line {first[0]}) does; one key needs one file "
                            "(write both rows' uris the same way)")


def _stat_batch(batch, values):
    """Manifest entries and their fields' text (or None) -> ImageRefs with size and stamp,
    or not_found errors."""
    if not batch:
        return
    remote = [(full, where) for _, full, _, _, where in batch if "://" in full]
    stats = _stat_all_remote(remote) if remote else {}
    for (key, full, label, split, where), fields in zip(batch, values):
        st = stats[full] if "://" in full else _stat_local(full, where)
        if isinstance(st, ErrorRecord):
            yield st
        elif st is None:
            yield ErrorRecord(full, "read", "not_found", "listed in the manifest but no such file")
        else:  # its fields given here: dataclasses.replace after was ~3 µs a row
            yield ImageRef(key, full, label, split, *st[:2], md5=st[2] if len(st) > 2 else None,
                           fields=fields)


def _stat_local(path, where):
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise walk.ListingFailed(f"{where}: cannot stat {path}: {e.strerror}") from e
    if stat.S_ISDIR(st.st_mode):
        return ErrorRecord(path, "read", "not_found", "listed in the manifest; a folder")
    kind = walk.special_kind(st)
    if kind:  # a FIFO, socket or device (or a link to one): never opened
        return walk.special_record(path, kind)
    return st.st_size, stamps.local_stamp(st)


def _stat_all_remote(remote):
    """{uri: (size, stamp, md5) | None} for a batch's gs:// rows. The folders they name are
    listed (one request per 1,000 names, from the first name wanted): a metadata GET per row
    per night was ~1.5-3 h at 10M rows. A folder's rows are stat'ed one by one only where
    its listing would take more than a page per ROWS_PER_PAGE of them (a few rows naming a
    huge folder), so a manifest never costs more than ~1% above one request per row."""
    folders = {}
    for full, where in remote:
        if not full.startswith("gs://"):
            raise UserError(f"{where}: {full}: only local paths and gs:// uris are supported")
        folders.setdefault(full.rsplit("/", 1)[0] + "/", []).append((full, where))
    stats, rest = {}, []
    for _, (found, left) in threaded(folders.items(), _list_folder, STAT_THREADS):
        stats.update(found)
        rest.extend(left)
    stats.update((full, stat) for (full, _), stat in threaded(
        rest, lambda row: _stat_remote(*row), STAT_THREADS))
    return stats


def _list_folder(item):
    """(folder uri, [(uri, where)]) -> ({uri: stat or None} found by listing the folder,
    [(uri, where)] left to stat one by one)."""
    from google.api_core import exceptions


    folder, rows = item
    if len(rows) < 2:  # one GET is no dearer than one list request
        return {}, rows
    bucket, _, prefix = folder[len("gs://"):].partition("/")
    names = sorted(full[len("gs://") + len(bucket) + 1:] for full, _ in rows)
    wanted, found, last = {full for full, _ in rows}, {}, ""
    listing = client().list_blobs(bucket, prefix=prefix, delimiter="/", start_offset=names[0],
                                  fields=walk.FIELDS, retry=walk.gcs_retry())
    complete = True
    try:
        for n, page in enumerate(listing.pages):
            for blob in page:
                uri, last = f"gs://{bucket}/{blob.name}", blob.name
                if uri in wanted:
                    found[uri] = (blob.size or 0, stamps.gcs_stamp(blob), blob.md5_hash)
            if last >= names[-1] or listing.next_page_token is None:
                break
            if n + 1 >= 1 + len(rows) // ROWS_PER_PAGE:
                complete = False
                break
    except exceptions.Forbidden:  # may read its objects, not list them: read each
        return {}, rows
    except Exception as e:
        raise walk.gcs_failure(e, folder, "list") from e
    if complete:  # listed past every wanted name: the ones not seen do not exist
        found.update((full, None) for full in wanted - found.keys())
    return found, [(full, where) for full, where in rows if full not in found]


def _stat_remote(uri, where):
    """One object's (size, stamp), by its exact name (never a glob), retried on transient
    errors; None when there is no such object."""
    if not uri.startswith("gs://"):
        raise UserError(f"{where}: {uri}: only local paths and gs:// uris are supported")
    bucket, name = gcs_blob(uri)
    try:
        blob = bucket.get_blob(name, retry=walk.gcs_retry())
    except Exception as e:
        raise walk.gcs_failure(e, f"{where}: {uri}", "read") from e
    if blob is None:
        return None
    return blob.size or 0, stamps.gcs_stamp(blob), blob.md5_hash
