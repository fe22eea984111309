"""The local engine a build runs on: chosen by the job's size unless a worker count pins it."""

import types

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions

from beam_pipeline.launcher import runner


def _build(validate="decode", transform=False):
    return types.SimpleNamespace(validate=validate, transform=transform)


def test_threads_give_way_to_processes_from_the_measured_sizes():
    for validate, start in (("decode", 15_000), ("header", 6_000)):
        build = _build(validate)
        assert runner.local_engine("multi_threading", start - 1, build) == "multi_threading"
        assert runner.local_engine("multi_threading", start, build) == "multi_processing"


def test_small_jobs_skip_worker_processes_and_transform_keeps_threads():
    assert runner.local_engine("multi_processing", runner.SMALL_JOB - 1) == "in_memory"
    assert runner.local_engine("multi_processing", runner.SMALL_JOB) == "multi_processing"
    assert runner.local_engine("multi_threading", 10**6, _build(transform=True)) == \
        "multi_threading"
    assert runner.local_engine("in_memory", 10**6) == "in_memory"


def _chosen(*flags, to_convert, build=None):
    """configs/local.yaml's one worker per core (0) unless the flags give a count."""
    options = PipelineOptions(["--direct_num_workers", "0", *flags])
    name, waits = runner.choose(options, to_convert, build or _build())
    direct = options.view_as(DirectOptions)
    return name, waits, direct.direct_running_mode, direct.direct_num_workers


def test_choose_sets_the_engine_only_for_a_per_core_worker_count():
    assert _chosen("--direct_running_mode", "multi_threading", to_convert=20_000) == \
        ("FnApiRunner", True, "multi_processing", 0)
    assert _chosen("--direct_running_mode", "multi_processing", to_convert=100) == \
        ("FnApiRunner", True, "in_memory", 1)
    # An explicit worker count pins the engine the user named.
    assert _chosen("--direct_running_mode", "multi_threading", "--direct_num_workers", "2",
                   to_convert=20_000) == ("FnApiRunner", True, "multi_threading", 2)
    # Other runners are left alone.
    assert _chosen("--runner", "DataflowRunner", "--direct_running_mode", "multi_threading",
                   to_convert=20_000)[2] == "multi_threading"
