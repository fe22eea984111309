"""gs:// objects read and written through this process's one storage client
(dataset_format/storage.py makes it), with generation preconditions where needed (LATEST,
ROOT/.lock): Beam's FileSystems has no compare-and-swap, and makes a new client for every
open, exists and create. Deletes: store/gcs_delete.py.
"""

import io

from dataset_format import storage

CHUNK = 16 << 20   # resumable upload chunk, as Beam's gcsio writes


def client():
    """This process's google-cloud-storage client (dataset_format/storage.py: one per
    process and endpoint). Workers, the launcher and commit read and write through it: a
    new client per operation costs a bucket GET and a new connection."""
    return storage.client()


def widen_pool(size):
    """At least `size` connections per client from now on (job/workers.py's budget)."""
    storage.widen_pool(size)


def gcs_blob(uri):
    """gs://bucket/name -> (google-cloud-storage Bucket, object name), through `client()`."""
    bucket, _, name = uri[len("gs://"):].partition("/")
    return client().bucket(bucket), name


# Seconds a read is retried on 429/5xx/resets/timeouts (google-cloud-storage's default, 120),
# and one request's timeout (its default, 60): dataset_format/storage.py reads them from
# the environment, so tests (and their child processes) can shorten them.
READ_DEADLINE = storage.READ_DEADLINE
REQUEST_TIMEOUT = storage.REQUEST_TIMEOUT


class GenerationGone(FileNotFoundError):
    """The listed generation of an object no longer exists: it was overwritten or deleted
    after the listing (a bucket without object versioning keeps only the live one)."""


def read_bytes(uri, max_bytes=0, generation=None):
    """An object's bytes in one request (no metadata read first); with `max_bytes`, at most
    max_bytes + 1 of them, so the caller can tell a larger object (0: no limit).

    With `generation` (the listed one), exactly those bytes or GenerationGone: a retried
    bundle reads what the first attempt read, or learns that it cannot."""
    from google.api_core import exceptions
    from google.cloud.storage.retry import DEFAULT_RETRY

    bucket, name = gcs_blob(uri)
    end = max_bytes if max_bytes else None  # inclusive
    try:  # raw: stored bytes, never transcoded (as Beam reads them)
        return bucket.blob(name, generation=generation).download_as_bytes(
            start=0 if end else None, end=end, raw_download=True, timeout=REQUEST_TIMEOUT,
            retry=DEFAULT_RETRY.with_deadline(READ_DEADLINE))
    except exceptions.RequestRangeNotSatisfiable:  # a range of an empty object
        return b""
    except exceptions.NotFound as e:
        if generation is None:
            raise
        raise GenerationGone(f"{uri}: generation {generation} is gone") from e


def read_range(uri, offset, length, generation=None):
    """`length` bytes of an object from `offset` (fewer at its end) in one ranged GET
    through this process's client: not Beam's FileSystems.open, which makes a new client,
    reads the object's metadata and then fills a 16 MiB window from the offset."""
    from google.api_core import exceptions
    from google.cloud.storage.retry import DEFAULT_RETRY

    bucket, name = gcs_blob(uri)
    try:
        return bucket.blob(name, generation=generation).download_as_bytes(
            start=offset, end=offset + length - 1, raw_download=True, timeout=REQUEST_TIMEOUT,
            retry=DEFAULT_RETRY.with_deadline(READ_DEADLINE))
    except exceptions.RequestRangeNotSatisfiable:  # from past the end
        return b""


def read_whole(uri):
    """An object's bytes in one GET; FileNotFoundError naming it when it is not there."""
    from google.api_core import exceptions

    try:
        return read_bytes(uri)
    except exceptions.NotFound:
        raise FileNotFoundError(f"{uri}: no such object") from None


