"""Near-duplicate precision on hard negatives and recall on fresh copies: the hash alone
against the hash confirmed by the built descriptor (dedup/descriptor.py), the confirmation
before, and the alternatives it was chosen over; the confirmation's limits chosen on one
half of the benchmark and reported on the other.

    python benchmarks/bench_near_duplicate_precision.py [--radii 6,8,10] [--fresh_dir DIR]
                                                        [--record PATH]

The positives are bench_near_duplicates.py's: ~22 photos that scikit-image, scikit-learn and
matplotlib ship, each a scene and 5 crops, each stored as an original and 6 variants (crop
<= 10%, resize 40-90%, JPEG q40-95, brightness +/-10%, the other format, all at once).
"single": an original and one single-transform variant; "combo": an original and the
all-at-once variant. Every pair of one scene is a positive; crops of one photo overlapping
less than half are hard negatives.

Fresh positives (`fresh_set`), from the one shipped photograph nothing else here turns into
scenes (motorcycle_right: elsewhere only the stereo negative): 48 crops, each an original
and one copy of each kind (crop <= 8% then downscale to 45-85%, brightness +/-8%, PNG
re-save, JPEG q45-90 re-encode, all at once); crops overlapping < 40% are hard negatives.
They are written with truth.jsonl beside them (--fresh_dir).

Added hard negatives, each image its own subject (all seeded; JPEG q90 or PNG, alternating):
  gradient    linear two-colour gradients, and quarter discs on black (the smooth shapes a
              64-bit pHash reads as "one bright region")
  disc        shaded, blurred discs of random colours on black (a retina photo's shape)
  chart       matplotlib line, bar and scatter charts of seeded data
  texture     3x3 grids of 30% crops (no two overlap) of brick, grass, gravel, moon, a
              motion-blurred clock and the Hubble deep field
  microscopy  likewise of cell and IHC images; medical: of retina, microaneurysms, phantom
  flat        near-uniform fields: a colour, a faint shading and noise (skies, walls)
  subject     the right image of scikit-image's stereo motorcycle pair (the left is a corpus
              photo): another photo of one subject, 5 cm to the side
  face        100 different people's faces (scikit-image's LFW subset, 25x25, upscaled)
A hard crop of a corpus photo is not compared with that photo's scenes (they may overlap).

Halves (`halves`): groups (a photo, a fresh crop, a source of hard crops) and the pairs
across groups are dealt to A and B (seeded); `choose_limits` picks the descriptor's limits
on A; every table prints all, A and B.

Printed: the limits chosen on A against the built ones; at each radius, recall (single,
combo, fresh) and precision on direct pairs and on the pairs the reported components imply,
hash only, confirmed as before (19 windows), before the colour grid (the whole means) and as
built, for two, six and the build's seven hashes (the seventh made at commit from the
stored thumbnail), per half; recall per class; combinations within the fresh copies' bounds
(cut <= 8%, scaled to >= 45%) and beyond; the hard negatives' overlaps by source; the
positives the build misses, with what was done to each, measured anyway; probe hashes made
from the thumbnail, chosen on A; structure over more windows, limits chosen on A; stored
probe hashes beside the six; the search plan's recall as catalogs grow; the alternatives'
figures at the built radius. Needs the "bench" extra.
"""

import argparse
import io
import json
import os
import random
import sys
import time

import numpy as np
from PIL import Image, ImageEnhance, ImageFilter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench_near_duplicates as corpus_lib  # noqa: E402
from common import DATA, Record, add_record_argument  # noqa: E402
from beam_pipeline.dedup import descriptor, perceptual  # noqa: E402
from beam_pipeline.dedup import near_duplicates  # noqa: E402

SEED = 5
SIDE = 320
TEXTURES = ("brick.png", "grass.png", "gravel.png", "moon.png", "clock_motion.png",
            "hubble_deep_field.jpg")
MICROSCOPY = ("cell.png", "ihc.png")
MEDICAL = ("retina.jpg", "microaneurysms.png", "phantom.png")


def hard_negatives():
    """[(image, class, source photo name or None)], seeded."""
    import matplotlib
    import skimage.data

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rng = np.random.default_rng(SEED)
    out = []
    yy, xx = np.mgrid[0:SIDE, 0:SIDE] / SIDE
    for _ in range(24):
        a = rng.uniform(0, 2 * np.pi)
        c0, c1 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
        t = np.cos(a) * xx + np.sin(a) * yy
        t = ((t - t.min()) / (t.max() - t.min()))[..., None]
        out.append((Image.fromarray((c0 * (1 - t) + c1 * t).astype(np.uint8)), "gradient", None))
    for _ in range(24):
        cx, cy, r = rng.choice([0, 1]), rng.choice([0, 1]), rng.uniform(0.6, 1.1)
        d = np.clip(1 - np.hypot(xx - cx, yy - cy) / r, 0, 1)[..., None]
        arr = np.clip(rng.uniform(60, 255, 3) * d * rng.uniform(1, 2), 0, 255)
        out.append((Image.fromarray(arr.astype(np.uint8)), "gradient", None))
    for _ in range(24):
        cx, cy, r = rng.uniform(.3, .7), rng.uniform(.3, .7), rng.uniform(.2, .45)
        d = np.hypot(xx - cx, yy - cy)
        arr = rng.uniform(40, 255, 3) * ((d < r) * (1 - 0.5 * d / r))[..., None]
        img = Image.fromarray(arr.astype(np.uint8))
        out.append((img.filter(ImageFilter.GaussianBlur(rng.uniform(0, 6))), "disc", None))
    for k in range(24):
        fig = plt.figure(figsize=(4, 3), dpi=80)
        ax = fig.add_subplot(111)
        x = np.arange(20)
        if k % 3 == 0:
            ax.plot(x, np.cumsum(rng.normal(size=20)))
        elif k % 3 == 1:
            ax.bar(x[:8], rng.uniform(1, 10, 8))
        else:
            ax.scatter(rng.normal(size=50), rng.normal(size=50))
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        plt.close(fig)
        out.append((Image.open(io.BytesIO(buf.getvalue())).convert("RGB"), "chart", None))
    sk = os.path.dirname(skimage.data.__file__)
    for names, cls in ((TEXTURES, "texture"), (MICROSCOPY, "microscopy"), (MEDICAL, "medical")):
        for name in names:
            img = Image.open(os.path.join(sk, name)).convert("RGB")
            w, h = img.size
            for q in range(9):  # a 3x3 grid of 30% crops: no two overlap
                x, y = (q % 3) / 3 + rng.uniform(0, 0.03), (q // 3) / 3 + rng.uniform(0, 0.03)
                box = (int(x * w), int(y * h), int((x + 0.3) * w), int((y + 0.3) * h))
                out.append((img.crop(box), cls, name))
    for _ in range(32):
        a, amp = rng.uniform(0, 2 * np.pi), rng.uniform(2, 15)
        t = (np.cos(a) * xx + np.sin(a) * yy)[..., None]
        arr = (rng.uniform(30, 230, 3) + amp * t
               + rng.normal(0, rng.uniform(0.5, 4), (SIDE, SIDE, 1)))
        out.append((Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8)), "flat", None))
    out.append((Image.open(os.path.join(sk, "motorcycle_right.png")).convert("RGB"),
                "subject", None))
    for face in np.load(os.path.join(sk, "lfw_subset.npy"))[:100]:
        img = Image.fromarray((face * 255).astype(np.uint8)).resize((100, 100),
                                                                    Image.Resampling.LANCZOS)
        out.append((img.convert("RGB"), "face", None))
    return out


