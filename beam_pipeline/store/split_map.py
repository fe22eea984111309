"""split_map.parquet: the split of every content ever published under a root.

One row per distinct input content (the first 16 bytes of its input sha256), with the
input's size (so the launcher hashes only inputs of a size some published input had), the
gs:// listing's md5 of it when one was known (so a gs:// input is found without a download)
and the split it was first published in. Each version's commit writes its own map: the map it
was planned with plus this version's new contents, so the map spans the root's whole
history while each version stays immutable; --resplit starts a new one. A content first
published in several splits at once (byte-identical copies under keys that hash apart)
takes the first split name.

A SplitMap holds one whole, as numpy arrays: 16 + 8 + 16 + 1 bytes per content, sorted by
content, looked up by binary search; the md5 index (two more words and a position per md5)
is built on the first md5 lookup. Builds no longer hold the map: the launcher and commit go
through store/split_map_file.py, a row group at a time, with the bytes `write` writes. A
SplitMap remains for a version written before split maps (its catalog is its map) and for
rows given without a map.
"""

import base64
import binascii
import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from beam_pipeline.store import catalog, files, transient




DIGEST_BYTES = 16  # of the input sha256: collisions ~ n^2 / 2^129, nil at any real n
_HEX = np.full(256, 255, np.uint8)
_HEX[np.frombuffer(b"0123456789abcdef", np.uint8)] = np.arange(16, dtype=np.uint8)
_HEX[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16, dtype=np.uint8)
NO_MD5 = b"\0" * 16  # an md5 of all zero bytes stands for "none known" (~2^-128 to be real)


class SplitMapUnreadable(Exception):
    """The file is missing, truncated or not a split map (the message names it). A read
    that failed without proving that (a 503, a timeout, a 403, EIO) raises
    store/transient.py's StorageUnavailable instead: no older map stands in for it."""


@dataclasses.dataclass(frozen=True)
class SplitMap:
    contents: np.ndarray   # "S16" digests, sorted, unique
    sizes: np.ndarray      # int64 input size of each content
    codes: np.ndarray      # uint8 index into `names`
    names: tuple           # split names, sorted
    source: str = None     # the file it was read from
    md5s: np.ndarray = None  # "S16" listing md5 of each content, NO_MD5 where none is known
                             # (local, composite objects, maps written before this column)

    def __len__(self):
        return len(self.contents)

    def md5_words(self):
        """Each content's md5 as two big-endian uint64 words (zeros: none known)."""
        if self.md5s is None:
            return np.zeros((len(self), 2), np.uint64)
        return self.md5s.view(">u8").reshape(-1, 2).astype(np.uint64)

    def split_of(self, input_sha256):
        """The split `input_sha256` (hex) was first published in, or None."""
        if not input_sha256 or not len(self.contents):
            return None
        digest = bytes.fromhex(input_sha256[:2 * DIGEST_BYTES])
        i = int(np.searchsorted(self.contents, digest))
        if i < len(self.contents) and self.contents[i] == digest.rstrip(b"\0"):  # "S16" items
            # drop trailing zero bytes: compared with the digest whole, 1 in 256 was missed
            return self.names[self.codes[i]]
        return None

    def probe(self, md5s, sizes):
        """split_map_file.StoredMap.probe's answer: a map in memory answers any question."""
        return self

    def splits_of(self, items):
        """(hex input sha256 or None, x) -> (x, its split or None), as StoredMap.splits_of."""
        for sha, x in items:
            yield x, self.split_of(sha)

    def has_size(self, size):
        """Whether some published input had exactly `size` bytes (worth hashing)."""
        known = self._known_sizes()
        i = int(np.searchsorted(known, size))
        return i < len(known) and known[i] == size

    def split_of_md5(self, md5, size):
        """The split of the content whose listing md5 (base64, as GCS gives it) and size are
        `md5` and `size`, or None (no md5 given, or none known for these bytes)."""
        if not md5:
            return None
        q0, q1 = np.frombuffer(base64.b64decode(md5), ">u8").astype(np.uint64)
        words, where = self._md5_index()
        first = words[:, 0]
        for i in range(np.searchsorted(first, q0, "left"), np.searchsorted(first, q0, "right")):
            j = where[i]
            if words[i, 1] == q1 and self.sizes[j] == size:
                return self.names[self.codes[j]]
        return None

    def has_size_without_md5(self, size):
        """Whether some published input had `size` bytes and no known md5: a gs:// input of
        that size whose md5 the map lacks may still be those bytes (worth hashing)."""
        known = self._cached("_md5_less_sizes", lambda: np.unique(
            self.sizes[~self.md5_words().any(axis=1)]))
        i = int(np.searchsorted(known, size))
        return i < len(known) and known[i] == size

    def _md5_index(self):
        """(the known md5s' words sorted, each one's row): built once, on the first lookup."""
        def build():  # sorted by the first word only: the lookup compares the second
            words = self.md5_words()
            rows = np.flatnonzero(words.any(axis=1))
            rows = rows[np.argsort(words[rows, 0], kind="stable")]
            return words[rows], rows
        return self._cached("_md5s_sorted", build)

    def _known_sizes(self):
        return self._cached("_sizes", lambda: np.unique(self.sizes))

    def _cached(self, name, make):
        if name not in self.__dict__:
            object.__setattr__(self, name, make())
        return self.__dict__[name]


