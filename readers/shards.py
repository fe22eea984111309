"""Reading a pipeline's pieces of shard files as serialized records, loudly, and never
raising inside the stream (the decode map's `ignore_errors` downstream must only ever drop
records that do not decode: readers/checked.py).

* Before any reading (`check_files`, eager, all files in parallel): every file exists and has
  the size manifest.json gives it. A pruned version, a 403/404 on gs:// or a partial copy
  fails here, within seconds, naming the file, whatever `skip_corrupt` says.
* Each time a piece is opened (`reader`, in the graph): the same size check, through
  FixedLengthRecordDataset (it stats the file and reads its first byte), so a file that
  disappears or shrinks during training is named too. It also keeps TFRecordDataset from
  spinning: under `ignore_errors` it retries a file it cannot open forever.
* While reading: TFRecordDataset's DataLossError (bad CRC, truncated frame) names no file,
  and the interleave hides which one failed. So each file is read with `ignore_errors` (which
  ends that file at the first bad frame), and a piece that came out short ends with an
  in-band failure element the check after decoding turns into an error naming the file (or,
  with `skip_corrupt`, a warning). With `skip_corrupt` and `.index` files, pieces are read by
  offset instead (`resyncing_reader`): a damaged record is lost alone.
"""

import concurrent.futures
import sys

import numpy as np
import tensorflow as tf

from dataset_format import examples, frames, layout, schema
from readers import offset_records, ranged
from readers.ranged import size_problem

RESYNC_READ = 256  # skip_corrupt with .index files: records per ranged read


def check_files(pieces):
    """Raise FileNotFoundError / ValueError naming the first missing or wrong-sized file."""
    files = {p.path: p.num_bytes for p in pieces}

    def problem(item):
        path, expected = item
        try:
            size = tf.io.gfile.stat(path).length
        except tf.errors.NotFoundError:
            size = None
        except tf.errors.OpError as e:
            return OSError(f"{path}: cannot read this shard file: {e.message}")
        return size_problem(path, size, expected)

    with concurrent.futures.ThreadPoolExecutor(min(16, len(files)) or 1) as pool:
        for error in pool.map(problem, sorted(files.items())):
            if error:
                raise error


def record_offsets(paths, file_records):
    """{path: [byte offset of each record]} from the `.index` files beside the shards (one
    read each, in parallel), or None when a file has none (built with --write_index false).
    An index whose line count is not the manifest's record count raises, naming it."""
    def offsets(item):
        path, count = item
        index = layout.index_name(path)
        try:
            with tf.io.gfile.GFile(index, "rb") as f:
                entries = frames.parse_index(f.read().decode())
        except tf.errors.NotFoundError:
            return None
        if len(entries) != count:
            raise ValueError(f"{index}: {len(entries)} lines, but manifest.json gives {path} "
                             f"{count} records: the index does not belong to this shard")
        return [offset for offset, _ in entries]

    items = sorted(dict(zip(paths, file_records)).items())
    with concurrent.futures.ThreadPoolExecutor(min(16, len(items)) or 1) as pool:
        found = dict(zip((path for path, _ in items), pool.map(offsets, items)))
    return None if any(v is None for v in found.values()) else found


def pieces_dataset(pieces, offsets=None):
    """Dataset of (path, start, count, num_bytes, first, piece, offset) per piece: `first`
    is the number of the piece's first record among this host's records (plan order),
    `piece` its index in `pieces`, num_bytes -1 when the manifest has no size, offset the
    byte offset of its first record (`offsets`: `record_offsets`' result; else -1)."""
    firsts = [sum(p.count for p in pieces[:i]) for i in range(len(pieces))]
    return tf.data.Dataset.from_tensor_slices((
        tf.constant([p.path for p in pieces]),
        tf.constant([p.start for p in pieces], tf.int64),
        tf.constant([p.count for p in pieces], tf.int64),
        tf.constant([-1 if p.num_bytes is None else p.num_bytes for p in pieces], tf.int64),
        tf.constant(firsts, tf.int64),
        tf.range(len(pieces), dtype=tf.int64),
        tf.constant([offsets[p.path][p.start] if offsets else -1 for p in pieces], tf.int64)))


def sentinel_record():
    """A valid serialized Example (an 8x8 grey JPEG, label 0) standing in for a record that
    could not be read: it decodes like any record, so it passes the decode map without a
    per-record branch, and the check after decoding turns its negative id into the error."""
    jpeg = tf.io.encode_jpeg(tf.fill([8, 8, 3], tf.constant(128, tf.uint8))).numpy()
    return examples.serialize_example({schema.ENCODED: jpeg, schema.LABEL: 0})


def failed_id(piece, file_check):
    """The id of a piece's in-band failure (record ids are >= 0): `file_check` when the file
    was missing, unreadable or not its size (always an error), else a damaged frame."""
    return -2 - 2 * piece if file_check else -1 - 2 * piece


def failure_of(rid):
    """failed_id's inverse: (piece, file_check)."""
    return (-1 - rid) // 2, (-1 - rid) % 2 == 1


