"""The container images install from a wheelhouse made from constraints.txt: no index.

No Docker daemon runs where the suite does, so the images are not built here. The
Dockerfiles are checked as text (every base pinned, every pip install offline from the
mounted wheelhouse, the pin check in both images); docker/build_wheelhouse.py runs for real
on a slice of constraints.txt (two binary wheels and a pure one with a dependency), and the
slice is installed with --no-index into a fresh venv that sees neither the test venv's nor
the system's site-packages.
"""

import json
import os
import re
import runpy
import sys
import venv

import pytest

from tests.helpers import REPO

SCRIPT = REPO / "docker" / "build_wheelhouse.py"
CONSTRAINTS = REPO / "constraints.txt"
DOCKERFILES = (REPO / "docker" / "worker.Dockerfile",
               REPO / "configs" / "flex_template" / "Dockerfile")
MOUNT = "--mount=type=bind,source=build/wheelhouse,target=/wheelhouse"
# pillow and google-crc32c: platform wheels; python-dateutil: pure, requires six. pip: the
# images install the pinned pip from the wheelhouse first, and so does the test.
SLICE = ("pillow", "google-crc32c", "python-dateutil")


def _instructions(path):
    """(keyword, arguments) per Dockerfile instruction, continuation lines joined."""
    text = re.sub(r"^\s*#.*\n", "", path.read_text(), flags=re.M).replace("\\\n", " ")
    return [tuple(line.split(None, 1)) for line in text.splitlines() if line.strip()]


def _pins():
    return dict(line.split("==") for line in CONSTRAINTS.read_text().split()
                if "==" in line)


def _run(*argv, env=None, timeout=300):
    import subprocess

    return subprocess.run([str(a) for a in argv], env=env, timeout=timeout, cwd=REPO,
                          capture_output=True, text=True)


