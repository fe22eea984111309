"""A small, deterministic sample image set: `python -m beam_pipeline.tools.sample_data DIR`.

Three classes a model can learn (circle, square, triangle on noisy backgrounds), in the
formats real folders hold (baseline and progressive JPEG, PNG, grayscale, CMYK, palette
with transparency, 16-bit, EXIF-rotated, animated GIF) plus a few broken files.
"""

import io
import os
import random
import sys

from PIL import Image, ImageDraw

CLASSES = ("circle", "square", "triangle")
PER_CLASS = 40
VARIANTS = ("jpeg", "jpeg", "jpeg", "png", "gray", "cmyk", "palette", "exif", "progressive",
            "gray16", "rgba", "gif")


def draw(shape, rng, size=(160, 120)):
    """An RGB image of one shape; size and colours vary with rng."""
    return drawn(shape, rng, size)[0]


def drawn(shape, rng, size=(160, 120)):
    """(draw's image, the shape's box as {xmin, ymin, xmax, ymax, label}: fractions of the
    upright image, the tags it has: "large"/"small", "warm"/"cool")."""
    w, h = size
    img = Image.new("RGB", size, tuple(rng.randrange(0, 90) for _ in range(3)))
    d = ImageDraw.Draw(img)
    colour = tuple(rng.randrange(150, 256) for _ in range(3))
    r = rng.randrange(min(w, h) // 5, min(w, h) // 2 - 4)
    cx, cy = rng.randrange(r + 2, w - r - 2), rng.randrange(r + 2, h - r - 2)
    if shape == "circle":
        d.ellipse((cx - r, cy - r, cx + r, cy + r), fill=colour)
    elif shape == "square":
        d.rectangle((cx - r, cy - r, cx + r, cy + r), fill=colour)
    else:
        d.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=colour)
    box = {"xmin": round((cx - r) / w, 4), "ymin": round((cy - r) / h, 4),
           "xmax": round(min(cx + r + 1, w) / w, 4), "ymax": round(min(cy + r + 1, h) / h, 4),
           "label": shape}
    tags = ["large" if 2 * r > min(w, h) // 2 else "small",
            "warm" if colour[0] >= colour[2] else "cool"]
    return img, box, tags


def encode(img, variant):
    """(bytes, file extension) of `img` saved as `variant`."""
    out = io.BytesIO()
    if variant == "jpeg":
        img.save(out, "JPEG", quality=90)
    elif variant == "progressive":
        img.save(out, "JPEG", quality=90, progressive=True)
    elif variant == "png":
        img.save(out, "PNG")
    elif variant == "gray":
        img.convert("L").save(out, "JPEG", quality=90)
    elif variant == "cmyk":
        img.convert("CMYK").save(out, "JPEG", quality=90)
    elif variant == "palette":
        p = img.convert("P", palette=Image.Palette.ADAPTIVE, colors=64)
        p.info["transparency"] = 0
        p.save(out, "PNG", transparency=0)
    elif variant == "exif":
        # Stored rotated 90° with Orientation=6 ("rotate 90 CW to view"): upright once applied.
        exif = Image.Exif()
        exif[0x0112] = 6
        img.transpose(Image.Transpose.ROTATE_90).save(out, "JPEG", quality=90, exif=exif)
    elif variant == "gray16":
        Image.fromarray(_to_uint16(img.convert("L"))).save(out, "PNG")
    elif variant == "rgba":
        rgba = img.convert("RGBA")
        rgba.putalpha(200)
        rgba.save(out, "PNG")
    elif variant == "gif":
        frames = [img.convert("P"), img.transpose(Image.Transpose.FLIP_LEFT_RIGHT).convert("P")]
        frames[0].save(out, "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    else:
        raise ValueError(f"unknown variant {variant!r}")
    ext = {"png": "png", "palette": "png", "gray16": "png", "rgba": "png", "gif": "gif"}
    return out.getvalue(), ext.get(variant, "jpg")


def _to_uint16(gray):
    import numpy as np

    return np.asarray(gray, dtype=np.uint16) * 257


def broken_files():
    """name -> bytes of inputs the pipeline must reject into errors.jsonl."""
    good, _ = encode(draw("circle", random.Random(0)), "jpeg")
    return {
        "truncated.jpg": good[: len(good) // 2],
        "empty.jpg": b"",
        "not_an_image.jpg": b"this is a text file, not a JPEG\n",
    }


MANIFEST, SCHEMA = "images.jsonl", "schema.yaml"
SCHEMA_TEXT = f"""fields:
  tags: {{type: classes, max_len: 2, classes: [large, small, warm, cool]}}
  objects: {{type: boxes, max_len: 1, classes: [{', '.join(CLASSES)}]}}
"""


def generate(root, per_class=None, seed=0, manifest=False):
    """Write ROOT/<class>/<n>.<ext>; returns the number of files written. `manifest`: also
    ROOT/images.jsonl (uri, label, tags, the shape's box) and ROOT/schema.yaml declaring them."""
    rng, count, rows = random.Random(seed), 0, []
    per_class = PER_CLASS if per_class is None else per_class
    for shape in CLASSES:
        os.makedirs(os.path.join(root, shape), exist_ok=True)
        for i in range(per_class):
            size = (rng.randrange(96, 224), rng.randrange(96, 224))
            img, box, tags = drawn(shape, rng, size)
            data, ext = encode(img, VARIANTS[i % len(VARIANTS)])
            name = f"{shape}/{shape}_{i:03d}.{ext}"
            with open(os.path.join(root, name), "wb") as f:
                f.write(data)
            rows.append({"uri": name, "label": shape, "tags": tags, "objects": [box]})
            count += 1
    for name, data in broken_files().items():
        with open(os.path.join(root, CLASSES[0], name), "wb") as f:
            f.write(data)
        rows.append({"uri": f"{CLASSES[0]}/{name}", "label": CLASSES[0], "tags": [],
                     "objects": []})
        count += 1
    if manifest:
        import json

        with open(os.path.join(root, MANIFEST), "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        with open(os.path.join(root, SCHEMA), "w") as f:
            f.write(SCHEMA_TEXT)
    return count


def main(argv=None):
    """argparse, so `--help` prints help (it once wrote the images into a folder '--help')."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m beam_pipeline.tools.sample_data", allow_abbrev=False,
        description=f"Write a small, deterministic image set into DIR: {PER_CLASS} images "
        f"of each of {', '.join(CLASSES)} and {len(broken_files())} broken files.")
    parser.add_argument("dir", help="folder to write DIR/<class>/<image> into")
    parser.add_argument("--manifest", action="store_true",
                        help=f"also write DIR/{MANIFEST} (uri, label, tags, the shape's box) "
                             f"and DIR/{SCHEMA} declaring its fields, for --schema")
    args = parser.parse_args(argv)
    print(f"wrote {generate(args.dir, manifest=args.manifest)} files to {args.dir}"
          + (f", {MANIFEST} and {SCHEMA}" if args.manifest else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
