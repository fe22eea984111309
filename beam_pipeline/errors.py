"""The build's own exceptions: what the user can fix, and what a retry would repeat.

The errors.jsonl record is dataset_format/error_record.py's ErrorRecord."""


class UserError(Exception):
    """A mistake the user can fix (bad option, no inputs, unwritable output): one clear line."""


class RetryWontHelp(RuntimeError):
    """A build that failed in a way the same command on the same inputs would repeat (too
    many rejected inputs): exit 3, so a scheduler retries only the failures worth it."""