EMPTY = SplitMap(np.empty(0, "S16"), np.empty(0, np.int64), np.empty(0, np.uint8), ())


def digests(hex_column):
    """An array of hex sha256 strings (no nulls) -> their first 16 bytes as "S16"."""
    text = np.asarray(hex_column, dtype=f"S{2 * DIGEST_BYTES}")  # truncates to 32 hex digits
    nibbles = _HEX[text.view(np.uint8).reshape(len(text), 2 * DIGEST_BYTES)]
    if (nibbles == 255).any():
        raise ValueError("not a hex sha256")
    return np.ascontiguousarray((nibbles[:, 0::2] << 4) | nibbles[:, 1::2]).view("S16").ravel()


def md5_words(column):
    """An arrow string array of base64 md5s (the listing's md5Hash; nulls allowed) -> (n, 2)
    uint64 big-endian words, zeros where null; decoded from the string buffer at once."""
    column = pa.array(column, pa.string()) if not isinstance(column, pa.Array) else column
    n = len(column)
    valid = (np.ones(n, bool) if column.null_count == 0
             else column.is_valid().to_numpy(zero_copy_only=False))
    words = np.zeros((n, 2), np.uint64)
    if not valid.any():
        return words
    offsets = np.frombuffer(column.buffers()[1], np.int32, n + 1, column.offset * 4)
    if (np.diff(offsets)[valid] != 24).any():
        raise ValueError("not a base64 md5")
    text = np.frombuffer(column.buffers()[2], np.uint8)
    if valid.all():  # each 24 characters, one after the other
        text = text[offsets[0]:offsets[-1]]
    else:
        text = text[offsets[:-1][valid, None] + np.arange(24)]
    # "==" -> "AA" (zero bits): one base64 text of 18 bytes per md5, decoded in C at once
    text = text.copy()
    text[text == ord("=")] = ord("A")
    try:
        raw = np.frombuffer(binascii.a2b_base64(text.tobytes(), strict_mode=True), np.uint8)
    except binascii.Error as e:
        raise ValueError("not a base64 md5") from e
    known = np.ascontiguousarray(raw.reshape(-1, 18)[:, :16]).view(">u8").astype(np.uint64)
    if valid.all():
        return known
    words[valid] = known
    return words


def from_columns(input_sha256, input_size, split, old=None, input_md5=None):
    """Rows (hex input sha256 or None, size, split name, base64 md5 or None) added to `old`
    (None: a new map): a content already in `old` keeps its split (and gains an md5 it
    lacked); a new one takes the first split name it has here."""
    return _merge(old, [_present(input_sha256, input_size, split, input_md5)])


def _present(input_sha256, input_size, split, input_md5=None):
    """Columns -> (digests, sizes, split names, md5 words) of the rows with an input sha256."""
    sha = np.asarray(input_sha256, dtype=object)
    present = np.fromiter((v is not None for v in sha), bool, len(sha))
    names, codes = np.unique(np.asarray(split, dtype=object)[present].astype(str),
                             return_inverse=True)
    md5 = md5_words([None] * len(sha) if input_md5 is None else input_md5)
    return (digests(sha[present]) if present.any() else np.empty(0, "S16"),
            np.asarray(input_size, dtype=np.int64)[present], (names.tolist(), codes.ravel()),
            md5[present])


