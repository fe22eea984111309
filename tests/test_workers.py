"""The shard writers' budget per machine (job/workers.py): pure, no Beam."""

import yaml

from beam_pipeline.job import workers
from beam_pipeline.job.inputs import READ_AHEAD
from beam_pipeline.launcher import options
from tests.helpers import REPO

GiB, MiB = 1 << 30, 1 << 20


def test_read_ahead_is_a_quarter_of_a_writers_memory_share_within_bounds():
    # n2-standard-4 (16 GiB, 4 vCPU), 2 writers per SDK process: 2 GiB each -> the 256 MiB cap
    assert workers.budget(16 * GiB, 4, 2, READ_AHEAD) == workers.Budget(256 * MiB, 34)
    # n2-highcpu-8 (8 GiB, 8 vCPU): 512 MiB each -> 128 MiB; 4 writers (unknown) -> 64 MiB
    assert workers.budget(8 * GiB, 8, 2, READ_AHEAD).read_ahead_bytes == 128 * MiB
    assert workers.budget(8 * GiB, 8, None, READ_AHEAD).read_ahead_bytes == 64 * MiB
    assert workers.budget(1 * GiB, 8, 12, READ_AHEAD).read_ahead_bytes == 32 * MiB  # the floor


def test_the_connection_pool_holds_every_read_thread_and_upload_of_a_process():
    for writers in (1, 2, 12):
        pool = workers.budget(16 * GiB, 4, writers, READ_AHEAD).connections
        assert pool == writers * (READ_AHEAD + 1)


def test_configs_dataflow_yaml_sets_the_writers_per_process_as_a_beam_option(tmp_path):
    settings = yaml.safe_load((REPO / "configs" / "dataflow.yaml").read_text())
    assert settings["number_of_worker_harness_threads"] == 2
    pipeline_options, _ = options.parse(["--config", str(REPO / "configs" / "dataflow.yaml"),
                                         "--input", str(tmp_path), "--output",
                                         str(tmp_path / "out")])
    assert pipeline_options.get_all_options()["number_of_worker_harness_threads"] == 2
