"""``omnigraph`` as a subprocess, for tests that signal it and check what it leaves behind."""

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import ROOT

EXE = str(Path(sys.executable).parent / "omnigraph")


def omnigraph(args, signals=(), env_extra=None, timeout=300, after_signal_s=None):
    """Run the CLI; ``signals``: (condition, signal) pairs, each sent once its condition holds (in order). Returns
    (code, stdout, stderr, seconds from the first signal to the exit, descendants still alive, all it had). A run
    still going after ``timeout`` seconds (or ``after_signal_s`` after the first signal) is killed with its
    descendants, and the test fails."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", **(env_extra or {})}
    p = subprocess.Popen([EXE, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc, seen, todo, first = psutil.Process(p.pid), set(), list(signals), None
    start = time.monotonic()
    while p.poll() is None and time.monotonic() - start < timeout:
        try:
            seen |= {c.pid for c in proc.children(recursive=True)}
        except psutil.Error:
            pass
        if todo and todo[0][0]():
            p.send_signal(todo.pop(0)[1])
            if first is None and after_signal_s is not None:
                timeout = min(timeout, time.monotonic() - start + after_signal_s)
            first = first or time.monotonic()
        time.sleep(0.1)
    ended = time.monotonic()
    if p.poll() is None:
        for pid in [p.pid, *seen]:
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
        _, err = p.communicate(timeout=60)
        never = " and never signalled" if todo and first is None else ""
        pytest.fail(f"still running after {timeout:.0f} s{never}: omnigraph {' '.join(args)}\n{err[-3000:]}")
    out, err = p.communicate(timeout=60)
    deadline, alive = time.monotonic() + 15, list(seen)
    while alive and time.monotonic() < deadline:
        alive = [q for q in seen if psutil.pid_exists(q) and psutil.Process(q).status() != "zombie"]
        time.sleep(0.3)
    return p.returncode, out, err, (ended - first) if first else None, alive, seen
