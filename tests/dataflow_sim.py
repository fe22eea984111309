"""Dataflow's service, played offline: the only thing the retry tests stand in for.

Dataflow runs a job's DoFns on its workers, retries a failed work item (a bundle) up to
four times, may run a straggler's work item a second time (a "zombie" attempt that keeps
running beside the one it commits), and commits one attempt's output. Here a test decides
which attempts run, when, and which one's output is committed. Everything else is the real
code: the launcher's plan (listing, shard listings, claimed version), the shard writer
`WriteShardFn` (the DoFn as Dataflow calls it: setup, process), `commit.commit` and the
store, against the GCS emulator (usually through tests/faults.py's proxy).
"""

import dataclasses

from beam_pipeline.job import commit, pipeline
from beam_pipeline.job.shards import WriteShardFn
from beam_pipeline.launcher import options, prepare, runner
from beam_pipeline.store import lock


@dataclasses.dataclass
class Job:
    """A planned version and what a Dataflow worker would be given to write it."""

    encode_options: object
    planned: object
    tasks: list

    @property
    def spec(self):
        return self.planned.spec

    def writer(self):
        """A fresh DoFn instance, set up as a worker sets it up (one per attempt)."""
        spec = self.spec
        fn = WriteShardFn(spec.tmp_dir, spec.name, spec.num_shards,
                          {label: i for i, label in enumerate(spec.labels)},
                          self.encode_options, spec.write_index,
                          previous_vdir=spec.previous_vdir, phash=spec.dedup.near_duplicates,
                          previous_build=spec.previous_build)
        fn.setup()
        return fn

    def attempt(self, task):
        """One attempt of one work item (a shard) -> its ShardResult, or what it raises."""
        fn = self.writer()
        try:
            (result,) = fn.process(task)
            return result
        finally:
            fn.teardown()

    def attempt_elsewhere(self, task, env, gate=None):
        """The same attempt on another worker: a separate process with environment `env`
        (e.g. STORAGE_EMULATOR_HOST through another proxy) -> a Popen whose stdout will be
        the ShardResult's JSON (`finish`). With `gate` (a directory), the process imports
        and sets its DoFn up, says so (gate/ready), and starts the attempt only when
        `release(proc, gate)` says go: Beam's import takes seconds, the attempt a fraction."""
        import os
        import pickle
        import subprocess
        import sys
        import tempfile

        from tests.helpers import REPO

        if gate:
            gate.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("wb", suffix=".pickle", delete=False) as f:
            pickle.dump((self, task, gate and str(gate)), f)
        code = "import sys, tests.dataflow_sim as sim; sim._attempt_here(sys.argv[1])"
        return subprocess.Popen([sys.executable, "-c", code, f.name], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=REPO,
                                env=dict(os.environ, PYTHONPATH=str(REPO), **env))

    def commit(self, results):
        """The commit stage, given the committed attempt of each shard."""
        return commit.commit(results, self.spec)


@lock.release_on_exit
def plan(argv):
    """The launcher's half of a Dataflow launch: the root's lock taken, the version planned,
    the lock handed to the job (whose commit releases it) -> Job."""
    pipeline_options, build = options.parse([str(a) for a in argv])
    root = build.output.rstrip("/")
    lock.acquire(root)
    planned = prepare.prepare(build, root)
    assert isinstance(planned, prepare.Planned), planned
    lock.hand_off(root, planned.spec.version, max_seconds=runner._max_seconds(pipeline_options))
    return Job(build.encode_options(), planned,
               list(pipeline.read_shard_index(planned.shards_index)))


def _attempt_here(pickled):
    """attempt_elsewhere's process: unpickle, set up, wait at the gate, attempt, print."""
    import os
    import pickle
    import time

    job, task, gate = pickle.load(open(pickled, "rb"))
    fn = job.writer()
    if gate:
        open(os.path.join(gate, "ready"), "w").close()
        deadline = time.monotonic() + 300
        while not os.path.exists(os.path.join(gate, "go")):
            if time.monotonic() > deadline:
                raise SystemExit("never released at the gate")
            time.sleep(0.001)
    try:
        (result,) = fn.process(task)
    finally:
        fn.teardown()
    print(result.to_json())


def release(proc, gate, timeout=120):
    """Wait until attempt_elsewhere's process is ready at `gate`, then let it go."""
    import time

    deadline = time.monotonic() + timeout
    while not (gate / "ready").exists():
        if proc.poll() is not None:
            raise AssertionError(f"the other attempt died before its start: "
                                 f"{proc.stderr.read().decode()[-3000:]}")
        assert time.monotonic() < deadline, "the other attempt never got ready"
        time.sleep(0.01)
    (gate / "go").touch()


def finish(proc, timeout=300):
    """A Popen from Job.attempt_elsewhere -> its ShardResult (AssertionError on failure)."""
    from beam_pipeline.job.contracts import ShardResult

    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err.decode()[-3000:]
    return ShardResult.from_json(out.decode().strip().splitlines()[-1])
