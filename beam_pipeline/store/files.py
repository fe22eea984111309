"""File I/O under a dataset root, local paths and gs:// behaving the same.

Every module that writes or reads a whole small file (manifest, errors, listings, TFDS
metadata) goes through here, so a full disk or a torn write is handled in one place.
gs:// goes through the process's one storage client (store/gcs.py): one request per read,
exists or small write. Beam's FileSystems made a new client per call: a bucket GET, a
metadata GET, and an empty GET after each read (about 8 requests per shard in all).
"""

import contextlib
import json
import os
import uuid

from apache_beam.io.filesystems import FileSystems

from beam_pipeline.store import gcs, gcs_delete, transient
from dataset_format import frames, layout


def is_gcs(path):
    return path.startswith("gs://")


def exists(path):
    if is_gcs(path):
        return gcs.exists(path)
    return FileSystems.exists(path)


def objects(pattern):
    """The paths matching `pattern` (FileSystems.match's syntax: `*` within a name, `**`
    across folders); none when nothing matches. A listing that fails is retried while the
    failure is transient, then raises StorageUnavailable naming `pattern`: an empty answer
    would say nothing is there (no failed run to resume from, a version id free to claim).
    Names starting with "." (temp files) are left out locally, as glob leaves them."""
    def listing():
        return gcs.matching(pattern) if is_gcs(pattern) else _local_objects(pattern)

    try:
        return transient.retrying(listing, f"the listing of {pattern}")
    except transient.StorageUnavailable:
        raise
    except Exception as e:  # not even damage: a listing proves nothing about a file
        raise transient.unavailable(e, f"the listing of {pattern}") from e


def _local_objects(pattern):
    """objects() on a local filesystem. Not glob (nor Beam's FileSystems.match, which uses
    it): glob takes a folder it cannot read (EIO, ESTALE, EACCES) for an empty one."""
    import re

    from apache_beam.io.filesystem import FileSystem

    wanted = re.compile(FileSystem.translate_pattern(pattern))
    fixed = re.match(r"^[^[*?]*", pattern).group(0)
    top = fixed.rstrip("/") if fixed.endswith("/") else os.path.dirname(fixed)
    if fixed == pattern:  # no wildcard: the file itself
        return [pattern] if os.path.isfile(pattern) else []
    deepest = None if "**" in pattern else pattern.count("/") - top.count("/") - 1

    def failed(error):
        if not (isinstance(error, FileNotFoundError) and error.filename == top):
            raise error  # a missing top folder: nothing matches

    found = []
    for folder, subfolders, names in os.walk(top or ".", onerror=failed):
        if deepest is not None and folder.count("/") - top.count("/") >= deepest:
            subfolders[:] = []
        found += [path for path in (os.path.join(folder, name)[0 if top else 2:]
                                    for name in sorted(names) if not name.startswith("."))
                  if wanted.match(path)]  # (a pattern without a folder: "./" cut)
    return found


def read_bytes(path):
    """The whole file; FileNotFoundError naming it when it is not there."""
    if is_gcs(path):
        return gcs.read_whole(path)
    with open(path, "rb") as f:
        return f.read()


def open_read(path):
    """A small file, whole, as a binary file object (gs://: one GET)."""
    import io

    return io.BytesIO(read_bytes(path))


WHOLE_BYTES = 16 << 20  # a gs:// file up to this size is read whole by open_seekable


def open_seekable(path):
    """A seekable binary file object, for a reader of the whole file or of most of its row
    groups in order (Parquet reads its footer, then parts): local, the file; gs://, the
    whole object from one GET when it is at most WHOLE_BYTES (a catalog fragment, a split
    map), else its first WHOLE_BYTES kept from that GET and the rest by ranged GETs of 16
    MiB through the shared client (gcs.open_ranged). A reader of a footer alone asks
    catalog.footer, which reads only that. FileNotFoundError naming it when it is not
    there."""
    if not is_gcs(path):
        return open(path, "rb")

    return gcs.open_ranged(path, WHOLE_BYTES)


STREAM_BYTES = 4 << 20  # a file read front to back holds at most this much of it


def open_stream(path):
    """A file to read front to back (its lines iterate), holding at most STREAM_BYTES:
    local, the file; gs://, ranged GETs of STREAM_BYTES through the shared client, of the
    generation the first one read (gcs.FrontToBack): a small file costs one GET, as a
    whole read. FileNotFoundError naming it when it is not there."""
    if not is_gcs(path):
        return open(path, "rb")
    import io

    return io.BufferedReader(gcs.FrontToBack(path), STREAM_BYTES)


