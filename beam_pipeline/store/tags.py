"""Tags written: create, move and delete ROOT/tags/NAME under the root's lock (reading them:
dataset_format/refs.py). The lock keeps a tag from racing a build's retention: a tag
written while a prune ran could name a version whose files that prune deletes.

    from beam_pipeline.store import tags
    tags.create(ROOT, "paper-2026")            # LATEST's version; or tags.create(ROOT, N, V)
    tags.move(ROOT, "paper-2026", V2); tags.delete(ROOT, "paper-2026"); tags.list_tags(ROOT)

Each write replaces the file whole: a temp file fsynced and renamed locally, one upload on
gs:// (as LATEST). A tag names a published version only (one whose manifest is there, not
newer than LATEST's).
"""

import datetime
import os
import socket

from beam_pipeline.errors import UserError
from beam_pipeline.store import files, lock, versions
from dataset_format import layout, refs

list_tags = refs.list_tags


@lock.release_on_exit
def create(root, name, version=None, wait=False, move=False):
    """Tag `version` (a version id or another tag; default LATEST's) `name`. -> the Tag.
    An existing tag is a UserError unless `move`; tagging the version it names already
    writes nothing."""
    root = str(root).rstrip("/")
    refs.check_name(name)
    lock.acquire(root, wait=wait)
    target = _published(root, version)
    current = refs.read_tag(root, name)
    if current is not None and current.version == target:
        return current
    if current is not None and not move:
        raise UserError(f"{root}: tag {name!r} names version {current.version} already; "
                        "move it (tag ROOT move NAME VERSION) or delete it first")
    if current is None and move:
        raise UserError(f"{root}: no tag {name!r} to move (tags: "
                        f"{', '.join(sorted(refs.list_tags(root))) or 'none'})")
    by = f"{socket.gethostname()} pid {os.getpid()}"
    created = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    _write(layout.tag_file(root, name), refs.record(name, target, created, by))
    return refs.Tag(name, target, created, by)


def move(root, name, version=None, wait=False):
    """Point the existing tag `name` at `version` (default LATEST's)."""
    return create(root, name, version, wait=wait, move=True)


@lock.release_on_exit
def delete(root, name, wait=False):
    """Delete the tag `name`; the version it named is kept again only as long as
    --keep_versions (or another tag, or a hold) says. -> the Tag deleted."""
    root = str(root).rstrip("/")
    refs.check_name(name)
    lock.acquire(root, wait=wait)
    current = refs.read_tag(root, name)
    if current is None:
        raise UserError(f"{root}: no tag {name!r} (tags: "
                        f"{', '.join(sorted(refs.list_tags(root))) or 'none'})")
    files.delete(layout.tag_file(root, name))
    return current


def _published(root, ref):
    """The published version `ref` names (None: LATEST's), or a UserError saying why not."""
    latest = versions.latest_id(root)
    if latest is None:
        raise UserError(f"{root}: no published version (no {layout.LATEST}) to tag")
    try:
        version = latest if ref is None else refs.version_of(root, ref)
    except (FileNotFoundError, ValueError) as e:
        raise UserError(str(e)) from None
    if version > latest or not files.exists(layout.join(layout.version_dir(root, version),
                                                        layout.MANIFEST)):
        raise UserError(f"{root}: version {version} is not a published version (no "
                        f"{layout.MANIFEST}, or newer than {layout.LATEST}'s {latest})")
    return version


def _write(path, data):
    if "://" in path:
        files.write_bytes(path, data)  # an object is replaced whole
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    files.replace_local(path, data)
