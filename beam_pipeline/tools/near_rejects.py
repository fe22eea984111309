"""The closest near-duplicate candidates a build's descriptor turned down, across splits
(`verify --near_duplicate_rejects N`): a user judges a borderline case by the measure that
rejected it and by how much, and can look at the two images.
"""

from beam_pipeline.dedup import near_duplicates
from beam_pipeline.tools import verify_reads
from dataset_format import layout


def closest(vdir, manifest, n):
    """Lines describing up to `n` rejected cross-split pairs of the version at `vdir`,
    nearest to the build's limits first (near_duplicates.closest_rejected), after a heading;
    one line saying why there are none when the version has no rejected pairs file. The file
    is read through verify_reads: an outage is verify's one line (exit 1), not a traceback."""
    near = manifest.get("near_duplicates") or {}
    rel = near.get("rejected_path")
    if not rel:
        return ["no near-duplicate rejects: this version was built without --near_duplicates "
                "(or before rejected candidates were kept)"]
    # a version from before the colour grid recorded no max_mean_chroma: its pairs are of means
    limits = near.get("max_structure"), near.get("max_chroma"), near.get("max_mean_chroma")
    text = verify_reads.read_text(layout.join(vdir, rel))
    pairs = near_duplicates.closest_rejected(near_duplicates.read_pairs(text.splitlines()), n,
                                             *limits)
    lines = [f"closest rejected cross-split near-duplicate pairs ({len(pairs)} shown, of "
             f"{near.get('rejected', '?')} rejected in {rel}; limits: structure "
             f"{limits[0]}, chroma {limits[1]}"
             f"{f' (of whole means {limits[2]})' if limits[2] else ''}):"]
    for p in pairs:
        measured = ("hash only" if p.structure is None else
                    f"structure {p.structure:g}, chroma {p.chroma:g}, "
                    f"{p.excess(*limits):.2f}x the limit")
        lines.append(f"  {p.keys[0]} ({p.splits[0]}) ~ {p.keys[1]} ({p.splits[1]}): "
                     f"{p.hash_distance} bits, {measured}: {p.reason(*limits)}")
    return lines
