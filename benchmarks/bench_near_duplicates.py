"""Near-duplicate detection: which perceptual hash and threshold, at what cost, and how grouping
scales.

    python benchmarks/bench_near_duplicates.py accuracy   # hashes compared, ROC per threshold
    python benchmarks/bench_near_duplicates.py cost       # per-image cost beside the decode;
                                                          # confirmation per pair, before/after
    python benchmarks/bench_near_duplicates.py build      # 5k and 20k builds, with and without
    python benchmarks/bench_near_duplicates.py grouping [RADIUS [BANDS]]  # time, RSS, 50k-400k
    python benchmarks/bench_near_duplicates.py grouping2 [RADIUS]  # 1 vs 2 hashes an image
    python benchmarks/bench_near_duplicates.py scale [RADIUS]  # the build's plan, 50k-1M
    python benchmarks/bench_near_duplicates.py probe_cost [RADIUS]  # the join with and
                                                          # without the 7th hash, 50k, 200k
    python benchmarks/bench_near_duplicates.py            # all seven
    python benchmarks/bench_near_duplicates.py cost --record PATH   # the JSON record's path

Needs the "bench" extra (imagehash as the yardstick; the photos scikit-image, scikit-learn
and matplotlib ship). Everything generated is seeded.

accuracy: ~22 photos -> "scenes" (the photo and 5 crops of 55-75% of each side) -> each scene
stored as an original (JPEG q90 or PNG) and 6 variants: one per single transform (cropped by
up to 10%, resized to 40-90%, JPEG q40-95, brightness +/-10%, the other format) and one with
all of them at once. Positives, two definitions: (a) the issue's, an original and one
single-transform variant; (b) every pair of one scene (composite variants, and two variants
of one scene: two independent crops are up to 20% apart). Hard negatives = crops of one photo
overlapping less than half (of the smaller crop); distinct = different photos; pairs of one
photo's scenes overlapping more are left out.
"""

import io
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import simplejpeg
from PIL import Image, ImageEnhance

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from beam_pipeline.dedup import descriptor, perceptual  # noqa: E402

SEED = 21
SKIMAGE_PHOTOS = ["astronaut.png", "camera.png", "chelsea.png", "coffee.png", "coins.png",
                  "hubble_deep_field.jpg", "rocket.jpg", "retina.jpg", "motorcycle_left.png",
                  "moon.png", "page.png", "text.png", "cell.png", "brick.png", "grass.png",
                  "gravel.png", "ihc.png", "microaneurysms.png", "clock_motion.png"]
MAX_SIDE = 800
CROPS_PER_PHOTO = 5


# --- the photos and their variants ------------------------------------------------------------

def photos():
    import matplotlib
    import skimage.data
    import sklearn.datasets

    sk = os.path.dirname(skimage.data.__file__)
    paths = [os.path.join(sk, n) for n in SKIMAGE_PHOTOS]
    paths += [os.path.join(os.path.dirname(sklearn.datasets.__file__), "images", n)
              for n in ("china.jpg", "flower.jpg")]
    paths.append(os.path.join(matplotlib.get_data_path(), "sample_data", "grace_hopper.jpg"))
    out = []
    for p in paths:
        img = Image.open(p).convert("RGB")
        img.thumbnail((MAX_SIDE, MAX_SIDE), Image.Resampling.LANCZOS)
        out.append((os.path.basename(p), img))
    return out


def encode(img, fmt, quality=90):
    buf = io.BytesIO()
    if fmt == "PNG":
        img.save(buf, "PNG")
    else:
        img.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


KINDS = ("crop", "resize", "quality", "brightness", "format", "all")


def variant(img, rng, kind, done=None):
    """One near-duplicate of `kind`: crop <= 10% of each side's length in all, resize to
    40-90%, brightness +/-10%, JPEG q40-95, the other format (PNG <-> JPEG q90), or all of
    these at once (JPEG q40-95 or, 30% of the time, PNG). `done` (a dict), if given, gets
    what was done: the share of each side cut off, the scale, the brightness factor."""
    done = {} if done is None else done
    fmt, quality = ("PNG", 90) if kind == "all" and rng.random() < 0.3 else ("JPEG", 90)
    if kind in ("crop", "all"):
        w, h = img.size
        cw, ch = rng.uniform(0, 0.10) * w, rng.uniform(0, 0.10) * h
        left, top = rng.uniform(0, cw), rng.uniform(0, ch)
        img = img.crop((round(left), round(top), round(w - (cw - left)), round(h - (ch - top))))
        done["cut"] = (cw / w, ch / h)
    if kind in ("resize", "all"):
        s = rng.uniform(0.4, 0.9)
        img = img.resize((max(1, round(img.width * s)), max(1, round(img.height * s))),
                         Image.Resampling.LANCZOS)
        done["scale"] = s
    if kind in ("brightness", "all"):
        done["brightness"] = rng.uniform(0.9, 1.1)
        img = ImageEnhance.Brightness(img).enhance(done["brightness"])
    if kind in ("quality", "all") and fmt == "JPEG":
        quality = rng.randint(40, 95)
    return encode(img, fmt, quality), kind


