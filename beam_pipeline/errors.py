"""User-facing errors and the errors.jsonl record (docs/format.md)."""


class UserError(Exception):
    """A mistake the user can fix (bad option, no inputs, unwritable output): one clear line."""


def error_record(uri, stage, reason, detail):
    return {"uri": uri, "stage": stage, "reason": reason, "detail": detail}
