"""PyTorch DataLoader throughput: the TensorFlow-free loaders vs an ImageFolder-style folder of the
original JPEGs vs the `tfrecord` package, on the same photographs, in one alternating run.

    python benchmarks/bench_loaders.py [--n 2000] [--rounds 2] [--workers 2] [--batch 64]

The photographs (benchmarks/photos.py) are built once with the project's CLI (one split,
--splits train=1, 4 shards, .index files). Every pipeline is a torch DataLoader with the same
worker count and batch and the same per-image work after the bytes are in memory: decode to
RGB, an Inception random-resized crop to 224 px (PIL, bilinear) and a random flip, as uint8
[224, 224, 3]. What differs is how each gets its bytes and decodes them:

  folder      a map-style Dataset of the JPEG files, opened with PIL (torchvision's ImageFolder
              default loader; torchvision itself is not installed: the PyTorch 2.13 CPU wheel
              the project pins has no matching torchvision on this machine), shuffled
  tfrecord    tfrecord.torch.MultiTFRecordDataset over the shards and their .index files,
              PIL decode (its usual use; it shards each file among the workers)
  source+pil  loaders.RecordSource(decode=False) by .index offset, shuffled, PIL decode
  source      loaders.RecordSource: simplejpeg decode (the loader's default), shuffled
  sequential  loaders.pytorch.IterableRecords: 8 MiB reads per worker, simplejpeg decode
  grain       loaders.RecordSource in grain.DataLoader (the JAX side; no torch): the same
              worker count, shuffled by its IndexSampler, grain.Batch

Each pipeline's epoch starts new workers (no persistent workers), so "first batch" includes
their start-up. Figures: images/s over the epoch, CPU per image (the loading process and its
workers: steadier than wall time on a shared machine), seconds to the first batch, the median
of --rounds, and the ratios to `folder`.
"""

import argparse
import io
import os
import random
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from common import DATA, ENV, Record, add_record_argument, build_command, files_of  # noqa: E402
from photos import photo_tree  # noqa: E402

SIZE = 224
PIPELINES = ("folder", "tfrecord", "source+pil", "source", "sequential", "grain")


def crop_flip(image, rng):
    """Inception random-resized crop (area 8-100%, aspect 3/4-4/3) to SIZE, then a flip: PIL."""
    from PIL import Image

    w, h = image.size
    for _ in range(10):
        area = w * h * rng.uniform(0.08, 1.0)
        aspect = rng.uniform(3 / 4, 4 / 3)
        cw, ch = int(round((area * aspect) ** 0.5)), int(round((area / aspect) ** 0.5))
        if 0 < cw <= w and 0 < ch <= h:
            x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
            break
    else:
        cw = ch = min(w, h)
        x, y = (w - cw) // 2, (h - ch) // 2
    out = image.resize((SIZE, SIZE), Image.BILINEAR, box=(x, y, x + cw, y + ch))
    if rng.random() < 0.5:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    import numpy as np

    return np.array(out)  # writable: torch warns on a read-only array


def from_jpeg(data, rng):
    from PIL import Image

    return crop_flip(Image.open(io.BytesIO(data)).convert("RGB"), rng)


class _Rng:
    """One random.Random per process (each DataLoader worker seeds its own)."""
    rng = random.Random(0)


