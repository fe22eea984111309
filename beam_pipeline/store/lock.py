"""One build per dataset root at a time: a lock with a heartbeat that expires.

ROOT/.lock names the build that holds the root, as one JSON object:
{"host", "pid", "started", "heartbeat", "token", "state": "running" | "submitted", "version"}.

* Local roots (lock_local.py): `fcntl.flock` on ROOT/.lock, held for as long as the launcher
  runs. The kernel drops a flock when its process dies, however it dies (SIGKILL, OOM, power
  loss), so a killed build never blocks the next one and needs no expiry.
* gs:// roots (lock_gcs.py): the object ROOT/.lock, created with `if_generation_match=0`
  (exactly one creator wins). A heartbeat thread rewrites it every HEARTBEAT seconds with
  `if_generation_match=<its generation>`. A lock whose object was last written more than
  TTL seconds ago belonged to a killed build; the next build takes it over with a
  compare-and-swap on that generation, so two builds taking over the same dead lock cannot
  both win. The age is measured on the server's clock alone (the object's `updated` against
  the Date of the server's answer), so a client whose clock runs fast takes over nothing.
* Runners that return once the job is submitted (Dataflow, and the Flex Template launcher,
  which runs the CLI with --template_location and submits the job file it writes): the
  launcher cannot hold the lock for the job, so just before submitting (or writing the job
  file) it hands the lock to the job (state "submitted", the version) and the job's commit
  stage releases it (`release_submitted`, after publishing or after refusing to). The job
  keeps it alive: every worker process that runs the shard writers or the commit beats it
  (`keep_alive`: "job_heartbeat" in the body, at most one write per JOB_HEARTBEAT across
  the job). A handed-off lock no worker has beaten yet expires SUBMITTED_TTL after the
  hand-off (submission and worker start-up); once beaten, JOB_TTL after the job's last
  beat, so a failed or cancelled job (its workers gone) frees the root within minutes.
  A submission that raises releases the lock at once. Local roots are not handed off:
  their lock ends with the launcher, which waits for its job. A classic template
  (--template_location outside the Flex launcher) is refused before any of this.

A build that stalled past TTL may have lost its lock without knowing it: it checks that the
lock is still its own (same token) before it submits the job (`check_held`) and, in the
job's commit stage, before it publishes (`check_token`); if not, LockLost: exit 1, nothing
published.

A second build exits with one line naming the holder (UserError: status 2), or with
`--wait` polls until the root is free. Whatever the lock says, LATEST only moves forward,
by compare-and-swap (versions.py).

The modules: this one is the API callers import (acquire, token, checks, hand-off, the
job's keep-alive); lock_base.py holds the timings, the body and messages, and `RootLock`,
the interface lock_local.py and lock_gcs.py implement. Neither imports this module.
"""

import functools
import logging
import sys
import threading
import time

from beam_pipeline.store import lock_base as base, lock_gcs, lock_local
from beam_pipeline.store.lock_base import (  # noqa: F401 (the API callers import from here)
    LockHeld, LockLost, describe, lock_path)

POLL = 2.0                     # --wait: seconds between looks at a held lock

_local = threading.local()     # locks this thread acquired inside a `release_on_exit` call


def _held_message(root, holder, age):
    """The one line a second build exits with."""
    if holder.get("state") == "submitted":
        expiry = (f"{base.JOB_TTL / 60:g} min after its job's last heartbeat"
                  if holder.get("job_heartbeat") else
                  f"{base.SUBMITTED_TTL / 60:g} min after submission unless its workers start")
        if holder.get("deadline"):
            expiry += f", and at {holder['deadline']} (--max_hours) in any case"
        return (f"{describe(root, holder, age)}; nothing done. Pass --wait to wait, or if that "
                f"job failed delete {lock_path(root)} (it expires {expiry})")
    return f"{describe(root, holder, age)}; nothing done. Pass --wait to wait for it"


# --- the public API -------------------------------------------------------------------------

def _kind(root):
    """The RootLock implementation for ROOT."""
    return lock_gcs.GcsLock if root.startswith("gs://") else lock_local.LocalLock


