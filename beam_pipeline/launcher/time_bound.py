"""--max_hours for runs the launcher waits for (local, cron, Flink/Spark in process).

On Dataflow the service cancels a job past the bound (runner.bound_runtime); a local build
runs in the launcher, so the launcher bounds itself: a hung build would otherwise hold the
root's lock for ever, and every later night would exit 2 behind it.

At the bound, SIGALRM raises TimeBoundExceeded in the main thread, wherever it waits (a
listing, the job, a lock held by another build with --wait): the run unwinds, its lock is
released and the CLI exits 1 with one line. Should the main thread not get back to Python
within GRACE seconds (a C call that never returns), a watchdog thread prints the same
line, releases the lock and ends the process (exit 1).
"""

import contextlib
import os
import signal
import sys
import threading

GRACE = 30.0  # seconds the main thread has to unwind before the watchdog ends the process
expired = threading.Event()  # set once a bound was reached (cli.console then exits at once)


class TimeBoundExceeded(RuntimeError):
    """The run went past --max_hours: stopped, nothing published (exit 1)."""


def message(hours):
    return (f"stopped after --max_hours {hours:g} ({hours * 3600:.0f} s); nothing published, "
            "the root's lock released (a hung input, or a bound too tight for this build?)")


@contextlib.contextmanager
def bounded(hours, release=lambda: None, grace=GRACE):
    """Run the body within `hours` (0: unbounded). `release()` frees the root's lock if
    the watchdog must end the process. Only in the main thread (signals go there)."""
    if not hours or threading.current_thread() is not threading.main_thread():
        yield
        return
    line = message(hours)

    def on_alarm(signum, frame):
        expired.set()
        raise TimeBoundExceeded(line)

    def hard_stop():
        print(f"error: build failed: {line}", file=sys.stderr, flush=True)
        with contextlib.suppress(Exception):
            release()
        os._exit(1)

    previous = signal.signal(signal.SIGALRM, on_alarm)
    watchdog = threading.Timer(hours * 3600 + grace, hard_stop)
    watchdog.daemon = True
    watchdog.start()
    signal.setitimer(signal.ITIMER_REAL, hours * 3600)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        watchdog.cancel()
