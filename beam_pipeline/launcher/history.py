"""What a build starts from: the version it builds on and the root's split map, found even
when the root is damaged.

    LATEST -> its manifest -> its catalog (records to reuse) and its split map
A damaged link is one line naming the file and the way out, and the build goes on from
the newest intact version: a missing or unreadable LATEST or manifest (or a LATEST naming
a version that is gone) -> the newest complete version; an unreadable catalog -> nothing
reused (every image converted again); an unreadable split map -> the newest intact
version's map, said so. It never resplits silently: with versions but no intact map
anywhere it stops and names --resplit.

Only proven damage is gone around (store/transient.py): a read that fails for any other
reason (a 503 past the retries, a timeout, a 403, EIO) raises StorageUnavailable and the
build stops, exit 1: going around a file that is only out of reach tonight would rebuild
every image, or move one to another split, for good.
"""

import dataclasses
from typing import Optional

from beam_pipeline.errors import UserError
from beam_pipeline.store import (catalog, files, split_map as split_maps, split_map_file,
                                 transient, versions)
from dataset_format import layout
from dataset_format.dataset_info import DatasetInfo, from_manifest


@dataclasses.dataclass(frozen=True)
class History:
    version: Optional[str] = None          # the version this build builds on
    manifest: Optional[DatasetInfo] = None  # ... its manifest, typed
    catalog: Optional[str] = None          # ... its catalog, when intact (reuse, re-framing)
    # split_map_file.StoredMap (read a row group at a time), or a SplitMap (a version's
    # catalog, written before split maps); None: a new root, or --resplit
    split_map: Optional[object] = None
    notes: tuple = ()                      # lines for the user: damage gone around


@dataclasses.dataclass(frozen=True)
class HistoryConfig:
    """What the history stage needs of the build options."""

    root: str              # the dataset root
    resplit: bool = False  # --resplit: start over without a split map


def find(config):
    """HistoryConfig -> History of `config.root` (--resplit: no split map)."""
    root = config.root

    notes = []
    latest, problem = _latest(root)
    complete = _complete_versions(root, versions)
    candidates = ([latest] if latest else []) + [v for v in complete if v != latest]
    version = manifest = None
    for v in candidates:
        manifest, why = _manifest(root, v)
        if manifest is not None:
            version = v
            break
        problem = problem or why
    if problem:
        notes.append(f"{problem}; building on {f'version {version}' if version else 'nothing'}"
                     f" (the newest complete version), and LATEST moves to this build")
    catalog = None
    if manifest and manifest.has_catalog:
        catalog, why = _intact_catalog(root, version, manifest)
        if why:
            notes.append(f"{why}; nothing is reused from version {version}: every image is "
                         "converted again (its splits still hold)")
    smap = None if config.resplit else _split_map(root, candidates, notes)
    return History(version, manifest, catalog, smap, tuple(notes))


def _latest(root):
    """(version LATEST names, None) or (None, the problem with it) or (None, None): no LATEST."""
    path = layout.join(root, layout.LATEST)
    try:
        if not transient.retrying(lambda: files.exists(path), path):
            return None, None
        return transient.retrying(lambda: files.read_json(path), path)["version"], None
    except transient.StorageUnavailable:
        raise
    except Exception as e:  # damage: cut short, not JSON, no "version"
        return None, f"{path}: unreadable ({_short(e)})"


def _complete_versions(root, versions):
    """Complete version ids, newest first; StorageUnavailable when the listing fails (what
    it could not see is not "no versions")."""
    where = layout.join(root, layout.VERSIONS)
    try:
        found = transient.retrying(lambda: versions.list_versions(root), where)
    except transient.StorageUnavailable:
        raise
    except Exception as e:
        raise transient.unavailable(e, where) from e
    return sorted((v for v, done in found.items() if done), reverse=True)


def _manifest(root, version):
    """(DatasetInfo, None) or (None, the problem with the version's manifest)."""
    vdir = layout.version_dir(root, version)
    path = layout.join(vdir, layout.MANIFEST)
    try:
        manifest = transient.retrying(lambda: files.read_json(path), path)
        manifest["splits"], manifest["labels"]  # the fields a build relies on
        return from_manifest(vdir, manifest), None
    except transient.StorageUnavailable:
        raise
    except FileNotFoundError:
        return None, f"{path}: missing (LATEST names version {version})"
    except Exception as e:
        return None, f"{path}: unreadable ({_short(e)})"


def _intact_catalog(root, version, manifest):
    """(catalog path, None) when its footer reads and its rows are the manifest's;
    (None, the problem) otherwise. The footer alone is read (on gs:// by ranged GETs)."""
    path = manifest.catalog
    try:
        rows = catalog.footer(path).num_rows
    except transient.StorageUnavailable:
        raise
    except Exception as e:  # damage: missing, cut short, not Parquet
        return None, f"{path}: {split_maps.describe(e)}"
    if manifest.catalog_rows is not None and rows != manifest.catalog_rows:
        return None, f"{path}: {rows} rows, the manifest says {manifest.catalog_rows}"
    return path, None


def _split_map(root, candidates, notes):
    """The newest intact split map among `candidates` (newest first); a version written
    before split maps has its catalog as its map. None: no version ever had one."""
    problems = []
    for v in candidates:
        vdir = layout.version_dir(root, v)
        manifest, _ = _manifest(root, v)
        if manifest is None:
            continue
        path = layout.join(vdir, layout.SPLIT_MAP)
        try:
            if manifest.has_split_map or transient.retrying(lambda: files.exists(path), path):
                smap = split_map_file.open_stored(path)
            elif manifest.has_catalog:  # a version written before split maps
                smap = split_maps.read_catalog(manifest.catalog)
            else:  # no catalog (--sink beam): no map to read here
                continue
        except split_maps.SplitMapUnreadable as e:
            problems.append(str(e))
            continue
        if problems:
            notes.append(f"{problems[0]}; splits from {smap.source}, the newest intact split "
                         "map")
        return smap
    if problems:
        raise UserError(f"{problems[0]}, and no older version has an intact split map: "
                        "restore that file, or pass --resplit to split every image again")
    return None


def _short(e):
    return " ".join(f"{type(e).__name__}: {e}".split())[:160]
