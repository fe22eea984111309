"""What a gs:// build is billed for: requests by kind and bytes moved, counted by a proxy in
front of the storage emulator (tests/gcs_counting.py), on photographs (benchmarks/photos.py).

    python benchmarks/bench_gcs_cost.py [--photos 300] [--code DIR]...

Each checkout named by --code (default: this one) runs the same nights, in a fresh bucket,
with the default command (in-process runner: every request of launcher, job and commit
goes through the proxy):

1. full build of N photographs from a gs:// folder;
2. the same folder again (unchanged night);
3. +1% night: new photographs, each padded (a JPEG comment) to the size of a stored one,
   so size alone cannot tell them apart; the bytes it adds under the root (every version,
   as billed) against the dataset's shard bytes; the previous catalog's bytes its reuse
   and copy tasks download (each reads its shard's rows), against the catalog's size;
4. every file renamed (copied under new names): same bytes, new keys: the build re-frames
   every stored record;
5. a CSV manifest of gs:// uris: built once, then again unchanged.

It prints, per checkout, the issue's measures beside their targets. The emulator is one
Python process on loopback: compare counts and bytes, not seconds.
"""

import argparse
import csv
import io
import os
import subprocess
import sys
import tempfile
import time
from urllib.parse import unquote

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)
from common import Record, add_record_argument  # noqa: E402


def photos(n, first=0):
    import photos as ph

    ph._load_sources()
    return [ph.photo_jpeg(seed) for seed in range(first, first + n)]


def padded_to(jpeg, size):
    """`jpeg` with a comment segment after SOI making it exactly `size` bytes."""
    n = size - len(jpeg) - 4
    assert 0 <= n <= 65000, (len(jpeg), size)  # one comment segment holds < 64 KiB
    return jpeg[:2] + b"\xff\xfe" + (n + 2).to_bytes(2, "big") + b"\0" * n + jpeg[2:]


def run_build(code, inputs, root, counter, *extra):
    """One CLI run (a subprocess with `code` first on its path) -> (counts, seconds)."""
    env = dict(os.environ, PYTHONPATH=code, TF_CPP_MIN_LOG_LEVEL="2")
    cmd = [sys.executable, "-m", "beam_pipeline", "--output", root, "--name", "pets", *extra]
    for uri in inputs:
        cmd += ["--input", uri]
    counter.reset()
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=code, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"build failed ({done.returncode}): {' '.join(cmd)}\n"
                         f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return counter.totals(), list(counter.log), seconds


def latest_manifest(emulator, root):
    version = emulator.read_json(f"{root}/LATEST")["version"]
    return emulator.read_json(f"{root}/versions/{version}/manifest.json")


def shard_bytes(manifest):
    return sum(s["num_bytes"] for split in manifest["splits"].values() for s in split["shards"])


def stored_bytes(emulator, root):
    """Bytes of every object under the dataset root (all versions: what is billed)."""
    return sum(emulator.list(f"{root}/").values())


def shards_of(manifest):
    return sum(len(split["shards"]) for split in manifest["splits"].values())


def media(log, inside):
    """(GETs, bytes) of media downloads whose path holds `inside`."""
    hits = [down for kind, _, target, down in log
            if kind == "media_get" and inside in unquote(target)
            and ".catalog.parquet" not in target and not unquote(target).split("?")[0]
            .endswith(".index")]
    return len(hits), sum(hits)


GETS = ("media_get", "metadata_get", "bucket_get", "list")


def gets_by_what(log, inputs):
    """GET-class requests (reads, metadata, bucket, listings) of one run -> (of inputs under
    `inputs`, of one shard's objects: its listing, temp shard, fragment, index; the
    launcher's progress display reading the writers' progress files, every 5 s while they
    run; of the run as a whole: lock, LATEST, manifests, listings, bucket metadata)."""
    of_inputs = of_shards = of_progress = of_run = 0
    for kind, _, target, _ in log:
        if kind not in GETS:
            continue
        path = unquote(target).split("?")[0]
        if inputs in path and kind != "list":
            of_inputs += 1
        elif kind != "list" and "/.tmp/progress/" in path:
            of_progress += 1
        elif kind != "list" and ("/.tmp/listing/" in path or ".tfrecord-" in path):
            of_shards += 1
        else:
            of_run += 1
    return of_inputs, of_shards, of_progress, of_run