def _present_arrow(table):
    """A catalog row group (arrow) -> (digests, sizes, split names, md5 words) of its rows
    with an input sha256: the hex read straight from the string buffer when every value is
    64 characters (always, as the writer writes them), without a Python string per row; a
    catalog written before input_md5 gives no md5s."""
    import pyarrow.compute as pc

    table = table.filter(pc.is_valid(table["input_sha256"])).combine_chunks()
    if not table.num_rows:
        return (np.empty(0, "S16"), np.empty(0, np.int64), ([], np.empty(0, np.int64)),
                np.zeros((0, 2), np.uint64))
    sha = table["input_sha256"].chunk(0)
    offsets = np.frombuffer(sha.buffers()[1], np.int32, len(sha) + 1, sha.offset * 4)
    if (np.diff(offsets) == 64).all():
        text = np.frombuffer(sha.buffers()[2], np.uint8, 64 * len(sha), offsets[0])
        nibbles = _HEX[text.reshape(len(sha), 64)[:, :2 * DIGEST_BYTES]]
        if (nibbles == 255).any():
            raise ValueError("not a hex sha256")
        found = np.ascontiguousarray((nibbles[:, 0::2] << 4) | nibbles[:, 1::2])
        contents = found.view("S16").ravel()
    else:
        contents = digests(sha.to_numpy(zero_copy_only=False))
    split = pc.dictionary_encode(table["split"]).chunk(0)
    md5 = (md5_words(table["input_md5"].chunk(0)) if "input_md5" in table.column_names
           else np.zeros((len(contents), 2), np.uint64))
    return (contents, table["input_size"].to_numpy(),
            (split.dictionary.to_pylist(), split.indices.to_numpy()), md5)


def _merge(old, parts):
    """`old` plus the (digests, sizes, (split names, codes), md5 words) `parts`, in one
    sort; a content's md5 is any of its rows' (the same bytes have the same md5).

    `parts` is emptied as its columns are joined, and each column is put in order and
    deduplicated on its own, the unordered one dropped at once: ~70 bytes a row at the
    peak, against ~125 when every column and its sorted copy lived together (commit's
    peak RSS grew ~120 bytes a stored image: 258 MB at 50k tiny images, 317 at 400k)."""
    old = old or EMPTY
    names = tuple(sorted(set(old.names).union(*(p[2][0] for p in parts))))

    def recoded(local, codes):
        rank = np.array([names.index(n) for n in local], np.uint8)
        return rank[codes] if len(codes) else np.empty(0, np.uint8)

    def joined(first, column):
        if not len(first) and len(parts) == 1:  # nothing to join: no copy
            piece = column(parts[0])
            parts[0] = parts[0][:column.slot] + (None,) + parts[0][column.slot + 1:]
            return piece
        pieces = [first]
        for i, part in enumerate(parts):
            pieces.append(column(part))
            parts[i] = part[:column.slot] + (None,) + part[column.slot + 1:]
        return np.concatenate(pieces)

    def slot(i, get):
        get.slot = i
        return get

    new_codes = joined(np.empty(0, np.uint8), slot(2, lambda p: recoded(*p[2])))
    codes = np.concatenate([recoded(old.names, old.codes), new_codes])
    # first the old row, then the new rows in split-name order: each content's first wins
    priority = np.concatenate([np.zeros(len(old), np.int16), 1 + new_codes.astype(np.int16)])
    del new_codes
    words = joined(old.contents, slot(0, lambda p: p[0])).view(">u8").reshape(-1, 2).astype(
        np.uint64)  # compared as integers: "S16" ones cost ~10x
    order = np.lexsort((priority, words[:, 1], words[:, 0]))
    del priority
    words = words[order]
    first = np.ones(len(words), bool)
    first[1:] = (words[1:] != words[:-1]).any(axis=1)
    contents = np.ascontiguousarray(words[first].astype(">u8")).view("S16").ravel()
    del words
    codes = codes[order][first]
    sizes = joined(old.sizes, slot(1, lambda p: p[1]))[order][first]
    md5 = joined(old.md5_words(), slot(3, lambda p: p[3]))[order]
    parts.clear()
    del order
    known = md5.any(axis=1)
    md5s = np.zeros((len(contents), 2), np.uint64)
    md5s[(np.cumsum(first) - 1)[known]] = md5[known]
    del md5
    return SplitMap(contents, sizes, codes, names,
                    md5s=np.ascontiguousarray(md5s.astype(">u8")).view("S16").ravel())


def from_rows(rows):
    """Catalog rows (dicts) -> their map (tests, and rows given without a map)."""
    rows = list(rows)
    return from_columns([r.get("input_sha256") for r in rows],
                        [r["input_size"] for r in rows], [r["split"] for r in rows],
                        input_md5=[r.get("input_md5") for r in rows])


