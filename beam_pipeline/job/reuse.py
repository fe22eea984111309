"""Incremental shard tasks on a worker: reuse a previous shard, or copy its surviving records.

Neither decodes an image: "reuse" shares the previous shard file (the new manifest names
it where it is, `../VERSION/NAME`: no byte written or copied, on local roots and gs:// alike;
docs/format.md, format version 3); "copy" reads the kept records' TFRecord frames by offset
from the previous shard and writes them to a new one. Both write the new shard's catalog
fragment and return a ShardResult, as WriteShardFn does.
"""

import dataclasses
import json
import logging
import os
import posixpath
import uuid

import google_crc32c

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_pipeline.job.contracts import Kind
from beam_pipeline.job.rewrite import copy_frames, with_rows
from beam_pipeline.store import catalog, files, transient
from dataset_format import frames, layout, storage

RAW = CompressionTypes.UNCOMPRESSED


def read_task(listing, previous_vdir):
    """A reuse/copy listing -> (header dict, [kept CatalogRows in shard order]).

    After its header, a line per kept image: [row number in the previous version's
    catalog, uri, input_size, input_stamp, input_sha256, input_md5]
    (launcher/incremental.kept_line). The row is read from that catalog (the row groups of
    this shard only) and takes the input's values the listing gives: the same bytes, found
    under a new stamp or uri (a sha256 or md5 of null keeps the row's). A read that fails
    without proving damage raises StorageUnavailable naming the file (store/transient.py)."""
    data = transient.retrying(lambda: files.read_bytes(listing), listing)
    lines = [line for line in data.decode().splitlines() if line]
    kept = [json.loads(line) for line in lines[1:]]
    stored = catalog.read_numbered(layout.join(previous_vdir, layout.CATALOG),
                                   [k[0] for k in kept])
    rows = [row.replace(uri=uri, input_size=size, input_stamp=stamp,
                        input_sha256=sha256 or row.input_sha256, input_md5=md5 or row.input_md5)
            for row, (_, uri, size, stamp, sha256, md5) in zip(stored, kept)]
    return json.loads(lines[0]), rows


def link_or_copy(source, target):
    """Share `source`'s bytes at `target`: hard link locally, server-side copy on GCS."""
    if "://" not in source and "://" not in target:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        tmp = f"{target}.{uuid.uuid4().hex[:12]}.part"
        try:
            os.link(source, tmp)
            os.replace(tmp, target)  # a retried task replaces its earlier link at once
            return
        except OSError:  # another filesystem, or no hard links there
            pass
    files.copy(source, target)  # on GCS a server-side copy, complete or absent


def run(kind, result, listing, previous_vdir, write_index, redo=None, vdir=None,
        catalog_schema=None):
    """A reuse or copy task -> its ShardResult (`result`: split, shard, path and temp set).

    Nothing damaged is carried forward: a shard is reused only when its size and checksum
    are the previous manifest's, and copied records have their CRCs checked. A damaged
    record goes to `redo` (converted again from its input, or rejected: rewrite.copy_frames).
    Copied records are written to the attempt's temp name (the caller places them: two
    attempts may differ). A reused file is shared where it is (nothing written but the
    attempt's catalog fragment, so attempts cannot collide); copied instead only when its
    index is not the catalog's, the same bytes from any attempt, straight to its final name
    in `vdir` when given.
    """
    header, rows = read_task(listing, previous_vdir)
    source = layout.shard_file(previous_vdir, header["source"])
    split, shard = result.split, result.shard
    final, temp = result.files.path, result.files.temp
    damage = None if kind == Kind.COPY else unlike_manifest(source, header)
    if kind == Kind.COPY or damage:
        result, errors, redone = copy_frames(source, result, rows, write_index, redo,
                                             deep=damage is not None,
                                             catalog_schema=catalog_schema)
        if damage:
            logging.warning("%s: %s; its records copied one by one, CRCs checked", source,
                            damage)
        result = result.with_made(repaired=redone, converted=redone)
        return dataclasses.replace(result, errors=tuple(errors))
    # The file as it is: its checksum as the previous manifest gave it (crc32c, or sha256
    # from a version written before shards had a CRC-32C).
    result = result.with_written(crc32c=header.get("crc32c"), sha256=header.get("sha256"),
                                 num_bytes=sum(r.length for r in rows))
    index = "".join(frames.index_line(r.offset, r.length) for r in rows)
    shared = layout.shared_path(posixpath.basename(previous_vdir.rstrip("/")), header["source"])
    if not write_index or _index_is(source, index):
        # Shared: the manifest and catalog name the file where it is; the index beside it
        # is the one readers use, so it must be the catalog's (a damaged one is not shared).
        result = result.with_files(shared=shared, temp=source, index_temp=None)
        return with_rows(result, _placed(rows, split, shard, shared), False, catalog_schema)
    # Its index missing or not the catalog's: a copy, with a new index.
    if vdir is not None:
        temp = layout.join(vdir, final)
    link_or_copy(source, temp)
    result = result.with_files(temp=temp)
    return with_rows(result, _placed(rows, split, shard, final), write_index, catalog_schema)


