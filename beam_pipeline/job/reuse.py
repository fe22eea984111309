"""Incremental shard tasks on a worker: reuse a previous shard, or copy its surviving records.

Neither decodes an image: "reuse" links the previous shard file (a hard link locally, a
server-side copy on GCS: no image bytes through the worker); "copy" reads the kept
records' TFRecord frames by offset from the previous shard and writes them to a new one.
Both write the new shard's catalog fragment and return a ShardResult, as WriteShardFn does.
"""

import dataclasses
import json
import os
import uuid

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_pipeline.job.contracts import Kind
from beam_pipeline.job.rewrite import copy_frames, with_rows
from dataset_format import layout

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
        tmp = f"{target}.{uuid.uuid4().hex[:12]}.part"
        try:
            os.link(source, tmp)
            os.replace(tmp, target)  # a retried task replaces its earlier link at once
            return
        except OSError:  # another filesystem, or no hard links there
            pass
    FileSystems.copy([source], [target])  # on GCS a server-side copy, complete or absent


def run(kind, result, listing, previous_vdir, write_index):
    """A reuse or copy task -> its ShardResult (`result`: split, shard, path and temp set)."""
    header, rows = read_task(listing)
    source = layout.join(previous_vdir, header["source"])
    split, shard, final, temp = result.split, result.shard, result.path, result.temp
    if kind == Kind.COPY:
        rows, crc32c, num_bytes, index = copy_frames(source, temp, rows, split, shard, final)
        return with_rows(dataclasses.replace(result, crc32c=crc32c, num_bytes=num_bytes),
                         rows, write_index, index)
    link_or_copy(source, temp)
    if write_index and FileSystems.exists(layout.index_name(source)):
        result = dataclasses.replace(result, index_temp=layout.index_name(temp))
        link_or_copy(layout.index_name(source), result.index_temp)
    # The file as it is: its checksum as the previous manifest gave it (crc32c, or sha256
    # from a version written before shards had a CRC-32C).
    result = dataclasses.replace(result, crc32c=header.get("crc32c"),
                                 sha256=header.get("sha256"),
                                 num_bytes=sum(r["length"] for r in rows))
    return with_rows(result, [dict(r, split=split, shard=shard, file=final) for r in rows],
                     write_index=False)
