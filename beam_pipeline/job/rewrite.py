"""Rewrite a shard keeping some of its rows: the records' frames copied by offset, nothing
decoded. Incremental "copy" tasks and --drop_content_duplicates both end here."""

import dataclasses
import io

import google_crc32c

from beam_pipeline.job import reframe
from beam_pipeline.store import catalog, files, ranges
from dataset_format import frames, layout, schema


class Damaged(IOError):
    """A stored record that is missing, cut short or fails a CRC or its catalog row."""


def copy_frames(source, target, rows, split, shard, final, redo=None, deep=False):
    """Copy the TFRecord frames of `rows` (catalog rows, in order) from `source` to `target`,
    each one's CRCs checked on the way, so damage is never copied.

    The frames are read in runs (store/ranges.py): neighbouring kept frames in one ranged
    read, at most 1.1x their bytes downloaded, one run in memory at a time. A damaged
    record (or a source that cannot be read) goes to `redo(row, why)`, which returns
    (frame, row fields) converted again from the input, or (None, error record); without
    `redo` it raises Damaged. `deep`: also check each record's key and image sha256 against
    its row (a file whose checksum is not the manifest's may have been rewritten whole).

    Returns (their new catalog rows, CRC-32C of the new file (frames.crc32c_text), its size,
    index lines, error records, records converted again).
    """
    offset, crc, index, new_rows, errors, redone = 0, 0, [], [], [], 0
    with files.create_final(target) as out:
        for row, frame, why in _checked(source, rows, deep):
            fields = {}
            if why is not None:
                if redo is None:
                    raise Damaged(f"{source}: {why}")
                frame, fields = redo(row, f"{source}: {why}")
                redone += frame is not None
                if frame is None:
                    errors.append(fields)
                    continue
            out.write(frame)
            crc = google_crc32c.extend(crc, frame)
            index.append(frames.index_line(offset, len(frame)))
            new_rows.append(dict(row, **fields, split=split, shard=shard, file=final,
                                 position=len(new_rows), offset=offset, length=len(frame)))
            offset += len(frame)
    return new_rows, frames.crc32c_text(crc), offset, index, errors, redone


def _checked(source, rows, deep):
    """(row, frame, None) for a whole frame, (row, None, why) for a damaged one; when the
    source cannot be read, every row from there on is damaged."""
    spans = ranges.read_spans(source, [(row["offset"], row["length"]) for row in rows])
    unreadable = None
    for row in rows:
        if unreadable is None:
            try:
                frame = next(spans, b"")
            except Exception as e:  # missing, or unreadable
                unreadable = f"unreadable ({type(e).__name__}: {e})"
        why = unreadable or damage(frame, row, deep)
        yield row, (None if why else frame), why


def damage(frame, row, deep=False):
    """What is wrong with `frame` as the record of catalog `row`, or None (~2 µs for a 40 KB
    record: its CRCs, by the C extension)."""
    if len(frame) != row["length"]:
        return f"record {row['position']} is cut short ({len(frame)} of {row['length']} bytes)"
    try:
        found = frames.read_frame(io.BytesIO(frame), row["offset"])
    except frames.FrameError as e:
        return f"record {row['position']}: {e}"
    if found is None or found[1] != row["length"]:
        return f"record {row['position']}: no whole frame at offset {row['offset']}"
    if deep:
        features = reframe.parse_example(found[0])
        if (features.get(schema.FILENAME, b"").decode() != row["key"]
                or features.get(schema.SHA256, b"").decode() != row["sha256"]):
            return f"record {row['position']} is not {row['key']}'s"
    return None


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
    rows, crc32c, num_bytes, index, _, _ = copy_frames(
        result.temp, temp, rows, result.split, result.shard, result.path)
    return with_rows(dataclasses.replace(result, temp=temp, crc32c=crc32c, num_bytes=num_bytes,
                                         catalog_temp=None),  # the original stays, for a retry
                     rows, write_index, index)
