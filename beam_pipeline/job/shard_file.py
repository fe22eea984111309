"""One shard's files written together: the TFRecord shard, its `.index` and its catalog
fragment, each complete or absent (store/files.py create_final).

Every way a shard is made ends here: converted images (job/shards.py), records copied by
offset (job/rewrite.py: incremental "copy" tasks, --drop_content_duplicates), and a previous
shard linked as it is (job/reuse.py: then only the index and the fragment are written).
A catalog row gives the index its line, so the two always agree.
"""

import contextlib

import google_crc32c

from beam_pipeline.store import catalog, files
from dataset_format import frames


class ShardFile:
    """with ShardFile(path, fragment, index) as shard: shard.write(...) or
    shard.write_frame(...) per record, then shard.add(row) with the row placing it.

    `path` None: the shard file is in place already (linked); `index` None: no index.
    """

    def __init__(self, path, fragment, index=None, catalog_schema=None):
        self.path, self.fragment_path, self.index_path = path, fragment, index
        self.catalog_schema = catalog_schema  # the fragment's (catalog.schema_of): None, SCHEMA
        self.num_bytes, self.num_examples, self.label_counts = 0, 0, {}

    def __enter__(self):
        with contextlib.ExitStack() as stack:  # nested `with`s: the first opened closes last
            self._frames = None
            if self.path:
                self._frames = stack.enter_context(
                    _FrameBuffer(stack.enter_context(files.create_final(self.path))))
            self._fragment = stack.enter_context(catalog.FragmentWriter(self.fragment_path,
                                                                          self.catalog_schema))
            self._index = stack.enter_context(_IndexWriter(self.index_path))
            self._stack = stack.pop_all()
        return self

    @property
    def crc32c(self):
        """The shard file's CRC-32C as the manifest writes it (frames.crc32c_text)."""
        return frames.crc32c_text(self._frames.crc)

    def write(self, parts, length):
        """Frame a record given as pieces of `length` bytes in all -> the frame's length."""
        written = self._frames.write_frame(parts, length)
        self.num_bytes += written
        return written

    def write_frame(self, frame):
        """An already framed record (copied from another shard) -> its length."""
        self._frames.write_framed(frame)
        self.num_bytes += len(frame)
        return len(frame)

    def add(self, row):
        """The CatalogRow of the record just written (or of a linked shard's record): to the
        fragment, its offset and length to the index, its label to the counts."""
        self._fragment.append(row)
        self._index.add(row.offset, row.length)
        self.num_examples += 1
        self.label_counts[row.label] = self.label_counts.get(row.label, 0) + 1

    def record(self, metadata):
        """Key-value metadata for the fragment's footer (job/attempts.py)."""
        self._fragment.record(metadata)

    def __exit__(self, *exc):
        return self._stack.__exit__(*exc)  # an exception: none of the three appears


class _FrameBuffer:
    """TFRecord frames into the shard file through one fixed buffer, and the file's CRC-32C
    (the manifest's checksum) kept as they go.

    A record arrives in pieces (records.example_parts) and is copied once, into the buffer:
    not joined into a record, then into a frame, then handed to the file (which wrote each
    photo with its own system call). CRC-32C instead of SHA-256 over the file: 3-5 µs per
    40 KB photo against ~30 µs, and what Cloud Storage reports for every object.
    """

    SIZE = 1 << 20

    def __init__(self, out):
        self.out, self.crc, self.used = out, 0, 0
        self.view = memoryview(bytearray(self.SIZE))

    def __enter__(self):
        return self

    def write_frame(self, parts, length):
        """Frame a record given as pieces of `length` bytes in all -> the frame's length."""
        head, tail = frames.frame_ends(parts, length)
        for piece in (head, *parts, tail):
            self._put(piece)
        return len(head) + length + len(tail)

    def write_framed(self, frame):
        self._put(frame)

    def _put(self, piece):
        self.crc = google_crc32c.extend(self.crc, piece)
        n = len(piece)
        if self.used + n > self.SIZE:
            self.flush()
        if n > self.SIZE:
            self.out.write(piece)
        else:
            self.view[self.used:self.used + n] = piece
            self.used += n

    def flush(self):
        if self.used:
            self.out.write(self.view[:self.used])
            self.used = 0

    def __exit__(self, *exc):
        if not exc[0]:
            self.flush()


class _IndexWriter:
    """The DALI / tfrecord-package index beside a shard: "offset length" per record,
    written as the shard is (None: no index)."""

    def __init__(self, path):
        self.path, self.lines = path, []

    def __enter__(self):
        self.opened = files.create_final(self.path) if self.path else None
        self.out = self.opened.__enter__() if self.opened else None
        return self

    def add(self, offset, length):
        if self.out:
            self.lines.append(frames.index_line(offset, length))
            if len(self.lines) >= 4096:
                self.out.write("".join(self.lines).encode())
                self.lines = []

    def __exit__(self, *exc):
        if self.out:
            if not exc[0]:
                self.out.write("".join(self.lines).encode())
            self.opened.__exit__(*exc)  # an exception: no index appears
