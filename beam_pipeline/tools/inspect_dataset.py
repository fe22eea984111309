"""Look at a dataset before training on it: `python -m beam_pipeline.tools.inspect_dataset PATH --out DIR`.

Prints the manifest summary (splits, classes, counts, rejected inputs by reason) and writes
two PNGs into DIR, three for a version built with --near_duplicates:

  contact_sheet.png        N records sampled across the splits, each titled with its class name
  class_counts.png         a bar chart of examples per class, one bar per split
  near_duplicates.png      up to N confirmed near-duplicate pairs that span splits, side by
                           side (near_duplicates.jsonl order), then the closest candidates the
                           descriptor rejected, captioned with key, split and distances

This module is the command and the summary text; samples.py picks records from the
shards without a full read, drawing.py draws the PNGs. A read that fails without proving
damage (a 503 past the retries, a 403) is one line, "error: cannot read FILE (...)", and
exit 1; a path with no dataset, or a split it does not have, exit 2.
"""

import argparse
import sys

from beam_pipeline.manifest_text import class_table, near_duplicates_line
from beam_pipeline.store import transient
from beam_pipeline.tools.drawing import class_counts_chart, contact_sheet, near_duplicate_sheet
from beam_pipeline.tools.samples import MissingShard, cross_split_pairs, ordered_splits, sample
from beam_pipeline.tools.verify_reads import INSPECT_ADVICE
from dataset_format import dataset_info, layout, refs
import tf_quiet

CONTACT_SHEET = "contact_sheet.png"
CLASS_COUNTS = "class_counts.png"
NEAR_DUPLICATE_SHEET = "near_duplicates.png"


def summary(manifest, version_dir=None):
    """The manifest as a few lines of text: splits, classes, counts, errors by reason."""
    splits = ordered_splits(manifest)
    labels = list(manifest.get("labels", []))
    lines = [f"{manifest.get('name')} version {manifest.get('version')} "
             f"(created {manifest.get('created_at')})"
             + (f"  {version_dir}" if version_dir else "")]
    lines.append(f"{len(labels)} classes, {len(splits)} splits: " + ", ".join(
        f"{s} {manifest['splits'][s]['num_examples']} examples in "
        f"{len(manifest['splits'][s]['shards'])} shard(s), "
        f"{manifest['splits'][s].get('num_bytes', 0) / 2**20:.2f} MiB" for s in splits))
    lines += class_table(manifest, splits, all_column=True)
    acc = manifest.get("accounting")
    if acc:
        lines.append(f"inputs: listed {acc.get('listed')} = written {acc.get('written')} + "
                     f"duplicates {acc.get('duplicates')} + failed {acc.get('failed')}")
    near = manifest.get("near_duplicates")
    if near:
        lines.append(f"{near_duplicates_line(manifest)}; see {near['path']}")
    errors = manifest.get("errors") or {}
    if errors.get("count"):
        reasons = ", ".join(f"{r}: {n}" for r, n in
                            sorted(errors.get("by_reason", {}).items(), key=lambda kv: (-kv[1], kv[0])))
        lines.append(f"rejected {errors['count']} ({reasons}); see {errors.get('path')}")
    else:
        lines.append("rejected 0")
    if manifest.get("tfds"):
        lines.append(f"TFDS metadata: {', '.join(manifest['tfds'].get('files', []))}")
    return "\n".join(lines)


def inspect(path, out_dir, n=16, split=None, seed=0):
    """Summary text and the two PNGs for a dataset root or version dir.

    Returns {"summary": text, "contact_sheet": png path, "class_counts": png path,
    "version_dir": …}.
    """
    import tensorflow as tf

    try:  # as verify reads it: 429/5xx retried (google-cloud-storage), a local EIO too
        version_dir, manifest = transient.retrying(lambda: dataset_info.load_manifest(path),
                                                   path)
    except transient.StorageUnavailable as e:  # not the file's: neither damage nor a mistake
        raise transient.unavailable(e.__cause__, f"the manifest of {path}",
                                    INSPECT_ADVICE) from e.__cause__
    tf.io.gfile.makedirs(out_dir)
    sheet = layout.join(out_dir, CONTACT_SHEET)
    chart = layout.join(out_dir, CLASS_COUNTS)
    samples = sample(version_dir, manifest, n, split, seed)
    contact_sheet(samples, sheet, f"{manifest.get('name')} {manifest.get('version')}: "
                                  f"{len(samples)} sampled records"
                                  + (f" from {split}" if split else ""))
    class_counts_chart(manifest, chart)
    result = {"summary": summary(manifest, version_dir), "contact_sheet": sheet,
              "class_counts": chart, "version_dir": version_dir}
    if manifest.get("near_duplicates"):
        pairs = cross_split_pairs(version_dir, manifest, n)
        result["near_duplicates"] = layout.join(out_dir, NEAR_DUPLICATE_SHEET)
        near_duplicate_sheet(pairs, result["near_duplicates"],
                             f"{len(pairs)} near-duplicate pair(s) across splits "
                             f"(pHash within {manifest['near_duplicates']['radius']} bits)")
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m beam_pipeline.tools.inspect_dataset", allow_abbrev=False,
        description="Print a dataset's manifest summary and write a contact sheet and a "
                    "class-count chart (PNG).")
    parser.add_argument("path", help="dataset root (follows LATEST) or versions/V directory")
    parser.add_argument("--out", default=".", help="directory for the PNGs (default: .)")
    parser.add_argument("--n", type=int, default=16, help="records on the contact sheet")
    parser.add_argument("--split", default=None, help="sample only this split (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    parser.add_argument("--verbose", action="store_true",
                        help="also show TensorFlow's start-up lines")
    args = parser.parse_args(argv)
    tf_quiet.install(args.verbose)  # before TensorFlow loads
    if args.n < 0:
        parser.error("--n must be >= 0")
    try:
        result = inspect(args.path, args.out, args.n, args.split, args.seed)
    except (FileNotFoundError, KeyError, ValueError) as e:
        print(f"error: {e.args[0] if isinstance(e, KeyError) and e.args else e}",
              file=sys.stderr)
        return 2
    except (transient.StorageUnavailable,  # a read failed without proving damage
            MissingShard) as e:            # proven damage: neither a mistake nor an outage
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(result["summary"])
    tags = _tags(result["version_dir"])
    if tags:
        print(f"tags: {tags}")
    print(f"wrote {result['contact_sheet']}")
    print(f"wrote {result['class_counts']}")
    if "near_duplicates" in result:
        print(f"wrote {result['near_duplicates']}")
    return 0


def _tags(vdir):
    """The tags of the root naming the version inspected, and the root's other tags."""
    root = layout.root_of(vdir)
    try:
        found = refs.list_tags(root) if root else {}
    except Exception:  # a listing that fails costs the line
        return ""
    version = vdir.rstrip("/").rsplit("/", 1)[-1]
    return ", ".join(f"{n}{' (this version)' if t.version == version else ' -> ' + t.version}"
                     for n, t in sorted(found.items()))


if __name__ == "__main__":
    sys.exit(main())
