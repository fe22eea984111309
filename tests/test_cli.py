"""The command line: exit codes and one-line errors."""

import os
import subprocess
import sys
import time

import pytest

from beam_pipeline import cli
from dataset_format import layout
from tests.helpers import FAST, REPO, make_images


@pytest.fixture(scope="module")
def images_dir(tmp_path_factory):
    src = tmp_path_factory.mktemp("cli_images")
    make_images(src, {"cat": 2, "dog": 2})
    return src


def one_line_error(capsys, argv, code=2):
    """Run main(argv); check the exit code and that stderr is exactly one 'error: …' line."""
    assert cli.main([str(a) for a in argv]) == code
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]


def test_missing_input(capsys, tmp_path):
    line = one_line_error(capsys, ["--output", tmp_path / "out"])
    assert "--input" in line


def test_missing_output(capsys, images_dir):
    assert "--output" in one_line_error(capsys, ["--input", images_dir])


def test_directory_without_images(capsys, tmp_path):
    empty = tmp_path / "empty"
    (empty / "cat").mkdir(parents=True)
    (empty / "cat" / "notes.txt").write_text("hi")
    line = one_line_error(capsys, ["--input", empty, "--output", tmp_path / "out"])
    assert str(empty) in line and "no image files" in line


def test_missing_directory(capsys, tmp_path):
    line = one_line_error(capsys, ["--input", tmp_path / "nope", "--output", tmp_path / "out"])
    assert str(tmp_path / "nope") in line


def test_glob_matches_nothing(capsys, images_dir, tmp_path):
    pattern = f"{images_dir}/*/*.webp"
    line = one_line_error(capsys, ["--input", pattern, "--output", tmp_path / "out"])
    assert pattern in line and "no files match" in line


def test_unreadable_manifest(capsys, tmp_path):
    missing = tmp_path / "nope.csv"
    line = one_line_error(capsys, ["--input", missing, "--output", tmp_path / "out"])
    assert str(missing) in line and "manifest" in line


