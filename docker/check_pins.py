"""Fail unless every installed requirement of a package is the version constraints.txt pins.

    python check_pins.py constraints.txt "image-tfrecords[transform]" [pip setuptools ...]

Walks the installed requirement graph from the package (with its extras, markers evaluated
for this interpreter) and compares each distribution with its pin. The worker image runs
it after installing, and tests/test_packaging.py runs it in a fresh offline venv, so the
workers' stack is the tested one. Exit 1 with one line per mismatch; 0 when all match.
"""

import importlib.metadata as md
import re
import sys

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # a bare image: pip always carries a copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name


def pins(path):
    found = {}
    for line in open(path):
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            found[canonicalize_name(name)] = version.strip()
    return found


def closure(tops):
    """{canonical name: installed version} of `tops` and everything they require."""
    seen, done, todo = {}, set(), [(Requirement(top), "the command line") for top in tops]
    while todo:
        req, parent = todo.pop()
        name = canonicalize_name(req.name)
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            raise SystemExit(f"{req} (needed by {parent}) is not installed") from None
        seen[name] = dist.version
        for extra in {""} | set(req.extras):  # "" = the requirements without an extra
            if (name, extra) in done:
                continue
            done.add((name, extra))
            for sub in map(Requirement, dist.requires or ()):
                marker = str(sub.marker or "")
                if sub.marker is None and not extra or sub.marker is not None and (
                        ("extra" in marker) == bool(extra)) and sub.marker.evaluate(
                        {"extra": extra}):
                    todo.append((sub, name))
    return seen


def main(argv):
    constraints, *tops = argv
    pinned, installed = pins(constraints), closure(tops)
    bad = [f"{name}: installed {version}, constraints.txt pins {pinned[name]}"
           for name, version in sorted(installed.items())
           if name in pinned and pinned[name] != version]
    same = sum(pinned.get(name) == version for name, version in installed.items())
    own = canonicalize_name(Requirement(tops[0]).name)
    unpinned = sorted(set(installed) - set(pinned) - {own})
    for line in bad:
        print(line, file=sys.stderr)
    print(f"{len(installed)} distributions in the closure of {' '.join(tops)}: {same} match "
          f"their pins, {len(bad)} differ, {len(unpinned)} not pinned"
          f"{': ' + ', '.join(unpinned) if unpinned else ''}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