def add_catalog(old, catalog_path):
    """`old` (None: a new map) plus the contents of a catalog.parquet, read column-wise one
    row group at a time into arrays allocated once for every row (16 + 8 + 1 + 16 bytes a
    row: a list of per-row-group arrays, concatenated, held ~50 more at commit's peak),
    merged in one sort."""
    total = catalog.footer(catalog_path).num_rows  # (on gs://: the footer alone, ranged)
    contents, sizes = np.empty(total, "S16"), np.empty(total, np.int64)
    codes, md5 = np.empty(total, np.uint8), np.empty((total, 2), np.uint64)
    names, filled = [], 0
    for table in catalog.iter_tables(
            catalog_path, columns=["input_sha256", "input_size", "split", "input_md5"]):
        part_contents, part_sizes, (local, local_codes), part_md5 = _present_arrow(table)
        end = filled + len(part_contents)
        names += [n for n in local if n not in names]
        rank = np.array([names.index(n) for n in local], np.uint8)
        contents[filled:end], sizes[filled:end], md5[filled:end] = (
            part_contents, part_sizes, part_md5)
        codes[filled:end] = rank[local_codes] if len(local_codes) else codes[filled:end]
        filled = end
    by_name = np.array([sorted(names).index(n) for n in names] or [0], np.uint8)
    parts = [(contents[:filled], sizes[:filled], (sorted(names), by_name[codes[:filled]]),
              md5[:filled])]
    del contents, sizes, codes, md5
    return _merge(old, parts)


SCHEMA = pa.schema([("content", pa.binary(DIGEST_BYTES)), ("size", pa.int64()),
                    ("split", pa.dictionary(pa.int8(), pa.string())),
                    ("md5", pa.binary(16))])  # null: none known (older maps lack the column)


def table(smap):
    """`smap` -> its Arrow table in SCHEMA (the columns' buffers shared, not copied)."""
    n = len(smap)
    contents = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(DIGEST_BYTES), n, [None, pa.py_buffer(np.ascontiguousarray(smap.contents))])
    split = pa.DictionaryArray.from_arrays(pa.array(smap.codes.astype(np.int8), pa.int8()),
                                           pa.array(list(smap.names), pa.string()))
    md5s = smap.md5s if smap.md5s is not None else np.zeros(n, "S16")
    known = md5s.view(">u8").reshape(-1, 2).any(axis=1)  # no copy of the words
    md5 = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(16), n, [pa.py_buffer(np.packbits(known, bitorder="little").tobytes()),
                           pa.py_buffer(np.ascontiguousarray(md5s))])
    return pa.Table.from_arrays([contents, pa.array(smap.sizes, pa.int64()), split, md5],
                                schema=SCHEMA)


def write(path, smap):
    """`smap` -> a Parquet file at `path` (complete or absent). split_map_file.build writes
    the same bytes without holding the map whole."""
    with files.create_final(path) as raw:
        pq.write_table(table(smap), raw, compression="zstd")


def read(path):
    """A split_map.parquet -> SplitMap; SplitMapUnreadable naming the file otherwise."""
    try:
        data = transient.retrying(lambda: files.read_bytes(path), path)
        table = pq.read_table(pa.BufferReader(data)).combine_chunks()
        contents, split = table["content"].chunk(0), table["split"].chunk(0)
        data = contents.buffers()[1]
        digest = np.frombuffer(data, "S16", count=len(contents), offset=contents.offset * 16)
        codes = split.indices.to_numpy().astype(np.uint8)
        names = tuple(split.dictionary.to_pylist())
        sizes = table["size"].to_numpy()
        md5s = _md5_column(table)
    except Exception as e:
        raise _unreadable(path, e) from e
    order = np.argsort(names)
    rank = np.empty(len(names), np.uint8)
    rank[order] = np.arange(len(names), dtype=np.uint8)
    return SplitMap(digest.copy(), sizes.copy(), rank[codes] if len(names) else codes,
                    tuple(sorted(names)), source=path, md5s=md5s)


def _md5_column(table):
    """A read map's md5 column -> "S16" with NO_MD5 for nulls; None for a map written
    before the column (no md5 known)."""
    if "md5" not in table.column_names:
        return None
    column = table["md5"].chunk(0)
    md5s = np.frombuffer(column.buffers()[1], "S16", count=len(column),
                         offset=column.offset * 16).copy()
    if column.null_count:
        md5s[column.is_null().to_numpy(zero_copy_only=False)] = NO_MD5
    return md5s


def read_catalog(path):
    """A version written before split maps: its catalog.parquet is its map."""
    try:
        smap = transient.retrying(lambda: add_catalog(None, path), path)
    except Exception as e:
        raise _unreadable(path, e) from e
    return dataclasses.replace(smap, source=path)


def _unreadable(path, e):
    """SplitMapUnreadable for proven damage; StorageUnavailable for anything else."""
    if isinstance(e, transient.StorageUnavailable):
        return e
    if not transient.is_damage(e):
        return transient.unavailable(e, path)
    return SplitMapUnreadable(f"{path}: {describe(e)}")


def describe(e):
    """A read error -> "missing" or "unreadable (the error, one line)"."""
    if isinstance(e, FileNotFoundError):
        return "missing"
    return "unreadable (" + " ".join(f"{type(e).__name__}: {e}".split())[:200] + ")"
