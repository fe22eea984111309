"""Near-duplicates at commit: the stored images' perceptual hashes joined within a Hamming
radius (candidates), each candidate confirmed or rejected by a second descriptor ->
near_duplicates.jsonl (confirmed pairs) and near_duplicates_rejected.jsonl, and the
evaluation images that leak a train image.

Byte hashes (dedup/duplicates.py) miss the copies that inflate test scores most: the same
photo resized, re-compressed, lightly cropped or re-exported. The writer stores six 64-bit
pHashes per image (--near_duplicates): of the whole image and of its central 90% (catalog
columns phash, phash_center) and of the four 95% corner crops (the first 32 bytes of
near_descriptor), so a crop of up to 10% stays near one of them, and a seventh made here
from the stored thumbnail's central 85%; near_descriptor also holds
what confirms a candidate (dedup/descriptor.py: a 16x16 luma thumbnail and the mean colour).
This step streams (key, split, phash, phash_center, near_descriptor) from the shards' catalog
fragments into the multi-index join (dedup/near_duplicates.py), where a pair's hash distance
is the least of its (up to 49) hash pairs, then compares the candidates' descriptors; memory stays
flat.

Incremental: rows of reused and copied shards are old; only pairs with a new row are
searched, and the previous version's measured pairs between rows still unchanged are
carried over, so the files always describe the whole version: only when that version was
confirmed as this one confirms (the same `CONFIRM` and limits), else every pair is measured
again (and when it proposed them with other hashes: it may have missed pairs between rows
it held). A row without a descriptor (a catalog written before it) can't be confirmed: its
candidates are listed as rejected with that reason, and a --full_rebuild describes them.

A leak is an evaluation image with a confirmed pair with a train image: a pair, never a
chain of pairs. With --drop_near_duplicate_leaks leaks leave their shards (frames copied,
nothing decoded, as --drop_content_duplicates does) and count as `leaks` in the accounting;
a train image never leaves, so with sticky splits no near-copy of a train image enters
evaluation later.
"""

import json
import tempfile

from apache_beam.io.filesystems import FileSystems

from beam_pipeline.dedup import band_plan, descriptor, near_duplicates as grouping
from beam_pipeline.store import catalog, files
from beam_pipeline.kinds import Kind
from dataset_format import layout

HASH = "phash64x6+thumb85"  # 64-bit pHashes: whole, central 90% (perceptual.phash_pair), 4
# corners (descriptor.probes), and one made at commit of the thumbnail's central 85%
# (descriptor.thumbnail_probes); "phash64x6": without that one
CONFIRM = "luma16-chroma/3"  # dedup/descriptor.py: structure (49 windows), colour over the
# lined-up window (the grid); /2: colour of the whole means; /1: 19 windows
TRAIN = "train"
OLD_KINDS = (Kind.REUSE, Kind.COPY)  # incremental shards whose rows the previous version grouped


def report(results, spec):
    """ShardResults (cataloged, in order) -> (manifest entry, {shard file: positions to drop}).

    Writes VDIR/near_duplicates.jsonl and VDIR/near_duplicates_rejected.jsonl. Positions are
    collected only with spec.dedup.drop_near_duplicate_leaks.
    """
    known = _previous_pairs(spec)
    incremental = known is not None
    plans = []  # the search plan: exact to its exact_radius (a multi-probe plan past a budget)
    pairs = grouping.near_pairs(_rows(results, incremental), spec.dedup.near_duplicate_radius,
                                known=known or (), on_plan=plans.append)  # own scratch dir
    radius = spec.dedup.near_duplicate_radius
    exact = plans[0].exact_radius if plans else radius  # no plan: no new rows to search
    found = round(band_plan.found_share(plans[0], radius), 3) if exact < radius else 1.0
    confirmed = [p for p in pairs if p.confirmed]
    leaks = {k for p in confirmed if (k := p.leak(TRAIN)) is not None}
    excluded = leaks if spec.dedup.drop_near_duplicate_leaks else set()
    _write(spec.vdir, layout.NEAR_DUPLICATES,
           (p.to_json(excluded=[k for k in p.keys if k in excluded]) for p in confirmed))
    _write(spec.vdir, layout.NEAR_DUPLICATES_REJECTED,
           (p.to_json() for p in pairs if not p.confirmed))
    groups = grouping.components(confirmed)
    entry = {"path": layout.NEAR_DUPLICATES, "rejected_path": layout.NEAR_DUPLICATES_REJECTED,
             "hash": HASH,
             "confirm": CONFIRM, "radius": radius, "exact_radius": exact,
             "found_at_radius": found,
             **_limits(),
             "candidates": len(pairs), "pairs": len(confirmed),
             "rejected": len(pairs) - len(confirmed),
             "unconfirmable": sum(p.structure is None for p in pairs),
             "pairs_across_splits": sum(p.spans_splits for p in confirmed),
             "components": len(groups), "images": sum(len(g) for g in groups),
             "leaks": len(leaks), "excluded": len(excluded), "incremental": incremental}
    return entry, _positions(results, excluded)


