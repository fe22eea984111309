"""Values both sides share: the listed-image reference and the split names.

Lives below launcher/ and job/ so the job (Beam workers) never imports the launcher.
"""

import collections
import dataclasses
import json
from typing import Optional

SPLIT_NAMES = ("train", "validation", "test")  # split folders a directory input may have; report order

# A listing line is ImageRef.to_json(): a JSON list with the fields at these positions. The
# planner's passes read a field from the parsed list without building an ImageRef.
(LINE_KEY, LINE_URI, LINE_LABEL, LINE_SPLIT, LINE_SIZE, LINE_STAMP, LINE_SHA256, LINE_SOURCE,
 LINE_MD5, LINE_FIELDS) = range(10)
# A line of an image without declared fields stops at LINE_MD5 (the line it was before
# fields existed); with fields, LINE_FIELDS holds their checked values as JSON text
# (dataset_format/fields.values_text: a string, so passes that never look at it do not parse it).


class Listed(collections.namedtuple("Listed",
                                    "key uri label split size stamp sha256 source md5 fields")):
    """A listing line's fields as a named tuple, read without building an ImageRef (a frozen
    dataclass: ~3 us): Listed._make(json.loads(line)). A line without fields reads with
    fields None (and is dumped again with a trailing null, which ImageRef reads the same)."""

    __slots__ = ()

    @classmethod
    def _make(cls, values):
        values = tuple(values)
        return tuple.__new__(cls, values if len(values) == 10 else values + (None,))


@dataclasses.dataclass(frozen=True, order=True)
class StoredFrame:
    """A record already stored by an earlier version: its TFRecord frame in a shard file.

    A listed image whose bytes that record was made from is re-framed from it (the stored
    JPEG bytes under the new key and label) instead of being decoded again.
    """

    path: str                     # the shard file (absolute local path or gs:// uri)
    offset: int
    length: int
    phash: Optional[int] = None   # its catalog row's perceptual hashes (--near_duplicates):
    phash_center: Optional[int] = None  # whole, central 90% (None: a catalog from before it)
    descriptor: Optional[str] = None  # its near_descriptor, base64 as catalog.iter_rows gives it


@dataclasses.dataclass(frozen=True, order=True)
class ImageRef:
    """One listed input: small, and streamed through the launcher, never held all at once."""

    key: str                      # identity: path relative to its input root (image/filename)
    uri: str                      # where to read it: absolute local path or gs:// uri
    label: str
    split: Optional[str] = None   # fixed by layout or manifest column, else hashed
    size: int = 0
    stamp: str = ""               # change token: "mtime_ns:ctime_ns", or "gen:N" on gs://
    sha256: Optional[str] = None  # of the input bytes, when the launcher read them
    source: Optional[StoredFrame] = None  # re-frame this stored record instead of converting
    md5: Optional[str] = None     # the gs:// listing's md5Hash (base64): identity without a
                                  # download (none locally, nor for composite objects)
    fields: Optional[str] = dataclasses.field(default=None, compare=False)
    # ^ declared fields' checked values as JSON text (dataset_format/fields.values_text),
    # None without a schema

    def to_json(self):  # a list (LINE_* positions), not dataclasses.astuple: that deep-copies
                        # (10x slower)
        source = self.source and [self.source.path, self.source.offset, self.source.length,
                                  self.source.phash, self.source.phash_center,
                                  self.source.descriptor]
        line = [self.key, self.uri, self.label, self.split, self.size, self.stamp,
                self.sha256, source, self.md5]
        if self.fields is not None:
            line.append(self.fields)
        return json.dumps(line)

    @classmethod
    def from_json(cls, line):
        return cls.from_fields(json.loads(line))

    @classmethod
    def from_fields(cls, fields):
        """The parsed to_json list -> ImageRef."""
        if len(fields) > LINE_SOURCE and fields[LINE_SOURCE]:
            fields[LINE_SOURCE] = StoredFrame(*fields[LINE_SOURCE])
        return cls(*fields)

    def with_key(self, key):
        return dataclasses.replace(self, key=key)


def split_order(names):
    """Split names in report order: the usual three first, then any others by name."""
    order = {s: i for i, s in enumerate(SPLIT_NAMES)}
    return sorted(names, key=lambda s: (order.get(s, len(order)), s))