# --- fresh positives: crops of a photograph no other part of the benchmark turns into scenes ---

FRESH_SOURCE = "motorcycle_right.png"  # skimage's; elsewhere only the stereo "subject" negative
FRESH_SEED = 44
FRESH_CROPS = 48
FRESH_KINDS = ("crop+downscale", "brightness", "png", "quality", "all")
FRESH_HARD = 0.4  # two crops overlapping less than this (of the smaller) are a hard negative


def fresh_variant(img, original, rng, kind):
    """One copy of a crop (`img`; `original`: its stored JPEG) as phones and web exports make
    them: crop <= 8% of each side in all then downscale to 45-85%; brightness +/-8%; the
    original's pixels re-saved as PNG; the original re-encoded at JPEG q45-90; or all of
    these at once (PNG 30% of the time). -> (bytes, what was done)."""
    done = {}
    if kind in ("crop+downscale", "all"):
        w, h = img.size
        cw, ch = rng.uniform(0, 0.08) * w, rng.uniform(0, 0.08) * h
        left, top = rng.uniform(0, cw), rng.uniform(0, ch)
        box = (round(left), round(top), round(w - (cw - left)), round(h - (ch - top)))
        s = rng.uniform(0.45, 0.85)
        img = img.crop(box).resize((max(1, round((box[2] - box[0]) * s)),
                                    max(1, round((box[3] - box[1]) * s))),
                                   Image.Resampling.LANCZOS)
        done.update(crop=box, scale=round(s, 3))
    if kind in ("png", "quality"):
        img = Image.open(io.BytesIO(original)).convert("RGB")
    if kind in ("brightness", "all"):
        b = rng.uniform(0.92, 1.08)
        img = ImageEnhance.Brightness(img).enhance(b)
        done["brightness"] = round(b, 3)
    fmt, quality = "JPEG", 90
    if kind == "png" or (kind == "all" and rng.random() < 0.3):
        fmt = "PNG"
    elif kind in ("quality", "all"):
        quality = rng.randint(45, 90)
    done.update(format=fmt, **({"quality": quality} if fmt == "JPEG" else {}))
    return corpus_lib.encode(img, fmt, quality), done


def fresh_set():
    """[(data, crop number, crop box (fractions of the photo), kind, what was done)]: each of
    FRESH_CROPS crops of 20-45% of each side an original (JPEG q75-95) and one copy of each
    FRESH_KINDS, seeded. Every pair of one crop is a positive; crops overlapping less than
    FRESH_HARD are hard negatives (the rest are left out: they share content)."""
    import skimage.data

    rng = random.Random(FRESH_SEED)
    photo = Image.open(os.path.join(os.path.dirname(skimage.data.__file__), FRESH_SOURCE))
    photo = photo.convert("RGB")
    w, h = photo.size
    out = []
    for c in range(FRESH_CROPS):
        fw, fh = rng.uniform(0.2, 0.45), rng.uniform(0.2, 0.45)
        x, y = rng.uniform(0, 1 - fw), rng.uniform(0, 1 - fh)
        box = (x, y, x + fw, y + fh)
        crop = photo.crop(tuple(round(v * s) for v, s in zip(box, (w, h, w, h))))
        q = rng.randint(75, 95)
        original = corpus_lib.encode(crop, "JPEG", q)
        out.append((original, c, box, "original", {"format": "JPEG", "quality": q}))
        for kind in FRESH_KINDS:
            data, done = fresh_variant(crop, original, rng, kind)
            out.append((data, c, box, kind, done))
    return out


def dataset():
    """(datas, class per image, kind per image, group per image, fresh truth, what was made
    per image (its scene's or crop's box, in fractions of the photo; a variant's cut, scale,
    brightness; {} for a hard negative), i, j, label):
    label 1 positive, 0 hard negative, -1 distinct, 9 left out; upper-triangle pairs. A
    group is what a positive can't leave (a photo, a fresh crop, a source of hard crops):
    the halves split groups."""
    applied = []
    items = corpus_lib.corpus(random.Random(corpus_lib.SEED), applied)
    hard = hard_negatives()
    fresh = fresh_set()
    base, nh = len(items), len(hard)
    datas = ([d for d, *_ in items] + [corpus_lib.encode(img, "JPEG" if k % 2 else "PNG")
                                        for k, (img, _, _) in enumerate(hard)]
             + [d for d, *_ in fresh])
    cls = np.array(["photo"] * base + [c for _, c, _ in hard] + ["fresh"] * len(fresh))
    kind = np.array([k for *_, k in items] + ["hard"] * nh
                    + [f"fresh {k}" for _, _, _, k, _ in fresh])
    names = [name for name, _ in corpus_lib.photos()]
    group = ([f"photo {p}" for _, p, _, _ in items]
             + [f"hard {src or q}" for q, (_, _, src) in enumerate(hard)]
             + [f"fresh {c}" for _, c, _, _, _ in fresh])
    n = len(datas)
    _, _, corpus_label = corpus_lib.pair_labels(items)
    i, j = np.triu_indices(n, 1)
    label = np.full(i.shape, 0, np.int8)  # a hard negative is one against everything
    label[j < base] = corpus_label
    photo = np.array([p for _, p, _, _ in items] + [-1] * (n - base))
    for q, (_, _, src) in enumerate(hard):
        if src in names:  # a crop of a corpus photo vs that photo's scenes: may overlap
            label[(j == base + q) & (photo[i] == names.index(src))] = 9
    f0 = base + nh
    stereo = names.index("motorcycle_left.png")
    subject = base + next(q for q, (_, c, _) in enumerate(hard) if c == "subject")
    fi, fj = i - f0, j - f0
    in_fresh = fj >= 0
    label[in_fresh & (i < base)] = -1
    label[in_fresh & ((photo[i] == stereo) | (i == subject))] = 9  # the same scene, 5 cm off
    both = in_fresh & (fi >= 0)
    crop = np.array([c for _, c, _, _, _ in fresh])
    boxes = [b for _, _, b, _, _ in fresh]
    for q in np.flatnonzero(both):
        a, b = fi[q], fj[q]
        label[q] = (1 if crop[a] == crop[b] else
                    0 if corpus_lib.overlap(boxes[a], boxes[b]) < FRESH_HARD else 9)
    truth = [{"image": f"fresh/{c:02d}-{k.replace('+', '-')}.{'png' if d[:4] == PNG else 'jpg'}",
              "crop": c, "box": [round(v, 4) for v in box], "kind": k, "done": done}
             for d, c, box, k, done in fresh]
    applied = ([dict(d, box=box) for d, (_, _, box, _) in zip(applied, items)]
               + [{} for _ in hard] + [dict(d, box=box) for _, _, box, _, d in fresh])
    return datas, cls, kind, np.array(group), truth, applied, i, j, label


