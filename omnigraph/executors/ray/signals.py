"""Sleeping waiters: named pipes that keep Compiled Graphs' busy-polling off the CPU.

A Compiled Graph reader waits for its channel by spinning (``sched_yield`` in
``PlasmaObjectHeader::ReadAcquire``): a driver blocked in ``get`` burns about
a core and an idle actor 27-73% of one. On a small host that spinning steals
the cores the nodes need, and the overlap of one-step-off disappears.

So no waiter of ours reads a channel before its value is (nearly) there:

- before a task that reads a value made on another actor, the executor
  inserts a *wait* task on the consumer's actor that sleeps in ``select`` on
  a named pipe until the producer task writes one byte to it, which it does
  right after computing (even when it failed, so nobody waits forever);
- the driver sleeps on one pipe per actor, written by each actor's last task
  of the step, before it reads the step's results.

The channel read that follows finds the value written, or about to be, and
spins for microseconds instead of the whole step. Pipes work between
processes of one host; across hosts the executor falls back to Ray's own
waiting.

>>> import tempfile
>>> box = Signals(tempfile.mkdtemp())
>>> box.create(["a"])
>>> box.signal("a"); box.wait("a", timeout=1.0)
True
"""

from __future__ import annotations

import os
import select
import shutil
import tempfile
import time


def signal_dir() -> str:
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    return tempfile.mkdtemp(prefix="omnigraph-signals-", dir=base)


class Signals:
    def __init__(self, directory: str):
        self.dir = directory
        self._fds: dict[str, int] = {}

    def create(self, names: list[str]) -> None:
        """Make the pipes (the driver does this once, before any actor starts)."""
        for name in names:
            os.mkfifo(os.path.join(self.dir, name))

    def _fd(self, name: str) -> int:
        fd = self._fds.get(name)
        if fd is None:
            # O_RDWR: opening never blocks, and the pipe stays open even with no peer yet
            fd = os.open(os.path.join(self.dir, name), os.O_RDWR | os.O_NONBLOCK)
            self._fds[name] = fd
        return fd

    def signal(self, name: str) -> None:
        os.write(self._fd(name), b"x")

    def wait(self, name: str, timeout: float | None) -> bool:
        """Sleep until one signal arrives (True) or ``timeout`` seconds pass (False)."""
        fd = self._fd(name)
        while True:
            try:
                os.read(fd, 1)
                return True
            except BlockingIOError:
                pass
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                return False

    def wait_all(self, names: list[str], timeout: float | None) -> list[str]:
        """Wait for one signal on each pipe; return the names still silent after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        missing = []
        for name in names:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self.wait(name, left):
                missing.append(name)
        return missing

    def close(self) -> None:
        for fd in self._fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds.clear()

    def remove(self) -> None:
        self.close()
        shutil.rmtree(self.dir, ignore_errors=True)
