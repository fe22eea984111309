"""Check a dataset against its manifest: `python -m beam_pipeline.tools.verify PATH`.

PATH is a dataset root (LATEST is followed once) or a version directory, local or gs://.
Checked, file by file and record by record, with no trust in anything but manifest.json:

  * every file the manifest names is there: shards, their .index files, errors.jsonl, TFDS files
  * each shard's size and checksum (crc32c; sha256 in versions written before) equal the
    manifest's
  * each TFRecord frame is whole and both its CRCs (length and data) are valid
  * each record parses as a tf.train.Example whose label id and class name agree
  * records per shard, per split and per class equal the manifest's counts, and the
    manifest's own sums add up (docs/format.md, "manifest.json")
  * each .index line is the offset and length of the frame at that position
  * catalog.parquet reads, has the manifest's row count, and each row's offset and length
    are a record of its shard with the row's key, split and image sha256
  * TFDS dataset_info.json shard lengths equal the manifest's

Exit status 0 when nothing is wrong, 1 with a report of every problem found, 2 when PATH is
not a dataset at all. A read of any of these files (the manifest or LATEST, the catalog, a
shard, an index, errors.jsonl, the TFDS metadata) that fails without proving damage (a 503
or timeout past the retries, a 401/403, EACCES, EIO) is neither: exit 1 with one line,
"cannot read X (reason)", and no report; run verify again once storage answers. The files
are read through the project's storage layer (tools/verify_reads.py), not tf.io.gfile.
"""

import argparse
import json
import sys

from beam_pipeline.store import transient
from beam_pipeline.tools import near_rejects, verify_copy, verify_reads
from beam_pipeline.tools.verify_catalog import CatalogCheck
from beam_pipeline.tools.verify_reads import ADVICE
from beam_pipeline.tools.verify_shards import check_shard
from dataset_format import dataset_info, fields, layout, refs
import tf_quiet


class NotADataset(Exception):
    """PATH has no manifest.json and no LATEST, or the manifest is not one (not JSON, a
    format this reader does not know)."""


class _Problems:
    def __init__(self):
        self.items = []

    def add(self, where, message):
        self.items.append(f"{where}: {message}")


def _read_listed(path, rel, problems):
    """A file the manifest lists, as text; None (and the problem "missing") when it is not
    there. An outage raises StorageUnavailable."""
    try:
        return verify_reads.read_text(path)
    except FileNotFoundError:
        problems.add(rel, "missing (the manifest lists it)")
        return None


def _check_errors_file(vdir, manifest, problems):
    errors = manifest.get("errors") or {}
    rel = errors.get("path", layout.ERRORS)
    text = _read_listed(layout.join(vdir, rel), rel, problems)
    if text is None:
        return
    lines = [l for l in text.splitlines() if l.strip()]
    if len(lines) != errors.get("count", len(lines)):
        problems.add(rel, f"{len(lines)} lines, manifest errors.count is {errors['count']}")


def _check_near_duplicates_file(vdir, manifest, problems):
    near = manifest.get("near_duplicates")
    if not near:
        return
    text = _read_listed(layout.join(vdir, near["path"]), near["path"], problems)
    if text is None:
        return
    lines = sum(1 for l in text.split("\n") if l.strip())
    field = "pairs" if "pairs" in near else "groups"  # groups: before pairs were confirmed
    if lines != near[field]:
        problems.add(near["path"], f"{lines} lines, manifest near_duplicates.{field} is "
                                   f"{near[field]}")


def _check_tfds(vdir, info, problems):
    tfds = info.manifest.get("tfds")
    if not tfds:
        return
    for rel in tfds.get("files", []):
        if not verify_reads.exists(layout.join(vdir, rel)):
            problems.add(rel, "missing (TFDS metadata the manifest lists)")
    info_path = layout.join(vdir, layout.TFDS_DATASET_INFO)
    if layout.TFDS_DATASET_INFO in tfds.get("files", []) and verify_reads.exists(info_path):
        tfds_info = json.loads(verify_reads.read_text(info_path))
        for s in tfds_info.get("splits", []):
            split = info.splits.get(s["name"])
            want = [sh.num_examples for sh in split.shards] if split else None
            got = [int(n) for n in s.get("shardLengths", [])]
            if got != want:
                problems.add(layout.TFDS_DATASET_INFO, f"split {s['name']!r} shard lengths {got} "
                                                  f"!= manifest {want}")


