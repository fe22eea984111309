"""A shard's inputs, read ahead in listing order: the listing file -> (ImageRef, bytes, error).

An input is its file (local or gs://, at the generation the listing stamped) or, for a
record an earlier version stored (ref.source), that record's frame, read by byte range.
Rejections are data (the error beside the ref) only for proven damage; a transient or
denied storage error is raised as StorageUnavailable naming the file (store/transient.py).
"""

import os

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_pipeline.algorithms.read_ahead import ordered
from beam_pipeline.job import images, reframe
from beam_pipeline.refs import ImageRef
from beam_pipeline.store import files, gcs, ranges, transient

READ_AHEAD = 16                 # images fetched concurrently: hides gs:// latency
READ_AHEAD_BYTES = 256 << 20    # ... and at most this many listed bytes in flight (one more
                                # image when a single one is larger)


def read_bytes(uri, max_bytes=0, stamp=""):
    """The file's bytes; None when it holds more than `max_bytes` (0: no limit), found
    without reading more than max_bytes + 1 of them. gs:// objects in one request through
    the worker's one storage client (store/gcs.py), not a new client per read, at the
    generation the listing stamped (`stamp` "gen:N"), so every attempt reads the same bytes."""
    if uri.startswith("gs://"):
        data = gcs.read_bytes(uri, max_bytes, gcs.listed_generation(stamp))
    else:
        with FileSystems.open(uri, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            data = read_at_most(f, max_bytes)
    return None if max_bytes and len(data) > max_bytes else data


def read_at_most(f, max_bytes):
    """Up to max_bytes + 1 bytes of an open local file (0: all of them). Not f.read(max_bytes
    + 1) alone: a read of n bytes allocates n first, 1 GiB at the default --max_image_mb:
    46 µs of CPU to read a 700-byte image, against 14 this way (5,000 tiny JPEGs, medians
    of 5; a default build of tiny images spends ~400 µs of CPU an image). So the size
    comes from fstat, and a file that grew since is read on, up to the limit."""
    if not max_bytes:
        return f.read()
    try:
        size = os.fstat(f.fileno()).st_size
    except (AttributeError, OSError, ValueError):  # no descriptor: as before
        return f.read(max_bytes + 1)
    data = f.read(min(size, max_bytes) + 1)
    if size < len(data) <= max_bytes:  # it grew since fstat: read on, to the limit
        data += f.read(max_bytes + 1 - len(data))
    return data


CHANGED = "changed_during_build"  # errors.jsonl reason: the listed generation is gone


def fetch(uri, max_bytes=0, stamp=""):
    """(bytes, None) or (None, the error that makes this input a rejection: proven damage,
    i.e. gone or replaced since listing; locally also a file we may not read). Anything
    else raises StorageUnavailable naming `uri` (a local EIO, ESTALE, ... retried first):
    a 429/5xx past the retry deadline, a timeout, a reset, a 401/403 (a credential, not
    the image). The runner retries the bundle, and then the build fails (exit 1) with
    nothing published: counted as rejected images, an outage or a wrong credential would
    be blamed on the images and end as an exceeded error budget (exit 3)."""
    try:
        data = transient.retrying(lambda: read_bytes(uri, max_bytes, stamp), uri)
    except gcs.GenerationGone as e:
        return None, images.ImageError(
            "read", CHANGED, f"{e}: it changed during the build (the next build reads it)")
    except Exception as e:
        return None, rejection(uri, e)
    if data is None:  # it grew past the limit after it was listed
        return None, _too_large(max_bytes)
    return data, None


def rejection(uri, error):
    """`error` when it is the input's own: damage, or a local file's OSError that is not an
    outage (EACCES, ELOOP: its mode or its links are the input's, and errors.jsonl says so);
    else StorageUnavailable naming `uri`, raised."""
    cause = error.__cause__ if isinstance(error, transient.StorageUnavailable) else error
    if transient.is_damage(cause) or ("://" not in uri and isinstance(cause, OSError)
                                       and not transient.is_local_outage(cause)):
        return cause
    if isinstance(error, transient.StorageUnavailable):
        raise error
    raise transient.unavailable(error, uri) from error


def _too_large(max_bytes):
    return images.ImageError("read", "too_large",
                             f"over --max_image_mb ({max_bytes / 2**20:g} MiB)")


def read_listing(path):
    """A shard's listing file -> ImageRefs in shard order, streamed (a shard of tiny images
    may list a hundred thousand), local and gs:// alike (files.open_stream: gs:// by ranged
    GETs of 4 MiB, one generation). Held whole, a shard of 160,000 tiny images kept its 27
    MB listing (~170 bytes an image) for as long as the shard was written, the job's part
    of the growth of a default build's peak RSS with the inputs (docs/measurements.md).
    A read that fails without proving damage, at the start or midway, raises
    StorageUnavailable naming the listing: the attempt fails (and its retry reads the
    listing again from its start); it never ends the listing early."""
    try:
        with files.open_stream(path) as f:
            for line in f:
                if line.strip():
                    yield ImageRef.from_json(line.decode())
    except transient.StorageUnavailable:
        raise
    except Exception as e:
        if transient.is_damage(e):
            raise
        raise transient.unavailable(e, path) from e


def _fetch_for(ref, max_bytes=0):
    """The bytes a ref is made from: its stored record (ref.source), else its input file."""
    if ref.source is None:
        return fetch(ref.uri, max_bytes, ref.stamp)
    try:
        return reframe.read_stored(ref.source), None
    except Exception as e:  # damaged or gone: converted from its input instead
        if transient.is_transient(e):  # storage busy: the task fails and is retried
            raise transient.unavailable(e, ref.source.path) from e
        return None, e


def read_ahead(pool, refs, max_bytes=0, budget=None):
    """Yield (ref, bytes, error) in order while later reads are in flight: up to READ_AHEAD
    of them, holding at most `budget` (READ_AHEAD_BYTES) listed bytes, or one read
    (algorithms/read_ahead.py).

    A local input file is opened ahead, with the kernel asked to read it in, and read here
    when its turn comes: a page-cache read costs less than handing it to a thread (that
    hand-off was ~12% of a worker's CPU). gs:// objects and stored records use the pool;
    stored records listed one after another that lie close together in one shard file are
    one read (store/ranges.py).
    """
    budget = READ_AHEAD_BYTES if budget is None else budget
    for group, got in ordered(_stored_runs(refs), lambda group: _submit(pool, group, max_bytes),
                              READ_AHEAD, budget, lambda group: sum(r.size for r in group)):
        for ref, (data, error) in zip(group, got if len(group) > 1 else [got]):
            yield ref, data, error


def _submit(pool, group, max_bytes):
    ref = group[0]
    if len(group) > 1:
        return pool.submit(reframe.read_stored_run, [r.source for r in group])
    if ref.source is None and "://" not in ref.uri:
        return _LocalRead(ref.uri, max_bytes)
    return pool.submit(_fetch_for, ref, max_bytes)


def _stored_runs(refs):
    """Refs -> lists of refs read together: consecutive stored records of one shard file that
    form one run of store/ranges.py; every other ref alone."""
    group, run, used = [], None, 0
    for ref in refs:
        source = ref.source
        if (run is not None and source is not None and source.path == group[0].source.path
                and ranges.joins(run, used, source.offset, source.length)):
            group.append(ref)
            run = ranges.Run(run.start, source.offset + source.length, ())
            used += source.length
            continue
        if group:
            yield group
        group = [ref]
        run = source and ranges.Run(source.offset, source.offset + source.length, ())
        used = source.length if source else 0
    if group:
        yield group


class _LocalRead:
    """A local file opened now (and its pages asked for: POSIX_FADV_WILLNEED) and read on
    result(): the (bytes, error) of fetch, without a thread."""

    def __init__(self, path, max_bytes):
        self.path, self.max_bytes, self.file, self.error = path, max_bytes, None, None
        try:
            self.file = open(path, "rb")  # what Beam's local FileSystems.open does
        except OSError as e:  # judged in result(): the input's own, or the storage's
            self.error = e
            return
        try:
            os.posix_fadvise(self.file.fileno(), 0, 0, os.POSIX_FADV_WILLNEED)
        except (OSError, AttributeError):  # a filesystem or platform without it
            pass

    def result(self):
        if self.error is None:
            try:
                with self.file:
                    data = read_at_most(self.file, self.max_bytes)
            except OSError as e:
                self.error = e
        if self.error is not None:
            if transient.is_local_outage(self.error):  # EIO, ESTALE, ...: read again, retried
                return fetch(self.path, self.max_bytes)
            return None, rejection(self.path, self.error)
        if self.max_bytes and len(data) > self.max_bytes:  # it grew past the limit
            return None, _too_large(self.max_bytes)
        return data, None
