"""One build per dataset root at a time: a lock with a heartbeat that expires.

ROOT/.lock names the build that holds the root, as one JSON object:
{"host", "pid", "started", "heartbeat", "token", "state": "running" | "submitted", "version"}.

* Local roots: `fcntl.flock` on ROOT/.lock, held for as long as the launcher runs. The
  kernel drops a flock when its process dies, however it dies (SIGKILL, OOM, power loss), so
  a killed build never blocks the next one and needs no expiry; the JSON body only names
  the holder for the message, and the file's mtime is its heartbeat.
* gs:// roots: the object ROOT/.lock, created with `if_generation_match=0` (exactly one
  creator wins). A heartbeat thread rewrites it every HEARTBEAT seconds with
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
"""

import datetime
import fcntl
import functools
import json
import logging
import os
import random
import socket
import sys
import threading
import time
import uuid

from beam_pipeline.errors import UserError
from beam_pipeline.store import gcs

LOCK_NAME = ".lock"
HEARTBEAT = 20.0               # seconds between heartbeats of a running build
TTL = 120.0                    # a gs:// lock not refreshed for this long has expired
SUBMITTED_TTL = 3600.0         # a handed-off lock no worker has beaten yet expires after this
JOB_HEARTBEAT = 60.0           # seconds between a running job's beats (any of its workers)
JOB_TTL = 600.0                # a handed-off lock its job stopped beating expires after this
POLL = 2.0                     # --wait: seconds between looks at a held lock

_local = threading.local()     # locks this thread acquired inside a `release_on_exit` call


class LockHeld(UserError):
    """Another build holds the root: one line naming it."""


class LockLost(RuntimeError):
    """This build no longer holds the root's lock (another took it over): it stops before
    submitting or publishing, and publishes nothing."""


def lock_path(root):
    return f"{root.rstrip('/')}/{LOCK_NAME}"


def _now():
    return datetime.datetime.now(datetime.timezone.utc)


def _iso(t):
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _body(token, started, state="running", version=None):
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": _iso(started),
            "heartbeat": _iso(_now()), "token": token, "state": state, "version": version}


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


def ttl(holder):
    """Seconds after its last write that a lock with this body expires."""
    if holder.get("state") != "submitted":
        return TTL
    return JOB_TTL if holder.get("job_heartbeat") else SUBMITTED_TTL


def _held_message(root, holder, age):
    """The one line a second build exits with."""
    if holder.get("state") == "submitted":
        expiry = (f"{JOB_TTL / 60:g} min after its job's last heartbeat"
                  if holder.get("job_heartbeat") else
                  f"{SUBMITTED_TTL / 60:g} min after submission unless its workers start")
        return (f"{describe(root, holder, age)}; nothing done. Pass --wait to wait, or if that "
                f"job failed delete {lock_path(root)} (it expires {expiry})")
    return f"{describe(root, holder, age)}; nothing done. Pass --wait to wait for it"


# --- the public API -------------------------------------------------------------------------

def acquire(root, wait=False):
    """Take the lock on ROOT for this build, or raise LockHeld (or wait, with `wait`).

    The lock is released when the enclosing `release_on_exit` call returns or raises,
    or explicitly with `.release()`.
    """
    root = root.rstrip("/")
    kind = _GcsLock if root.startswith("gs://") else _LocalLock
    held, announced = kind(root), False
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
    holder = (_GcsLock(root)._read()[0] if root.startswith("gs://")
              else _LocalLock(root).body())
    if (holder or {}).get("token") != token:
        raise LockLost(_lost_message(root, holder))


def _lost_message(root, holder):
    now = describe(root, holder, None) if holder else f"{lock_path(root)} is gone"
    return f"lost the lock on {root} ({now}); nothing published"


def hand_off(root, version):
    """Before submitting a job that outlives the launcher: the job's commit releases it."""
    for held in getattr(_local, "held", []):
        if held.root == root.rstrip("/"):
            held.hand_off(version)


def release_submitted(root, version):
    """Called by the job's commit stage: release a lock handed to the job that built
    `version`; any other lock (a running launcher's, a newer build's) is left alone."""
    if not root.startswith("gs://"):
        return
    try:
        _GcsLock(root.rstrip("/")).release_if_submitted(version)
    except Exception as e:  # never fail a commit that has published: the lock expires
        logging.warning("could not release %s (%s); it expires %g min after the job's "
                        "last heartbeat", lock_path(root), e, JOB_TTL / 60)


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
            beat = _job_beats[key] = _JobBeat(*key)
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


