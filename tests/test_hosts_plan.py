"""readers/hosts.py in pure Python: which records each host reads, each host's seed, and how
a host finds its place. No TensorFlow pipeline runs here; tests/test_reader.py checks that
make_dataset reads what the plan says, tests/test_reader_multihost.py the real workers."""

import itertools
import json

import pytest

from dataset_format.dataset_info import ShardInfo, SplitInfo
from readers import hosts


def split_of(sizes, name="train"):
    shards = tuple(ShardInfo(f"/ds/{name}-{i:05d}", n, num_bytes=100 * n + 1)
                   for i, n in enumerate(sizes))
    return SplitInfo(name, sum(sizes), None, {}, shards)


def records_of(plan, sizes):
    """The split positions (manifest order) a plan's pieces cover, in order."""
    starts = dict(zip((f"/ds/train-{i:05d}" for i in range(len(sizes))),
                      itertools.accumulate([0, *sizes])))
    return [starts[p.path] + p.start + k for p in plan.pieces for k in range(p.count)]


LAYOUTS = [(30,), (8, 7, 8, 7), (5, 4), (1, 1, 1), (0, 9, 0, 3), (13, 0, 2, 17, 1)]
# (file sizes, hosts): every layout with 1-7 hosts, as long as each host gets a record
CASES = [(sizes, count) for sizes in LAYOUTS for count in (1, 2, 3, 4, 7) if count <= sum(sizes)]


@pytest.mark.parametrize("sizes,count", CASES, ids=str)
def test_hosts_cover_every_record_exactly_once_in_contiguous_near_equal_ranges(sizes, count):
    total = sum(sizes)
    plans = [hosts.plan(split_of(sizes), hosts.Hosts(count, i, "input_context"), False)
             for i in range(count)]
    ranges = [records_of(p, sizes) for p in plans]
    assert [r for rng in ranges for r in rng] == list(range(total))  # once each, in order
    lengths = [p.records for p in plans]
    assert lengths == [len(r) for r in ranges] and max(lengths) - min(lengths) <= 1
    assert all(p.per_epoch == p.records and p.split_records == total for p in plans)
    for p in plans:  # each piece lies inside its file and carries the file's manifest facts
        for piece in p.pieces:
            n = sizes[int(piece.path[-5:])]
            assert 0 <= piece.start < piece.start + piece.count <= n
            assert (piece.file_records, piece.num_bytes) == (n, 100 * n + 1)
        assert p.files == sorted({piece.path for piece in p.pieces})


@pytest.mark.parametrize("sizes,count", CASES, ids=str)
def test_training_hosts_all_yield_the_common_minimum(sizes, count):
    total = sum(sizes)
    plans = [hosts.plan(split_of(sizes), hosts.Hosts(count, i, "strategy"), True)
             for i in range(count)]
    assert [p.per_epoch for p in plans] == [total // count] * count
    assert all(p.records - p.per_epoch in (0, 1) for p in plans)  # at most one left out


def test_a_file_cut_by_a_range_boundary_is_read_by_both_neighbours():
    # 30 records in 4 files of 8, 7, 8, 7; 4 hosts: ranges [0, 7), [7, 15), [15, 22), [22, 30)
    plans = [hosts.plan(split_of((8, 7, 8, 7)), hosts.Hosts(4, i, "TF_CONFIG"), False)
             for i in range(4)]
    pieces = [[(p.path[-1], p.start, p.count) for p in plan.pieces] for plan in plans]
    assert pieces == [[("0", 0, 7)], [("0", 7, 1), ("1", 0, 7)], [("2", 0, 7)],
                      [("2", 7, 1), ("3", 0, 7)]]
    assert [plan.files for plan in plans][1] == ["/ds/train-00000", "/ds/train-00001"]


def test_empty_files_are_left_out_and_too_many_hosts_are_refused():
    plan = hosts.plan(split_of((0, 5, 0)), hosts.Hosts(1, 0, "single"), True)
    assert [p.path for p in plan.pieces] == ["/ds/train-00001"]
    with pytest.raises(ValueError, match="has 3 records for 4 input pipelines"):
        hosts.plan(split_of((1, 2)), hosts.Hosts(4, 0, "input_context"), False)
    with pytest.raises(ValueError, match="'train' has no records"):
        hosts.plan(split_of((0, 0)), hosts.Hosts(1, 0, "single"), False)


def test_hosts_draw_different_augmentations_reproducibly():
    seeds = [hosts.seed_for(7, hosts.Hosts(2, i, "input_context")) for i in (0, 1, 0)]
    assert seeds[0] != seeds[1] and seeds[0] == seeds[2]
    assert all(0 <= s < 2**63 for s in seeds)
    assert hosts.seed_for(7, hosts.Hosts(1, 0, "single")) == 7
    assert hosts.seed_for(None, hosts.Hosts(2, 1, "input_context")) is None


class Ctx:
    """Stands in for tf.distribute.InputContext (the two attributes the reader reads)."""

    def __init__(self, n, i):
        self.num_input_pipelines, self.input_pipeline_id = n, i


def test_an_input_context_names_the_host():
    assert hosts.detect(Ctx(3, 2)) == hosts.Hosts(3, 2, "input_context")


@pytest.mark.parametrize("config,expected", [
    ({"cluster": {"chief": ["a:1"], "worker": ["b:1", "c:1"]},
      "task": {"type": "worker", "index": 1}}, (3, 2, "TF_CONFIG")),
    ({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}},
     (2, 0, "TF_CONFIG")),
    ({"cluster": {"chief": ["a:1"], "worker": ["b:1"]}, "task": {"type": "evaluator",
                                                              "index": 0}}, (1, 0, "single")),
    ({"cluster": {"worker": ["a:1"], "ps": ["p:1"]}, "task": {"type": "worker", "index": 0}},
     (1, 0, "single")),
    (None, (1, 0, "single")),
])
def test_hosts_from_tf_config(config, expected):
    # detect()'s last resort, without TensorFlow (detect() first asks a strategy in scope;
    # make_dataset under TF_CONFIG: tests/test_reader.py)
    text = "" if config is None else json.dumps(config)
    assert hosts._from_tf_config(text) == hosts.Hosts(*expected)
