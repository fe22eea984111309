"""List inputs: directories, globs and CSV/JSONL manifests -> a stream of ImageRefs, no bytes read.

Runs in the launcher, before any heavy work, so a bad --input fails in a second and the
listing can be fingerprinted. It streams: nothing here holds the whole listing, so the
launcher's memory does not grow with the number of inputs (the planner spills to disk).

Keys (docs/format.md, "Keys"): an image's key is its path relative to its input root (`class/x.jpg`,
`train/class/x.jpg`), never an absolute path, so the same images under another folder or
bucket get the same splits and shards. With several inputs each key is prefixed by the
input's name (the root's last path component; a manifest's file stem).
"""

import concurrent.futures
import csv
import io
import itertools
import json
import os
import posixpath
import queue
import re
import stat
import threading
import unicodedata

from beam_pipeline.errors import UserError, error_record
from beam_pipeline.refs import SPLIT_NAMES, ImageRef
from beam_pipeline.store.spill import SortedSpill

IMAGE_EXTENSIONS = {".jpg", ".jpeg", ".png", ".gif", ".bmp", ".tif", ".tiff", ".webp"}
GLOB_CHARS = set("*?[")
GCS_LIST_THREADS = 32      # gs:// prefixes listed at once (one request returns <= 1,000 names)
GCS_FANOUT_DEPTH = 2       # fan out on split/ and class/ folders, then list each subtree
STAT_THREADS = 32          # manifest uris on gs:// checked at once
SPLIT_PATTERN = re.compile(r"[a-z][a-z0-9_]*")  # split names become file and folder names


class ListingFailed(RuntimeError):
    """A folder or object could not be listed: the build stops (exit 1) before it plans,
    rather than counting what it could not see as removed."""


def iter_inputs(specs, max_bytes=0):
    """Every --input -> a stream of ImageRef (listed image) or dict (an errors.jsonl record).

    An input larger than `max_bytes` (0: no limit) is an error record, `too_large`: it is
    never read, so one huge file cannot fill a worker's memory.
    """
    names = input_names(specs)
    for spec, name in zip(specs, names):
        for item in _list_spec(spec):
            if isinstance(item, ImageRef):
                if max_bytes and item.size > max_bytes:
                    item = error_record(item.uri, "read", "too_large",
                                        f"{item.size} bytes, over --max_image_mb "
                                        f"({max_bytes / 2**20:g} MiB)")
                elif name:
                    item = item.with_key(f"{name}/{item.key}")
            yield item


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
        spec = _glob_root(spec)
    name = posixpath.basename(spec.rstrip("/")) or spec.replace("://", "_").strip("/")
    return name or "input"


def _is_manifest(spec):
    return spec.lower().endswith((".csv", ".jsonl")) and not GLOB_CHARS & set(spec)


def _list_spec(spec):
    if _is_manifest(spec):
        return _list_manifest(spec)
    if GLOB_CHARS & set(spec):
        return _list_glob(spec)
    return _list_directory(spec.rstrip("/") or "/")


# --- directories and globs ---------------------------------------------------------------

def _list_directory(root):
    found, labels = 0, {}  # class folder -> its label, checked once
    for rel, uri, size, stamp in _walk(root):
        if not _is_image_name(rel):
            continue
        if size is None:
            found += 1
            yield error_record(uri, "read", "not_found", "a broken symbolic link, or deleted "
                                                         "while listing")
            continue
        parts = rel.split("/")
        split = None
        if len(parts) >= 3 and parts[0] in SPLIT_NAMES:
            split, parts = parts[0], parts[1:]
        if len(parts) < 2:
            raise UserError(f"--input {root}: {rel} is not in a class folder; use "
                            f"{root}/<class>/<image> or a CSV manifest")
        found += 1
        label = labels.get(parts[0]) or labels.setdefault(
            parts[0], _folder_label(parts[0], root, rel))
        yield ImageRef(rel, uri, label, split, size, stamp)
    if not found:
        raise UserError(f"--input {root}: no image files found (expected {root}/<class>/<image>, "
                        f"extensions {', '.join(sorted(IMAGE_EXTENSIONS))})")


