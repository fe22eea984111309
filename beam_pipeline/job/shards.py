"""Write one shard per DoFn call: stream its images from storage, convert, frame, write.

Only small ImageRefs crossed the shuffle; image bytes live here, one shard at a time,
so memory does not grow with the dataset.
"""

import collections
import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import os
import socket
import time
import uuid
from typing import Optional

import apache_beam as beam
import google_crc32c
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from beam_pipeline.store import catalog, files, gcs, ranges
from beam_pipeline.dedup import perceptual
from beam_pipeline.job import attempts, images, records, reframe, reuse, workers
from beam_pipeline.errors import error_record
from beam_pipeline.job.contracts import Kind, PixelMoments, ShardResult
from beam_pipeline.refs import ImageRef
from dataset_format import frames, layout, schema

DAMAGED = "damaged_record"  # errors.jsonl: a damaged stored record whose input is gone
READ_AHEAD = 16                 # images fetched concurrently: hides gs:// latency
READ_AHEAD_BYTES = 256 << 20    # ... and at most this many listed bytes in flight (one more
                                # image when a single one is larger)


def read_bytes(uri, max_bytes=0, stamp=""):
    """The file's bytes; None when it holds more than `max_bytes` (0: no limit), found
    without reading more than max_bytes + 1 of them. gs:// objects in one request through
    the worker's one storage client (store/gcs.py), not a new client per read, at the
    generation the listing stamped (`stamp` "gen:N"), so every attempt reads the same bytes."""
    if uri.startswith("gs://"):
        data = gcs.read_bytes(uri, max_bytes, gcs.listed_generation(stamp))
    else:
        with FileSystems.open(uri, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            data = f.read(max_bytes + 1) if max_bytes else f.read()
    return None if max_bytes and len(data) > max_bytes else data


CHANGED = "changed_during_build"  # errors.jsonl reason: the listed generation is gone


def fetch(uri, max_bytes=0, stamp=""):
    """(bytes, None) or (None, the error that makes this input a rejection). A transient
    storage error (429/5xx past the retry deadline, a reset) is raised instead: the runner
    retries the bundle, and the shard never depends on when the service was busy."""
    try:
        data = read_bytes(uri, max_bytes, stamp)
    except gcs.GenerationGone as e:
        return None, images.ImageError(
            "read", CHANGED, f"{e}: it changed during the build (the next build reads it)")
    except Exception as e:  # a vanished or unreadable file is data, not a crash
        if gcs.is_transient(e):
            raise
        return None, e
    if data is None:  # it grew past the limit after it was listed
        return None, _too_large(max_bytes)
    return data, None


def _too_large(max_bytes):
    return images.ImageError("read", "too_large",
                             f"over --max_image_mb ({max_bytes / 2**20:g} MiB)")


def read_listing(path):
    """A shard's listing file -> ImageRefs in shard order, streamed (a shard of tiny images
    may list a hundred thousand)."""
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        for line in f:
            if line.strip():
                yield ImageRef.from_json(line.decode())


def _disk_errors_name_the_dir(process):
    """A full or failing disk (OSError without a file name, e.g. ENOSPC from a write) ->
    the same error naming the directory being written, so the user's one line says where."""

    def named(self, element):
        try:
            yield from process(self, element)
        except OSError as e:
            if e.filename or e.errno is None:
                raise
            raise OSError(e.errno, f"{e.strerror} writing under {self.tmp_dir}") from e

    named.__name__, named.__doc__ = process.__name__, process.__doc__
    return named


class WriteShardFn(beam.DoFn):
    """ShardTask -> ShardResult.

    Each attempt writes the shard, its index and its catalog fragment under names of its
    own in `tmp_dir`, then (`direct`) puts shard and index at their final names in the
    version directory, which no reader looks at before commit writes manifest.json and
    LATEST: first attempt wins, no later one overwrites it (job/attempts.py). Only with
    `direct=False` (options that let commit rewrite any shard: dropping content duplicates
    or near-duplicate leaks) does commit rename the committed attempt's files instead.
    A shard a failed run of the same plan finished (`resume_from`) is copied, not converted.
    """

    def __init__(self, tmp_dir, name, num_shards, label_ids, encode_options, write_index,
                 progress_dir=None, moments=False, previous_vdir=None, phash=False,
                 direct=True, resume_from=(), writers_per_process=None):
        self.tmp_dir, self.name, self.num_shards = tmp_dir, name, num_shards
        self.vdir, self.direct = tmp_dir.rstrip("/").rsplit("/", 1)[0], direct
        self.phash = phash  # --near_duplicates: a perceptual hash per stored image
        self.previous_vdir = previous_vdir  # incremental: where reuse/copy tasks read from
        self.moments = moments  # --transform: per-shard pixel sums for the analysis
        self.label_ids = label_ids
        self.encode_options, self.write_index = encode_options, write_index
        self.progress_dir = progress_dir
        self.resume_from = tuple(resume_from)  # failed runs' version dirs, newest first
        self.writers_per_process = writers_per_process  # --number_of_worker_harness_threads
        self.written = Metrics.counter("images", "written")
        self.failed = Metrics.counter("images", "failed")
        self.passed_through = Metrics.counter("images", "passed_through")

    def setup(self):
        self.pool = concurrent.futures.ThreadPoolExecutor(READ_AHEAD)
        self.budget = workers.this_machine(self.writers_per_process, READ_AHEAD)
        gcs.widen_pool(self.budget.connections)

    def teardown(self):
        self.pool.shutdown(wait=False)

    @_disk_errors_name_the_dir
    def process(self, task):
        final = layout.shard_name(self.name, task.split, task.shard, self.num_shards[task.split])
        attempt = uuid.uuid4().hex[:12]
        temp = layout.join(self.tmp_dir, f"{final}.{attempt}")
        result = ShardResult(split=task.split, shard=task.shard, path=final, temp=temp,
                             catalog_temp=temp + attempts.FRAGMENT_SUFFIX,
                             kind=task.kind, origin=task.origin,
                             writer=f"{socket.gethostname()}:{os.getpid()}")  # counted by commit
        if task.kind != Kind.IMAGES:  # incremental: a previous shard reused or its records copied
            if self.direct:
                result = dataclasses.replace(result, temp=layout.join(self.vdir, final))
            yield reuse.run(task.kind, result, task.listing, self.previous_vdir,
                            self.write_index, redo=self._redo)
            return
        shard_recipe = attempts.recipe(
            task.listing, name=final, labels=self.label_ids, encode=self.encode_options,
            index=self.write_index, phash=self.phash, moments=self.moments)
        found = attempts.find_finished(self.resume_from, final, shard_recipe)
        resumed = found and attempts.resume(found, result, self.vdir)
        if resumed:
            yield resumed
            return
        progress = _Progress(self.progress_dir, f"{final}.{attempt}")
        result = self._write_images(result, read_listing(task.listing), progress, shard_recipe)
        progress.flush(force=True)
        yield attempts.place(result, self.vdir) if self.direct else result

    def _write_images(self, result, refs, progress, shard_recipe=None):
        """Convert `refs` in listing order (which is shard order: the output is deterministic)
        into the temp shard, its catalog fragment and index -> the finished ShardResult."""
        split, shard, final, temp = result.split, result.shard, result.path, result.temp
        catalog_temp = result.catalog_temp
        index_temp = layout.index_name(temp) if self.write_index else None
        counts, errors = {}, []
        num_examples = num_bytes = passed_through = converted = reframed = repaired = 0
        moments = PixelMoments() if self.moments else None  # exact over the stored pixels
        with (files.create_final(temp) as raw_out, _ShardOut(raw_out) as out,
              catalog.FragmentWriter(catalog_temp) as catalog_rows,
              _IndexWriter(index_temp) as index):
            for ref, data, read_error in _read_ahead(self.pool, refs,
                                                     self.encode_options.max_bytes,
                                                     self.budget.read_ahead_bytes):
                try:
                    made = self._make(ref, data, read_error)
                except images.ImageError as e:
                    errors.append(error_record(ref.uri, e.stage, e.reason, e.detail))
                    Metrics.counter("errors", e.reason).inc()
                    progress.tick()
                    continue
                length = out.write_frame(made.parts, made.length)
                catalog_rows.append({
                    "key": ref.key, "uri": ref.uri, "label": ref.label,
                    "label_id": self.label_ids[ref.label], "split": split, "shard": shard,
                    "file": final, "position": num_examples,
                    "offset": num_bytes, "length": length, "sha256": made.sha256,
                    "height": made.height, "width": made.width, "input_size": ref.size,
                    "input_stamp": ref.stamp, "input_sha256": made.input_sha256,
                    "input_md5": ref.md5,
                    "phash": made.phash, "phash_center": made.phash_center,
                    "near_descriptor": made.descriptor})
                index.add(num_bytes, length)
                num_bytes += length
                num_examples += 1
                passed_through += made.passed_through
                reframed += made.reframed
                converted += not made.reframed
                repaired += made.repaired
                if moments is not None:
                    moments = moments.plus(*made.moments)
                counts[ref.label] = counts.get(ref.label, 0) + 1
                progress.tick()
            result = dataclasses.replace(
                result, num_examples=num_examples, num_bytes=num_bytes, label_counts=counts,
                errors=tuple(errors), passed_through=passed_through, converted=converted,
                reframed=reframed, repaired=repaired, crc32c=frames.crc32c_text(out.crc),
                catalog_temp=catalog_temp, index_temp=index_temp, pixel_moments=moments)
            catalog_rows.record(attempts.record(result, shard_recipe))  # what a resume needs
        self.written.inc(num_examples)  # counted per shard: per image they cost ~1% of CPU
        self.passed_through.inc(passed_through)
        self.failed.inc(len(errors))
        return result

    def _make(self, ref, data, read_error):
        """One listed image -> _Made: its stored record re-framed (ref.source: no decode),
        or its input converted. Raises images.ImageError for an input that is rejected."""
        label_id = self.label_ids[ref.label]
        if ref.source is not None:
            try:
                if read_error is not None:
                    raise read_error
                record, f = reframe.reframe(data, ref.key, label_id, ref.label)
                return _Made((record,), len(record), f[schema.SHA256].decode(), f[schema.HEIGHT],
                             f[schema.WIDTH], ref.sha256, 0, None, ref.source.phash,
                             ref.source.phash_center, ref.source.descriptor, reframed=True)
            except Exception as e:  # the stored record damaged or gone: convert instead
                logging.warning("%s: converting %s again (%s)", ref.source.path, ref.uri, e)
                data, read_error = fetch(ref.uri, self.encode_options.max_bytes, ref.stamp)
                return dataclasses.replace(
                    self._again(ref, data, read_error, f"{ref.source.path}: {e}"),
                    repaired=True)
        return self._converted(ref, data, read_error)

    def _again(self, ref, data, read_error, why):
        """A damaged stored record's input converted again; its failure says both."""
        try:
            return self._converted(ref, data, read_error)
        except images.ImageError as e:
            raise images.ImageError(e.stage, DAMAGED, f"its stored record is damaged "
                                    f"({why}) and its input cannot replace it: {e.detail}")

    def _redo(self, row, why):
        """A reuse/copy task's damaged record (catalog `row`) -> (its frame converted again
        from the input, the row's new fields), or (None, error record)."""
        ref = ImageRef(row["key"], row["uri"], row["label"], row["split"],
                       row["input_size"], row["input_stamp"])
        logging.warning("%s: converting %s again", why, ref.uri)
        data, read_error = fetch(ref.uri, self.encode_options.max_bytes, ref.stamp)
        try:
            made = self._again(ref, data, read_error, why)
        except images.ImageError as e:
            return None, error_record(ref.uri, e.stage, e.reason, e.detail)
        head, tail = frames.frame_ends(made.parts, made.length)
        return b"".join((head, *made.parts, tail)), {
            "sha256": made.sha256, "height": made.height, "width": made.width,
            "input_sha256": made.input_sha256, "phash": made.phash,
            "phash_center": made.phash_center, "near_descriptor": made.descriptor}

    def _converted(self, ref, data, read_error):
        """An input's bytes converted -> _Made (ImageError when it is rejected)."""
        label_id = self.label_ids[ref.label]
        encoded = self._convert(data, read_error)
        sha256 = hashlib.sha256(encoded.data).hexdigest()
        parts, length = records.example_parts(encoded, label_id, ref.label, ref.key, sha256)
        # Stored as it came: the input's hash is the stored image's (one pass, not two).
        input_sha256 = (sha256 if encoded.data is data or encoded.data == data
                        else hashlib.sha256(data).hexdigest())
        return _Made(parts, length, sha256, encoded.height, encoded.width, input_sha256,
                     encoded.passed_through, encoded.moments, _signed(encoded.phash),
                     _signed(encoded.phash_center), encoded.descriptor)

    def _convert(self, data, read_error):
        """Image bytes -> images.Encoded; ImageError for an unreadable or unusable input."""
        if isinstance(read_error, images.ImageError):
            raise read_error
        if read_error is not None:
            raise images.ImageError("read", "unreadable",
                                    f"{type(read_error).__name__}: {read_error}")
        try:
            return images.convert(data, self.encode_options, with_moments=self.moments,
                                  with_phash=self.phash)
        except images.ImageError:
            raise
        except Exception as e:  # a decoder's unforeseen failure is this image's, not the night's
            raise images.ImageError("decode", "crashed", f"{type(e).__name__}: {e}") from e


def _signed(phash):
    return None if phash is None else perceptual.to_signed(phash)


@dataclasses.dataclass(frozen=True)
class _Made:
    """One record ready to frame, and what its catalog row and the shard result need."""

    parts: tuple                  # the serialized Example, in pieces (records.example_parts)
    length: int                   # ... and its length
    sha256: str                   # of the stored image bytes
    height: int
    width: int
    input_sha256: str             # of the input bytes it came from
    passed_through: int
    moments: object               # --transform: the stored pixels' moments, else None
    phash: Optional[int]          # --near_duplicates: the catalog's signed perceptual hashes:
    phash_center: Optional[int]   # of the whole image and of its central 90%
    descriptor: Optional[bytes]   # ... and the pairs' second opinion (dedup/descriptor.py)
    reframed: bool = False
    repaired: bool = False        # its stored record was damaged: converted again


def _fetch_for(ref, max_bytes=0):
    """The bytes a ref is made from: its stored record (ref.source), else its input file."""
    if ref.source is None:
        return fetch(ref.uri, max_bytes, ref.stamp)
    try:
        return reframe.read_stored(ref.source), None
    except Exception as e:
        return None, e


def _read_ahead(pool, refs, max_bytes=0, budget=None):
    """Yield (ref, bytes, error) in order while later reads are in flight: up to READ_AHEAD
    of them, holding at most `budget` (READ_AHEAD_BYTES) listed bytes, or one read.

    A local input file is opened ahead, with the kernel asked to read it in, and read here
    when its turn comes: a page-cache read costs less than handing it to a thread (that
    hand-off was ~12% of a worker's CPU). gs:// objects and stored records use the pool;
    stored records listed one after another that lie close together in one shard file are
    one read (store/ranges.py).
    """
    budget = READ_AHEAD_BYTES if budget is None else budget
    pending, in_flight = collections.deque(), 0
    for group in _stored_runs(refs):
        size = sum(ref.size for ref in group)
        while pending and (len(pending) >= READ_AHEAD or in_flight + size > budget):
            done, future = pending.popleft()
            in_flight -= sum(ref.size for ref in done)
            yield from _results(done, future)
        pending.append((group, _submit(pool, group, max_bytes)))
        in_flight += size
    for done, future in pending:
        yield from _results(done, future)


def _submit(pool, group, max_bytes):
    ref = group[0]
    if len(group) > 1:
        return pool.submit(reframe.read_stored_run, [r.source for r in group])
    if ref.source is None and "://" not in ref.uri:
        return _LocalRead(ref.uri, max_bytes)
    return pool.submit(_fetch_for, ref, max_bytes)


def _results(group, future):
    got = future.result()
    for ref, (data, error) in zip(group, got if len(group) > 1 else [got]):
        yield ref, data, error


def _stored_runs(refs):
    """Refs -> lists of refs read together: consecutive stored records of one shard file that
    form one run of store/ranges.py; every other ref alone."""
    group, run, used = [], None, 0
    for ref in refs:
        source = ref.source
        if (run is not None and source is not None and source.path == group[0].source.path
                and ranges.joins(run, used, source.offset, source.length)):
            group.append(ref)
            run = ranges.Run(run.start, source.offset + source.length, ())
            used += source.length
            continue
        if group:
            yield group
        group = [ref]
        run = source and ranges.Run(source.offset, source.offset + source.length, ())
        used = source.length if source else 0
    if group:
        yield group


class _LocalRead:
    """A local file opened now (and its pages asked for: POSIX_FADV_WILLNEED) and read on
    result(): the (bytes, error) of fetch, without a thread."""

    def __init__(self, path, max_bytes):
        self.max_bytes, self.file, self.error = max_bytes, None, None
        try:
            self.file = open(path, "rb")  # what Beam's local FileSystems.open does
        except OSError as e:  # a vanished or unreadable file is data, not a crash
            self.error = e
            return
        try:
            os.posix_fadvise(self.file.fileno(), 0, 0, os.POSIX_FADV_WILLNEED)
        except (OSError, AttributeError):  # a filesystem or platform without it
            pass

    def result(self):
        if self.error is not None:
            return None, self.error
        try:
            with self.file:
                data = self.file.read(self.max_bytes + 1) if self.max_bytes else self.file.read()
        except OSError as e:
            return None, e
        if self.max_bytes and len(data) > self.max_bytes:  # it grew past the limit
            return None, _too_large(self.max_bytes)
        return data, None


class _ShardOut:
    """TFRecord frames into the shard file through one fixed buffer, and the file's CRC-32C
    (the manifest's checksum) kept as they go.

    A record arrives in pieces (records.example_parts) and is copied once, into the buffer:
    not joined into a record, then into a frame, then handed to the file (which wrote each
    photo with its own system call). CRC-32C instead of SHA-256 over the file: 3-5 µs per
    40 KB photo against ~30 µs, and what Cloud Storage reports for every object.
    """

    SIZE = 1 << 20

    def __init__(self, out):
        self.out, self.crc, self.used = out, 0, 0
        self.view = memoryview(bytearray(self.SIZE))

    def __enter__(self):
        return self

    def write_frame(self, parts, length):
        """Frame a record given as pieces of `length` bytes in all -> the frame's length."""
        head, tail = frames.frame_ends(parts, length)
        for piece in (head, *parts, tail):
            self.crc = google_crc32c.extend(self.crc, piece)
            n = len(piece)
            if self.used + n > self.SIZE:
                self.flush()
            if n > self.SIZE:
                self.out.write(piece)
            else:
                self.view[self.used:self.used + n] = piece
                self.used += n
        return len(head) + length + len(tail)

    def flush(self):
        if self.used:
            self.out.write(self.view[:self.used])
            self.used = 0

    def __exit__(self, *exc):
        if not exc[0]:
            self.flush()


class _IndexWriter:
    """The DALI / tfrecord-package index beside a shard: "offset length" per record,
    written as the shard is (None: no index)."""

    def __init__(self, path):
        self.path, self.lines = path, []

    def __enter__(self):
        self.opened = files.create_final(self.path) if self.path else None
        self.out = self.opened.__enter__() if self.opened else None
        return self

    def add(self, offset, length):
        if self.out:
            self.lines.append(frames.index_line(offset, length))
            if len(self.lines) >= 4096:
                self.out.write("".join(self.lines).encode())
                self.lines = []

    def __exit__(self, *exc):
        if self.out:
            if not exc[0]:
                self.out.write("".join(self.lines).encode())
            self.opened.__exit__(*exc)  # an exception: no index appears


class _Progress:
    """Every few seconds, a tiny file with this shard's count, which the launcher sums."""

    PERIOD = 2.0

    def __init__(self, directory, name):
        self.path = layout.join(directory, name) if directory else None
        self.count, self.last = 0, time.monotonic()

    def tick(self):
        self.count += 1
        if self.path and time.monotonic() - self.last > self.PERIOD:
            self.flush()

    def flush(self, force=False):
        if self.path and (force or self.count):
            try:
                with FileSystems.create(self.path) as f:
                    f.write(json.dumps({"done": self.count}).encode())
            except Exception:  # progress is a courtesy; never fail a shard for it
                self.path = None
            self.last = time.monotonic()
