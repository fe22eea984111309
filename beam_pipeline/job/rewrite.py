"""Rewrite a shard keeping some of its rows: the records' frames copied by offset, nothing
decoded. Incremental "copy" tasks and --drop_content_duplicates both end here."""

import dataclasses

import google_crc32c

from beam_pipeline.store import catalog, files, ranges
from dataset_format import frames, layout


def copy_frames(source, target, rows, split, shard, final):
    """Copy the TFRecord frames of `rows` (catalog rows, in order) from `source` to `target`.

    The frames are read in runs (store/ranges.py): neighbouring kept frames in one ranged
    read, at most 1.1x their bytes downloaded, one run in memory at a time.

    Returns (their new catalog rows, CRC-32C of the new file (frames.crc32c_text), its size,
    index lines).
    """
    offset, crc, index, new_rows = 0, 0, [], []
    frames_read = ranges.read_spans(source, [(row["offset"], row["length"]) for row in rows])
    with files.create_final(target) as out:
        for position, (row, frame) in enumerate(zip(rows, frames_read)):
            if len(frame) != row["length"]:
                raise IOError(f"{source}: record {row['position']} is cut short "
                              f"({len(frame)} of {row['length']} bytes)")
            out.write(frame)
            crc = google_crc32c.extend(crc, frame)
            index.append(frames.index_line(offset, len(frame)))
            new_rows.append(dict(row, split=split, shard=shard, file=final,
                                 position=position, offset=offset))
            offset += len(frame)
    return new_rows, frames.crc32c_text(crc), offset, index


def with_rows(result, rows, write_index, index=None):
    """`result` with the catalog fragment (and index) of its `rows` written, and counted."""
    catalog_temp = result.catalog_temp or result.temp + layout.FRAGMENT_SUFFIX
    with catalog.FragmentWriter(catalog_temp) as fragment:
        for row in rows:
            fragment.append(row)
    index_temp = result.index_temp
    if write_index and index is not None:
        index_temp = layout.index_name(result.temp)
        with files.create_final(index_temp) as f:
            f.write("".join(index).encode())
    counts = {}
    for row in rows:
        counts[row["label"]] = counts.get(row["label"], 0) + 1
    return dataclasses.replace(result, catalog_temp=catalog_temp, index_temp=index_temp,
                               num_examples=len(rows), label_counts=counts)


def keep_rows(result, drop_positions, write_index):
    """`result`'s temp shard rewritten without the records at `drop_positions`."""
    rows = [r for r in catalog.iter_rows(result.catalog_temp)
            if r["position"] not in drop_positions]
    temp = result.temp + layout.REWRITE_SUFFIX
    rows, crc32c, num_bytes, index = copy_frames(
        result.temp, temp, rows, result.split, result.shard, result.path)
    return with_rows(dataclasses.replace(result, temp=temp, crc32c=crc32c, num_bytes=num_bytes,
                                         catalog_temp=None),  # the original stays, for a retry
                     rows, write_index, index)
