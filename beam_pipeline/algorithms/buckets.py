"""Sorted streams of lines by buckets known beforehand, each sorted in memory: no k-way merge.

A sorted spill (algorithms/spill.py) pays a heap merge in Python for every line it gives
back: ~200 runs of 50,000 lines at 10M images, ~2 µs a line under cProfile at 3M. A later
night sorted two such streams that need no merge: the resolved images with a stored record
by row number (dense in [0, rows): `NumberedSpill`), and the previous catalog's records by
key (whose ranges a sample of the keys gives: `RangeSpill`). Their lines go to the file of
their bucket as they come, and each bucket is sorted when read back: the same order.
"""

import bisect
import itertools
import os
import tempfile

from beam_pipeline.algorithms.spill import SortedSpill

BUCKET_ROWS = 1 << 16  # lines a bucket holds (~16 MB of resolved lines sorted at once)
PENDING_LINES = 50_000  # lines held before they are appended to their buckets' files


class _Buckets:
    """Texts appended to numbered bucket files, PENDING_LINES held in memory at a time."""

    def __init__(self, directory):
        self.directory = directory or tempfile.gettempdir()
        self.pending, self.files, self.sizes, self.held = {}, {}, {}, 0

    def add(self, bucket, text):
        self.pending.setdefault(bucket, []).append(text)
        self.sizes[bucket] = self.sizes.get(bucket, 0) + 1
        self.held += 1
        if self.held >= PENDING_LINES:
            self.flush()

    def flush(self):
        for bucket, texts in self.pending.items():
            path = self.files.get(bucket)
            if path is None:
                fd, path = tempfile.mkstemp(prefix="bucket-", suffix=".txt", dir=self.directory)
                os.close(fd)
                self.files[bucket] = path
            with open(path, "a", encoding="utf-8") as f:
                f.writelines(texts)
        self.pending, self.held = {}, 0

    def texts(self, bucket):
        """A bucket's texts, from its file then those pending, as an iterator."""
        path = self.files.get(bucket)
        if path is None:
            return iter(self.pending.get(bucket, ()))
        with open(path, encoding="utf-8") as f:
            return itertools.chain(f.readlines(), self.pending.get(bucket, ()))

    def lines(self, bucket):
        """A bucket's texts streamed from its file (for one too large to hold)."""
        path = self.files.get(bucket)
        if path is not None:
            with open(path, encoding="utf-8") as f:
                yield from f
        yield from self.pending.get(bucket, ())

    def order(self):
        return sorted(self.sizes)

    def __len__(self):
        return sum(self.sizes.values())

    def close(self):
        for path in self.files.values():
            try:
                os.remove(path)
            except OSError:
                pass
        self.files, self.pending, self.sizes, self.held = {}, {}, {}, 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class NumberedSpill(_Buckets):
    """add(number, text) in any order (number >= 0, text without a newline); iterate
    (number, text) back by number, ties by text: what a SortedSpill keyed by the number
    zero-padded to 12 digits gives."""

    def __init__(self, directory=None, bucket_rows=BUCKET_ROWS):
        super().__init__(directory)
        self.bucket_rows = bucket_rows

    def add(self, number, text):
        super().add(number // self.bucket_rows, f"{number:012d}\t{text}\n")

    def __iter__(self):
        for bucket in self.order():
            for text in sorted(self.texts(bucket)):
                yield int(text[:12]), text[13:-1]


class RangeSpill(_Buckets):
    """A SortedSpill's texts and order ("sort_key<TAB>line" by the whole text), its lines
    parted by ranges of the text known beforehand (`bounds`: ascending, e.g. a sample of the
    keys): a range is one bucket. A range that drew more than `most` lines (a sample that
    missed a crowd of keys) is sorted on disk by a SortedSpill instead of in memory."""

    def __init__(self, bounds, directory=None, most=4 * BUCKET_ROWS):
        super().__init__(directory)
        self.bounds, self.most = list(bounds), most

    def extend_texts(self, texts):
        """Spilled texts, "sort_key<TAB>line\\n" each (SortedSpill.extend_texts')."""
        for i, text in zip(map(bisect.bisect_right, itertools.repeat(self.bounds), texts),
                           texts):
            self.add(i, text)

    def __iter__(self):
        for bucket in self.order():
            if self.sizes[bucket] <= self.most:
                texts = sorted(self.texts(bucket))
            else:
                texts = _on_disk(self.lines(bucket), self.directory)
            for text in texts:
                sort_key, _, line = text[:-1].partition("\t")
                yield sort_key, line


def _on_disk(texts, directory):
    """Spilled texts -> the same, sorted by a SortedSpill (chunks on disk, merged)."""
    with SortedSpill(directory) as spill:
        for text in texts:
            sort_key, _, line = text[:-1].partition("\t")
            spill.add(sort_key, line)
        for sort_key, line in spill:
            yield f"{sort_key}\t{line}\n"
