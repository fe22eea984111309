"""Records picked out of a version's shards without a full read, for inspect_dataset.

A record is fetched by (shard, position): one ranged read of the span the shard's .index
file gives, or a scan of the shard up to that position when there is none. Near-duplicate
pairs find their members' places in the catalog. Every read goes through
tools/verify_reads.py (retried; gs:// by ranged GETs through the process's client): a read
that fails without proving damage (a 503 past the retries, a 403) raises StorageUnavailable
"cannot read FILE (...)", inspect_dataset's one line and exit 1.
"""

import heapq
import io
import json
import random

from beam_pipeline.refs import split_order
from beam_pipeline.store import catalog, transient
from beam_pipeline.tools import drawing, verify_reads
from beam_pipeline.tools.verify_reads import INSPECT_ADVICE
from dataset_format import fields, frames, layout, schema


def ordered_splits(manifest):
    return split_order(manifest.get("splits", {}))


class MissingShard(Exception):
    """A shard the manifest lists is not there: the version is damaged (not a mistake in the
    command, and not an outage): inspect_dataset's one line and exit 1."""


def _record_at(shard_path, position, index):
    """The serialized Example at `position` of a shard: the index's span in one read, else
    a scan from the start (CHUNK pieces). MissingShard when the shard is not there (on
    gs:// the client's NotFound, which was a traceback)."""
    try:
        return _read_record(shard_path, position, index)
    except Exception as e:  # re-raised unless the shard is missing
        if verify_reads.is_missing(e):
            raise MissingShard(f"{shard_path} is missing: the version is damaged "
                               f"(python -m beam_pipeline.tools.verify names what else is)"
                               ) from None
        raise


def _read_record(shard_path, position, index):
    if index is not None:
        offset, length = index[position]
        data = verify_reads.read_range(shard_path, offset, length, INSPECT_ADVICE)
        return frames.read_frame(io.BytesIO(data), offset)[0]
    f, offset = verify_reads.Stream(shard_path, INSPECT_ADVICE), 0
    for _ in range(position):
        offset += frames.read_frame(f, offset, check_crc=False)[1]
    return frames.read_frame(f, offset)[0]


def _read_index(shard_path):
    """The shard's index entries [(offset, length)], or None when it has no .index file."""
    try:
        text = verify_reads.read_text(layout.index_name(shard_path), INSPECT_ADVICE)
    except Exception as e:  # damage only (verify_reads raises nothing else): missing is fine
        if verify_reads.is_missing(e):
            return None
        raise
    return frames.parse_index(text)


def sample(version_dir, manifest, n, split=None, seed=0):
    """Up to `n` records, uniformly over the chosen split(s) (all by default).

    Returns [(split, class name, label id, PIL RGB image)], in sampling order.
    """
    from PIL import Image
    from tensorflow.core.example import example_pb2

    splits = [split] if split else ordered_splits(manifest)
    for s in splits:
        if s not in manifest["splits"]:
            raise KeyError(f"no split {s!r}; this version has {ordered_splits(manifest)}")
    slots = [(s, sh["path"], k) for s in splits for sh in manifest["splits"][s]["shards"]
             for k in range(sh["num_examples"])]
    picked = sorted(random.Random(seed).sample(range(len(slots)), min(n, len(slots))))
    indexes, out = {}, []
    for i in picked:
        s, rel, k = slots[i]
        path = layout.shard_file(version_dir, rel)
        if rel not in indexes:
            indexes[rel] = _read_index(path)
        feature = example_pb2.Example.FromString(
            _record_at(path, k, indexes[rel])).features.feature
        image = Image.open(io.BytesIO(feature[schema.ENCODED].bytes_list.value[0]))
        out.append((s, feature[schema.TEXT].bytes_list.value[0].decode(),
                    feature[schema.LABEL].int64_list.value[0],
                    drawing.with_boxes(image.convert("RGB"), boxes_of(feature))))
    return out


