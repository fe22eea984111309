"""Ordered read-ahead: results in the items' order while later ones are read, within a bound.

The shard writer (job/inputs.py), commit's catalog merge (store/catalog.py) and the
launcher's hashing of new inputs all read many small things whose latency (a gs:// GET:
~30-80 ms) dwarfs their transfer, and all must hand them on in order. Each had its own
loop over a deque of futures; this is that loop once, bounded in count and in bytes.
"""

import collections
import concurrent.futures


def ordered(items, start, depth, max_bytes=None, size=None):
    """Yield (item, started.result()) in the order of `items`, with up to `depth` started
    and not yet yielded, and, given `max_bytes`, at most that many bytes of size(item)
    among them (or one item, when a single one is larger).

    `start(item)` begins reading and returns anything with result(): a Future from a
    thread pool, or a handle that does its work when asked (job/inputs.py's local reads,
    which cost less than a thread hand-off). Memory: what the started items hold.
    """
    pending, in_flight = collections.deque(), 0
    for item in items:
        cost = size(item) if max_bytes is not None else 0
        while pending and (len(pending) >= depth
                           or (max_bytes is not None and in_flight + cost > max_bytes)):
            done, started, done_cost = pending.popleft()
            in_flight -= done_cost
            yield done, started.result()
        pending.append((item, start(item), cost))
        in_flight += cost
    while pending:
        done, started, _ = pending.popleft()
        yield done, started.result()


def threaded(items, read, threads, depth=None):
    """Yield (item, read(item)) in order, `threads` reads running at once and up to `depth`
    (default: `threads`) submitted ahead of the one yielded. The pool lives as long as the
    iteration; an exception from read() is raised when its item's turn comes."""
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        yield from ordered(items, lambda item: pool.submit(read, item), depth or threads)
