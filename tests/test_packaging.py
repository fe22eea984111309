"""The package as the worker image installs it: a wheel, no index, no TensorFlow.

The slow test builds the wheel (`pip wheel --no-deps`, no build isolation: nothing fetched),
makes a fresh venv whose only other packages are the shared .venv's minus TensorFlow and
tensorflow-transform (a symlinked copy of its site-packages, put on the path by a .pth
file), installs the wheel with `pip install --no-index --find-links WHEELHOUSE` (pip resolves
every requirement against what is installed and may not download), and then runs a real
build from that venv. This is what the worker image does at build time, minus PyPI for
the dependencies, and what a worker VM must not need at start-up: any index.
"""

import ast
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO

# Dependencies the base install must not need (the "transform" and "test" extras bring them).
HIDDEN = ("tensorflow", "tensorflow_transform", "tensorflow_datasets", "tfx_bsl", "keras",
          "tf_keras", "tensorboard")
# The only job modules that may import TensorFlow, and the flag that makes them run.
TF_MODULES = {"beam_pipeline/job/analyze.py": "--transform",
              "beam_pipeline/job/beam_sink.py": "--sink beam"}


def _hidden(entry):
    stem = entry.split("-")[0].split(".")[0].lower()
    return (stem in HIDDEN or stem.startswith(("image_tfrecords", "__editable__"))
            or entry.endswith(".pth"))


def _run(python, *args, cwd, env, timeout=300):
    return subprocess.run([str(python), *map(str, args)], cwd=cwd, env=env, timeout=timeout,
                          capture_output=True, text=True)


def _offline_venv(tmp_path):
    """A venv made from this interpreter, seeing the shared .venv's packages except the
    HIDDEN ones; pip (from the shared .venv) installs into the new venv's own prefix."""
    import sysconfig

    deps = tmp_path / "deps"
    deps.mkdir()
    purelib = pathlib.Path(sysconfig.get_paths()["purelib"])
    for entry in os.listdir(purelib):
        if not _hidden(entry):
            (deps / entry).symlink_to(purelib / entry)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python*/site-packages")
    (site / "_shared_deps.pth").write_text(f"{deps}\n")
    return venv / "bin" / "python"


@pytest.mark.slow
def test_wheel_installs_without_an_index_and_builds_without_tensorflow(tmp_path, make_images):
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for package in ("beam_pipeline", "dataset_format", "tf_quiet", "readers", "loaders"):
        shutil.copytree(REPO / package, src / package, ignore=ignore)
    shutil.copy(REPO / "setup.py", src / "setup.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_"))}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_CONFIG_FILE=os.devnull,
               TF_CPP_MIN_LOG_LEVEL="2")

    start = time.monotonic()
    wheelhouse = tmp_path / "wheelhouse"
    built = _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                 "--wheel-dir", wheelhouse, src, cwd=tmp_path, env=env)
    assert built.returncode == 0, built.stderr
    (wheel,) = wheelhouse.glob("image_tfrecords-*.whl")
    python = _offline_venv(tmp_path)
    installed = _run(python, "-m", "pip", "install", "--no-index", "--find-links", wheelhouse,
                     "image-tfrecords", cwd=tmp_path, env=env)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    seconds = time.monotonic() - start
    print(f"wheel {wheel.name} ({wheel.stat().st_size / 1024:.0f} KiB): built and installed "
          f"offline in {seconds:.1f} s")

    # The installed copy (not the source tree) imports without TensorFlow, which is absent.
    check = _run(python, "-c", "import sys, beam_pipeline.cli, beam_pipeline.job.pipeline, "
                 "beam_pipeline.job.commit, beam_pipeline.launcher.plan, dataset_format.layout; "
                 "print(beam_pipeline.__file__); print('tensorflow' in sys.modules); "
                 "import tensorflow", cwd=tmp_path, env=env)
    where, loaded = check.stdout.split()
    assert where.startswith(str(python.parent.parent)) and loaded == "False"
    assert "No module named 'tensorflow'" in check.stderr
    # ... and is the pinned stack: every installed requirement equals its constraints.txt pin.
    pins = _run(python, REPO / "docker" / "check_pins.py", REPO / "constraints.txt",
                "image-tfrecords", cwd=tmp_path, env=env)
    assert pins.returncode == 0 and " 0 differ" in pins.stdout, pins.stdout + pins.stderr

    # --transform needs the extra: one line, exit 2, before any work.
    make_images(tmp_path / "in", {"daisy": 2, "rose": 2})
    cli = ["-m", "beam_pipeline", "--input", tmp_path / "in", "--output", tmp_path / "out",
           "--name", "flowers", "--num_shards", "1"]
    refused = _run(python, *cli, "--transform", cwd=tmp_path, env=env)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "--transform needs tensorflow and tensorflow_transform" in refused.stderr
    assert "'.[transform]'" in refused.stderr and not (tmp_path / "out" / "LATEST").exists()
    # A real build (Beam's FnApiRunner, in process) from the installed wheel, no TensorFlow.
    built = _run(python, *cli, "--runner", "FnApiRunner", cwd=tmp_path, env=env)
    assert built.returncode == 0, built.stdout + built.stderr
    assert "Published flowers version" in built.stdout
    assert (tmp_path / "out" / "LATEST").exists()


def test_transform_without_tensorflow_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    import importlib.util

    from beam_pipeline import cli

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name.startswith(
        "tensorflow") else find_spec(name, *a))
    args = ["--input", str(tmp_path), "--output", str(tmp_path / "out")]
    assert cli.main(args + ["--transform"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --transform needs tensorflow and tensorflow_transform, which "
                          "is not installed: pip install -c constraints.txt '.[transform]'")
    assert err.count("\n") == 1 and not (tmp_path / "out").exists()
    assert cli.main(args + ["--sink", "beam"]) == 2
    assert "error: --sink beam needs tensorflow, which" in capsys.readouterr().err


def test_only_the_transform_and_comparison_sink_modules_import_tensorflow():
    """The launcher, the job (default options), the store and the tools the job uses never
    import TensorFlow, at any level: workers run without it."""
    offenders = []
    for path in sorted((REPO / "beam_pipeline").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith("beam_pipeline/tools/") or rel in TF_MODULES:
            continue  # tools (verify, inspect) read datasets like a trainer: the reader extra
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{rel}:{node.lineno} {n}" for n in names
                          if n.split(".")[0] in HIDDEN]
    assert not offenders, offenders


def test_extras_split_tensorflow_from_the_base_install():
    """setup.py: no TensorFlow in install_requires; the test extra covers the transform one."""
    import setuptools

    captured = {}
    cwd = os.getcwd()
    try:
        os.chdir(REPO)
        original = setuptools.setup
        setuptools.setup = lambda **kw: captured.update(kw)
        try:
            exec(compile((REPO / "setup.py").read_text(), "setup.py", "exec"), {})
        finally:
            setuptools.setup = original
    finally:
        os.chdir(cwd)
    base = " ".join(captured["install_requires"])
    extras = captured["extras_require"]
    assert "tensorflow" not in base
    assert any(r.startswith("tensorflow-transform") for r in extras["transform"])
    assert set(extras["transform"]) <= set(extras["test"])
    assert set(extras["reader"]) <= set(extras["transform"])
    venv_sh = (REPO / "scripts" / "venv.sh").read_text()
    assert "ensure_venv test" in (REPO / "run_tests.sh").read_text()
    assert "ensure_venv transform" in (REPO / "run_local.sh").read_text()
    assert '-c constraints.txt -e "$spec"' in venv_sh
