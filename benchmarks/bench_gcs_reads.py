"""Image reads per second from gs:// against the storage emulator: Beam's FileSystems (a new
GcsIO, storage client and HTTP session per open, plus a metadata request before each
download) versus the worker's one client (store/gcs.py: one GET per object).

    python benchmarks/bench_gcs_reads.py [--objects 400] [--size_kb 40] [--threads 16]

Both read the same objects with the shard writer's read-ahead width (16 threads), three
rounds each, alternating; the median round is printed. The emulator is a single Python
process on loopback, so absolute rates are far below GCS's; the ratio is the point: it
counts the requests and connection set-ups per read that a worker saves. On GCS each
saved request is a round trip (tens of ms) and each saved connection a TLS handshake.
"""

import argparse
import concurrent.futures
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Record, add_record_argument  # noqa: E402


def beam_read(uri):
    """What job/shards.py did before: FileSystems.open per image."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.open(uri, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        return f.read()


def client_read(uri):
    from beam_pipeline.store import gcs

    return gcs.read_bytes(uri)


def rate(read, uris, threads):
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        total = sum(len(b) for b in pool.map(read, uris))
    seconds = time.perf_counter() - start
    return len(uris) / seconds, total


def count_requests(proxy_less_endpoint, read, uris):
    """HTTP requests per read, counted on the client side (urllib3 connection pool)."""
    import urllib3.connectionpool as cp

    calls, opened = [0], [0]
    urlopen, new_conn = cp.HTTPConnectionPool.urlopen, cp.HTTPConnectionPool._new_conn

    def counting_urlopen(self, *a, **k):
        calls[0] += 1
        return urlopen(self, *a, **k)

    def counting_new_conn(self):
        opened[0] += 1
        return new_conn(self)

    cp.HTTPConnectionPool.urlopen, cp.HTTPConnectionPool._new_conn = (counting_urlopen,
                                                                      counting_new_conn)
    try:
        for uri in uris:
            read(uri)
    finally:
        cp.HTTPConnectionPool.urlopen, cp.HTTPConnectionPool._new_conn = urlopen, new_conn
    return calls[0] / len(uris), opened[0] / len(uris)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=400)
    parser.add_argument("--size_kb", type=int, default=40)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    add_record_argument(parser)
    args = parser.parse_args()
    record = Record("bench_gcs_reads", args)
    from tests.gcs_emulator import run_emulator

    with tempfile.TemporaryDirectory() as work, run_emulator(work) as emulator:
        bucket = emulator.create_bucket()
        rng = random.Random(5)  # seeded payloads
        uris = [emulator.upload_bytes(f"gs://{bucket}/img/{i:06d}.jpg",
                                      rng.randbytes(args.size_kb * 1024))
                for i in range(args.objects)]
        assert beam_read(uris[0]) == client_read(uris[0])
        rates = {"beam FileSystems": [], "one client": []}
        for _ in range(args.rounds):
            for name, read in (("beam FileSystems", beam_read), ("one client", client_read)):
                rates[name].append(rate(read, uris, args.threads)[0])
        per_read = {name: count_requests(emulator.endpoint, read, uris[:50])
                    for name, read in (("beam FileSystems", beam_read),
                                       ("one client", client_read))}
    print(f"{args.objects} objects of {args.size_kb} KiB, {args.threads} threads, "
          f"{args.rounds} rounds (median), storage emulator on loopback")
    for name, values in rates.items():
        requests, connections = per_read[name]
        print(f"  {name:17s} {statistics.median(values):7.0f} reads/s  "
              f"(rounds: {', '.join(f'{v:.0f}' for v in values)}); "
              f"{requests:.2f} HTTP requests and {connections:.2f} new connections per read")
    ratio = statistics.median(rates["one client"]) / statistics.median(rates["beam FileSystems"])
    print(f"  one client / FileSystems: {ratio:.2f}x")
    record.save({"reads_per_s": rates, "requests_and_connections_per_read": per_read,
                 "one_client_vs_filesystems": ratio})


if __name__ == "__main__":
    main()
