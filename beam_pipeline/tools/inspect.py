"""Look at a dataset before training on it: `python -m beam_pipeline.tools.inspect PATH --out DIR`.

Prints the manifest summary (splits, classes, counts, rejected inputs by reason) and writes
two PNGs into DIR:

  contact_sheet.png   N records sampled across the splits, each titled with its class name
  class_counts.png    a bar chart of examples per class, one bar per split

Sampling needs no full read: records are picked by (shard, position) from the manifest's
counts and fetched through the shard's .index file (seek to the offset), or by scanning
the shard up to that position when there is no index.
"""

import argparse
import io
import math
import random
import sys

from readers import layout, schema

CONTACT_SHEET = "contact_sheet.png"
CLASS_COUNTS = "class_counts.png"
SPLIT_ORDER = ("train", "validation", "test")
MAX_CHART_INCHES = 24.0   # bar chart width cap (100 dpi)
MAX_NAMED_CLASSES = 80    # beyond this, x ticks are class ids, not names


def _ordered_splits(manifest):
    order = {s: i for i, s in enumerate(SPLIT_ORDER)}
    return sorted(manifest.get("splits", {}), key=lambda s: (order.get(s, len(order)), s))


def summary(manifest, version_dir=None):
    """The manifest as a few lines of text: splits, classes, counts, errors by reason."""
    splits = _ordered_splits(manifest)
    labels = list(manifest.get("labels", []))
    lines = [f"{manifest.get('name')} version {manifest.get('version')} "
             f"(created {manifest.get('created_at')})"
             + (f"  {version_dir}" if version_dir else "")]
    lines.append(f"{len(labels)} classes, {len(splits)} splits: " + ", ".join(
        f"{s} {manifest['splits'][s]['num_examples']} examples in "
        f"{len(manifest['splits'][s]['shards'])} shard(s), "
        f"{manifest['splits'][s].get('num_bytes', 0) / 2**20:.2f} MiB" for s in splits))
    width = max([len(l) for l in labels] + [len("total"), len("class")])
    lines.append("  " + "class".ljust(width) + "".join(f"{s:>12}" for s in splits)
                 + f"{'all':>12}")
    for label in labels:
        row = [manifest["splits"][s].get("label_counts", {}).get(label, 0) for s in splits]
        lines.append("  " + label.ljust(width) + "".join(f"{n:>12}" for n in row)
                     + f"{sum(row):>12}")
    totals = [manifest["splits"][s]["num_examples"] for s in splits]
    lines.append("  " + "total".ljust(width) + "".join(f"{n:>12}" for n in totals)
                 + f"{sum(totals):>12}")
    acc = manifest.get("accounting")
    if acc:
        lines.append(f"inputs: listed {acc.get('listed')} = written {acc.get('written')} + "
                     f"duplicates {acc.get('duplicates')} + failed {acc.get('failed')}")
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


def _record_at(gfile, shard_path, position, index):
    """The serialized Example at `position` of a shard: seek via its index, else scan."""
    from beam_pipeline.records import read_frame

    with gfile.GFile(shard_path, "rb") as f:
        if index is not None:
            offset = index[position][0]
            f.seek(offset)
            return read_frame(f, offset)[0]
        offset = 0
        for _ in range(position):
            offset += read_frame(f, offset, check_crc=False)[1]
        return read_frame(f, offset)[0]


def _read_index(gfile, shard_path):
    path = layout.index_name(shard_path)
    if not gfile.exists(path):
        return None
    with gfile.GFile(path, "r") as f:
        return [tuple(int(x) for x in l.split()) for l in f.read().splitlines() if l.strip()]


def sample(version_dir, manifest, n, split=None, seed=0):
    """Up to `n` records, uniformly over the chosen split(s) (all by default).

    Returns [(split, class name, label id, PIL RGB image)], in sampling order.
    """
    import tensorflow as tf
    from PIL import Image
    from tensorflow.core.example import example_pb2

    splits = [split] if split else _ordered_splits(manifest)
    for s in splits:
        if s not in manifest["splits"]:
            raise KeyError(f"no split {s!r}; this version has {_ordered_splits(manifest)}")
    slots = [(s, sh["path"], k) for s in splits for sh in manifest["splits"][s]["shards"]
             for k in range(sh["num_examples"])]
    picked = sorted(random.Random(seed).sample(range(len(slots)), min(n, len(slots))))
    indexes, out = {}, []
    for i in picked:
        s, rel, k = slots[i]
        path = layout.join(version_dir, rel)
        if rel not in indexes:
            indexes[rel] = _read_index(tf.io.gfile, path)
        feature = example_pb2.Example.FromString(
            _record_at(tf.io.gfile, path, k, indexes[rel])).features.feature
        image = Image.open(io.BytesIO(feature[schema.ENCODED].bytes_list.value[0]))
        out.append((s, feature[schema.TEXT].bytes_list.value[0].decode(),
                    feature[schema.LABEL].int64_list.value[0], image.convert("RGB")))
    return out


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    return plt


