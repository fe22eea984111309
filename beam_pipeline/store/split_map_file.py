"""split_map.parquet read and written in row groups, never held whole.

The launcher and commit once held the whole map (41 bytes a content, plus ~24 for the md5
index, plus commit's sort: ~100 bytes a content at its peak): ~0.6 GB at 10M contents in
the launcher, and the one thing in commit's memory that grew with the inputs. Here:

  * `open_stored(path)` checks every row group (damage found now, not mid-build; a gs:// map is
    copied to local scratch first) and keeps only the split names and each row group's
    last content;
  * `StoredMap.probe(md5s, sizes)` answers the md5 and size questions of the keys a night
    resolves (the new or changed ones) in one pass over the map;
  * `StoredMap.splits_of(items)` looks contents up in digest order, a merge join against
    the map's own order, reading only the row groups the digests fall in;
  * `build(old, contents, path)` writes the next map from sorted runs on local disk: the
    new contents sorted in chunks of RUN_ROWS, merged with the old map's rows, each row
    group written as it fills. The bytes are `split_map.write`'s for the same map: the same
    row groups (pq.write_table's ROW_GROUP rows), each written whole, so memory holds at
    most one row group of the output (41 bytes a content up to ROW_GROUP).
"""

import base64
import io
import itertools
import os
import shutil
import sys
import tempfile
import weakref

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from beam_pipeline.store import catalog, files, split_map, transient

ROW_GROUP = 1024 * 1024  # rows per row group: pq.write_table's default (split_map.write)
RUN_ROWS = 1 << 16       # new contents sorted in memory at a time (~3 MB of records)
BLOCK_ROWS = 1 << 13     # records read from each run or the old map at a time

# One row of a map being built: the digest as two big-endian words (compared as integers),
# its order of arrival (the old map's rows 0, then the catalog's rows), input size, listing
# md5 words (zeros: none known) and split (an index into the build's list of names).
RECORD = np.dtype([("w0", "<u8"), ("w1", "<u8"), ("seq", "<i8"), ("size", "<i8"),
                   ("m0", "<u8"), ("m1", "<u8"), ("name", "u1")])


class StoredMap:
    """A split map on disk (local scratch for a gs:// one), checked whole at open."""

    def __init__(self, source, local, names, rows, lasts, has_md5):
        self.source = source      # the file it was read from (the manifest's "from")
        self.local = local        # where it is read: `source`, or a copy in scratch
        self.names = names        # split names, sorted
        self.rows = rows
        self.lasts, self.groups = lasts  # each row group's last content ("S16",
                                         # ascending), and its number (empty ones left out)
        self.has_md5 = has_md5    # False: a map written before the md5 column

    def __len__(self):
        return self.rows

    def probe(self, md5s, sizes):
        """(listing md5 base64, size) pairs and sizes asked about -> a Probe answering
        them: one pass over the map's size, md5 and split columns."""
        return Probe.of(self, md5s, sizes)

    def splits_of(self, items):
        """(hex input sha256 or None, x) in sha256 order (None first) -> (x, the split the
        content was first published in, or None), reading only the row groups they fall in."""
        with _parquet(self.local) as source:
            group, contents, codes = -1, None, None
            for sha, x in items:
                if not sha:
                    yield x, None
                    continue
                digest = bytes.fromhex(sha[:2 * split_map.DIGEST_BYTES])
                wanted = int(np.searchsorted(self.lasts, np.array(digest, "S16")))
                if wanted >= len(self.lasts):
                    yield x, None
                    continue
                if wanted != group:
                    group = wanted
                    table = source.read_row_group(self.groups[group],
                                                  columns=["content", "split"])
                    contents = _contents(table["content"])
                    codes, _ = _codes(table["split"], self.names)
                i = int(np.searchsorted(contents, np.array(digest, "S16")))
                found = i < len(contents) and contents[i] == digest.rstrip(b"\0")  # as numpy
                # gives an "S16" item: without its trailing zero bytes
                yield x, self.names[codes[i]] if found else None

    def blocks(self, names):
        """The map's rows as RECORD blocks in content order, `names` (a list, extended with
        any name it lacks) indexing their splits."""
        with _parquet(self.local) as source:
            for batch in source.iter_batches(BLOCK_ROWS, columns=_columns(self.has_md5)):
                table = pa.Table.from_batches([batch])
                contents = _contents(table["content"])
                codes, local = _codes(table["split"])
                yield _records(contents, table["size"].to_numpy(), _ranks(local, names)[codes],
                               _md5_words(table) if self.has_md5 else None, seq=None)


