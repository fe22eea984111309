"""Look at a dataset before training on it: `python -m beam_pipeline.tools.inspect_dataset PATH --out DIR`.

Prints the manifest summary (splits, classes, counts, rejected inputs by reason) and writes
two PNGs into DIR, three for a version built with --near_duplicates:

  contact_sheet.png        N records sampled across the splits, each titled with its class name
  class_counts.png         a bar chart of examples per class, one bar per split
  near_duplicates.png      up to N near-duplicate pairs that span splits, side by side (the
                           closest stored pair of each group, groups in near_duplicates.jsonl
                           order), captioned with key, split and Hamming distance

Sampling needs no full read: records are picked by (shard, position) from the manifest's
counts and fetched through the shard's .index file (seek to the offset), or by scanning
the shard up to that position when there is no index.
"""

import argparse
import io
import json
import math
import random
import sys

from beam_pipeline.launcher.report import class_table
from beam_pipeline.refs import split_order
from readers import _quiet, frames, layout, schema

CONTACT_SHEET = "contact_sheet.png"
CLASS_COUNTS = "class_counts.png"
NEAR_DUPLICATE_SHEET = "near_duplicates.png"
MAX_CHART_INCHES = 24.0   # bar chart width cap (100 dpi)
MAX_NAMED_CLASSES = 80    # beyond this, x ticks are class ids, not names


def _ordered_splits(manifest):
    return split_order(manifest.get("splits", {}))


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
    lines += class_table(manifest, splits, all_column=True)
    acc = manifest.get("accounting")
    if acc:
        lines.append(f"inputs: listed {acc.get('listed')} = written {acc.get('written')} + "
                     f"duplicates {acc.get('duplicates')} + failed {acc.get('failed')}")
    near = manifest.get("near_duplicates")
    if near:
        lines.append(f"near-duplicates (pHash within {near['radius']} bits): {near['groups']} "
                     f"group(s), {near['groups_across_splits']} across splits, {near['leaks']} "
                     f"evaluation image(s) near a train image ({near['excluded']} left out); "
                     f"see {near['path']}")
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
    with gfile.GFile(shard_path, "rb") as f:
        if index is not None:
            offset = index[position][0]
            f.seek(offset)
            return frames.read_frame(f, offset)[0]
        offset = 0
        for _ in range(position):
            offset += frames.read_frame(f, offset, check_crc=False)[1]
        return frames.read_frame(f, offset)[0]


def _read_index(gfile, shard_path):
    path = layout.index_name(shard_path)
    if not gfile.exists(path):
        return None
    with gfile.GFile(path, "r") as f:
        return frames.parse_index(f.read())


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


# Drawing is plain Pillow (a dependency already): inspect works in the environment
# ./run_local.sh makes, with no plotting library.
BACKGROUND, INK, GRID = (255, 255, 255), (20, 20, 20), (225, 225, 225)
SPLIT_COLOURS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
                 (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207)]
MAX_WIDTH = int(MAX_CHART_INCHES * 100)  # px; the same cap the charts had at 100 dpi
PAD = 8


def _font(size):
    from PIL import ImageFont

    return ImageFont.load_default(size=size)  # Pillow's bundled TrueType font


def _text_size(draw, text, font):
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    return right - left, bottom - top


def _centered(draw, cx, y, text, font, fill=INK):
    draw.text((cx, y), text, font=font, fill=fill, anchor="ma")  # middle, ascender at y


