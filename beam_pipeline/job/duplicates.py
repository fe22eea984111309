"""Content duplicates: groups of byte-identical stored images, found from the catalog's sha256.

Barz & Denzler (2020) found 3.3% of CIFAR-10's and 10% of CIFAR-100's test images
duplicated in their training sets; a group that spans splits inflates test accuracy.
Runs in the commit stage, over the shards' catalog fragments, sorted by hash on disk so
memory stays flat. With --drop_content_duplicates the copy whose key sorts first stays;
the others leave their shards (frames copied, nothing decoded) and count as duplicates.
"""

import itertools
import json
import tempfile

from beam_pipeline.store import catalog, files
from beam_pipeline.store.spill import SortedSpill
from readers import layout

DUPLICATES = "duplicates.jsonl"


def groups(fragments):
    """Catalog fragments -> each group of rows sharing a sha256 (rows sorted by key)."""
    with tempfile.TemporaryDirectory(prefix="duplicates-") as scratch:
        with SortedSpill(scratch) as by_hash:
            for fragment in fragments:
                for row in catalog.iter_rows(fragment):
                    by_hash.add(f"{row['sha256']} {json.dumps(row['key'])}",
                                json.dumps([row["key"], row["split"], row["file"],
                                            row["position"]]))
            for sha256, run in itertools.groupby(by_hash, key=lambda item: item[0].split()[0]):
                members = [json.loads(line) for _, line in run]
                if len(members) > 1:
                    yield sha256, members


def report(fragments, vdir, collect_extras=False):
    """Write VDIR/duplicates.jsonl -> (manifest entry, {shard file: positions to drop}).

    The extra copies (all but the key that sorts first) are collected only when asked.
    """
    count, across, extras = 0, 0, {}
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl") as out:
        for sha256, members in groups(fragments):
            splits = [m[1] for m in members]
            count += 1
            across += len(set(splits)) > 1
            out.write(json.dumps({"sha256": sha256, "keys": [m[0] for m in members],
                                  "splits": splits}) + "\n")
            for _, _, file, position in members[1:] if collect_extras else ():
                extras.setdefault(file, set()).add(position)
        out.flush()
        files.copy_local_file(out.name, layout.join(vdir, DUPLICATES))
    return {"groups": count, "across_splits": across, "path": DUPLICATES}, extras