class Probe:
    """What a StoredMap says of the md5s and sizes a Probe was made for (asked about anything
    else, it raises: an answer of "not there" would be a silent wrong split)."""

    def __init__(self, md5_splits, sizes, md5_less, asked_sizes, asked_md5s):
        self._md5_splits, self._sizes, self._md5_less = md5_splits, sizes, md5_less
        self._asked_sizes, self._asked_md5s = asked_sizes, asked_md5s

    @classmethod
    def of(cls, smap, md5s, sizes):
        asked_md5s = {(m, int(s)) for m, s in md5s if m}
        asked_sizes = {int(s) for s in sizes} | {s for _, s in asked_md5s}
        want = np.array(sorted(asked_sizes), np.int64)
        keys = {(_md5_key(m), s): (m, s) for m, s in asked_md5s}
        firsts = np.array(sorted({words[0] for words, _ in keys}), np.uint64)
        found, known_sizes, md5_less = {}, set(), set()
        with _parquet(smap.local) as source:
            for batch in source.iter_batches(BLOCK_ROWS,
                                             columns=["size", "split"] + (
                                                 ["md5"] if smap.has_md5 else [])):
                size = batch.column(batch.schema.get_field_index("size")).to_numpy()
                at = np.minimum(np.searchsorted(want, size), max(len(want) - 1, 0))
                hit = want[at] == size if len(want) else np.zeros(len(size), bool)
                if not hit.any():
                    continue
                known_sizes.update(np.unique(size[hit]).tolist())
                table = pa.Table.from_batches([batch])
                words = (_md5_words(table) if smap.has_md5
                         else np.zeros((len(size), 2), np.uint64))
                none = ~words.any(axis=1)
                md5_less.update(np.unique(size[hit & none]).tolist())
                rows = np.flatnonzero(hit & ~none)
                if rows.size and len(firsts):  # only rows whose md5's first word was asked
                    near = np.minimum(np.searchsorted(firsts, words[rows, 0]), len(firsts) - 1)
                    rows = rows[firsts[near] == words[rows, 0]]
                if rows.size:
                    codes, _ = _codes(table["split"], smap.names)
                    for r in rows.tolist():
                        key = ((int(words[r, 0]), int(words[r, 1])), int(size[r]))
                        if key in keys and keys[key] not in found:
                            found[keys[key]] = smap.names[codes[r]]
        return cls(found, known_sizes, md5_less, asked_sizes, asked_md5s)

    def split_of_md5(self, md5, size):
        """SplitMap.split_of_md5, for an md5 and size asked about."""
        if not md5:
            return None
        if (md5, size) not in self._asked_md5s:
            raise KeyError(f"split map probe: md5 {md5} of size {size} was not asked about")
        return self._md5_splits.get((md5, size))

    def has_size(self, size):
        """SplitMap.has_size, for a size asked about."""
        return self._ask(size) in self._sizes

    def has_size_without_md5(self, size):
        """SplitMap.has_size_without_md5, for a size asked about."""
        return self._ask(size) in self._md5_less

    def _ask(self, size):
        if size not in self._asked_sizes:
            raise KeyError(f"split map probe: size {size} was not asked about")
        return size


def open_stored(path):
    """A split_map.parquet -> StoredMap, every row group read once to prove it intact;
    SplitMapUnreadable naming `path` when it is damaged, StorageUnavailable when it could
    not be read (store/transient.py)."""
    local, cleanup = path, None
    try:
        if files.is_gcs(path):
            local = transient.retrying(lambda: _copy_to_scratch(path), path)
            cleanup = local
        smap = transient.retrying(lambda: _checked(path, local), path)  # EIO: retried
    except Exception as e:
        if cleanup:
            _remove(cleanup)
        raise split_map._unreadable(path, e) from e
    if cleanup:
        weakref.finalize(smap, _remove, cleanup)
    return smap