def read_json(path):
    return json.loads(read_bytes(path).decode())


def write_bytes(path, data):
    """`data` at `path`, whole or not at all (gs://: one upload request)."""
    if is_gcs(path):
        return gcs.write_bytes(path, data)
    try:
        with FileSystems.create(path) as f:
            f.write(data)
    except OSError as e:  # e.g. a full disk: say which file (the error alone does not)
        if e.filename or e.errno is None:
            raise
        raise OSError(e.errno, f"cannot write {path}: {e.strerror}") from e


def copy_local_file(local_path, path):
    """Stream a local file to `path` (local or gs://) in 8 MiB pieces."""
    with open(local_path, "rb") as src, create_final(path) as dst:
        while chunk := src.read(8 << 20):
            dst.write(chunk)


def write_json(path, obj):
    """Write a JSON file whole or not at all (two-space indent, keys in order)."""
    write_whole(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


def write_whole(path, data):
    """`data` at `path` whole or not at all, local or gs:// (a manifest present means a
    complete version)."""
    if "://" in path:
        write_bytes(path, data)  # an object appears only once its upload completes
    else:
        replace_local(path, data)


def replace_local(path, data):
    """Atomically replace a local file: temp file, fsync, rename over `path`, fsync the
    directory. A crash or a full disk leaves the old file (or none), never a torn one."""
    directory, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(directory, f".{name}.{uuid.uuid4().hex[:12]}{layout.REPLACING_SUFFIX}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise OSError(e.errno, f"cannot write {path}: {e.strerror}") from e
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself survives a power cut
    finally:
        os.close(fd)


def delete_tree(directory):
    """Delete a local directory, or every object under a gs:// prefix; missing is fine."""
    if not directory.startswith("gs://"):
        if FileSystems.exists(directory):
            FileSystems.delete([directory])  # LocalFileSystem removes the whole tree
        return

    gcs_delete.delete_prefix(directory)  # batched: not Beam's three round trips per object


def place_once(source, path):
    """Put the finished file `source` at `path` unless a file is there already: True when
    this call put it, False when `path` existed (it is left as it was). Locally a hard link
    (atomic: EEXIST), on gs:// a server-side copy with ifGenerationMatch=0. `source` stays.

    A shard reaches its final name this way, so a second attempt of it (a retry, a zombie)
    can never overwrite the first one's bytes (job/shards.py)."""
    if path.startswith("gs://"):
        return gcs.copy_if_absent(source, path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    try:
        os.link(source, path)
    except FileExistsError:
        return False
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)  # the link survives a power cut
    finally:
        os.close(fd)
    return True


def size_and_crc32c(path):
    """(size, CRC-32C as the manifest writes it) of a file, or None when there is none:
    a gs:// object's from its metadata, a local file's read in 8 MiB pieces."""
    if path.startswith("gs://"):
        return gcs.size_and_crc32c(path)
    import google_crc32c

    crc, size = 0, 0
    try:
        with open(path, "rb") as f:
            while chunk := f.read(8 << 20):
                crc, size = google_crc32c.extend(crc, chunk), size + len(chunk)
    except FileNotFoundError:
        return None
    return size, frames.crc32c_text(crc)


def delete(path):
    """Delete one file; FileNotFoundError when it is not there."""
    if is_gcs(path):
        return gcs_delete.delete(path)
    os.unlink(path)


def copy(source, path):
    """`source`'s bytes at `path`, whole or not at all (gs://: a server-side copy)."""
    if is_gcs(source) and is_gcs(path):
        return gcs.copy(source, path)
    FileSystems.copy([source], [path])


def delete_quietly(path):
    """Delete one file if it is there (a temp file; a failure is left to the clean-up)."""
    if path.startswith("gs://"):
        gcs_delete.delete_quietly(path)
        return
    with contextlib.suppress(OSError):
        os.unlink(path)


@contextlib.contextmanager
def create_final(path):
    """Write `path` whole or not at all, under its final name: a writer that raises (or a
    worker that dies) leaves nothing there, and one that finishes replaces any earlier copy
    at once. gs://: one upload through this process's client (store/gcs.py), which is
    completed only on success; locally: a temp file beside it, renamed over it.

    Shards are written this way straight into the unpublished version directory: the
    bytes are deterministic, so a retried or duplicate attempt writes the same object."""
    if path.startswith("gs://"):
        with gcs.open_write(path) as f:  # BlobWriter: an exception cancels the upload
            yield f
        return
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.part")
    try:
        with open(tmp, "wb") as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
