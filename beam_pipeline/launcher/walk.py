"""Every file under a root, streamed: local trees and gs:// prefixes, with the failures that
stop a listing. Kept apart from what the files mean (folders.py, manifests.py) because the
hard parts here are storage ones: symbolic-link loops, parallel prefix listing with flat
memory, retries, and telling the user's 403 from a failed build."""

import concurrent.futures
import os
import queue
import stat
import threading

from beam_pipeline.errors import UserError
from beam_pipeline.launcher import stamps
from beam_pipeline.store import transient
from beam_pipeline.store.gcs import client as shared_client
from dataset_format.error_record import ErrorRecord

GCS_LIST_THREADS = 32      # gs:// prefixes listed at once (one request returns <= 1,000 names)
GCS_FANOUT_DEPTH = 2       # fan out on split/ and class/ folders, then list each subtree
# What a listing asks for: the fields used, not every object field (~1/3 of the bytes).
FIELDS = "items(name,size,generation,md5Hash),prefixes,nextPageToken"


SPECIAL_FILE = "special_file"  # errors.jsonl reason: a FIFO, socket or device, never opened


def special_kind(st):
    """What a stat result is when it is not a regular file or a folder ("a FIFO (named
    pipe)", ...), else None. Opening a FIFO blocks until something writes to it: a build
    that opened one would wait for ever, holding the root's lock."""
    mode = st.st_mode
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a character device" if stat.S_ISCHR(mode)
            else "a block device" if stat.S_ISBLK(mode) else "not a regular file")


def special_record(uri, kind):
    """The errors.jsonl row of a special file: rejected at listing, never opened."""
    return ErrorRecord(uri, "read", SPECIAL_FILE, f"{kind}, not a regular file: never opened")


class Special(str):
    """The stamp `walk` gives a special file (its kind, e.g. "a FIFO (named pipe)"), with
    size None: the caller rejects it (special_record) and never opens it."""


class ListingFailed(RuntimeError):
    """A folder or object could not be listed: the build stops (exit 1) before it plans,
    rather than counting what it could not see as removed."""


def walk(root):
    """Every file under `root` -> (path relative to root, uri, size, stamp, md5), streamed
    (md5: the listing's md5Hash on gs://, None locally and for composite objects). Size
    None: a broken link (stamp None) or a special file (stamp a Special naming its kind).

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
                yield rel, path, None, None, None
                continue
            except OSError as e:
                raise ListingFailed(f"cannot stat {path}: {e.strerror}") from e
            kind = special_kind(st)
            if stat.S_ISDIR(st.st_mode):
                (linked if entry.is_symlink() else subdirs).append(path)
            elif kind:  # a FIFO, socket or device (or a link to one): never opened
                yield rel, path, None, Special(kind), None
            else:
                yield rel, path, st.st_size, stamps.local_stamp(st), None
        stack.extend(reversed(subdirs))


def _scan(directory):
    try:
        with os.scandir(directory) as entries:
            return sorted(entries, key=lambda e: e.name)
    except OSError as e:
        raise ListingFailed(f"cannot list {directory}: {e.strerror}") from e


def _walk_gcs(root):
    from apache_beam.io.gcp.gcsio import parse_gcs_path


    client = shared_client()
    bucket_name, base = parse_gcs_path(root.rstrip("/") + "/", object_optional=True)
    bucket = client.bucket(bucket_name)

    def list_one(prefix, depth):
        # Folder by folder (delimiter) near the top, so subtrees are listed in parallel.
        delimiter = "/" if depth < GCS_FANOUT_DEPTH else None
        pages = client.list_blobs(bucket, prefix=prefix, delimiter=delimiter, fields=FIELDS,
                                  retry=gcs_retry()).pages
        for page in named_pages(pages, f"gs://{bucket_name}/{prefix}", "list"):
            for blob in page:
                if not blob.name.endswith("/"):
                    yield "item", (blob.name[len(base):], f"gs://{bucket_name}/{blob.name}",
                                   blob.size or 0, stamps.gcs_stamp(blob), blob.md5_hash)
            for sub in sorted(getattr(page, "prefixes", ()) or ()):
                yield "prefix", sub

    yield from parallel_walk(list_one, base, GCS_LIST_THREADS)


def gcs_retry():
    """google-cloud-storage's retry (429, 5xx, resets; exponential back-off, 120 s)."""
    from google.cloud.storage.retry import DEFAULT_RETRY

    return DEFAULT_RETRY


def named_pages(pages, where, what):
    """Pages of a listing, with a failure that outlived the retries named: a 401/403 is the
    user's to fix (exit 2), anything else fails the build (exit 1)."""
    try:
        yield from pages
    except Exception as e:
        raise gcs_failure(e, where, what) from e


def gcs_failure(e, where, what):
    """The error of a failed first read of what the command names (--input's folders, a
    manifest and its objects): credentials refused, 403 or 401 alike (transient.is_denied),
    are the command's (UserError, exit 2); anything else fails the build (exit 1)."""
    from google.api_core import exceptions

    if transient.is_denied(e):
        if any(isinstance(c, exceptions.Forbidden) for c in transient.causes(e)):
            permission = "list" if what == "list" else "get"
            return UserError(f"{where}: permission denied (403) to {what} it; grant the "
                             f"build's account storage.objects.{permission}")
        return UserError(f"{where}: credentials refused (401: {type(e).__name__}: "
                         f"{_one_line(e)}) to {what} it; give the build credentials the "
                         "storage accepts (application default credentials, or its service "
                         "account)")
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
    # Not algorithms/read_ahead.py: a folder's listing submits its sub-folders' (tasks make
    # tasks) and items come unordered through a queue; that helper reads a known sequence.
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