def contact_sheet(samples, path, title="", cols=None):
    """A grid of the sampled images, each captioned 'class (label id)' and 'split WxH';
    saved as PNG at `path`."""
    from PIL import Image, ImageDraw

    cols = cols or max(1, math.ceil(math.sqrt(len(samples))))
    rows = max(1, math.ceil(len(samples) / cols))
    cell = max(64, min(200, (MAX_WIDTH - PAD) // cols - PAD))  # thumbnail box, px
    caption_font, title_font = _font(12), _font(16)
    caption_h, title_h = 2 * 15 + 4, 36
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    width = max(cols * (cell + PAD) + PAD, _text_size(probe, title, title_font)[0] + 2 * PAD)
    height = title_h + rows * (caption_h + cell + PAD) + PAD
    sheet = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    _centered(draw, width // 2, 10, title, title_font)
    x0 = (width - cols * (cell + PAD) + PAD) // 2
    for k, (split, text, label, image) in enumerate(samples):
        x = x0 + (k % cols) * (cell + PAD)
        y = title_h + (k // cols) * (caption_h + cell + PAD)
        _centered(draw, x + cell // 2, y, f"{text} ({label})", caption_font)
        _centered(draw, x + cell // 2, y + 15, f"{split} {image.width}x{image.height}",
                  caption_font)
        scale = min(cell / image.width, cell / image.height)
        thumb = image.resize((max(1, round(image.width * scale)),
                              max(1, round(image.height * scale))), Image.LANCZOS)
        sheet.paste(thumb, (x + (cell - thumb.width) // 2,
                            y + caption_h + (cell - thumb.height) // 2))
    if not samples:
        _centered(draw, width // 2, title_h + cell // 2, "no records", title_font)
    _save(sheet, path)


def cross_split_pairs(version_dir, manifest, n):
    """Up to `n` (distance, member a, member b) pairs of stored images in different splits,
    the closest pair of each group; a member is (split, key, image). Keys are found in the
    catalog; members left out of the version (--drop_near_duplicate_leaks) are skipped."""
    import tensorflow as tf

    near = manifest.get("near_duplicates")
    if not near or not n:
        return []
    wanted = []
    with tf.io.gfile.GFile(layout.join(version_dir, near["path"]), "r") as f:
        for line in f:
            if len(wanted) >= n:
                break
            g = json.loads(line)
            gone = set(g.get("excluded", ()))
            across = [(d, g["keys"][i], g["keys"][j]) for i, j, d in g["distances"]
                      if g["splits"][i] != g["splits"][j]
                      and not {g["keys"][i], g["keys"][j]} & gone]
            if across:
                wanted.append(min(across))
    where = _catalog_places(version_dir, {k for _, a, b in wanted for k in (a, b)})
    indexes, out = {}, []
    for d, a, b in wanted:
        members = []
        for key in (a, b):
            split, rel, position = where[key]
            path = layout.join(version_dir, rel)
            if rel not in indexes:
                indexes[rel] = _read_index(tf.io.gfile, path)
            members.append((split, key, _image(_record_at(tf.io.gfile, path, position,
                                                          indexes[rel]))))
        out.append((d, *members))
    return out


def _catalog_places(version_dir, keys):
    """{key: (split, shard file, position)} of `keys`, from catalog.parquet."""
    import pyarrow.compute as pc

    from beam_pipeline.store import catalog

    places = {}
    for table in catalog.iter_tables(layout.join(version_dir, layout.CATALOG)):
        rows = table.filter(pc.is_in(table["key"], value_set=pa_array(sorted(keys))))
        for row in rows.select(["key", "split", "file", "position"]).to_pylist():
            places[row["key"]] = (row["split"], row["file"], row["position"])
    return places


def pa_array(values):
    import pyarrow as pa

    return pa.array(values, pa.string())


def _image(record):
    from PIL import Image
    from tensorflow.core.example import example_pb2

    feature = example_pb2.Example.FromString(record).features.feature
    return Image.open(io.BytesIO(feature[schema.ENCODED].bytes_list.value[0])).convert("RGB")


def near_duplicate_sheet(pairs, path, title):
    """Each pair on one row, side by side, captioned 'key (d bits)' and 'split WxH'."""
    cells = [(split, key, f"{d} bits", image)
             for d, *members in pairs for split, key, image in members]
    contact_sheet(cells, path, title, cols=2)


def _paste_vertical(image, text, font, x, y, centre=False):
    """Draw `text` rotated 90° (reading upwards) at x (its centre) and y (its top, or its
    centre with centre=True)."""
    from PIL import Image, ImageDraw

    left, top, right, bottom = font.getbbox(text)
    tile = Image.new("RGB", (right - left + 2, bottom - top + 4), BACKGROUND)
    ImageDraw.Draw(tile).text((1 - left, 2 - top), text, font=font, fill=INK)
    tile = tile.rotate(90, expand=True)
    y = y - tile.height // 2 if centre else y
    image.paste(tile, (round(x - tile.width / 2) if not centre else round(x), round(y)))
    return tile


def _nice_step(top, ticks=6):
    """A 1-2-5 step giving about `ticks` gridlines up to `top`."""
    raw = max(top, 1) / ticks
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    return max(1, int(step))


def class_counts_chart(manifest, path):
    """Grouped bars: examples per class (x) for each split (colour), counts on the bars for up
    to 20 classes, a legend of splits with their totals; saved as PNG at `path`."""
    from PIL import Image, ImageDraw

    labels = list(manifest.get("labels", []))
    splits = _ordered_splits(manifest)
    counts = {s: [manifest["splits"][s].get("label_counts", {}).get(l, 0) for l in labels]
              for s in splits}
    font, small, title_font = _font(12), _font(10), _font(15)
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    legend = [f"{s} ({manifest['splits'][s]['num_examples']})" for s in splits]
    legend_w = max([_text_size(probe, t, font)[0] for t in legend + ["split"]]) + 40
    left, right, top = 56, legend_w + 2 * PAD, 40
    # Wide enough to read a few dozen classes; capped so 1,000 classes still make a sane PNG.
    slot = max(1.0, min(40.0 * max(1, len(splits)) + 20,
                        (MAX_WIDTH - left - right) / max(1, len(labels))))
    named = len(labels) <= MAX_NAMED_CLASSES
    label_w = max([_text_size(probe, l, font)[0] for l in labels] + [0]) if named else 0
    vertical = named and label_w > slot - 4
    bottom = (min(label_w, 160) + 16 if vertical else 30) + (20 if not named else 0)
    plot_w = max(300, round(slot * len(labels)))
    width, height = left + plot_w + right, top + 300 + bottom
    chart = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(chart)
    _centered(draw, width // 2, 10,
              f"{manifest.get('name')} {manifest.get('version')}: examples per class", title_font)
    y_max = max([c for row in counts.values() for c in row] + [1])
    step = _nice_step(y_max * 1.1)
    y_top = step * math.ceil(y_max * 1.1 / step)
    plot_h = height - top - bottom
    y_of = lambda v: top + plot_h - plot_h * v / y_top  # noqa: E731
    for v in range(0, y_top + 1, step):  # gridlines and y ticks
        y = round(y_of(v))
        draw.line([(left, y), (left + plot_w, y)], fill=GRID)
        draw.text((left - 6, y), str(v), font=small, fill=INK, anchor="rm")
    _paste_vertical(chart, "examples", font, 6, top + plot_h // 2, centre=True)
    slot = plot_w / max(1, len(labels))
    bar_w = 0.8 * slot / max(1, len(splits))
    for j, s in enumerate(splits):
        colour = SPLIT_COLOURS[j % len(SPLIT_COLOURS)]
        for i, n in enumerate(counts[s]):
            x = left + i * slot + 0.1 * slot + j * bar_w
            if n:
                draw.rectangle([round(x), round(y_of(n)), max(round(x), round(x + bar_w) - 1),
                                top + plot_h], fill=colour)
            if len(labels) <= 20:
                draw.text((x + bar_w / 2, y_of(n) - 2), str(n), font=small, fill=INK,
                          anchor="md")
    draw.line([(left, top), (left, top + plot_h), (left + plot_w, top + plot_h)], fill=INK)
    base = top + plot_h + 4
    if named:
        for i, name in enumerate(labels):
            cx = left + (i + 0.5) * slot
            if vertical:  # too narrow for horizontal names: write them upwards
                _paste_vertical(chart, name, font, cx, base)
            else:
                draw.text((cx, base), name, font=font, fill=INK, anchor="ma")
    else:
        _centered(draw, left + plot_w // 2, base + 4,
                  f"class id (0-{len(labels) - 1}; too many classes to name)", font)
    lx, ly = left + plot_w + 2 * PAD, top  # legend
    draw.text((lx, ly), "split", font=font, fill=INK)
    for j, text in enumerate(legend):
        y = ly + 20 + 18 * j
        draw.rectangle([lx, y + 2, lx + 16, y + 12], fill=SPLIT_COLOURS[j % len(SPLIT_COLOURS)])
        draw.text((lx + 22, y), text, font=font, fill=INK)
    _save(chart, path)


def _save(image, path):
    """PNG to a local path or gs:// (through tf.io.gfile)."""
    if "://" in path:
        import tensorflow as tf

        buf = io.BytesIO()
        image.save(buf, format="PNG")
        with tf.io.gfile.GFile(path, "wb") as f:
            f.write(buf.getvalue())
    else:
        image.save(path, format="PNG")


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
    _quiet.install(args.verbose)  # before TensorFlow loads
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
    if "near_duplicates" in result:
        print(f"wrote {result['near_duplicates']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
