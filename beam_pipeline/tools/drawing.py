"""The PNGs inspect_dataset writes: contact sheets and the class-count chart.

Drawing is plain Pillow (a dependency already): inspect works in the environment
./run_local.sh makes, with no plotting library.
"""

import io
import math

from beam_pipeline.refs import split_order

MAX_CHART_INCHES = 24.0   # bar chart width cap (100 dpi)
MAX_NAMED_CLASSES = 80    # beyond this, x ticks are class ids, not names
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

BOX_COLOURS = ((255, 64, 64), (64, 220, 64), (80, 140, 255), (255, 200, 0), (220, 80, 255))


def with_boxes(image, boxes):
    """`image` (PIL RGB) with `boxes` [(xmin, ymin, xmax, ymax, class name)] drawn on it
    (fractions of its size), each class in its own colour; the image itself when none."""
    from PIL import ImageDraw

    if not boxes:
        return image
    image = image.copy()
    draw = ImageDraw.Draw(image)
    width = max(1, round(max(image.size) / 100))
    colours = {}
    for xmin, ymin, xmax, ymax, name in boxes:
        colour = colours.setdefault(name, BOX_COLOURS[len(colours) % len(BOX_COLOURS)])
        w, h = image.width - 1, image.height - 1
        draw.rectangle([round(xmin * w), round(ymin * h), round(xmax * w), round(ymax * h)],
                       outline=colour, width=width)
        draw.text((round(xmin * w) + width + 1, round(ymin * h) + width), name, fill=colour,
                  font=_font(max(10, 4 * width)))
    return image


def near_duplicate_sheet(pairs, path, title):
    """Each pair on one row, side by side, captioned with key, split and its caption
    ('6 bits, s 0.03', or 'rejected 9 bits, s 0.41' for a candidate the descriptor turned
    down)."""
    cells = [(split, key, caption, image)
             for caption, *members in pairs for split, key, image in members]
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
    # ~65 lines: one drawing, laid out top to bottom (axes, bars, legend); parts share its
    # coordinates, so pieces of it would pass a dozen values each.
    from PIL import Image, ImageDraw

    labels = list(manifest.get("labels", []))
    splits = split_order(manifest.get("splits", {}))
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
