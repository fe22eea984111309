"""A cached, seeded set of JPEG photographs: crops of the photos scikit-image ships.

Synthetic noise compresses and decodes unlike photographs (more entropy-coded bits per pixel),
so speed measured on it flatters or penalises the wrong stages. Each file here is a random
crop of one of scikit-image's colour photos, flipped at random, resized to ~500 px on the
longer side and saved as a baseline 4:2:0 JPEG at a random quality in 75..95.

    .venv/bin/python benchmarks/photos.py N     # generate DATA/photos-N (cached) and print its size
"""

import importlib.util
import io
import os
import random
import sys

from common import cached_tree

# scikit-image's colour photographs (the greyscale ones and the synthetic ones are left out).
SOURCES = ("astronaut.png", "chelsea.png", "coffee.png", "motorcycle_left.png",
           "motorcycle_right.png", "rocket.jpg", "hubble_deep_field.jpg", "ihc.png")
QUALITIES = (75, 95)
LONGER_SIDE = (440, 560)
_photos = []


def _source_dir():
    spec = importlib.util.find_spec("skimage")
    if spec is None:
        raise SystemExit("benchmarks need scikit-image for their photographs: "
                         "pip install -e '.[bench]' -c constraints.txt")
    return os.path.join(os.path.dirname(spec.origin), "data")


def _load_sources():
    from PIL import Image

    for name in SOURCES:
        with Image.open(os.path.join(_source_dir(), name)) as img:
            _photos.append(img.convert("RGB"))


def photo_jpeg(seed):
    """The bytes of photo number `seed`: the same bytes for the same seed and libraries."""
    from PIL import Image

    rng = random.Random(seed)
    src = _photos[rng.randrange(len(_photos))]
    w, h = src.size
    cw, ch = int(w * rng.uniform(0.5, 1.0)), int(h * rng.uniform(0.5, 1.0))
    x, y = rng.randrange(w - cw + 1), rng.randrange(h - ch + 1)
    img = src.crop((x, y, x + cw, y + ch))
    if rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    side = rng.randint(*LONGER_SIDE)
    scale = side / max(cw, ch)
    img = img.resize((max(1, round(cw * scale)), max(1, round(ch * scale))),
                     Image.Resampling.BICUBIC)
    out = io.BytesIO()
    img.save(out, "JPEG", quality=rng.randint(*QUALITIES))
    return out.getvalue()


def _make(args):
    path, seed = args
    with open(path, "wb") as f:
        f.write(photo_jpeg(seed))


def photo_tree(n, classes=10):
    """DATA/photos-N/<class>/<i>.jpg, generated once (deterministic) and reused."""
    return cached_tree("photos", n, _make, classes, initializer=_load_sources)


if __name__ == "__main__":
    from common import files_of

    root = photo_tree(int(sys.argv[1]))
    paths = files_of(root)
    mb = sum(os.path.getsize(p) for p in paths) / 2**20
    print(f"{root}: {len(paths)} JPEGs, {mb:.0f} MiB ({mb * 1024 / len(paths):.0f} KiB each)")
