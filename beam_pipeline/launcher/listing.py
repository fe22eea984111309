"""List inputs: directories, globs and CSV/JSONL manifests -> a stream of ImageRefs, no bytes read.

Runs in the launcher, before any heavy work, so a bad --input fails in a second and the
listing can be fingerprinted. It streams: nothing here holds the whole listing, so the
launcher's memory does not grow with the number of inputs (the planner spills to disk).

Keys (DESIGN §5): an image's key is its path relative to its input root (`class/x.jpg`,
`train/class/x.jpg`), never an absolute path, so the same images under another folder or
bucket get the same splits and shards. With several inputs each key is prefixed by the
input's name (the root's last path component; a manifest's file stem).
"""

import concurrent.futures
import csv
import io
import json
import os
import posixpath
import queue
import re
import threading

from beam_pipeline.errors import UserError, error_record
from beam_pipeline.refs import SPLIT_NAMES, ImageRef

IMAGE_EXTENSIONS = {".jpg", ".jpeg", ".png", ".gif", ".bmp", ".tif", ".tiff", ".webp"}
GLOB_CHARS = set("*?[")
GCS_LIST_THREADS = 32      # gs:// prefixes listed at once (one request returns <= 1,000 names)
GCS_FANOUT_DEPTH = 2       # fan out on split/ and class/ folders, then list each subtree
STAT_THREADS = 32          # manifest uris on gs:// checked at once


def iter_inputs(specs):
    """Every --input -> a stream of ImageRef (listed image) or dict (an errors.jsonl record)."""
    names = input_names(specs)
    for spec, name in zip(specs, names):
        for item in _list_spec(spec):
            if name and isinstance(item, ImageRef):
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
    found = 0
    for rel, uri, size, mtime in _walk(root):
        if not _is_image_name(rel):
            continue
        parts = rel.split("/")
        split = None
        if len(parts) >= 3 and parts[0] in SPLIT_NAMES:
            split, parts = parts[0], parts[1:]
        if len(parts) < 2:
            raise UserError(f"--input {root}: {rel} is not in a class folder; use "
                            f"{root}/<class>/<image> or a CSV manifest")
        found += 1
        yield ImageRef(rel, uri, parts[0], split, size, mtime)
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
    for rel, uri, size, mtime in _walk(root or "."):
        if not regex.fullmatch(f"{root}/{rel}" if root else rel):
            continue
        found += 1
        yield ImageRef(rel, uri, posixpath.basename(posixpath.dirname(uri)), None, size, mtime)
    if not found:
        raise UserError(f"--input {pattern}: no files match")


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
    """Every file under `root` -> (path relative to root, uri, size, mtime), streamed.

    Local uris are absolute (workers may run elsewhere); gs:// lists prefixes in parallel.
    """
    if root.startswith("gs://"):
        return _walk_gcs(root)
    return _walk_local(root)


def _walk_local(root):
    if not os.path.isdir(root):
        raise UserError(f"--input {root}: no such directory")
    base = os.path.abspath(root)
    for directory, dirs, files in os.walk(base, followlinks=True):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(directory, name)
            try:
                st = os.stat(path)
            except OSError:  # vanished, or a broken link
                continue
            yield os.path.relpath(path, base).replace(os.sep, "/"), path, st.st_size, st.st_mtime


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
        pages = client.list_blobs(bucket, prefix=prefix, delimiter=delimiter).pages
        for page in pages:
            for blob in page:
                if not blob.name.endswith("/"):
                    yield "item", (blob.name[len(base):], f"gs://{bucket_name}/{blob.name}",
                                   blob.size or 0,
                                   blob.updated.timestamp() if blob.updated else 0.0)
            for sub in sorted(getattr(page, "prefixes", ()) or ()):
                yield "prefix", sub

    try:
        yield from parallel_walk(list_one, base, GCS_LIST_THREADS)
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"--input {root}: cannot list it ({type(e).__name__}: {e})") from e


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
    for n, row in _manifest_rows(path):
        any_row = True
        uri, label = str(row.get("uri") or "").strip(), str(row.get("label") or "").strip()
        split = str(row.get("split") or "").strip() or None
        if not uri or not label:
            yield error_record(uri or f"{path}:{n}", "read", "bad_manifest_row",
                               f"{path} row {n} needs both uri and label")
            continue
        full = uri if "://" in uri or uri.startswith("/") else posixpath.join(base, uri)
        if "://" not in full:  # one key per local file: data/./a.jpg, x/../data/a.jpg, data/a.jpg
            full = posixpath.normpath(full)
        batch.append((manifest_key(uri, full, base), full, label, split))
        if len(batch) >= 1000:
            yield from _stat_batch(batch)
            batch = []
    yield from _stat_batch(batch)
    if not any_row:
        raise UserError(f"--input {path}: manifest has no rows")


def _stat_batch(batch):
    """Manifest entries -> ImageRefs with size and mtime, or not_found errors."""
    if not batch:
        return
    remote = [full for _, full, _, _ in batch if "://" in full]
    stats = {}
    if remote:
        with concurrent.futures.ThreadPoolExecutor(STAT_THREADS) as pool:
            stats = dict(zip(remote, pool.map(_stat_remote, remote)))
    for key, full, label, split in batch:
        st = stats[full] if "://" in full else _stat_local(full)
        if st is None:
            yield error_record(full, "read", "not_found", "listed in the manifest but no such file")
        else:
            yield ImageRef(key, full, label, split, *st)


def _stat_local(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime) if os.path.isfile(path) else None


def _stat_remote(path):
    from apache_beam.io.filesystems import FileSystems

    try:
        m = FileSystems.match([path])[0].metadata_list
    except Exception:
        return None
    exact = [x for x in m if x.path == path]
    return (exact[0].size_in_bytes, exact[0].last_updated_in_seconds) if exact else None


def _is_image_name(path):
    name = posixpath.basename(path)
    return not name.startswith(".") and posixpath.splitext(name)[1].lower() in IMAGE_EXTENSIONS