def test_csv_manifest_without_header(capsys, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("path,class\nx.jpg,cat\n")
    line = one_line_error(capsys, ["--input", bad, "--output", tmp_path / "out"])
    assert str(bad) in line and "uri,label" in line


def test_malformed_jsonl_manifest(capsys, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"uri": "a.jpg", "label": "cat"}\n{"uri": "b.jpg",\n')
    line = one_line_error(capsys, ["--input", bad, "--output", tmp_path / "out"])
    assert f"{bad}:2" in line and "JSON" in line


def test_empty_manifest(capsys, tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text("uri,label,split\n")
    line = one_line_error(capsys, ["--input", empty, "--output", tmp_path / "out"])
    assert str(empty) in line and "no rows" in line


@pytest.mark.parametrize("splits, named", [
    ("train=0.5,test=0.2", "0.7"),
    ("train=0.8,validation=x", "validation=x"),
    ("train:1", "train:1"),
])
def test_bad_splits(capsys, images_dir, tmp_path, splits, named):
    line = one_line_error(capsys, ["--input", images_dir, "--output", tmp_path / "out",
                                   "--splits", splits])
    assert "--splits" in line and named in line
    assert not (tmp_path / "out" / layout.VERSIONS).exists()  # checked before any work


@pytest.mark.parametrize("quality", ["0", "101", "-5"])
def test_bad_jpeg_quality(capsys, images_dir, tmp_path, quality):
    line = one_line_error(capsys, ["--input", images_dir, "--output", tmp_path / "out",
                                   "--jpeg_quality", quality])
    assert "jpeg_quality" in line and quality in line


def test_non_numeric_jpeg_quality(capsys, images_dir, tmp_path):
    # argparse's own message (usage + one error line), still exit code 2 and naming the value.
    with pytest.raises(SystemExit) as info:
        cli.main(["--input", str(images_dir), "--output", str(tmp_path / "out"),
                  "--jpeg_quality", "abc"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--jpeg_quality" in err and "'abc'" in err and "Traceback" not in err


@pytest.mark.parametrize("flag, value", [("--num_shards", "-1"), ("--max_error_rate", "2"),
                                         ("--max_side", "-3"), ("--name", "my-set")])
def test_other_bad_values(capsys, images_dir, tmp_path, flag, value):
    line = one_line_error(capsys, ["--input", images_dir, "--output", tmp_path / "out",
                                   flag, value])
    assert flag.lstrip("-") in line and value in line


def test_output_not_writable(capsys, images_dir, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a regular file")
    target = blocker / "sub"
    line = one_line_error(capsys, ["--input", images_dir, "--output", target])
    assert str(target) in line and "not writable" in line


def test_bad_config_file(capsys, images_dir, tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("- just\n- a list\n")
    line = one_line_error(capsys, ["--config", config, "--input", images_dir,
                                   "--output", tmp_path / "out"])
    assert str(config) in line


def test_unreadable_label_file(capsys, images_dir, tmp_path):
    missing = tmp_path / "labels.txt"
    line = one_line_error(capsys, ["--input", images_dir, "--output", tmp_path / "out",
                                   "--label_file", missing])
    assert str(missing) in line and "--label_file" in line


@pytest.mark.slow
def test_success_returns_zero(capsys, images_dir, tmp_path):
    out = tmp_path / "out"
    assert cli.main(["--input", str(images_dir), "--output", str(out), *FAST]) == 0
    captured = capsys.readouterr()
    assert "Published" in captured.out and "error" not in captured.err.lower()
    assert (out / layout.LATEST).exists()
    # Unchanged inputs and options: nothing to do, still success.
    assert cli.main(["--input", str(images_dir), "--output", str(out), *FAST]) == 0
    assert "up to date" in capsys.readouterr().out


@pytest.mark.slow
def test_config_file_gives_defaults_and_flags_override(images_dir, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("name: fromyaml\nsplits: train=1\nnum_shards: 3\nno_transform: true\n")
    result = cli.run(["--config", str(config), "--input", str(images_dir),
                      "--output", str(tmp_path / "out"), "--num_shards", "1"])
    m = result.manifest
    assert m["name"] == "fromyaml" and list(m["splits"]) == ["train"]
    assert len(m["splits"]["train"]["shards"]) == 1  # the flag beat the YAML's 3


@pytest.mark.slow
def test_error_rate_exceeded_one_line_exit_3(capsys, caplog, tmp_path):
    """Exit 3, not 1: the same command fails the same way until the inputs or
    --max_error_rate change, so a scheduler must not retry it."""
    src = tmp_path / "src"
    make_images(src, {"cat": 2, "dog": 1})
    make_images(src, {"cat": {"empty.jpg": b""}})
    out = tmp_path / "out"
    line = one_line_error(capsys, ["--input", src, "--output", out, *FAST], code=3)
    assert "max_error_rate" in line and "errors.jsonl" in line
    assert not (out / layout.LATEST).exists()
    # Beam must not dump the worker traceback through logging either (only with --verbose).
    tracebacks = [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert not tracebacks, tracebacks[0].getMessage()


def test_help_is_fast_and_lists_build_options():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "beam_pipeline", "--help"],
                          cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    seconds = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-2000:]
    for flag in ("--input", "--output", "--config", "--splits", "--max_error_rate", "--reencode"):
        assert flag in proc.stdout, proc.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:")}
    assert "tensorflow" not in imported, "--help must not import TensorFlow"
    assert seconds < 60


def test_console_exits_normally_where_tensorflow_was_loaded_before(monkeypatch):
    """A process that had TensorFlow before (this test runner) gets a plain SystemExit, so
    the suite goes on (console's os._exit is only for runs that loaded TensorFlow)."""
    import tensorflow  # noqa: F401

    monkeypatch.setattr(cli, "main", lambda argv=None: 3)
    with pytest.raises(SystemExit) as exit_:
        cli.console([])
    assert exit_.value.code == 3


@pytest.mark.slow
def test_console_skips_the_teardown_after_loading_tensorflow():
    """A run that loaded TensorFlow (a --transform build) exits with main's status, skipping
    the interpreter teardown that segfaults (exit 139) with TFT's threads still running."""
    code = ("from beam_pipeline import cli\n"
            "def main(argv=None):\n"
            "    import tensorflow\n"
            "    print('built', flush=True)\n"
            "    return 3\n"
            "cli.main = main\n"
            "cli.console([])\n"
            "print('not reached')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert proc.returncode == 3 and proc.stdout.splitlines() == ["built"], proc
