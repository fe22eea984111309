"""User-facing errors and the errors.jsonl record (docs/format.md)."""


class UserError(Exception):
    """A mistake the user can fix (bad option, no inputs, unwritable output): one clear line."""


class RetryWontHelp(RuntimeError):
    """A build that failed in a way the same command on the same inputs would repeat (too
    many rejected inputs): exit 3, so a scheduler retries only the failures worth it."""


def error_record(uri, stage, reason, detail):
    return {"uri": uri, "stage": stage, "reason": reason, "detail": detail}
