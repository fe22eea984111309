"""Tags: names a user gives versions of a root, read here by readers, loaders and tools
(docs/format.md, "Tags"); written under the root's lock by beam_pipeline/store/tags.py.

`ROOT/tags/NAME` is one JSON object, LATEST's shape plus who tagged it and when:
{"version", "manifest", "created_at", "by"}. Retention never deletes a tagged version or a
file its manifest names. A tag name never looks like a version id, so wherever a version id
is accepted a tag is too, without ambiguity (`version_of`).
"""

import dataclasses
import json
import posixpath
import re
from typing import Optional

from dataset_format import layout, storage

VERSION_ID = re.compile(r"\d{8}T\d{6}Z")  # versions.new_version_id's form
TAG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclasses.dataclass(frozen=True)
class Tag:
    name: str
    version: str
    created_at: Optional[str] = None
    by: Optional[str] = None


def is_version_id(ref):
    return bool(VERSION_ID.fullmatch(str(ref)))


def check_name(name):
    """ValueError naming `name` unless it can be a tag (a file name that is no version id)."""
    if is_version_id(name):
        raise ValueError(f"tag {name!r}: looks like a version id; a tag needs another name")
    if not TAG_NAME.fullmatch(str(name)) or name.endswith(".tmp"):
        raise ValueError(f"tag {name!r}: use letters, digits, '.', '_' and '-' (128 at most, "
                         "starting with a letter or digit)")
    return name


def record(name, version, created_at, by):
    """The bytes of ROOT/tags/NAME."""
    return json.dumps({"version": version, "manifest": layout.join(
        layout.VERSIONS, version, layout.MANIFEST), "created_at": created_at, "by": by},
        sort_keys=True).encode()


def parse(name, data, where):
    try:
        body = json.loads(data)
        return Tag(name, str(body["version"]), body.get("created_at"), body.get("by"))
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{where}: not a tag (one JSON object with a version)") from None


def read_tag(root, name):
    """The Tag `name` of ROOT, or None when there is none."""
    path = layout.tag_file(root, check_name(name))
    try:
        data = storage.read_bytes(path)
    except FileNotFoundError:
        return None
    return parse(name, data, path)


def list_tags(root):
    """{name: Tag} of every tag of ROOT (one listing, one read a tag)."""
    found = {}
    for path, _ in storage.stamped(layout.join(str(root).rstrip("/"), layout.TAGS)):
        name = posixpath.basename(path)
        if TAG_NAME.fullmatch(name) and not name.endswith(".tmp"):  # not a temp file
            found[name] = parse(name, storage.read_bytes(path), path)
    return found


def tags_of(root, version):
    """The names of ROOT's tags that name `version`, sorted."""
    return sorted(n for n, t in list_tags(root).items() if t.version == version)


def version_of(root, ref):
    """The version id `ref` names under ROOT: itself when it is a version id, else the
    version of the tag `ref`. FileNotFoundError (one line) when there is no such tag."""
    if is_version_id(ref):
        return ref
    tag = read_tag(root, ref)
    if tag is None:
        raise FileNotFoundError(
            f"{root}: no version or tag named {ref!r} (tags are in "
            f"{layout.join(str(root).rstrip('/'), layout.TAGS)}/, versions in "
            f"{layout.join(str(root).rstrip('/'), layout.VERSIONS)}/)")
    return tag.version
