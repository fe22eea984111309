"""errors.jsonl's line (docs/format.md, "errors.jsonl"): one input that was not written.

The one owner of the record, beside the manifest's `errors` entry (manifest.ErrorsEntry)
that counts these lines: the launcher's listing, the job's writers and commit write it, and
commit and verify read it, so it sits below all of them. Pure Python.
"""

import dataclasses
import json


@dataclasses.dataclass(frozen=True)
class ErrorRecord:
    """A rejected input: where, at which stage, a short reason code, one line for people."""

    uri: str     # the input (a manifest row with no uri: MANIFEST:LINE)
    stage: str   # read (listing or reading the bytes), decode, convert or encode
    reason: str  # a short code (not_found, truncated, ...)
    detail: str  # one line for people

    def to_json(self):
        """The errors.jsonl line, without its newline: keys sorted, ASCII."""
        return json.dumps(self.to_dict(), sort_keys=True)

    def to_dict(self):
        """The record as a dict in field order (the shard record a resume reads keeps it)."""
        return {"uri": self.uri, "stage": self.stage, "reason": self.reason,
                "detail": self.detail}

    @classmethod
    def from_json(cls, text):
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, fields):
        """Exactly the four keys: a line missing one, or with another, raises."""
        if set(fields) != {"uri", "stage", "reason", "detail"}:
            raise ValueError(f"not an errors.jsonl record (keys {sorted(fields)})")
        return cls(fields["uri"], fields["stage"], fields["reason"], fields["detail"])
