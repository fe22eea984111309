"""This host's serialized records as (record, id) elements, in the order a pipeline reads
them: `id` is the record's number among this host's records (plan order), from which a record
that fails is named (readers/checked.py). How each piece of a file is read and checked:
readers/shards.py.

* Training (stream order): the pieces shuffled each epoch, 16 read interleaved, one record
  from each in turn (the shuffle buffer downstream mixes them).
* Evaluation (manifest order): the pieces cut into ranges of `EVAL_RANGE` consecutive records
  (each read from its byte offset, from the `.index` files), `EVAL_CYCLE` ranges read at once
  in a deterministic interleave that yields each range whole before the next: manifest
  order, read off the decode's thread, and in parallel within a file where one reading
  thread (~100 us a record) would not keep up with many decoding cores. On 2 cores it
  changed neither CPU per image nor RSS measurably (docs/reader.md, "Speed").
* cache=: chunks of `CACHE_CHUNK` records cached in a fixed order, the chunks reshuffled.
"""

import dataclasses

import tensorflow as tf

from readers import shards

GCS_READ_BUFFER_BYTES = 8 << 20  # per open shard on gs://: large reads keep throughput up
LOCAL_READ_BUFFER_BYTES = 256 << 10  # per open local shard (TFRecordDataset's default)
SHUFFLE_BUFFER_BYTES = 32 << 20  # default shuffle buffer: ~this many serialized bytes...
CACHE_CHUNK = 8  # cache=: records per cached element, their order reshuffled each epoch;
# chunks of 256 (~11 MB) let a file cache's peak RSS grow with the split (1.29 GB at 4k
# records, 1.85 at 50k), chunks of 8 did not (1.23, 1.30)
EVAL_RANGE = 128  # evaluation: consecutive records read as one range (~5 MB of photos)
EVAL_CYCLE = 2  # evaluation: ranges read at once (8 held ~0.12 GB more RSS, no faster here)


def records(plan, split_info, training, seed, cache=False, cycle_length=None,
            deterministic=True, read_buffer_bytes=None, skip_corrupt=False, skips=None):
    """(Dataset of this host's serialized records as (record, id), the pieces it reads: ids
    number their records in turn). A piece that could not be read ends with an in-band
    element (readers/shards.py) that names it among these pieces. skips: a ranged.Skips
    counting what skip_corrupt skips while reading."""
    pieces, offsets = read_pieces(plan, training, cache, skip_corrupt)
    read = (skip_corrupt and shards.resyncing_reader(pieces, skips)) or shards.reader(
        _read_buffer(read_buffer_bytes, plan), by_offset=offsets is not None)
    pieces_ds = shards.pieces_dataset(pieces, offsets)
    cycle = cycle_length or min(len(pieces), 16)
    if cache:  # cache chunks in a fixed order; reshuffle the chunks each epoch instead
        # Both interleaves are sequential: a parallel one buffers chunks per input ahead of
        # need, more the longer the shards (the RSS grew with the split).
        ds = pieces_ds.interleave(_plain(lambda *p: read(*p).batch(CACHE_CHUNK)),
                                  cycle_length=cycle)
        ds = ds.cache("" if cache is True else cache)
        if training:
            ds = ds.shuffle(_chunk_buffer(cache, plan, split_info), seed=seed,
                            reshuffle_each_iteration=True)
        unchunk = _plain(lambda *chunk: tf.data.Dataset.from_tensor_slices(chunk))
        return ds.interleave(unchunk, cycle_length=cycle), pieces
    if training:
        pieces_ds = pieces_ds.shuffle(len(pieces), seed=seed, reshuffle_each_iteration=True)
        return pieces_ds.interleave(read, cycle_length=cycle, block_length=1,
                                    num_parallel_calls=tf.data.AUTOTUNE,
                                    deterministic=deterministic), pieces
    # evaluation: manifest order. A deterministic interleave takes up to block_length
    # records from a piece before the next; every piece is shorter, so each comes out whole
    # and in turn, while the others are read ahead in parallel.
    cycle = cycle_length or min(len(pieces), EVAL_CYCLE)
    return pieces_ds.interleave(read, cycle_length=cycle,
                                block_length=max(p.count for p in pieces) + 1,
                                num_parallel_calls=cycle, deterministic=True), pieces


def read_pieces(plan, training, cache, skip_corrupt):
    """(pieces, offsets): what `records` reads. Evaluation reads plan.pieces cut into ranges
    of EVAL_RANGE records when every file has an `.index` (offsets: {path: record offsets});
    everything else reads plan.pieces whole, from each piece's start (offsets None)."""
    if training or cache or skip_corrupt:
        return plan.pieces, None
    offsets = shards.record_offsets([p.path for p in plan.pieces],
                                    [p.file_records for p in plan.pieces])
    if offsets is None:
        return plan.pieces, None
    return tuple(ranges(plan.pieces, EVAL_RANGE)), offsets


def ranges(pieces, size):
    """The pieces cut into consecutive pieces of at most `size` records, in order."""
    for p in pieces:
        for lo in range(0, p.count, size):
            yield dataclasses.replace(p, start=p.start + lo, count=min(size, p.count - lo))


_plain = tf.autograph.experimental.do_not_convert  # no tensor control flow: cheaper tracing


def _read_buffer(read_buffer_bytes, plan):
    """Bytes read at a time per open shard: large on gs:// (each read is a request), small
    locally (the page cache reads ahead; 16 open shards x 8 MiB was 128 MiB of RSS)."""
    if read_buffer_bytes:
        return int(read_buffer_bytes)
    remote = any("://" in p.path for p in plan.pieces)
    return GCS_READ_BUFFER_BYTES if remote else LOCAL_READ_BUFFER_BYTES


def _chunk_buffer(cache, plan, split_info):
    """Chunks shuffled together: all of them in memory (cache=True holds the split there
    anyway); a file cache shuffles ~SHUFFLE_BUFFER_BYTES of chunks, so its memory does not
    grow with the split."""
    chunks = -(-plan.records // CACHE_CHUNK) + len(plan.pieces)
    if cache is True:
        return chunks
    chunk_bytes = CACHE_CHUNK * mean_bytes(split_info)
    return int(max(2, min(chunks, SHUFFLE_BUFFER_BYTES // chunk_bytes)))


def mean_bytes(split_info):
    """Serialized bytes a record, from the manifest (100 KB when it has no sizes)."""
    return (split_info.num_bytes or 0) / max(split_info.num_examples, 1) or 100_000
