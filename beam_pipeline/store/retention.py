"""Retention: what killed runs left behind (`clean_leftovers`, before a build claims its
version) and what no reader or live build can need any more (`prune`, after publishing).

A deleted version keeps the shards that kept versions name (store/shared.py).
"""

import datetime
import logging
import os

from apache_beam.io.filesystems import FileSystems

from beam_pipeline import defaults
from beam_pipeline.store import files, lock_base, shared, versions
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

    Deleting a version keeps the shards (and indexes) the versions that stay name
    (store/shared.py): its manifest goes first, then every file none of them names; the
    named ones go when the last version naming them does. Any listing error, or a kept
    manifest that cannot be read, means delete nothing (logged). A delete that is refused (a bucket
    retention policy, a missing permission) is logged and the next version tried: the
    version that called this is published already, and the next build tries again.
    Returns the deleted version ids (with `dry_run`, the ones it would delete, deleting
    nothing: what a refused delete left behind, judged at `now`, by default the time).
    """
    try:
        found = versions.list_versions(root)
    except Exception as e:
        logging.warning("cleanup of %s skipped, nothing deleted: cannot list its versions "
                        "(%s)", root, " ".join(str(e).split())[:300])
        return []
    complete = sorted((v for v, done in found.items() if done), reverse=True)
    now = now or datetime.datetime.now(datetime.timezone.utc)
    drops = {}
    for v, done in sorted(found.items()):
        if done:
            drop = (keep and v != published and v not in complete[:keep]
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
                        "a kept version (%s)", root, " ".join(str(e).split())[:300])
        return []
    deleted = []
    for v, done in drops.items():
        keep_files = held.get(v, frozenset())
        if not dry_run and _refused(lambda v=v, k=keep_files: delete_version(root, v, k),
                                    f"version {v} of {root}"):
            continue
        if done or not keep_files:  # a retired directory holding shared files is not news
            deleted.append(v)
    return deleted


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
