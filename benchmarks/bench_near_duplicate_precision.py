"""Near-duplicate precision on hard negatives: the hash alone against the hash confirmed by
the built descriptor (dedup/descriptor.py) and the alternatives it was chosen over.

    python benchmarks/bench_near_duplicate_precision.py [--radii 6,8,10,12] [--record PATH]

The positives are bench_near_duplicates.py's: ~22 photos that scikit-image, scikit-learn and
matplotlib ship, each a scene and 5 crops, each stored as an original and 6 variants (crop
<= 10%, resize 40-90%, JPEG q40-95, brightness +/-10%, the other format, all at once).
"single": an original and one single-transform variant; "combo": an original and the
all-at-once variant. Every pair of one scene is a positive; crops of one photo overlapping
less than half are hard negatives.

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

Printed: at each radius, recall (single, combo) and precision on direct pairs and on the
pairs the reported components imply, hash only and confirmed; per class, the false pairs
each scheme reports; the alternatives' figures at the built radius. Needs the "bench" extra.
"""

import argparse
import io
import os
import random
import sys
import time

import numpy as np
from PIL import Image, ImageFilter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench_near_duplicates as corpus_lib  # noqa: E402
from common import Record, add_record_argument  # noqa: E402
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


def dataset():
    """(datas, class per image, kind per image, i, j, label): label 1 positive, 0 hard
    negative, -1 distinct, 9 left out; upper-triangle pairs."""
    items = corpus_lib.corpus(random.Random(corpus_lib.SEED))
    hard = hard_negatives()
    base = len(items)
    datas = [d for d, *_ in items] + [corpus_lib.encode(img, "JPEG" if k % 2 else "PNG")
                                      for k, (img, _, _) in enumerate(hard)]
    cls = np.array(["photo"] * base + [c for _, c, _ in hard])
    kind = np.array([k for *_, k in items] + ["hard"] * len(hard))
    i, j, corpus_label = corpus_lib.pair_labels(items)
    n = len(datas)
    i, j = np.triu_indices(n, 1)
    label = np.full(i.shape, 0, np.int8)
    inside = j < base
    label[inside] = corpus_label
    names = [name for name, _ in corpus_lib.photos()]
    photo = np.array([p for _, p, _, _ in items])
    for q, (_, _, src) in enumerate(hard):
        if src in names:  # a crop of a corpus photo vs that photo's scenes: may overlap
            label[(j == base + q) & (i < base) & (photo[np.minimum(i, base - 1)]
                                                  == names.index(src))] = 9
    return datas, cls, kind, i, j, label


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


def built_descriptor(pairs_i, pairs_j, smalls, positive=None):
    desc = {k: descriptor.describe(smalls[k]) for k in set(pairs_i) | set(pairs_j)}
    s, c = descriptor.distances([desc[k] for k in pairs_i], [desc[k] for k in pairs_j])
    return descriptor.confirmed(s, c), "its own limits"


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
    "BUILT: luma 16x16 aligned (<= 0.25) + chroma (<= 3)": built_descriptor,
}


# --- scoring ------------------------------------------------------------------------------

def scores(keep, cand, label, kind, i, j, totals):
    """(single recall, combo recall, direct precision, implied precision, false by class)."""
    c = cand[keep]
    lab = label[c]
    tp, fp = int((lab == 1).sum()), int(((lab == 0) | (lab == -1)).sum())
    ki, kj = kind[i[c]], kind[j[c]]
    other = np.where(ki == "original", kj, ki)
    orig = (ki == "original") | (kj == "original")
    single = int(((lab == 1) & orig & (other != "all") & (other != "original")).sum())
    combo = int(((lab == 1) & orig & (other == "all")).sum())
    implied = _implied_precision(c, label, i, j)
    return (single / totals[0], combo / totals[1], tp / max(1, tp + fp), implied)


