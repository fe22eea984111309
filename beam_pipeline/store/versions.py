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
    try:
        with FileSystems.create(path) as f:
            f.write(data)
    except OSError as e:  # e.g. a full disk: say which file (the error alone does not)
        if e.filename or e.errno is None:
            raise
        raise OSError(e.errno, f"cannot write {path}: {e.strerror}") from e


def copy_local_file(local_path, path):
    """Stream a local file to `path` (local or gs://) in 8 MiB pieces."""
    with open(local_path, "rb") as src, FileSystems.create(path) as dst:
        while chunk := src.read(8 << 20):
            dst.write(chunk)


def write_json(path, obj):
    """Write a JSON file whole or not at all (a manifest present means a complete version)."""
    data = (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode()
    if "://" in path:
        write_bytes(path, data)  # an object appears only once its upload completes
    else:
        replace_local(path, data)


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


class Fingerprint:
    """sha256 over the build options and the listing (uri, size, mtime, label, split), fed
    one ref at a time in key order, so the launcher never holds the listing."""

    def __init__(self, config, package_version):
        self.h = hashlib.sha256()
        self.h.update(json.dumps({"config": config, "package": package_version},
                                 sort_keys=True).encode())

    def add(self, r):
        self.h.update(json.dumps([r.uri, r.size, r.mtime, r.label, r.split]).encode())
        self.h.update(b"\n")

    def hexdigest(self):
        return "sha256:" + self.h.hexdigest()


def publish(root, version):
    """Point LATEST at `version` unless a newer one is already there; returns the version
    LATEST names afterwards (`version`, or the newer one that stays).

    LATEST only moves forward, and atomically (issue 13): on gs:// by a compare-and-swap on
    LATEST's generation, re-read and retried when another writer got in first; locally
    under an flock on the root directory, through a temp file that is fsynced and renamed
    over LATEST, then the directory fsynced. Publishing the version LATEST already names
    writes nothing, so a retried commit leaves LATEST byte-identical.
    """
    if root.startswith("gs://"):
        return _publish_gcs(root, version)
    return _publish_local(root, version)


def _publish_local(root, version):
    import fcntl

    path = layout.join(root, layout.LATEST)
    fd = os.open(root, os.O_RDONLY)  # the directory's flock serializes read-compare-rename
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        current = read_json(path)["version"] if os.path.exists(path) else None
        if current is not None and current >= version:
            return current
        replace_local(path, json.dumps(layout.latest_record(version)).encode())
        return version
    finally:
        os.close(fd)  # drops the flock


def replace_local(path, data):
    """Atomically replace a local file: temp file, fsync, rename over `path`, fsync the
    directory. A crash or a full disk leaves the old file (or none), never a torn one."""
    directory, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(directory, f".{name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise OSError(e.errno, f"cannot write {path}: {e.strerror}") from e
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself survives a power cut
    finally:
        os.close(fd)


def _publish_gcs(root, version, attempts=50):
    from google.api_core import exceptions
    from google.cloud.storage.retry import DEFAULT_RETRY

    bucket, name = gcs_blob(layout.join(root, layout.LATEST))
    record = json.dumps(layout.latest_record(version)).encode()
    for _ in range(attempts):
        current, generation = _read_gcs_latest(bucket, name)
        if current is not None and current >= version:
            return current
        try:  # 412 if LATEST changed since it was read (or appeared, for generation 0)
            bucket.blob(name).upload_from_string(
                record, content_type="application/octet-stream",
                if_generation_match=generation, retry=DEFAULT_RETRY)
            return version
        except exceptions.PreconditionFailed:
            # Another publisher got in first, or this request's first try did and its answer
            # was lost: read LATEST again and compare.
            time.sleep(random.uniform(0.05, 0.5))
    raise RuntimeError(f"{root}/{layout.LATEST}: still changing after {attempts} "
                       "compare-and-swap attempts; nothing published")


def _read_gcs_latest(bucket, name):
    """(version LATEST names, its generation), or (None, 0) when there is no LATEST."""
    from google.api_core import exceptions
    from google.cloud.storage.retry import DEFAULT_RETRY

    while True:
        blob = bucket.get_blob(name, retry=DEFAULT_RETRY)
        if blob is None:
            return None, 0
        generation = blob.generation  # (the download resets it from its response headers)
        try:  # that very generation, so the version and the generation belong together
            data = blob.download_as_bytes(if_generation_match=generation, retry=DEFAULT_RETRY)
        except (exceptions.PreconditionFailed, exceptions.NotFound):
            continue
        return json.loads(data)["version"], generation


_gcs_clients = {}


def gcs_blob(uri):
    """gs://bucket/name -> (google-cloud-storage Bucket, object name), through a client made
    the way Beam's gcsio makes its own (same credentials), one per endpoint and process."""
    from apache_beam.io.gcp.gcsio import GcsIO

    endpoint = os.environ.get("STORAGE_EMULATOR_HOST")  # tests switch emulators
    if endpoint not in _gcs_clients:
        _gcs_clients[endpoint] = GcsIO().client
    bucket, _, name = uri[len("gs://"):].partition("/")
    return _gcs_clients[endpoint].bucket(bucket), name


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
