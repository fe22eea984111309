"""The reader under real multi-worker training: 2-3 TensorFlow worker processes on loopback
(TF_CONFIG with 127.0.0.1 ports, MultiWorkerMirroredStrategy; tests/reader_worker.py), no
mocks. Each image's colour encodes its record id, so the test sees which records every step
of every worker trained on.

What they pin down (the guarantees docs/reader.md states):
* every path (Model.fit, experimental_distribute_dataset, distribute_datasets_from_function)
  reads each record at most once an epoch across hosts, and all of them but each host's
  last partial batch: hosts read disjoint, balanced ranges (at most one record apart) and
  training takes the common minimum;
* every worker runs the same number of steps, every training batch full (static shapes);
* evaluation reads every record exactly once.
"""

import json
import os
import socket
import subprocess
import sys

import pytest

from tests.helpers import REPO
from tests.test_reader import write_dataset

pytestmark = pytest.mark.slow

VERSION = "20261201T101500Z"
WORKER = os.path.join(REPO, "tests", "reader_worker.py")
TIMEOUT = 240  # seconds for the whole group; a hang fails the test instead of the suite


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def run_workers(root, workers, paths, batch):
    """Start `workers` processes, wait for all; returns each one's RESULT dict."""
    cluster = {"worker": [f"127.0.0.1:{p}" for p in _free_ports(workers)]}
    procs = []
    for i in range(workers):
        env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2",
                   TF_CONFIG=json.dumps({"cluster": cluster,
                                         "task": {"type": "worker", "index": i}}))
        procs.append(subprocess.Popen(
            [sys.executable, WORKER, str(root), VERSION, ",".join(paths), str(batch)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=TIMEOUT)
            assert p.returncode == 0, err[-4000:]
            [line] = [x for x in out.splitlines() if x.startswith("RESULT ")]
            results.append(json.loads(line[len("RESULT "):]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


def check_training(results, path, n, step_size, expected_steps):
    """Same step count everywhere, full batches, no record twice, the expected total."""
    steps = [r[path] for r in results]
    assert [len(s) for s in steps] == [expected_steps] * len(steps), (path, steps)
    assert all(len(batch) == step_size for s in steps for batch in s), (path, steps)
    ids = [i for s in steps for batch in s for i in batch]
    assert len(ids) == len(set(ids)), f"{path}: a record read twice: {sorted(ids)}"
    assert set(ids) <= set(range(n))
    return ids


def test_two_workers_every_path(tmp_path):
    # 30 records in 5 shards; global batch 4 over 2 workers (one replica each).
    n, batch = 30, 4
    write_dataset(tmp_path, VERSION, (("train", n, 5), ("validation", 9, 2)))
    results = run_workers(tmp_path, 2, ["fit", "distribute", "from_function", "eval"], batch)
    assert [r["workers"] for r in results] == [2, 2]
    # A host reads 15 records; without an input context its batches are global (4), which
    # tf.distribute splits over both workers: 3 host batches = 6 steps of 2 per worker.
    for path in ("fit", "distribute"):
        ids = check_training(results, path, n, 2, 6)
        assert len(ids) == 24  # each host's last partial global batch (3 records) left out
    # With an input context, batches are per replica: 15 records -> 7 steps of 2.
    assert len(check_training(results, "from_function", n, 2, 7)) == 28
    # Evaluation: 4 and 5 records; every record once, the shorter host pads with an empty
    # batch (tf.distribute's partial-batch handling) so both run 3 steps.
    evals = [r["eval"] for r in results]
    assert [len(s) for s in evals] == [3, 3]
    ids = [i for s in evals for batch in s for i in batch]
    assert sorted(ids) == list(range(9))


def test_three_workers_uneven_split(tmp_path):
    # 31 records over 3 hosts: ranges of 10, 10 and 11; training takes 10 everywhere.
    n, batch = 31, 3
    write_dataset(tmp_path, VERSION, (("train", n, 2), ("validation", 7, 1)))
    results = run_workers(tmp_path, 3, ["distribute", "from_function", "eval"], batch)
    # global batch 3 = 1 per worker: 10 records -> 3 host batches -> 9 steps of 1
    assert len(check_training(results, "distribute", n, 1, 9)) == 27
    assert len(check_training(results, "from_function", n, 1, 10)) == 30
    evals = [r["eval"] for r in results]
    ids = [i for s in evals for batch in s for i in batch]
    assert sorted(ids) == list(range(7))  # 2 + 2 + 3, one file cut among three hosts
