"""Holds: a lease a reading job keeps on the version it reads, so retention keeps that
version (its manifest and every file it names) for as long as the job runs, and no longer
than `seconds` after it stops, however it stops (docs/format.md, "Holds").

`ROOT/holds/VERSION/HOLDER` is one JSON object per holding process: {"version", "holder",
"host", "pid", "seconds", "renewed"}. A daemon thread of the process rewrites it every
`seconds / RENEWALS` (one upload request on gs://, one small file renamed locally), while a
DatasetInfo (or a dataset or loader made from it) that asked for the hold is alive; then,
and at a clean exit, the lease is deleted. A killed process stops renewing: its lease
lapses `seconds` after its last renewal.

Whether a lease is live is judged by the storage's clock alone: the time the storage
stamped on the lease's last write (a gs:// object's `updated`, a local file's mtime)
against the storage's time when retention looks (beam_pipeline/store/protected.py). The
`renewed` field (the holder's clock) is for people. So a holder or a cleaner whose clock is
minutes off neither keeps a lease alive nor lets a live one lapse. Each host, and each
process, holds its own lease: several hosts reading one version never write one object, and
one that dies lets its own lease lapse, not the others'.

Readers and loaders hold a version with `hold=True` (or a lease length in seconds):
`readers.info(ROOT, version=..., hold=True)`, `make_dataset(..., hold=True)`,
`RecordSource(..., hold=True)`.
"""

import atexit
import dataclasses
import datetime
import json
import logging
import os
import re
import socket
import sys
import threading
import uuid
import weakref

from dataset_format import layout, removal, storage

DEFAULT_SECONDS = 600.0  # a lease lapses this long after its last renewal (10 min)
RENEWALS = 4             # renewals per lease length: three may fail in a row before it lapses

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Lease:
    path: str
    version: str
    holder: str
    seconds: float
    written: datetime.datetime  # by the storage's clock

    def live(self, now):
        """Whether the lease still holds its version at `now` (the storage's clock)."""
        return (now - self.written).total_seconds() < self.seconds


def holder_id():
    """This process's name among a version's holders: host, pid and a random part (a pid is
    reused, and two containers share one)."""
    host = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())[:64] or "host"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def body(version, holder, seconds):
    return json.dumps({"version": version, "holder": holder, "host": socket.gethostname(),
                       "pid": os.getpid(), "seconds": float(seconds),
                       "renewed": datetime.datetime.now(datetime.timezone.utc).strftime(
                           "%Y-%m-%dT%H:%M:%SZ")}, sort_keys=True).encode()


def leases(root):
    """Every lease under ROOT/holds/ (one listing, one read a lease). A lease that cannot
    be parsed counts as DEFAULT_SECONDS long: when unsure, keep."""
    found = []
    for path, written in storage.stamped(layout.holds_dir(root)):
        version = version_of_lease(path)
        if version is None:
            continue
        holder = path.rstrip("/").rsplit("/", 1)[1]
        if holder.endswith(".tmp"):  # a local write in progress
            continue
        try:
            seconds = float(json.loads(storage.read_bytes(path))["seconds"])
        except FileNotFoundError:  # released since the listing
            continue
        except (ValueError, KeyError, TypeError):
            seconds = DEFAULT_SECONDS
        found.append(Lease(path, version, holder, seconds, written))
    return found


def version_of_lease(path):
    """The version of a lease path ROOT/holds/VERSION/HOLDER, or None for anything else."""
    parts = str(path).rstrip("/").split("/")
    if len(parts) < 3 or parts[-3] != layout.HOLDS:
        return None
    return parts[-2]


class Hold:
    """This process's lease on one version, renewed by a daemon thread until `release`."""

    def __init__(self, root, version, seconds=DEFAULT_SECONDS):
        if not seconds or seconds <= 0:
            raise ValueError(f"hold: a lease of {seconds!r} seconds; give a positive length")
        self.root, self.version, self.seconds = root, version, float(seconds)
        self.holder = holder_id()
        self.path = layout.join(layout.holds_dir(root, version), self.holder)
        self.renewals = 0
        self._stop, self._pid = threading.Event(), os.getpid()
        self._write()
        # The lease first, then the manifest: retention deletes manifests first and looks
        # at the leases again before it deletes any file (store/retention.py), so a version
        # whose manifest was seen here after the lease was written stays whole.
        vdir = layout.version_dir(root, version)
        if removal.removed(vdir):
            storage.delete(self.path)
            raise removal.error(vdir)
        self._thread = threading.Thread(target=self._renew, daemon=True,
                                        name=f"hold {root} {version}")
        self._thread.start()

    def _write(self):
        try:
            storage.write_bytes(self.path, body(self.version, self.holder, self.seconds))
        except Exception as e:
            raise PermissionError(f"{self.path}: cannot write this reader's hold on version "
                                  f"{self.version} ({' '.join(str(e).split())[:200]}); read "
                                  "without hold=, or with write access to the root") from None
        self.renewals += 1

    def _renew(self):
        while not self._stop.wait(self.seconds / RENEWALS):
            try:
                self._write()
            except Exception as e:  # the next renewal tries again; three may fail
                print(f"WARNING readers: {e}", file=sys.stderr)

    def release(self):
        """Stop renewing and delete the lease (only in the process that took it: a forked
        DataLoader worker inherits the object, not the lease)."""
        if os.getpid() != self._pid or self._stop.is_set():
            return
        self._stop.set()
        try:
            storage.delete(self.path)
        except Exception as e:  # it lapses by itself
            log.warning("could not delete %s (%s); it lapses %g s after its last renewal",
                        self.path, e, self.seconds)


_held, _guard = {}, threading.Lock()  # (root, version) -> [Hold, owners]


def hold(ds_info, seconds=None):
    """Hold the version `ds_info` (a DatasetInfo) reads while it, or a dataset or loader
    made from it, is alive: one lease per process and version, shared by its owners.
    seconds: True / None gives DEFAULT_SECONDS. Raises VersionRemoved when the version is
    gone already, ValueError for a version directory outside a root (a copy: nothing can
    remove it), PermissionError when the lease cannot be written."""
    seconds = DEFAULT_SECONDS if seconds in (None, True) else float(seconds)
    root = layout.root_of(ds_info.version_dir)
    if root is None:
        raise ValueError(f"{ds_info.version_dir}: not a version directory of a dataset root "
                         "(ROOT/versions/V): no retention to hold it against")
    key = (root, ds_info.version)
    with _guard:
        entry = _held.get(key)
        if entry is None or entry[0]._stop.is_set():
            entry = _held[key] = [Hold(root, ds_info.version, seconds), 0]
        entry[1] += 1
        weakref.finalize(ds_info, _drop, key, entry[0])
        return entry[0]


def _drop(key, held):
    with _guard:
        entry = _held.get(key)
        if entry is None or entry[0] is not held:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _held[key]
    held.release()


def held():
    """The holds of this process: {(root, version): Hold}."""
    with _guard:
        return {k: v[0] for k, v in _held.items()}


@atexit.register
def release_all():
    """Delete this process's leases (a clean exit; a killed process's lapse)."""
    with _guard:
        entries = list(_held.values())
        _held.clear()
    for entry in entries:
        entry[0].release()