def _checked(source, local):
    """Read every row group's columns as split_map.read does, keeping names and each group's
    last content."""
    names, lasts, groups, rows = set(), [], [], 0
    with _parquet(local) as f:
        has_md5 = "md5" in f.schema_arrow.names
        for g in range(f.num_row_groups):
            last = None
            for batch in f.iter_batches(8 * BLOCK_ROWS, row_groups=[g],
                                        columns=_columns(has_md5)):
                table = pa.Table.from_batches([batch])
                contents = _contents(table["content"])
                _, local_names = _codes(table["split"])
                table["size"].to_numpy()  # decoded only to prove the column intact
                if has_md5:
                    split_map._md5_column(table)
                names.update(local_names)
                rows += len(contents)
                last = contents[-1] if len(contents) else last
            if last is not None:
                lasts.append(last)
                groups.append(g)
    return StoredMap(source, local, tuple(sorted(names)), rows,
                     (np.array(lasts, "S16"), groups), has_md5)


def _copy_to_scratch(path):
    fd, local = tempfile.mkstemp(prefix="split-map-", suffix=".parquet")
    try:
        with os.fdopen(fd, "wb") as out, files.open_seekable(path) as f:
            shutil.copyfileobj(f, out, 8 << 20)
    except BaseException:
        _remove(local)
        raise
    return local


def _remove(path):
    try:
        os.remove(path)
    except OSError:
        pass


class _parquet:
    """A local Parquet file read a page at a time (no whole column chunk buffered)."""

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        self.file = pa.OSFile(self.path)
        return pq.ParquetFile(self.file, buffer_size=1 << 20, pre_buffer=False)

    def __exit__(self, *exc):
        self.file.close()


def _columns(has_md5):
    return ["content", "size", "split"] + (["md5"] if has_md5 else [])


def _contents(column):
    """A content column (fixed binary 16) -> "S16" numpy array (a copy)."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if column.type != pa.binary(split_map.DIGEST_BYTES):
        raise ValueError(f"content column of type {column.type}")
    return np.frombuffer(column.buffers()[1], "S16", count=len(column),
                         offset=column.offset * 16).copy()


def _codes(column, names=None):
    """A split column (dictionary) -> (codes into `names`, or into its own names when
    `names` is None; its own names)."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if isinstance(column, pa.ChunkedArray) or not pa.types.is_dictionary(column.type):
        raise ValueError(f"split column of type {column.type}")
    local = column.dictionary.to_pylist()
    codes = column.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    if names is None:
        return codes, local
    rank = np.array([names.index(n) for n in local] or [0], np.uint8)
    return rank[codes], local


def _md5_words(table):
    md5s = split_map._md5_column(table)
    return md5s.view(">u8").reshape(-1, 2).astype(np.uint64)


def _md5_key(md5):
    q0, q1 = np.frombuffer(base64.b64decode(md5), ">u8")
    return int(q0), int(q1)


def _ranks(local, names):
    """Indices of `local`'s names in `names`, appending the ones it lacks."""
    for n in local:
        if n not in names:
            names.append(n)
    return np.array([names.index(n) for n in local] or [0], np.uint8)


def _records(contents, sizes, names, md5, seq):
    """Columns -> RECORD array; `seq` None: an old map's rows (0), else the first's."""
    out = np.empty(len(contents), RECORD)
    words = contents.view(">u8").reshape(-1, 2)
    out["w0"], out["w1"] = words[:, 0], words[:, 1]
    out["seq"] = 0 if seq is None else np.arange(seq, seq + len(contents))
    out["size"], out["name"] = sizes, names
    if md5 is None:
        out["m0"] = out["m1"] = 0
    else:
        out["m0"], out["m1"] = md5[:, 0], md5[:, 1]
    return out


def _memory_blocks(smap, names):
    """An in-memory SplitMap (a version written before split maps: its catalog) as blocks."""
    ranks = _ranks(list(smap.names), names)
    md5 = smap.md5_words()
    for i in range(0, len(smap), BLOCK_ROWS):
        j = i + BLOCK_ROWS
        yield _records(smap.contents[i:j], smap.sizes[i:j], ranks[smap.codes[i:j]], md5[i:j],
                       seq=None)


# --- build ----------------------------------------------------------------------------------