def check(path):
    """Verify a dataset root or version dir. Returns a dict: problems, version_dir, counts.

    Raises NotADataset when there is no manifest at PATH, StorageUnavailable when it (or
    the catalog) could not be read for a reason that is not the file's.
    """
    try:  # dataset_format.storage: google-cloud-storage retries 429/5xx, retrying an EIO
        vdir, manifest = transient.retrying(lambda: dataset_info.load_manifest(path), path)
    except transient.StorageUnavailable as e:  # not the file's: neither damage nor a mistake
        raise transient.unavailable(e.__cause__, f"the manifest of {path}", ADVICE) from e
    except Exception as e:  # damage (retrying raises nothing else): missing, not a manifest
        raise NotADataset(str(e)) from e
    problems = _Problems()
    info = dataset_info.from_manifest(vdir, manifest)
    labels, label_offset = list(info.labels), info.label_offset
    write_index = bool(info.config.get("write_index", False))
    files = records = 0
    written = 0
    catalog = CatalogCheck(vdir, manifest, problems)
    field_schema = fields.from_json(manifest["fields"]) if manifest.get("fields") else None
    for split, s in sorted(info.splits.items()):
        counted, readable = {}, True
        for shard in s.shards:
            counts = check_shard(shard, labels, label_offset, write_index=write_index,
                                 problems=problems, catalog=catalog, split=split,
                                 field_schema=field_schema)
            files += 1
            if counts is None:
                readable = False
                continue
            for label, n in counts.items():
                counted[label] = counted.get(label, 0) + n
                records += n
        _check_split(split, s, counted if readable else None, problems)
        written += s.num_examples
    _check_accounting(manifest.get("accounting"), written, problems)
    catalog.finish([sh.name for s in info.splits.values() for sh in s.shards])
    _check_errors_file(vdir, manifest, problems)
    _check_near_duplicates_file(vdir, manifest, problems)
    _check_tfds(vdir, info, problems)
    return {"problems": problems.items, "version_dir": vdir, "version": info.version,
            "shards": files, "records": records, "warnings": _warnings(manifest)}


def _check_split(split, s, counted, problems):
    """A split's manifest sums (shards, bytes, classes) and, when every shard was read to its
    end (`counted`: records per class; None otherwise), its records per class."""
    shard_sum = sum(sh.num_examples for sh in s.shards)
    if shard_sum != s.num_examples:
        problems.add(f"manifest split {split!r}", f"num_examples {s.num_examples} but its "
                                                  f"shards add up to {shard_sum}")
    bytes_sum = sum(sh.num_bytes or 0 for sh in s.shards)
    if s.num_bytes is not None and bytes_sum != s.num_bytes:
        problems.add(f"manifest split {split!r}", f"num_bytes {s.num_bytes} but its "
                                                  f"shards add up to {bytes_sum}")
    if sum(s.label_counts.values()) != s.num_examples:
        problems.add(f"manifest split {split!r}",
                     f"label_counts add up to {sum(s.label_counts.values())}, "
                     f"num_examples is {s.num_examples}")
    if counted is not None:
        for label in sorted(set(counted) | set(s.label_counts)):
            want, got = s.label_counts.get(label, 0), counted.get(label, 0)
            if want != got:
                problems.add(f"split {split!r}",
                             f"class {label!r}: {got} records, manifest says {want}")
        total = sum(counted.values())
        if total != s.num_examples:
            problems.add(f"split {split!r}",
                         f"{total} records, manifest num_examples is {s.num_examples}")
    else:
        problems.add(f"split {split!r}", "records per class not counted: a shard is missing "
                                         "or cannot be read to its end (see above)")


