"""Every benchmark writes its JSON record through benchmarks/common.py's `Record`: what the
record holds, where it goes, and that each bench_*.py script uses it."""

import json
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO

BENCHMARKS = sorted((REPO / "benchmarks").glob("bench_*.py"))


@pytest.fixture
def common():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import common
        yield common
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


def test_a_record_holds_commit_machine_load_arguments_and_figures(common, tmp_path, capsys):
    path = tmp_path / "sub" / "run.json"
    record = common.Record("bench_x", {"sizes": "20,40", "record": str(path)})
    assert record.save({"ratio": 1.25, "runs": [{"n": 20, "seconds": 1.5}]}) == str(path)
    got = json.loads(path.read_text())
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    assert got["benchmark"] == "bench_x" and got["commit"] == head
    assert isinstance(got["dirty"], bool)
    assert got["machine"]["cores"] >= 1 and got["machine"]["ram_gib"] > 0
    assert got["machine"]["cpu"]
    assert len(got["load_before"]) == len(got["load_after"]) == 3
    assert got["arguments"] == {"sizes": "20,40"}  # where the record goes is not an argument
    assert got["figures"] == {"ratio": 1.25, "runs": [{"n": 20, "seconds": 1.5}]}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", got["started"])
    assert capsys.readouterr().out == f"record: {path}\n"


def test_the_default_path_is_under_results_and_dash_writes_none(common, tmp_path,
                                                                 monkeypatch):
    monkeypatch.setattr(common, "RESULTS", str(tmp_path))
    path = common.Record("bench_y", {"record": None}).save({"v": 1})
    assert re.fullmatch(re.escape(str(tmp_path)) + r"/bench_y-\d{8}T\d{6}Z\.json", path)
    assert common.Record("bench_y", {"record": "-"}).save({"v": 1}) is None
    assert len(list(tmp_path.iterdir())) == 1


def test_printed_keeps_what_a_block_prints(common, capsys):
    with common.printed() as lines:
        print("a | b")
        print("1 | 2", end="")
    assert lines == ["a | b", "1 | 2"]
    assert capsys.readouterr().out == "a | b\n1 | 2"


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda p: p.name)
def test_every_benchmark_writes_a_record(script):
    source = script.read_text()
    assert "Record(" in source and ".save(" in source, (
        f"{script.name} writes no JSON record: see benchmarks/README.md, 'The JSON record'")
    assert "--record" in source or "add_record_argument" in source
    assert script.name in (REPO / "benchmarks" / "README.md").read_text(), (
        f"benchmarks/README.md does not say how to run {script.name}")


def test_results_are_not_committed():
    ignored = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q",
                              "benchmarks/_results/bench_x-20260101T000000Z.json"])
    assert ignored.returncode == 0
