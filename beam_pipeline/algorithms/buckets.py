"""Lines keyed by a dense row number, read back in number order by buckets, not a merge.

A later night's resolved listing holds each image with a stored record under its previous
catalog row number, and the plan reads them in that order (one pass over catalog.parquet).
Row numbers are dense in [0, rows), so a line goes to the file of its number's bucket
(BUCKET_ROWS numbers each) and each bucket is sorted in memory when read: the order a
sorted spill (algorithms/spill.py) keyed by the zero-padded number gives, without its
runs' heap merge. (At 1M lines in shuffled order both cost ~3 s of CPU, adding and reading
back; the merge grows with the runs, 200 at 10M.)
"""

import os
import tempfile

BUCKET_ROWS = 1 << 16  # numbers a bucket holds (~16 MB of resolved lines sorted at once)
PENDING_LINES = 50_000  # lines held before they are appended to their buckets' files


class NumberedSpill:
    """add(number, text) in any order (number >= 0, text without a newline); iterate
    (number, text) back by number, ties by text."""

    def __init__(self, directory=None, bucket_rows=BUCKET_ROWS):
        self.directory = directory or tempfile.gettempdir()
        self.bucket_rows = bucket_rows
        self.pending, self.files, self.held, self.count = {}, {}, 0, 0

    def add(self, number, text):
        bucket = number // self.bucket_rows
        texts = self.pending.get(bucket)
        if texts is None:
            texts = self.pending[bucket] = []
        texts.append(f"{number:012d}\t{text}\n")
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
        self.count += self.held
        self.pending, self.held = {}, 0

    def __len__(self):
        return self.count + self.held

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
        self.files, self.pending, self.held, self.count = {}, {}, 0, 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
