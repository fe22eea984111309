"""Lines keyed by a dense row number, read back in number order by buckets, not a merge.

A later night's resolved listing holds each kept image under its previous catalog row
number, and the plan reads them in that order (one pass over catalog.parquet). A sorted
spill (algorithms/spill.py) pays a k-way heap merge in Python for every line: ~200 runs of
50,000 lines at 10M images. Row numbers are dense in [0, rows), so lines go to the file of
their number's bucket instead (BUCKET_ROWS numbers each), and each bucket is sorted in
memory when read: the same order, without the merge.
"""

import os
import tempfile

BUCKET_ROWS = 1 << 16  # numbers a bucket holds (~16 MB of resolved lines read at once)
PENDING_LINES = 50_000  # lines held before they are appended to their buckets' files


class NumberedSpill:
    """add(number, text) in any order (number >= 0, text without a newline); iterate
    (number, text) back by number, ties by text: what a SortedSpill keyed by the number
    zero-padded gives."""

    def __init__(self, directory=None, bucket_rows=BUCKET_ROWS):
        self.directory = directory or tempfile.gettempdir()
        self.bucket_rows = bucket_rows
        self.pending, self.files, self.held, self.count = {}, {}, 0, 0

    def add(self, number, text):
        self.pending.setdefault(number // self.bucket_rows, []).append(
            f"{number:012d}\t{text}\n")
        self.count += 1
        self.held += 1
        if self.held >= PENDING_LINES:
            self._flush()

    def _flush(self):
        for bucket, texts in self.pending.items():
            path = self.files.get(bucket)
            if path is None:
                fd, path = tempfile.mkstemp(prefix="bucket-", suffix=".txt", dir=self.directory)
                os.close(fd)
                self.files[bucket] = path
            with open(path, "a", encoding="utf-8") as f:
                f.writelines(texts)
        self.pending, self.held = {}, 0

    def __len__(self):
        return self.count

    def __iter__(self):
        for bucket in sorted(self.files.keys() | self.pending.keys()):
            texts = self.pending.get(bucket, [])
            path = self.files.get(bucket)
            if path is not None:
                with open(path, encoding="utf-8") as f:
                    texts = f.readlines() + texts
            texts.sort()
            for text in texts:
                yield int(text[:12]), text[13:-1]

    def close(self):
        for path in self.files.values():
            try:
                os.remove(path)
            except OSError:
                pass
        self.files, self.pending, self.held = {}, {}, 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
