"""Whole files and byte ranges of a dataset, on local paths and gs://, without TensorFlow or Beam.

The manifest, the `.index` files and the records of the TensorFlow-free loaders (`loaders/`)
are read through here: local files with `os.pread` (thread-safe, no shared file position),
gs:// objects with google-cloud-storage, which the base install already has. A DataLoader
worker that imports TensorFlow only to read bytes pays ~15 s and ~0.5 GB per worker.
"""

import os
import threading

_clients, _guard = {}, threading.Lock()

# Seconds a gs:// read is retried on 429/5xx/resets/timeouts, and one request's timeout:
# google-cloud-storage's defaults (120, 60) unless the environment says otherwise (tests).
READ_DEADLINE = float(os.environ.get("IMAGE_TFRECORDS_RETRY_SECONDS", "120"))
REQUEST_TIMEOUT = float(os.environ.get("IMAGE_TFRECORDS_REQUEST_TIMEOUT", "60"))


def is_gcs(path):
    return str(path).startswith("gs://")


def exists(path):
    if is_gcs(path):
        bucket, name = _blob(path)
        return bucket.blob(name).exists()
    return os.path.exists(path)


def read_bytes(path):
    """The whole file; FileNotFoundError naming it when it is not there."""
    if not is_gcs(path):
        with open(path, "rb") as f:
            return f.read()
    from google.api_core import exceptions

    bucket, name = _blob(path)
    try:
        return bucket.blob(name).download_as_bytes(raw_download=True, retry=_retry(),
                                                   timeout=REQUEST_TIMEOUT)
    except exceptions.NotFound:
        raise FileNotFoundError(f"{path}: no such object") from None


def read_text(path):
    return read_bytes(path).decode()


def read_range(path, offset, length):
    """`length` bytes from `offset` (fewer at the end of the file), in one request on gs://."""
    if length <= 0:
        return b""
    if not is_gcs(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.pread(fd, length, offset)
        finally:
            os.close(fd)
    from google.api_core import exceptions

    bucket, name = _blob(path)
    try:
        return bucket.blob(name).download_as_bytes(start=offset, end=offset + length - 1,
                                                   raw_download=True, retry=_retry(),
                                                   timeout=REQUEST_TIMEOUT)
    except exceptions.RequestRangeNotSatisfiable:
        return b""
    except exceptions.NotFound:
        raise FileNotFoundError(f"{path}: no such object") from None


def write_bytes(path, data):
    """Replace `path` with `data` atomically: one upload request on gs:// (an object is
    replaced whole), a temp file renamed over it locally (its directory made if missing).
    Small records only: tags and a reader's lease (refs.py, holds.py)."""
    if not is_gcs(path):
        import uuid

        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return
    bucket, name = _blob(path)
    bucket.blob(name).upload_from_string(data, content_type="application/json",
                                         retry=_retry())


def delete(path):
    """Delete one file or object; missing is fine."""
    if not is_gcs(path):
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        return
    from google.api_core import exceptions

    bucket, name = _blob(path)
    try:
        bucket.delete_blob(name, retry=_retry())
    except exceptions.NotFound:
        pass


def stamped(prefix):
    """[(path, when it was last written by the storage's clock, UTC datetime)] of every file
    under the directory or gs:// prefix `prefix`, sorted; [] when there is none. One listing
    on gs:// (1,000 names a page); locally a walk with one stat a file."""
    import datetime

    prefix = str(prefix).rstrip("/")
    if is_gcs(prefix):
        bucket, name = _blob(prefix + "/")
        return sorted((f"gs://{bucket.name}/{b.name}", b.updated)
                      for b in client().list_blobs(bucket.name, prefix=name, retry=_retry()))
    found = []
    for top, _, names in os.walk(prefix):
        for n in names:
            path = os.path.join(top, n)
            try:
                mtime = os.stat(path).st_mtime
            except FileNotFoundError:  # deleted since the walk listed it
                continue
            found.append((path, datetime.datetime.fromtimestamp(mtime, datetime.timezone.utc)))
    return sorted(found)


class LocalFile:
    """An open local file read by offset (os.pread): one descriptor shared by threads."""

    def __init__(self, path):
        self.path, self._fd = path, None  # set first: __del__ runs even when open fails
        try:
            self._fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}: no such file") from None

    def read_range(self, offset, length):
        return os.pread(self._fd, length, offset)

    def close(self, _close=os.close):  # os may be gone when __del__ runs at exit
        fd, self._fd = getattr(self, "_fd", None), None
        if fd is not None:
            _close(fd)

    def __del__(self):
        self.close()


class GcsFile:
    """A gs:// object read by ranged requests (one request per call)."""

    def __init__(self, path):
        self.path = path

    def read_range(self, offset, length):
        return read_range(self.path, offset, length)

    def close(self):
        pass


def open_ranged(path):
    """A LocalFile or GcsFile for `path`; FileNotFoundError when a local file is missing."""
    return GcsFile(path) if is_gcs(path) else LocalFile(path)


def _blob(uri):
    bucket, _, name = uri[len("gs://"):].partition("/")
    return client().bucket(bucket), name


POOL = 64  # connections per client: a writer's read-ahead threads share one client


def client():
    """This process's google-cloud-storage client, one per endpoint: the only factory of
    shared clients in the code (the job's `beam_pipeline/store/gcs.py` takes it from here).

    Every new client fetches the bucket's metadata in the background on its first request
    to a bucket (one bucket GET), and opens its own HTTP session. Beam's FileSystems makes
    a new client for every open, exists and create: a bucket GET, a metadata GET and a new
    connection each. One client per process and endpoint pays that once. A client's session
    must not cross a fork (a DataLoader worker makes its own: the pid is in the key), and
    tests switch emulators (STORAGE_EMULATOR_HOST)."""
    key = (os.getpid(), os.environ.get("STORAGE_EMULATOR_HOST"))
    with _guard:
        if key not in _clients:
            _clients[key] = new_client()
        return _clients[key]


def new_client():
    """A client of its own (a batch is not thread-safe: delete batches in threads take one
    each), with a connection pool of POOL. Credentials from the environment as Beam's gcsio
    finds them (google.auth.default); none found: an anonymous client, as gcsio falls back
    to (public buckets only)."""
    import google.auth.exceptions
    from google.cloud import storage

    try:
        made = storage.Client()
    except google.auth.exceptions.DefaultCredentialsError:
        made = storage.Client.create_anonymous_client()
    _mount(made, POOL)
    return made


def widen_pool(size):
    """At least `size` connections per client from now on (the shard writers' budget,
    job/workers.py): clients made already get a wider pool too."""
    global POOL
    with _guard:
        if size <= POOL:
            return
        POOL = size
        for made in _clients.values():
            _mount(made, POOL)


def _mount(made, size):
    from requests.adapters import HTTPAdapter

    for scheme in ("https://", "http://"):  # http: the emulator
        made._http.mount(scheme, HTTPAdapter(pool_connections=4, pool_maxsize=size))


def _retry():
    from google.cloud.storage.retry import DEFAULT_RETRY

    return DEFAULT_RETRY.with_deadline(READ_DEADLINE)