def catalog_reads(log):
    """Requests that read a catalog fragment (media or metadata GETs)."""
    return sum(1 for kind, _, target, _ in log
               if kind in ("media_get", "metadata_get") and ".catalog.parquet" in unquote(target))


def nights(emulator, counter, code, n, shards):
    """The five nights on a fresh bucket -> {measure: figure}."""
    bucket = emulator.create_bucket()
    base, root = f"gs://{bucket}/in", f"gs://{bucket}/ds"
    data = photos(n)
    for i, jpeg in enumerate(data):
        emulator.upload_bytes(f"{base}/class{i % 5}/{i:05d}.jpg", jpeg)
    opts = ("--num_shards", str(shards))
    figures = {}

    totals, log, sec = run_build(code, [base], root, counter, *opts)
    m = latest_manifest(emulator, root)
    converted = m["build"]["converted"]
    gets, _ = media(log, "/in/")
    _, shard_gets, progress_gets, run_gets = gets_by_what(log, "/in/")
    figures["full build"] = dict(
        images=converted, shards=shards_of(m), seconds=sec, requests=totals["requests"],
        input_gets_per_image=gets / converted,
        requests_per_image=totals["requests"] / converted,
        gets_per_shard=shard_gets / shards_of(m), progress_gets=progress_gets,
        gets_per_run=run_gets,
        bucket_gets=totals.get("bucket_get", 0), uploads=totals.get("upload", 0),
        catalog_reads_per_shard=catalog_reads(log) / shards_of(m), totals=totals)

    totals, log, sec = run_build(code, [base], root, counter, *opts)
    figures["unchanged"] = dict(seconds=sec, requests=totals["requests"], lists=totals.get("list", 0),
                                beyond_listing=totals["requests"] - totals.get("list", 0),
                                totals=totals)

    sizes = sorted(len(d) for d in data)
    new = [padded_to(j, next(s for s in sizes if s >= len(j) + 4))
           for j in photos(max(1, n // 100), n) if len(j) + 4 <= sizes[-1]]
    for i, jpeg in enumerate(new):
        emulator.upload_bytes(f"{base}/class{i % 5}/new{i:05d}.jpg", jpeg)
    stored, previous = stored_bytes(emulator, root), latest_manifest(emulator, root)["version"]
    totals, log, sec = run_build(code, [base], root, counter, *opts)
    m = latest_manifest(emulator, root)
    gets, _ = media(log, "/in/")
    added = stored_bytes(emulator, root) - stored
    catalog_size = emulator.list(f"{root}/versions/{previous}/catalog.parquet")
    previous_catalog = [down for kind, _, target, down in log if kind == "media_get"
                        and f"/versions/{previous}/catalog.parquet" in unquote(target)]
    figures["+1% night"] = dict(new=len(new), seconds=sec, requests=totals["requests"],
                                launcher_input_downloads=gets - m["build"]["converted"],
                                stored_added=added, storage_share=added / shard_bytes(m),
                                previous_catalog_gets=len(previous_catalog),
                                previous_catalog_share=sum(previous_catalog)
                                / sum(catalog_size.values()),
                                copies=sum(1 for kind, _, target, _ in log if kind == "copy"
                                           and f"/versions/{previous}/" in unquote(target)),
                                totals=totals)

    for i, jpeg in enumerate(data + new):
        name = f"class{i % 5}/{i:05d}.jpg" if i < n else f"class{(i - n) % 5}/new{i - n:05d}.jpg"
        emulator.upload_bytes(f"gs://{bucket}/renamed/{name.replace('/', '/r-')}", jpeg)
    before = latest_manifest(emulator, root)
    totals, log, sec = run_build(code, [f"gs://{bucket}/renamed"], root, counter, *opts)
    m = latest_manifest(emulator, root)
    in_gets, _ = media(log, "/renamed/")
    shard_gets, shard_down = media(log, ".tfrecord")  # the shards' frames, not fragments
    record_bytes = shard_bytes(before)
    figures["renamed"] = dict(
        images=m["accounting"]["written"], reframed=m["build"]["reframed"], seconds=sec,
        requests=totals["requests"], launcher_input_downloads=in_gets - m["build"]["converted"],
        stored_gets=shard_gets, stored_bytes=shard_down, record_bytes=record_bytes,
        bytes_ratio=shard_down / record_bytes,
        catalog_reads_per_shard=catalog_reads(log) / shards_of(m), totals=totals)

    rows = io.StringIO()
    writer = csv.writer(rows)
    writer.writerow(["uri", "label"])
    for i in range(n):
        writer.writerow([f"{base}/class{i % 5}/{i:05d}.jpg", f"class{i % 5}"])
    manifest_uri = emulator.upload_bytes(f"gs://{bucket}/lists/all.csv", rows.getvalue().encode())
    mroot = f"gs://{bucket}/ds-manifest"
    run_build(code, [manifest_uri], mroot, counter, *opts)
    totals, log, sec = run_build(code, [manifest_uri], mroot, counter, *opts)
    figures["manifest unchanged"] = dict(
        rows=n, seconds=sec, requests=totals["requests"],
        per_row=(totals["requests"] - totals.get("list", 0)) / n, totals=totals)
    return figures


TARGETS = (
    ("re-framing: bytes downloaded / records' bytes", "renamed", "bytes_ratio", "<= 1.1"),
    ("re-framing: stored-record GETs", "renamed", "stored_gets", "~ records, fewer when adjacent"),
    ("launcher input downloads, renamed night", "renamed", "launcher_input_downloads", "0"),
    ("+1% night: storage added / dataset's shard bytes", "+1% night", "storage_share",
     "~ 0.01"),
    ("+1% night: server-side copies of the previous version's objects", "+1% night",
     "copies", "0"),
    ("+1% night: previous catalog GETs (launcher's reads, reuse/copy tasks' rows)",
     "+1% night", "previous_catalog_gets", "a few + 1 per task"),
    ("+1% night: previous catalog bytes downloaded / its size", "+1% night",
     "previous_catalog_share", "launcher's reads + ~1 for the tasks"),
    ("launcher input downloads, +1% night (same sizes)", "+1% night",
     "launcher_input_downloads", "0"),
    ("input GETs per converted image", "full build", "input_gets_per_image", "<= 1.1"),
    ("all requests per converted image", "full build", "requests_per_image",
     "1.1 + O(1)/shard"),
    ("GETs per shard: its listing, fragment", "full build", "gets_per_shard", "O(1)"),
    ("GETs of the progress display (every 5 s)", "full build", "progress_gets", "-"),
    ("GETs per build: lock, LATEST, manifests, listings", "full build", "gets_per_run",
     "O(1)"),
    ("bucket metadata GETs, full build", "full build", "bucket_gets", "one per process"),
    ("upload requests, full build", "full build", "uploads", "~1 per object written"),
    ("unchanged night: requests beyond listing", "unchanged", "beyond_listing", "0 per image"),
    ("manifest, unchanged night: requests per row", "manifest unchanged", "per_row", "0"),
    ("commit: fragment reads per shard, full build", "full build", "catalog_reads_per_shard",
     "1-2 (x2 requests)"),
    ("commit: fragment reads per shard, renamed night", "renamed", "catalog_reads_per_shard",
     "1-2 (x2 requests)"),
)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=int, default=300)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--code", action="append", help="checkouts to compare (default: this)")
    add_record_argument(parser)
    args = parser.parse_args()
    record = Record("bench_gcs_cost", args)
    codes = args.code or [REPO]
    from tests.gcs_counting import counting
    from tests.gcs_emulator import run_emulator

    results = {}
    with tempfile.TemporaryDirectory() as work, run_emulator(work) as emulator, \
            counting(emulator) as counter:
        for code in codes:
            results[code] = nights(emulator, counter, os.path.abspath(code), args.photos,
                                   args.shards)
    print(f"{args.photos} photographs, {args.shards} shards per build, storage emulator behind "
          f"a counting proxy; load: {os.getloadavg()[0]:.1f}")
    names = [os.path.basename(os.path.abspath(c)) for c in codes]
    print("| measure | " + " | ".join(names) + " | target |")
    print("|---|" + "---|" * len(names) + "---|")
    for title, night, key, target in TARGETS:
        cells = [_fmt(results[c][night][key]) for c in codes]
        print(f"| {title} | " + " | ".join(cells) + f" | {target} |")
    for code in codes:
        print(f"\n{code}:")
        for night, figures in results[code].items():
            shown = {k: _fmt(v) for k, v in figures.items() if k != "totals"}
            print(f"  {night}: {shown}\n    requests by kind: {figures['totals']}")
    record.save(results)


def _fmt(value):
    if isinstance(value, float):
        return f"{value:.3g}" if value < 100 else f"{value:,.0f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


if __name__ == "__main__":
    main()