def _offline_env():
    """No PYTHONPATH, no pip configuration (find-links, extra indexes): only the flags given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def _bare_venv(tmp_path, wheelhouse):
    """`python -m venv` (ensurepip's pip, no system site-packages) from the base interpreter,
    not the test venv, with the pinned pip from the wheelhouse (as the images do first);
    returns its python after checking what its sys.path holds."""
    root = tmp_path / "bare"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(root)
    python = root / "bin" / "python"
    path = json.loads(_run(python, "-c", "import json, sys; print(json.dumps(sys.path))",
                           env=_offline_env()).stdout)
    sites = [p for p in path if p.endswith(("site-packages", "dist-packages"))]
    assert sites and all(p.startswith(str(root)) for p in sites), path
    assert not any(p.startswith(sys.prefix) for p in path), (sys.prefix, path)
    absent = _run(python, "-c", "import PIL", env=_offline_env())
    assert "No module named 'PIL'" in absent.stderr  # nothing borrowed from the test venv
    pip = _run(python, "-m", "pip", "install", "--no-index", "--find-links", wheelhouse,
               "-c", CONSTRAINTS, "pip", env=_offline_env())
    assert pip.returncode == 0, pip.stdout + pip.stderr
    return python


def _wheels(wheelhouse):
    return {re.sub(r"[-_.]+", "-", w.name.split("-")[0]).lower(): w.name.split("-")[1]
            for w in wheelhouse.glob("*.whl")}


def test_dockerfiles_install_only_from_the_wheelhouse_and_run_the_pin_check():
    for path in DOCKERFILES:
        steps, stages = _instructions(path), set()
        for keyword, args in steps:
            if keyword == "FROM":
                image, *alias = args.split()
                assert image in stages or re.fullmatch(
                    r"[\w.\-/]+:[\w.\-]+(@sha256:[0-9a-f]{64})?", image), (path.name, image)
                stages.update(alias[-1:])
        runs = [args for keyword, args in steps if keyword == "RUN"]
        installs = [(run, cmd) for run in runs for cmd in run.split("&&") if "pip install" in cmd]
        assert len(installs) >= 2, path
        for run, cmd in installs:
            assert "--no-index" in cmd and "--upgrade" not in cmd, (path.name, cmd)
            assert "--find-links" not in cmd or MOUNT in run, (path.name, cmd)
        first = installs[0][1].split()
        assert first[-2:] == ["pip", "setuptools"] and "constraints.txt" in first, first
        assert any('python check_pins.py constraints.txt "image-tfrecords${EXTRAS:+[$EXTRAS]}" '
                   "pip setuptools" in run for run in runs), path.name
        assert any(k == "COPY" and "docker/check_pins.py" in a for k, a in steps), path.name
    # The images mount the script's default output; pip and setuptools are pinned there.
    assert "--out\", type=Path, default=REPO / \"build\" / \"wheelhouse\"" in SCRIPT.read_text()
    assert {"pip", "setuptools"} <= set(_pins())


def test_the_wheelhouse_refuses_unpinned_and_host_compiled_wheels_and_caps_glibc(tmp_path):
    script = runpy.run_path(str(SCRIPT))
    names = ["six-1.17.0-py2.py3-none-any.whl", "six-1.16.0-py2.py3-none-any.whl",
             "left_pad-1.0-py3-none-any.whl", "crcmod-1.7-cp311-cp311-linux_x86_64.whl",
             "pillow-12.3.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"]
    pinned = {"six": "1.17.0", "crcmod": "1.7", "pillow": "12.3.0"}
    assert script["unpinned"]([tmp_path / n for n in names], pinned) == [
        "six-1.16.0-py2.py3-none-any.whl: constraints.txt pins 1.17.0",
        "left_pad-1.0-py3-none-any.whl: constraints.txt does not pin it (pin it there)",
        "crcmod-1.7-cp311-cp311-linux_x86_64.whl: compiled on this host, not a published "
        "manylinux wheel"]
    hook = {}  # PEP 600's _manylinux module, as pip imports it in the script's pip run
    exec(script["MANYLINUX_HOOK"].format(glibc=(2, 28)), hook)
    assert [hook["manylinux_compatible"](2, minor, arch) for minor, arch in (
        (17, "x86_64"), (28, "x86_64"), (31, "x86_64"), (17, "aarch64"))] == [
        True, True, False, False]


@pytest.mark.slow
def test_wheelhouse_slice_installs_at_its_pins_offline_into_a_bare_venv(tmp_path):
    wheelhouse = tmp_path / "wheelhouse"
    made = _run(sys.executable, SCRIPT, "--out", wheelhouse, *SLICE, "pip")
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
    assert "5 wheels" in made.stdout and str(wheelhouse) in made.stdout
    pins = {name.lower(): version for name, version in _pins().items()}
    expected = {name: pins[name] for name in (*SLICE, "six", "pip")}
    assert _wheels(wheelhouse) == expected

    python = _bare_venv(tmp_path, wheelhouse)
    installed = _run(python, "-m", "pip", "install", "--no-index", "--find-links", wheelhouse,
                     "-c", CONSTRAINTS, *SLICE, env=_offline_env())
    assert installed.returncode == 0, installed.stdout + installed.stderr
    probe = _run(python, "-c", """if 1:
        import importlib.metadata as md, json, sys
        import PIL.Image, google_crc32c, dateutil.parser
        print(json.dumps({"versions": {n: md.version(n) for n in sys.argv[1:]},
                          "files": [PIL.__file__, google_crc32c.__file__, dateutil.__file__],
                          "pixels": list(PIL.Image.new("L", (2, 1), 7).tobytes()),
                          "crc32c": [google_crc32c.value(b"123456789"),
                                     google_crc32c.implementation],
                          "hour": dateutil.parser.parse("2026-12-01T22:10").hour}))
        """, *expected, env=_offline_env())
    assert probe.returncode == 0, probe.stderr
    seen = json.loads(probe.stdout)
    assert seen["versions"] == expected
    assert all(f.startswith(str(python.parent.parent)) for f in seen["files"]), seen["files"]
    # CRC-32C's check value, and the C extension computed it (not the pure-Python fallback).
    assert seen["pixels"] == [7, 7] and seen["crc32c"] == [0xE3069283, "c"] and seen["hour"] == 22
    checked = _run(python, REPO / "docker" / "check_pins.py", CONSTRAINTS, *SLICE, "pip",
                   env=_offline_env())
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert ("5 distributions in the closure of pillow google-crc32c python-dateutil pip: 5 match "
            "their pins, 0 differ, 0 not pinned") in checked.stdout, checked.stdout


@pytest.mark.slow
def test_a_missing_wheel_fails_the_offline_install_and_an_unpinned_one_the_wheelhouse(tmp_path):
    wheelhouse = tmp_path / "wheelhouse"
    made = _run(sys.executable, SCRIPT, "--out", wheelhouse, "python-dateutil", "pip")
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
    (six,) = wheelhouse.glob("six-*.whl")
    six.unlink()
    python = _bare_venv(tmp_path, wheelhouse)
    refused = _run(python, "-m", "pip", "install", "--no-index", "--find-links", wheelhouse,
                   "-c", CONSTRAINTS, "python-dateutil", env=_offline_env())
    said = refused.stdout + refused.stderr
    assert refused.returncode == 1, said
    assert "The user requested (constraint) six==1.17.0" in said, said
    assert re.search(r"no matching distributions available for your environment:\s+six\n",
                     said), said
    listed = _run(python, "-m", "pip", "list", "--format", "json", env=_offline_env())
    assert "python-dateutil" not in listed.stdout  # nothing half-installed

    # A dependency constraints.txt doesn't pin would make every build differ: refused whole.
    partial = tmp_path / "constraints.txt"
    partial.write_text("".join(line for line in CONSTRAINTS.read_text().splitlines(True)
                               if not line.startswith("six==")))
    out = tmp_path / "unpinned"
    made = _run(sys.executable, SCRIPT, "--out", out, "--constraints", partial, "python-dateutil")
    assert made.returncode == 1 and not out.exists(), made.stdout[-2000:]
    assert re.search(r"^error: six-[\d.]+-py2\.py3-none-any\.whl: constraints\.txt does not pin "
                     r"it \(pin it there\)$", made.stderr, re.M), made.stderr[-2000:]

    # Bases older than the pinned wheels need: pillow's cp311 wheels want glibc 2.27+.
    old = tmp_path / "old"
    made = _run(sys.executable, SCRIPT, "--out", old, "--glibc", "2.17", "pillow")
    assert made.returncode == 1 and not old.exists(), made.stdout[-2000:]
    assert made.stderr.rstrip().endswith("error: pip wheel failed (exit 1), output above")
    assert "pillow" in made.stdout + made.stderr