class FolderDataset:
    """torchvision.datasets.ImageFolder's work: (path, class) pairs, PIL open + convert."""

    def __init__(self, root):
        classes = sorted(os.listdir(root))
        self.items = [(p, classes.index(os.path.basename(os.path.dirname(p))))
                      for p in files_of(root)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        from PIL import Image

        path, label = self.items[i]
        with open(path, "rb") as f:
            image = Image.open(f).convert("RGB")
        return crop_flip(image, _Rng.rng), label


def _tfrecord_transform(ex):
    return from_jpeg(bytes(ex["image/encoded"]), _Rng.rng), int(ex["image/class/label"][0])


def _source_pil(ex):
    return from_jpeg(ex.image, _Rng.rng), ex.label


def _source_decoded(ex):
    from PIL import Image

    return crop_flip(Image.fromarray(ex.image), _Rng.rng), ex.label


def _seed_worker(worker_id):
    _Rng.rng = random.Random(worker_id)


def loader(name, photos, vdir, shards, workers, batch):
    import torch

    from loaders import RecordSource

    common = dict(batch_size=batch, num_workers=workers, worker_init_fn=_seed_worker)
    shuffled = dict(common, shuffle=True, generator=torch.Generator().manual_seed(0))
    if name == "folder":
        return torch.utils.data.DataLoader(FolderDataset(photos), **shuffled)
    if name == "tfrecord":
        from tfrecord.torch.dataset import MultiTFRecordDataset

        names = [os.path.basename(s) for s in shards]
        ds = MultiTFRecordDataset(os.path.join(vdir, "{}"), os.path.join(vdir, "{}.index"),
                                  {n: 1.0 / len(names) for n in names},
                                  description={"image/encoded": "byte", "image/class/label": "int"},
                                  shuffle_queue_size=256, infinite=False,
                                  transform=_tfrecord_transform)
        return torch.utils.data.DataLoader(ds, **common)
    if name == "source+pil":
        return torch.utils.data.DataLoader(
            RecordSource(vdir, "train", decode=False, transform=_source_pil), **shuffled)
    if name == "source":
        return torch.utils.data.DataLoader(
            RecordSource(vdir, "train", transform=_source_decoded), **shuffled)
    if name == "grain":
        import grain.python as grain

        source = RecordSource(vdir, "train", transform=_source_decoded)
        sampler = grain.IndexSampler(len(source), grain.NoSharding(), shuffle=True,
                                     num_epochs=1, seed=0)
        return _GrainEpoch(grain.DataLoader(data_source=source, sampler=sampler,
                                            worker_count=workers,
                                            operations=[grain.Batch(batch)]))
    from loaders.pytorch import IterableRecords

    return torch.utils.data.DataLoader(
        IterableRecords(vdir, "train", transform=_source_decoded, seed=0, shuffle_buffer=256),
        **common)


class _GrainEpoch:
    """One epoch of a grain.DataLoader whose worker processes are closed (and so reaped, their
    CPU time counted) when it ends."""

    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        iterator = iter(self.loader)
        try:
            yield from iterator
        finally:
            close = getattr(iterator, "close", None) or getattr(iterator, "__del__", None)
            if close:
                close()


def _cpu():
    """CPU seconds of this process and of its finished children (the DataLoader's workers)."""
    return sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF,
               resource.RUSAGE_CHILDREN) for f in ("ru_utime", "ru_stime"))


def epoch(dl):
    """(images, seconds to the first batch, seconds for the epoch, CPU seconds). The epoch's
    end joins the workers, so their CPU time is counted: it holds on a loaded machine where
    wall time does not."""
    cpu, start = _cpu(), time.perf_counter()
    first, n = None, 0
    for images, _ in dl:
        if first is None:
            first = time.perf_counter() - start
        assert tuple(images.shape[1:]) == (SIZE, SIZE, 3)
        n += images.shape[0]
    return n, first, time.perf_counter() - start, _cpu() - cpu


def built(photos, n):
    """The photos built once by the project's CLI: ROOT's version dir and train shards."""
    root = os.path.join(DATA, f"photos-{n}-built")
    if not os.path.exists(os.path.join(root, "LATEST")):
        subprocess.run(build_command(photos, root, "--name", "photos", "--splits", "train=1",
                                     "--num_shards", "4", "--no_transform"),
                       env=ENV, check=True, stdout=subprocess.DEVNULL)
    from loaders import RecordSource

    source = RecordSource(root, "train")
    return source.info.version_dir, [s.path for s in source.info.split("train").shards]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    add_record_argument(parser)
    args = parser.parse_args()
    record = Record("bench_loaders", args)

    photos = photo_tree(args.n)
    vdir, shards = built(photos, args.n)
    n = len(files_of(photos))
    print(f"{n} photographs ({n and sum(map(os.path.getsize, files_of(photos))) / n / 1024:.0f} "
          f"KiB each), {len(shards)} shards; DataLoader workers={args.workers}, "
          f"batch={args.batch}, {SIZE} px random-resized crop + flip; load "
          f"{os.getloadavg()[0]:.2f} at start")
    results = {name: [] for name in PIPELINES}
    for _ in range(args.rounds):  # alternating: each round runs every pipeline once
        for name in PIPELINES:
            count, first, seconds, cpu = epoch(loader(name, photos, vdir, shards, args.workers,
                                                      args.batch))
            if count != n:
                print(f"  {name}: {count} images, not {n}")
            results[name].append((count / seconds, first, cpu / count * 1e3))
    med = {name: [statistics.median(r[k] for r in results[name]) for k in range(3)]
           for name in PIPELINES}
    rate0, _, cpu0 = med["folder"]
    print(f"{'pipeline':<12} {'images/s':>9} {'x folder':>9} {'CPU ms/image':>13} "
          f"{'x folder':>9} {'first batch s':>14}")
    for name in PIPELINES:
        rate, first, cpu = med[name]
        print(f"{name:<12} {rate:>9.0f} {rate / rate0:>8.2f}x {cpu:>13.2f} {cpu / cpu0:>8.2f}x "
              f"{first:>14.2f}")
    print(f"load {os.getloadavg()[0]:.2f} at the end")
    record.save({"images": n, "shards": len(shards),
                 "runs": {name: [dict(zip(("images_per_s", "first_batch_s", "cpu_ms_per_image"),
                                          r)) for r in results[name]] for name in PIPELINES},
                 "medians": {name: dict(zip(("images_per_s", "first_batch_s", "cpu_ms_per_image"),
                                            med[name])) for name in PIPELINES}})


if __name__ == "__main__":
    main()