def open_ranged(uri, whole_bytes):
    """A seekable reader of the object: its bytes from one GET when it holds at most
    `whole_bytes`; a larger one's first `whole_bytes` + 1 are kept (that GET read them) and
    the rest is read by ranged GETs of at least CHUNK (a RangedObject; its size from a
    metadata GET). Before, that first GET was thrown away and a BlobReader read the object
    again from its start: 16 MiB more than the object, on every open of a large catalog."""
    from google.api_core import exceptions

    try:
        head = read_bytes(uri, max_bytes=whole_bytes)
    except exceptions.NotFound:
        raise FileNotFoundError(f"{uri}: no such object") from None
    if len(head) <= whole_bytes:
        return io.BytesIO(head)
    found = size_and_crc32c(uri)
    if found is None:
        raise FileNotFoundError(f"{uri}: no such object")
    return RangedObject(uri, found[0], head=head, ahead=CHUNK)


class RangedObject(io.RawIOBase):
    """A gs:// object of known `size` as a seekable binary file whose reads are ranged GETs
    (read_range), except those inside `head` (the object's first bytes, kept) or the span
    `fetch` read last. For a Parquet file read by row group: pyarrow reads its footer from
    the end (one or two reads) and a row group's column chunks one by one, side by side in
    the file; `fetch` of the row group's span makes them one GET (catalog.read_numbered).
    With `ahead`, a read outside both fetches at least `ahead` bytes from where it starts
    (to the object's end at most): a file read front to back, or row group after row group,
    costs one GET per `ahead` bytes. An object shorter than `size` raises EOFError (never
    a file silently cut short)."""

    def __init__(self, uri, size, head=b"", ahead=0):
        super().__init__()
        self.uri, self.size, self.position = uri, size, 0
        self.held_at, self.held = 0, b""
        self.head, self.ahead = head, ahead

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self.position

    def seek(self, offset, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = base + offset
        return self.position

    def fetch(self, start, end):
        """Read bytes [start, end) in one GET; reads inside them are answered from memory
        until the next fetch."""
        self.held_at, self.held = start, b""  # (the last span let go before the next GET)
        self.held = read_range(self.uri, start, end - start)

    def read(self, n=-1):
        n = self.size - self.position if n is None or n < 0 else n
        n = max(0, min(n, self.size - self.position))
        parts = []
        while n > 0:
            at, held = self.position, self.position - self.held_at
            if at < len(self.head):
                part = self.head[at:at + n]
            elif 0 <= held < len(self.held):
                part = self.held[held:held + n]
            elif self.ahead:
                self.fetch(at, min(self.size, at + max(n, self.ahead)))
                part = self.held[:n]
            else:
                part = read_range(self.uri, at, n)
            if not part:
                raise EOFError(f"{self.uri}: ends at byte {at}, not {self.size}")
            parts.append(part)
            self.position += len(part)
            n -= len(part)
        return b"".join(parts)

    def readall(self):
        return self.read()

    def readinto(self, buffer):
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


class FrontToBack(io.RawIOBase):
    """A gs:// object read front to back (wrap it in io.BufferedReader to iterate lines):
    each read one ranged GET from where the last ended, all of the generation the first
    answer named (a file replaced while it is read raises NotFound, never mixes two). The
    end is a read answered short (GCS answers a range of one generation whole). Each GET
    is retried as every read (READ_DEADLINE); one that still fails raises, so a reader can
    fail loudly, never stop early as if the file ended there."""

    def __init__(self, uri):
        super().__init__()
        self.uri, self.offset, self.generation, self.ended = uri, 0, None, False

    def readable(self):
        return True

    def readinto(self, buffer):
        if self.ended or not len(buffer):
            return 0
        from google.api_core import exceptions
        from google.cloud.storage.retry import DEFAULT_RETRY

        bucket, name = gcs_blob(self.uri)
        blob = bucket.blob(name, generation=self.generation)
        try:
            data = blob.download_as_bytes(
                start=self.offset, end=self.offset + len(buffer) - 1, raw_download=True,
                timeout=REQUEST_TIMEOUT, retry=DEFAULT_RETRY.with_deadline(READ_DEADLINE))
        except exceptions.RequestRangeNotSatisfiable:  # from its end (or an empty object)
            data = b""
        except exceptions.NotFound:
            if self.offset or self.generation is not None:
                raise  # gone, or replaced, while it was read
            raise FileNotFoundError(f"{self.uri}: no such object") from None
        if self.generation is None and blob.generation is not None:
            self.generation = int(blob.generation)  # (from the answer's x-goog-generation)
        buffer[:len(data)] = data
        self.offset += len(data)
        self.ended = len(data) < len(buffer)
        return len(data)


def exists(uri):
    """Whether the object is there: one metadata GET."""
    from google.cloud.storage.retry import DEFAULT_RETRY

    bucket, name = gcs_blob(uri)
    return bucket.blob(name).exists(timeout=REQUEST_TIMEOUT,
                                    retry=DEFAULT_RETRY.with_deadline(READ_DEADLINE))


def write_bytes(uri, data):
    """`data` as the object `uri` in one upload request (it appears whole or not at all)."""
    from google.cloud.storage.retry import DEFAULT_RETRY

    bucket, name = gcs_blob(uri)
    bucket.blob(name).upload_from_string(data, content_type="application/octet-stream",
                                         retry=DEFAULT_RETRY)


def matching(pattern):
    """The gs:// paths matching `pattern` (Beam's FileSystems.match syntax), from one listing
    of the prefix before its first wildcard."""
    import re

    from apache_beam.io.filesystem import FileSystem

    prefix = re.match(r"^[^[*?]*", pattern).group(0)
    wanted = re.compile(FileSystem.translate_pattern(pattern))
    from google.cloud.storage.retry import DEFAULT_RETRY

    bucket, name = gcs_blob(prefix)
    found = (f"gs://{bucket.name}/{b.name}" for b in client().list_blobs(
        bucket.name, prefix=name, fields="items(name),nextPageToken", timeout=REQUEST_TIMEOUT,
        retry=DEFAULT_RETRY.with_deadline(READ_DEADLINE)))
    return [path for path in found if wanted.match(path)]


def listed_generation(stamp):
    """The generation a gs:// listing stamp ("gen:N") names, else None."""
    return int(stamp[4:]) if stamp and stamp.startswith("gen:") else None


def is_transient(error):
    """True when `error` is the storage service's or the network's, not the object's: a
    429 or 5xx (still failing after the retry deadline), a reset or timed-out connection.
    The caller re-raises it, so the runner retries the whole bundle; counting it as a
    rejected image would make the output depend on when GCS throttled."""
    import requests
    from google.api_core import exceptions
    from google.auth import exceptions as auth_exceptions

    transient = (exceptions.TooManyRequests, exceptions.ServerError, exceptions.RetryError,
                 requests.exceptions.ConnectionError, requests.exceptions.Timeout,
                 requests.exceptions.ChunkedEncodingError, auth_exceptions.TransportError,
                 ConnectionError, TimeoutError)
    seen = set()
    while error is not None and id(error) not in seen:  # RetryError wraps its last cause
        seen.add(id(error))
        if isinstance(error, transient):
            return True
        status = getattr(getattr(error, "response", None), "status_code", None)
        if status == 429 or (status or 0) >= 500:  # google-resumable-media's InvalidResponse
            return True
        error = getattr(error, "cause", None) or error.__cause__ or error.__context__
    return False


def open_write(uri):
    """A writer for the object `uri`: it appears only when the writer is closed; leaving
    its `with` block by an exception cancels the upload (nothing appears)."""
    return _Upload(uri)


class _Upload(io.RawIOBase):
    """Bytes held until CHUNK, then a resumable upload in CHUNK pieces (a BlobWriter);
    closed under CHUNK: one upload request, not a resumable upload's two (a shard's
    listing, index, catalog fragment and progress file, and small shards, are all small)."""

    def __init__(self, uri):
        self.uri, self.held, self.writer, self.written = uri, bytearray(), None, 0

    def writable(self):
        return True

    def write(self, data):
        data = memoryview(data).cast("B")
        self.written += len(data)
        if self.writer is not None:
            return self.writer.write(data)
        self.held += data
        if len(self.held) >= CHUNK:
            from google.cloud.storage.retry import DEFAULT_RETRY

            bucket, name = gcs_blob(self.uri)
            self.writer = bucket.blob(name, chunk_size=CHUNK).open(
                "wb", ignore_flush=True, content_type="application/octet-stream",
                retry=DEFAULT_RETRY)
            self.writer.write(bytes(self.held))
            self.held = bytearray()
        return len(data)

    def tell(self):
        return self.written

    def close(self):
        if not self.closed:
            if self.writer is not None:
                self.writer.close()
            else:
                write_bytes(self.uri, bytes(self.held))
        super().close()

    def __exit__(self, kind, value, tb):
        if kind is None:
            self.close()
            return False
        if self.writer is not None:  # cancels the resumable upload: nothing appears
            self.writer.__exit__(kind, value, tb)
        self.held, self.writer = bytearray(), None
        super().close()
        return False


def copy(source, target):
    """Server-side copy of the object `source` over `target` (rewrites until done)."""
    from google.cloud.storage.retry import DEFAULT_RETRY

    (src_bucket, src_name), (dst_bucket, dst_name) = gcs_blob(source), gcs_blob(target)
    dest, token = dst_bucket.blob(dst_name), None
    while True:
        token, _, _ = dest.rewrite(src_bucket.blob(src_name), token=token, retry=DEFAULT_RETRY)
        if token is None:
            return


def copy_if_absent(source, target):
    """Server-side copy of the object `source` to `target` unless `target` exists (one
    rewrite with ifGenerationMatch=0, in the bucket: no bytes through this process).
    True when this call created it, False when an object was there."""
    from google.api_core import exceptions
    from google.cloud.storage.retry import DEFAULT_RETRY

    (src_bucket, src_name), (dst_bucket, dst_name) = gcs_blob(source), gcs_blob(target)
    dest, token = dst_bucket.blob(dst_name), None
    try:  # conditional, so retried safely; a retry of a copy that took effect says 412
        while True:
            token, _, _ = dest.rewrite(src_bucket.blob(src_name), token=token,
                                       if_generation_match=0, retry=DEFAULT_RETRY)
            if token is None:
                return True
    except exceptions.PreconditionFailed:
        return False


def size_and_crc32c(uri):
    """(size, CRC-32C as base64) of an object from its metadata, or None when absent.
    Retried for READ_DEADLINE as every read (it was the client's own 120 s whatever the
    environment said)."""
    from google.cloud.storage.retry import DEFAULT_RETRY

    bucket, name = gcs_blob(uri)
    blob = bucket.get_blob(name, timeout=REQUEST_TIMEOUT,
                           retry=DEFAULT_RETRY.with_deadline(READ_DEADLINE))
    return None if blob is None else (blob.size or 0, blob.crc32c)


def server_time(bucket, name):
    """Now, by the storage server's clock (the Date header of a metadata read of `name`;
    404 answers carry it too). Lock ages compare it with the server's `updated`, so a
    client clock that is off cannot make a live lock look expired."""
    import urllib.parse
    from email.utils import parsedate_to_datetime

    from google.api_core import exceptions
    from google.cloud.storage.retry import DEFAULT_RETRY

    client = bucket.client
    url = client._connection.build_api_url(
        f"/b/{bucket.name}/o/{urllib.parse.quote(name, safe='')}")

    def get():
        response = client._http.request("GET", url, timeout=60)
        if response.status_code >= 400 and response.status_code != 404:
            raise exceptions.from_http_response(response)
        return parsedate_to_datetime(response.headers["Date"])

    return DEFAULT_RETRY(get)()


def read_with_generation(bucket, name, attempts=None):
    """(bytes, generation, updated) of one object, all three of the same generation, or
    (None, 0, None) when there is none. Retries when the object changes between the metadata
    read and the download; RuntimeError after `attempts` such changes (None: no limit)."""
    from google.api_core import exceptions
    from google.cloud.storage.retry import DEFAULT_RETRY

    tries = 0
    while attempts is None or tries < attempts:
        tries += 1
        blob = bucket.get_blob(name, retry=DEFAULT_RETRY)
        if blob is None:
            return None, 0, None
        # Before the download, which resets them from its response headers.
        generation, updated = blob.generation, blob.updated
        try:  # that very generation, so the bytes and the generation belong together
            data = blob.download_as_bytes(if_generation_match=generation, retry=DEFAULT_RETRY)
        except (exceptions.PreconditionFailed, exceptions.NotFound):
            continue  # rewritten or deleted between the two calls: look again
        return data, generation, updated
    raise RuntimeError(f"gs://{bucket.name}/{name}: changing too fast to read")
