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
    """Dataset of (path, start, count, file_records, num_bytes) per piece (-1: size unknown)."""
    return tf.data.Dataset.from_tensor_slices((
        tf.constant([p.path for p in pieces]),
        tf.constant([p.start for p in pieces], tf.int64),
        tf.constant([p.count for p in pieces], tf.int64),
        tf.constant([p.file_records for p in pieces], tf.int64),
        tf.constant([-1 if p.num_bytes is None else p.num_bytes for p in pieces], tf.int64)))


def reader(skip_corrupt, read_buffer_bytes):
    """A function of one `pieces_dataset` element -> Dataset of (record, path, position)."""

    def read(path, start, count, file_records, num_bytes):
        if skip_corrupt:
            return _read_retrying(path, num_bytes, start, start + count, read_buffer_bytes,
                                  READ_ATTEMPTS, start)
        fail = tf.data.Dataset.from_tensors(path).map(
            lambda p: _short_piece(p, start, count, file_records))
        return _checked(path, num_bytes, lambda p: _records(
            p, start, read_buffer_bytes).concatenate(fail).take(count))

    return read


def _checked(path, num_bytes, then):
    """`then(path)`, opened only once the size check passed. A flat_map, not a concatenate:
    after the check fails, an interleave still prefetching must find nothing left to read
    (a TFRecordDataset of a missing file would spin)."""
    return tf.data.Dataset.from_tensors(path).map(
        lambda p: _check_size(p, num_bytes)).flat_map(then)


def _records(path, start, read_buffer_bytes):
    """(record, path, position in file) from `start` on, ending at the first bad frame."""
    records = tf.data.TFRecordDataset(path, buffer_size=read_buffer_bytes)
    records = records.ignore_errors(log_warning=True).skip(start)  # logs TF's reason + offset
    return records.enumerate(start).map(lambda i, r: (r, path, i))


def _check_size(path, num_bytes):
    """Fails naming `path` unless it exists with `num_bytes` bytes (-1: exists, any size).

    FixedLengthRecordDataset of 1-byte records before a footer of num_bytes - 1 bytes has
    exactly one record when the size matches (it reads the first byte), none when the file
    is shorter; a missing or unreadable file raises an error naming it.
    """
    footer = tf.maximum(num_bytes - 1, 0)
    n = tf.data.FixedLengthRecordDataset(path, 1, footer_bytes=footer, buffer_size=1).take(2)
    found = n.reduce(tf.constant(0, tf.int64), lambda c, _: c + 1)
    ok = tf.where(num_bytes < 0, found >= 1, found == 1)
    check = tf.debugging.Assert(ok, [tf.strings.join([
        path, ": not the size manifest.json gives it (", tf.strings.as_string(num_bytes),
        " bytes): truncated, overwritten or emptied since the build; rebuild the dataset or "
        "read another version"])])
    with tf.control_dependencies([check]):
        return tf.identity(path)


def _short_piece(path, start, count, file_records):
    what = tf.strings.join([
        "records ", tf.strings.as_string(start), "..", tf.strings.as_string(start + count - 1),
        " of the ", tf.strings.as_string(file_records)])
    check = tf.debugging.Assert(False, [tf.strings.join([
        path, ": could not read ", what, " in manifest.json: the shard is corrupt (bad CRC) or "
        "truncated (TensorFlow logged the reason above). Rebuild the dataset, or pass "
        "skip_corrupt=True to read past it."])])
    with tf.control_dependencies([check]):
        return tf.constant(b""), path, tf.constant(-1, tf.int64)


def _read_retrying(path, num_bytes, start, end, read_buffer_bytes, attempts, first):
    """skip_corrupt: records [start, end) of the piece [first, end); a short read is retried
    from where it stopped (`attempts` reads in all), then the missing tail is logged as lost."""
    records = _checked(path, num_bytes,
                       lambda p: _records(p, start, read_buffer_bytes).take(end - start))
    marked = records.map(lambda r, p, i: (r, p, i, False)).concatenate(
        tf.data.Dataset.from_tensors((tf.constant(b""), path, tf.constant(-1, tf.int64), True)))
    # the end marker's position becomes where this read stopped
    marked = marked.scan(start, lambda nxt, e: (tf.where(e[3], nxt, e[2] + 1),
                                                (e[0], e[1], tf.where(e[3], nxt, e[2]), e[3])))

    def expand(record, p, i, is_end):
        one = tf.data.Dataset.from_tensors((record, p, i)).take(_pick(is_end, 0, 1))
        if attempts > 1:
            rest = _read_retrying(path, num_bytes, i, end, read_buffer_bytes, attempts - 1,
                                  first)
        else:
            rest = tf.data.Dataset.from_tensors(path).map(
                lambda q: _log_lost(q, i - first, end - first))
            rest = rest.filter(lambda *lost: False)
        return one.concatenate(rest.take(_pick(is_end & (i < end), -1, 0)))

    return marked.flat_map(expand)


def _pick(condition, if_true, if_false):
    return tf.where(condition, tf.constant(if_true, tf.int64), tf.constant(if_false, tf.int64))


def _log_lost(path, got, expected):
    done = tf.print(tf.strings.join([
        "WARNING readers: skip_corrupt: ", path, ": read ", tf.strings.as_string(got), " of ",
        tf.strings.as_string(expected), " records of this piece, skipped ",
        tf.strings.as_string(expected - got), " (corrupt or truncated)"]),
        output_stream=sys.stderr)
    with tf.control_dependencies([done]):  # not via logging: data loss is never muted
        return tf.constant(b""), path, tf.constant(-1, tf.int64)
