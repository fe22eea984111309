"""verify's and inspect_dataset's reads of a version's files (shards, `.index` files,
errors.jsonl, TFDS metadata, near-duplicate pairs), through the project's storage layer
rather than tf.io.gfile: gs:// by the process's one
client (store/gcs.py: 429/5xx and resets retried for READ_DEADLINE), a local EIO or ESTALE
retried as long (store/transient.py). A read that fails without proving damage (a 503 past
the retries, a 401/403, a timeout, EACCES, EIO) raises StorageUnavailable naming the file:
the tool stops with exit 1, "cannot read FILE (...); `advice`", instead of reporting an
outage as the file's damage (verify) or a traceback (inspect_dataset). Missing (404, ENOENT)
and unreadable bytes are the caller's to report.
"""

import os

from beam_pipeline.store import files, gcs, ranges, transient

ADVICE = "it is not known to be damaged: run verify again once storage answers"
INSPECT_ADVICE = "it is not known to be damaged: run inspect_dataset again once storage answers"
CHUNK = 16 << 20  # a shard is read front to back in pieces of this size (one GET each)


def retried(read, path, advice=ADVICE):
    """`read()`'s answer; damage (missing, not parseable) raised as it is; anything else,
    once the retries are spent, StorageUnavailable "cannot read PATH (...); `advice`"."""
    try:
        return transient.retrying(read, path)
    except transient.StorageUnavailable as e:
        raise transient.unavailable(e.__cause__, path, advice) from e.__cause__


def is_missing(error):
    """Not there: a 404 or ENOENT (a damage verify reports as "missing")."""
    from google.api_core import exceptions

    return isinstance(error, (FileNotFoundError, exceptions.NotFound))


def exists(path, advice=ADVICE):
    """Whether the file is there (gs://: one metadata GET); an outage raises, never False."""
    def probe():
        if files.is_gcs(path):
            return gcs.exists(path)
        try:
            os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return False
        return True

    return retried(probe, path, advice)


def read_bytes(path, advice=ADVICE):
    """The whole (small) file; FileNotFoundError when it is not there."""
    return retried(lambda: files.read_bytes(path), path, advice)


def read_text(path, advice=ADVICE):
    return read_bytes(path, advice).decode()


def read_range(path, offset, length, advice=ADVICE):
    """`length` bytes of the file from `offset` (fewer at its end): one ranged GET on gs://."""
    return retried(lambda: ranges.read_range(path, offset, length), path, advice)


class Stream:
    """A file read front to back, `read(n)` as a binary file's, in CHUNK pieces: one ranged
    GET each on gs://, os.pread locally, each retried (`retried`). The first read raises
    FileNotFoundError or NotFound when the file is missing."""

    def __init__(self, path, advice=ADVICE):
        self.path, self.offset, self.piece, self.at, self.ended = path, 0, b"", 0, False
        self.advice = advice

    def _next_piece(self):
        piece = read_range(self.path, self.offset, CHUNK, self.advice)
        self.offset += len(piece)
        self.piece, self.at, self.ended = piece, 0, len(piece) < CHUNK

    def read(self, n):
        out = []
        while n > 0:
            if self.at == len(self.piece):
                if self.ended:
                    break
                self._next_piece()
                continue
            part = self.piece[self.at:self.at + n]
            self.at += len(part)
            n -= len(part)
            out.append(part)
        return b"".join(out)

    def start(self):
        """Read the first piece now: a missing file raises here, before any frame."""
        if not self.piece and not self.ended:
            self._next_piece()
        return self