def _glob_root(pattern):
    prefix = pattern[:min(pattern.index(c) for c in GLOB_CHARS if c in pattern)]
    return prefix.rsplit("/", 1)[0] if "/" in prefix else ""


def _list_glob(pattern):
    root = _glob_root(pattern)
    regex = re.compile(_glob_regex(pattern))
    found = 0
    for rel, uri, size, stamp in _walk(root or "."):
        if not regex.fullmatch(f"{root}/{rel}" if root else rel):
            continue
        found += 1
        if size is None:
            yield error_record(uri, "read", "not_found", "a broken symbolic link, or deleted "
                                                         "while listing")
            continue
        label = _folder_label(posixpath.basename(posixpath.dirname(uri)), pattern, rel)
        yield ImageRef(rel, uri, label, None, size, stamp)
    if not found:
        raise UserError(f"--input {pattern}: no files match")


def _has_control(text):
    """Control characters and line separators: they would break the line-based files
    (sort spills, TFDS label files) that labels and splits are written into."""
    return any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in text)


def _folder_label(name, spec, rel):
    if _has_control(name):
        raise UserError(f"--input {spec}: class folder {name!r} (of {rel!r}) has a control "
                        "character; rename it")
    return name


def _glob_regex(pattern):
    """Beam's glob rules: '*' and '?' stay inside one folder, '**' crosses folders."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                out.append(re.escape(c))
            else:
                out.append("[" + pattern[i + 1:end].replace("!", "^", 1) + "]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def _walk(root):
    """Every file under `root` -> (path relative to root, uri, size, stamp), streamed.

    Local uris are absolute (workers may run elsewhere); gs:// lists prefixes in parallel.
    """
    if root.startswith("gs://"):
        return _walk_gcs(root)
    return _walk_local(root)


def _walk_local(root):
    """Sorted, depth first. Symbolic links to folders are followed once each: every folder
    is listed once by (st_dev, st_ino), real folders before linked ones, so a link back up
    the tree (`cat/up -> ..`) cuts the loop instead of listing the tree again under the
    wrong class. A folder or file that cannot be read raises ListingFailed."""
    if not os.path.isdir(root):
        raise UserError(f"--input {root}: no such directory")
    base = os.path.abspath(root)
    cut = len(os.path.join(base, ""))  # every path listed is base/rel: sliced, not relpath'd
    seen, stack, linked = set(), [base], []
    while stack or linked:
        directory = stack.pop() if stack else linked.pop(0)
        try:
            st = os.stat(directory)
        except OSError as e:
            raise ListingFailed(f"cannot list {directory}: {e.strerror}") from e
        if (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        subdirs = []
        for entry in _scan(directory):
            path = entry.path
            rel = path[cut:] if os.sep == "/" else path[cut:].replace(os.sep, "/")
            try:
                st = entry.stat()  # follows links
            except FileNotFoundError:  # a broken link, or deleted while listing
                yield rel, path, None, None
                continue
            except OSError as e:
                raise ListingFailed(f"cannot stat {path}: {e.strerror}") from e
            if stat.S_ISDIR(st.st_mode):
                (linked if entry.is_symlink() else subdirs).append(path)
            else:
                yield rel, path, st.st_size, local_stamp(st)
        stack.extend(reversed(subdirs))


def _scan(directory):
    try:
        with os.scandir(directory) as entries:
            return sorted(entries, key=lambda e: e.name)
    except OSError as e:
        raise ListingFailed(f"cannot list {directory}: {e.strerror}") from e


def _absolute(path):
    return path if "://" in path else os.path.abspath(path)


def _walk_gcs(root):
    from apache_beam.io.gcp.gcsio import GcsIO, parse_gcs_path

    client = GcsIO().client
    bucket_name, base = parse_gcs_path(root.rstrip("/") + "/", object_optional=True)
    bucket = client.bucket(bucket_name)

    def list_one(prefix, depth):
        # Folder by folder (delimiter) near the top, so subtrees are listed in parallel.
        delimiter = "/" if depth < GCS_FANOUT_DEPTH else None
        pages = client.list_blobs(bucket, prefix=prefix, delimiter=delimiter,
                                  retry=_gcs_retry()).pages
        for page in _named(pages, f"gs://{bucket_name}/{prefix}", "list"):
            for blob in page:
                if not blob.name.endswith("/"):
                    yield "item", (blob.name[len(base):], f"gs://{bucket_name}/{blob.name}",
                                   blob.size or 0, gcs_stamp(blob))
            for sub in sorted(getattr(page, "prefixes", ()) or ()):
                yield "prefix", sub

    yield from parallel_walk(list_one, base, GCS_LIST_THREADS)


def _gcs_retry():
    """google-cloud-storage's retry (429, 5xx, resets; exponential back-off, 120 s)."""
    from google.cloud.storage.retry import DEFAULT_RETRY

    return DEFAULT_RETRY


