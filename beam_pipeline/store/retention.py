"""Retention: what killed runs left behind (`clean_leftovers`, before a build claims its
version) and what no reader or live build can need any more (`prune`, after publishing).

A deleted version keeps the shards that kept versions name (store/shared.py); tagged and
held versions are kept whatever --keep_versions says (store/protected.py).
"""

import datetime
import logging
import os

from apache_beam.io.filesystems import FileSystems

from beam_pipeline import defaults
from beam_pipeline.store import files, lock_base, protected, shared, versions
from dataset_format import layout

KEEP_SUPERSEDED_HOURS = defaults.KEEP_SUPERSEDED_HOURS


def delete_version(root, version, keep=frozenset()):
    """The manifest first, then every file but `keep` (shards kept versions share)."""
    shared.delete_version(root, version, keep)


def clean_leftovers(root, now=None):
    """Before a build claims its version (it holds the root's lock): what killed runs left.

    * A version newer than LATEST with a manifest was never published (a run killed after
      writing manifest.json, before LATEST moved): its manifest is deleted, so it is an
      unpublished run like any failed one, never a complete version taking a
      --keep_versions slot: this build resumes its finished shards (versions.failed_runs)
      and the cleanup after publishing deletes it. Locally all of them (the flock rules out
      a live writer); on gs:// those claimed longer than lock_base.SUBMITTED_TTL ago (a
      build whose lock was taken over may still be running; it cannot publish).
    * LATEST's own .tmp/, left by a run killed after publishing.
    Nothing without a readable LATEST (a new root, or a damaged one: nothing is known to be
    unpublished). Returns the version ids unpublished.
    """
    try:
        latest_version = versions.latest_id(root)
        found = versions.list_versions(root) if latest_version else {}
    except Exception as e:  # an unreadable LATEST: the build says so where it reads it
        logging.warning("leftovers of %s not cleaned: %s", root, " ".join(str(e).split())[:300])
        return []
    if not latest_version:
        return []
    now_id, unpublished = versions.new_version_id(now), []
    for v, done in sorted(found.items()):
        if done and v > latest_version and (
                "://" not in root or _seconds_between(v, now_id) > lock_base.SUBMITTED_TTL):
            manifest = layout.join(layout.version_dir(root, v), layout.MANIFEST)
            if _refused(lambda: FileSystems.delete([manifest]), manifest):
                continue
            unpublished.append(v)
    tmp = layout.join(layout.version_dir(root, latest_version), layout.TMP)
    if "://" in root or os.path.isdir(tmp):
        _refused(lambda: files.delete_tree(tmp), tmp)
    return unpublished


def _refused(delete, what):
    """Run a leftover's delete; a refusal (a retention policy, a 403) is a warning, not a
    failed build: the leftover costs storage, not correctness. True when refused."""
    try:
        delete()
        return False
    except Exception as e:
        logging.warning("leftover %s not deleted (%s); a later build tries again", what,
                        " ".join(str(e).split())[:300])
        return True


