"""List inputs: directories, globs and CSV/JSONL manifests -> ImageRefs, with no image bytes read.

Runs in the launcher, before any heavy work, so a bad --input fails in a second and the
listing can be fingerprinted; the pipeline then reads the listing as a file.
"""

import csv
import io
import json
import posixpath

from apache_beam.io.filesystems import FileSystems

from beam_pipeline.errors import UserError, error_record
from beam_pipeline.plan import SPLIT_NAMES, ImageRef

IMAGE_EXTENSIONS = {".jpg", ".jpeg", ".png", ".gif", ".bmp", ".tif", ".tiff", ".webp"}
GLOB_CHARS = set("*?[")


def list_inputs(specs):
    """All specs -> (unique refs sorted by key, listing errors, duplicate count, listed count)."""
    refs, errors = [], []
    for spec in specs:
        found, bad = _list_spec(spec)
        refs.extend(found)
        errors.extend(bad)
    unique, duplicates, conflicts = dedupe(refs)
    errors.extend(conflicts)
    return unique, errors, duplicates, len(refs) + len(errors) - len(conflicts)


def dedupe(refs):
    """Same key twice: written once and counted; with another label or split, it's an error."""
    first, duplicates, conflicts = {}, 0, []
    for ref in sorted(refs):
        seen = first.setdefault(ref.key, ref)
        if seen is ref:
            continue
        if (seen.label, seen.split) == (ref.label, ref.split):
            duplicates += 1
        else:
            conflicts.append(error_record(
                ref.uri, "read", "conflicting_duplicate",
                f"listed again with label {ref.label!r}, split {ref.split!r}; kept label "
                f"{seen.label!r}, split {seen.split!r}"))
    return sorted(first.values()), duplicates, conflicts


def _list_spec(spec):
    lower = spec.lower()
    if lower.endswith((".csv", ".jsonl")) and not GLOB_CHARS & set(spec):
        return _list_manifest(spec)
    if GLOB_CHARS & set(spec):
        return _list_glob(spec), []
    return _list_directory(spec.rstrip("/")), []


def _match(pattern):
    try:
        return FileSystems.match([pattern])[0].metadata_list
    except Exception as e:  # Beam raises BeamIOError for "nothing matched" and I/O alike
        if "No files found" in str(e) or "matched no files" in str(e):
            return []
        raise UserError(f"--input {pattern}: cannot list it ({e})") from e


def _list_directory(root):
    matches = [m for m in _match(root + "/**") if _is_image_name(m.path)]
    if not matches:
        raise UserError(f"--input {root}: no image files found (expected {root}/<class>/<image>, "
                        f"extensions {', '.join(sorted(IMAGE_EXTENSIONS))})")
    refs = []
    for m in matches:
        rel = _relative(root, m.path)
        parts = rel.split("/")
        split = None
        if len(parts) >= 3 and parts[0] in SPLIT_NAMES:
            split, parts = parts[0], parts[1:]
        label = parts[0] if len(parts) >= 2 else ""
        refs.append(ImageRef(m.path, m.path, rel, label, split, m.size_in_bytes,
                             m.last_updated_in_seconds))
    unlabelled = [r.filename for r in refs if not r.label]
    if unlabelled:
        raise UserError(f"--input {root}: {len(unlabelled)} image(s) are not in a class folder "
                        f"(e.g. {unlabelled[0]}); use {root}/<class>/<image> or a CSV manifest")
    return refs


def _list_glob(pattern):
    matches = _match(pattern)
    if not matches:
        raise UserError(f"--input {pattern}: no files match")
    prefix = pattern[:min(pattern.index(c) for c in GLOB_CHARS if c in pattern)]
    root = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
    refs = []
    for m in matches:
        label = posixpath.basename(posixpath.dirname(m.path))
        refs.append(ImageRef(m.path, m.path, _relative(root, m.path), label, None,
                             m.size_in_bytes, m.last_updated_in_seconds))
    return refs


def _read_manifest_rows(path):
    try:
        with FileSystems.open(path) as f:
            text = f.read().decode("utf-8-sig")
    except Exception as e:
        raise UserError(f"--input {path}: cannot read manifest ({e})") from e
    if path.lower().endswith(".jsonl"):
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise UserError(f"{path}:{n}: not valid JSON ({e.msg})") from e
        return rows
    reader = csv.DictReader(io.StringIO(text))
    if not reader.fieldnames or not {"uri", "label"} <= set(reader.fieldnames):
        raise UserError(f"{path}: a manifest needs a header with columns uri,label[,split]; "
                        f"found {reader.fieldnames}")
    return list(reader)


def _list_manifest(path):
    rows = _read_manifest_rows(path)
    if not rows:
        raise UserError(f"--input {path}: manifest has no rows")
    base = posixpath.dirname(path)
    refs, errors, wanted = [], [], {}
    for n, row in enumerate(rows, 1):
        uri, label = str(row.get("uri") or "").strip(), str(row.get("label") or "").strip()
        split = str(row.get("split") or "").strip() or None
        if not uri or not label:
            errors.append(error_record(uri or f"{path}:{n}", "read", "bad_manifest_row",
                                       f"{path} row {n} needs both uri and label"))
            continue
        full = uri if "://" in uri or uri.startswith("/") else posixpath.join(base, uri)
        if "://" not in full:  # one key per local file: data/./a.jpg, x/../data/a.jpg, data/a.jpg
            full = posixpath.normpath(full)
        wanted.setdefault(full, []).append((uri, label, split))
    sizes = _stat_all(list(wanted))
    for full, entries in wanted.items():
        for uri, label, split in entries:
            if full not in sizes:
                errors.append(error_record(full, "read", "not_found", "listed in the manifest "
                                           "but no such file"))
                continue
            size, mtime = sizes[full]
            refs.append(ImageRef(full, full, uri, label, split, size, mtime))
    return refs, errors


def _stat_all(paths):
    """path -> (size, mtime) for the paths that exist.

    One listing per folder rather than one request per file: a manifest of a million
    gs:// uris in a few folders costs a few list calls, not a million metadata GETs.
    """
    by_folder = {}
    for path in paths:
        by_folder.setdefault(posixpath.dirname(path), set()).add(path)
    out = {}
    for folder, wanted in by_folder.items():
        if GLOB_CHARS & set(folder):  # can't list it as a pattern: ask for each file
            patterns = sorted(wanted)
        else:
            patterns = [folder + "/*"]
        for pattern in patterns:
            try:
                found = FileSystems.match([pattern])[0].metadata_list
            except Exception:  # nothing matched
                continue
            for m in found:
                if m.path in wanted:
                    out[m.path] = (m.size_in_bytes, m.last_updated_in_seconds)
    return out


def _relative(root, path):
    root = root.rstrip("/") + "/" if root else ""
    return path[len(root):] if root and path.startswith(root) else posixpath.basename(path)


def _is_image_name(path):
    name = posixpath.basename(path)
    return not name.startswith(".") and posixpath.splitext(name)[1].lower() in IMAGE_EXTENSIONS
