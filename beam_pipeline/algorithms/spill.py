"""External merge sort of text lines on local disk: any number of lines, one chunk in memory.

The launcher must order millions of listed images (by key to find duplicates and
fingerprint, by shard hash to cut shards) without holding them: ~0.9 KB per image in
memory would need 9 GB at 10 M inputs, more than a Flex Template launcher VM has.
"""

import heapq
import os
import tempfile

CHUNK_LINES = 50_000  # ~15 MB of listing lines in memory at a time


class SortedSpill:
    """add(sort_key, line) in any order; iterate (sort_key, line) back in sort order.

    `sort_key` and `line` must hold no tab or newline (JSON text and hex digests don't):
    each spilled line is "sort_key<TAB>line", and tab sorts below every printable
    character, so comparing whole lines orders by sort_key first.
    """

    def __init__(self, directory=None, chunk_lines=CHUNK_LINES):
        self.directory = directory or tempfile.gettempdir()
        self.chunk_lines = chunk_lines
        self.chunk, self.files, self.count = [], [], 0

    def add(self, sort_key, line):
        self.chunk.append(f"{sort_key}\t{line}\n")
        self.count += 1
        if len(self.chunk) >= self.chunk_lines:
            self._spill()

    def extend_texts(self, texts):
        """add() of many lines given as their spilled texts, "sort_key<TAB>line\n" each
        (built column-wise by the caller)."""
        self.chunk += texts
        self.count += len(texts)
        if len(self.chunk) >= self.chunk_lines:
            self._spill()

    def _spill(self):
        self.chunk.sort()
        fd, path = tempfile.mkstemp(prefix="spill-", suffix=".txt", dir=self.directory)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.writelines(self.chunk)
        self.files.append(path)
        self.chunk = []

    def __len__(self):
        return self.count

    def __iter__(self):
        self.chunk.sort()
        handles = [open(p, encoding="utf-8") for p in self.files]
        try:
            for text in heapq.merge(*handles, self.chunk):
                sort_key, _, line = text[:-1].partition("\t")
                yield sort_key, line
        finally:
            for h in handles:
                h.close()

    def close(self):
        for path in self.files:
            try:
                os.remove(path)
            except OSError:
                pass
        self.files, self.chunk = [], []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def join_sorted(a, b):
    """Two (key, value) streams sorted by key, keys unique in each -> (key, a's value or
    None, b's value or None) for every key of either: the merge join the launcher's spills
    are read with (identity: the listing and the previous catalog; resume: the listing and
    failed runs' listings)."""
    a, b = iter(a), iter(b)
    x, y = next(a, None), next(b, None)
    while x is not None or y is not None:
        if y is None or (x is not None and x[0] < y[0]):
            yield x[0], x[1], None
            x = next(a, None)
        elif x is None or y[0] < x[0]:
            yield y[0], None, y[1]
            y = next(b, None)
        else:
            yield x[0], x[1], y[1]
            x, y = next(a, None), next(b, None)
