"""Peak memory per concurrent shard writer, on photos and on 12-megapixel images, from gs://.

    python benchmarks/bench_writer_memory.py [--photos 400] [--large 24]

Against the storage emulator (tests/gcs_emulator.py): the images are uploaded, then a fresh
process per case runs 1 or 2 WriteShardFn instances at once (threads, as one Dataflow SDK
process runs --number_of_worker_harness_threads bundles), each writing one shard of all the
images with its read-ahead (job/workers.py's budget for this machine). Printed: the peak
RSS over the RSS after imports and setup, in all and per writer, beside the budget's
read-ahead bound.
"""

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MiB = 1 << 20


def large_jpeg(seed, size=(4000, 3000)):
    """A 12-megapixel JPEG like a phone photo: smooth gradients plus sensor-like noise."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    w, h = size
    x, y = np.linspace(0, 1, w)[None, :, None], np.linspace(0, 1, h)[:, None, None]
    base = rng.random(3)[None, None, :]
    arr = 255 * (0.5 * base + 0.4 * x * y) + rng.normal(0, 6, (h, w, 3))
    buf = io.BytesIO()
    Image.fromarray(arr.clip(0, 255).astype("uint8"), "RGB").save(buf, "JPEG", quality=90)
    return buf.getvalue()


def child(listing, tmp_dir, writers):
    """Run `writers` shard writers at once over `listing` -> prints JSON figures."""
    from beam_pipeline.job import pixels, shards
    from beam_pipeline.job.contracts import ShardTask

    fns = [shards.WriteShardFn(tmp_dir, f"mem{i}", {"train": 1}, {"a": 0},
                               pixels.EncodeOptions(), True, writers_per_process=writers)
           for i in range(writers)]
    for fn in fns:
        fn.setup()
    before = _rss()
    peak, done = [before], threading.Event()

    def sample():  # ru_maxrss would include the imports' own peak, before `before`
        while not done.wait(0.005):
            peak[0] = max(peak[0], _rss())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    results = []
    threads = [threading.Thread(target=lambda fn=fn: results.extend(
        fn.process(ShardTask("train", 0, listing)))) for fn in fns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    sampler.join()
    print(json.dumps({"before": before, "peak": max(peak[0], _rss()),
                      "images": sum(r.num_examples for r in results),
                      "read_ahead": fns[0].budget.read_ahead_bytes}))


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=int, default=400)
    parser.add_argument("--large", type=int, default=24)
    parser.add_argument("--child", nargs=3)
    from benchmarks.common import Record, add_record_argument, files_of, jpeg_tree

    add_record_argument(parser)
    args = parser.parse_args()
    if args.child:
        return child(args.child[0], args.child[1], int(args.child[2]))
    record = Record("bench_writer_memory", {"photos": args.photos, "large": args.large,
                                            "record": args.record})
    from tests.gcs_emulator import run_emulator

    sets = {"photos (~500x375, ~40 KB)": [open(p, "rb").read()
                                          for p in files_of(jpeg_tree(args.photos))[:args.photos]],
            "12 MP (4000x3000)": [large_jpeg(i) for i in range(args.large)]}
    rows = []
    with tempfile.TemporaryDirectory() as work, run_emulator(work) as emulator:
        bucket = emulator.create_bucket()
        for n, (name, images) in enumerate(sets.items()):
            lines = []
            for i, data in enumerate(images):
                uri = emulator.upload_bytes(f"gs://{bucket}/in{n}/{i:05d}.jpg", data)
                blob = emulator.client.bucket(bucket).get_blob(f"in{n}/{i:05d}.jpg")
                lines.append(json.dumps([f"{i:05d}.jpg", uri, "a", "train", len(data),
                                         f"gen:{blob.generation}", None, None]))
            listing = os.path.join(work, f"listing{n}.jsonl")
            with open(listing, "w") as f:
                f.write("\n".join(lines) + "\n")
            mean = sum(map(len, images)) / len(images)
            for writers in (1, 2):
                tmp_dir = f"gs://{bucket}/out{n}-{writers}/versions/V/.tmp"
                out = subprocess.run([sys.executable, __file__, "--child", listing, tmp_dir,
                                      str(writers)], check=True, capture_output=True,
                                     env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
                fig = json.loads(out.stdout.decode().strip().splitlines()[-1])
                grown = (fig["peak"] - fig["before"]) / MiB
                rows.append((name, mean / MiB, writers, grown, grown / writers,
                             fig["read_ahead"] / MiB))
    load = os.getloadavg()
    print(f"one shard writer process per case, storage emulator; load {load[0]:.1f}")
    print(f"{'images':<28} {'MiB/img':>7} {'writers':>7} {'peak+ MiB':>9} "
          f"{'per writer':>10} {'read-ahead bound':>16}")
    for name, mean, writers, grown, per, bound in rows:
        print(f"{name:<28} {mean:7.2f} {writers:7d} {grown:9.0f} {per:10.0f} {bound:16.0f}")
    names = ("images", "mib_per_image", "writers", "peak_grown_mib", "per_writer_mib",
             "read_ahead_bound_mib")
    print(f"record: {record.save({'rows': [dict(zip(names, row)) for row in rows]})}")


if __name__ == "__main__":
    main()
