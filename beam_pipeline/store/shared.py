"""Shard files shared between versions: which ones a kept version still names, so retention
deletes only what nothing kept references (docs/format.md, format version 3).

A reused shard stays where the version that wrote it put it, and later manifests name it
`../VERSION/NAME`. Deleting a version therefore deletes its manifest first (it is no longer
a version), then every file no kept manifest names; the named shards and their `.index`
files stay in the retired directory until the last version naming them goes.
"""

import logging
import os

from beam_pipeline.store import files
from dataset_format import layout


def referenced(root, kept):
    """{version id: {file names in its directory}} that the manifests of the versions
    `kept` name (shards and their indexes). Raises when a manifest cannot be read: retention
    that cannot see every reference must delete nothing."""
    held = {}
    for version in kept:
        manifest = files.read_json(layout.join(layout.version_dir(root, version),
                                               layout.MANIFEST))
        for split in manifest.get("splits", {}).values():
            for shard in split.get("shards", ()):
                if shard["path"].startswith(layout.SHARED_PREFIX):
                    owner, name = layout.shared_parts(shard["path"])
                    held.setdefault(owner, set()).update((name, layout.index_name(name)))
    return held


def delete_version(root, version, keep=frozenset()):
    """Delete version `version`'s directory but the files named in `keep` (names in it):
    the manifest first, so a run killed part way leaves an incomplete version (the next
    cleanup's), never a manifest whose shards are gone."""
    vdir = layout.version_dir(root, version)
    manifest = layout.join(vdir, layout.MANIFEST)
    if "://" in root:  # listed first: a refused listing (403) leaves the version whole,
        from beam_pipeline.store import gcs_delete  # so the summary still names it as left over

        gcs_delete.delete_prefix(vdir, first=manifest, keep={layout.join(vdir, k) for k in keep})
        return
    if not keep:
        if files.exists(manifest):
            os.remove(manifest)
        files.delete_tree(vdir)
        return
    try:
        entries = sorted(os.scandir(vdir), key=lambda e: e.name != layout.MANIFEST)
    except FileNotFoundError:
        return
    for entry in entries:  # the manifest first
        if entry.name in keep:
            continue
        if entry.is_dir(follow_symlinks=False):
            files.delete_tree(entry.path)
        else:
            os.remove(entry.path)
    logging.info("%s: kept %d shared files", vdir, len(keep))
