"""The file tree the regeneration model (tests/test_model.py) changes, and its pure checks.

Files live under TMP/in0, TMP/in1 as <class>/<name>. Every change is what a user or a tool
does to a photo folder: add, delete (into a trash the model may restore from, nights
later), rename or move, relabel, rename onto an existing name, renumber (delete one, rename
the rest down), swap, rotate, replace keeping size and mtime, a near copy (re-encoded),
and a read failure (the file is a broken link for a while, then comes back).
"""

import hashlib
import io
import os

import numpy as np
from PIL import Image

from beam_pipeline.job import images, records
from dataset_format import examples, frames, layout, schema

CLASSES = ("cat", "dog", "owl")
INPUTS = ("in0", "in1")


def tiny_image(seed, fmt, quality=90):
    """A 20x14 seeded image, like a photo thumbnail: a gradient, a block and some noise.
    PNG is stored uncompressed, so every PNG has the same size (and can be swapped)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:14, 0:20]
    base = rng.integers(0, 256, 3)
    pixels = base + 4 * x[..., None] - 3 * y[..., None] + rng.normal(0, 12, (14, 20, 3))
    top, left = rng.integers(0, 8), rng.integers(0, 12)
    pixels[top:top + 6, left:left + 8] = rng.integers(0, 256, 3)
    img = Image.fromarray(pixels.clip(0, 255).astype(np.uint8), "RGB")
    return encode(img, fmt, quality)


def encode(img, fmt, quality=90):
    buf = io.BytesIO()
    if fmt == "png":
        img.save(buf, "PNG", compress_level=0)
    else:
        img.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def near_copy(data):
    """The same picture re-encoded at another quality: other bytes, a near-duplicate."""
    with Image.open(io.BytesIO(data)) as img:
        return encode(img.convert("RGB"), "jpg", quality=60)


class Tree:
    """The inputs on disk, plus what was deleted (restorable) and what cannot be read."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.trash = []      # [(rel, bytes, mtime_ns)] deleted files, oldest first
        self.broken = {}     # rel -> where its file waits while rel is a broken link
        self.counter = 0

    def path(self, rel):
        return os.path.join(self.tmp, rel)

    def write(self, rel, data, mtime_ns=None):
        os.makedirs(os.path.dirname(self.path(rel)), exist_ok=True)
        with open(self.path(rel), "wb") as f:
            f.write(data)
        if mtime_ns is not None:
            os.utime(self.path(rel), ns=(mtime_ns, mtime_ns))

    def files(self, inputs=INPUTS, readable_only=False):
        out = []
        for name in inputs:
            for label in CLASSES:
                folder = os.path.join(self.tmp, name, label)
                if os.path.isdir(folder):
                    out += [f"{name}/{label}/{f}" for f in sorted(os.listdir(folder))]
        return [r for r in out if r not in self.broken] if readable_only else out

    def pick(self, i, inputs=INPUTS):
        files = self.files(inputs, readable_only=True)
        return files[i % len(files)] if files else None

    def fresh_name(self, prefix):
        self.counter += 1
        return f"{prefix}{self.counter}"

    def removable(self, rel, active):
        """`rel` can stop being readable without leaving its input with no image."""
        name = rel.split("/")[0]
        return name not in active or len(self.files([name], readable_only=True)) > 1

    def delete(self, rel):
        st = os.stat(self.path(rel))
        with open(self.path(rel), "rb") as f:
            self.trash.append((rel, f.read(), st.st_mtime_ns))
        os.remove(self.path(rel))

    def restore(self, i):
        """A deleted file back (cp -p from a backup): its old name if free, else a new one."""
        rel, data, mtime = self.trash.pop(i % len(self.trash))
        if os.path.lexists(self.path(rel)):
            rel = f"{rel.rsplit('/', 1)[0]}/{self.fresh_name('r')}.{rel.rsplit('.', 1)[1]}"
        self.write(rel, data, mtime)

    def move(self, rel, target):
        os.makedirs(os.path.dirname(self.path(target)), exist_ok=True)
        os.rename(self.path(rel), self.path(target))  # bytes and mtime travel along

    def swap(self, rels):
        """Each file takes the next one's name, the last the first's (two: a swap)."""
        temp = self.path(rels[0]) + ".swap"
        os.rename(self.path(rels[0]), temp)
        for a, b in zip(rels, rels[1:]):
            os.rename(self.path(b), self.path(a))
        os.rename(temp, self.path(rels[-1]))

    def renumber(self, rel):
        """Delete `rel`, then rename every later file of its folder down by one name."""
        folder = rel.rsplit("/", 1)[0]
        names = [r for r in self.files(readable_only=True) if r.rsplit("/", 1)[0] == folder]
        at = names.index(rel)
        self.delete(rel)
        for a, b in zip(names[at:], names[at + 1:]):
            os.rename(self.path(b), self.path(a))

    def break_read(self, rel):
        """`rel` cannot be read for a while: a broken link where the file was."""
        os.makedirs(self.path("stash"), exist_ok=True)
        keep = self.path(f"stash/{self.fresh_name('s')}")
        os.rename(self.path(rel), keep)
        os.symlink(self.path("nowhere/" + os.path.basename(keep)), self.path(rel))
        self.broken[rel] = keep

    def heal(self, i):
        rel = sorted(self.broken)[i % len(self.broken)]
        os.remove(self.path(rel))
        os.rename(self.broken.pop(rel), self.path(rel))

    def signature(self, active):
        stats = []
        for rel in self.files(active):
            st = os.lstat(self.path(rel))
            stats.append((rel, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
        return tuple(active), tuple(stats)

    def sha256(self, rel):
        with open(self.path(rel), "rb") as f:
            data = f.read()
        return data, hashlib.sha256(data).hexdigest()


def full_build_record(data, key, label, labels):
    """The record a full build stores for a file: the writer's own pure functions."""
    encoded = images.convert(data, images.EncodeOptions())
    return records.make_example(encoded, labels.index(label), label, key)


def stored_examples(vdir, manifest):
    """{key: (split, serialized Example)}, read frame by frame (CRCs checked)."""
    out = {}
    for split, info in manifest["splits"].items():
        for shard in info["shards"]:
            with open(layout.shard_file(vdir, shard["path"]), "rb") as f:
                offset = 0
                while (found := frames.read_frame(f, offset)) is not None:
                    record, length = found
                    key = examples.parse_example(record)[schema.FILENAME].decode()
                    assert key not in out, f"{key} stored twice"
                    out[key] = (split, record)
                    offset += length
    return out
