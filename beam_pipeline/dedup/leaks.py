"""Near-duplicates at commit: the stored images' perceptual hashes grouped within a Hamming
radius -> near_duplicates.jsonl, and the evaluation images that leak a train image.

Byte hashes (dedup/duplicates.py) miss the copies that inflate test scores most: the same
photo resized, re-compressed, lightly cropped or re-exported. The writer stored two 64-bit
pHashes per image in the catalog (--near_duplicates): of the whole image and of its central
90%, so a crop of up to 10% stays near one of them; this step streams (key, split, phash,
phash_center) from the shards' catalog fragments into the multi-index grouping
(dedup/near_duplicates.py), where a pair's distance is the least of its four hash pairs; it
keeps the hashes in a local file and sorts them a band and value range at a time, so memory
stays flat.

Incremental: rows of reused and copied shards are old; only pairs with a new row are
searched, and the previous version's pairs between rows still unchanged are carried over,
so near_duplicates.jsonl always describes the whole version. A row from a catalog written
before the central hash (phash_center null) is grouped by its whole hash alone: its pairs
with new rows are the least over the hashes both have.

A leak is an evaluation-split member of a group with a train member. With
--drop_near_duplicate_leaks they leave their shards (frames copied, nothing decoded, as
--drop_content_duplicates does) and count as `leaks` in the accounting; a train image never
leaves, so with sticky splits no near-copy of a train image enters evaluation later.
"""

import tempfile

from apache_beam.io.filesystems import FileSystems

from beam_pipeline.store import catalog, files
from beam_pipeline.dedup import near_duplicates as grouping
from dataset_format import layout

NEAR_DUPLICATES = "near_duplicates.jsonl"
HASH = "phash64x2"  # dedup/perceptual.phash_pair: 64-bit pHashes of the whole and central 90%
TRAIN = "train"
OLD_KINDS = ("reuse", "copy")  # incremental shards whose rows the previous version grouped


def report(results, spec):
    """ShardResults (cataloged, in order) -> (manifest entry, {shard file: positions to drop}).

    Writes VDIR/near_duplicates.jsonl. Positions are collected only with
    spec.drop_near_duplicate_leaks.
    """
    known = _previous_pairs(spec)
    incremental = known is not None
    groups = grouping.find_groups(_rows(results, incremental), spec.near_duplicate_radius,
                                  known_pairs=known or ())  # its own scratch directory
    leaks = {k for g in groups for k in g.leaks(TRAIN)}
    excluded = leaks if spec.drop_near_duplicate_leaks else set()
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl") as out:
        for g in groups:
            out.write(g.to_json(excluded=[k for k in g.keys if k in excluded]) + "\n")
        out.flush()
        files.copy_local_file(out.name, layout.join(spec.vdir, NEAR_DUPLICATES))
    entry = {"path": NEAR_DUPLICATES, "hash": HASH, "radius": spec.near_duplicate_radius,
             "groups": len(groups), "groups_across_splits": sum(g.spans_splits for g in groups),
             "images": sum(len(g.keys) for g in groups), "leaks": len(leaks),
             "excluded": len(excluded), "incremental": incremental}
    return entry, _positions(results, excluded)


_ROW_COLUMNS = ["key", "split", "phash", "phash_center"]  # the catalog columns _rows reads


def _rows(results, incremental):
    """Every stored image with a hash, as a grouping Row (old: grouped by the previous run)."""
    for r in results:
        old = incremental and r.kind in OLD_KINDS
        for table in catalog.iter_tables(r.catalog_temp, columns=_ROW_COLUMNS):
            columns = table.to_pydict()
            for key, split, phash, center in zip(columns["key"], columns["split"],
                                                 columns["phash"], columns["phash_center"]):
                if phash is not None:
                    yield grouping.Row(key, split, phash, old, center)


def _previous_pairs(spec):
    """The previous version's pairs (None when this build is not incremental, or the previous
    version has no near_duplicates.jsonl: then every row is compared with every other)."""
    if not spec.increment:
        return None
    path = layout.join(spec.previous_vdir, NEAR_DUPLICATES)
    if not files.exists(path):
        return None
    with FileSystems.open(path) as f:
        return list(grouping.read_pairs(line.decode() for line in f))


def _positions(results, keys):
    """{shard file: catalog positions} of `keys`, from the fragments of evaluation shards."""
    drop = {}
    if not keys:
        return drop
    for r in results:
        if r.split == TRAIN:
            continue
        for table in catalog.iter_tables(r.catalog_temp, columns=["key", "position"]):
            for row in table.to_pylist():
                if row["key"] in keys:
                    drop.setdefault(r.path, set()).add(row["position"])
    return drop
