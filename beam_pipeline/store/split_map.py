"""split_map.parquet: the split of every content ever published under a root.

One row per distinct input content (the first 16 bytes of its input sha256), with the
input's size (so the launcher hashes only inputs of a size some published input had) and
the split it was first published in. Each version's commit writes its own map: the map it
was planned with plus this version's new contents, so the map spans the root's whole
history while each version stays immutable; --resplit starts a new one. A content first
published in several splits at once (byte-identical copies under keys that hash apart)
takes the first split name.

Held as numpy arrays, not Python objects: 16 + 8 + 1 bytes per content, sorted, looked up
by binary search (docs/format.md gives the measured cost at 1M contents).
"""

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

DIGEST_BYTES = 16  # of the input sha256: collisions ~ n^2 / 2^129, nil at any real n
_HEX = np.full(256, 255, np.uint8)
_HEX[np.frombuffer(b"0123456789abcdef", np.uint8)] = np.arange(16, dtype=np.uint8)
_HEX[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16, dtype=np.uint8)


class SplitMapUnreadable(Exception):
    """The file is missing, truncated or not a split map (the message names it)."""


@dataclasses.dataclass(frozen=True)
class SplitMap:
    contents: np.ndarray   # "S16" digests, sorted, unique
    sizes: np.ndarray      # int64 input size of each content
    codes: np.ndarray      # uint8 index into `names`
    names: tuple           # split names, sorted
    source: str = None     # the file it was read from

    def __len__(self):
        return len(self.contents)

    def split_of(self, input_sha256):
        """The split `input_sha256` (hex) was first published in, or None."""
        if not input_sha256 or not len(self.contents):
            return None
        digest = bytes.fromhex(input_sha256[:2 * DIGEST_BYTES])
        i = int(np.searchsorted(self.contents, digest))
        if i < len(self.contents) and self.contents[i] == digest:
            return self.names[self.codes[i]]
        return None

    def has_size(self, size):
        """Whether some published input had exactly `size` bytes (worth hashing)."""
        known = self._known_sizes()
        i = int(np.searchsorted(known, size))
        return i < len(known) and known[i] == size

    def _known_sizes(self):
        if "_sizes" not in self.__dict__:
            object.__setattr__(self, "_sizes", np.unique(self.sizes))
        return self.__dict__["_sizes"]


EMPTY = SplitMap(np.empty(0, "S16"), np.empty(0, np.int64), np.empty(0, np.uint8), ())


def digests(hex_column):
    """An array of hex sha256 strings (no nulls) -> their first 16 bytes as "S16"."""
    text = np.asarray(hex_column, dtype=f"S{2 * DIGEST_BYTES}")  # truncates to 32 hex digits
    nibbles = _HEX[text.view(np.uint8).reshape(len(text), 2 * DIGEST_BYTES)]
    if (nibbles == 255).any():
        raise ValueError("not a hex sha256")
    return np.ascontiguousarray((nibbles[:, 0::2] << 4) | nibbles[:, 1::2]).view("S16").ravel()


def from_columns(input_sha256, input_size, split, old=None):
    """Rows (hex input sha256 or None, size, split name) added to `old` (None: a new map):
    a content already in `old` keeps its split; a new one takes the first split name it has
    here."""
    return _merge(old, [_present(input_sha256, input_size, split)])


def _present(input_sha256, input_size, split):
    """Columns -> (digests, sizes, split names) of the rows that have an input sha256."""
    sha = np.asarray(input_sha256, dtype=object)
    present = np.fromiter((v is not None for v in sha), bool, len(sha))
    names, codes = np.unique(np.asarray(split, dtype=object)[present].astype(str),
                             return_inverse=True)
    return (digests(sha[present]) if present.any() else np.empty(0, "S16"),
            np.asarray(input_size, dtype=np.int64)[present], (names.tolist(), codes.ravel()))


def _present_arrow(table):
    """A catalog row group (arrow) -> (digests, sizes, split names) of its rows with an
    input sha256: the hex read straight from the string buffer when every value is 64
    characters (always, as the writer writes them), without a Python string per row."""
    import pyarrow.compute as pc

    table = table.filter(pc.is_valid(table["input_sha256"])).combine_chunks()
    if not table.num_rows:
        return np.empty(0, "S16"), np.empty(0, np.int64), ([], np.empty(0, np.int64))
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
    return (contents, table["input_size"].to_numpy(),
            (split.dictionary.to_pylist(), split.indices.to_numpy()))


