"""The lock on a gs:// dataset root: an object written with generation preconditions, whose
age is judged on the server's clock alone. No process holds it, so it expires; the launcher
beats it while it runs, and the workers of a job it was handed to beat it (JobBeat) until
the commit releases it. The protocol: lock.py."""

import datetime
import json
import logging
import random
import socket
import threading
import time
import uuid

from beam_pipeline.store import gcs, lock_base as base


class GcsLock(base.RootLock):
    def __init__(self, root):
        self.root = root
        self.bucket, self.name = gcs.gcs_blob(base.lock_path(root))
        self.token, self.started = uuid.uuid4().hex, base.now()
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
            raise ValueError(f"{base.lock_path(self.root)}: no generation to compare with")
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

    def holder(self):
        return self._read()[0]

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
            raise base.LockLost(base.lost_message(self.root, self._read()[0]))

    def try_acquire(self):
        body = base.body(self.token, self.started)
        if self._write(body, 0):
            return None
        holder, generation, updated = self._read()
        if holder is None:
            return self.try_acquire()  # released just now
        now = gcs.server_time(self.bucket, self.name) if updated is not None else None
        age = (now - updated).total_seconds() if now is not None else None
        expired = age is not None and age > base.ttl(holder)  # a killed build's lock
        if expired or base.past_deadline(holder, now):  # ... or a job past --max_hours
            logging.warning("taking over the expired lock %s: %s%s", base.lock_path(self.root),
                            base.describe(self.root, holder, age),
                            "" if expired else f" (past its deadline {holder['deadline']})")
            if self._write(body, generation):
                return None
            return self.try_acquire()
        return holder, age

    def _beat(self):
        while not self.stop.wait(base.HEARTBEAT):
            try:
                if not self._write(base.body(self.token, self.started), self.generation):
                    self.lost = True
                    logging.error("lost the lock on %s: its heartbeat stalled for over %.0f s "
                                  "and another build took it over", self.root, base.TTL)
                    return
            except Exception as e:  # a heartbeat is retried on the next beat
                logging.warning("lock heartbeat on %s failed: %s", self.root, e)

    def hand_off(self, version, max_seconds=None):
        self.stop.set()
        if self.thread:
            self.thread.join()
        body = base.body(self.token, self.started, state="submitted", version=version)
        if max_seconds:  # on the server's clock, as every expiry here
            now = gcs.server_time(self.bucket, self.name)
            body["deadline"] = base.iso(now + datetime.timedelta(seconds=max_seconds))
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
        age = (base.now() - updated).total_seconds() if updated else None
        if holder.get("job_heartbeat") and age is not None and age < base.JOB_HEARTBEAT:
            return True  # another worker beat it a moment ago
        body = dict(holder, job_heartbeat=base.iso(base.now()), job_worker=socket.gethostname())
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
        raise RuntimeError(f"{base.lock_path(self.root)}: still changing after {attempts} tries")


class JobBeat(threading.Thread):
    """One worker process's heartbeat of the lock its job was handed. Every worker beats,
    but a beat reads the lock and writes it only when no beat was written for
    JOB_HEARTBEAT seconds (one object takes about one write a second): a thousand workers
    still make about one write a minute."""

    def __init__(self, root, version):
        super().__init__(daemon=True, name=f"job-lock-heartbeat {root} {version}")
        self.root, self.version, self.stop = root, version, threading.Event()

    def run(self):
        held, rng = GcsLock(self.root), random.Random()
        while True:
            try:
                if not held.beat_for_job(self.version):
                    return  # committed, or not this job's lock: never again ours
            except Exception as e:  # a failed beat is retried on the next one
                logging.warning("job heartbeat of %s failed: %s", base.lock_path(self.root), e)
            if self.stop.wait(base.JOB_HEARTBEAT * rng.uniform(0.25, 0.5)):
                return

