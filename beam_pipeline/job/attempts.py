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
* The attempt's catalog fragment records, in its Parquet metadata, the recipe of the shard
  (a digest of its listing and of everything else its bytes depend on) and the attempt's
  ShardResult. A run after a failed or cancelled one (`resume_from`: the unpublished
  versions newer than LATEST) takes a shard whose fragment has the same recipe and whose
  final file has the size and crc32c the fragment recorded: copied (hard link, server-side
  copy) instead of converted again.
"""

import dataclasses
import hashlib
import json
import logging

from beam_pipeline.job import code_build
from beam_pipeline.job.contracts import ShardResult
from beam_pipeline.store import files
from dataset_format import layout

FRAGMENT_SUFFIX = layout.FRAGMENT_SUFFIX  # an attempt's fragment: .tmp/SHARD.ATTEMPT + this
RECORD_KEY = "image_tfrecords.shard"  # the fragment's Parquet metadata key


def recipe(listing, **settings):
    """sha256 over the shard's listing file and `settings` (everything else its bytes depend
    on: name, shard count, label ids, encode options...) and this worker's code build (a
    failed run's shard written by another build is not resumed)."""
    h = hashlib.sha256(json.dumps([settings, code_build.worker_build()], sort_keys=True,
                                  default=repr).encode())
    with files.open_read(listing) as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def record(result, shard_recipe):
    """The fragment metadata of a finished attempt: its recipe and ShardResult."""
    return {RECORD_KEY: json.dumps({"recipe": shard_recipe, "result": result.to_json()})}


def place(result, vdir):
    """A finished attempt (shard and index under temp names) -> the ShardResult commit
    needs: pointing at the final names when this attempt put them there or an earlier one
    put the same bytes there; else at its own temp names, for commit to rename."""
    final = layout.join(vdir, result.path)
    mine = (result.num_bytes, result.crc32c)
    if not files.place_once(result.temp, final) and files.size_and_crc32c(final) != mine:
        logging.warning("%s: another attempt of this shard wrote other bytes (an input "
                        "changed between attempts?); this attempt's copy stays at %s, and "
                        "commit renames it if this attempt is the one committed",
                        final, result.temp)
        return result
    files.delete_quietly(result.temp)
    index = None
    if result.index_temp:
        index = layout.index_name(final)
        files.place_once(result.index_temp, index)  # the same bytes if already there
        files.delete_quietly(result.index_temp)
    return dataclasses.replace(result, temp=final, index_temp=index)


def find_finished(vdirs, name, shard_recipe):
    """(version dir, recorded ShardResult, fragment path) of a finished attempt of shard
    `name` with this recipe in one of `vdirs` (failed runs), or None."""
    for vdir in vdirs:
        pattern = layout.join(layout.tmp_dir(vdir), f"{name}.*{FRAGMENT_SUFFIX}")
        for fragment in files.objects(pattern):
            recorded = _recorded(fragment)
            if recorded is None or recorded["recipe"] != shard_recipe:
                continue
            result = ShardResult.from_json(recorded["result"])
            shard = layout.join(vdir, name)
            if (files.size_and_crc32c(shard) == (result.num_bytes, result.crc32c)
                    and (not result.index_temp or files.exists(layout.index_name(shard)))):
                return vdir, result, fragment  # (killed before its index: not finished)
    return None


def _recorded(fragment):
    """A fragment's record (dict), or None (unreadable, or written before records)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if fragment.startswith("gs://"):
            from beam_pipeline.store import gcs

            metadata = pq.read_metadata(pa.BufferReader(gcs.read_bytes(fragment))).metadata
        else:
            metadata = pq.read_metadata(fragment).metadata
        return json.loads(metadata[RECORD_KEY.encode()])
    except Exception as e:
        logging.warning("%s: not resumable (%s)", fragment, e)
        return None


def resume(found, result, vdir):
    """Take a failed run's finished shard (`found`: find_finished's answer) into this
    version: shard and index copied to their final names, the fragment to this attempt's.
    -> its ShardResult, or None when this version holds other bytes under that name
    already (then the caller converts)."""
    from beam_pipeline.job.reuse import link_or_copy

    old_vdir, recorded, fragment = found
    final = layout.join(vdir, result.path)
    mine = (recorded.num_bytes, recorded.crc32c)
    if (not files.place_once(layout.join(old_vdir, result.path), final)
            and files.size_and_crc32c(final) != mine):
        return None
    index = None
    if recorded.index_temp:
        index = layout.index_name(final)
        files.place_once(layout.index_name(layout.join(old_vdir, result.path)), index)
    link_or_copy(fragment, result.catalog_temp)
    return dataclasses.replace(recorded, temp=final, index_temp=index,
                               catalog_temp=result.catalog_temp, writer=result.writer,
                               converted=0, reframed=0, resumed=True)
