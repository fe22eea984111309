"""The one ordered read-ahead (algorithms/read_ahead.py): pure, no Beam."""

import pytest

from beam_pipeline.algorithms.read_ahead import ordered, threaded


class _Started:
    def __init__(self, log, item):
        self.log, self.item = log, item
        log.append(("start", item))

    def result(self):
        self.log.append(("result", self.item))
        return self.item * 10


def test_results_come_in_order_with_at_most_depth_started_ahead():
    log, most = [], 0
    for item, got in ordered(range(7), lambda i: _Started(log, i), depth=3):
        assert got == item * 10
        started = sum(1 for what, _ in log if what == "start")
        most = max(most, started - item)  # started, counting the one handed out
    assert [i for what, i in log if what == "result"] == list(range(7))
    assert most == 3


def test_bytes_in_flight_stay_within_the_budget_or_one_larger_item():
    sizes = [3, 3, 3, 9, 1, 1, 1, 1, 3]
    log, held = [], []
    for item, _ in ordered(range(len(sizes)), lambda i: _Started(log, i), depth=16,
                           max_bytes=8, size=lambda i: sizes[i]):
        started = {i for what, i in log if what == "start"}
        held.append(sum(sizes[i] for i in started if i >= item))
    assert max(held) == 9  # the 9 alone; otherwise within 8
    assert sorted(held)[-2] <= 8


def test_threaded_raises_a_failed_read_at_its_turn():
    def read(i):
        if i == 2:
            raise ValueError("item 2 unreadable")
        return i

    got = []
    with pytest.raises(ValueError, match="item 2 unreadable"):
        for item, value in threaded(range(5), read, threads=2):
            got.append(value)
    assert got == [0, 1]
