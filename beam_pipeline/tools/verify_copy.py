"""verify's advice when files are missing: a version read in its root that lost files (a
rebuild with --force repairs it), a copy shipped without the shards it shares with earlier
versions (materialize it where it was built, then copy it again), and a partial copy (copy
it again). Telling them apart needs only where the directory is and which files it lacks.
"""

from beam_pipeline.tools import verify_reads
from dataset_format import dataset_info, layout

REBUILD = ("To repair it, build again with --force (python -m beam_pipeline --input … --output "
           "ROOT --force): a damaged record is converted again from its input (or rejected "
           "when the input is gone), the catalog, index and metadata files are written anew. "
           "Or restore the listed files.")


def advice(vdir, manifest):
    """The one paragraph verify ends a report of problems with. Which files are missing is
    asked through verify_reads, so an outage here stops verify (exit 1), not the advice."""
    info = dataset_info.from_manifest(vdir, manifest)
    shards = [s for split in info.splits.values() for s in split.shards]
    missing = [s for s in shards if not verify_reads.exists(s.path)]
    in_root = layout.root_of(vdir) is not None and verify_reads.exists(
        layout.join(layout.root_of(vdir), layout.LATEST))
    if not missing or in_root:
        return REBUILD
    shared = [s for s in missing if s.name.startswith(layout.SHARED_PREFIX)]
    if shared:
        owners = sorted({layout.shared_parts(s.name)[0] for s in shared})
        return (f"This version directory is a copy without the {len(shared)} shard(s) it "
                f"shares with version(s) {', '.join(owners)} of the root it was built in "
                "(its manifest names them ../VERSION/NAME). Make it self-contained where it "
                f"was built (python -m beam_pipeline.tools.materialize ROOT --version "
                f"{info.version}), then copy the directory again.")
    return (f"This version directory is a partial copy ({len(missing)} of its own shard(s) "
            "missing): copy the whole directory again (cp -r, gsutil -m cp -r) and verify it.")