def _write(vdir, name, lines):
    with tempfile.NamedTemporaryFile("w", suffix=layout.JSONL) as out:
        for line in lines:
            out.write(line + "\n")
        out.flush()
        files.copy_local_file(out.name, layout.join(vdir, name))


_ROW_COLUMNS = ["key", "split", "phash", "phash_center", "near_descriptor"]  # what _rows reads


def _rows(results, incremental):
    """Every stored image with a hash, as a grouping Row (old: paired by the previous run)."""
    for r in results:
        old = incremental and r.kind in OLD_KINDS
        for table in catalog.iter_tables(r.files.catalog_temp, columns=_ROW_COLUMNS):
            columns = table.to_pydict()
            for key, split, phash, center, desc in zip(
                    columns["key"], columns["split"], columns["phash"], columns["phash_center"],
                    columns["near_descriptor"]):
                if phash is not None:
                    yield grouping.Row(key, split, phash, old, center, desc)


def _previous_pairs(spec):
    """The previous version's measured pairs, confirmed and rejected (None when this build is
    not incremental, or the previous version has no pairs file of this form: then every row
    is compared with every other)."""
    if not spec.increment or not _confirmed_alike(spec.previous_vdir):
        return None
    found = []
    for name in (layout.NEAR_DUPLICATES, layout.NEAR_DUPLICATES_REJECTED):
        path = layout.join(spec.previous_vdir, name)
        if not files.exists(path):
            return None
        with FileSystems.open(path) as f:
            lines = [line.decode() for line in f]
        if any('"distances"' in line for line in lines):
            return None  # groups from before pairs were confirmed: compare everything again
        found.extend(grouping.read_pairs(lines))
    return found


def confirm_spec():
    """What decides the pairs, as `report` writes it to the manifest: the hashes that propose
    them and what confirms them. A previous version's pairs are this build's only when these
    are equal (with other hashes it may have missed pairs between rows it held)."""
    return {"hash": HASH, "confirm": CONFIRM, **_limits()}


def _limits():
    return {"max_structure": descriptor.MAX_STRUCTURE, "max_chroma": descriptor.MAX_CHROMA,
            "max_mean_chroma": descriptor.MAX_MEAN_CHROMA}


def _confirmed_alike(vdir):
    """Whether the version at `vdir` found and confirmed its pairs as this build does (its
    manifest's near_duplicates entry names the same hashes, comparison and limits)."""
    path = layout.join(vdir, layout.MANIFEST)
    if not files.exists(path):
        return False
    with FileSystems.open(path) as f:
        near = json.loads(f.read().decode()).get("near_duplicates") or {}
    return all(near.get(k) == v for k, v in confirm_spec().items())


def _positions(results, keys):
    """{shard file: catalog positions} of `keys`, from the fragments of evaluation shards."""
    drop = {}
    if not keys:
        return drop
    for r in results:
        if r.split == TRAIN:
            continue
        for table in catalog.iter_tables(r.files.catalog_temp, columns=["key", "position"]):
            for row in table.to_pylist():
                if row["key"] in keys:
                    drop.setdefault(r.files.path, set()).add(row["position"])
    return drop
