"""One shard, many attempts: where an attempt's output goes, and how a later run reuses it.

Dataflow retries a failed work item and may run a straggler's twice at once (a zombie), and
commits one attempt's ShardResult. So:

* Each attempt writes its shard and index under its own temp name in `.tmp/`, then puts
  them at their final names with `files.place_once` (a hard link, or a server-side copy
  with ifGenerationMatch=0): the first attempt to finish wins and no later one can
  overwrite it. A later attempt whose bytes are the same (the usual case: inputs are read at
  their listed generation, conversion is deterministic) returns the final name too. One
  whose bytes differ (an input changed between the attempts) keeps its temp name, and if
  Dataflow commits that attempt, commit renames it over the final name. Either way the
  manifest's size and crc32c describe the object in the bucket.
* The attempt's catalog fragment records, in its Parquet metadata, the shard's settings
  (everything but its listing that its bytes depend on: label ids, encode options, index,
  hashes, and the worker's code build) and the attempt's ShardResult.
* A run after a failed or cancelled one (the unpublished versions newer than LATEST) finds
  their finished shards (`finished`, in the launcher: launcher/resume.py) and takes each
  whose settings are this build's and whose own listing is unchanged, whatever else
  changed, as a `resume` task: the file shared where the failed run wrote it (`share`: the
  manifest names `../VERSION/NAME`, nothing copied) once its size and crc32c are the
  recorded ones, else its listing converted again. Matching by name and a recipe of the
  listing, as before, took nothing once one image was added: every cut moves.
"""

import dataclasses
import hashlib
import json
import logging

from beam_pipeline.algorithms.read_ahead import threaded
from beam_pipeline.job import code_build
from beam_pipeline.job.contracts import Made, ShardFiles, ShardResult
from beam_pipeline.job.rewrite import copy_frames, with_rows
from beam_pipeline.store import catalog, files, gcs, transient
from dataset_format import layout

FRAGMENT_SUFFIX = layout.FRAGMENT_SUFFIX  # an attempt's fragment: .tmp/SHARD.ATTEMPT + this
RECORD_KEY = "image_tfrecords.shard"  # the fragment's Parquet metadata key


def settings(label_ids, encode, index, phash, moments, fields=None):
    """sha256 (hex) of everything but its listing that a shard's bytes depend on: the label
    ids, the encode options, whether it has an index, perceptual hashes, pixel moments, the
    declared fields (their JSON, vocabularies given), and this process's code build (a failed
    run's shard written by another build is not taken). The writer and the launcher
    (launcher/resume.py) both call this."""
    wanted = {"labels": label_ids, "encode": encode, "index": bool(index), "phash": bool(phash),
              "moments": bool(moments)}
    if fields:  # absent without fields: the digest of a build without them is unchanged
        wanted["fields"] = fields
    return hashlib.sha256(json.dumps([wanted, code_build.worker_build()],
                                     sort_keys=True, default=repr).encode()).hexdigest()


def record(result, shard_settings=None):
    """The fragment metadata of a finished attempt: its settings and ShardResult."""
    return {RECORD_KEY: json.dumps({"settings": shard_settings, "result": result.to_json()})}


@dataclasses.dataclass(frozen=True)
class Finished:
    """A shard a failed run finished: under its final name, its fragment recording it."""

    vdir: str            # the failed run's version directory
    fragment: str        # the attempt's catalog fragment (rows, and the record)
    listing: str         # the failed run's listing of the shard (ImageRef lines)
    settings: str        # attempts.settings of the attempt that wrote it
    result: ShardResult  # as recorded: path is the file's name in `vdir`

    @property
    def source(self):
        """The file as another version's manifest names it: ../VERSION/NAME."""
        return layout.shared_path(self.vdir.rstrip("/").rsplit("/", 1)[-1],
                                  self.result.files.path)


def finished(vdirs):
    """The finished shards of the failed runs `vdirs` (newest first) -> [Finished], one per
    file. A shard counts when its recorded attempt wrote images (a listing to compare), the
    file has the recorded size (gs://: and crc32c, from metadata; a local file's checksum
    is read by the task that takes it) and its index is beside it when it has one (placed
    last: a run killed between the two left no finished shard)."""
    fragments = [(vdir, path) for vdir in vdirs for path in sorted(
        files.objects(layout.join(layout.tmp_dir(vdir), f"*{FRAGMENT_SUFFIX}")))]

    def check(item):  # 16 at a time: on gs:// each is a round trip or two
        vdir, fragment = item
        recorded = _recorded(fragment, quiet=True)
        if not recorded or not recorded.get("settings"):
            return None
        result = ShardResult.from_json(recorded["result"])
        if not _in_place(layout.join(vdir, result.files.path), result):
            return None
        return Finished(vdir, fragment, layout.listing_file(layout.tmp_dir(vdir), result.split,
                                                            result.shard),
                        recorded["settings"], result)

    found, seen = [], set()
    for _, shard in threaded(fragments, check, 16):
        if shard is not None and (shard.vdir, shard.result.files.path) not in seen:
            seen.add((shard.vdir, shard.result.files.path))  # (two attempts of one shard)
            found.append(shard)
    return found