def acquire(root, wait=False):
    """Take the lock on ROOT for this build, or raise LockHeld (or wait, with `wait`).

    The lock is released when the enclosing `release_on_exit` call returns or raises,
    or explicitly with `.release()`.
    """
    root = root.rstrip("/")
    held, announced = _kind(root)(root), False
    while True:
        holder = held.try_acquire()  # None: ours now; else (holder dict, heartbeat age)
        if holder is None:
            break
        if not wait:
            raise LockHeld(_held_message(root, *holder))
        if not announced:
            print(f"waiting: {describe(root, *holder)}", file=sys.stderr, flush=True)
            announced = True
        time.sleep(POLL)
    held.start_heartbeat()
    registry = getattr(_local, "held", None)
    if registry is not None:  # else acquired outside release_on_exit: the caller releases
        registry.append(held)
    return held


def token(root):
    """The token of the lock this thread holds on ROOT, or None. The job's commit stage
    compares it with ROOT/.lock before publishing (`check_token`)."""
    for held in getattr(_local, "held", []):
        if held.root == root.rstrip("/"):
            return held.token
    return None


def check_held(root):
    """Raise LockLost unless every lock this thread took on ROOT is still its own."""
    for held in getattr(_local, "held", []):
        if held.root == root.rstrip("/"):
            held.check()


def check_token(root, token):
    """Raise LockLost unless ROOT/.lock is still the lock `token` took (None: no lock to
    check, e.g. a commit called directly)."""
    if token is None:
        return
    root = root.rstrip("/")
    holder = _kind(root)(root).holder()
    if (holder or {}).get("token") != token:
        raise LockLost(base.lost_message(root, holder))


def hand_off(root, version, max_seconds=None):
    """Before submitting a job that outlives the launcher: the job's commit releases it.
    With `max_seconds` (--max_hours) the lock also expires that long after the hand-off,
    however its job beats it: a hung job cannot block the next night."""
    for held in getattr(_local, "held", []):
        if held.root == root.rstrip("/"):
            held.hand_off(version, max_seconds)


def release_submitted(root, version):
    """Called by the job's commit stage: release a lock handed to the job that built
    `version`; any other lock (a running launcher's, a newer build's) is left alone."""
    if not root.startswith("gs://"):
        return
    try:
        lock_gcs.GcsLock(root.rstrip("/")).release_if_submitted(version)
    except Exception as e:  # never fail a commit that has published: the lock expires
        logging.warning("could not release %s (%s); it expires %g min after the job's "
                        "last heartbeat", lock_path(root), e, base.JOB_TTL / 60)


def keep_alive(root, version):
    """On the job's workers: beat the lock handed to the job that builds `version`, from a
    daemon thread, for as long as this process lives (one thread per process and version).

    Called from the shard writers' and the commit's setup. The thread stops for good once
    ROOT/.lock is gone (committed) or is anyone else's (another build, or a newer version):
    it never creates a lock. Local roots have no handed-off lock: nothing to do.
    """
    if not root.startswith("gs://"):
        return
    key = (root.rstrip("/"), version)
    with _job_beats_guard:
        beat = _job_beats.get(key)
        if beat is None or not beat.is_alive():
            beat = _job_beats[key] = lock_gcs.JobBeat(*key)
            beat.start()


def stop_keep_alive():
    """Stop this process's job heartbeats (tests: a worker that dies)."""
    with _job_beats_guard:
        beats = list(_job_beats.values())
        _job_beats.clear()
    for beat in beats:
        beat.stop.set()
        beat.join()


_job_beats, _job_beats_guard = {}, threading.Lock()


def release_on_exit(fn):
    """Decorator: every lock `fn` acquires (in this thread) is released when it returns,
    except one handed off to a submitted job, and whenever it raises (a failed submission
    must not leave the root locked for SUBMITTED_TTL)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        outer = getattr(_local, "held", None)
        _local.held, failed = [], True
        try:
            result = fn(*args, **kwargs)
            failed = False
            return result
        finally:
            held, _local.held = _local.held, outer
            for lock in reversed(held):
                lock.release(force=failed)

    return wrapper
