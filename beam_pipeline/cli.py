"""`python -m beam_pipeline`: arguments -> prepare (launcher/) -> the Beam job -> a summary.

Everything that must happen for a version to exist (commit, manifest, LATEST) runs inside
the job; the launcher only prepares, submits and, for runners that wait, reports. This
module is the entry point: exit codes, one-line errors, logging, interpreter exit.

Exit status, so a scheduler can tell what to do (README, docs/scheduling.md):
    0  published, up to date, or submitted to a remote runner (its last step publishes)
    1  failed, and running again may succeed: storage unavailable (store/transient.py), a
       worker process died, the lock was lost, --max_hours reached, a disk full
    2  a mistake in the command (bad option or value, no inputs, unwritable output, a
       damaged root that needs --resplit) or another build holds the root
    3  failed, and running the same command again will fail the same way until the inputs
       or options change (errors.RetryWontHelp: too many rejected inputs)
"""

import contextlib
import logging
import os
import sys
import threading

from beam_pipeline.errors import RetryWontHelp, UserError
from beam_pipeline.store import lock

EXIT_OK, EXIT_RETRY, EXIT_USAGE, EXIT_NO_RETRY = 0, 1, 2, 3
# Failures a retry repeats, as Beam reports them from inside the job (by name: a worker's
# exception reaches the launcher as text).
NO_RETRY_NAMES = ("ErrorRateExceeded",)


@lock.release_on_exit  # the lock taken below is released however run() ends
def run(argv=None):
    """Build one dataset version -> Published, Submitted or UpToDate (launcher/ types),
    within --max_hours (launcher/time_bound.py)."""
    # lazy: `--help` answers before the launcher (Beam) loads
    from beam_pipeline.launcher import options as opts, time_bound

    pipeline_options, build = opts.parse(argv)
    held = []
    with time_bound.bounded(build.max_hours,
                            release=lambda: [h.release(force=True) for h in held]):
        return _run(pipeline_options, build, held)


def _run(pipeline_options, build, held):
    # lazy: `--help` answers before the launcher (Beam) loads
    from beam_pipeline.launcher import checks, prepare, report, runner as runners

    root = checks.preflight(pipeline_options, build)  # a command's mistakes: exit 2, nothing made
    held.append(lock.acquire(root, wait=build.wait))  # one build per root: exit 2 if held
    planned = prepare.prepare(build, root)
    if isinstance(planned, prepare.UpToDate):
        report.print_up_to_date(root, planned.version, planned.why)
        if pipeline_options.get_all_options().get("template_location"):
            runners.write_no_op_job(pipeline_options, planned.version)
        return planned
    runner, waits = runners.choose(pipeline_options, planned.to_convert, build)
    report.print_plan(root, planned, notes=not waits)  # else in the summary
    result = runners.launch(pipeline_options, build, planned, runner, waits)
    if isinstance(result, runners.Published):
        report.print_summary(root, result, planned.notes)
    return result


def main(argv=None):
    """Console entry point: the exit status (module docstring): 0 published or up to date,
    1 failed (a retry may help), 2 a mistake in the command, 3 failed (a retry will not
    help)."""
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:  # answer before Beam and TensorFlow load
        # lazy: `--help` answers before the launcher (Beam) loads
        from beam_pipeline.launcher.flags import help_parser

        help_parser().print_help()
        return 0
    # lazy: `--help` answers before the launcher (Beam) loads
    from beam_pipeline.launcher.flags import wants_verbose
    # lazy: `--help` answers before the launcher (Beam) loads
    import tf_quiet

    verbose = wants_verbose(argv)
    tf_quiet.install(verbose)  # before TensorFlow loads anywhere (tf_quiet/__init__.py says why)
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not verbose:
        for name in ("apache_beam", "absl", "tensorflow"):
            logging.getLogger(name).setLevel(logging.ERROR)
        # Beam logs a failed bundle's traceback at ERROR; main prints its cause in one line.
        logging.getLogger("apache_beam").setLevel(logging.CRITICAL)
        # So do Beam's own threads when an SDK worker process dies: same line.
        threading.excepthook = lambda a: logging.debug("thread %s: %r", a.thread, a.exc_value)
    # lazy: `--help` answers before the launcher (Beam) loads
    from beam_pipeline.launcher.quiet_stderr import without_tracebacks

    try:
        with contextlib.nullcontext() if verbose else without_tracebacks():
            result = run(argv)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted: nothing published", file=sys.stderr)
        return 130
    except Exception as e:  # the job failed: one line, the cause, and where to look
        if verbose:
            raise
        print(f"error: build failed: {_root_cause(e)} (run with --verbose for the traceback)",
              file=sys.stderr)
        return exit_status(e)
    return EXIT_OK if result.status in ("published", "up_to_date", "submitted") else EXIT_RETRY


def exit_status(e):
    """A failed build's status: 3 when running it again would fail the same way, else 1."""
    if isinstance(e, RetryWontHelp):
        return EXIT_NO_RETRY
    text = str(e)
    if any(f"{name}: " in text for name in NO_RETRY_NAMES):  # raised in the job
        return EXIT_NO_RETRY
    return EXIT_RETRY


def console(argv=None):
    """`python -m beam_pipeline`, the console script and the Flex Template: main(), then exit.

    After a --transform build has published, interpreter teardown with TensorFlow's and
    tensorflow-transform's C++ threads still running segfaults (exit 139, seen every time
    with configs/local.yaml). Everything is written by then, so flush and skip the teardown,
    but only when this call loaded TensorFlow: a process that had it before (a test runner)
    exits as usual.
    """
    # lazy: `--help` answers before the launcher (Beam) loads
    from beam_pipeline.launcher import time_bound

    loaded_before = "tensorflow" in sys.modules  # e.g. a test runner calling this in-process
    code = main(argv)
    # Past --max_hours a hung worker thread may never end: exit without waiting for it.
    if ("tensorflow" in sys.modules and not loaded_before) or time_bound.expired.is_set():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def _root_cause(e):
    """The innermost message of a Beam-wrapped worker exception, on one line."""
    text = str(e)
    if "Channel closed prematurely" in text or "Worker subprocess exited" in text:
        return "a Beam worker process died mid-job (killed, or out of memory?)"
    for marker in ("ErrorRateExceeded: ", "PublishRefused: ", "LockLost: ",
                   "StorageUnavailable: ", "TimeBoundExceeded: "):
        if marker in text:
            return text.split(marker)[-1].splitlines()[0].split(" [while running")[0]
    lines = [l.strip() for l in text.strip().splitlines() if l.strip()]
    return (lines[-1] if lines else type(e).__name__).split(" [while running")[0]
