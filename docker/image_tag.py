"""The worker image's tag, derived from what the image is built from; or check a reference.

    python docker/image_tag.py [--extras transform]     # prints e.g. 0.1.0-3f9a2c1b7d0e
    python docker/image_tag.py --check IMAGE            # exit 1 unless IMAGE is immutable

A tag like `:2.77.0` can be pushed again with other bytes while a job autoscales, giving one
version two code builds. This tag is the package version and 12 hex digits of a sha256 over
every file `docker/worker.Dockerfile` copies (the Dockerfile itself, setup.py,
constraints.txt, the packages' files, sorted by path; `__pycache__` and `.pyc` left out) and
the EXTRAS build argument: other code or other pins give another tag, the same tree the same
one anywhere. `--check` accepts a reference by digest (`@sha256:` and 64 hex digits) or one
whose tag has this form; anything else is refused in one line (the launcher image's build
runs it on WORKER_IMAGE). Standard library only: it runs before anything is installed.
"""

import argparse
import hashlib
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What docker/worker.Dockerfile COPYs (tests/test_containers.py checks the two agree).
FILES = ("constraints.txt", "setup.py", "docker/check_pins.py", "docker/worker.Dockerfile")
TREES = ("beam_pipeline", "dataset_format", "tf_quiet", "readers", "loaders")
DIGITS = 12
IMMUTABLE = re.compile(r"(@sha256:[0-9a-f]{64}|:\d[\w.+]*-[0-9a-f]{%d})$" % DIGITS)


def inputs(repo=REPO):
    """The repository-relative paths the worker image is built from, sorted."""
    paths = [p for p in FILES if os.path.exists(os.path.join(repo, p))]
    for tree in TREES:
        for folder, dirs, names in os.walk(os.path.join(repo, tree)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            paths += [os.path.relpath(os.path.join(folder, n), repo).replace(os.sep, "/")
                      for n in names if not n.endswith(".pyc")]
    return sorted(paths)


def version(repo=REPO):
    with open(os.path.join(repo, "beam_pipeline", "__init__.py")) as f:
        return re.search(r'__version__ = "(.+?)"', f.read()).group(1)


def tag(repo=REPO, extras=""):
    """VERSION-HEX12: the package version and a digest of the image's inputs and extras."""
    h = hashlib.sha256(f"extras={extras}\0".encode())
    for path in inputs(repo):
        with open(os.path.join(repo, path), "rb") as f:
            data = f.read()
        h.update(f"{path}\0{len(data)}\0".encode())
        h.update(data)
    return f"{version(repo)}-{h.hexdigest()[:DIGITS]}"


def mutable(image):
    """Why `image` may name other bytes tomorrow, or None when it cannot."""
    if IMMUTABLE.search(image):
        return None
    return (f"worker image {image!r} is a reused tag: name it by digest (IMAGE@sha256:...) "
            "or by the tag `python docker/image_tag.py` prints")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extras", default="", help="the image's EXTRAS build argument")
    parser.add_argument("--check", metavar="IMAGE", help="refuse IMAGE unless it is immutable")
    args = parser.parse_args(argv)
    if args.check is not None:
        why = mutable(args.check)
        if why:
            print(f"error: {why}", file=sys.stderr)
            return 1
        return 0
    print(tag(extras=args.extras))
    return 0


if __name__ == "__main__":
    sys.exit(main())
