"""Values both sides share: the listed-image reference and the split names.

Lives below launcher/ and job/ so the job (Beam workers) never imports the launcher.
"""

import dataclasses
import json
from typing import Optional

SPLIT_NAMES = ("train", "validation", "test")  # split folders a directory input may have; report order


@dataclasses.dataclass(frozen=True, order=True)
class ImageRef:
    """One listed input: small, and streamed through the launcher, never held all at once."""

    key: str                      # identity: path relative to its input root (image/filename)
    uri: str                      # where to read it: absolute local path or gs:// uri
    label: str
    split: Optional[str] = None   # fixed by layout or manifest column, else hashed
    size: int = 0
    mtime: float = 0.0            # mtime or GCS update time; for the fingerprint and catalog

    def to_json(self):  # a list, not dataclasses.astuple: that deep-copies (10x slower)
        return json.dumps([self.key, self.uri, self.label, self.split, self.size, self.mtime])

    @classmethod
    def from_json(cls, line):
        return cls(*json.loads(line))

    def with_key(self, key):
        return dataclasses.replace(self, key=key)


def split_order(names):
    """Split names in report order: the usual three first, then any others by name."""
    order = {s: i for i, s in enumerate(SPLIT_NAMES)}
    return sorted(names, key=lambda s: (order.get(s, len(order)), s))
