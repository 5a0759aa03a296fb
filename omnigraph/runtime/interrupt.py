"""Ctrl-C during ``omnigraph run``: a request to stop at the next clean point, then stop at once.

Python's own SIGINT handler raises KeyboardInterrupt in whatever Python code the main thread runs
next. That can be a finalizer (Ray's compiled-graph refs run Python code in ``__del__`` after every
step) or a callback, where Python prints the exception and drops it: the interrupt is lost and the
run goes on. So ``omnigraph run`` installs :func:`deferred`'s handler instead:

- the first Ctrl-C only records the request (and says so on stderr);
- the supervisor calls :func:`check` between steps and while the actors start, which raises
  KeyboardInterrupt there, and the graph is torn down as for any other error;
- a second Ctrl-C raises KeyboardInterrupt at once, wherever it lands (a step that hangs).

Without :func:`deferred` (``run()`` called from Python), :func:`check` does nothing and Ctrl-C
behaves as Python's default.

>>> with deferred():
...     signal.raise_signal(signal.SIGINT)
...     requested()
True
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Iterator

_requested = False

NOTE = b"interrupt: stopping after this step (Ctrl-C again to stop at once)\n"


def requested() -> bool:
    return _requested


def check() -> None:
    """Raise KeyboardInterrupt when a Ctrl-C has come in since :func:`deferred` began."""
    if _requested:
        raise KeyboardInterrupt


def _handler(signum, frame) -> None:
    global _requested
    if _requested:
        raise KeyboardInterrupt
    _requested = True
    os.write(2, NOTE)           # not print(): the main thread may be inside a write to sys.stderr


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Install the handler for the block (main thread only: elsewhere signals cannot be handled)."""
    global _requested
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, _handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        _requested = False