def boxes_of(feature):
    """A record's boxes (a boxes field's Object Detection API keys) as [(xmin, ymin, xmax,
    ymax, class name)]; [] for a record without."""
    if fields.BBOX["xmin"] not in feature:
        return []
    sides = [feature[fields.BBOX[s]].float_list.value for s in fields.BOX_SIDES]
    names = [v.decode() for v in feature[fields.BOX_TEXT].bytes_list.value]
    return list(zip(*sides, names))

def cross_split_pairs(version_dir, manifest, n, rejected=2):
    """Up to `n` (caption, member a, member b) pairs of stored images in different splits: the
    confirmed pairs first, then up to `rejected` of the closest candidates the descriptor
    turned down (captioned "rejected"); a member is (split, key, image). Keys are found in
    the catalog; members left out of the version (--drop_near_duplicate_leaks) are skipped."""
    near = manifest.get("near_duplicates")
    if not near or not n:
        return []
    wanted = _cross_split(version_dir, near["path"], n - min(rejected, n // 2), "")
    if near.get("rejected_path"):
        closest = heapq.nsmallest(n - len(wanted), _cross_split(
            version_dir, near["rejected_path"], None, "rejected "))
        wanted += closest
    wanted = [w[1:] for w in wanted]
    where = _catalog_places(version_dir, {k for _, a, b in wanted for k in (a, b)})
    indexes, out = {}, []
    for caption, a, b in wanted:
        members = []
        for key in (a, b):
            split, rel, position = where[key]
            path = layout.shard_file(version_dir, rel)
            if rel not in indexes:
                indexes[rel] = _read_index(path)
            members.append((split, key, _image(_record_at(path, position, indexes[rel]))))
        out.append((caption, *members))
    return out


def _cross_split(version_dir, rel, n, prefix):
    """[(hash distance, caption, key a, key b)] of the pairs across splits in a
    near_duplicates(_rejected) file (the earlier group form: each group's closest pair); all
    of them when n is None."""
    found = []
    text = verify_reads.read_text(layout.join(version_dir, rel), INSPECT_ADVICE)
    for line in text.splitlines():
        if n is not None and len(found) >= n:
            break
        if line.strip():
            g = json.loads(line)
            gone = set(g.get("excluded", ()))
            if "distances" in g:
                across = [(d, f"{d} bits", g["keys"][i], g["keys"][j])
                          for i, j, d in g["distances"]
                          if g["splits"][i] != g["splits"][j]
                          and not {g["keys"][i], g["keys"][j]} & gone]
                if across:
                    found.append(min(across))
            elif g["splits"][0] != g["splits"][1] and not set(g["keys"]) & gone:
                structure = "-" if g["structure"] is None else f"{g['structure']:.2f}"
                found.append((g["hash_distance"],
                              f"{prefix}{g['hash_distance']} bits, s {structure}", *g["keys"]))
    return found

def _catalog_places(version_dir, keys):
    """{key: (split, shard file, position)} of `keys`, from catalog.parquet (its reads
    retried by catalog.iter_tables; an outage says to run inspect_dataset again)."""
    import pyarrow.compute as pc

    places, path = {}, layout.join(version_dir, layout.CATALOG)
    try:
        for table in catalog.iter_tables(path, columns=["key", "split", "file", "position"]):
            rows = table.filter(pc.is_in(table["key"], value_set=pa_array(sorted(keys))))
            for row in rows.to_pylist():
                places[row["key"]] = (row["split"], row["file"], row["position"])
    except transient.StorageUnavailable as e:
        raise transient.unavailable(e.__cause__, path, INSPECT_ADVICE) from e.__cause__
    return places


def pa_array(values):
    import pyarrow as pa

    return pa.array(values, pa.string())


def _image(record):
    from PIL import Image
    from tensorflow.core.example import example_pb2

    feature = example_pb2.Example.FromString(record).features.feature
    return Image.open(io.BytesIO(feature[schema.ENCODED].bytes_list.value[0])).convert("RGB")

