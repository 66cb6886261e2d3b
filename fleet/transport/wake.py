"""The main thread never waits without a bound, so Ctrl-C always stops fleet at once.

Python runs signal handlers in the main thread only, at its next byte code; the kernel may
hand the process's SIGINT to any thread that does not block it (a worker, paramiko's
transport thread). A main thread blocked in an unbounded lock, event or channel wait would
see that Ctrl-C only when the wait ends: when a host answers, minutes later in a long
command. So it waits in steps of ``WAKE_S``; other threads may wait as long as they like.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

WAKE_S = 0.2


def wait_step(deadline: float | None) -> float | None:
    """How long the calling thread may block now, given an absolute ``deadline``
    (``time.monotonic()``; None: none): at most ``WAKE_S`` in the main thread; ``<= 0``
    once the deadline has passed."""
    left = None if deadline is None else deadline - time.monotonic()
    if threading.current_thread() is not threading.main_thread():
        return left
    return WAKE_S if left is None else min(WAKE_S, left)


def steps(deadline: float | None) -> Iterator[float | None]:
    """The waits that make up one wait until ``deadline`` (see :func:`wait_step`), for a
    loop that blocks for each in turn until what it waits for comes; once the deadline
    has passed, :class:`TimeoutError`."""
    while True:
        step = wait_step(deadline)
        if step is not None and step <= 0:
            raise TimeoutError()
        yield step
