"""The code build a process writes shards with: this package's version and the codecs' (a
shard's bytes depend on them), as a small dict every ShardResult carries.

A worker image re-pushed under the same tag while a job autoscales would give one version
shards of two builds; commit compares the builds its shards recorded and refuses such a
version (job/commit.py), and the launcher reuses a previous version's records only when the
build that wrote them is the one that will write this version's (launcher/policy.py).
"""

import functools
import importlib.metadata as md

from beam_pipeline import __version__

# The fields, in the order messages name them (docs/format.md, `build.workers`).
FIELDS = ("image_tfrecords", "apache_beam", "pillow", "libjpeg_turbo", "simplejpeg")


@functools.lru_cache(maxsize=1)
def worker_build():
    """{field: version or None} of this process (read once: a process runs one build)."""
    def version(package):
        try:
            return md.version(package)
        except md.PackageNotFoundError:
            return None

    try:
        from PIL import features

        turbo = features.version("libjpeg_turbo")  # the JPEG library Pillow was built with
    except Exception:
        turbo = None
    return {"image_tfrecords": __version__, "apache_beam": version("apache-beam"),
            "pillow": version("pillow"), "libjpeg_turbo": turbo,
            "simplejpeg": version("simplejpeg")}


def describe(build):
    """A build as one short text: 'image_tfrecords 0.1.0, apache_beam 2.77.0, ...'."""
    if not build:
        return "an unrecorded build"
    return ", ".join(f"{k} {build.get(k) or '-'}" for k in
                     (*FIELDS, *sorted(set(build) - set(FIELDS))))
