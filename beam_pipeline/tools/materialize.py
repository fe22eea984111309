"""Make a version directory self-contained: the shards it shares with earlier versions put
into it, under the names TFDS's file template gives them, and its manifest (and catalog)
then naming only its own files. So `tfds.builder_from_directory(VERSION_DIR)` reads it, and
a `cp -r` (or `gsutil -m cp -r`) of the directory reads anywhere, away from its root.

An incremental build names a reused shard where an earlier version wrote it
(`../VERSION/NAME`, docs/format.md) instead of copying it. Locally each shard is placed as
a hard link (no bytes), on gs:// as a server-side copy: the storage that sharing saves is
spent only on the version a user asks for. Every placed file is checked against the
manifest's size and CRC-32C before the catalog, then the manifest, are rewritten (each
replaced whole); run again after a kill, it finishes the job. It takes the root's lock,
as a build does (exit 2 naming the build that holds it; --wait waits): a build's retention
must not delete a shared shard between its placing and the manifest's rewriting.

    python -m beam_pipeline.tools.materialize ROOT [--version ID_OR_TAG] [--wait]
"""

import argparse
import dataclasses
import io
import sys

from beam_pipeline.errors import UserError
from beam_pipeline.store import files, lock
from dataset_format import dataset_info, layout


@lock.release_on_exit
def materialize(path, version=None, wait=False):
    """-> (version directory, shards placed now, shards already there). Raises ValueError
    naming a placed file whose size or CRC-32C is not the manifest's, UserError when another
    build holds the root."""
    vdir = dataset_info.resolve(path, version)
    root = layout.root_of(vdir)
    if root is not None:
        lock.acquire(root, wait=wait)
    vdir, manifest = dataset_info.load_manifest(vdir)  # again, under the lock
    placed = present = 0
    renamed = {}
    for split, s in sorted(manifest["splits"].items()):
        n = len(s["shards"])
        for i, shard in enumerate(s["shards"]):
            if not shard["path"].startswith(layout.SHARED_PREFIX):
                continue
            source = layout.shard_file(vdir, shard["path"])
            own = layout.shard_name(manifest["name"], split, i, n)
            target = layout.join(vdir, own)
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
            renamed[shard["path"]] = own
    if renamed:
        _rewrite_catalog(vdir, manifest, renamed)
        manifest = own_files(manifest, renamed)
        files.write_whole(layout.join(vdir, layout.MANIFEST), manifest.to_json().encode())
    return vdir, placed, present


def own_files(manifest, renamed):
    """The Manifest with its shared shards' paths renamed ({old path: own name})."""
    splits = {name: dataclasses.replace(s, shards=tuple(
        dataclasses.replace(sh, path=renamed.get(sh.path, sh.path)) for sh in s.shards))
        for name, s in manifest.splits.items()}
    sections = dict(manifest.sections)
    if "tfds" in sections:
        sections["tfds"] = dict(sections["tfds"], shared_shards=0)
    return dataclasses.replace(manifest, splits=splits, sections=sections)


def _rewrite_catalog(vdir, manifest, renamed):
    """catalog.parquet with each row's `file` renamed as the manifest's shards are: the same
    rows, row groups, schema and metadata, replaced whole."""
    entry = manifest.get("catalog")
    if not entry:
        return
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    path = layout.join(vdir, entry["path"])
    source = pq.ParquetFile(pa.BufferReader(files.read_bytes(path)))
    out = io.BytesIO()
    with pq.ParquetWriter(out, source.schema_arrow) as writer:
        for i in range(source.num_row_groups):
            table = source.read_row_group(i)
            column = table.schema.get_field_index("file")
            old = table.column(column)
            new = pa.array([renamed.get(v, v) for v in old.to_pylist()], old.type)
            if not pc.all(pc.equal(old, new)).as_py():
                table = table.set_column(column, table.schema.field(column), new)
            writer.write_table(table)
    files.write_bytes(path, out.getvalue()) if "://" in path else files.replace_local(
        path, out.getvalue())


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m beam_pipeline.tools.materialize", allow_abbrev=False,
        description="Make a version directory self-contained: put the shards it shares with "
                    "earlier versions into it (hard links locally, server-side copies on "
                    "gs://) and name only its own files in its manifest, so "
                    "tfds.builder_from_directory reads it and a copy of it reads anywhere.")
    parser.add_argument("path", help="dataset root (follows LATEST) or versions/V directory")
    parser.add_argument("--version",
                        help="a version id under ROOT/versions/ or a tag (default: LATEST)")
    parser.add_argument("--wait", action="store_true",
                        help="wait for a build holding the root instead of exiting 2")
    args = parser.parse_args(argv)
    try:
        vdir, placed, present = materialize(args.path, args.version, wait=args.wait)
    except (FileNotFoundError, ValueError, UserError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(f"OK {vdir}: {placed} shared shard(s) placed, {present} already there; its "
          f"manifest names only its own files: tfds.builder_from_directory({vdir!r}) reads "
          "it, and so does a copy of the directory")
    return 0


if __name__ == "__main__":
    sys.exit(main())
