"""No TensorFlow or absl start-up lines from the command lines, unless they run with --verbose.

What prints them (TensorFlow 2.21, CPU-only machine, found by running each CLI):

* `import tensorflow` loads two shared libraries whose static initialisers log through absl
  before anything calls absl::InitializeLog(): "WARNING: All log messages before
  absl::InitializeLog() is called are written to STDERR" and "cudart_stub.cc:31] Could not find
  cuda drivers …", once per library. No environment variable reaches them: TensorFlow reads
  TF_CPP_MIN_LOG_LEVEL only later.
* cpu_feature_guard ("This TensorFlow binary is optimized …") and oneDNN notices log at INFO:
  TF_CPP_MIN_LOG_LEVEL=2 stops them (numerics untouched, unlike TF_ENABLE_ONEDNN_OPTS=0).
* The first device listing logs "failed call to cuInit" at ERROR.

So `install()` sets TF_CPP_MIN_LOG_LEVEL=2 (unless the user set it) and a one-shot import hook:
the first `import tensorflow` in the process, wherever it happens, and TensorFlow's first device
listing run with file descriptor 2 pointed at a temporary file. Nothing is lost when the import
fails: what was written there is replayed to stderr before the exception propagates. Once the
import is done, stderr is TensorFlow's again (real warnings and errors still show).

Beam's local worker processes (DirectRunner multi_processing) inherit the environment, ENV
included, but not this process's hook. Importing this module installs the hook when ENV is "1",
so worker code quiets its TensorFlow import with `import tf_quiet  # noqa: F401`
before it. (Beam's --beam_plugins cannot do it: the FnApiRunner hands its worker processes no
pipeline options.) Remote workers (Dataflow) do not inherit ENV: unchanged.

No Beam and no TensorFlow here: the build's CLI and tools, its workers (through
`import beam_pipeline`) and readers' CLI share this package; none imports another's.
"""

import contextlib
import importlib.abc
import importlib.util
import os
import sys
import tempfile

ENV = "IMAGE_TFRECORDS_QUIET"
_LEVEL = "TF_CPP_MIN_LOG_LEVEL"
_we_set_level = False


def install(verbose=False):
    """Call first thing in a CLI's main, before anything imports TensorFlow.

    verbose=True undoes an earlier install() in this process (in-process callers, tests).
    """
    global _we_set_level
    if verbose:
        _remove_hook()
        os.environ.pop(ENV, None)
        if _we_set_level:
            os.environ.pop(_LEVEL, None)
            _we_set_level = False
        return
    if _LEVEL not in os.environ:
        os.environ[_LEVEL] = "2"  # INFO and WARNING from TensorFlow's C++ logging
        _we_set_level = True
    os.environ[ENV] = "1"  # inherited by local worker processes
    if "tensorflow" not in sys.modules and not any(isinstance(f, _QuietImport)
                                                   for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietImport())


def _remove_hook():
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _QuietImport)]


@contextlib.contextmanager
def stderr_to_tempfile():
    """Point fd 2 (C++ logging included) at a temporary file; replay it if the block raises."""
    _flush_stderr()
    saved = os.dup(2)
    capture = tempfile.TemporaryFile()
    os.dup2(capture.fileno(), 2)
    ok = False
    try:
        yield
        ok = True
    finally:
        _flush_stderr()
        os.dup2(saved, 2)
        os.close(saved)
        if not ok:  # the import failed: show what TensorFlow said before the traceback
            capture.seek(0)
            data = capture.read()
            while data:
                data = data[os.write(2, data):]
        capture.close()


def _flush_stderr():
    try:
        sys.stderr.flush()
    except (AttributeError, ValueError, OSError):
        pass


class _QuietImport(importlib.abc.MetaPathFinder):
    """Finds `tensorflow` like the other finders do, and loads it with stderr silenced."""

    busy = False

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow" or self.busy:
            return None
        self.busy = True
        try:
            spec = importlib.util.find_spec(name)  # the finders after this one
        finally:
            self.busy = False
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec


class _QuietLoader(importlib.abc.Loader):
    def __init__(self, loader):
        self._loader = loader

    def __getattr__(self, name):  # anything else (resources, get_data, …): the real loader
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        try:
            with stderr_to_tempfile():
                self._loader.exec_module(module)
                try:  # what the first op would do anyway; logs cuInit failures
                    module.config.list_physical_devices()
                except Exception:
                    pass
        finally:
            module.__loader__ = module.__spec__.loader = self._loader
            _remove_hook()  # one shot: TensorFlow is loaded now


if os.environ.get(ENV) == "1":  # e.g. a worker process started by a quiet launcher
    install()
