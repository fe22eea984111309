"""Incremental shard tasks on a worker: reuse a previous shard, or copy its surviving records.

Neither decodes an image: "reuse" links the previous shard file (a hard link locally, a
server-side copy on GCS: no image bytes through the worker); "copy" reads the kept
records' TFRecord frames by offset from the previous shard and writes them to a new one.
Both write the new shard's catalog fragment and return the same stats as WriteShardFn.
"""

import hashlib
import json
import os

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_pipeline.store import catalog
from readers import layout

RAW = CompressionTypes.UNCOMPRESSED


def read_task(listing):
    """A reuse/copy listing -> (header dict, [kept catalog rows in shard order])."""
    with FileSystems.open(listing, compression_type=RAW) as f:
        lines = [line for line in f.read().decode().splitlines() if line]
    return json.loads(lines[0]), [json.loads(line) for line in lines[1:]]


def link_or_copy(source, target):
    """Share `source`'s bytes at `target`: hard link locally, server-side copy on GCS."""
    if "://" not in source and "://" not in target:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        try:
            os.link(source, target)
            return
        except OSError:  # another filesystem, or no hard links there
            pass
    FileSystems.copy([source], [target])


def copy_frames(source, target, rows, split, shard, final):
    """Copy the TFRecord frames of `rows` (catalog rows, in order) from `source` to `target`.

    Returns (their new catalog rows, sha256 of the new file, its size, index lines).
    """
    offset, digest, index, new_rows = 0, hashlib.sha256(), [], []
    with (FileSystems.open(source, compression_type=RAW) as src,
          FileSystems.create(target) as out):
        for position, row in enumerate(rows):
            src.seek(row["offset"])
            frame = src.read(row["length"])
            if len(frame) != row["length"]:
                raise IOError(f"{source}: record {row['position']} is cut short "
                              f"({len(frame)} of {row['length']} bytes)")
            out.write(frame)
            digest.update(frame)
            index.append(f"{offset} {len(frame)}\n")
            new_rows.append(dict(row, split=split, shard=shard, file=final,
                                 position=position, offset=offset))
            offset += len(frame)
    return new_rows, digest.hexdigest(), offset, index


def set_rows(stats, rows, write_index, index=None):
    """Write a shard's catalog fragment (and index) from its rows; count them into stats."""
    stats["catalog_temp"] = stats["temp"] + ".catalog.parquet"
    with catalog.FragmentWriter(stats["catalog_temp"]) as fragment:
        for row in rows:
            fragment.append(row)
    if write_index and index is not None:
        stats["index_temp"] = stats["temp"] + layout.INDEX_SUFFIX
        with FileSystems.create(stats["index_temp"]) as f:
            f.write("".join(index).encode())
    stats["num_examples"] = len(rows)
    stats["label_counts"] = {}
    for row in rows:
        stats["label_counts"][row["label"]] = stats["label_counts"].get(row["label"], 0) + 1
    return stats


def run(kind, stats, listing, previous_vdir, write_index):
    """Fill a shard's `stats` (split, shard, path, temp set) from a reuse or copy task."""
    header, rows = read_task(listing)
    source = layout.join(previous_vdir, header["source"])
    split, shard, final, temp = stats["split"], stats["shard"], stats["path"], stats["temp"]
    if kind == "copy":
        rows, stats["sha256"], stats["num_bytes"], index = copy_frames(
            source, temp, rows, split, shard, final)
        return set_rows(stats, rows, write_index, index)
    link_or_copy(source, temp)
    if write_index and FileSystems.exists(layout.index_name(source)):
        stats["index_temp"] = temp + layout.INDEX_SUFFIX
        link_or_copy(layout.index_name(source), stats["index_temp"])
    stats["sha256"], stats["num_bytes"] = header["sha256"], sum(r["length"] for r in rows)
    return set_rows(stats, [dict(r, split=split, shard=shard, file=final) for r in rows],
                    write_index=False)
