"""The worker image is named immutably: docker/image_tag.py derives its tag from what the
image is built from, refuses reused tags, and no doc or config names the image by one."""

import re
import shutil
import subprocess
import sys

import pytest

from tests.helpers import REPO

SCRIPT = REPO / "docker" / "image_tag.py"


@pytest.fixture(scope="module")
def image_tag():
    import runpy

    return runpy.run_path(str(SCRIPT))


def _tree(tmp_path):
    """A copy of what the image is built from."""
    repo = tmp_path / "repo"
    for name in ("constraints.txt", "setup.py", "docker", "beam_pipeline", "dataset_format",
                 "tf_quiet", "readers", "loaders"):
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, repo / name)
    return repo


def test_the_tag_follows_the_code_the_constraints_and_the_extras(tmp_path, image_tag):
    tag = image_tag["tag"]
    repo = _tree(tmp_path)
    first = tag(str(repo))
    version = image_tag["version"](str(repo))
    assert re.fullmatch(re.escape(version) + r"-[0-9a-f]{12}", first), first
    assert tag(str(repo)) == first == tag(str(REPO))  # the same tree: the same tag anywhere
    (repo / "beam_pipeline" / "__pycache__").mkdir(exist_ok=True)
    (repo / "beam_pipeline" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    assert tag(str(repo)) == first  # byte code is not an input
    assert tag(str(repo), extras="transform") != first
    codec = repo / "beam_pipeline" / "job" / "jpeg.py"
    codec.write_text(codec.read_text() + "\n# one more line\n")
    second = tag(str(repo))
    assert second != first and second.split("-")[0] == first.split("-")[0]
    pins = repo / "constraints.txt"
    pins.write_text(pins.read_text().replace("pillow==", "pillow==0", 1))
    assert tag(str(repo)) not in (first, second)


def test_the_command_prints_the_tag_and_checks_a_reference(image_tag):
    run = lambda *a: subprocess.run([sys.executable, str(SCRIPT), *a], capture_output=True,
                                    text=True, cwd=REPO)
    printed = run()
    assert printed.returncode == 0 and printed.stdout == image_tag["tag"]() + "\n"
    repo = "us-central1-docker.pkg.dev/p/dataflow/image-tfrecords-worker"
    for good in (f"{repo}:{image_tag['tag']()}", f"{repo}@sha256:{'ab' * 32}",
                 f"{repo}:2.77.0@sha256:{'0f' * 32}"):
        assert run("--check", good).returncode == 0, good
    refused = run("--check", f"{repo}:2.77.0")
    assert refused.returncode == 1
    assert refused.stderr == (f"error: worker image '{repo}:2.77.0' is a reused tag: name it "
                              "by digest (IMAGE@sha256:...) or by the tag `python "
                              "docker/image_tag.py` prints\n")
    for bad in (f"{repo}:latest", f"{repo}@sha256:abc", f"{repo}:0.1.0-XYZ"):
        assert run("--check", bad).returncode == 1, bad


def test_no_doc_or_config_names_the_worker_image_by_a_reused_tag():
    texts = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
             *sorted(p for p in (REPO / "configs").rglob("*") if p.is_file()),
             *sorted((REPO / "docker").glob("*Dockerfile"))]
    found = [(p.name, m.group(0)) for p in texts
             for m in re.finditer(r"image-tfrecords-worker:[\w.\-]+", p.read_text())]
    assert not found, found
    dockerfile = (REPO / "configs" / "flex_template" / "Dockerfile").read_text()
    assert 'python /tmp/image_tag.py --check "${WORKER_IMAGE}"' in dockerfile
    dag = (REPO / "configs" / "airflow" / "image_tfrecords_dag.py").read_text()
    assert '"sdkContainerImage": "{{ var.value.image_tfrecords_worker_image }}"' in dag
