"""Checks of the inputs and the environment before any work: each a one-line UserError
naming what to fix (exit 2); a storage outage met while checking is StorageUnavailable
(exit 1), not the command's mistake."""

import importlib.util
import os

from beam_pipeline.errors import UserError
from beam_pipeline.launcher import listing
from beam_pipeline.store import files, transient


def preflight(pipeline_options, build):
    """Everything a command can get wrong, checked before anything is created or locked:
    one line and exit 2 (errors.UserError). -> the dataset root."""
    refuse_classic_template(pipeline_options)
    require_tensorflow(build)
    listing.check_exist(build.input)  # before the output root is created
    root = build.output.rstrip("/")
    check_writable(root)
    return root


FLEX_LAUNCHER_ENV = "FLEX_TEMPLATE_PYTHON_PY_FILE"  # set in every Flex Template launcher image


def refuse_classic_template(pipeline_options):
    """--template_location outside the Flex launcher writes a classic template: its listing
    and version are fixed now, and the next build's cleanup deletes them, so a later launch
    would fail. The Flex launcher passes --template_location too, for the job it submits
    at once; its image sets FLEX_LAUNCHER_ENV."""
    template = pipeline_options.get_all_options().get("template_location")
    if template and not os.environ.get(FLEX_LAUNCHER_ENV):
        raise UserError(f"--template_location {template}: classic templates are not supported "
                        "(the listing they carry is deleted by the next build); use the Flex "
                        "Template in configs/flex_template/ (docs/scheduling.md), which lists "
                        "the inputs at each launch")


def require_tensorflow(build):
    """The base install has no TensorFlow (workers never need it); --transform does, and so
    does the comparison sink. Say so before any work, not as an ImportError on a worker."""
    flag = "--transform" if build.transform else "--sink beam" if build.sink == "beam" else None
    needed = ["tensorflow"] + (["tensorflow_transform"] if build.transform else [])
    missing = [m for m in needed if flag and importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(f"{flag} needs {' and '.join(missing)}, which is not installed: "
                        "pip install -c constraints.txt '.[transform]' (and on Dataflow, a "
                        "worker image built with --build-arg EXTRAS=transform)")


def has_split_map(previous):
    """Whether the latest version (a DatasetInfo) holds the splits its images keep for life
    (its catalog)."""
    return bool(previous) and previous.has_catalog


def refuse_catalogless(build, root, previous):
    """`--sink beam` writes no catalog: published over a root with a split map, it would
    leave the next build none, and every image would be split again by its key hash."""
    if build.sink == "beam" and has_split_map(previous) and not build.resplit:
        raise UserError(f"--sink beam writes no catalog, so it would erase the split map of "
                        f"{root} (the splits its published images keep for life); build the "
                        "comparison into another --output, or add --resplit to start the "
                        "split map over")


def check_writable(root):
    """Fail before any listing when --output can't take a file."""
    probe = f"{root}/.write-check-{os.getpid()}"
    try:
        if not root.startswith("gs://"):
            os.makedirs(root, exist_ok=True)
        files.write_bytes(probe, b"ok")
        files.delete(probe)
    except Exception as e:
        _outage(e, f"--output {root}")
        raise UserError(f"--output {root}: not writable ({type(e).__name__}: {e})") from e


def _outage(error, what):
    """Raise StorageUnavailable (exit 1) when `error` is the storage's, not the command's: a
    429/5xx past the retries, a timeout, a local EIO. A 403 or EACCES stays the command's
    (exit 2): the option names something this build may not use."""
    if transient.is_transient(error) and not transient.is_denied(error):
        if isinstance(error, transient.StorageUnavailable):
            raise error
        raise transient.StorageUnavailable(
            f"{what}: storage did not answer ({' '.join(str(error).split())[:200]}); "
            "nothing was built: run again once it does") from error


def read_label_file(path):
    """--label_file -> its class names, in order: one unique name per line."""
    try:  # gs://: one GET through the process's client, retried as every read of ours
        data = transient.retrying(lambda: files.read_bytes(path), f"--label_file {path}")
        names = [l.strip() for l in data.decode().splitlines() if l.strip()]
    except Exception as e:
        _outage(e, f"--label_file {path}")
        cause = e.__cause__ if isinstance(e, transient.StorageUnavailable) else e
        raise UserError(f"--label_file {path}: cannot read it ({cause})") from e
    if not names or len(set(names)) != len(names):
        raise UserError(f"--label_file {path}: needs one unique class name per line")
    return names