def build(old, contents_path, path, directory=None):
    """`old` (a StoredMap, an in-memory SplitMap or None) plus the contents of a
    catalog.parquet -> the next map, written to `path`: what split_map.write(path,
    split_map.add_catalog(old, contents_path)) writes, byte for byte. Returns its number of
    contents."""
    names = []  # the catalog's splits in order of appearance, then the old map's others
    with tempfile.TemporaryDirectory(prefix="split-map-runs-", dir=directory) as scratch:
        runs = _write_runs(contents_path, names, scratch)
        if old is None:
            old_blocks = iter(())
        else:
            _ranks(list(old.names), names)
            old_blocks = (old.blocks(names) if isinstance(old, StoredMap)
                          else _memory_blocks(old, names))
        final = tuple(sorted(names))
        rank = np.array([final.index(n) for n in names] or [0], np.uint8)
        most = runs.rows + (len(old) if old is not None else 0)
        with _Writer(path, final, max(1, min(ROW_GROUP, most))) as writer:
            for group in _grouped(_merged([old_blocks] + [_run_blocks(p) for p in runs]),
                                  rank):
                writer.add(*group)
        return writer.rows


def _write_runs(contents_path, names, directory):
    """The catalog's rows with an input sha256 -> files of RECORDs, each sorted by (content,
    seq), RUN_ROWS at most; `names` gets their splits in order of first appearance."""
    runs, pending, count, seq = _Runs(), [], 0, 1
    columns = ["input_sha256", "input_size", "split", "input_md5"]
    for table in catalog.iter_tables(contents_path, columns=columns):
        contents, sizes, (local, codes), md5 = split_map._present_arrow(table)
        del table
        ranks = _ranks(local, names)
        if not len(contents):
            continue
        pending.append(_records(contents, sizes, ranks[codes], md5, seq))
        seq += len(contents)
        count += len(contents)
        if count >= RUN_ROWS:
            runs.append(_spill(pending, directory, len(runs)))
            count = 0
    if pending:
        runs.append(_spill(pending, directory, len(runs)))
    runs.rows = seq - 1
    return runs


class _Runs(list):
    """Run files, and how many rows they hold."""

    rows = 0


def _spill(pending, directory, number):
    """Pending RECORD arrays -> one sorted run file (`pending` emptied)."""
    records = _ordered(np.concatenate(pending))
    pending.clear()
    path = os.path.join(directory, f"run-{number:06d}.bin")
    records.tofile(path)
    return path


def _ordered(records):
    """RECORDs -> sorted by (w0, w1, seq): one stable sort by w0 when no two share it (the
    usual case: w0 is 64 bits of sha256; only copies of one content share it), else the
    three-key sort."""
    w0 = records["w0"]
    order = np.argsort(w0, kind="stable")
    ordered = w0[order]
    if len(ordered) > 1 and (ordered[1:] == ordered[:-1]).any():
        order = np.lexsort((records["seq"], records["w1"], w0))
    return records[order]


def _run_blocks(path):
    with io.open(path, "rb") as f:
        while True:
            block = np.fromfile(f, RECORD, BLOCK_ROWS)
            if not len(block):
                return
            yield block


def _le(block, bound):
    """How many of `block`'s first records are <= `bound` (both in (w0, w1, seq) order)."""
    w0 = block["w0"]
    lo = int(np.searchsorted(w0, bound["w0"], "left"))
    hi = int(np.searchsorted(w0, bound["w0"], "right"))
    tie = block[lo:hi]
    below = (tie["w1"] < bound["w1"]) | ((tie["w1"] == bound["w1"])
                                         & (tie["seq"] <= bound["seq"]))
    return lo + int(below.sum())


def _merged(sources):
    """Block iterators, each sorted by (w0, w1, seq), the keys unique (the old map's rows,
    seq 0, have unique contents) -> RECORD blocks in that order: each round emits every
    held record up to the smallest last record a source holds, so a source holds one block
    at a time (k-way merge, BLOCK_ROWS a source)."""
    held = []
    for source in sources:
        block = next(source, None)
        if block is not None and len(block):
            held.append([block, source])
    while held:
        bound = min((block[-1] for block, _ in held),
                    key=lambda r: (int(r["w0"]), int(r["w1"]), int(r["seq"])))
        out = []
        for item in held:
            block, source = item
            n = _le(block, bound)
            if n:
                out.append(block[:n])
                item[0] = block = block[n:]
            if not len(block):
                item[0] = next(source, block)
        held = [item for item in held if len(item[0])]
        yield _ordered(np.concatenate(out)) if len(out) > 1 else out[0]