PNG = b"\x89PNG"


def write_fresh(directory, datas, truth):
    """The fresh set as files and truth.jsonl beside them (one line an image: its crop, the
    crop's box in fractions of the photo, the copy's kind and what was done to it): a set
    a user can build with --near_duplicates and score by the same truth."""
    first = len(datas) - len(truth)
    os.makedirs(os.path.join(directory, "fresh"), exist_ok=True)
    for k, t in enumerate(truth):
        with open(os.path.join(directory, t["image"]), "wb") as f:
            f.write(datas[first + k])
    with open(os.path.join(directory, "truth.jsonl"), "w") as f:
        f.write(json.dumps({"source": FRESH_SOURCE, "seed": FRESH_SEED,
                            "positive": "two images of one crop",
                            "hard_negative": f"crops overlapping < {FRESH_HARD:.0%}"}) + "\n")
        for t in truth:
            f.write(json.dumps(t) + "\n")


small_rgb = corpus_lib.small_rgb  # what the writer decodes


# --- the alternatives: each (describe pixels -> object, compare two -> distance, limit) ---

def _ycc_grid(a, side):
    return np.asarray(Image.fromarray(a).convert("YCbCr").resize((side, side),
                                                                  Image.Resampling.BOX),
                      np.float32)


def colour_layout(a):
    return [_ycc_grid(v, 4) for v in (a, perceptual.central(a))]


def colour_layout_distance(x, y):
    def one(p, q):
        s = (q[..., 0].mean() + 1) / (p[..., 0].mean() + 1)
        return float(np.abs(p * s - q).mean())
    return min(one(p, q) for p in x for q in y)


def gradient_hash(a):
    out = []
    for v in (a, perceptual.central(a)):
        g = np.asarray(Image.fromarray(v).convert("L").resize((9, 8), Image.Resampling.BOX),
                       np.float32)
        out.append((g[:, 1:] > g[:, :-1]).ravel())
    return out


def gradient_hash_distance(x, y):
    return min(int((p != q).sum()) for p in x for q in y)


def block_means(a):
    out = []
    for v in (a, perceptual.central(a)):
        g = np.asarray(Image.fromarray(v).convert("L").resize((8, 8), Image.Resampling.BOX),
                       np.float32)
        g = g - g.mean()
        out.append(g / max(float(g.std()), 1e-6))
    return out


def block_means_distance(x, y):
    return min(float(1 - (p * q).mean()) for p in x for q in y)


def built_descriptor(pairs_i, pairs_j, smalls, positive=None, limits=None):
    """The built confirmation at `limits` (structure, chroma; default the descriptor's)."""
    s, c = measured(pairs_i, pairs_j, smalls)
    ms, mc = limits or (descriptor.MAX_STRUCTURE, descriptor.MAX_CHROMA)
    return (s <= ms) & (c <= mc), f"<= {ms:g}, {mc:g}"


def measured(pairs_i, pairs_j, smalls, distances=descriptor.distances):
    desc = {k: descriptor.describe(smalls[k]) for k in set(pairs_i) | set(pairs_j)}
    return distances([desc[k] for k in pairs_i], [desc[k] for k in pairs_j])


def without_grid(d):
    """A descriptor as written before the colour grid (291 bytes): its pairs compare by the
    whole means, as that build did."""
    return d[:8 * descriptor.PROBES] + d[-descriptor.CONFIRM_SIZE:]


def means_descriptor(pairs_i, pairs_j, smalls, positive=None):
    """The confirmation before the colour grid: 49 windows, the whole means, <= 0.29 and
    <= 4.4 (the limits half A chose for it)."""
    s, c = measured(pairs_i, pairs_j, smalls,
                    lambda a, b: descriptor.distances([without_grid(d) for d in a],
                                                      [without_grid(d) for d in b]))
    return (s <= 0.29) & (c <= 4.4), "<= 0.29, 4.4"


def before_descriptor(pairs_i, pairs_j, smalls, positive=None):
    """The confirmation before: 19 windows (both sides cut alike), <= 0.25 and <= 3."""
    s, c = measured(pairs_i, pairs_j, smalls, corpus_lib.before_distances)
    return (s <= 0.25) & (c <= 3.0), "<= 0.25, 3"


def alternative(describe, distance):
    """A confirmer whose limit is the positives' 98th percentile among the candidates (each
    alternative at its own best-case limit: the built one's limits are fixed)."""
    def confirm(pairs_i, pairs_j, smalls, positive):
        desc = {k: describe(smalls[k]) for k in set(pairs_i) | set(pairs_j)}
        d = np.array([distance(desc[a], desc[b]) for a, b in zip(pairs_i, pairs_j)])
        limit = float(np.quantile(d[positive], 0.98))
        return d <= limit, f"<= {limit:.3g}"
    return confirm


