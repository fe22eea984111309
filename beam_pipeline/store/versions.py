"""Versions under a dataset root: ids claimed atomically, LATEST moved forward only, the
versions listed (docs/format.md, "Layout"). What is deleted, and when: store/retention.py.

Writer-side twin of dataset_format.layout, on Beam FileSystems so gs:// works the same.
"""

import datetime
import json
import os
import random
import time
import uuid

from apache_beam.io.filesystems import FileSystems

from beam_pipeline.errors import UserError
from beam_pipeline.store import files, gcs, transient
from dataset_format import layout

def new_version_id(now=None):
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y%m%dT%H%M%SZ")




def check_clock(root, latest_version, now=None):
    """Before any work: a version id from this machine's clock must come after the one
    LATEST names, or the build could never publish (LATEST only moves forward) and would
    fail at its end, as if another build had published meanwhile."""
    ours = new_version_id(now)
    if latest_version and ours < latest_version:
        raise UserError(f"{root}: this machine's clock reads {ours} (UTC), before the latest "
                        f"version, {latest_version}; a version built now could never be "
                        "published (LATEST only moves forward). Set the clock (NTP) and build "
                        "again")


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
    if files.objects(vdir + "/**"):
        return False
    mine = layout.join(layout.tmp_dir(vdir), layout.CLAIM_PREFIX + token)
    files.write_bytes(mine, token.encode())
    if any(p != mine for p in files.objects(layout.join(layout.tmp_dir(vdir), layout.CLAIM_PREFIX + "*"))):
        FileSystems.delete([mine])
        return False
    return True


def latest(root):
    """(version, manifest) that ROOT/LATEST names, or (None, None) for a new root."""
    path = layout.join(root, layout.LATEST)
    if not files.exists(path):
        return None, None
    record = files.read_json(path)
    return record["version"], files.read_json(layout.join(root, record["manifest"]))


def latest_id(root):
    """The version ROOT/LATEST names, or None (one small read, no manifest). A read that
    fails without proving damage raises StorageUnavailable naming LATEST
    (transient.retrying)."""
    path = layout.join(root, layout.LATEST)
    data = transient.retrying(lambda: files.read_bytes(path) if files.exists(path) else None,
                              path)
    return None if data is None else _version_in(data)


def _version_in(data):
    """The version a LATEST's bytes name; None when they are damaged (cut short, not JSON):
    the build that found it said so (launcher/history.py), and publishing replaces it."""
    try:
        return json.loads(data)["version"]
    except (ValueError, KeyError, TypeError):
        return None


def list_versions(root, complete=True):
    """{version id: is complete} for every directory under ROOT/versions/ (complete=False:
    {version id: None}, without a look into each).

    Raises when any part of the listing fails: a cleanup that cannot see everything must
    delete nothing (a version it could not look into is not "incomplete").
    """
    prefix = layout.join(root, layout.VERSIONS)
    if "://" not in root:
        found = _list_local_versions(prefix)
        return found if complete else dict.fromkeys(found)
    # One listing page of version "directories", then one metadata read per version: not
    # a listing of every object of every version (a million at 100k shards x 10 versions).
    from google.cloud.storage.retry import DEFAULT_RETRY

    bucket, name = gcs.gcs_blob(prefix + "/")
    pages = gcs.client().list_blobs(bucket.name, prefix=name, delimiter="/",
                                    timeout=gcs.REQUEST_TIMEOUT,
                                    retry=DEFAULT_RETRY.with_deadline(gcs.READ_DEADLINE))
    list(pages)  # raises on failure; fills .prefixes
    found = {}
    for sub in sorted(pages.prefixes):
        found[sub[len(name):].rstrip("/")] = (
            gcs.exists(f"gs://{bucket.name}/{sub}{layout.MANIFEST}") if complete else None)
    return found


RESUME_FROM = 3  # failed runs a build looks into for finished shards (newest first)


def failed_runs(root, latest, own):
    """Unpublished versions newer than `latest` (runs that failed, were cancelled, or were
    killed since), newest first, but `own`: where a build looks for finished shards of the
    same plan (job/attempts.py). A listing that fails is retried while the failure is
    transient, then raises StorageUnavailable: "no failed run" would convert again what one
    finished."""
    where = layout.join(root, layout.VERSIONS)
    try:
        found = transient.retrying(lambda: list_versions(root), where)
    except transient.StorageUnavailable:
        raise
    except Exception as e:  # a listing proves nothing about a version
        raise transient.unavailable(e, where) from e
    return tuple(layout.version_dir(root, v) for v, done in sorted(found.items(), reverse=True)
                 if not done and v != own and (latest is None or v > latest))[:RESUME_FROM]


def _list_local_versions(prefix):
    try:
        entries = sorted(os.scandir(prefix), key=lambda e: e.name)
    except FileNotFoundError:
        return {}
    found = {}
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            continue
        try:  # complete = has a manifest; any error but "no such file" propagates
            os.stat(os.path.join(entry.path, layout.MANIFEST))
            found[entry.name] = True
        except FileNotFoundError:
            found[entry.name] = False
    return found


def publish(root, version):
    """Point LATEST at `version` unless a newer one is already there; returns the version
    LATEST names afterwards (`version`, or the newer one that stays).

    LATEST only moves forward, and atomically: on gs:// by a compare-and-swap on
    LATEST's generation, re-read and retried when another writer got in first; locally
    under an flock on the root directory, through a temp file that is fsynced and renamed
    over LATEST, then the directory fsynced. Publishing the version LATEST already names
    writes nothing, so a retried commit leaves LATEST byte-identical.

    A LATEST that names a version whose manifest is gone (an id from a clock that ran
    ahead, a restore of an older root) is damage, as a cut-short one is: it is replaced,
    not obeyed, or every later build would be refused for good. A publisher writes its
    manifest before LATEST, so a live rival's LATEST always names a complete version.
    """
    if root.startswith("gs://"):
        return _publish_gcs(root, version)
    return _publish_local(root, version)


def _gone(root, version):
    """Whether `version` has no manifest: proven, a failed read raises (store/transient.py)."""
    path = layout.join(layout.version_dir(root, version), layout.MANIFEST)
    return not transient.retrying(lambda: files.exists(path), path)


def _publish_local(root, version):
    import fcntl

    path = layout.join(root, layout.LATEST)
    fd = os.open(root, os.O_RDONLY)  # the directory's flock serializes read-compare-rename
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        current = _version_in(files.read_bytes(path)) if os.path.exists(path) else None
        if current is not None and (current == version or (
                current > version and not _gone(root, current))):
            return current
        files.replace_local(path, json.dumps(layout.latest_record(version)).encode())
        return version
    finally:
        os.close(fd)  # drops the flock


def _publish_gcs(root, version, attempts=50):
    from google.api_core import exceptions
    from google.cloud.storage.retry import DEFAULT_RETRY

    bucket, name = gcs.gcs_blob(layout.join(root, layout.LATEST))
    record = json.dumps(layout.latest_record(version)).encode()
    for _ in range(attempts):
        data, generation, _ = gcs.read_with_generation(bucket, name)
        current = _version_in(data) if data is not None else None
        if current is not None and (current == version or (
                current > version and not _gone(root, current))):
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