def _placed(rows, split, shard, file):
    """The kept rows as rows of this version's shard `file`."""
    return [r.replace(split=split, shard=shard, file=file) for r in rows]


def _index_is(shard, text):
    """The index beside `shard` holds exactly `text`: one GET on gs:// through the
    process's one client (Beam's FileSystems.open adds a metadata and a bucket GET).
    Missing: not shared (a copy with a new index). A read that failed without proving the
    index gone (a 503, a timeout, EIO) fails the task, which the runner retries: a blip
    must not turn a shared shard into a copy."""
    path = layout.index_name(shard)
    try:
        return transient.retrying(lambda: storage.read_bytes(path), path) == text.encode()
    except transient.StorageUnavailable:
        raise
    except Exception:  # damage (missing): not shared, written anew
        return False


def unlike_manifest(path, header):
    """How the shard at `path` differs from its previous manifest entry (`header`: its
    num_bytes and crc32c, or sha256 in versions written before), or None. A gs:// object's
    size and crc32c come from its metadata (no download); a local file is read once
    (CRC-32C at several GB/s: a small part of what a hard link saves over a copy)."""
    want_size = header.get("num_bytes")

    def sums():
        if path.startswith("gs://") and header.get("crc32c"):
            sized = files.size_and_crc32c(path)
            if sized is None:
                raise FileNotFoundError(path)
            return sized
        legacy = bool(header.get("sha256")) and not header.get("crc32c")
        size, crc, sha = _local_sums(path, legacy)
        if legacy:
            crc = None if sha == header["sha256"] else "?"
        return size, crc

    try:  # a failure that proves nothing (a 503, a 403, EIO) fails the task: a blip must
        size, crc = transient.retrying(sums, path)  # not turn a shared shard into a copy
    except transient.StorageUnavailable:
        raise
    except FileNotFoundError:
        return "missing"
    except Exception as e:  # damage: retrying raises nothing else
        return f"unreadable ({e})"
    if want_size is not None and size != want_size:
        return f"{size} bytes, the manifest says {want_size}"
    if crc != header.get("crc32c"):
        return "its checksum is not the manifest's (the file changed or is damaged)"
    return None


def _local_sums(path, sha256=False):
    """(size, crc32c text, sha256 hex or None) of a file, read in 1 MiB pieces."""
    import hashlib

    crc, size, sha = 0, 0, hashlib.sha256() if sha256 else None
    with FileSystems.open(path, compression_type=RAW) as f:
        while chunk := f.read(1 << 20):
            crc = google_crc32c.extend(crc, chunk)
            if sha is not None:
                sha.update(chunk)
            size += len(chunk)
    return size, frames.crc32c_text(crc), sha and sha.hexdigest()
