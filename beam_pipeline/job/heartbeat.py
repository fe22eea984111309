"""The job keeps ROOT/.lock alive while its workers run (store/lock.py, `keep_alive`).

A pass-through step fused with the shard writers: its setup runs in every worker process
that writes shards and starts that process's lock heartbeat. When the job fails or is
cancelled its workers go, the beats stop, and the lock expires JOB_TTL later.
"""

import apache_beam as beam

from beam_pipeline.store import lock


class KeepLockAlive(beam.DoFn):
    """Elements pass unchanged; setup starts this process's beat of the job's lock."""

    def __init__(self, root, version):
        self.root, self.version = root, version

    def setup(self):
        lock.keep_alive(self.root, self.version)

    def process(self, element):
        yield element
