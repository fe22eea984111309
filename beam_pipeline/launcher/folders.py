"""Directory and glob inputs -> ImageRefs: a file's class is its folder, an optional split
folder above it. Apart from the walk itself (walk.py), so the rules for what a listed path
means are read in one place."""

import posixpath
import re
import unicodedata

from beam_pipeline.errors import UserError
from beam_pipeline.launcher.walk import Special, special_record, walk
from beam_pipeline.refs import SPLIT_NAMES, ImageRef
from dataset_format.error_record import ErrorRecord

IMAGE_EXTENSIONS = {".jpg", ".jpeg", ".png", ".gif", ".bmp", ".tif", ".tiff", ".webp"}
GLOB_CHARS = set("*?[")


def list_directory(root):
    found, labels = 0, {}  # class folder -> its label, checked once
    for rel, uri, size, stamp, md5 in walk(root):
        if not _is_image_name(rel):
            continue
        if size is None:
            found += 1
            yield _unlisted(uri, stamp)
            continue
        parts = rel.split("/")
        split = None
        if len(parts) >= 3 and parts[0] in SPLIT_NAMES:
            split, parts = parts[0], parts[1:]
        if len(parts) < 2:
            raise UserError(f"--input {root}: {rel} is not in a class folder; use "
                            f"{root}/<class>/<image> or a CSV manifest")
        found += 1
        label = labels.get(parts[0]) or labels.setdefault(
            parts[0], _folder_label(parts[0], root, rel))
        yield ImageRef(rel, uri, label, split, size, stamp, md5=md5)
    if not found:
        raise UserError(f"--input {root}: no image files found (expected {root}/<class>/<image>, "
                        f"extensions {', '.join(sorted(IMAGE_EXTENSIONS))})")


def _unlisted(uri, stamp):
    """The errors.jsonl row of a walked path with no size: a special file, or a broken link."""
    if isinstance(stamp, Special):
        return special_record(uri, stamp)
    return ErrorRecord(uri, "read", "not_found", "a broken symbolic link, or deleted while "
                                                 "listing")


def glob_root(pattern):
    prefix = pattern[:min(pattern.index(c) for c in GLOB_CHARS if c in pattern)]
    return prefix.rsplit("/", 1)[0] if "/" in prefix else ""


def list_glob(pattern):
    root = glob_root(pattern)
    regex = re.compile(_glob_regex(pattern))
    found = 0
    for rel, uri, size, stamp, md5 in walk(root or "."):
        if not regex.fullmatch(f"{root}/{rel}" if root else rel):
            continue
        found += 1
        if size is None:
            yield _unlisted(uri, stamp)
            continue
        label = _folder_label(posixpath.basename(posixpath.dirname(uri)), pattern, rel)
        yield ImageRef(rel, uri, label, None, size, stamp, md5=md5)
    if not found:
        raise UserError(f"--input {pattern}: no files match")


def has_control(text):
    """Control characters and line separators: they would break the line-based files
    (sort spills, TFDS label files) that labels and splits are written into."""
    return any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in text)


def _folder_label(name, spec, rel):
    if has_control(name):
        raise UserError(f"--input {spec}: class folder {name!r} (of {rel!r}) has a control "
                        "character; rename it")
    return name


def _glob_regex(pattern):
    """Beam's glob rules: '*' and '?' stay inside one folder, '**' crosses folders."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                out.append(re.escape(c))
            else:
                out.append("[" + pattern[i + 1:end].replace("!", "^", 1) + "]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def _is_image_name(path):
    name = posixpath.basename(path)
    return not name.startswith(".") and posixpath.splitext(name)[1].lower() in IMAGE_EXTENSIONS
