"""What the loaders give per record, and where a split's records lie (shards, .index offsets).

Pure Python on the format package: a record is located by its shard's `.index` line (one
ranged read per record), its frame CRCs are checked, its Example parsed without TensorFlow
and its JPEG decoded by simplejpeg (libjpeg-turbo, which the build already uses).
"""

import dataclasses
import io
import threading
from typing import Any, NamedTuple

from dataset_format import dataset_info as info_lib
from dataset_format import (examples, fields, frames, holds, layout, removal, schema,
                            slices, storage)


class Example(NamedTuple):
    """One record. A NamedTuple, so PyTorch's default collate and Grain's batching take it.

    image: uint8 [H, W, 3] RGB at the stored size (decode=True), else the stored JPEG bytes.
    label: the class id, 0-based + the loader's label_offset.
    key:   the image's key (image/filename), unique in a version.
    """
    image: Any
    label: int
    key: str


class FieldsExample(NamedTuple):
    """One record with declared fields (RecordSource(..., fields=[...])): Example's three
    and `fields`, {name: value} as dataset_format.fields.values_of gives them."""
    image: Any
    label: int
    key: str
    fields: dict


@dataclasses.dataclass(frozen=True)
class Span:
    """Records [first, first + count) of one shard file."""
    path: str
    first: int
    count: int


def open_info(path, version=None, hold=False):
    """A dataset_info.DatasetInfo from a root, a version directory or one already read
    (`version`: an id or a tag); `hold`: dataset_format/holds.py. Raises VersionRemoved for
    a version retention removed, before any record is read."""
    given = isinstance(path, info_lib.DatasetInfo)
    if given:
        info_lib.check_ref(path, version)
    found = path if given else info_lib.info(path, version)
    if hold:
        holds.hold(found, hold)  # looks at the manifest again after writing the lease
    elif given:  # read earlier: the version may have gone since
        removal.check_present(found.version_dir)
    return found


def explained(ds_info, e):
    """A read error, or the one line saying retention removed the version meanwhile."""
    return removal.explain(ds_info.version_dir, e)


def spans_of(ds_info, split):
    """The Spans a split spec ("train", "train[:10%]", "a+b[5:]") reads, in manifest order."""
    out = []
    for window in slices.windows_of(split, ds_info):
        offset = 0
        for shard in ds_info.split(window.split).shards:
            lo, hi = max(window.start, offset), min(window.stop, offset + shard.num_examples)
            if lo < hi:
                out.append(Span(shard.path, lo - offset, hi - lo))
            offset += shard.num_examples
    return tuple(out)


def part(spans, index, count):
    """The index-th of `count` contiguous parts of `spans`' records (sizes differ by at most
    one): every record is in exactly one part."""
    total = sum(s.count for s in spans)
    lo, hi = index * total // count, (index + 1) * total // count
    out, offset = [], 0
    for s in spans:
        start, end = max(lo, offset), min(hi, offset + s.count)
        if start < end:
            out.append(Span(s.path, s.first + start - offset, end - start))
        offset += s.count
    return tuple(out)


class Offsets:
    """(offset, frame length) of every record of the shards read, loaded once per shard and
    process from its .index file (or, without one, by walking the frames). Thread-safe; not
    pickled (each worker loads what it reads)."""

    def __init__(self, file_records):
        self._expected = dict(file_records)  # path -> records per the manifest
        self._loaded, self._lock = {}, threading.Lock()

    def of(self, path):
        found = self._loaded.get(path)
        if found is None:
            found = self._load(path)
            with self._lock:
                self._loaded[path] = found
        return found

    def _load(self, path):
        try:
            entries = frames.parse_index(storage.read_text(layout.index_name(path)))
        except FileNotFoundError:
            entries = scan(path)
        except ValueError as e:
            raise ValueError(f"{layout.index_name(path)}: not an index ({e})") from None
        if len(entries) != self._expected[path]:
            raise ValueError(f"{path}: {len(entries)} records in its index or frames, "
                             f"{self._expected[path]} in the manifest")
        return entries

    def __getstate__(self):
        return {"_expected": self._expected}

    def __setstate__(self, state):
        self.__init__(state["_expected"])


MISSING = ("shard file missing (manifest.json lists it): the version was pruned or only "
           "partly copied; rebuild it or read another version")


def open_shard(path):
    """A storage.LocalFile or GcsFile of a shard; one line naming it when it is missing."""
    try:
        return storage.open_ranged(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: {MISSING}") from None


def scan(path):
    """[(offset, frame length)] of a shard written without .index files (--no_write_index)."""
    try:
        data = storage.read_bytes(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: {MISSING}") from None
    entries, offset = [], 0
    stream = io.BytesIO(data)
    while offset < len(data):
        _, length = frames.read_frame(stream, offset, check_crc=False)
        entries.append((offset, length))
        offset += length
    return entries


class Decoder:
    """Record bytes -> Example; errors name the shard, position and key."""

    def __init__(self, decode, label_shift, transform=None, fields=()):
        self.decode, self.label_shift, self.transform = decode, label_shift, transform
        self.fields = tuple(fields)  # declared fields (dataset_format.fields.Field) to give

    def __call__(self, data, path, position, offset):
        try:
            found = frames.read_frame(io.BytesIO(data), offset)
        except frames.FrameError as e:
            raise ValueError(f"{path}: record {position}: {e}; the shard is damaged "
                             "(verify it, or rebuild the version)") from None
        if found is None or found[1] != len(data):
            raise ValueError(f"{path}: record {position} at offset {offset}: no whole frame "
                             f"({len(data)} bytes read)")
        features = examples.parse_example(found[0])
        key = features.get(schema.FILENAME, b"").decode()
        image = features[schema.ENCODED]
        if self.decode:
            image = decode_jpeg(image, f"{path}: record {position} (key {key})")
        example = Example(image, int(features[schema.LABEL]) + self.label_shift, key)
        if self.fields:
            example = FieldsExample(*example, fields.values_of(
                self.fields, examples.parse_features(found[0])))
        return self.transform(example) if self.transform else example


def decode_jpeg(data, where):
    """uint8 [H, W, 3] RGB pixels of a stored JPEG (libjpeg-turbo's accurate DCT)."""
    import simplejpeg

    try:
        return simplejpeg.decode_jpeg(data, colorspace="RGB")
    except ValueError as e:
        raise ValueError(f"{where}: the image does not decode ({e})") from None


def declared(ds_info, names):
    """The version's declared fields named in `names` (ValueError naming an unknown one)."""
    try:
        return fields.declared_fields(ds_info.manifest, names or ())
    except KeyError as e:
        raise ValueError(f"{ds_info.version_dir}: {e.args[0]}") from None


def center_crop(image, crop_fraction=0.875):
    """The square center crop of `crop_fraction` of the shorter side of a uint8 [H, W, 3]
    image: the window the tf.data reader's evaluation crops (readers/images.center_window,
    the same float32 arithmetic), so both give the same pixels before any resize."""
    import numpy as np

    height, width = image.shape[:2]
    side = max(int(np.float32(crop_fraction) * np.float32(min(height, width))), 1)
    y, x = (height - side + 1) // 2, (width - side + 1) // 2
    return image[y:y + side, x:x + side]


def label_shift(ds_info, label_offset):
    """What to add to a stored label id for 0-based ids + label_offset."""
    return int(label_offset) - ds_info.label_offset


def file_records(ds_info, spans):
    """{shard path: its records per the manifest} for the shards `spans` touch."""
    counts = {s.path: s.num_examples for split in ds_info.splits.values() for s in split.shards}
    return {s.path: counts[s.path] for s in spans}