def reader(read_buffer_bytes, by_offset=False):
    """A function of one `pieces_dataset` element -> Dataset of (record, id): `id` the
    record's number among this host's records, so a record that fails to decode is named
    from it (readers/checked.py). by_offset: pieces carry their byte offsets, and are read
    from there (readers/offset_records.py) rather than from the file's first record.

    Nothing here raises: the decode map's `ignore_errors` downstream must never see a
    reading error. A file that is missing, unreadable or not its manifest size when the piece
    is opened, and a bad CRC or truncated frame while reading (which ends the piece), each
    end the piece with one in-band element: a decodable stand-in record whose id is
    `failed_id(...)`. The check after decoding names the file (TensorFlow logs its reason).
    """
    sentinel = tf.constant(sentinel_record())

    @_plain
    def read(path, start, count, num_bytes, first, piece, offset):
        # the size check, run (and passed) before the TFRecordDataset is opened: one of a
        # missing file would spin. A map of one element, so a failure is not retried.
        size_ok = tf.data.Dataset.from_tensors(path).map(
            _plain(lambda p: _size_ok(p, num_bytes))).ignore_errors(log_warning=True)
        size_ok = size_ok.concatenate(tf.data.Dataset.from_tensors(False)).take(1)
        size_ok = size_ok.get_single_element()
        readable = tf.where(size_ok, count, tf.constant(0, tf.int64))
        if by_offset:
            records = offset_records.records_from(path, offset, readable, read_buffer_bytes,
                                                  log_warning=True)
        else:
            records = _records(path, start, read_buffer_bytes).take(readable)
        ids = tf.data.Dataset.range(first, first + count)
        failed = tf.data.Dataset.from_tensors(
            (sentinel, tf.where(size_ok, failed_id(piece, False), failed_id(piece, True))))
        return tf.data.Dataset.zip(records, ids).concatenate(failed).take(count)

    return read


def resyncing_reader(pieces, skips=None):
    """skip_corrupt with `.index` files: like `reader`, but each piece is read through
    readers/ranged.py, record by record from the index's offsets (both CRCs checked in
    Python), so a damaged record is skipped alone (warning naming it) and reading goes on at
    the next record's offset; a TFRecordDataset cannot resync, it loses the rest of the
    file. Returns None when a file has no `.index` (the caller then uses `reader`)."""
    if not all(tf.io.gfile.exists(layout.index_name(p.path)) for p in pieces):
        return None
    firsts = [sum(q.file_records for q in pieces[:i]) for i in range(len(pieces))]
    source = ranged.RangedRecords([ranged.Shard(p.path, f, p.file_records, -1)
                                   for p, f in zip(pieces, firsts)], skip_corrupt=True,
                                  skips=skips)
    sentinel = sentinel_record()

    def records(piece):
        p = pieces[piece]
        first = sum(q.count for q in pieces[:piece])
        try:
            for lo in range(0, p.count, RESYNC_READ):
                hi = min(lo + RESYNC_READ, p.count)
                got = source.read(np.arange(p.start + lo, p.start + hi) + firsts[piece])
                for j, record in enumerate(got):
                    if record is not None:
                        yield record, first + lo + j
        except Exception as e:  # noqa: BLE001 - in-band: see `reader`
            print(f"WARNING readers: {p.path}: {e}", file=sys.stderr)
            yield sentinel, failed_id(piece, True)

    spec = (tf.TensorSpec([], tf.string), tf.TensorSpec([], tf.int64))
    return _plain(lambda path, start, count, num_bytes, first, piece, offset: (
        tf.data.Dataset.from_generator(records, output_signature=spec, args=(piece,))))


def _plain(fn):
    """No autograph conversion: these functions have no Python control flow on tensors, and
    converting them was ~0.4 s of make_dataset."""
    return tf.autograph.experimental.do_not_convert(fn)


def _records(path, start, read_buffer_bytes):
    """The file's records from `start` on, ending at the first bad frame (TensorFlow logs
    its reason and offset)."""
    records = tf.data.TFRecordDataset(path, buffer_size=read_buffer_bytes)
    return records.ignore_errors(log_warning=True).skip(start)


def _size_ok(path, num_bytes):
    """Whether `path` has `num_bytes` bytes (-1: exists, any size); a missing or unreadable
    file raises (TensorFlow's error names it).

    FixedLengthRecordDataset of 1-byte records before a footer of num_bytes - 1 bytes has
    exactly one record when the size matches (it reads the first byte), none when the file
    is shorter.
    """
    footer = tf.maximum(num_bytes - 1, 0)
    n = tf.data.FixedLengthRecordDataset(path, 1, footer_bytes=footer, buffer_size=1).take(2)
    none = tf.data.Dataset.from_tensors(tf.zeros([0], tf.string))  # batch: no function to trace
    found = tf.size(n.batch(2).concatenate(none).take(1).get_single_element())
    return tf.where(num_bytes < 0, found >= 1, found == 1)
