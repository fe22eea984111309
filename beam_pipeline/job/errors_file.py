"""VDIR/errors.jsonl: the listing's error records and the shards', streamed into one file."""

from beam_pipeline.store import files
from dataset_format import layout
from dataset_format.error_record import ErrorRecord


def write_errors(results, spec, error_files=()):
    """The listing's errors, the shards' (from `error_files`, or the results) ->
    VDIR/errors.jsonl, streamed; returns {reason: count}."""
    reasons = {}

    def lines():
        for path in (spec.listed.errors_path, *error_files):
            for line in _iter_lines(path):
                yield ErrorRecord.from_json(line)
        for r in results:
            yield from r.errors

    with files.create_final(layout.join(spec.vdir, layout.ERRORS)) as out:
        batch = []
        for error in lines():
            reasons[error.reason] = reasons.get(error.reason, 0) + 1
            batch.append(error.to_json() + "\n")
            if len(batch) >= 4096:
                out.write("".join(batch).encode())
                batch = []
        out.write("".join(batch).encode())
    return reasons


def _iter_lines(path):
    """A JSONL file's non-empty lines (none when there is no such file)."""
    if not path:
        return
    try:
        f = files.open_read(path)  # gs://: one GET, not exists + a new client's three
    except FileNotFoundError:
        return
    with f:
        for line in f:
            if line.strip():
                yield line.decode()
