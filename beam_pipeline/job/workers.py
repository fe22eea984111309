"""How much each shard writer on a worker may hold: read-ahead bytes and connections, from
the machine and the writers it runs at once.

On Dataflow (Runner v2) each VM runs one SDK process per vCPU, and each process runs
`--number_of_worker_harness_threads` bundles at once: that many WriteShardFn instances,
each with READ_AHEAD read threads on the process's one storage client. Left to Dataflow,
the thread count is the service's choice; with a dozen writers per process the 16-thread
read-ahead of each shares a 64-connection pool, and urllib3 discards connections (TLS
churn, log noise). configs/dataflow.yaml sets 2 writers per process: shard writing is
CPU-bound (one vCPU per process), so a second writer only overlaps one shard's reads and
upload with another's conversion.
"""

import dataclasses
import os

MIN_READ_AHEAD_BYTES = 32 << 20
MAX_READ_AHEAD_BYTES = 256 << 20
MEMORY_SHARE = 4   # a writer's read-ahead may take a quarter of its share of the memory


@dataclasses.dataclass(frozen=True)
class Budget:
    """Per shard writer: listed bytes read ahead; per process: storage connections."""

    read_ahead_bytes: int
    connections: int


def budget(memory_bytes, cpus, writers_per_process, read_threads):
    """The budget of a writer on a machine with `memory_bytes` and `cpus` (one SDK process
    each), `writers_per_process` writers at once per process (None: unknown, taken as 4),
    `read_threads` read-ahead threads per writer."""
    writers = writers_per_process or 4
    share = memory_bytes // max(1, cpus * writers)
    read_ahead = min(MAX_READ_AHEAD_BYTES, max(MIN_READ_AHEAD_BYTES, share // MEMORY_SHARE))
    return Budget(read_ahead, writers * (read_threads + 1))  # + its upload


def this_machine(writers_per_process, read_threads):
    """budget() for the machine this runs on (a Dataflow worker VM, or a laptop)."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return budget(memory, os.cpu_count() or 1, writers_per_process, read_threads)