def overlap(a, b):
    """Intersection area over the smaller box's area."""
    iw = max(0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    small = min((a[2] - a[0]) * (a[3] - a[1]), (b[2] - b[0]) * (b[3] - b[1]))
    return iw * ih / small


def corpus(rng, done=None):
    """[(data, photo index, scene box, kind)]; scene boxes are fractions of the photo.
    `done` (a list), if given, gets one dict an item: what `variant` did ({} for an original
    or a format swap)."""
    items = []
    for p, (_, img) in enumerate(photos()):
        scenes = [(0.0, 0.0, 1.0, 1.0)]
        for _ in range(CROPS_PER_PHOTO):
            fw, fh = rng.uniform(0.55, 0.75), rng.uniform(0.55, 0.75)
            x, y = rng.uniform(0, 1 - fw), rng.uniform(0, 1 - fh)
            scenes.append((x, y, x + fw, y + fh))
        for k, box in enumerate(scenes):
            w, h = img.size
            scene = img.crop(tuple(round(v * s) for v, s in zip(box, (w, h, w, h))))
            original = "PNG" if k % 2 else "JPEG"
            items.append((encode(scene, original), p, box, "original"))
            made = [{}]
            for kind in KINDS:
                made.append({})
                data, kind = variant(scene, rng, kind, made[-1])
                if kind == "format" and original == "PNG":
                    data = encode(scene, "JPEG")
                elif kind == "format":
                    data = encode(scene, "PNG")
                items.append((data, p, box, kind))
            if done is not None:
                done.extend(made)
    return items


def pair_labels(items):
    """Upper-triangle pair index arrays and labels: 1 positive, 0 hard negative,
    -1 distinct, None (left out) as 9."""
    n = len(items)
    i, j = np.triu_indices(n, 1)
    label = np.full(i.shape, 9, np.int8)
    for q, (a, b) in enumerate(zip(i, j)):
        (_, pa, ba, _), (_, pb, bb, _) = items[a], items[b]
        if pa != pb:
            label[q] = -1
        elif ba == bb:
            label[q] = 1
        elif overlap(ba, bb) < 0.5:
            label[q] = 0
    return i, j, label


# --- the hashes compared ----------------------------------------------------------------------

def is_jpeg(data):
    return data[:3] == b"\xff\xd8\xff"


def small_grey(data, side=perceptual.MIN_SIDE):
    """What the writer would have: a strict DCT-scaled grey decode for a JPEG; for others the
    full decode (Pillow), which the hash then box-averages itself."""
    if is_jpeg(data):
        return simplejpeg.decode_jpeg(data, "GRAY", min_width=side, min_height=side,
                                      strict=True)[:, :, 0]
    return np.asarray(Image.open(io.BytesIO(data)).convert("L"))


def small_rgb(data, side=perceptual.MIN_SIDE):
    """What the writer has with --near_duplicates: a strict DCT-scaled RGB decode of a JPEG,
    else the full decode."""
    if is_jpeg(data):
        return simplejpeg.decode_jpeg(data, "RGB", min_width=side, min_height=side,
                                      strict=True)
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def lib_full(fn):
    return lambda data: int(str(fn(Image.open(io.BytesIO(data)))), 16)


def lib_small(fn):
    def h(data):
        g = small_grey(data)
        f = perceptual.shrink_factor(*g.shape)
        img = Image.fromarray(g, "L")
        return int(str(fn(img.reduce(f) if f > 1 else img)), 16)
    return h


def _dct_full(data):
    t = perceptual.thumbnail(small_grey(data))
    d = perceptual._dct_rows(perceptual.HASH_SIDE, perceptual.HASH_SIDE)
    return (d @ t @ d.T).ravel()


_U, _V = np.meshgrid(np.arange(perceptual.HASH_SIDE), np.arange(perceptual.HASH_SIDE),
                     indexing="ij")
_FREQ = np.hypot(_U, _V).ravel()
_LOWEST_AC = np.argsort(_FREQ, kind="stable")[1:33]  # the 32 lowest frequencies but DC


def _pack(bits):
    return int("".join("1" if b else "0" for b in bits), 2)


def rank_thermometer(data):
    """Alternative: the 32 lowest AC frequencies in 3 rank levels (bottom 11, middle 10,
    top 11) as 2 thermometer bits each: 64 bits, a coefficient one level off costs 1 bit."""
    c = _dct_full(data)[_LOWEST_AC]
    return _pack(np.concatenate([c > np.quantile(c, q) for q in (1 / 3, 2 / 3)]))


def sign_magnitude(data):
    """Alternative: the signs of the 32 lowest AC frequencies, and which of them are larger
    than the median once weighted by frequency (a photo's spectrum falls as 1/f)."""
    c = _dct_full(data)[_LOWEST_AC]
    m = np.abs(c) * _FREQ[_LOWEST_AC]
    return _pack(np.concatenate([c > 0, m > np.median(m)]))


def built(data):
    """What the writer stores (--near_duplicates): perceptual.phash_pair of the pixels it has,
    the whole image's pHash and its central 90%'s; a pair's distance is the least of the 4."""
    return perceptual.phash_pair(small_grey(data))


def distances(hashes, i, j):
    """Pair distances; for two hashes per image, the least of the 4 combinations."""
    h = np.array(hashes, dtype=np.uint64)
    if h.ndim == 1:
        return perceptual.hamming_many(h[i], h[j])
    return np.minimum.reduce([perceptual.hamming_many(h[i, a], h[j, b])
                              for a in (0, 1) for b in (0, 1)])


def before_distances(a, b):
    """descriptor.distances as it was before each side of a window was cut on its own: 19
    windows (the whole; 95% and 90% of both sides at 9 positions), a subset of today's 49."""
    if not len(a):
        return np.zeros(0, np.float32), np.zeros(0, np.float32)
    index = {}
    ia = np.array([index.setdefault(d, len(index)) for d in a])
    ib = np.array([index.setdefault(d, len(index)) for d in b])
    thumbs, means = descriptor.parse(list(index))
    spans = 7  # per side: the whole, 95% at 3 positions, 90% at 3
    same = [y * spans + x for y in range(spans) for x in range(spans)
            if (y == x == 0) or (0 < y < 4 and 0 < x < 4) or (y >= 4 and x >= 4)]
    windows = descriptor._windows(thumbs)[:, same]
    n = descriptor.WINDOW ** 2
    r_ab = np.einsum("nk,nwk->nw", windows[ia, 0], windows[ib]).max(1) / n
    r_ba = np.einsum("nk,nwk->nw", windows[ib, 0], windows[ia]).max(1) / n
    ma, mb = means[ia], means[ib]
    return 1.0 - np.maximum(r_ab, r_ba), np.minimum(descriptor._chroma(ma, mb),
                                                    descriptor._chroma(mb, ma))


def describe_without_grid(pixels):
    """descriptor.describe as it was before the colour grid (291 bytes: probes, thumbnail,
    means), for the cost side by side: the same code less the grid's product."""
    small, grey = perceptual.reduced(pixels)
    h, w = grey.shape
    thumb = descriptor._box(h) @ grey @ descriptor._box(w).T
    flat = small.reshape(-1, 3)
    means = (descriptor._YCC @ (np.ones(len(flat)) @ flat) / len(flat) + (0, 128, 128))
    return (descriptor._PROBES.pack(*perceptual.corner_hashes_of_grey(grey))
            + np.round(thumb).astype(np.uint8).tobytes()
            + bytes(int(round(min(max(m, 0), 255))) for m in means.tolist()))


def methods():
    import imagehash

    return {
        "BUILT: pHash of image + central 90%": built,
        "ours: pHash of scaled decode (whole)": lambda d: perceptual.phash(small_grey(d)),
        "ours: pHash, decode scaled >= 64": lambda d: perceptual.phash(small_grey(d, 64)),
        "alt: rank thermometer 32x2": rank_thermometer,
        "alt: sign + magnitude 32+32": sign_magnitude,
        "imagehash.phash, scaled decode": lib_small(imagehash.phash),
        "imagehash.dhash, scaled decode": lib_small(imagehash.dhash),
        "imagehash.phash, full decode": lib_full(imagehash.phash),
        "imagehash.dhash, full decode": lib_full(imagehash.dhash),
        "imagehash.average_hash, full": lib_full(imagehash.average_hash),
        "imagehash.whash (haar), full": lib_full(imagehash.whash),
    }


def one_transform(items, i, j, label):
    """The issue's positives: an original and ONE variant of each single kind (no composite
    variants, no variant-variant pairs); negatives as before, among the same images."""
    kind = np.array([it[3] for it in items])
    keep = kind != "all"
    original = (kind[i] == "original") ^ (kind[j] == "original")
    out = np.where((label == 1) & ~original, 9, label)
    return np.where(keep[i] & keep[j], out, 9).astype(np.int8)


def roc(dist, label, t):
    """(recall, precision, false pairs hard, false pairs distinct) at threshold t."""
    tp = int((dist[label == 1] <= t).sum())
    fp_hard, fp_other = int((dist[label == 0] <= t).sum()), int((dist[label == -1] <= t).sum())
    fp = fp_hard + fp_other
    return tp / (label == 1).sum(), tp / (tp + fp) if tp + fp else 1.0, fp_hard, fp_other


def chance_z(dist, label, t):
    """How many standard deviations below the mean distance of distinct photos t lies: the
    benchmark's 407,484 distinct pairs cannot show chance rates below ~1e-6, a dataset of
    50,000 images has 1.25e9 pairs; hashes are compared for chance pairs at equal z."""
    d = dist[label == -1].astype(float)
    return (d.mean() - t - 0.5) / d.std()


def recall_by_kind(items, i, j, label, dist, t):
    """Recall on (original, variant) pairs per kind of variant, and on variant-variant pairs."""
    kind = np.array([it[3] for it in items])
    ki, kj = kind[i], kind[j]
    pos = label == 1
    out = {}
    for k in KINDS:
        sel = pos & (((ki == "original") & (kj == k)) | ((kj == "original") & (ki == k)))
        out[k] = float((dist[sel] <= t).mean())
    sel = pos & (ki != "original") & (kj != "original")
    out["variant-variant"] = float((dist[sel] <= t).mean())
    return out


def _best(dist, label):
    """(t, recall, precision) of the largest recall with precision >= 99%, and the smallest t
    with recall >= 95% (t, recall, precision)."""
    rows = [(t, *roc(dist, label, t)[:2]) for t in range(0, 33)]
    ok = [r for r in rows if r[2] >= 0.99]
    return (max(ok, key=lambda r: r[1]) if ok else rows[0],
            next((r for r in rows if r[1] >= 0.95), rows[-1]))


def accuracy():
    rng = random.Random(SEED)
    items = corpus(rng)
    i, j, label = pair_labels(items)
    defs = {"(a)": one_transform(items, i, j, label), "(b)": label}
    print(f"{len(items)} images ({sum(is_jpeg(d) for d, *_ in items)} JPEG). (a) the issue's "
          f"positives, an original and one variant of a single kind: {(defs['(a)'] == 1).sum()}; "
          f"(b) every pair of one scene, composite variants (all kinds at once) and "
          f"variant-variant pairs too: {(label == 1).sum()}. Negatives: {(label == 0).sum()} "
          f"hard (crops of one photo overlapping < half), {(label == -1).sum()} distinct "
          f"(b; (a) {(defs['(a)'] == 0).sum()} / {(defs['(a)'] == -1).sum()}), "
          f"{(label == 9).sum()} overlapping crops left out")
    summary = {}
    for name, fn in methods().items():
        dist = distances([fn(d) for d, *_ in items], i, j)
        summary[name] = {k: _best(dist, lab) for k, lab in defs.items()}
        pos = dist[label == 1]
        print(f"\n{name}: (b) positive distance median {np.median(pos):.0f}, p95 "
              f"{np.percentile(pos, 95):.0f}, max {pos.max()}; hard negative min "
              f"{dist[label == 0].min()}, distinct min {dist[label == -1].min()}")
        print("  t  (a) recall precision false   (b) recall precision false (hard/distinct)"
              "  chance z")
        for t in range(4, 21):
            ra, pa, ha, da = roc(dist, defs["(a)"], t)
            rb, pb, hb, db = roc(dist, label, t)
            print(f" {t:2d}  {ra:10.1%} {pa:9.2%} {ha + da:5d}   {rb:10.1%} {pb:9.2%} "
                  f"{hb:5d} / {db:<6d}  {chance_z(dist, label, t):12.1f}")
        t = summary[name]["(b)"][0][0]
        print("  recall per kind at t={}: ".format(t) + "  ".join(
            f"{k} {v:.0%}" for k, v in recall_by_kind(items, i, j, label, dist, t).items()))
    print("\ntargets recall >= 95% and precision >= 99%: per definition, the best t with "
          "precision >= 99% and the first t with recall >= 95%")
    for name, by in summary.items():
        print(f"  {name:34s} " + "   ".join(
            f"{k} t={b[0]:2d} R {b[1]:5.1%} P {b[2]:6.2%}, R95 at t={r[0]:2d} P {r[2]:6.2%}"
            for k, (b, r) in by.items()))


# --- cost beside the writer's decode ----------------------------------------------------------

def per_image_us(fn, datas, repeat=5):
    """Median over images of the best of `repeat` runs, in microseconds."""
    out = []
    for d in datas:
        best = float("inf")
        for _ in range(repeat):
            t = time.perf_counter()
            fn(d)
            best = min(best, time.perf_counter() - t)
        out.append(best * 1e6)
    return statistics.median(out)


def corruptions(datas, rng, per=8):
    """Byte flips inside the entropy-coded data, and truncations."""
    out = []
    for d in datas:
        sos = d.find(b"\xff\xda")
        for _ in range(per):
            b = bytearray(d)
            if rng.random() < 0.25:
                b = b[:rng.randrange(sos + 20, len(d) - 2)]
            else:
                k = rng.randrange(sos + 20, len(d) - 2)
                b[k] ^= 1 << rng.randrange(8)
            out.append(bytes(b))
    return out


def refused(fn, d):
    try:
        fn(d)
    except (ValueError, KeyError):
        return True
    return False


CPU_SLOPE_US = 770.0  # the default build's CPU per image, 5,000 -> 20,000 (`build`, median)


def cost():
    import imagehash
    from common import _make

    tmp = tempfile.mkdtemp()
    datas = []
    for k in range(40):  # the default pipeline benchmark's images: 500x375 JPEG q75
        _make((os.path.join(tmp, f"{k}.jpg"), k))
        datas.append(open(os.path.join(tmp, f"{k}.jpg"), "rb").read())
    full_grey = lambda d: simplejpeg.decode_jpeg(d, "GRAY", strict=True)  # noqa: E731
    full_rgb = lambda d: simplejpeg.decode_jpeg(d, "RGB", strict=True)  # noqa: E731
    scaled = lambda d: simplejpeg.decode_jpeg(  # noqa: E731
        d, "GRAY", min_width=perceptual.MIN_SIDE, min_height=perceptual.MIN_SIDE, strict=True)
    small = [scaled(d)[:, :, 0] for d in datas]
    rgb = [full_rgb(d) for d in datas]
    pil_small = [Image.fromarray(s, "L") for s in small]
    figures = {
        "full strict grey decode": per_image_us(full_grey, datas),
        "full strict RGB decode (re-encode path)": per_image_us(full_rgb, datas),
        "strict grey decode scaled to >= 32 px": per_image_us(scaled, datas),
        "ours: pHash of the scaled decode's pixels": per_image_us(perceptual.phash, small),
        "BUILT: phash_pair of the scaled decode's pixels": per_image_us(perceptual.phash_pair,
                                                                        small),
        "ours: pHash of full RGB pixels": per_image_us(perceptual.phash, rgb),
        "BUILT: phash_pair of full RGB pixels": per_image_us(perceptual.phash_pair, rgb),
        "BUILT: descriptor.describe of the scaled RGB decode": per_image_us(
            descriptor.describe, [simplejpeg.decode_jpeg(d, "RGB", min_width=perceptual.MIN_SIDE,
                                                         min_height=perceptual.MIN_SIDE)
                                  for d in datas]),
        "before the colour grid: describe of the scaled RGB decode": per_image_us(
            describe_without_grid, [simplejpeg.decode_jpeg(
                d, "RGB", min_width=perceptual.MIN_SIDE, min_height=perceptual.MIN_SIDE)
                for d in datas]),
        "imagehash.phash of the scaled decode": per_image_us(imagehash.phash, pil_small),
        "imagehash.phash of the JPEG (open + full)": per_image_us(lib_full(imagehash.phash),
                                                                  datas),
    }
    scaled_rgb = [simplejpeg.decode_jpeg(d, "RGB", min_width=perceptual.MIN_SIDE,
                                         min_height=perceptual.MIN_SIDE) for d in datas]
    descs = [descriptor.describe(s) for s in scaled_rgb]
    a, b = zip(*[(descs[x], descs[y]) for x in range(len(descs))
                 for y in range(x + 1, len(descs))])
    pairs_us = {}
    ungridded = [d[:8 * descriptor.PROBES] + d[-descriptor.CONFIRM_SIZE:] for d in descs]
    a_means, b_means = zip(*[(ungridded[x], ungridded[y]) for x in range(len(descs))
                             for y in range(x + 1, len(descs))])
    for _ in range(5):  # alternating: load drifts alike
        t = time.perf_counter()
        descriptor.distances(list(a_means), list(b_means))
        pairs_us.setdefault("means", []).append((time.perf_counter() - t) / len(a) * 1e6)
        for name, fn in (("before", before_distances), ("built", descriptor.distances)):
            t = time.perf_counter()
            fn(list(a), list(b))
            pairs_us.setdefault(name, []).append((time.perf_counter() - t) / len(a) * 1e6)
    figures["confirmation per candidate pair, before (19 windows)"] = min(pairs_us["before"])
    figures["confirmation per candidate pair, before the grid (whole means)"] = min(
        pairs_us["means"])
    figures["confirmation per candidate pair, built (49 windows)"] = min(pairs_us["built"])
    from beam_pipeline.job import images

    for label, opts in (("", images.EncodeOptions()),
                        (", --reencode always", images.EncodeOptions(reencode="always"))):
        figures[f"writer path: images.convert{label}"] = per_image_us(
            lambda d: images.convert(d, opts), datas)
        figures[f"writer path: images.convert{label}, with_phash"] = per_image_us(
            lambda d: images.convert(d, opts, with_phash=True), datas)
    print(f"per image, median of {len(datas)} 500x375 JPEGs (the pipeline benchmark's), best "
          f"of 5 runs each, in one thread; % of the default build's CPU per image "
          f"({CPU_SLOPE_US:.0f} us, the `build` mode's median)")
    for name, us in figures.items():
        print(f"  {name:58s} {us:8.1f} us  {us / CPU_SLOPE_US:6.1%}")
    for label in ("", ", --reencode always"):
        net = figures[f"writer path: images.convert{label}, with_phash"] - \
            figures[f"writer path: images.convert{label}"]
        print(f"  the hash adds {net:+.1f} us per image to the writer{label or ' (pass-through)'}"
              f" ({net / CPU_SLOPE_US:+.1%} of the default build's CPU per image; target <= 5%)")
    extra = (figures["confirmation per candidate pair, built (49 windows)"]
             - figures["confirmation per candidate pair, before (19 windows)"])
    grid = (figures["confirmation per candidate pair, built (49 windows)"]
            - figures["confirmation per candidate pair, before the grid (whole means)"])
    describe = (figures["BUILT: descriptor.describe of the scaled RGB decode"]
                - figures["before the colour grid: describe of the scaled RGB decode"])
    print(f"  confirmation: {extra:+.1f} us per candidate pair against 19 windows, "
          f"{grid:+.1f} against the whole means ({len(a)} pairs of these images, one batch, "
          f"best of 5 alternating runs); at ~0.01 candidates an image (photos with ~1% "
          f"near-duplicates) {grid * 0.01:+.2f} us per image; the colour grid adds "
          f"{describe:+.1f} us per image to describe (the writer)")
    bad = corruptions(datas, random.Random(SEED))
    a = [refused(full_grey, d) for d in bad]
    b = [refused(scaled, d) for d in bad]
    print(f"strict check, full vs scaled decode, on {len(bad)} corrupted JPEGs: full refuses "
          f"{sum(a)}, scaled refuses {sum(b)}, verdicts agree on {sum(x == y for x, y in zip(a, b))}")


def build(sizes=(5000, 20000)):
    """The default command with and without --near_duplicates on the pipeline benchmark's
    photographs: the whole cost (writer's hash, catalog column, grouping at commit), as the
    slope between two sizes of the CPU seconds of the process tree (what load moves least)."""
    import resource
    import shutil

    from common import build_command, run_measured
    from photos import photo_tree

    def cpu():
        u = resource.getrusage(resource.RUSAGE_CHILDREN)
        return u.ru_utime + u.ru_stime

    res = {}
    for n in sizes:
        src = photo_tree(n)
        for flags in ((), ("--near_duplicates",)):  # interleaved: load drifts alike
            out = tempfile.mkdtemp(prefix="bench-nd-")
            try:
                before = cpu()
                seconds, *_ = run_measured(build_command(src, os.path.join(out, "o"), *flags))
                res[n, flags] = (seconds, cpu() - before)
            finally:
                shutil.rmtree(out, ignore_errors=True)
            print(f"  {n:6d} images {' '.join(flags) or 'default':18s} wall {res[n, flags][0]:6.1f} s"
                  f"  CPU {res[n, flags][1]:6.1f} s", flush=True)
    lo, hi = sizes[0], sizes[-1]
    for k, what in ((0, "wall"), (1, "CPU")):
        slope = {f: (res[hi, f][k] - res[lo, f][k]) / (hi - lo) * 1e6
                 for f in ((), ("--near_duplicates",))}
        extra = slope[("--near_duplicates",)] - slope[()]
        print(f"{what} slope {lo} -> {hi}: default {slope[()]:.0f} us/image, with "
              f"--near_duplicates {slope[('--near_duplicates',)]:.0f} us/image: {extra:+.0f} us "
              f"({extra / slope[()]:+.1%}; on by default only at <= 5%)")


# --- grouping at scale ------------------------------------------------------------------------

GROUP_SIZES = (50_000, 100_000, 200_000, 400_000)
INCREMENTAL = (400_000, 0.01)  # old rows, new fraction: a nightly run against a big catalog


def bit_frequencies(hashes):
    """How often each of the 64 bits is 1 over `hashes` (uint64), bit 0 = LSB."""
    hashes = np.asarray(hashes, np.uint64).ravel()
    return ((hashes[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)).mean(0)


def stats_of(n, frequencies):
    """The plan's statistics for n new hashes with these bit frequencies."""
    from beam_pipeline.dedup import band_plan

    return band_plan.Stats(n, 0, tuple(int(round(q * n)) for q in frequencies))


def synthetic_hashes(n, radius, real_path, seed=SEED):
    """n hashes that look like real ones: the benchmark's own (with their near-duplicate
    pairs), then independent bits with the per-bit frequencies measured on them (the top
    bit, pHash's DC term, is always 1, so buckets are fuller than uniform hashes make them);
    1% of the rows get a planted near copy within `radius` (bits that vary only: pHash's
    top bit never does). Made 50,000 at a time, so the process's peak RSS is the grouping's."""
    rng = np.random.default_rng(seed)
    real = np.load(real_path)
    p = bit_frequencies(real)
    h = np.empty(n, np.uint64)
    for lo in range(0, n, 50_000):
        bits = rng.random((min(n - lo, 50_000), 64)) < p
        h[lo:lo + len(bits)] = (bits.astype(np.uint64) << np.arange(64, dtype=np.uint64)).sum(
            1, dtype=np.uint64)
    h[:len(real)] = real
    varying = np.flatnonzero((p > 0) & (p < 1))
    planted = n // 100
    for k in range(planted):
        flips = rng.choice(varying, rng.integers(1, radius + 1), replace=False)
        h[n - planted + k] = h[len(real) + k] ^ np.uint64(sum(1 << int(f) for f in flips))
    return h, planted


def _memory_kb(field):
    """VmRSS (now) or VmHWM (peak) of this process: ru_maxrss would be the parent's peak,
    which Linux keeps across exec."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def grouping_one(n, radius, bands, real_path, new_fraction=1.0):
    """Runs in a child process so the peak RSS is this size's own. Rows are made as the
    grouping reads them (as the commit step streams them from the catalog), timed with it;
    new_fraction < 1: the first rows are old (an incremental run against them)."""
    from beam_pipeline.dedup import band_plan, near_duplicates

    h, planted = synthetic_hashes(n, radius, real_path)
    splits = ("train", "validation", "test")
    first_new = n - int(n * new_fraction)
    rows = (near_duplicates.Row(f"img/{k:08d}.jpg", splits[k % 3], v, k < first_new)
            for k, v in enumerate(h.tolist()))
    chosen = []
    choose = band_plan.choose_plan
    band_plan.choose_plan = lambda *a: chosen.append(choose(*a)) or chosen[-1]
    base = _memory_kb("VmRSS")
    t = time.perf_counter()
    found = near_duplicates.near_pairs(rows, radius, bands or None)
    pairs = len(found)
    took = time.perf_counter() - t
    peak = _memory_kb("VmHWM")
    plan = "x".join(map(str, chosen[0].widths)) + f"/{chosen[0].sub_radius}"
    print(f"{n} {took:.2f} {peak / 1024:.1f} {(peak - base) / 1024:.1f} {pairs} {planted} "
          f"{plan}")


def _child(n, radius, bands, real_path, new_fraction=1.0, repeat=2):
    """The fastest of `repeat` runs (the machine is shared: the others measure the load)."""
    runs = []
    for _ in range(repeat):
        r = subprocess.run([sys.executable, __file__, "_group", str(n), str(radius),
                            str(bands or 0), real_path, str(new_fraction)],
                           capture_output=True, text=True, check=True)
        n_, took, peak, grew, pairs, planted, plan = r.stdout.split()
        runs.append((int(n_), float(took), float(peak), float(grew), int(pairs), int(planted),
                     plan))
    return min(runs, key=lambda run: run[1])


def _extrapolate(radius, bands, real):
    """The cost model's plan and estimate per image beyond the sizes run (its constants are
    per look-up and per compared pair, fitted on this machine; spill and key reading, ~6 us
    per image, left out)."""
    from beam_pipeline.dedup import band_plan

    p = bit_frequencies(real)
    cells = []
    for n in (50_000, 400_000, 1_000_000, 10_000_000, 100_000_000):
        stats = stats_of(n, p)
        plan = band_plan.choose_plan(radius, stats, bands or None)
        cells.append(f"{n / 1e6:g}M {'x'.join(map(str, plan.widths))}/{plan.sub_radius} "
                     f"{band_plan.estimate(plan, stats) / n * 1e6:.0f} us")
    print("model, plan and estimated join time per image: " + "; ".join(cells))


def grouping(radius=None, bands=None):
    """The build's grouping (the plan chosen for each n unless BANDS is given) on hashes that
    look like real ones, at GROUP_SIZES, then an incremental run (1% new rows against the
    rest). Exact search within `radius` compares the pairs whose values in some band are
    within the sub-radius, ~n**2 * V / 2**width per band: per image, time is flat only while
    the look-ups (~V per bucket) outweigh them (docs/measurements.md)."""
    from beam_pipeline.dedup import near_duplicates

    radius = near_duplicates.DEFAULT_RADIUS if radius is None else radius
    real = np.array([perceptual.phash(small_grey(d)) for d, *_ in corpus(random.Random(SEED))],
                    dtype=np.uint64)
    real_path = os.path.join(tempfile.mkdtemp(), "real.npy")
    np.save(real_path, real)
    print(f"grouping {len(real)} benchmark hashes plus hashes with their bit frequencies, "
          f"radius {radius}, bands {bands or 'chosen per n'}; each size in its own process, "
          f"the faster of 2 runs ('grouping MB' is peak RSS minus the RSS just before "
          f"grouping)")
    print("       n   seconds  us/image  peak MB  grouping MB  pairs found  planted  plan")
    out = []
    for n in GROUP_SIZES:
        n_, took, peak, grew, pairs, planted, plan = _child(n, radius, bands, real_path)
        out.append((n_, took, grew))
        print(f" {n_:7d}  {took:8.2f}  {took / n_ * 1e6:8.1f}  {peak:7.0f}  {grew:11.1f}  "
              f"{pairs:11d}  {planted:7d}  {plan}")
    (n0, t0, m0), (n1, t1, m1) = out[0], out[-1]
    print(f"time per image {n1 // 1000}k vs {n0 // 1000}k: {(t1 / n1) / (t0 / n0):.2f}x "
          f"(linear = 1.00x); grouping memory {n1 // 1000}k vs {n0 // 1000}k: "
          f"{max(m1, 1) / max(m0, 1):.2f}x (target <= 1.15x)")
    _extrapolate(radius, bands, real)
    old, frac = INCREMENTAL
    n = int(old / (1 - frac))
    n_, took, peak, grew, pairs, planted, plan = _child(n, radius, bands, real_path, frac)
    print(f"incremental: {n - old} new rows against {old} old: {took:.2f} s "
          f"({took / (n - old) * 1e6:.0f} us per new image), grouping {grew:.1f} MB, "
          f"{pairs} pairs with a new row, plan {plan}")


# --- grouping with the built scheme's two hashes per image ------------------------------------

PAIR_SIZES = (50_000, 100_000, 200_000)


def synthetic_centres(h, real_pairs, seed=SEED):
    """A central-90% hash for each of `h`: the benchmark's own where the row is one of its
    images, else the row's hash with k varying bits flipped, k drawn from the benchmark's
    whole-vs-centre distances (a row's two hashes are that close)."""
    rng = np.random.default_rng(seed + 1)
    whole, centre = real_pairs[:, 0], real_pairs[:, 1]
    gaps = perceptual.hamming_many(whole, centre)
    p = bit_frequencies(whole)
    varying = np.flatnonzero((p > 0) & (p < 1))
    out = h.copy()
    for k in range(len(real_pairs), len(h)):
        flips = rng.choice(varying, int(rng.choice(gaps)), replace=False)
        out[k] ^= np.uint64(sum(1 << int(f) for f in flips))
    out[:len(real_pairs)] = centre
    return out


def grouping_two_one(n, radius, hashes, real_path):
    """near_pairs on n images with `hashes` (1 or 2) hashes each, in a child process."""
    from beam_pipeline.dedup import near_duplicates

    pairs_path = real_path.replace(".npy", "-pairs.npy")
    h, planted = synthetic_hashes(n, radius, real_path)
    centre = synthetic_centres(h, np.load(pairs_path)) if hashes == 2 else None
    splits = ("train", "validation", "test")
    rows = (near_duplicates.Row(f"img/{k:08d}.jpg", splits[k % 3], v, False,
                                None if centre is None else int(centre[k]))
            for k, v in enumerate(h.tolist()))
    base = _memory_kb("VmRSS")
    t = time.perf_counter()
    found = near_duplicates.near_pairs(rows, radius)
    took = time.perf_counter() - t
    peak = _memory_kb("VmHWM")
    print(f"{took:.2f} {(peak - base) / 1024:.1f} {len(found)}")


def _saved(hashes, name):
    """The benchmark's hashes for child processes: real.npy (whole hashes) and
    real-NAME.npy (every hash of each image) in a new temporary directory -> real.npy."""
    path = os.path.join(tempfile.mkdtemp(), "real.npy")
    np.save(path, hashes[:, 0])
    np.save(path.replace(".npy", f"-{name}.npy"), hashes)
    return path


def grouping2(radius=None):
    """The built scheme's grouping cost: n images with their whole hash only, then with
    both (2n hashes in the join), each size in its own process, the faster of 2 runs."""
    from beam_pipeline.dedup import near_duplicates

    radius = near_duplicates.DEFAULT_RADIUS if radius is None else radius
    pairs = np.array([perceptual.phash_pair(small_grey(d)) for d, *_ in
                      corpus(random.Random(SEED))], dtype=np.uint64)
    real_path = _saved(pairs, "pairs")
    print(f"grouping n images, radius {radius}, 1 hash (whole) vs 2 (whole + central 90%) "
          f"per image; 'grouping MB' is peak RSS minus RSS before grouping")
    print("       n  hashes  seconds  us/image  grouping MB  pairs found")
    per = {}
    for n in PAIR_SIZES:
        for hashes in (1, 2):
            runs = []
            for _ in range(2):
                r = subprocess.run([sys.executable, __file__, "_group2", str(n), str(radius),
                                    str(hashes), real_path], capture_output=True, text=True,
                                   check=True)
                took, grew, found = r.stdout.split()
                runs.append((float(took), float(grew), int(found)))
            took, grew, found = min(runs)
            per[n, hashes] = took / n * 1e6
            print(f" {n:7d}  {hashes:6d}  {took:7.2f}  {per[n, hashes]:8.1f}  {grew:11.1f}  "
                  f"{found:11d}")
    for n in PAIR_SIZES:
        print(f"  {n // 1000}k: 2 hashes cost {per[n, 2] - per[n, 1]:+.1f} us per image "
              f"({per[n, 2] / per[n, 1]:.2f}x)")


# --- the build's grouping as catalogs grow: the plan choose_plan picks, exact or multi-probe -----

SCALE_SIZES = (50_000, 200_000, 1_000_000)


def synthetic_extras(h, real, seed=SEED):
    """Extra hashes for each of `h` as a build has them (centre, 4 corners): the benchmark's
    own where the row is one of its images, else the row's hash with k varying bits
    flipped, k drawn from the benchmark's whole-vs-that-hash distances. Vectorised, 50,000
    rows at a time (a row's flips: the k smallest of random keys over the varying bits)."""
    rng = np.random.default_rng(seed + 2)
    whole = real[:, 0]
    p = bit_frequencies(whole)
    varying = np.flatnonzero((p > 0) & (p < 1)).astype(np.uint64)
    out = np.repeat(h[:, None], real.shape[1] - 1, 1)
    for e in range(1, real.shape[1]):
        gaps = perceptual.hamming_many(whole, real[:, e])
        for lo in range(0, len(h), 50_000):
            hi = min(len(h), lo + 50_000)
            k = rng.choice(gaps, hi - lo)
            order = np.argsort(rng.random((hi - lo, len(varying))), 1)
            chosen = order < k[:, None]  # k random varying bits per row
            masks = (chosen.astype(np.uint64) << varying[None, :]).sum(1, dtype=np.uint64)
            out[lo:hi, e - 1] ^= masks
    out[:len(real)] = real[:, 1:]
    return out


def scale_one(n, radius, real_path, thumbnails=0):
    """near_pairs on n images with six hashes each (as a build has: whole, centre, four
    corners in the descriptor's probe bytes), in a child process: seconds, grouping MB,
    pairs, planted copies found, planted, the plan, its exact radius. `thumbnails` 1: each
    row's thumbnail seeded noise, so the build makes it a seventh hash at commit
    (descriptor.thumbnail_probes, unrelated to its other hashes); 0: a flat thumbnail (no
    seventh hash), as before it."""
    from beam_pipeline.dedup import descriptor, near_duplicates

    h, planted = synthetic_hashes(n, radius, real_path)
    extras = synthetic_extras(h, np.load(real_path.replace(".npy", "-all.npy")))
    base_real = len(np.load(real_path))
    blank = bytes(descriptor.CONFIRM_SIZE)
    noise = np.random.default_rng(SEED + 3)

    def rows():  # made as the grouping reads them, 50,000 at a time (flat memory)
        for lo in range(0, n, 50_000):
            more = extras[lo:lo + 50_000].tolist()
            thumbs = (noise.integers(0, 256, (50_000, descriptor.SIDE ** 2), np.uint8)
                      if thumbnails else None)
            for k, v in enumerate(h[lo:lo + 50_000].tolist()):
                probes = b"".join(x.to_bytes(8, "big") for x in more[k][1:])
                rest = (thumbs[k].tobytes() + blank[-3:]) if thumbnails else blank
                yield near_duplicates.Row(f"{lo + k:08d}", "train", v, False, more[k][0],
                                          probes + rest)

    plans = []
    before = _memory_kb("VmRSS")
    t = time.process_time()  # CPU: the join is one thread, and the machine is shared
    keys = {(a.key, b.key) for a, b, _ in near_duplicates.find_pairs(rows(), radius,
                                                                      on_plan=plans.append)}
    took = time.process_time() - t
    grew = (_memory_kb("VmHWM") - before) / 1024
    hits = sum((f"{base_real + k:08d}", f"{n - planted + k:08d}") in keys
               for k in range(planted))
    p = plans[0]
    print(f"{took:.2f} {grew:.1f} {len(keys)} {hits} {planted} "
          f"{'x'.join(map(str, p.widths))}/{p.sub_radius} {p.exact_radius}")


def _corpus_hashes():
    """The corpus's six hashes an image (whole, central 90%, four corners) and the .npy
    file the child processes read them from."""
    from beam_pipeline.dedup import descriptor

    smalls = [small_rgb(d) for d, *_ in corpus(random.Random(SEED))]
    real = np.array([perceptual.phash_pair(s) + descriptor.probes(descriptor.describe(s))
                     for s in smalls], dtype=np.uint64)
    return real, _saved(real, "all")


def scale(radius=None):
    """Grouping time per image and memory at SCALE_SIZES with six hashes per image and the
    plan the build would choose (band_plan.choose_plan: exact within BUDGET, else
    multi-probe), the planted copies (1..radius varying bits of the whole hash flipped,
    uniformly; their other hashes unrelated) it finds, and the model to 100M."""
    from beam_pipeline.dedup import band_plan, near_duplicates

    radius = near_duplicates.DEFAULT_RADIUS if radius is None else radius
    real, real_path = _corpus_hashes()
    print(f"grouping n images with six hashes each, radius {radius}, the plan the build "
          f"chooses; one process per size, the faster of 2 runs (1M: 1 run); CPU seconds")
    print("       n   seconds  us/image  grouping MB  planted found  plan (widths/sub)  exact")
    per = []
    for n in SCALE_SIZES:
        runs = []
        for _ in range(1 if n >= 1_000_000 else 2):
            r = subprocess.run([sys.executable, __file__, "_scale", str(n), str(radius),
                                real_path], capture_output=True, text=True, check=True)
            took, grew, found, hits, planted, plan, exact = r.stdout.split()
            runs.append((float(took), float(grew), int(hits), int(planted), plan, int(exact)))
        took, grew, hits, planted, plan, exact = min(runs)
        per.append(took / n * 1e6)
        print(f" {n:7d}  {took:8.2f}  {per[-1]:8.1f}  {grew:11.1f}  {hits:6d}/{planted:<6d}  "
              f"{plan:<17}  {exact}")
    print(f"time per image {SCALE_SIZES[-1] // 1000}k vs {SCALE_SIZES[0] // 1000}k: "
          f"{per[-1] / per[0]:.2f}x (target <= 1.5x)")
    p = bit_frequencies(real.ravel())
    cells = []
    for n in (50_000, 200_000, 1_000_000, 10_000_000, 100_000_000):
        hashes = real.shape[1] * n
        stats = stats_of(hashes, p)
        plan = band_plan.choose_plan(radius, stats)
        cells.append(f"{n / 1e6:g}M images: {'x'.join(map(str, plan.widths))}/"
                     f"{plan.sub_radius}, exact {plan.exact_radius}, at {radius} bits "
                     f"{band_plan.found_share(plan, radius):.0%}, "
                     f"{band_plan.estimate(plan, stats) / n * 1e6:.0f} us")
    print("model (plan, exact radius, share found at the radius, join per image):\n  "
          + "\n  ".join(cells))


PROBE_SIZES = (50_000, 200_000)


def probe_cost(radius=None):
    """The join with the seventh hash made at commit from the thumbnail beside the join
    without it, side by side: the same synthetic rows (scale's six hashes) with seeded
    noise thumbnails or flat ones, one child process per run, alternating, the faster of 3;
    CPU seconds per image (making the seventh hash included)."""
    from beam_pipeline.dedup import near_duplicates

    radius = near_duplicates.DEFAULT_RADIUS if radius is None else radius
    real, real_path = _corpus_hashes()
    print(f"join at radius {radius}, six hashes an image against six and the thumbnail's "
          "(made at commit), the faster of 3 alternating runs, CPU us per image")
    for n in PROBE_SIZES:
        runs = {0: [], 1: []}
        for _ in range(3):
            for thumbs in (0, 1):
                r = subprocess.run([sys.executable, __file__, "_scale", str(n), str(radius),
                                    real_path, str(thumbs)], capture_output=True, text=True,
                                   check=True)
                took, grew, found, hits, planted, plan, exact = r.stdout.split()
                runs[thumbs].append((float(took) / n * 1e6, float(grew), plan))
        six, seven = min(runs[0]), min(runs[1])
        print(f"  {n:>9,} images: six {six[0]:6.1f} us ({six[2]}, {six[1]:.0f} MB), with the "
              f"seventh {seven[0]:6.1f} us ({seven[2]}, {seven[1]:.0f} MB): "
              f"{seven[0] - six[0]:+.1f} us, {seven[0] / six[0]:.2f}x")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    if what == "_group":
        grouping_one(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5],
                     float(sys.argv[6]))
    elif what == "_scale":
        scale_one(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4],
                  *map(int, sys.argv[5:6]))
    elif what == "_group2":
        grouping_two_one(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    else:
        from common import Record, printed

        args = sys.argv[2:]
        path = args.pop(args.index("--record") + 1) if "--record" in args else None
        args = [a for a in args if a != "--record"]
        record, figures = Record("bench_near_duplicates", {"mode": what, "args": args,
                                                           "record": path}), {}
        for name, fn in (("accuracy", accuracy), ("cost", cost), ("build", build),
                         ("grouping", grouping), ("grouping2", grouping2), ("scale", scale),
                         ("probe_cost", probe_cost)):
            if what in (name, "all"):
                print(f"== {name}")
                with printed() as lines:  # its modes print their tables; kept as printed
                    fn(*map(int, args))
                figures[name] = lines
        record.save(figures)
