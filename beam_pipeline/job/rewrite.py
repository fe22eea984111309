"""Rewrite a shard keeping some of its rows: the records' frames copied by offset, nothing
decoded. Incremental "copy" tasks and --drop_content_duplicates both end here."""

import hashlib

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_pipeline.store import catalog
from readers import frames, layout

RAW = CompressionTypes.UNCOMPRESSED


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
            index.append(frames.index_line(offset, len(frame)))
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


def keep_rows(stats, drop_positions, write_index):
    """Rewrite one temp shard without the records at `drop_positions` (its stats updated)."""
    rows = [r for r in catalog.iter_rows(stats["catalog_temp"])
            if r["position"] not in drop_positions]
    source, stats["temp"] = stats["temp"], stats["temp"] + ".dedup"
    rows, stats["sha256"], stats["num_bytes"], index = copy_frames(
        source, stats["temp"], rows, stats["split"], stats["shard"], stats["path"])
    return set_rows(stats, rows, write_index, index)
