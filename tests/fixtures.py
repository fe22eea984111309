"""Shared fixtures (a pytest plugin: tests/conftest.py registers it with `pytest_plugins`).

* `make_images`     the tests.helpers.make_images function, as a fixture
* `sample_images`   (session) `sample_data.generate(dir, per_class=12)`, read-only
* `built_dataset`   (session) one real build of `sample_images`, read-only
* `gcs_without_objects` a loopback storage endpoint where every request is 404: gs:// reads
                    fail at once (the real endpoint is unreachable here: each read retried
                    for ~1 min before it failed)
* `restore_logger_levels` (autouse) gives every test the Beam/TF logger levels back

Treat the session fixtures as read-only: copy first
(`shutil.copytree(built_dataset["root"], tmp_path / "copy")`) before changing anything.

Tests that use a fixture in SLOW_FIXTURES are marked `slow` at collection (a build, the GCS
emulator), so `-m "not slow"` leaves them out even where a module forgot the marker.
"""

import http.server
import logging
import threading

import pytest

from tests.helpers import BUILT_ARGS, build, make_images

# Fixtures that run a build or start the storage emulator.
SLOW_FIXTURES = frozenset({"built_dataset", "gcs", "gcs_bucket"})


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items):
    for item in items:
        if SLOW_FIXTURES.intersection(item.fixturenames) and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(name="make_images")
def make_images_fixture():
    """The `tests.helpers.make_images(root, spec)` helper as a fixture (see its docstring)."""
    return make_images


@pytest.fixture(scope="session")
def sample_images(tmp_path_factory):
    """A directory made by `sample_data.generate(dir, per_class=12)`: 3 classes x 12 images in
    every variant (JPEG, progressive, PNG, gray, CMYK, palette, EXIF, 16-bit, RGBA, GIF) plus
    the 3 broken files of `sample_data.broken_files()` under circle/. Read-only."""
    from beam_pipeline.tools import sample_data

    directory = tmp_path_factory.mktemp("sample_images")
    sample_data.generate(str(directory), per_class=12)
    return str(directory)


@pytest.fixture(scope="session")
def built_dataset(sample_images, tmp_path_factory):
    """One real build (FnApiRunner, in-process) of `sample_images`; shared and read-only.

    `tests.helpers.build(sample_images, ROOT, *BUILT_ARGS)`, i.e. name "shapes", 2 shards
    per split, --max_error_rate 0.2 (the 3 broken files are ~8%), --no_transform. Returns the
    `cli.run` dict plus two keys:
      status       "published"
      version      the version id, e.g. "20261129T220102Z"
      manifest     the manifest.json dict (docs/format.md)
      version_dir  ROOT/versions/VERSION
      root         ROOT, the dataset root (has LATEST; readers take it)
      input        the sample image directory that was built
    Labels are ["circle", "square", "triangle"]; 36 images written, 3 failed
    (empty_file, truncated, not_an_image).
    """
    root = tmp_path_factory.mktemp("built") / "dataset"
    return dict(build(sample_images, root, *BUILT_ARGS), input=sample_images)


class _NotFound(http.server.BaseHTTPRequestHandler):
    def _answer(self):
        body = b'{"error": {"code": 404, "message": "No such object"}}'
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _answer

    def log_message(self, *args):
        pass


@pytest.fixture
def gcs_without_objects(monkeypatch):
    """STORAGE_EMULATOR_HOST -> a loopback server that answers 404 to everything, so a gs://
    read fails at once with NotFound (no credentials or metadata-server probe either). For
    tests where no gs:// object exists and a read must fail; the real emulator is `gcs`."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "no-objects")
    yield
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def restore_logger_levels():
    """cli.main quiets Beam/TF loggers process-wide, as a console run should; give every
    other test its levels back."""
    names = ("apache_beam", "absl", "tensorflow")
    levels = {n: logging.getLogger(n).level for n in names}
    yield
    for n, level in levels.items():
        logging.getLogger(n).setLevel(level)