ALTERNATIVES = {
    "colour layout 4x4 YCbCr (mean abs, luma-scaled)": alternative(colour_layout,
                                                                   colour_layout_distance),
    "gradient hash (dHash 9x8, bits)": alternative(gradient_hash, gradient_hash_distance),
    "block means 8x8 (1 - correlation)": alternative(block_means, block_means_distance),
    "BEFORE: luma 16x16, 19 windows (<= 0.25) + chroma (<= 3)": before_descriptor,
    "BEFORE THE GRID: luma 16x16, 49 windows + whole means' chroma": means_descriptor,
    "BUILT: luma 16x16, 49 windows + chroma over the window, its limits": built_descriptor,
}


ALL_CONFIRMS = (("", None), (" + before", before_descriptor), (" + means", means_descriptor),
                (" + conf", built_descriptor))


def least(hashes, i, j):
    """Per pair, the least Hamming distance over all pairs of the two images' hashes."""
    n = hashes.shape[1]
    return np.minimum.reduce([perceptual.hamming_many(hashes[i, a], hashes[j, b])
                              for a in range(n) for b in range(n)])


def with_probes(hashes, extra):
    """`hashes` with one more column: `extra` (a list), the image's whole hash where it is
    None (a flat thumbnail gets no probe: a repeated hash changes no least distance)."""
    col = [hashes[k, 0] if e is None else e for k, e in enumerate(extra)]
    return np.concatenate([hashes, np.array(col, np.uint64)[:, None]], 1)


FRESH_CUT, FRESH_SCALE = 0.08, 0.45  # fresh_variant's bounds: the issue's positives


def within_fresh_bounds(applied, kind, i, j):
    """Per pair: its variant (the non-original) was cut by at most FRESH_CUT of each side and
    scaled to at least FRESH_SCALE, the bounds of the fresh copies (an existing combination
    may be cut by up to 10% and scaled to 40%)."""
    variant = np.where(np.char.endswith(kind[i].astype(str), "original"), j, i)
    ok = np.array([max(d.get("cut", (0, 0))) <= FRESH_CUT + 1e-9
                   and d.get("scale", 1.0) >= FRESH_SCALE for d in applied])
    return ok[variant]


def bounds(keep, cand, pclass, inside, halves_):
    """Combination recall within the fresh copies' bounds (cut <= 8%, scale >= 45%) and
    beyond them (cut 8-10% of a side or scale 40-45%), per half."""
    confirmed = np.zeros(len(pclass), bool)
    confirmed[cand[keep]] = True
    out = {}
    print("\ncombinations within the fresh copies' bounds (cut <= 8% of each side, scaled to "
          ">= 45%) and beyond them (cut up to 10%, scaled to 40%), confirmed / all:")
    for part, universe in halves_.items():
        combo = (pclass == "combo") & universe
        out[part] = {name: [int((combo & m & confirmed).sum()), int((combo & m).sum())]
                     for name, m in (("within", inside), ("beyond", ~inside))}
        print(f"  {part:<4} within {out[part]['within'][0]}/{out[part]['within'][1]}  "
              f"beyond {out[part]['beyond'][0]}/{out[part]['beyond'][1]}")
    return out


def hard_overlaps(label, cls, group, made, i, j):
    """How much the hard negatives' two crops overlap (`made`'s boxes), by where they come
    from: the corpus's scenes of one photo (overlapping < 50%), the fresh crops (<
    FRESH_HARD), the 3x3 grids of 30% crops (none), with how many overlap 40% or more."""
    out = {}
    photo = (label == 0) & (cls[i] == "photo") & (cls[j] == "photo")
    fresh = (label == 0) & (cls[i] == "fresh") & (cls[j] == "fresh")
    grid = (label == 0) & (group[i] == group[j]) & ~photo & ~fresh
    # none overlap by construction: a crop starts within 3% after a third, spans 30%
    out["grid crops (texture, microscopy, medical)"] = {"pairs": int(grid.sum()),
                                                        "max_overlap": 0.0, "at_least_40": 0}
    print("\nhard negatives: the overlap of their two crops (of the smaller), by source:")
    for name, mask in (("corpus scenes of one photo", photo), ("fresh crops", fresh)):
        q = np.flatnonzero(mask)
        ov = np.array([corpus_lib.overlap(made[a]["box"], made[b]["box"])
                       for a, b in zip(i[q].tolist(), j[q].tolist())])
        out[name] = {"pairs": len(q), "max_overlap": round(float(ov.max()), 3) if len(q) else 0,
                     "at_least_40": int((ov >= 0.4).sum())}
    for name, v in out.items():
        print(f"  {name:<42} {v['pairs']:>7} pairs, largest overlap {v['max_overlap']:.1%}, "
              f"{v['at_least_40']} of them >= 40%")
    return out


WINDOW_SETS = {  # name: (the share of a side a window spans, positions per share)
    "built: 1, .95, .9 at 3 positions": ((1.0, .95, .9), 3),
    "1, .96, .92, .88 at 3 positions": ((1.0, .96, .92, .88), 3),
    "1, .95, .9 at 5 positions": ((1.0, .95, .9), 5),
    "1, .97, .94, .91, .88 at 3 positions": ((1.0, .97, .94, .91, .88), 3),
}


def window_sets(cand, smalls, label, pclass, i, j, halves_):
    """Structure searched over more scales and shifts of the window (within the
    descriptor's 16x16 thumbnail), each with its limits chosen on half A as the built ones
    were: what a finer alignment of a crop + downscale wins on B. descriptor._spans is
    swapped for the run (its windows' matrices made again), then restored."""
    built = descriptor._spans
    out = {}
    print("\nstructure over more windows (limits chosen on A for each, as built):")
    try:
        for name, (shares, positions) in WINDOW_SETS.items():
            spans = [(0.0, 1.0) if f == 1.0 else (float(x), float(x) + f)
                     for f in shares for x in (np.linspace(0, 1 - f, positions)
                                               if f < 1.0 else (0.0,))]
            descriptor._spans = lambda spans=spans: spans
            descriptor._resamplers.cache_clear()
            descriptor._cell_weights.cache_clear()
            s, c = measured(i[cand].tolist(), j[cand].tolist(), smalls)
            ms, mc, *_ = choose_limits(s, c, cand, label, pclass, i, j, halves_["A"])
            keep = (s <= ms) & (c <= mc)
            row = {"windows": len(spans) ** 2, "limits": [ms, mc]}
            for part, universe in halves_.items():
                u = universe[cand]
                row[part] = scores(keep[u], cand[u], label, pclass, i, j, universe)
            out[name] = row
            print(f"  {name:<38} {row['windows']:>3} windows, <= {ms:g}, {mc:g}: " + "  ".join(
                f"{p} {_line(row[p])}" for p in ("A", "B")))
    finally:
        descriptor._spans = built
        descriptor._resamplers.cache_clear()
        descriptor._cell_weights.cache_clear()
    return out