def _in_place(shard, result):
    """The finished shard `result` recorded is at `shard`, with its index (cheap checks: a
    local file's checksum is read by the task that shares it)."""
    return _as_recorded(shard, result, checksum=shard.startswith("gs://"))


def _as_recorded(shard, recorded, checksum=True):
    """Whether `shard` is what `recorded` says (size, and its CRC-32C unless `checksum` is
    False), with its index. A check that fails without proving the file gone raises
    StorageUnavailable (store/transient.py): not taking the shard would convert its images
    again."""
    import os

    def sums():
        if checksum:
            return files.size_and_crc32c(shard)
        return os.path.getsize(shard), recorded.written.crc32c

    index = layout.index_name(shard)
    try:
        return transient.retrying(sums, shard) == (
            recorded.written.num_bytes, recorded.written.crc32c) and (
            not recorded.files.index_temp
            or transient.retrying(lambda: files.exists(index), index))
    except transient.StorageUnavailable:
        raise
    except Exception:  # damage (retrying raises nothing else): gone since it was recorded
        return False


def share(header, lost, result, vdir, write_index=True, redo=None):
    """A `resume` task (`header`: the launcher's, for a Finished shard; `lost`: the keys of
    its listing this version does not take from it) -> its ShardResult, `resumed`:

    * whole: the failed run's file shared where it is (`shared` ../VERSION/NAME), its
      catalog rows placed in this version's shard, its recorded error records carried; or
      None when the file is not what its fragment recorded (the caller converts its
      listing again);
    * else the records of the other keys copied by offset into this attempt's temp shard
      (rewrite.copy_frames: CRCs checked, a damaged one converted again through `redo`).
    """
    recorded = ShardResult.from_json(header["result"])
    source = header["source"]
    shard = layout.shard_file(vdir, source)
    if not header.get("whole", True):
        lost = set(lost)
        rows = [r for r in catalog.read_rows(header["fragment"]) if r.key not in lost]
        copied, errors, redone = copy_frames(shard, result, rows, write_index, redo)
        return dataclasses.replace(
            copied, errors=tuple(errors),
            made=Made(passed_through=sum(r.sha256 == r.input_sha256 for r in rows),
                      converted=redone, repaired=redone, resumed=True),
            writer=dataclasses.replace(copied.writer, build=recorded.writer.build))
    if not _as_recorded(shard, recorded):
        logging.warning("%s: not what its fragment recorded; its listing is converted again",
                        shard)
        return None
    rows = [r.replace(split=result.split, shard=result.shard, file=source)
            for r in catalog.read_rows(header["fragment"])]
    shared = dataclasses.replace(
        recorded, split=result.split, shard=result.shard, kind=result.kind,
        files=ShardFiles(path=result.files.path, temp=shard, shared=source,
                         catalog_temp=result.files.catalog_temp),
        made=dataclasses.replace(recorded.made, converted=0, reframed=0, repaired=0,
                                 resumed=True),
        writer=dataclasses.replace(recorded.writer, process=result.writer.process))
    return with_rows(shared, rows, False)


def place(result, vdir):
    """A finished attempt (shard and index under temp names) -> the ShardResult commit
    needs: pointing at the final names when this attempt put them there or an earlier one
    put the same bytes there; else at its own temp names, for commit to rename."""
    final = layout.join(vdir, result.files.path)
    mine = (result.written.num_bytes, result.written.crc32c)
    if not files.place_once(result.files.temp, final) and files.size_and_crc32c(final) != mine:
        logging.warning("%s: another attempt of this shard wrote other bytes (an input "
                        "changed between attempts?); this attempt's copy stays at %s, and "
                        "commit renames it if this attempt is the one committed",
                        final, result.files.temp)
        return result
    files.delete_quietly(result.files.temp)
    index = None
    if result.files.index_temp:
        index = layout.index_name(final)
        files.place_once(result.files.index_temp, index)  # the same bytes if already there
        files.delete_quietly(result.files.index_temp)
    return result.with_files(temp=final, index_temp=index)


def _recorded(fragment, quiet=False):
    """A fragment's record (dict), or None (unreadable, or written before records, or by a
    reuse or copy task, which records none: `quiet` says nothing of those)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def read():
        if fragment.startswith("gs://"):
            return pq.read_metadata(pa.BufferReader(gcs.read_bytes(fragment))).metadata
        return pq.read_metadata(fragment).metadata

    try:  # a read that fails without proving damage fails the build (not "not resumable")
        metadata = transient.retrying(read, fragment)
        if quiet and (not metadata or RECORD_KEY.encode() not in metadata):
            return None
        return json.loads(metadata[RECORD_KEY.encode()])
    except transient.StorageUnavailable:
        raise
    except Exception as e:  # damage: gone, cut short, not Parquet
        logging.warning("%s: not resumable (%s)", fragment, e)
        return None
