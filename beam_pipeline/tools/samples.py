"""Records picked out of a version's shards without a full read, for inspect_dataset.

A record is fetched by (shard, position): seek through the shard's .index file, or scan the
shard up to that position when there is none. Near-duplicate pairs find their members'
places in the catalog.
"""

import heapq
import io
import json
import random

from beam_pipeline.refs import split_order
from beam_pipeline.store import catalog
from beam_pipeline.tools import drawing
from dataset_format import fields, frames, layout, schema


def ordered_splits(manifest):
    return split_order(manifest.get("splits", {}))


def _record_at(gfile, shard_path, position, index):
    """The serialized Example at `position` of a shard: seek via its index, else scan."""
    with gfile.GFile(shard_path, "rb") as f:
        if index is not None:
            offset = index[position][0]
            f.seek(offset)
            return frames.read_frame(f, offset)[0]
        offset = 0
        for _ in range(position):
            offset += frames.read_frame(f, offset, check_crc=False)[1]
        return frames.read_frame(f, offset)[0]


def _read_index(gfile, shard_path):
    path = layout.index_name(shard_path)
    if not gfile.exists(path):
        return None
    with gfile.GFile(path, "r") as f:
        return frames.parse_index(f.read())


def sample(version_dir, manifest, n, split=None, seed=0):
    """Up to `n` records, uniformly over the chosen split(s) (all by default).

    Returns [(split, class name, label id, PIL RGB image)], in sampling order.
    """
    import tensorflow as tf
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
            indexes[rel] = _read_index(tf.io.gfile, path)
        feature = example_pb2.Example.FromString(
            _record_at(tf.io.gfile, path, k, indexes[rel])).features.feature
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
    import tensorflow as tf

    near = manifest.get("near_duplicates")
    if not near or not n:
        return []
    wanted = _cross_split(tf.io.gfile, version_dir, near["path"], n - min(rejected, n // 2),
                          "")
    if near.get("rejected_path"):
        closest = heapq.nsmallest(n - len(wanted), _cross_split(
            tf.io.gfile, version_dir, near["rejected_path"], None, "rejected "))
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
                indexes[rel] = _read_index(tf.io.gfile, path)
            members.append((split, key, _image(_record_at(tf.io.gfile, path, position,
                                                          indexes[rel]))))
        out.append((caption, *members))
    return out


def _cross_split(gfile, version_dir, rel, n, prefix):
    """[(hash distance, caption, key a, key b)] of the pairs across splits in a
    near_duplicates(_rejected) file (the earlier group form: each group's closest pair); all
    of them when n is None."""
    found = []
    with gfile.GFile(layout.join(version_dir, rel), "r") as f:
        for line in f:
            if n is not None and len(found) >= n:
                break
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
    """{key: (split, shard file, position)} of `keys`, from catalog.parquet."""
    import pyarrow.compute as pc

    places = {}
    for table in catalog.iter_tables(layout.join(version_dir, layout.CATALOG)):
        rows = table.filter(pc.is_in(table["key"], value_set=pa_array(sorted(keys))))
        for row in rows.select(["key", "split", "file", "position"]).to_pylist():
            places[row["key"]] = (row["split"], row["file"], row["position"])
    return places


def pa_array(values):
    import pyarrow as pa

    return pa.array(values, pa.string())


def _image(record):
    from PIL import Image
    from tensorflow.core.example import example_pb2

    feature = example_pb2.Example.FromString(record).features.feature
    return Image.open(io.BytesIO(feature[schema.ENCODED].bytes_list.value[0])).convert("RGB")