def prune(root, published, keep, keep_superseded_hours=KEEP_SUPERSEDED_HOURS, dry_run=False,
          now=None):
    """After `published` was published: delete what no reader or live build can need.

    * Incomplete versions older than `published` that no live build can own. On a local root
      that is all of them (this build holds the root's flock, so no other build runs). On
      gs:// a build whose lock was taken over may still be writing (it will not publish:
      its lock check fails), and a submitted job's lock lives lock_base.SUBMITTED_TTL: only those
      claimed longer than that before `published` are deleted.
    * With `keep` > 0, complete versions beyond the newest `keep` (never `published`), but
      only once superseded (a newer complete version written) more than
      `keep_superseded_hours` ago: a training job may have pinned one just before.
    * Never a tagged version, nor one a live lease holds (store/protected.py); lapsed
      leases are deleted.

    Crash-safe with shared files, in two phases: first the manifests of every version
    dropped (each read first), so from then on no reader or `verify` takes them for
    versions; then the tags and leases are read again, and a dropped version that a lease
    (or tag) written meanwhile protects gets its manifest back whole (a reader writes its
    lease, then looks for the manifest: it saw it only if its lease came before the
    deletion, so this second look sees that lease); only then the files of the dropped
    versions, but every file a version that stays names (store/shared.py). Killed at any
    point, every version that still has a manifest has all its files; what is left over the
    next prune deletes. Any listing error, or a kept manifest, a tag or a lease that cannot
    be read, means delete nothing (logged). A delete that is refused (a bucket retention
    policy, a missing permission) is logged and that version kept: the version that called
    this is published already, and the next build tries again. Returns the deleted version
    ids (with `dry_run`, the ones it would delete, deleting nothing: what a refused delete
    left behind, judged at `now`, by default the time).
    """
    try:
        found = versions.list_versions(root)
    except Exception as e:
        logging.warning("cleanup of %s skipped, nothing deleted: cannot list its versions "
                        "(%s)", root, _line(e))
        return []
    complete = sorted((v for v, done in found.items() if done), reverse=True)
    kept_by_user = protected.NONE
    if keep and len(complete) > keep:  # only then can a version be dropped: look (a listing
        try:  # of tags and one of leases, one read each)
            kept_by_user = protected.read(root)
        except Exception as e:
            logging.warning("cleanup of %s skipped, nothing deleted: cannot read its tags or "
                            "holds (%s)", root, _line(e))
            return []
    now = now or datetime.datetime.now(datetime.timezone.utc)
    drops = {}
    for v, done in sorted(found.items()):
        if done:
            drop = (keep and v != published and v not in complete[:keep]
                    and v not in kept_by_user.versions
                    and _superseded_for(root, v, complete, now) > keep_superseded_hours * 3600)
        else:
            drop = v < published and ("://" not in root or _seconds_between(v, published)
                                       > lock_base.SUBMITTED_TTL)
        if drop:
            drops[v] = done
    try:  # what the versions that stay share: never deleted
        held = shared.referenced(root, [v for v in complete if v not in drops]) if drops else {}
    except Exception as e:
        logging.warning("cleanup of %s skipped, nothing deleted: cannot read the manifest of "
                        "a kept version (%s)", root, _line(e))
        return []
    if dry_run:
        return [v for v, done in drops.items() if done or not held.get(v)]
    if not drops:
        protected.delete_expired(kept_by_user)
        return []
    saved, stays = _retire_manifests(root, drops)
    try:
        stays += _restore_protected(root, saved)
    except Exception as e:  # a manifest not written back: delete no file of any version
        logging.error("cleanup of %s stopped: a version held or tagged meanwhile could not "
                      "get its manifest back (%s)", root, _line(e))
        return []
    for v in stays:
        del drops[v]
    if stays:  # versions that stay after all: what they name stays too
        try:
            for owner, names in shared.referenced(root, stays).items():
                held.setdefault(owner, set()).update(names)
        except Exception as e:  # their manifests are there: the files stay, a later prune
            logging.warning("cleanup of %s stopped after retiring manifests: %s", root,
                            _line(e))  # deletes what none names
            return []
    deleted = []
    for v, done in drops.items():
        keep_files = held.get(v, frozenset())
        if _refused(lambda v=v, k=keep_files: delete_version(root, v, k),
                    f"version {v} of {root}"):
            continue
        if done or not keep_files:  # a retired directory holding shared files is not news
            deleted.append(v)
    protected.delete_expired(kept_by_user)
    return deleted


def _retire_manifests(root, drops):
    """Phase one: delete the manifest of every complete version in `drops`, each read
    first. -> ({version: its manifest's bytes}, [versions whose manifest stays: unreadable
    or its delete refused])."""
    saved, stays = {}, []
    for v, done in sorted(drops.items()):
        if not done:
            continue
        manifest = layout.join(layout.version_dir(root, v), layout.MANIFEST)
        try:
            data = files.read_bytes(manifest)
        except Exception as e:
            logging.warning("version %s of %s kept: cannot read its manifest (%s)", v, root,
                            _line(e))
            stays.append(v)
            continue
        if _refused(lambda m=manifest: files.delete(m), manifest):
            stays.append(v)
            continue
        saved[v] = data
    return saved, stays


def _restore_protected(root, saved):
    """The second look: a dropped version a tag or a live lease now protects (written while
    phase one ran) gets its manifest back, byte for byte. Protections that cannot be read:
    every manifest back (nothing is known to be unprotected). -> the versions restored."""
    if not saved:
        return []
    try:
        now_protected = protected.read(root).versions
    except Exception as e:
        logging.warning("cleanup of %s: cannot read its tags or holds again (%s); the "
                        "versions it retired are restored", root, _line(e))
        now_protected = set(saved)
    restored = sorted(v for v in saved if v in now_protected)
    for v in restored:
        manifest = layout.join(layout.version_dir(root, v), layout.MANIFEST)
        if "://" in root:
            files.write_bytes(manifest, saved[v])
        else:
            files.replace_local(manifest, saved[v])
        logging.info("version %s of %s kept: held or tagged while the cleanup ran", v, root)
    return restored


def _line(e):
    return " ".join(str(e).split())[:300]


def _id_time(version):
    try:
        return datetime.datetime.strptime(version, "%Y%m%dT%H%M%SZ").replace(
            tzinfo=datetime.timezone.utc)
    except ValueError:
        return None


def _seconds_between(older, newer):
    """Seconds from one version id to a later one; -inf when either is not an id (kept)."""
    a, b = _id_time(older), _id_time(newer)
    return (b - a).total_seconds() if a and b else float("-inf")


def _superseded_for(root, version, complete, now):
    """Seconds since the next newer complete version was written (its manifest's
    created_at, else its id); -inf when unknown, so the version is kept."""
    newer = [v for v in complete if v > version]
    if not newer:
        return float("-inf")
    successor = min(newer)
    try:
        created = files.read_json(layout.join(layout.version_dir(root, successor),
                                              layout.MANIFEST)).get("created_at")
        when = (datetime.datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=datetime.timezone.utc) if created else _id_time(successor))
    except Exception:
        return float("-inf")
    return (now - when).total_seconds() if when else float("-inf")
