"""Every failure is one line on every local engine, through ./run_local.sh as users run it.

Beam's SDK worker prints a failed instruction's traceback to stderr itself; with
configs/local.yaml (worker threads) a build over --max_error_rate printed 92-109 lines
before its one-line error, and worker processes print theirs to the same descriptor.
"""

import hashlib
import os
import subprocess
import sys

import pytest

from beam_pipeline.launcher.quiet_stderr import TracebackFilter
from tests.helpers import REPO, make_images

BEAM_TRACEBACK = """\
Traceback (most recent call last):
  File "apache_beam/runners/common.py", line 1512, in process
    wrapper = lambda x: [fn(x)]
beam_pipeline.job.commit.ErrorRateExceeded: 2 of 8 inputs rejected

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "sdk_worker.py", line 310, in _execute
RuntimeError: ErrorRateExceeded: 2 of 8 [while running 'Commit']

"""


def test_the_filter_drops_traceback_blocks_and_keeps_other_lines():
    text = ("WARNING beam_pipeline: converting a.jpg again\n" + BEAM_TRACEBACK
            + "  3/8 images, 1 img/s\nerror: build failed: 2 of 8 inputs rejected\n")
    keep = TracebackFilter().keep
    assert [l for l in text.splitlines(keepends=True) if keep(l)] == [
        "WARNING beam_pipeline: converting a.jpg again\n", "  3/8 images, 1 img/s\n",
        "error: build failed: 2 of 8 inputs rejected\n"]


def _venv_for_run_local(tmp_path):
    """A VENV for run_local.sh that is the test's interpreter, marked installed (so the
    script never installs into the shared environment)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    digest = hashlib.sha256((REPO / "setup.py").read_bytes()
                            + (REPO / "constraints.txt").read_bytes()).hexdigest()[:16]
    (venv / f".installed-{digest}-transform").touch()
    return venv


@pytest.mark.slow
@pytest.mark.parametrize("engine", [[], ["--direct_running_mode", "multi_processing",
                                         "--direct_num_workers", "2"]],
                         ids=["threads", "processes"])
def test_a_failed_build_through_run_local_sh_is_one_line(tmp_path, engine):
    src = tmp_path / "in"
    make_images(src, {"cat": 6, "dog": {"broken.jpg": b"not an image"}})
    env = dict(os.environ, VENV=str(_venv_for_run_local(tmp_path)), PYTHONPATH=str(REPO))
    done = subprocess.run([str(REPO / "run_local.sh"), "--input", str(src), "--output",
                           str(tmp_path / "out"), "--max_error_rate", "0", *engine],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 3, done.stderr  # the error budget: a retry would not help
    lines = [l for l in done.stderr.splitlines() if l.strip()]
    progress = [l for l in lines if l.strip().endswith(("ETA 0s", "img/s"))]
    assert len(lines) - len(progress) == 1, done.stderr
    assert lines[-1].startswith("error: build failed: 1 of 7 inputs rejected (14.3%) exceeds "
                                "--max_error_rate 0; nothing published"), done.stderr