# --- more probe hashes: what proposing more candidates would win --------------------------

def crop_hash(grey, cut):
    """pHash of grey pixels (perceptual.reduced's) with (top, bottom, left, right) fractions
    of each side cut off: the stored corner hashes are (0, .05, 0, .05) and the like."""
    h, w = grey.shape
    t, b, l, r = (int(round(f * n)) for f, n in zip(cut, (h, h, w, w)))
    return perceptual._packed(perceptual.bits_of(perceptual._low(grey[t:h - b, l:w - r])))


def thumbnail_hash(desc, cut):
    """A pHash-like hash computed at commit from the stored 16x16 thumbnail (no new bytes):
    the 8x8 lowest DCT frequencies of the cut, resampled back to 16x16 (a 16-px thumbnail
    holds the same frequencies as the 32-px one pHash reads, box- not Lanczos-filtered). The
    built one, descriptor.thumbnail_probes, is this of the cut (.075, .075, .075, .075), batched."""
    thumb = descriptor.parse([desc])[0][0].astype(np.float64)
    dct = perceptual._dct_rows(descriptor.SIDE, 8)
    t, b, l, r = (f * descriptor.SIDE for f in cut)
    rows = dct @ descriptor.linear_resampling(t, descriptor.SIDE - b)
    cols = dct @ descriptor.linear_resampling(l, descriptor.SIDE - r)
    low = rows @ thumb @ cols.T
    return perceptual._packed(perceptual.bits_of(low.ravel()))


SIDE_SHIFTED = ((.025, .025, 0, .05), (.025, .025, .05, 0), (0, .05, .025, .025),
                (.05, 0, .025, .025))
PROBE_ALTERNATIVES = {  # name: its extra hashes' cuts (top, bottom, left, right)
    "+ central 80% (a 7th stored hash)": ((.1, .1, .1, .1),),
    "+ 4 side-shifted 95% (stored)": SIDE_SHIFTED,
    "+ central 80% and 4 side-shifted (stored)": ((.1, .1, .1, .1),) + SIDE_SHIFTED,
}  # the thumbnail's crops (made at commit, no bytes): thumbnail_families


