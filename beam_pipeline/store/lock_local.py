"""The lock on a local dataset root: an flock, which the kernel drops when the launcher dies
(however it dies), so it needs no expiry; the JSON body names the holder for the message of
the build that waits, and the file's mtime is its heartbeat. The protocol: lock.py."""

import fcntl
import json
import os
import threading
import time
import uuid

from beam_pipeline.errors import UserError
from beam_pipeline.store import lock_base as base


class LocalLock(base.RootLock):
    def __init__(self, root):
        self.root, self.path = root, base.lock_path(root)
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
        data = (json.dumps(base.body(self.token, base.now())) + "\n").encode()
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

    def holder(self):
        return self.body()

    def body(self):
        """The lock file's JSON (None when absent or unreadable)."""
        try:
            with open(self.path, "rb") as f:
                return json.loads(f.read())
        except (OSError, ValueError):
            return None

    def check(self):
        if not self._owns_path() or (self.body() or {}).get("token") != self.token:
            raise base.LockLost(base.lost_message(self.root, self.body()))

    def _owns_path(self):
        """Whether ROOT/.lock is still the file this build locked (someone may have
        deleted it, and another build locked a new one)."""
        try:
            return self.fd is not None and os.stat(self.path).st_ino == os.fstat(self.fd).st_ino
        except FileNotFoundError:
            return False

    def _beat(self):
        while not self.stop.wait(base.HEARTBEAT):
            try:
                os.utime(self.fd)  # mtime = heartbeat, for the waiting build's message
            except OSError:
                pass

    def hand_off(self, version, max_seconds=None):
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
