"""Name a version of a dataset root so retention keeps it (a release, a paper's data):

    python -m beam_pipeline.tools.tag ROOT list
    python -m beam_pipeline.tools.tag ROOT create NAME [VERSION]   # default: LATEST's
    python -m beam_pipeline.tools.tag ROOT move NAME [VERSION]
    python -m beam_pipeline.tools.tag ROOT delete NAME

Readers take the name wherever they take a version id (`readers.info(ROOT, version=NAME)`,
`make_dataset(..., version=NAME)`, the loaders). Writes take the root's lock
(store/tags.py): while a build runs, exit 2 naming it, or wait for it with --wait. `list`
also shows the versions live leases hold (dataset_format/holds.py).

Exit status 0, or 2 with one line (a bad name, no such version or tag, the root locked).
"""

import argparse
import sys

from beam_pipeline.errors import UserError
from beam_pipeline.store import protected, tags
from dataset_format import refs


def listing(root):
    """Lines naming each tag (and each held version) of ROOT."""
    found = refs.list_tags(root)
    lines = [f"{name}\t{tag.version}\t{tag.created_at or '?'}\t{tag.by or '?'}"
             for name, tag in sorted(found.items())]
    held = protected.read(root).held
    lines += [f"(held)\t{v}\t{len(h)} live lease(s): {', '.join(h)}"
              for v, h in sorted(held.items())]
    return lines or [f"{root}: no tags, no holds"]


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m beam_pipeline.tools.tag", allow_abbrev=False,
        description="List, create, move or delete the tags of a dataset root; retention "
                    "never deletes a tagged version.")
    parser.add_argument("root", help="dataset root (the --output of the builds)")
    parser.add_argument("action", choices=["list", "create", "move", "delete"])
    parser.add_argument("name", nargs="?", help="the tag (create, move, delete)")
    parser.add_argument("version", nargs="?",
                        help="a version id or another tag (create, move; default LATEST's)")
    parser.add_argument("--wait", action="store_true",
                        help="wait for a build holding the root instead of exiting 2")
    args = parser.parse_args(argv)
    root = args.root.rstrip("/")
    try:
        if args.action == "list":
            print("\n".join(listing(root)))
            return 0
        if not args.name:
            raise UserError(f"{args.action} needs a tag NAME")
        if args.action == "delete":
            if args.version:
                raise UserError("delete takes a tag NAME only")
            gone = tags.delete(root, args.name, wait=args.wait)
            print(f"deleted tag {gone.name} (it named version {gone.version})")
            return 0
        tag = tags.create(root, args.name, args.version, wait=args.wait,
                          move=args.action == "move")
        print(f"{tag.name} -> version {tag.version} of {root}")
        return 0
    except (UserError, ValueError, FileNotFoundError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
