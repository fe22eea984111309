"""Versions under a dataset root: ids, LATEST, clean-up and retention (DESIGN §2, issue 5).

Writer-side twin of readers.layout, on Beam FileSystems so gs:// works the same.
"""

import datetime
import hashlib
import json
import os
import random
import time
import uuid

from apache_beam.io.filesystems import FileSystems

from readers import layout


def new_version_id(now=None):
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y%m%dT%H%M%SZ")


CLAIM_PREFIX = "claim-"


def claim_version(root, attempts=20):
    """A new version id whose directory this run alone owns (two runs never share one).

    Ids have one-second resolution, so runs started in the same second would otherwise
    write into the same directory. Local: os.mkdir is atomic. Object stores (no directories,
    no atomic create through FileSystems): write a claim object under the version's .tmp/,
    then list the claims; any other claim means the id is taken and both back off.
    """
    token = uuid.uuid4().hex
    for _ in range(attempts):
        version = new_version_id()
        if _claim(layout.version_dir(root, version), token):
            return version
        time.sleep(random.uniform(0.5, 1.5))  # into a later second; jitter breaks ties
    raise RuntimeError(f"{root}: could not claim a new version id in {attempts} tries")


def _claim(vdir, token):
    if "://" not in vdir:
        os.makedirs(os.path.dirname(vdir), exist_ok=True)
        try:
            os.mkdir(vdir)
            return True
        except FileExistsError:
            return False
    if _objects(vdir + "/**"):
        return False
    mine = layout.join(vdir, ".tmp", CLAIM_PREFIX + token)
    write_bytes(mine, token.encode())
    if any(p != mine for p in _objects(layout.join(vdir, ".tmp", CLAIM_PREFIX + "*"))):
        FileSystems.delete([mine])
        return False
    return True


def _objects(pattern):
    try:
        return [m.path for m in FileSystems.match([pattern])[0].metadata_list]
    except Exception:
        return []


def read_json(path):
    with FileSystems.open(path) as f:
        return json.loads(f.read().decode())


def write_bytes(path, data):
    with FileSystems.create(path) as f:
        f.write(data)


def write_json(path, obj):
    write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


def exists(path):
    return FileSystems.exists(path)


def latest(root):
    """(version, manifest) that ROOT/LATEST names, or (None, None) for a new root."""
    path = layout.join(root, layout.LATEST)
    if not exists(path):
        return None, None
    record = read_json(path)
    return record["version"], read_json(layout.join(root, record["manifest"]))


def list_versions(root):
    """{version id: is complete} for every directory under ROOT/versions/."""
    pattern = layout.join(root, layout.VERSIONS, "*", "**")
    try:
        paths = [m.path for m in FileSystems.match([pattern])[0].metadata_list]
    except Exception:
        paths = []
    prefix = layout.join(root, layout.VERSIONS) + "/"
    found = {}
    for p in paths:
        if not p.startswith(prefix):
            continue
        version, _, rest = p[len(prefix):].partition("/")
        found[version] = found.get(version, False) or rest == layout.MANIFEST
    if "://" not in root and os.path.isdir(prefix):  # a run killed before its first file
        for version in os.listdir(prefix):
            found.setdefault(version, False)
    return found


def delete_version(root, version):
    delete_tree(layout.version_dir(root, version))


def delete_tree(directory):
    """Delete a local directory, or every object under a gs:// prefix; missing is fine."""
    if not directory.startswith("gs://"):
        if FileSystems.exists(directory):
            FileSystems.delete([directory])  # LocalFileSystem removes the whole tree
        return
    try:
        paths = [m.path for m in FileSystems.match([directory + "/**"])[0].metadata_list]
    except Exception:  # nothing matched
        paths = []
    if paths:
        FileSystems.delete(paths)


def fingerprint(refs, config, package_version):
    """sha256 over the listing (uri, size, mtime, label, split) and the build options."""
    h = hashlib.sha256()
    h.update(json.dumps({"config": config, "package": package_version}, sort_keys=True).encode())
    for r in refs:
        h.update(json.dumps([r.uri, r.size, r.mtime, r.label, r.split]).encode())
        h.update(b"\n")
    return "sha256:" + h.hexdigest()


def publish(root, version):
    """Point LATEST at `version` unless a newer one is already there; clean older leftovers.

    Returns the version LATEST names afterwards. The compare-then-write is not atomic on
    object stores; version ids sort by start time, so the window is the rename itself.
    """
    current, _ = latest(root)
    if current is not None and current > version:
        return current
    tmp = layout.join(root, f".{layout.LATEST}.{version}.tmp")
    write_bytes(tmp, json.dumps(layout.latest_record(version)).encode())
    FileSystems.rename([tmp], [layout.join(root, layout.LATEST)])
    return version


def prune(root, published, keep):
    """Delete incomplete versions older than `published`, and complete ones beyond `keep`."""
    deleted = []
    versions = list_versions(root)
    complete = sorted((v for v, done in versions.items() if done), reverse=True)
    for v, done in sorted(versions.items()):
        stale = not done and v < published
        surplus = keep and done and v != published and v not in complete[:keep]
        if stale or surplus:
            delete_version(root, v)
            deleted.append(v)
    return deleted