def _named(pages, where, what):
    """Pages of a listing, with a failure that outlived the retries named: 403 is the user's
    to fix (exit 2), anything else fails the build (exit 1)."""
    try:
        yield from pages
    except Exception as e:
        raise gcs_failure(e, where, what) from e


def gcs_failure(e, where, what):
    from google.api_core import exceptions

    if isinstance(e, exceptions.Forbidden):
        permission = "list" if what == "list" else "get"
        return UserError(f"{where}: permission denied (403) to {what} it; grant the build's "
                         f"account storage.objects.{permission}")
    return ListingFailed(f"cannot {what} {where}: {type(e).__name__}: {_one_line(e)}")


def _one_line(e):
    return " ".join(str(e).split())[:300]


def parallel_walk(list_one, root, threads):
    """Yield the items of a tree whose folders are listed `threads` at a time.

    `list_one(prefix, depth)` yields ("item", x) and ("prefix", sub-prefix). Items flow
    through a bounded queue, so memory stays flat however large the tree is.
    """
    out = queue.Queue(maxsize=4096)
    stop = threading.Event()
    pending, lock = [0], threading.Lock()
    done = object()
    pool = concurrent.futures.ThreadPoolExecutor(threads)

    def put(x):
        while not stop.is_set():
            try:
                out.put(x, timeout=0.5)
                return
            except queue.Full:
                continue

    def submit(prefix, depth):
        with lock:
            pending[0] += 1
        pool.submit(task, prefix, depth)

    def task(prefix, depth):
        try:
            for kind, x in list_one(prefix, depth):
                if stop.is_set():
                    return
                if kind == "prefix":
                    submit(x, depth + 1)
                else:
                    put(x)
        except BaseException as e:  # handed to the consumer, raised there
            put(e)
        finally:
            with lock:
                pending[0] -= 1
                last = pending[0] == 0
            if last:
                put(done)

    submit(root, 0)
    try:
        while (x := out.get()) is not done:
            if isinstance(x, BaseException):
                raise x
            yield x
    finally:
        stop.set()
        pool.shutdown(wait=False, cancel_futures=True)


# --- manifests ---------------------------------------------------------------------------

def _manifest_rows(path):
    """(row number, dict) per row, streamed from a local or gs:// CSV/JSONL file."""
    from apache_beam.io.filesystems import FileSystems

    try:
        raw = FileSystems.open(path)
    except Exception as e:
        raise UserError(f"--input {path}: cannot read manifest ({e})") from e
    with raw, io.TextIOWrapper(raw, encoding="utf-8-sig", newline="") as text:
        if path.lower().endswith(".jsonl"):
            for n, line in enumerate(text, 1):
                if line.strip():
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise UserError(f"{path}:{n}: not valid JSON ({e.msg})") from e
                    yield n, row if isinstance(row, dict) else {}
            return
        reader = csv.DictReader(text)
        if not reader.fieldnames or not {"uri", "label"} <= set(reader.fieldnames):
            raise UserError(f"{path}: a manifest needs a header with columns uri,label[,split]; "
                            f"found {reader.fieldnames}")
        for n, row in enumerate(reader, 2):
            yield n, row


def manifest_key(uri, full, base):
    """A manifest row's key: the uri as written when relative, else relative to the
    manifest's folder where it lies under it, else the full uri (a local one without its
    leading '/': keys are never absolute paths)."""
    if "://" not in uri and not uri.startswith("/"):
        return posixpath.normpath(uri)
    prefix = base.rstrip("/") + "/"
    return full[len(prefix):] if full.startswith(prefix) else full.lstrip("/")


