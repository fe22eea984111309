"""Reading a pipeline's pieces of shard files as serialized records, loudly.

Three checks, so that no damaged input passes silently and nothing spins:

* Before any reading (`check_files`, eager, all files in parallel): every file exists and has
  the size manifest.json gives it. A pruned version, a 403/404 on gs:// or a partial copy
  fails here, within seconds, naming the file, whatever `skip_corrupt` says.
* Each time a piece is opened (`read`, in the graph): the same size check, through
  FixedLengthRecordDataset (it stats the file and reads its last byte), so a file that
  disappears or shrinks during training fails naming it too. This also keeps
  `ignore_errors` below from spinning: TFRecordDataset retries a file it cannot open on every
  call, which under `ignore_errors` loops forever.
* While reading: TFRecordDataset's DataLossError (bad CRC, truncated frame) names no file,
  and the interleave hides which one failed. So each file is read with `ignore_errors` (which
  ends that file at the first bad frame) and compared with the manifest's count: a short piece
  raises an error naming the file, or with `skip_corrupt`, is read again (a transient storage
  error that outlived the file system's own retries is not corruption) and then logs how many
  records were lost.
"""

import concurrent.futures
import sys

import tensorflow as tf

READ_ATTEMPTS = 3  # skip_corrupt: reads of a short piece before its tail counts as lost


def check_files(pieces):
    """Raise FileNotFoundError / ValueError naming the first missing or wrong-sized file."""
    files = {p.path: p.num_bytes for p in pieces}

    def problem(item):
        path, expected = item
        try:
            size = tf.io.gfile.stat(path).length
        except tf.errors.NotFoundError:
            return FileNotFoundError(
                f"{path}: shard file missing (manifest.json lists it): the version was pruned "
                "or only partly copied; rebuild it or read another version")
        except tf.errors.OpError as e:
            return OSError(f"{path}: cannot read this shard file: {e.message}")
        if expected is not None and size != expected:
            return ValueError(
                f"{path}: {size} bytes, but manifest.json says {expected}: the file is "
                "truncated or was overwritten; rebuild the dataset or read another version")
        return None

    with concurrent.futures.ThreadPoolExecutor(min(16, len(files)) or 1) as pool:
        for error in pool.map(problem, sorted(files.items())):
            if error:
                raise error


def pieces_dataset(pieces):
    """Dataset of (path, start, count, num_bytes, first, piece) per piece: `first` is the
    number of the piece's first record among this host's records (plan order), `piece` its
    index in `pieces`, num_bytes -1 when the manifest has no size."""
    firsts = [sum(p.count for p in pieces[:i]) for i in range(len(pieces))]
    return tf.data.Dataset.from_tensor_slices((
        tf.constant([p.path for p in pieces]),
        tf.constant([p.start for p in pieces], tf.int64),
        tf.constant([p.count for p in pieces], tf.int64),
        tf.constant([-1 if p.num_bytes is None else p.num_bytes for p in pieces], tf.int64),
        tf.constant(firsts, tf.int64),
        tf.range(len(pieces), dtype=tf.int64)))


def sentinel_record():
    """A valid serialized Example (an 8x8 grey JPEG, label 0) standing in for a record that
    could not be read: it decodes like any record, so it passes the decode map without a
    per-record branch, and the check after decoding turns its negative id into the error."""
    from dataset_format import examples, schema

    jpeg = tf.io.encode_jpeg(tf.fill([8, 8, 3], tf.constant(128, tf.uint8))).numpy()
    return examples.serialize_example({schema.ENCODED: jpeg, schema.LABEL: 0})


def failed_id(piece, file_check):
    """The id of a piece's in-band failure (record ids are >= 0): `file_check` when the file
    was missing, unreadable or not its size (always an error), else a damaged frame."""
    return -2 - 2 * piece if file_check else -1 - 2 * piece


def failure_of(rid):
    """failed_id's inverse: (piece, file_check)."""
    return (-1 - rid) // 2, (-1 - rid) % 2 == 1


def reader(read_buffer_bytes):
    """A function of one `pieces_dataset` element -> Dataset of (record, id): `id` the
    record's number among this host's records, so a record that fails to decode is named
    from it (readers/checked.py).

    Nothing here raises: the decode map's `ignore_errors` downstream must never see a
    reading error. A file that is missing, unreadable or not its manifest size when the piece
    is opened, and a bad CRC or truncated frame while reading (which ends the piece), each
    end the piece with one in-band element: a decodable stand-in record whose id is
    `failed_id(...)`. The check after decoding names the file (TensorFlow logs its reason).
    """
    sentinel = tf.constant(sentinel_record())

    def read(path, start, count, num_bytes, first, piece):
        def then(size_ok):
            records = _records(path, start, read_buffer_bytes).take(
                tf.where(size_ok, count, tf.constant(0, tf.int64)))
            ids = tf.data.Dataset.range(first, first + count)
            failed = tf.data.Dataset.from_tensors(
                (sentinel, tf.where(size_ok, failed_id(piece, False), failed_id(piece, True))))
            return tf.data.Dataset.zip(records, ids).concatenate(failed).take(count)

        # the size check, opened before the TFRecordDataset: one of a missing file spins
        size_ok = tf.data.Dataset.from_tensors(path).map(lambda p: _size_ok(p, num_bytes))
        size_ok = size_ok.ignore_errors(log_warning=True).concatenate(
            tf.data.Dataset.from_tensors(False)).take(1)
        return size_ok.flat_map(then)

    return read


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
    found = n.reduce(tf.constant(0, tf.int64), lambda c, _: c + 1)
    return tf.where(num_bytes < 0, found >= 1, found == 1)
