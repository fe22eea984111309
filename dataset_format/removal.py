"""The one line a reader says when retention removed the version it reads (or means to).

A removed version shows as missing files; said as such ("shard file missing", "not a
decodable image record") it points at corruption. Here a missing file is checked against
its version's manifest: gone too means retention removed the version, and the message says
that, and how to keep one next time (a hold or a tag).
"""

import os
import posixpath

from dataset_format import layout, storage


class VersionRemoved(FileNotFoundError):
    """The version read was removed by retention."""


def message(root, version, certain=True):
    """The line; `certain` False when the version's directory is gone whole, so it may as
    well never have been published."""
    head = (f"version {version} of {root} was removed by retention (--keep_versions)"
            if certain else f"version {version!r} does not exist under {root}: retention "
            "removed it (--keep_versions), or it was never published")
    return (f"{head}; to keep a version a job reads, hold it while reading (readers.info("
            f"ROOT, version={version!r}, hold=True), or hold=True in make_dataset and the "
            f"loaders) or tag it (python -m beam_pipeline.tools.tag ROOT create NAME VERSION)")


def removed(vdir):
    """Whether the version directory `vdir` of a root has no manifest any more (retention
    removed it); False for a directory outside a root, or when it cannot be told."""
    root = layout.root_of(vdir)
    if root is None:
        return False
    try:
        return not storage.exists(layout.join(str(vdir).rstrip("/"), layout.MANIFEST))
    except Exception:  # a reader's error path: the original error stands
        return False


def error(vdir):
    """VersionRemoved for the version directory `vdir`."""
    vdir = str(vdir).rstrip("/")
    real = vdir if "://" in vdir else os.path.realpath(vdir)
    return VersionRemoved(message(layout.root_of(vdir), posixpath.basename(real)))


def check_present(vdir):
    """Raise VersionRemoved when the version at `vdir` was removed since it was opened:
    before any reading, so a job fails in seconds, not at its first missing shard."""
    if removed(vdir):
        raise error(vdir)


def explain(vdir, e):
    """`e` (an error reading a file of the version at `vdir`), or VersionRemoved when that
    version was removed meanwhile."""
    return error(vdir) if isinstance(e, FileNotFoundError) and removed(vdir) else e
