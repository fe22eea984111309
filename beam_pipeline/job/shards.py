"""Write one shard per DoFn call: stream its images from storage, convert, frame, write.

Only small ImageRefs crossed the shuffle; image bytes live here, one shard at a time,
so memory does not grow with the dataset.
"""

import base64
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
from apache_beam.metrics import Metrics

from beam_pipeline.store import catalog, files, gcs, transient
from beam_pipeline.dedup import perceptual
from beam_pipeline.job import (attempts, code_build, images, inputs, records, reframe, reuse,
                               workers)
from beam_pipeline.job.contracts import (Kind, Made, PixelMoments, ShardFiles, ShardResult,
                                         Sums, Writer, Written)
from beam_pipeline.job.shard_file import ShardFile
from beam_pipeline.refs import ImageRef
from dataset_format import fields as field_types, frames, layout, schema
from dataset_format.error_record import ErrorRecord
from dataset_format.catalog_schema import CatalogRow

DAMAGED = "damaged_record"  # errors.jsonl: a damaged stored record whose input is gone


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
    A `resume` task shares a failed run's finished shard where it is (job/attempts.py).
    """

    def __init__(self, tmp_dir, name, num_shards, label_ids, encode_options, write_index,
                 progress_dir=None, moments=False, previous_vdir=None, phash=False,
                 direct=True, writers_per_process=None, previous_build=None, fields=None):
        self.tmp_dir, self.name, self.num_shards = tmp_dir, name, num_shards
        self.vdir, self.direct = tmp_dir.rstrip("/").rsplit("/", 1)[0], direct
        self.phash = phash  # --near_duplicates: a perceptual hash per stored image
        self.previous_vdir = previous_vdir  # incremental: where reuse/copy tasks read from
        self.moments = moments  # --transform: per-shard pixel sums for the analysis
        self.label_ids = label_ids
        self.encode_options, self.write_index = encode_options, write_index
        self.progress_dir = progress_dir
        self.writers_per_process = writers_per_process  # --number_of_worker_harness_threads
        self.fields = fields  # declared fields (fields.Schema, vocabularies given), or None
        self.catalog_schema = catalog.schema_of(fields)  # the fragments' columns
        self.previous_build = previous_build  # what wrote the records reuse/copy tasks take
        self.written = Metrics.counter("images", "written")
        self.failed = Metrics.counter("images", "failed")
        self.passed_through = Metrics.counter("images", "passed_through")

    def setup(self):
        # The writer's own pool, kept across shards (read_ahead.threaded makes one per call):
        # read_ahead.ordered drives it (job/inputs.py), local reads skip it.
        self.pool = concurrent.futures.ThreadPoolExecutor(inputs.READ_AHEAD)
        self.budget = workers.this_machine(self.writers_per_process, inputs.READ_AHEAD)
        gcs.widen_pool(self.budget.connections)

    def teardown(self):
        self.pool.shutdown(wait=False)

    @_disk_errors_name_the_dir
    def process(self, task):
        final = layout.shard_name(self.name, task.split, task.shard, self.num_shards[task.split])
        attempt = uuid.uuid4().hex[:12]
        temp = layout.join(self.tmp_dir, f"{final}.{attempt}")
        writer = Writer(f"{socket.gethostname()}:{os.getpid()}",  # commit counts processes
                        code_build.worker_build())
        result = ShardResult(split=task.split, shard=task.shard, kind=task.kind,
                             origin=task.origin,
                             files=ShardFiles(path=final, temp=temp,
                                              catalog_temp=temp + attempts.FRAGMENT_SUFFIX),
                             writer=writer)
        shard_settings = attempts.settings(self.label_ids, self.encode_options,
                                           self.write_index, self.phash, self.moments,
                                           self.fields.to_json() if self.fields else None)
        listing = task.listing
        if task.kind == Kind.RESUME:  # a failed run's finished shard, its listing unchanged
            data = transient.retrying(lambda: files.read_bytes(listing), listing)
            header, *lost = data.decode().splitlines()
            header = json.loads(header)
            taken = attempts.share(header, [json.loads(k) for k in lost if k], result,
                                   self.vdir, self.write_index, self._redo)
            if taken is not None:  # shared where it is, or its records copied to `temp`
                yield (attempts.place(taken, self.vdir)
                       if self.direct and taken.files.temp == temp else taken)
                return
            listing = header["listing_file"]  # not as recorded: convert that listing again
            result = dataclasses.replace(result, kind=Kind.IMAGES)
        elif task.kind != Kind.IMAGES:  # incremental: a previous shard reused or its records copied
            result = dataclasses.replace(result, writer=Writer(writer.process,
                                                               self.previous_build))
            done = reuse.run(task.kind, result, task.listing, self.previous_vdir,
                             self.write_index, redo=self._redo,
                             vdir=self.vdir if self.direct else None,
                             catalog_schema=self.catalog_schema)
            # Copied records went to this attempt's temp name: they may differ from another
            # attempt's (an input one of them could not read), so the first to finish wins.
            yield (attempts.place(done, self.vdir) if self.direct and done.files.temp == temp
                   else done)
            return
        progress = _Progress(self.progress_dir, f"{final}.{attempt}")
        result = self._write_images(result, inputs.read_listing(listing), progress,
                                    shard_settings)
        progress.flush(force=True)
        yield attempts.place(result, self.vdir) if self.direct else result

    def _write_images(self, result, refs, progress, shard_settings=None):
        """Convert `refs` in listing order (which is shard order: the output is deterministic)
        into the temp shard, its catalog fragment and index -> the finished ShardResult."""
        split, shard = result.split, result.shard
        final, temp = result.files.path, result.files.temp
        index_temp = layout.index_name(temp) if self.write_index else None
        errors, passed_through, converted, reframed, repaired = [], 0, 0, 0, 0
        moments = PixelMoments() if self.moments else None  # exact over the stored pixels
        with ShardFile(temp, result.files.catalog_temp, index_temp, self.catalog_schema) as out:
            for ref, data, read_error in inputs.read_ahead(self.pool, refs,
                                                           self.encode_options.max_bytes,
                                                           self.budget.read_ahead_bytes):
                try:
                    made = self._make(ref, data, read_error)
                except images.ImageError as e:
                    errors.append(ErrorRecord(ref.uri, e.stage, e.reason, e.detail))
                    Metrics.counter("errors", e.reason).inc()
                    progress.tick()
                    continue
                offset = out.num_bytes
                length = out.write(made.parts, made.length)
                out.add(CatalogRow(
                    key=ref.key, uri=ref.uri, label=ref.label,
                    label_id=self.label_ids[ref.label], split=split, shard=shard,
                    file=final, position=out.num_examples,
                    offset=offset, length=length, sha256=made.sha256,
                    height=made.height, width=made.width, input_size=ref.size,
                    input_stamp=ref.stamp, input_sha256=made.input_sha256,
                    input_md5=ref.md5, phash=made.phash, phash_center=made.phash_center,
                    near_descriptor=made.descriptor, fields=made.fields))
                passed_through += made.passed_through
                reframed += made.reframed
                converted += not made.reframed
                repaired += made.repaired
                if moments is not None:
                    moments = moments.plus(*made.moments)
                progress.tick()
            result = dataclasses.replace(
                result.with_files(index_temp=index_temp),
                written=Written(out.num_examples, out.num_bytes, crc32c=out.crc32c),
                made=Made(passed_through, converted, reframed, repaired),
                sums=Sums(out.label_counts, moments), errors=tuple(errors))
            out.record(attempts.record(result, shard_settings))  # what a resume needs
        self.written.inc(out.num_examples)  # counted per shard: per image they cost ~1% of CPU
        self.passed_through.inc(passed_through)
        self.failed.inc(len(errors))
        return result

    def _make(self, ref, data, read_error):
        """One listed image -> _Made: its stored record re-framed (ref.source: no decode),
        or its input converted. Raises images.ImageError for an input that is rejected."""
        label_id = self.label_ids[ref.label]
        values = None if self.fields is None else field_types.values_from_text(ref.fields)
        if ref.source is not None:
            try:
                if read_error is not None:
                    raise read_error
                record, f = reframe.reframe(data, ref.key, label_id, ref.label, None if values
                                            is None else field_types.encoded(self.fields, values))
                return _Made(parts=(record,), length=len(record),
                             sha256=f[schema.SHA256].decode(), height=f[schema.HEIGHT],
                             width=f[schema.WIDTH], input_sha256=ref.sha256, passed_through=0,
                             moments=None, phash=ref.source.phash,
                             phash_center=ref.source.phash_center,
                             descriptor=_descriptor(ref.source.descriptor), reframed=True,
                             fields=values)
            except Exception as e:  # the stored record damaged or gone: convert instead
                logging.warning("%s: converting %s again (%s)", ref.source.path, ref.uri, e)
                data, read_error = inputs.fetch(ref.uri, self.encode_options.max_bytes, ref.stamp)
                return dataclasses.replace(
                    self._again(ref, data, read_error, f"{ref.source.path}: {e}"),
                    repaired=True)
        return self._converted(ref, data, read_error, values)

    def _again(self, ref, data, read_error, why):
        """A damaged stored record's input converted again; its failure says both."""
        try:
            return self._converted(ref, data, read_error)
        except images.ImageError as e:
            raise images.ImageError(e.stage, DAMAGED, f"its stored record is damaged "
                                    f"({why}) and its input cannot replace it: {e.detail}")

    def _redo(self, row, why):
        """A reuse/copy task's damaged record (its CatalogRow) -> (its frame converted again
        from the input, the row with the new record's fields), or (None, error record)."""
        ref = ImageRef(row.key, row.uri, row.label, row.split, row.input_size, row.input_stamp,
                       fields=None if row.fields is None else field_types.values_text(row.fields))
        logging.warning("%s: converting %s again", why, ref.uri)
        data, read_error = inputs.fetch(ref.uri, self.encode_options.max_bytes, ref.stamp)
        try:
            made = self._again(ref, data, read_error, why)
        except images.ImageError as e:
            return None, ErrorRecord(ref.uri, e.stage, e.reason, e.detail)
        head, tail = frames.frame_ends(made.parts, made.length)
        return b"".join((head, *made.parts, tail)), row.replace(
            sha256=made.sha256, height=made.height, width=made.width,
            input_sha256=made.input_sha256, phash=made.phash, phash_center=made.phash_center,
            near_descriptor=made.descriptor)

    def _converted(self, ref, data, read_error, values=None):
        """An input's bytes converted -> _Made (ImageError when it is rejected). `values`:
        its declared fields' (None: read here from ref.fields, in a build with fields)."""
        if values is None and self.fields is not None:
            values = field_types.values_from_text(ref.fields)
        features = None if values is None else field_types.encoded(self.fields, values)
        label_id = self.label_ids[ref.label]
        encoded = self._convert(data, read_error)
        sha256 = hashlib.sha256(encoded.data).hexdigest()
        parts, length = records.example_parts(encoded, label_id, ref.label, ref.key, sha256,
                                              features)
        # Stored as it came: the input's hash is the stored image's (one pass, not two).
        input_sha256 = (sha256 if encoded.data is data or encoded.data == data
                        else hashlib.sha256(data).hexdigest())
        return _Made(parts=parts, length=length, sha256=sha256, height=encoded.height,
                     width=encoded.width, input_sha256=input_sha256,
                     passed_through=encoded.passed_through, moments=encoded.moments,
                     phash=_signed(encoded.phash), phash_center=_signed(encoded.phash_center),
                     descriptor=encoded.descriptor, fields=values)

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


def _descriptor(text):
    """A stored row's near_descriptor as refs.StoredFrame carries it (base64) -> bytes."""
    return None if text is None else base64.b64decode(text)


def _signed(phash):
    return None if phash is None else perceptual.to_signed(phash)


@dataclasses.dataclass(frozen=True, kw_only=True)
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
    fields: Optional[dict] = None  # its declared fields' values (the catalog row's columns)


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
                files.write_bytes(self.path, json.dumps({"done": self.count}).encode())
            except Exception:  # progress is a courtesy; never fail a shard for it
                self.path = None
            self.last = time.monotonic()