def _list_manifest(path):
    base = posixpath.dirname(_absolute(path)) if "://" not in path else posixpath.dirname(path)
    batch, any_row = [], False
    with SortedSpill() as by_key:  # one key, two uris: found after the last row
        for n, row in _manifest_rows(path):
            any_row = True
            uri, label = str(row.get("uri") or "").strip(), str(row.get("label") or "").strip()
            split = str(row.get("split") or "").strip() or None
            if not uri or not label:
                yield error_record(uri or f"{path}:{n}", "read", "bad_manifest_row",
                                   f"{path} row {n} needs both uri and label")
                continue
            _check_row(path, n, uri, label, split)
            full = uri if "://" in uri or uri.startswith("/") else posixpath.join(base, uri)
            if "://" not in full:  # one key per local file: data/./a.jpg, x/../data/a.jpg
                full = posixpath.normpath(full)
            key = manifest_key(uri, full, base)
            by_key.add(json.dumps(key), json.dumps([full, n]))
            batch.append((key, full, label, split, f"{path}:{n}"))
            if len(batch) >= 1000:
                yield from _stat_batch(batch)
                batch = []
        yield from _stat_batch(batch)
        if not any_row:
            raise UserError(f"--input {path}: manifest has no rows")
        _check_unique_keys(path, by_key)


def _check_row(path, n, uri, label, split):
    """Values that become paths or lines: refused with file:line before any work."""
    if split is not None and not SPLIT_PATTERN.fullmatch(split):
        raise UserError(f"{path}:{n}: split {split!r} must match [a-z][a-z0-9_]* (it names "
                        "files and folders)")
    if _has_control(label):
        raise UserError(f"{path}:{n}: label {label!r} has a control character")
    if _has_control(uri):
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


def _stat_batch(batch):
    """Manifest entries -> ImageRefs with size and stamp, or not_found errors."""
    if not batch:
        return
    remote = [(full, where) for _, full, _, _, where in batch if "://" in full]
    stats = {}
    if remote:
        with concurrent.futures.ThreadPoolExecutor(STAT_THREADS) as pool:
            stats = dict(zip((full for full, _ in remote), pool.map(_stat_remote, *zip(*remote))))
    for key, full, label, split, where in batch:
        st = stats[full] if "://" in full else _stat_local(full, where)
        if isinstance(st, dict):
            yield st
        elif st is None:
            yield error_record(full, "read", "not_found", "listed in the manifest but no such file")
        else:
            yield ImageRef(key, full, label, split, *st)


def _stat_local(path, where):
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise ListingFailed(f"{where}: cannot stat {path}: {e.strerror}") from e
    if stat.S_ISDIR(st.st_mode):
        return error_record(path, "read", "not_found", "listed in the manifest; a folder")
    return st.st_size, local_stamp(st)


def _stat_remote(uri, where):
    """One object's (size, stamp), by its exact name (never a glob), retried on transient
    errors; None when there is no such object."""
    from beam_pipeline.store.gcs import gcs_blob

    if not uri.startswith("gs://"):
        raise UserError(f"{where}: {uri}: only local paths and gs:// uris are supported")
    bucket, name = gcs_blob(uri)
    try:
        blob = bucket.get_blob(name, retry=_gcs_retry())
    except Exception as e:
        raise gcs_failure(e, f"{where}: {uri}", "read") from e
    if blob is None:
        return None
    return blob.size or 0, gcs_stamp(blob)


def local_stamp(st):
    """What changes whenever a local file's bytes may have: mtime and ctime in ns.

    `cp -p`, `rsync -a` and tar restore mtime, but nothing sets ctime back: a file replaced
    that way still shows a new stamp (and same-size files are then hashed, not trusted).
    """
    return f"{st.st_mtime_ns}:{st.st_ctime_ns}"


def gcs_stamp(blob):
    """An object's generation: every write makes a new one (a time would be converted
    through the local time zone somewhere: Beam's last_updated_in_seconds uses mktime)."""
    return f"gen:{blob.generation}"


def _is_image_name(path):
    name = posixpath.basename(path)
    return not name.startswith(".") and posixpath.splitext(name)[1].lower() in IMAGE_EXTENSIONS