def _merge(old, parts):
    """`old` plus the (digests, sizes, (split names, codes)) `parts`, in one sort."""
    old = old or EMPTY
    names = tuple(sorted(set(old.names).union(*(p[2][0] for p in parts))))

    def recoded(local, codes):
        rank = np.array([names.index(n) for n in local], np.uint8)
        return rank[codes] if len(codes) else np.empty(0, np.uint8)

    old_codes = recoded(old.names, old.codes)
    new_codes = np.concatenate([recoded(*p[2]) for p in parts] or [np.empty(0, np.uint8)])
    contents = np.concatenate([old.contents] + [p[0] for p in parts])
    sizes = np.concatenate([old.sizes] + [p[1] for p in parts])
    codes = np.concatenate([old_codes, new_codes])
    # first the old row, then the new rows in split-name order: each content's first wins
    priority = np.concatenate([np.zeros(len(old), np.int16), 1 + new_codes.astype(np.int16)])
    words = contents.view(">u8").reshape(-1, 2).astype(np.uint64)  # compared as integers:
    order = np.lexsort((priority, words[:, 1], words[:, 0]))       # "S16" ones cost ~10x
    words, codes, sizes = words[order], codes[order], sizes[order]
    first = np.ones(len(words), bool)
    first[1:] = (words[1:] != words[:-1]).any(axis=1)
    contents = np.ascontiguousarray(words[first].astype(">u8")).view("S16").ravel()
    return SplitMap(contents, sizes[first], codes[first], names)


def from_rows(rows):
    """Catalog rows (dicts) -> their map (tests, and rows given without a map)."""
    rows = list(rows)
    return from_columns([r.get("input_sha256") for r in rows],
                        [r["input_size"] for r in rows], [r["split"] for r in rows])


def add_catalog(old, catalog_path):
    """`old` (None: a new map) plus the contents of a catalog.parquet, read column-wise one
    row group at a time (16 + 8 bytes and a split name kept per row), merged in one sort."""
    from beam_pipeline.store import catalog

    parts = [_present_arrow(table) for table in catalog.iter_tables(
        catalog_path, columns=["input_sha256", "input_size", "split"])]
    return _merge(old, parts)


SCHEMA = pa.schema([("content", pa.binary(DIGEST_BYTES)), ("size", pa.int64()),
                    ("split", pa.dictionary(pa.int8(), pa.string()))])


def write(path, smap):
    """`smap` -> a Parquet file at `path` (complete or absent)."""
    from beam_pipeline.store import files

    n = len(smap)
    contents = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(DIGEST_BYTES), n, [None, pa.py_buffer(smap.contents.tobytes())])
    split = pa.DictionaryArray.from_arrays(pa.array(smap.codes.astype(np.int8), pa.int8()),
                                           pa.array(list(smap.names), pa.string()))
    table = pa.Table.from_arrays([contents, pa.array(smap.sizes, pa.int64()), split],
                                 schema=SCHEMA)
    with files.create_final(path) as raw:
        pq.write_table(table, raw, compression="zstd")


def read(path):
    """A split_map.parquet -> SplitMap; SplitMapUnreadable naming the file otherwise."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            table = pq.read_table(pa.BufferReader(f.read())).combine_chunks()
        contents, split = table["content"].chunk(0), table["split"].chunk(0)
        data = contents.buffers()[1]
        digest = np.frombuffer(data, "S16", count=len(contents), offset=contents.offset * 16)
        codes = split.indices.to_numpy().astype(np.uint8)
        names = tuple(split.dictionary.to_pylist())
        sizes = table["size"].to_numpy()
    except Exception as e:
        raise SplitMapUnreadable(f"{path}: {describe(e)}") from e
    order = np.argsort(names)
    rank = np.empty(len(names), np.uint8)
    rank[order] = np.arange(len(names), dtype=np.uint8)
    return SplitMap(digest.copy(), sizes.copy(), rank[codes] if len(names) else codes,
                    tuple(sorted(names)), source=path)


def read_catalog(path):
    """A version written before split maps: its catalog.parquet is its map."""
    try:
        smap = add_catalog(None, path)
    except Exception as e:
        raise SplitMapUnreadable(f"{path}: {describe(e)}") from e
    return dataclasses.replace(smap, source=path)


def describe(e):
    """A read error -> "missing" or "unreadable (the error, one line)"."""
    if isinstance(e, FileNotFoundError):
        return "missing"
    return "unreadable (" + " ".join(f"{type(e).__name__}: {e}".split())[:200] + ")"
