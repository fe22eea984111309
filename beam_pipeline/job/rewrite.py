"""Rewrite a shard keeping some of its rows: the records' frames copied by offset, nothing
decoded. Incremental "copy" tasks and --drop_content_duplicates both end here."""

import dataclasses
import io

from beam_pipeline.job import reframe
from beam_pipeline.job.shard_file import ShardFile
from beam_pipeline.store import catalog, ranges, transient
from dataset_format import frames, layout, schema


class Damaged(IOError):
    """A stored record that is missing, cut short or fails a CRC or its catalog row."""


def copy_frames(source, result, rows, write_index, redo=None, deep=False, catalog_schema=None):
    """Copy the TFRecord frames of `rows` (catalog rows, in order) from `source` into a new
    shard at result.files.temp, with its catalog fragment and index (job/shard_file.py), each
    record's CRCs checked on the way, so damage is never copied.

    The frames are read in runs (store/ranges.py): neighbouring kept frames in one ranged
    read, at most 1.1x their bytes downloaded, one run in memory at a time. A damaged
    record (or a source that cannot be read) goes to `redo(row, why)`, which returns
    (frame, row updated) converted again from the input, or (None, error record); without
    `redo` it raises Damaged. `deep`: also check each record's key and image sha256 against
    its row (a file whose checksum is not the manifest's may have been rewritten whole).

    Returns (`result` with the new shard's files, size, CRC-32C and counts; error records;
    records converted again).
    """
    errors, redone = [], 0
    with _files_of(result, write_index, catalog_schema=catalog_schema) as out:
        for row, frame, why in _checked(source, rows, deep):
            if why is not None:
                if redo is None:
                    raise Damaged(f"{source}: {why}")
                frame, redone_row = redo(row, f"{source}: {why}")
                redone += frame is not None
                if frame is None:
                    errors.append(redone_row)  # the error record
                    continue
                row = redone_row
            offset = out.num_bytes
            out.write_frame(frame)
            out.add(row.replace(split=result.split, shard=result.shard, file=result.files.path,
                                position=out.num_examples, offset=offset, length=len(frame)))
    return _written(result, out, crc32c=out.crc32c, num_bytes=out.num_bytes), errors, redone


def _checked(source, rows, deep):
    """(row, frame, None) for a whole frame, (row, None, why) for a damaged one; when the
    source cannot be read, every row from there on is damaged."""
    spans = ranges.read_spans(source, [(row.offset, row.length) for row in rows])
    unreadable = None
    for row in rows:
        if unreadable is None:
            try:
                frame = next(spans, b"")
            except Exception as e:  # missing, or unreadable
                if transient.is_transient(e):  # storage busy, not damage: the task retries
                    raise
                unreadable = f"unreadable ({type(e).__name__}: {e})"
        why = unreadable or damage(frame, row, deep)
        yield row, (None if why else frame), why


def damage(frame, row, deep=False):
    """What is wrong with `frame` as the record of CatalogRow `row`, or None (~2 µs for a
    40 KB record: its CRCs, by the C extension)."""
    if len(frame) != row.length:
        return f"record {row.position} is cut short ({len(frame)} of {row.length} bytes)"
    try:
        found = frames.read_frame(io.BytesIO(frame), row.offset)
    except frames.FrameError as e:
        return f"record {row.position}: {e}"
    if found is None or found[1] != row.length:
        return f"record {row.position}: no whole frame at offset {row.offset}"
    if deep:
        features = reframe.parse_example(found[0])
        if (features.get(schema.FILENAME, b"").decode() != row.key
                or features.get(schema.SHA256, b"").decode() != row.sha256):
            return f"record {row.position} is not {row.key}'s"
    return None


def with_rows(result, rows, write_index, catalog_schema=None):
    """`result` (a shard in place at result.files.temp) with the catalog fragment and index of its
    `rows` (CatalogRows) written, and counted."""
    with _files_of(result, write_index, shard=False, catalog_schema=catalog_schema) as out:
        for row in rows:
            out.add(row)
    return _written(result, out)


def _files_of(result, write_index, shard=True, catalog_schema=None):
    """The ShardFile of `result`: its temp shard (unless `shard` is in place already), its
    fragment (`catalog_schema`: the build's, catalog.schema_of) and, with `write_index`,
    its index."""
    fragment = result.files.catalog_temp or result.files.temp + layout.FRAGMENT_SUFFIX
    index = layout.index_name(result.files.temp) if write_index else None
    return ShardFile(result.files.temp if shard else None, fragment, index, catalog_schema)


def _written(result, out, **written):
    """`result` with what the ShardFile `out` wrote (`written`: the shard's size and
    CRC-32C, when it wrote the shard)."""
    return dataclasses.replace(
        result.with_files(catalog_temp=out.fragment_path,
                          index_temp=out.index_path or result.files.index_temp),
        written=dataclasses.replace(result.written, num_examples=out.num_examples, **written),
        sums=dataclasses.replace(result.sums, label_counts=out.label_counts))


def keep_rows(result, drop_positions, write_index):
    """`result`'s temp shard rewritten without the records at `drop_positions`."""
    rows = [r for r in catalog.read_rows(result.files.catalog_temp)
            if r.position not in drop_positions]
    # A shared shard is an earlier version's file: its rewrite goes beside this attempt's
    # catalog fragment (in this build's .tmp/), never into that version's directory.
    base = (result.files.catalog_temp[:-len(layout.FRAGMENT_SUFFIX)] if result.files.shared
            else result.files.temp)
    rewritten = result.with_files(temp=base + layout.REWRITE_SUFFIX,
                                  catalog_temp=None,  # the original stays, for a retry
                                  shared=None)  # this version's own file now
    return copy_frames(result.files.temp, rewritten, rows, write_index,
                       catalog_schema=catalog.fragment_schema(result.files.catalog_temp))[0]
