"""Stop requests during ``omnigraph run``: Ctrl-C, SIGTERM, a scheduler's early warning.

Clusters end jobs by signal (Slurm sends SIGTERM, or ``--signal=USR1@120`` ahead of the limit;
Kubernetes sends SIGTERM and waits a grace period). Under :func:`deferred` each of SIGINT, SIGTERM
and ``runtime.preempt_signal`` is a *preemption*:

- the first one records the request (and says so on stderr); the executor submits no new step, the
  steps in flight finish, the supervisor writes a checkpoint and raises :class:`Preempted`
  (``omnigraph run`` exits with :data:`EXIT_PREEMPTED` and prints the command that continues);
- if that takes longer than ``runtime.grace_s``, or a second signal comes, KeyboardInterrupt is raised
  at once, wherever the main thread is (a step that hangs): the graph is torn down, the last
  checkpoint stands.

Python's own SIGINT handler would raise KeyboardInterrupt in whatever Python code the main thread runs
next: that can be a finalizer (Ray's compiled-graph refs run Python code in ``__del__``) where Python
prints the exception and drops it, so the first signal only sets a flag that the supervisor polls.
``ray.init`` installs its own SIGTERM handler (it exits the process): :func:`reinstall` puts ours back
once the executor has started.

Without :func:`deferred` (``run()`` called from Python), :func:`requested` stays False and the signals
behave as the process had them.

>>> with deferred():
...     signal.raise_signal(signal.SIGINT)
...     requested()
'SIGINT'
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path
from typing import Iterator

EXIT_PREEMPTED = 75
"""``omnigraph run``'s exit code after a preemption with its checkpoint (EX_TEMPFAIL: try again)."""
EXIT_STOPPED = 130
"""After a stop at once (second signal, or the grace period ran out): the last checkpoint stands."""

_requested: str | None = None
_active: dict | None = None             # the signals deferred() handles, and its grace period
_timer: threading.Timer | None = None


class Preempted(Exception):
    """A stop request was honoured: the steps up to ``step`` are done and ``checkpoint`` holds them."""

    def __init__(self, signame: str, run_dir: Path, step: int | None, checkpoint: str | None, steps: int):
        self.signame, self.run_dir, self.step, self.checkpoint, self.steps = signame, run_dir, step, checkpoint, steps
        super().__init__(f"preempted by {signame}")


class Stopped(KeyboardInterrupt):
    """Stopped at once (second signal, grace period over): ``checkpoint`` is the newest one kept."""

    def __init__(self, run_dir: Path, checkpoint: str | None):
        self.run_dir, self.checkpoint = run_dir, checkpoint
        super().__init__("stopped at once")


def requested() -> str | None:
    """The name of the signal that asked the run to stop, or None."""
    return _requested


def _at_once() -> None:
    os.write(2, b"interrupt: the grace period (runtime.grace_s) is over: stopping at once\n")
    signal.raise_signal(signal.SIGINT)     # the second-signal path, in the main thread


def _handler(signum, frame) -> None:
    global _requested, _timer
    if _requested:
        raise KeyboardInterrupt
    _requested = signal.Signals(signum).name
    grace = _active["grace_s"] if _active else 60.0
    os.write(2, f"interrupt: {_requested}: finishing the steps in flight, then a checkpoint (within {grace:g} s; "
                f"{_requested} again stops at once)\n".encode())    # not print(): may be inside a write to stderr
    _timer = threading.Timer(grace, _at_once)
    _timer.daemon = True
    _timer.start()


def reinstall() -> None:
    """Put the handlers back (``ray.init`` replaces SIGTERM's); a no-op outside :func:`deferred`."""
    if _active is not None and threading.current_thread() is threading.main_thread():
        for s in _active["signals"]:
            if signal.getsignal(s) is not _handler:
                signal.signal(s, _handler)


@contextlib.contextmanager
def deferred(preempt_signal: str | None = None, grace_s: float = 60.0) -> Iterator[None]:
    """Handle SIGINT, SIGTERM and ``preempt_signal`` (e.g. ``"USR1"``) as stop requests for the block
    (main thread only: elsewhere signals cannot be handled). The handlers are process-wide: each signal's
    previous handler (Python's own, or one ``ray.init`` installed before the block) is put back when the block
    ends, however it ends; a grace timer still running is cancelled; :func:`reinstall` acts only within it."""
    global _requested, _active, _timer
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = [signal.SIGINT, signal.SIGTERM] + ([signal.Signals[f"SIG{preempt_signal}"]] if preempt_signal else [])
    previous = {}
    try:
        for s in signals:
            previous[s] = signal.signal(s, _handler)
        _active = {"signals": signals, "grace_s": grace_s}
        yield
    finally:
        if _timer is not None:
            _timer.cancel()
        for s, h in previous.items():
            signal.signal(s, h)
        _requested, _active, _timer = None, None, None