def _implied_precision(c, label, i, j):
    """Precision over every pair inside a component of the reported pairs."""
    pairs = [near_duplicates.NearPair((int(a), int(b)), ("", ""), 0, 0.0, 0.0, True)
             for a, b in zip(i[c], j[c])]
    n = int(max(i.max(), j.max())) + 1
    index = {}
    good = bad = 0
    for comp in near_duplicates.components(pairs):
        comp = sorted(comp)
        for x in range(len(comp)):
            for y in range(x + 1, len(comp)):
                a, b = comp[x], comp[y]
                q = index.setdefault((a, b), a * n - a * (a + 1) // 2 + (b - a - 1))
                good += label[q] == 1
                bad += label[q] in (0, -1)
    return good / max(1, good + bad)


def false_by_class(keep, cand, label, cls, i, j):
    c = cand[keep]
    out = {}
    for q in c[(label[c] == 0) | (label[c] == -1)]:
        name = "-".join(sorted((cls[i[q]], cls[j[q]])))
        out[name] = out.get(name, 0) + 1
    return out


def plan_recall(hashes, i, j, label, kind, totals, smalls, radius):
    """The pairs the build's search finds as catalogs grow: past band_plan.BUDGET the plan
    is multi-probe (exact to a smaller radius), so the far pairs are found only in part."""
    from beam_pipeline.dedup import band_plan

    bits = corpus_lib.bit_frequencies(hashes)
    print(f"\nthe search plan the build picks at radius {radius} for a catalog of n images "
          "(six hashes each), applied to these pairs, confirmed:")
    out = {}
    for n in (50_000, 1_000_000, 10_000_000):
        k = hashes.shape[1] * n
        stats = corpus_lib.stats_of(k, bits)
        plan = band_plan.choose_plan(radius, stats)
        found = np.zeros(len(i), bool)
        for a in range(hashes.shape[1]):
            for b in range(hashes.shape[1]):
                found |= band_plan.found_by(plan, hashes[i, a] ^ hashes[j, b])
        cand = np.nonzero(found & (label != 9))[0]
        keep, _ = built_descriptor(i[cand].tolist(), j[cand].tolist(), smalls)
        sc = scores(keep, cand, label, kind, i, j, totals)
        out[str(n)] = dict(plan=list(plan.widths), sub_radius=plan.sub_radius,
                           exact_radius=plan.exact_radius, single=sc[0], combo=sc[1],
                           direct=sc[2], implied=sc[3])
        print(f"  {n:>10,} images: bands {'x'.join(map(str, plan.widths))} within "
              f"{plan.sub_radius}, exact to {plan.exact_radius}: single {sc[0]:.1%} combo "
              f"{sc[1]:.1%} direct {sc[2]:.2%} implied {sc[3]:.2%}")
    return out


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--radii", default="6,8,10")
    add_record_argument(parser)
    args = parser.parse_args(argv)
    record = Record("bench_near_duplicate_precision", args)
    radii = [int(r) for r in args.radii.split(",")]
    t0 = time.time()
    datas, cls, kind, i, j, label = dataset()
    smalls = [small_rgb(d) for d in datas]
    pairs = np.array([perceptual.phash_pair(s) for s in smalls], np.uint64)
    hashes = np.array([perceptual.phash_pair(s) + descriptor.probes(descriptor.describe(s))
                       for s in smalls], np.uint64)  # the build's six: whole, centre, corners
    dist = np.minimum.reduce([perceptual.hamming_many(hashes[i, a], hashes[j, b])
                              for a in range(6) for b in range(6)])
    dist2 = np.minimum.reduce([perceptual.hamming_many(pairs[i, a], pairs[j, b])
                               for a in (0, 1) for b in (0, 1)])
    ki, kj = kind[i], kind[j]
    orig = (ki == "original") | (kj == "original")
    other = np.where(ki == "original", kj, ki)
    totals = (int(((label == 1) & orig & (other != "all") & (other != "original")).sum()),
              int(((label == 1) & orig & (other == "all")).sum()))
    classes = {c: int((cls == c).sum()) for c in dict.fromkeys(cls)}
    print(f"{len(datas)} images ({classes}); positives: {totals[0]} single, {totals[1]} combo, "
          f"{int((label == 1).sum())} in all; hard negative pairs {int((label == 0).sum())}, "
          f"distinct {int((label == -1).sum())} ({time.time() - t0:.0f} s to make and hash)")
    figures = {"radii": {}, "alternatives": {}}
    print("\n'2 hashes': whole and central 90% (before); '6 hashes': and the four 95% corner "
          "crops (built); '+ conf': confirmed by the built descriptor")
    print(f"\n{'radius':>6} {'scheme':<17} {'single':>7} {'combo':>7} {'direct':>8} "
          f"{'implied':>8}  false pairs by class")
    for r in radii:
        for hashed, d in (("2 hashes", dist2), ("6 hashes", dist)):
            cand = np.nonzero((d <= r) & (label != 9))[0]
            everything = np.ones(len(cand), bool)
            confirmed, _ = built_descriptor(i[cand].tolist(), j[cand].tolist(), smalls)
            for scheme, keep in ((f"{hashed}", everything), (f"{hashed} + conf", confirmed)):
                s = scores(keep, cand, label, kind, i, j, totals)
                fp = false_by_class(keep, cand, label, cls, i, j)
                figures["radii"].setdefault(str(r), {})[scheme] = dict(
                    single=s[0], combo=s[1], direct=s[2], implied=s[3], false=fp)
                print(f"{r:>6} {scheme:<17} {s[0]:>7.1%} {s[1]:>7.1%} {s[2]:>8.2%} "
                      f"{s[3]:>8.2%}  {fp}")
    r = near_duplicates.DEFAULT_RADIUS
    figures["plans"] = plan_recall(hashes, i, j, label, kind, totals, smalls, r)
    cand = np.nonzero((dist <= r) & (label != 9))[0]
    print(f"\nalternatives at radius {r} (the hash's candidates, each confirmed by one "
          "descriptor):")
    for name, confirm in ALTERNATIVES.items():
        t = time.perf_counter()
        keep, limit = confirm(i[cand].tolist(), j[cand].tolist(), smalls, label[cand] == 1)
        took = (time.perf_counter() - t) / max(1, len(cand)) * 1e6
        s = scores(keep, cand, label, kind, i, j, totals)
        fp = false_by_class(keep, cand, label, cls, i, j)
        figures["alternatives"][name] = dict(single=s[0], combo=s[1], direct=s[2],
                                             implied=s[3], false=fp, us_per_pair=took)
        print(f"  {name:<52} {limit:<15} single {s[0]:.1%} combo {s[1]:.1%} direct "
              f"{s[2]:.2%} implied {s[3]:.2%} ({took:.0f} us/pair incl. describing) false {fp}")
    record.save(figures)


if __name__ == "__main__":
    main()