def _grouped(blocks, rank):
    """Merged RECORD blocks -> (contents "S16", sizes, codes into the final names, md5 words)
    of each content: the old map's row, else the new rows in split-name order then catalog
    order, gives split and size; the md5 is the last known one in that order (as
    split_map._merge decides). A content's rows may span blocks: the last content of a
    block waits for the next."""
    priority = 1 + rank.astype(np.int16)
    carry = None
    for block in itertools.chain(blocks, [None]):
        if block is None:  # the end: what waited
            if carry is None or not len(carry):
                return
            block = carry
        else:
            if carry is not None and len(carry):
                block = np.concatenate([carry, block])
            last = (block["w0"] == block["w0"][-1]) & (block["w1"] == block["w1"][-1])
            cut = len(block) - int(last.sum())  # the last content's rows are the tail
            carry, block = block[cut:], block[:cut]
            if not len(block):
                continue
        w0, w1 = block["w0"], block["w1"]
        first = np.ones(len(block), bool)
        first[1:] = (w0[1:] != w0[:-1]) | (w1[1:] != w1[:-1])
        if first.all():  # one row a content (the usual block): nothing to decide
            words = np.empty((len(block), 2), ">u8")
            words[:, 0], words[:, 1] = w0, w1
            md5 = np.empty((len(block), 2), np.uint64)
            md5[:, 0], md5[:, 1] = block["m0"], block["m1"]
            yield words.view("S16").ravel(), block["size"], rank[block["name"]], md5
            continue
        prio = np.where(block["seq"] == 0, 0, priority[block["name"]])
        block = block[np.lexsort((block["seq"], prio, w1, w0))]
        starts = np.flatnonzero(first)  # the same groups, reordered within each
        known = (block["m0"] != 0) | (block["m1"] != 0)
        last_known = np.maximum.reduceat(np.where(known, np.arange(len(block)), -1), starts)
        winners = block[starts]
        md5 = np.zeros((len(starts), 2), np.uint64)
        has = last_known >= 0
        md5[has, 0] = block["m0"][last_known[has]]
        md5[has, 1] = block["m1"][last_known[has]]
        words = np.empty((len(starts), 2), ">u8")
        words[:, 0], words[:, 1] = winners["w0"], winners["w1"]
        yield words.view("S16").ravel(), winners["size"], rank[winners["name"]], md5


class _Writer:
    """Rows in content order -> the map's Parquet file, a row group written each ROW_GROUP
    rows: split_map.write's row groups, each written whole from arrays allocated once (their
    pages touched only as rows fill them), so its bytes. Parquet writes a row group a column
    at a time, so one row group of the output is the least it can hold."""

    def __init__(self, path, names, capacity):
        """`capacity`: rows of a row group, ROW_GROUP or fewer when the map will be smaller."""
        self.path, self.names, self.rows, self.count = path, names, 0, 0
        self.capacity = capacity
        self.contents, self.sizes = np.empty(capacity, "S16"), np.empty(capacity, np.int64)
        self.codes, self.md5 = np.empty(capacity, np.uint8), np.zeros((capacity, 2), ">u8")
        self.md5_written = False  # zeros (calloc'd) never written hold no memory: a local
                                  # root's map, with no md5s, holds 25 bytes a row, not 41

    def __enter__(self):
        self._final = files.create_final(self.path)
        self.writer = pq.ParquetWriter(self._final.__enter__(), split_map.SCHEMA,
                                       compression="zstd")
        return self

    def add(self, contents, sizes, codes, md5):
        done = 0
        while done < len(contents):
            n = min(len(contents) - done, self.capacity - self.count)
            at = slice(self.count, self.count + n)
            self.contents[at], self.sizes[at] = contents[done:done + n], sizes[done:done + n]
            self.codes[at] = codes[done:done + n]
            if md5[done:done + n].any():
                self.md5[at] = md5[done:done + n]
                self.md5_written = True
            self.count += n
            done += n
            if self.count == self.capacity:
                self._flush()

    def _flush(self):
        n = self.count
        smap = split_map.SplitMap(self.contents[:n], self.sizes[:n], self.codes[:n],
                                  self.names, md5s=self.md5[:n].view("S16").ravel())
        self.writer.write_table(split_map.table(smap))
        self.rows += n
        self.count = 0
        if self.md5_written:
            self.md5, self.md5_written = np.zeros((self.capacity, 2), ">u8"), False

    def __exit__(self, kind, error, trace):
        try:
            if kind is None and (self.count or not self.rows):
                self._flush()  # the last row group; an empty map: one of no rows, as write's
            self.writer.close()
        except BaseException:
            self._final.__exit__(*sys.exc_info())
            raise
        return self._final.__exit__(kind, error, trace)