def contact_sheet(samples, path, title=""):
    """A grid of the sampled images, each titled 'class (split)'; saved as PNG at `path`."""
    plt = _pyplot()
    cols = max(1, math.ceil(math.sqrt(len(samples))))
    rows = max(1, math.ceil(len(samples) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(2.0 * cols, 2.2 * rows + 0.4), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, (split, text, label, image) in zip(axes.flat, samples):
        ax.imshow(image)
        ax.set_title(f"{text} ({label})\n{split} {image.width}x{image.height}", fontsize=8)
    if not samples:
        axes.flat[0].text(0.5, 0.5, "no records", ha="center", va="center")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def class_counts_chart(manifest, path):
    """Grouped bars: examples per class (x) for each split (colour); saved as PNG at `path`."""
    plt = _pyplot()
    labels = list(manifest.get("labels", []))
    splits = _ordered_splits(manifest)
    # Wide enough to read a few dozen classes; capped so 1,000 classes still make a sane PNG.
    fig_width = min(MAX_CHART_INCHES, max(5.0, 0.4 * len(labels) * max(1, len(splits)) + 2.5))
    fig, ax = plt.subplots(figsize=(fig_width, 4.5 if len(labels) > 8 else 4))
    width = 0.8 / max(1, len(splits))
    for j, s in enumerate(splits):
        counts = [manifest["splits"][s].get("label_counts", {}).get(l, 0) for l in labels]
        bars = ax.bar([i + (j - (len(splits) - 1) / 2) * width for i in range(len(labels))],
                      counts, width, label=f"{s} ({manifest['splits'][s]['num_examples']})")
        if len(labels) <= 20:
            ax.bar_label(bars, fontsize=7)
    if len(labels) <= MAX_NAMED_CLASSES:
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=45 if len(labels) > 8 else 0,
                           ha="right" if len(labels) > 8 else "center",
                           fontsize=9 if len(labels) <= 30 else 6)
    else:
        ax.set_xlabel(f"class id (0-{len(labels) - 1}; too many classes to name)")
    ax.set_ylabel("examples")
    ax.set_title(f"{manifest.get('name')} {manifest.get('version')}: examples per class")
    ax.margins(y=0.12)
    ax.legend(title="split", loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def _save(fig, path):
    """PNG to a local path or gs:// (through tf.io.gfile)."""
    if "://" in path:
        import tensorflow as tf

        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
        with tf.io.gfile.GFile(path, "wb") as f:
            f.write(buf.getvalue())
    else:
        fig.savefig(path, format="png", dpi=100)


def inspect(path, out_dir, n=16, split=None, seed=0):
    """Summary text and the two PNGs for a dataset root or version dir.

    Returns {"summary": text, "contact_sheet": png path, "class_counts": png path,
    "version_dir": …}.
    """
    import tensorflow as tf

    version_dir, manifest = layout.load_manifest(path)
    tf.io.gfile.makedirs(out_dir)
    sheet = layout.join(out_dir, CONTACT_SHEET)
    chart = layout.join(out_dir, CLASS_COUNTS)
    samples = sample(version_dir, manifest, n, split, seed)
    contact_sheet(samples, sheet, f"{manifest.get('name')} {manifest.get('version')}: "
                                  f"{len(samples)} sampled records"
                                  + (f" from {split}" if split else ""))
    class_counts_chart(manifest, chart)
    return {"summary": summary(manifest, version_dir), "contact_sheet": sheet,
            "class_counts": chart, "version_dir": version_dir}


def main(argv=None):
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow loads
    parser = argparse.ArgumentParser(
        prog="python -m beam_pipeline.tools.inspect",
        description="Print a dataset's manifest summary and write a contact sheet and a "
                    "class-count chart (PNG).")
    parser.add_argument("path", help="dataset root (follows LATEST) or versions/V directory")
    parser.add_argument("--out", default=".", help="directory for the PNGs (default: .)")
    parser.add_argument("--n", type=int, default=16, help="records on the contact sheet")
    parser.add_argument("--split", default=None, help="sample only this split (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    args = parser.parse_args(argv)
    if args.n < 0:
        parser.error("--n must be >= 0")
    try:
        result = inspect(args.path, args.out, args.n, args.split, args.seed)
    except (FileNotFoundError, KeyError, ValueError) as e:
        print(f"error: {e.args[0] if isinstance(e, KeyError) and e.args else e}",
              file=sys.stderr)
        return 2
    print(result["summary"])
    print(f"wrote {result['contact_sheet']}")
    print(f"wrote {result['class_counts']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
