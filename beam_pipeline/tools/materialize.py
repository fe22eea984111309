"""Put the shards a version shares with earlier ones into its own directory, under the names
TFDS's file template gives them, so `tfds.builder_from_directory(VERSION_DIR)` reads it.

An incremental build names a reused shard where an earlier version wrote it
(`../VERSION/NAME`, docs/format.md) instead of copying it; TFDS reads only files in the
directory it is given. Locally each shard is a hard link (no bytes), on gs:// a server-side
copy: the storage that sharing saves is spent only on the version a TFDS user asks for. The
manifest is left as it is (readers, `verify` and retention follow its paths); the copies are
plain files of the version directory, deleted with it.

    python -m beam_pipeline.tools.materialize ROOT [--version ID]
"""

import argparse
import sys

from beam_pipeline.store import files
from dataset_format import dataset_info, layout


def materialize(path, version=None):
    """-> (version directory, shards placed now, shards already there). Raises ValueError
    naming a placed file whose size or CRC-32C is not the manifest's."""
    vdir, manifest = dataset_info.load_manifest(path, version)
    placed = present = 0
    for split, s in sorted(manifest["splits"].items()):
        n = len(s["shards"])
        for i, shard in enumerate(s["shards"]):
            if not shard["path"].startswith(layout.SHARED_PREFIX):
                continue
            source = layout.shard_file(vdir, shard["path"])
            target = layout.join(vdir, layout.shard_name(manifest["name"], split, i, n))
            if files.place_once(source, target):
                placed += 1
            else:
                present += 1
            found = files.size_and_crc32c(target)
            want = (shard["num_bytes"], shard.get("crc32c") or (found or (0, None))[1])
            if found != want:
                raise ValueError(f"{target}: {found} is not the manifest's size and crc32c "
                                 f"{want} (from {source}); delete it and run again")
            if files.exists(layout.index_name(source)):
                files.place_once(layout.index_name(source), layout.index_name(target))
    return vdir, placed, present


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m beam_pipeline.tools.materialize", allow_abbrev=False,
        description="Put the shards a version shares with earlier versions into its own "
                    "directory (hard links locally, server-side copies on gs://), so "
                    "tfds.builder_from_directory reads it.")
    parser.add_argument("path", help="dataset root (follows LATEST) or versions/V directory")
    parser.add_argument("--version", help="a version id under ROOT/versions/ (default: LATEST)")
    args = parser.parse_args(argv)
    try:
        vdir, placed, present = materialize(args.path, args.version)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(f"OK {vdir}: {placed} shared shard(s) placed, {present} already there; "
          f"tfds.builder_from_directory({vdir!r}) reads it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
