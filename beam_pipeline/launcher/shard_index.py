
from beam_pipeline.algorithms.read_ahead import threaded

from beam_pipeline.store import files

from dataset_format import layout
"""The shard index: one listing file per shard task, and the index file naming them all.

The job reads only the index path (Dataflow rejects job graphs over ~10 MB, so the list of
shards is not inlined); each shard writer then streams its own listing file.
"""


def write_shard_listings(tmp_dir, shards):
    """PlannedShard stream -> one listing file per shard -> the
    path of the shard index the job reads. Small files are written 16 at a time (gs://
    latency; algorithms/read_ahead.py, its results drained in order); a shard of many tiny
    images is streamed, so memory stays flat either way.
    """
    index = []

    def small_listings():
        """(path, bytes) of each small listing; big ones are streamed here as they come."""
        for planned in shards:
            path = layout.listing_file(tmp_dir, planned.split, planned.shard)
            index.append(planned.task(path).to_json() + "\n")
            small = _write_listing(path, planned.lines)
            if small is not None:
                yield path, small

    for _ in threaded(small_listings(), lambda item: files.write_bytes(*item), 16, depth=32):
        pass  # a failed write raises here, in its turn
    index_path = layout.join(tmp_dir, layout.SHARD_INDEX)
    files.write_bytes(index_path, "".join(index).encode())
    return index_path


def _write_listing(path, lines):
    """Streams a big listing to `path` and returns None; returns a small one's bytes."""
    from apache_beam.io.filesystems import FileSystems

    buffer, size, out = [], 0, None
    for line in lines:
        buffer.append(line + "\n")
        size += len(line) + 1
        if size > 4 << 20:  # a big shard: write it as it comes
            out = out or FileSystems.create(path)
            out.write("".join(buffer).encode())
            buffer, size = [], 0
    if out is None:
        return "".join(buffer).encode()
    out.write("".join(buffer).encode())
    out.close()
    return None