def _us_per_image(greys, hash_all, repeats=3):
    """Best of `repeats` of hash_all(grey) over `greys`, in us an image (one thread)."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for g in greys:
            hash_all(g)
        times.append((time.perf_counter() - t) / len(greys) * 1e6)
    return min(times)


def probe_alternatives(hashes, smalls, cls, i, j, label, pclass, halves_, radius):
    """Each family of extra stored hashes added to the six, at `radius`, confirmed as built:
    recall per class and half, precision, false pairs, and what its hashes cost the writer
    an image beside the six's (40 corpus photos' decodes, one product per extra hash, one
    thread, best of 3)."""
    greys = [perceptual.reduced(s)[1] for s in smalls]
    # 40 photos, as the cost mode times: their side lengths stay within perceptual's cache
    photos = [g for g, c in zip(greys, cls) if c == "photo"][:40]
    six = _us_per_image(photos, lambda g: (perceptual.phash_pair_of_grey(g),
                                           perceptual.corner_hashes_of_grey(g)))
    print(f"\nmore probe hashes at radius {radius} (the six plus each family, confirmed as "
          "built; the six stored hashes, not the seventh made at commit): candidates / "
          f"confirmed / positives per class and half; the six cost {six:.1f} us an image")
    out = {"six_us_per_image": six}
    for name, cuts in PROBE_ALTERNATIVES.items():
        extra = [[crop_hash(g, c) for c in cuts] for g in greys]
        more = np.concatenate([hashes, np.array(extra, np.uint64)], 1)
        us = _us_per_image(photos, lambda g: [crop_hash(g, c) for c in cuts])
        n = more.shape[1]
        dist = least(more, i, j)
        row = {"us_per_image": us, "hashes": n}
        for part, universe in halves_.items():
            cand = np.nonzero((dist <= radius) & universe)[0]
            keep = built_descriptor(i[cand].tolist(), j[cand].tolist(), smalls)[0]
            sc = scores(keep, cand, label, pclass, i, j, universe)
            found = {cl: f"{int(((pclass == cl) & universe & (dist <= radius)).sum())}/"
                         f"{int((pclass[cand[keep]] == cl).sum())}/"
                         f"{int(((pclass == cl) & universe).sum())}" for cl in ("single", "combo")}
            row[part] = dict(sc, found=found,
                             false=false_by_class(keep, cand, label, cls, i, j))
        out[name] = row
        print(f"  {name:<52} {n} hashes, +{us:4.1f} us/image  " + "  ".join(
            f"{p}: single {row[p]['found']['single']} combo {row[p]['found']['combo']} "
            f"direct {row[p]['direct']:.2%} implied {row[p]['implied']:.2%}" for p in halves_)
            + f"  false (all) {row['all']['false']}")
    return out


def misses(cand, keep, dist, smalls, group, i, j, pclass, report, classes, made, inside):
    """Every positive of `classes` the build misses: its photo, half, least hash distance,
    what was done to the variant (`made`: the share of each side cut, the scale) and whether
    that is within the fresh copies' bounds (`inside`), and its structure and chroma,
    measured whether or not it was a candidate (what the confirmation would say of it if a
    hash had proposed it)."""
    confirmed = set(cand[keep].tolist())
    lost = [q for q in np.flatnonzero(np.isin(pclass, classes)) if q not in confirmed]
    ms, mc = measured(i[lost].tolist(), j[lost].tolist(), smalls)
    rows = []
    for q, a, b in zip(lost, ms, mc):
        done = made[j[q]]
        rows.append(dict(
            cls=str(pclass[q]), group=str(group[i[q]]), half="B" if report[q] else "A",
            hash_distance=int(dist[q]), structure=round(float(a), 4), chroma=round(float(b), 2),
            cut=[round(v, 3) for v in done.get("cut", (0, 0))],
            scale=round(done.get("scale", 1.0), 3), within_fresh_bounds=bool(inside[q]),
            why=near_duplicates.NearPair(("a", "b"), ("", ""), 0, float(a), float(b),
                                         bool(descriptor.confirmed(a, b))).why))
    print("\npositives missed at the default radius (class, photo, half, least hash distance, "
          "the variant's cut (of width, height) and scale, structure and chroma measured "
          "anyway, what the confirmation says):")
    for r in rows:
        print(f"  {r['cls']:<7} {r['group']:<9} {r['half']}  {r['hash_distance']:>2} bits  "
              f"cut {r['cut'][0]:.1%} x {r['cut'][1]:.1%} scale {r['scale']:.2f} "
              f"({'within' if r['within_fresh_bounds'] else 'beyond'} the fresh bounds)  "
              f"s {r['structure']:.3f}  c {r['chroma']:.2f}  {r['why'] or 'would be confirmed'}")
    return rows


THUMBNAIL_FAMILIES = {  # name: the cuts (top, bottom, left, right) of the stored thumbnail
    "central 90%": ((.05,) * 4,),
    "central 85% (built)": ((.075,) * 4,),
    "central 80%": ((.1,) * 4,),
    "central 75%": ((.125,) * 4,),
    "central 70%": ((.15,) * 4,),
    "central 80% and 90%": ((.1,) * 4, (.05,) * 4),
    "4 sides 90% (10% off one side)": ((0, .1, 0, 0), (.1, 0, 0, 0), (0, 0, 0, .1),
                                       (0, 0, .1, 0)),
    "4 corners 90%": ((0, .1, 0, .1), (0, .1, .1, 0), (.1, 0, 0, .1), (.1, 0, .1, 0)),
}


def thumbnail_families(six, descs, smalls, cls, i, j, label, pclass, choose, report, radius):
    """Probe hashes made at commit from the stored thumbnail (no bytes, no writer time),
    each family added to the six, chosen on half A: of the families that add no confirmed
    false pair there, the one putting the most of A's positives within radius - 2 bits
    (A's positives are all candidates already: the margin is what a family can add there),
    fewest hashes on a tie. Half B reports what each would find."""
    flat = [d is None for d in descriptor.thumbnail_probes(descs)]
    base = least(six, i, j) <= radius
    pos_a = (label == 1) & choose & (pclass != "")
    print(f"\nprobe hashes made at commit from the stored thumbnail, each family added to the "
          f"six at radius {radius}, chosen on half A (no confirmed false pair added there, "
          f"then the most of its {int(pos_a.sum())} positives within {radius - 2} bits; the "
          f"six: {int((pos_a & (least(six, i, j) <= radius - 2)).sum())}); B reports:")
    out, best = {}, None
    for name, cuts in THUMBNAIL_FAMILIES.items():
        more = six
        for cut in cuts:
            more = with_probes(more, [None if f else thumbnail_hash(d, cut)
                                      for d, f in zip(descs, flat)])
        dist = least(more, i, j)
        row = {"hashes": more.shape[1], "margin_A": int((pos_a & (dist <= radius - 2)).sum())}
        for part, universe in (("A", choose), ("B", report)):
            new = np.flatnonzero((dist <= radius) & universe & ~base)
            keep = built_descriptor(i[new].tolist(), j[new].tolist(), smalls)[0]
            lab = label[new]
            row[part] = {"candidates": len(new), "positives": int(((lab == 1) & keep).sum()),
                         "combos": int(((pclass[new] == "combo") & keep).sum()),
                         "false": false_by_class(keep, new, label, cls, i, j)}
        out[name] = row
        if not row["A"]["false"] and (best is None or (row["margin_A"], -row["hashes"]) >
                                      (out[best]["margin_A"], -out[best]["hashes"])):
            best = name
        print(f"  {name:<32} {row['hashes']} hashes  A: {row['margin_A']} within "
              f"{radius - 2} bits, {row['A']['candidates']} more candidates, false "
              f"{row['A']['false'] or 'none'}  |  B: {row['B']['candidates']} more candidates, "
              f"+{row['B']['positives']} positives ({row['B']['combos']} combinations), false "
              f"{row['B']['false'] or 'none'}")
    print(f"  chosen on A: {best}")
    out["chosen"] = best
    return out


# --- scoring ------------------------------------------------------------------------------

RECALL = ("single", "combo") + tuple(f"fresh {k}" for k in FRESH_KINDS)


def positive_classes(kind, i, j, label):
    """Per pair, the recall it counts in: "single" (a corpus original and one single-transform
    variant), "combo" (and its all-at-once variant), "fresh KIND" (a fresh original and its
    copy of that kind); "" for other positives (two variants) and for negatives."""
    ki, kj = kind[i], kind[j]
    out = np.full(len(i), "", object)
    pos = label == 1
    for prefix in ("", "fresh "):
        orig = pos & ((ki == prefix + "original") | (kj == prefix + "original"))
        other = np.where(ki == prefix + "original", kj, ki)
        if prefix:
            for k in FRESH_KINDS:
                out[orig & (other == prefix + k)] = prefix + k
        else:  # (a positive never pairs a corpus image with a fresh one)
            out[orig & (other == "all")] = "combo"
            out[orig & ~np.isin(other, ("all", "original"))] = "single"
    return out.astype(str)


def scores(keep, cand, label, pclass, i, j, universe):
    """{recall per class ("fresh": the five fresh ones pooled, "existing": single and combo
    pooled), direct and implied precision, false pairs} of the
    confirmed candidates `cand[keep]`, the recall's totals counted over `universe` (pairs)."""
    c = cand[keep]
    lab = label[c]
    tp, fp = int((lab == 1).sum()), int(((lab == 0) | (lab == -1)).sum())
    out = {}
    for cl in RECALL + ("fresh", "existing"):
        want = (np.char.startswith(pclass, "fresh ") if cl == "fresh" else
                np.isin(pclass, ("single", "combo")) if cl == "existing" else pclass == cl)
        total = int((want & universe).sum())
        out[cl] = (int(want[c].sum()) / total) if total else float("nan")
    out["direct"] = tp / max(1, tp + fp)
    out["implied"] = _implied_precision(c, label, i, j)
    out["false"] = fp
    return out


def _implied_precision(c, label, i, j):
    """Precision over every pair inside a connected set of the reported pairs."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    n = int(max(i.max(), j.max())) + 1
    if not len(c):
        return 1.0
    graph = coo_matrix((np.ones(len(c)), (i[c], j[c])), shape=(n, n))
    _, comp = connected_components(graph, directed=False)
    sizes = np.bincount(comp)
    good = bad = 0
    for root in np.flatnonzero(sizes > 1):
        members = np.flatnonzero(comp == root)
        a, b = np.triu_indices(len(members), 1)
        a, b = members[a], members[b]
        q = label[a * n - a * (a + 1) // 2 + (b - a - 1)]
        good += int((q == 1).sum())
        bad += int(((q == 0) | (q == -1)).sum())
    return good / max(1, good + bad)


def false_by_class(keep, cand, label, cls, i, j):
    c = cand[keep]
    out = {}
    for q in c[(label[c] == 0) | (label[c] == -1)]:
        name = "-".join(sorted((cls[i[q]], cls[j[q]])))
        out[name] = out.get(name, 0) + 1
    return out


def halves(group, i, j, label):
    """(choose, report): boolean masks over pairs. Groups (a photo, a fresh crop, a source of
    hard crops, a hard image) are dealt to two halves at random, and so are pairs across
    groups (all negatives), each on its own (seeded): every positive and every negative
    inside a group follows its group, so half A's photos never report on half B."""
    names = sorted(set(group.tolist()))
    rng = np.random.default_rng(SEED)
    order = rng.permutation(len(names))
    half = {names[k]: int(r % 2) for r, k in enumerate(order)}
    gi = np.array([half[g] for g in group])[i]
    of = np.where(group[i] == group[j], gi, rng.integers(0, 2, len(i)))
    kept = label != 9
    return kept & (of == 0), kept & (of == 1)


STRUCTURE_GRID = np.round(np.arange(0.10, 0.501, 0.01), 2)
CHROMA_GRID = np.round(np.arange(1.0, 10.01, 0.1), 1)


def choose_limits(s, c, cand, label, pclass, i, j, universe):
    """The limits chosen on one half: of the grid's (structure, chroma) limits with direct
    precision >= 99.5% and implied >= 99% on that half, those confirming the most of its
    positives, and of those the ones with the fewest false pairs; of those, the one farthest
    (in grid steps) from any other limit: the middle of the gap between the positives and
    the negatives. -> (structure, chroma, positives confirmed, of, false pairs)."""
    from scipy.ndimage import distance_transform_edt

    inside = universe[cand]
    cand, s, c = cand[inside], s[inside], c[inside]
    lab = label[cand]
    pos = lab == 1
    tp = np.zeros((len(STRUCTURE_GRID), len(CHROMA_GRID)), int)
    fp = np.zeros(tp.shape, int)
    ok = np.zeros(tp.shape, bool)
    for a, ms in enumerate(STRUCTURE_GRID):
        for b, mc in enumerate(CHROMA_GRID):
            keep = (s <= ms) & (c <= mc)
            tp[a, b], fp[a, b] = int((keep & pos).sum()), int((keep & ~pos).sum())
            if tp[a, b] / max(1, tp[a, b] + fp[a, b]) >= 0.995:
                ok[a, b] = _implied_precision(cand[keep], label, i, j) >= 0.99
    if not ok.any():
        raise SystemExit("no limits on the grid meet direct precision >= 99.5% and implied "
                         ">= 99% on half A")
    most = tp[ok].max()
    fewest = fp[ok & (tp == most)].min()  # the precision target is a floor, not a budget
    plateau = ok & (tp == most) & (fp == fewest)
    depth = distance_transform_edt(np.pad(plateau, 1))[1:-1, 1:-1]
    a, b = np.unravel_index(np.argmax(depth), depth.shape)
    return (float(STRUCTURE_GRID[a]), float(CHROMA_GRID[b]), int(most), int(pos.sum()),
            int(fewest))


def plan_recall(hashes, i, j, label, pclass, smalls, radius, universe):
    """The pairs the build's search finds as catalogs grow: past band_plan.BUDGET the plan
    is multi-probe (exact to a smaller radius), so the far pairs are found only in part."""
    from beam_pipeline.dedup import band_plan

    bits = corpus_lib.bit_frequencies(hashes)
    print(f"\nthe search plan the build picks at radius {radius} for a catalog of n images "
          f"({hashes.shape[1]} hashes each), applied to these pairs, confirmed:")
    out = {}
    for n in (50_000, 1_000_000, 10_000_000):
        k = hashes.shape[1] * n
        stats = corpus_lib.stats_of(k, bits)
        plan = band_plan.choose_plan(radius, stats)
        found = np.zeros(len(i), bool)
        for a in range(hashes.shape[1]):
            for b in range(hashes.shape[1]):
                found |= band_plan.found_by(plan, hashes[i, a] ^ hashes[j, b])
        cand = np.nonzero(found & universe)[0]
        keep, _ = built_descriptor(i[cand].tolist(), j[cand].tolist(), smalls)
        sc = scores(keep, cand, label, pclass, i, j, universe)
        out[str(n)] = dict(plan=list(plan.widths), sub_radius=plan.sub_radius,
                           exact_radius=plan.exact_radius, **sc)
        print(f"  {n:>10,} images: bands {'x'.join(map(str, plan.widths))} within "
              f"{plan.sub_radius}, exact to {plan.exact_radius}: {_line(sc)}")
    return out


def _line(sc):
    return (f"single {sc['single']:.1%} combo {sc['combo']:.1%} fresh {sc['fresh']:.1%} "
            f"direct {sc['direct']:.2%} implied {sc['implied']:.2%}")


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--radii", default="6,8,10")
    parser.add_argument("--fresh_dir", default=os.path.join(DATA, "near-fresh"),
                        help="where the fresh positives and truth.jsonl are written")
    add_record_argument(parser)
    args = parser.parse_args(argv)
    record = Record("bench_near_duplicate_precision", args)
    radii = [int(r) for r in args.radii.split(",")]
    t0 = time.time()
    datas, cls, kind, group, truth, applied, i, j, label = dataset()
    write_fresh(args.fresh_dir, datas, truth)
    smalls = [small_rgb(d) for d in datas]
    descs = [descriptor.describe(s) for s in smalls]
    pairs = np.array([perceptual.phash_pair(s) for s in smalls], np.uint64)
    six = np.array([perceptual.phash_pair(s) + descriptor.probes(d)
                    for s, d in zip(smalls, descs)], np.uint64)  # stored: whole, centre, corners
    hashes = with_probes(six, descriptor.thumbnail_probes(descs))  # the build's seven
    dist, dist6, dist2 = (least(h, i, j) for h in (hashes, six, pairs))
    pclass = positive_classes(kind, i, j, label)
    everything = label != 9
    choose, report = halves(group, i, j, label)
    classes = {str(c): int((cls == c).sum()) for c in dict.fromkeys(cls)}
    fresh_hard = int(((label == 0) & (cls[i] == "fresh") & (cls[j] == "fresh")).sum())
    totals = {c: int((pclass == c).sum()) for c in RECALL}
    print(f"{len(datas)} images ({classes}); positives {int((label == 1).sum())} in all, "
          f"{totals}; hard negative pairs {int((label == 0).sum())} ({fresh_hard} of them "
          f"fresh crops overlapping < {FRESH_HARD:.0%}), distinct {int((label == -1).sum())} "
          f"({time.time() - t0:.0f} s to make and hash); the "
          f"fresh set and its truth: {args.fresh_dir}")
    r = near_duplicates.DEFAULT_RADIUS
    cand = np.nonzero((dist <= r) & everything)[0]
    s, c = measured(i[cand].tolist(), j[cand].tolist(), smalls)
    ms, mc, got, of, wrong = choose_limits(s, c, cand, label, pclass, i, j, choose)
    built = (descriptor.MAX_STRUCTURE, descriptor.MAX_CHROMA)
    print(f"\nlimits chosen on half A ({int(choose.sum())} pairs, "
          f"{int((label[choose] == 1).sum())} positives) at radius {r}: structure <= {ms:g}, "
          f"chroma <= {mc:g} ({got} of its {of} candidate positives, {wrong} false pairs); "
          f"built: structure <= {built[0]:g}, chroma <= {built[1]:g}"
          f"{'' if (ms, mc) == built else '  (DIFFERENT: update descriptor.py)'}")
    figures = {"chosen": {"structure": ms, "chroma": mc, "confirmed": got, "candidates": of,
                          "false": wrong}, "built": list(built), "radii": {},
               "alternatives": {}}
    print("\n'2 hashes': whole and central 90%; '6 hashes': and the four 95% corner crops; "
          "'7 hashes': and the thumbnail's central 85%, made at commit (built); '+ before': "
          "confirmed as before (19 windows, <= 0.25, <= 3); '+ means': "
          "49 windows, the whole means' chroma (<= 0.29, <= 4.4: before the colour grid); "
          "'+ conf': "
          "the built confirmation (49 windows, chroma over the window they line up, its "
          "limits). Half A chose the limits; half B "
          "reports them.")
    print(f"\n{'radius':>6} {'scheme':<17} {'pairs':<6} {'single':>7} {'combo':>7} "
          f"{'fresh':>7} {'direct':>8} {'implied':>8}  false pairs by class")
    for rad in radii:
        for hashed, d, confirms in (("2 hashes", dist2, ALL_CONFIRMS),
                                    ("6 hashes", dist6, ALL_CONFIRMS),
                                    ("7 hashes", dist,
                                     (("", None), (" + conf", built_descriptor)))):
            for scheme, confirm in ((hashed + name, fn) for name, fn in confirms):
                for part, universe in (("all", everything), ("A", choose), ("B", report)):
                    cd = np.nonzero((d <= rad) & universe)[0]
                    keep = (np.ones(len(cd), bool) if confirm is None else
                            confirm(i[cd].tolist(), j[cd].tolist(), smalls)[0])
                    sc = scores(keep, cd, label, pclass, i, j, universe)
                    fp = false_by_class(keep, cd, label, cls, i, j)
                    figures["radii"].setdefault(str(rad), {}).setdefault(scheme, {})[part] = \
                        dict(sc, false=fp)
                    print(f"{rad:>6} {scheme:<17} {part:<6} {sc['single']:>7.1%} "
                          f"{sc['combo']:>7.1%} {sc['fresh']:>7.1%} {sc['direct']:>8.2%} "
                          f"{sc['implied']:>8.2%}  {fp}")
    print(f"\nrecall per class at radius {r}, built confirmation (all / half A / half B):")
    keep = built_descriptor(i[cand].tolist(), j[cand].tolist(), smalls)[0]
    per = {part: scores(keep[u[cand]], cand[u[cand]], label, pclass, i, j, u)
           for part, u in (("all", everything), ("A", choose), ("B", report))}
    for cl in RECALL + ("existing", "fresh"):
        print(f"  {cl:<22} " + "  ".join(f"{per[p][cl]:6.1%}" for p in per)
              + f"   ({totals.get(cl, 'pooled')} pairs)")
    figures["per_class"] = per
    rejected = cand[~keep & (label[cand] == 1) & (pclass[cand] != "")]
    print("  positives the confirmation rejects (class, photo group, structure, chroma): "
          + "; ".join(f"{pclass[q]} {group[i[q]]} {float(s[k]):.3f} {float(c[k]):.2f}"
                      for k, q in enumerate(cand) if q in set(rejected.tolist())))
    inside = within_fresh_bounds(applied, kind, i, j)
    figures["bounds"] = bounds(keep, cand, pclass, inside,
                               {"all": everything, "A": choose, "B": report})
    figures["hard_overlap"] = hard_overlaps(label, cls, group, applied, i, j)
    figures["misses"] = misses(cand, keep, dist, smalls, group, i, j, pclass, report,
                               ("single", "combo"), applied, inside)
    figures["thumbnail_probes"] = thumbnail_families(six, descs, smalls, cls, i, j, label,
                                                     pclass, choose, report, r)
    figures["windows"] = window_sets(cand, smalls, label, pclass, i, j,
                                     {"all": everything, "A": choose, "B": report})
    figures["probes"] = probe_alternatives(six, smalls, cls, i, j, label, pclass,
                                           {"all": everything, "A": choose, "B": report}, r)
    figures["plans"] = plan_recall(hashes, i, j, label, pclass, smalls, r, everything)
    print(f"\nalternatives at radius {r} (the hash's candidates, each confirmed by one "
          "descriptor):")
    for name, confirm in ALTERNATIVES.items():
        t = time.perf_counter()
        keep, limit = confirm(i[cand].tolist(), j[cand].tolist(), smalls, label[cand] == 1)
        took = (time.perf_counter() - t) / max(1, len(cand)) * 1e6
        sc = scores(keep, cand, label, pclass, i, j, everything)
        fp = false_by_class(keep, cand, label, cls, i, j)
        figures["alternatives"][name] = dict(sc, false=fp, us_per_pair=took)
        print(f"  {name:<58} {limit:<15} {_line(sc)} ({took:.0f} us/pair incl. describing) "
              f"false {fp}")
    record.save(figures)


if __name__ == "__main__":
    main()
