"""Keep Python tracebacks that Beam's workers print off the terminal, so a failed build is
the one line `cli.main` prints.

Beam's SDK worker prints every failed instruction's traceback to stderr itself
(`print(traceback_string, file=sys.stderr)` in sdk_worker.py), whatever the logging level:
with configs/local.yaml's worker threads a build over --max_error_rate printed 92-109 lines
before its one-line error; worker processes inherit the same descriptor and print theirs.
So, unless --verbose, file descriptor 2 goes through a pipe for the whole run, and a thread
passes on every line except traceback blocks (the header, the indented frames, the
exception line and the chaining lines between blocks). Warnings still show, as they come.
"""

import contextlib
import os
import sys
import threading

_HEADER = "Traceback (most recent call last):"
_CHAINING = ("During handling of the above exception, another exception occurred:",
             "The above exception was the direct cause of the following exception:")


class TracebackFilter:
    """Line by line: is this line part of a traceback block? (pure; fed in order)"""

    def __init__(self):
        self.state = "text"  # text | frames (inside a block) | after (just after a block)

    def keep(self, line):
        text = line.rstrip("\n")
        if text.startswith(_HEADER):
            self.state = "frames"
            return False
        if self.state == "frames":
            if text.startswith(" ") or not text:
                return False
            self.state = "after"  # the exception line ends the block
            return False
        if self.state == "after":
            if not text.strip() or text in _CHAINING:
                return False
            self.state = "text"
        return True


@contextlib.contextmanager
def without_tracebacks():
    """Filter file descriptor 2 (this process's and its children's) inside the block."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
        read_end, write_end = os.pipe()
    except (OSError, ValueError, AttributeError):  # no real descriptor 2 (embedded, tests)
        yield
        return
    os.dup2(write_end, 2)
    os.close(write_end)
    thread = threading.Thread(target=_pump, args=(read_end, saved), daemon=True,
                              name="stderr-filter")
    thread.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # the pipe's last writer here is gone; children have exited
        thread.join(timeout=5)
        if not thread.is_alive():  # else a lingering child still writes through it
            os.close(saved)


def _pump(read_end, out):
    keep = TracebackFilter().keep
    with os.fdopen(read_end, "r", errors="replace", newline="") as lines:
        for line in lines:
            if keep(line):
                os.write(out, line.encode(errors="replace"))
