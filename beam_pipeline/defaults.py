"""Defaults that several rooms share, each defined once.

A leaf: it imports nothing, so `launcher/flags.py` (whose `--help` loads no Beam), the job's
contracts, dedup and the store read the same value without importing one another.
"""

# Hamming bits between two images' perceptual hashes for a near-duplicate candidate;
# chosen by measurement (benchmarks/bench_near_duplicates.py, docs/measurements.md).
NEAR_DUPLICATE_RADIUS = 8

# --keep_superseded_hours: a version superseded less than this ago is kept, covering a
# nightly schedule twice (a reader that resolved LATEST just before the next build).
KEEP_SUPERSEDED_HOURS = 48.0