class _JobBeat(threading.Thread):
    """One worker process's heartbeat of the lock its job was handed. Every worker beats,
    but a beat reads the lock and writes it only when no beat was written for
    JOB_HEARTBEAT seconds (one object takes about one write a second): a thousand workers
    still make about one write a minute."""

    def __init__(self, root, version):
        super().__init__(daemon=True, name=f"job-lock-heartbeat {root} {version}")
        self.root, self.version, self.stop = root, version, threading.Event()

    def run(self):
        held, rng = _GcsLock(self.root), random.Random()
        while True:
            try:
                if not held.beat_for_job(self.version):
                    return  # committed, or not this job's lock: never again ours
            except Exception as e:  # a failed beat is retried on the next one
                logging.warning("job heartbeat of %s failed: %s", lock_path(self.root), e)
            if self.stop.wait(JOB_HEARTBEAT * rng.uniform(0.25, 0.5)):
                return


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


# --- local: flock ---------------------------------------------------------------------------

class _Heartbeat:
    """A daemon thread that runs the lock's `_beat` until `stop` is set."""

    def start_heartbeat(self):
        self.thread = threading.Thread(target=self._beat, daemon=True,
                                       name=f"lock-heartbeat {self.root}")
        self.thread.start()


class _LocalLock(_Heartbeat):
    def __init__(self, root):
        self.root, self.path = root, lock_path(root)
        self.fd, self.token = None, uuid.uuid4().hex
        self.stop = threading.Event()
        self.thread = None

    def try_acquire(self):
        os.makedirs(self.root, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return self._holder()
        except OSError as e:
            os.close(fd)
            raise UserError(f"{self.path}: cannot lock it ({e.strerror}); this file system "
                            "has no working flock") from e
        try:  # a releasing holder unlinks the file: then this inode is no longer the lock
            current = os.stat(self.path).st_ino
        except FileNotFoundError:
            current = None
        if current != os.fstat(fd).st_ino:
            os.close(fd)
            return self.try_acquire()
        data = (json.dumps(_body(self.token, _now())) + "\n").encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        os.fsync(fd)
        self.fd = fd
        return None

    def _holder(self):
        for _ in range(5):  # the holder may be between truncate and write: look again
            try:
                with open(self.path, "rb") as f:
                    holder = json.loads(f.read())
                return holder, time.time() - os.stat(self.path).st_mtime
            except (OSError, ValueError):
                time.sleep(0.05)
        return {}, None

    def body(self):
        """The lock file's JSON (None when absent or unreadable)."""
        try:
            with open(self.path, "rb") as f:
                return json.loads(f.read())
        except (OSError, ValueError):
            return None

    def check(self):
        if not self._owns_path() or (self.body() or {}).get("token") != self.token:
            raise LockLost(_lost_message(self.root, self.body()))

    def _owns_path(self):
        """Whether ROOT/.lock is still the file this build locked (someone may have
        deleted it, and another build locked a new one)."""
        try:
            return self.fd is not None and os.stat(self.path).st_ino == os.fstat(self.fd).st_ino
        except FileNotFoundError:
            return False

    def _beat(self):
        while not self.stop.wait(HEARTBEAT):
            try:
                os.utime(self.fd)  # mtime = heartbeat, for the waiting build's message
            except OSError:
                pass

    def hand_off(self, version):
        pass  # a flock cannot outlive the launcher; local roots are held while it runs

    def release(self, force=False):
        self.stop.set()
        if self.thread:
            self.thread.join()  # before closing: it touches the fd
        if self.fd is None:
            return
        try:
            if self._owns_path():  # never another build's lock file
                os.unlink(self.path)  # before unlocking: a waiter holding the old inode retries
        except FileNotFoundError:
            pass
        os.close(self.fd)  # drops the flock
        self.fd = None


# --- gs://: an object with generation preconditions -----------------------------------------

class _GcsLock(_Heartbeat):
    def __init__(self, root):
        self.root = root
        self.bucket, self.name = gcs.gcs_blob(lock_path(root))
        self.token, self.started = uuid.uuid4().hex, _now()
        self.generation, self.handed_off, self.lost = None, False, False
        self.stop = threading.Event()
        self.thread = None

    def _write(self, body, if_generation_match):
        """Write the lock body if its generation is still `if_generation_match` (0: absent).
        True when written (or found already written by this build: a retried request whose
        first try succeeded gets 412 for its own write); False when someone else's."""
        from google.api_core import exceptions
        from google.cloud.storage.retry import DEFAULT_RETRY

        if if_generation_match is None:  # would write unconditionally
            raise ValueError(f"{lock_path(self.root)}: no generation to compare with")
        blob = self.bucket.blob(self.name)
        try:
            blob.upload_from_string(json.dumps(body) + "\n", content_type="application/json",
                                    if_generation_match=if_generation_match,
                                    retry=DEFAULT_RETRY)
            self.generation = blob.generation
            return True
        except exceptions.PreconditionFailed:
            current, generation, _ = self._read()
            if (current or {}).get("token") == self.token and current["state"] == body["state"]:
                self.generation = generation
                return True
            return False

    def _read(self):
        """(body, generation, server time of its last write) of the lock object, or
        (None, 0, None)."""
        data, generation, updated = gcs.read_with_generation(self.bucket, self.name, attempts=10)
        if data is None:
            return None, 0, None
        try:
            body = json.loads(data)
        except ValueError:
            body = {}
        return body, generation, updated

    def _age(self, updated):
        """Seconds since `updated`, both on the server's clock (never this machine's)."""
        if updated is None:
            return None
        return (gcs.server_time(self.bucket, self.name) - updated).total_seconds()

    def check(self):
        if not self.lost:
            holder = self._read()[0]
            self.lost = (holder or {}).get("token") != self.token
        if self.lost:
            raise LockLost(_lost_message(self.root, self._read()[0]))

    def try_acquire(self):
        body = _body(self.token, self.started)
        if self._write(body, 0):
            return None
        holder, generation, updated = self._read()
        if holder is None:
            return self.try_acquire()  # released just now
        age = self._age(updated)
        if age is not None and age > ttl(holder):  # a killed build's lock: take it over by CAS
            logging.warning("taking over the expired lock %s: %s", lock_path(self.root),
                            describe(self.root, holder, age))
            if self._write(body, generation):
                return None
            return self.try_acquire()
        return holder, age

    def _beat(self):
        while not self.stop.wait(HEARTBEAT):
            try:
                if not self._write(_body(self.token, self.started), self.generation):
                    self.lost = True
                    logging.error("lost the lock on %s: its heartbeat stalled for over %.0f s "
                                  "and another build took it over", self.root, TTL)
                    return
            except Exception as e:  # a heartbeat is retried on the next beat
                logging.warning("lock heartbeat on %s failed: %s", self.root, e)

    def hand_off(self, version):
        self.stop.set()
        if self.thread:
            self.thread.join()
        body = _body(self.token, self.started, state="submitted", version=version)
        self.handed_off = self._write(body, self.generation)

    def release(self, force=False):
        """Delete the lock if still ours; one handed to a job only with `force`."""
        self.stop.set()
        if self.thread:
            self.thread.join()
        if (self.handed_off and not force) or self.lost or self.generation is None:
            return
        self._delete(self.generation)

    def _delete(self, generation):
        from google.api_core import exceptions
        from google.cloud.storage.retry import DEFAULT_RETRY

        try:
            self.bucket.delete_blob(self.name, if_generation_match=generation,
                                    retry=DEFAULT_RETRY)
        except (exceptions.NotFound, exceptions.PreconditionFailed):
            pass  # already gone (a retried delete), or no longer ours

    def beat_for_job(self, version):
        """One job heartbeat: rewrite the lock handed to `version` by a compare-and-swap on
        the generation just read, if no beat is fresher than JOB_HEARTBEAT. False once the
        lock is gone or not that job's."""
        from google.api_core import exceptions
        from google.cloud.storage.retry import DEFAULT_RETRY

        holder, generation, updated = self._read()
        if not holder or holder.get("state") != "submitted" or holder.get("version") != version:
            return False
        # By this worker's clock: it only decides how often beats are written (expiry is
        # judged on the server's clock).
        age = (_now() - updated).total_seconds() if updated else None
        if holder.get("job_heartbeat") and age is not None and age < JOB_HEARTBEAT:
            return True  # another worker beat it a moment ago
        body = dict(holder, job_heartbeat=_iso(_now()), job_worker=socket.gethostname())
        try:  # a 412: another worker beat first, or the commit deleted it; look next time
            self.bucket.blob(self.name).upload_from_string(
                json.dumps(body) + "\n", content_type="application/json",
                if_generation_match=generation, retry=DEFAULT_RETRY)
        except exceptions.PreconditionFailed:
            pass
        return True

    def release_if_submitted(self, version, attempts=20):
        """Delete the lock handed to `version`; a job heartbeat may rewrite it between the
        read and the delete (412): read again and retry."""
        from google.api_core import exceptions
        from google.cloud.storage.retry import DEFAULT_RETRY

        for _ in range(attempts):
            holder, generation, _ = self._read()
            if not (holder and holder.get("state") == "submitted"
                    and holder.get("version") == version):
                return
            try:
                self.bucket.delete_blob(self.name, if_generation_match=generation,
                                        retry=DEFAULT_RETRY)
                return
            except exceptions.NotFound:
                return  # a retried delete whose first try succeeded
            except exceptions.PreconditionFailed:
                time.sleep(0.1)
        raise RuntimeError(f"{lock_path(self.root)}: still changing after {attempts} tries")
