"""The lock's parts both implementations share (lock_local.py, lock_gcs.py) and the interface
they implement, `RootLock`; lock.py, the API callers import, picks one per root. This module
imports neither, so there is no import circle: lock.py -> lock_local, lock_gcs -> lock_base.

The protocol is lock.py's docstring.
"""

import abc
import datetime
import os
import socket
import threading

from beam_pipeline.errors import UserError
from dataset_format import layout

HEARTBEAT = 20.0               # seconds between heartbeats of a running build
TTL = 120.0                    # a gs:// lock not refreshed for this long has expired
SUBMITTED_TTL = 3600.0         # a handed-off lock no worker has beaten yet expires after this
JOB_HEARTBEAT = 60.0           # seconds between a running job's beats (any of its workers)
JOB_TTL = 600.0                # a handed-off lock its job stopped beating expires after this


class LockHeld(UserError):
    """Another build holds the root: one line naming it."""


class LockLost(RuntimeError):
    """This build no longer holds the root's lock (another took it over): it stops before
    submitting or publishing, and publishes nothing."""


def lock_path(root):
    return layout.lock_file(root)


def now():
    return datetime.datetime.now(datetime.timezone.utc)


def iso(t):
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def body(token, started, state="running", version=None):
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": iso(started),
            "heartbeat": iso(now()), "token": token, "state": state, "version": version}


def describe(root, holder, age):
    """Who holds ROOT and since when, e.g. 'ROOT is being built by host h pid 7 since …'."""
    who = (f"host {holder.get('host', '?')} pid {holder.get('pid', '?')} "
           f"since {holder.get('started', '?')}")
    if holder.get("state") == "submitted":
        beat = (f"; its job's last heartbeat {age:.0f} s ago"
                if holder.get("job_heartbeat") and age is not None else
                "; no job heartbeat yet" if not holder.get("job_heartbeat") else "")
        return (f"{root} is locked by version {holder.get('version')}, submitted to a runner "
                f"by {who} and not committed yet{beat}")
    beat = f"last heartbeat {age:.0f} s ago" if age is not None else "heartbeat unknown"
    return f"{root} is being built by {who} ({beat})"


def past_deadline(holder, now):
    """A handed-off lock whose job ran past --max_hours (`deadline`, server time) has
    expired whatever its beats say."""
    deadline = holder.get("deadline")
    return bool(deadline and now is not None and iso(now) > deadline)


def ttl(holder):
    """Seconds after its last write that a lock with this body expires."""
    if holder.get("state") != "submitted":
        return TTL
    return JOB_TTL if holder.get("job_heartbeat") else SUBMITTED_TTL


def lost_message(root, holder):
    who = describe(root, holder, None) if holder else f"{lock_path(root)} is gone"
    return f"lost the lock on {root} ({who}); nothing published"


class RootLock(abc.ABC):
    """One build's lock on a dataset root (`root`, `token`), however it is held."""

    root: str
    token: str

    @abc.abstractmethod
    def try_acquire(self):
        """Take the lock: None when it is ours now, else (holder body, heartbeat age in
        seconds or None)."""

    @abc.abstractmethod
    def holder(self):
        """The lock's body as stored now (None when there is no lock)."""

    @abc.abstractmethod
    def check(self):
        """Raise LockLost unless the lock is still this build's."""

    @abc.abstractmethod
    def hand_off(self, version, max_seconds=None):
        """Hand the lock to the job that builds `version` (a no-op where it cannot outlive
        the launcher)."""

    @abc.abstractmethod
    def release(self, force=False):
        """Give the lock up if still ours (a handed-off one only with `force`)."""

    @abc.abstractmethod
    def _beat(self):
        """The heartbeat loop, run by start_heartbeat's thread until `stop` is set."""

    def start_heartbeat(self):
        self.thread = threading.Thread(target=self._beat, daemon=True,
                                       name=f"lock-heartbeat {self.root}")
        self.thread.start()