def _check_accounting(acc, written, problems):
    """The manifest's accounting against the records the splits hold."""
    if not acc:
        return
    if acc.get("written") != written:
        problems.add("manifest accounting", f"written {acc.get('written')} but the splits "
                                            f"hold {written}")
    parts = (acc.get("duplicates", 0) + acc.get("failed", 0) + acc.get("written", 0)
             + acc.get("leaks", 0))
    if acc.get("listed") != parts:
        problems.add("manifest accounting", f"listed {acc.get('listed')} != duplicates + "
                                            f"failed + written + leaks = {parts}")


def _warnings(manifest):
    """Not damage, but worth knowing before training: the same image (byte for byte, or a
    near copy) in train and in an evaluation split."""
    warnings = []
    dup = manifest.get("content_duplicates") or {}
    if dup.get("across_splits"):
        warnings.append(f"{dup['across_splits']} group(s) of byte-identical images span splits "
                        f"(a test image also in train inflates accuracy); see {dup['path']}, "
                        "or rebuild with --drop_content_duplicates")
    near = manifest.get("near_duplicates") or {}
    kept = near.get("leaks", 0) - near.get("excluded", 0)
    if kept:
        warnings.append(f"{kept} evaluation image(s) are near-duplicates of train images "
                        f"(confirmed pairs: resized, re-compressed or lightly cropped "
                        f"copies inflate accuracy); see {near['path']} (side by "
                        "side: inspect_dataset's near_duplicates.png), or rebuild with "
                        "--drop_near_duplicate_leaks")
    return warnings


def _tags_line(vdir, version):
    """'; tagged a, b' for the tags of the root naming this version ('' for none)."""
    root = layout.root_of(vdir)
    try:
        names = refs.tags_of(root, version) if root else []
    except Exception:  # a listing that fails costs the line, not the check
        names = []
    return f"; tagged {', '.join(names)}" if names else ""


def verify(path):
    """Verify a dataset root or version dir against its manifest; returns a list of problems.

    An empty list means the dataset is intact. A PATH with no manifest is reported as a
    single problem; a read that failed without proving damage raises StorageUnavailable.
    """
    try:
        return check(path)["problems"]
    except NotADataset as e:
        return [str(e)]


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m beam_pipeline.tools.verify", allow_abbrev=False,
        description="Check a dataset root or version directory against its manifest.json.")
    parser.add_argument("path", help="dataset root (follows LATEST) or versions/V directory")
    parser.add_argument("--verbose", action="store_true",
                        help="also show TensorFlow's start-up lines")
    parser.add_argument("--near_duplicate_rejects", type=int, default=0, metavar="N",
                        help="also print the N rejected cross-split near-duplicate pairs "
                             "closest to the limits, with the measure that rejected each")
    args = parser.parse_args(argv)
    if args.near_duplicate_rejects < 0:
        parser.error(f"--near_duplicate_rejects {args.near_duplicate_rejects}: must be >= 0")
    tf_quiet.install(args.verbose)  # before TensorFlow loads
    try:
        return _report(check(args.path), args.near_duplicate_rejects)
    except NotADataset as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except transient.StorageUnavailable as e:  # during the check or the advice after it
        print(f"error: {e}", file=sys.stderr)
        return 1


def _report(result, near_duplicate_rejects):
    """Prints the outcome of `check` and returns the exit status (0 OK, 1 FAILED)."""
    where = result["version_dir"]
    for warning in result["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)
    if near_duplicate_rejects > 0:
        _print_near_duplicate_rejects(where, near_duplicate_rejects)
    tags = _tags_line(where, result["version"])
    if not result["problems"]:
        print(f"OK {where}: {result['shards']} shards, {result['records']} records; sizes, "
              f"checksums, CRCs, counts and indexes match manifest.json{tags}")
        return 0
    print(f"FAILED {where}: {len(result['problems'])} problem(s)", file=sys.stderr)
    for p in result["problems"]:
        print(f"  - {p}", file=sys.stderr)
    print(verify_copy.advice(where, dataset_info.load_manifest(where)[1]), file=sys.stderr)
    return 1


def _print_near_duplicate_rejects(vdir, n):
    _, manifest = dataset_info.load_manifest(vdir)
    print("\n".join(near_rejects.closest(vdir, manifest, n)))


if __name__ == "__main__":
    sys.exit(main())
