"""A Ray cluster of several nodes on this machine, for tests, benchmarks and trying ``--address``.

Each node is a raylet of its own, started as on a real cluster: the head with
``ray start --head`` and every other node with ``ray start --address``, each
with its own CPUs and node labels (``pools.<name>.labels`` places pools on
them). Nothing here imports Ray: it drives the ``ray`` command.

Every process of the cluster carries the cluster's own temporary folder in
its command line, so :meth:`LocalCluster.stop` ends exactly those (never
another Ray on the machine, which ``ray stop`` would), and
:meth:`LocalCluster.kill_node` ends one node at once (its raylet, its object
store, its workers and agents) the way a lost host would::

    with LocalCluster() as c:
        c.add_node("a", cpus=1)                 # the head, labelled omnigraph/node=a
        c.add_node("b", cpus=1)
        omnigraph run graph.yaml --address <c.address>
        c.kill_node("b"); c.add_node("b", cpus=1)   # a replacement joins under the same name and label
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LABEL = "omnigraph/node"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray() -> str:
    exe = Path(sys.executable).with_name("ray")
    return str(exe) if exe.exists() else (shutil.which("ray") or "ray")


class LocalCluster:
    def __init__(self) -> None:
        # short: the raylet's unix socket path must stay under ~100 characters
        self.root = Path(tempfile.mkdtemp(prefix="ogc-", dir="/tmp"))
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.nodes: dict[str, set[int]] = {}
        """Node name -> the processes its ``ray start`` left running (its workers are their children)."""
        self.dead: set[str] = set()
        # a raylet starved for CPU on a small loaded machine (a test suite beside it) must not be declared dead:
        # 10 missed health checks of 3 s (Ray's default is 5), a node killed on purpose is still seen at once
        # by its actors' callers
        self.env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
                    "RAY_health_check_failure_threshold": "10"}

    def add_node(self, name: str, cpus: float = 1, labels: dict[str, str] | None = None, gpus: float = 0,
                 timeout_s: float = 120.0) -> None:
        """Start node ``name`` (the first one is the head) labelled ``omnigraph/node=<name>`` plus ``labels``,
        and wait until the cluster counts it alive."""
        labels = {LABEL: name, **(labels or {})}
        args = [_ray(), "start", f"--num-cpus={cpus:g}", f"--num-gpus={gpus:g}", "--disable-usage-stats",
                "--labels=" + ",".join(f"{k}={v}" for k, v in labels.items()), f"--temp-dir={self.root}"]
        if not self.nodes:
            args += ["--head", f"--port={self.port}", "--include-dashboard=false"]
        else:
            args += [f"--address={self.address}"]
        before = set(self._pids(self._ours))
        done = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0:
            raise RuntimeError(f"ray start for node {name} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        self.nodes[name] = set(self._pids(self._ours)) - before     # its raylet, agents and log monitor
        self.dead.discard(name)
        self.wait_alive(len(set(self.nodes) - self.dead), timeout_s)

    def wait_alive(self, n: int, timeout_s: float = 120.0) -> None:
        """Until the cluster counts ``n`` live nodes (asked in a child process: this one stays free of Ray)."""
        code = ("import sys, time, ray\n"
                f"ray.init(address={self.address!r}, logging_level='ERROR')\n"
                f"deadline = time.monotonic() + {timeout_s}\n"
                f"while sum(x['Alive'] for x in ray.nodes()) != {n}:\n"
                "    if time.monotonic() > deadline: sys.exit(3)\n"
                "    time.sleep(0.25)\n")
        # the cluster's folder on its command line makes it one of the cluster's processes: stop() ends it too
        # (left behind by a stopped cluster, its Ray client spun at 100% of a core until its deadline)
        done = subprocess.run([sys.executable, "-c", code, str(self.root)], env=self.env, capture_output=True,
                              text=True, timeout=timeout_s + 60)
        if done.returncode != 0:
            raise RuntimeError(f"the local cluster did not reach {n} live nodes within {timeout_s:.0f} s"
                               + (f": {done.stderr[-1500:]}" if done.returncode != 3 else ""))

    def kill_node(self, name: str) -> int:
        """End every process of node ``name`` at once (SIGKILL), as a lost host; returns how many."""
        n = self._kill_tree(self.nodes[name])
        self.dead.add(name)
        return n

    def stop(self) -> None:
        roots = set().union(*self.nodes.values()) if self.nodes else set()
        self._kill_tree(roots | set(self._pids(self._ours)))
        shutil.rmtree(self.root, ignore_errors=True)

    def _kill_tree(self, roots: set[int]) -> int:
        """SIGKILL ``roots`` and all their descendants (Ray renames its workers and agents, ``ray::IDLE``:
        they are found by parentage, not by name)."""
        parents = self._parents()
        doomed, grew = set(roots), True
        while grew:
            more = {p for p, pp in parents.items() if pp in doomed} - doomed
            doomed |= more
            grew = bool(more)
        for pid in doomed:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        return len(doomed)

    def _ours(self, cmd: str) -> bool:
        """A process of this cluster by its command line: the temporary folder, or the head's port."""
        return str(self.root) in cmd or f":{self.port} " in cmd + " "

    @staticmethod
    def _pids(match) -> list[int]:
        out = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if match(cmd):
                out.append(int(pid))
        return out

    @staticmethod
    def _parents() -> dict[int, int]:
        out = {}
        for pid in os.listdir("/proc"):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                out[int(pid)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
        return out

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
