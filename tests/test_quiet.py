"""Quiet command lines: no TensorFlow or absl start-up lines on stderr
unless --verbose; the summary and progress stay. Each CLI runs as a subprocess, as a user runs
it, on one small dataset built once (by the CLI itself, with configs/local.yaml: Beam's
multi-process DirectRunner)."""

import os
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO, make_images


# What TensorFlow and absl print while starting, on machines with or without a GPU.
NOISE = re.compile(
    r"All log messages before absl::InitializeLog"
    r"|^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ [\w.-]+:\d+\]"  # absl / TF C++ log line
    r"|cudart_stub|cuInit|cuda_(platform|dnn|blas|fft)|computation_placer|cpu_feature_guard"
    r"|oneDNN custom operations|This TensorFlow binary is optimized"
    r"|To enable the following instructions"
    r"|^(WARNING|INFO):(absl|tensorflow):", re.M)


def user_env(**extra):
    """The environment a user's shell gives: none of the knobs the CLIs set themselves."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_CPP_MIN_LOG_LEVEL", "IMAGE_TFRECORDS_QUIET")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return dict(env, **extra)


def run(*args, env=None, timeout=600):
    return subprocess.run([sys.executable, *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env=env or user_env())


def noise(stderr):
    return [l for l in stderr.splitlines() if NOISE.search(l)]


@pytest.fixture(scope="module")
def tf_is_noisy():
    """Whether a bare `import tensorflow` prints start-up lines on this machine."""
    proc = run("-c", "import tensorflow as tf; tf.constant(1) + 1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return bool(noise(proc.stderr))


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """`python -m beam_pipeline --config configs/local.yaml …` once: (root, CompletedProcess)."""
    base = tmp_path_factory.mktemp("quiet")
    make_images(base / "src", {"cat": 3, "dog": 3})
    make_images(base / "src", {"cat": {"empty.jpg": b""}})
    root = base / "ds"
    proc = run("-m", "beam_pipeline", "--config", "configs/local.yaml", "--input", base / "src",
               "--output", root, "--name", "pets", "--num_shards", "1",
               "--max_error_rate", "0.5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, proc


@pytest.mark.slow
def test_build_is_quiet(build):
    _, proc = build
    assert not noise(proc.stderr), proc.stderr
    assert "Published pets version" in proc.stdout and "rejected 1 (empty_file: 1)" in proc.stdout
    # Only our own lines reach stderr (progress lines, when a build is long enough to print).
    assert all(l.startswith("  ") and "images" in l
               for l in proc.stderr.splitlines() if l.strip()), proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("args, expect", [
    (["-m", "readers", "{root}", "--split", "train", "--batch_size", "2"], "Read back"),
    (["-m", "beam_pipeline.tools.verify", "{root}"], "OK "),
    (["-m", "beam_pipeline.tools.inspect_dataset", "{root}", "--out", "{out}", "--n", "4"],
     "wrote "),
])
def test_tools_are_quiet_and_verbose_shows_tensorflow(build, tf_is_noisy, tmp_path, args,
                                                      expect):
    root, _ = build
    args = [a.format(root=root, out=tmp_path) for a in args]
    proc = run(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert expect in proc.stdout
    assert not noise(proc.stderr), proc.stderr
    assert not proc.stderr.strip(), proc.stderr
    loud = run(*args, "--verbose")
    assert loud.returncode == 0 and expect in loud.stdout, loud.stderr[-3000:]
    if tf_is_noisy:  # --verbose leaves TensorFlow's own lines alone
        assert noise(loud.stderr), loud.stderr


@pytest.mark.slow
def test_build_errors_stay_visible_when_quiet(tmp_path):
    """Quiet hides TensorFlow's start-up, not our one-line errors."""
    proc = run("-m", "beam_pipeline", "--input", tmp_path, "--output", tmp_path / "o",
               "--num_shardz", "2")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: unknown option --num_shardz (did you mean --num_shards?)"


FAKE_TF = """
import os
os.write(2, b"W0000 00:00:1.0 1 fake.cc:1] start-up chatter\\n")
if os.environ.get("FAKE_TF_FAILS"):
    raise ImportError("fake tensorflow could not load libfake.so")
"""

PROGRAM = """
import sys
import tf_quiet
tf_quiet.install(verbose=len(sys.argv) > 1)
import tensorflow
print("after import", file=sys.stderr, flush=True)
"""


@pytest.fixture
def fake_tf(tmp_path):
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text(FAKE_TF)
    (tmp_path / "prog.py").write_text(PROGRAM)
    return tmp_path


def fake_env(fake_tf, **extra):
    return user_env(PYTHONPATH=os.pathsep.join([str(fake_tf), str(REPO)]), **extra)


def test_import_hook_hides_start_up_lines_only_while_importing(fake_tf):
    proc = run(fake_tf / "prog.py", env=fake_env(fake_tf))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "after import\n"  # stderr works again after the import
    loud = run(fake_tf / "prog.py", "verbose", env=fake_env(fake_tf))
    assert "start-up chatter" in loud.stderr and "after import" in loud.stderr


def test_failed_import_shows_what_tensorflow_said(fake_tf):
    proc = run(fake_tf / "prog.py", env=fake_env(fake_tf, FAKE_TF_FAILS="1"))
    assert proc.returncode == 1
    assert "start-up chatter" in proc.stderr
    assert "ImportError: fake tensorflow could not load libfake.so" in proc.stderr


def test_worker_processes_quiet_themselves(fake_tf):
    """A process started by a quiet CLI inherits the environment; importing the module there
    (as worker code does before TensorFlow) installs the same hook."""
    code = "import tf_quiet, tensorflow, sys; print('ok', file=sys.stderr)"
    quiet = run("-c", code, env=fake_env(fake_tf, IMAGE_TFRECORDS_QUIET="1"))
    assert quiet.stderr == "ok\n", quiet.stderr
    plain = run("-c", code, env=fake_env(fake_tf))
    assert "start-up chatter" in plain.stderr


def test_user_log_level_is_kept(fake_tf):
    code = ("import os; import tf_quiet; tf_quiet.install(); "
            "print(os.environ['TF_CPP_MIN_LOG_LEVEL'])")
    assert run("-c", code, env=fake_env(fake_tf, TF_CPP_MIN_LOG_LEVEL="0")).stdout == "0\n"
    assert run("-c", code, env=fake_env(fake_tf)).stdout == "2\n"
