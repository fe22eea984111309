"""Transient or damage: the one classifier of a failed storage read.

A read of the root's own files (LATEST, a manifest, a catalog, a split map, an index) or of
an input can fail two ways, and they call for opposite answers:

* **damage**, proven about the file: it is missing (404, ENOENT), cut short or not what it
  should be (a parse error, a size or checksum mismatch). A build may go around it, loudly,
  naming the file: the next night would find it the same.
* **anything else**: the service or the network (429, 5xx, a reset or timed-out
  connection; EIO, ESTALE, ENOTCONN on a network filesystem) or the credentials (401, 403,
  EACCES on a root's file). None of it says anything about the file, so going around it
  would be wrong for good: a full rebuild, or an image moved to its key's split. It is
  retried with back-off for a bounded time (`RETRY_SECONDS`) and then fails the build:
  StorageUnavailable, exit 1, nothing published, and the next run reads the same files.

gs:// reads are retried inside google-cloud-storage (store/gcs.py: 429, 5xx and resets,
exponential back-off, `READ_DEADLINE`); `retrying` adds the same for local errnos.
"""

import errno
import logging
import random
import time

from beam_pipeline.store import gcs
from dataset_format import storage

# Seconds a local read is retried before the build fails: gs:// reads' deadline
# (IMAGE_TFRECORDS_RETRY_SECONDS in the environment, else google-cloud-storage's 120 s).
RETRY_SECONDS = storage.READ_DEADLINE

# Local errnos that say nothing about the file: I/O, a network filesystem that went away.
TRANSIENT_ERRNOS = frozenset(getattr(errno, name) for name in (
    "EIO", "ENOTCONN", "ESTALE", "ETIMEDOUT", "ECONNRESET", "ECONNABORTED", "ECONNREFUSED",
    "EHOSTDOWN", "EHOSTUNREACH", "ENETDOWN", "ENETUNREACH", "ENETRESET", "EAGAIN", "EINTR",
    "ENOLINK", "ECOMM", "EREMOTEIO", "EBUSY") if hasattr(errno, name))
# ... and that say the build may not read it: not damage either, but not worth a retry.
DENIED_ERRNOS = frozenset((errno.EACCES, errno.EPERM))


class StorageUnavailable(RuntimeError):
    """A read failed for a reason that is not the file's (transient, or denied): the build
    stops (exit 1) rather than treat the file as damaged."""


def causes(error):
    """`error` and its causes (RetryError and Beam wrap theirs), each once."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = getattr(error, "cause", None) or error.__cause__ or error.__context__


def is_transient(error):
    """True when `error` (or its cause) is the service's, the network's or the credentials':
    429, 5xx, a reset or timed-out connection, 401/403; a local EIO, ESTALE, ENOTCONN, ...
    or EACCES. False for everything that may be the file's."""
    if gcs.is_transient(error):
        return True
    for e in causes(error):
        if _denied(e):
            return True
        if isinstance(e, OSError) and not isinstance(e, FileNotFoundError) and (
                e.errno in TRANSIENT_ERRNOS or e.errno in DENIED_ERRNOS):
            return True
    return False


def is_denied(error):
    """A 401/403 or a local EACCES/EPERM in `error`'s chain: the credentials, or the
    permissions, are wrong (not damage; a retry will not fix them either)."""
    return any(_denied(e) or (isinstance(e, OSError) and e.errno in DENIED_ERRNOS)
               for e in causes(error))


def _denied(e):
    """A 401 or 403 from the storage service, or credentials that could not be had (a
    401 makes the client refresh them: RefreshError; anonymous ones raise InvalidOperation,
    a ValueError that says nothing about the file)."""
    from google.api_core import exceptions
    from google.auth import exceptions as auth

    if isinstance(e, (exceptions.Forbidden, exceptions.Unauthorized)):
        return True
    if isinstance(e, auth.GoogleAuthError) and not isinstance(e, auth.TransportError):
        return True
    status = getattr(getattr(e, "response", None), "status_code", None)
    return status in (401, 403)


def is_damage(error):
    """True when `error` proves the file missing or damaged: not found (404, ENOENT), or
    its bytes unparseable (JSON, Parquet, a missing field, a wrong size); never when any
    cause in its chain is transient (is_transient)."""
    if is_transient(error):
        return False
    from google.api_core import exceptions

    for e in causes(error):
        if isinstance(e, (FileNotFoundError, NotADirectoryError, IsADirectoryError,
                          exceptions.NotFound, ValueError, KeyError, TypeError, IndexError,
                          EOFError, UnicodeError)):
            return True  # ValueError covers json's and pyarrow's ArrowInvalid
        if isinstance(e, OSError) and e.errno is None:
            return True  # pyarrow's "file is too small", "not a Parquet file", a cut frame
    return False


BUILD_ADVICE = ("it is not known to be damaged, so nothing is rebuilt around it: nothing "
                "published, run again once storage answers")


def unavailable(error, what, advice=BUILD_ADVICE):
    """StorageUnavailable naming `what`, for a read that failed without proving damage:
    "cannot read WHAT (ErrorType: its text); `advice`"."""
    text = " ".join(f"{type(error).__name__}: {error}".split())[:200]
    return StorageUnavailable(f"cannot read {what} ({text}); {advice}")


def retrying(read, what, seconds=None):
    """`read()`'s answer; a transient local error (EIO, ESTALE, ...) retried with
    exponential back-off for `seconds` (RETRY_SECONDS). Raises the error itself when it is
    damage (the caller goes around it), StorageUnavailable naming `what` otherwise."""
    deadline = time.monotonic() + (RETRY_SECONDS if seconds is None else seconds)
    delay = 0.1
    while True:
        try:
            return read()
        except Exception as e:
            if is_damage(e):
                raise
            if not (is_local_outage(e) and time.monotonic() + delay < deadline):
                raise unavailable(e, what) from e
            logging.warning("%s: %s; retrying in %.1f s", what, e, delay)
            time.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, 10.0)


def is_local_outage(error):
    """A local errno worth retrying, in `error`'s chain: EIO, ESTALE, ENOTCONN, ... (gs://
    reads were retried by their client already). EACCES is not one: on an input it is the
    input's own problem."""
    return any(isinstance(e, OSError) and e.errno in TRANSIENT_ERRNOS for e in causes(error))
