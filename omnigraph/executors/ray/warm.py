"""Warm workers: the actors of a local cluster start with torch and their nodes' code already imported.

Each Ray actor is a new Python process, and each imported torch and transformers anew: on the tiny model
that was 3.3 CPU-seconds per actor, about half of the start-up, paid after Ray itself had started (2-3 s).
With ``runtime.warm_workers`` (default on) the executor instead

1. starts a *warm server* (:mod:`.warm_server`) first, which imports once, while Ray starts beside it, what
   the plan's actors will import: torch, each backend's module, and what each backend's ``warm`` hook names
   (the model's architecture code, :attr:`omnigraph.sdk.Backend.warm`);
2. starts the local Ray cluster with :mod:`.warm_launch` as Ray's worker program: each worker Ray starts asks
   the server for a fork of itself, which runs Ray's own worker from there (the imports are done, and their
   pages are shared by every actor of the host).

So the imports happen once, in parallel with Ray's start, instead of once per actor after it. A fork is a
fresh process in everything Ray and the nodes see: its own process group, environment, folder, standard
streams and seeds; the actor still sets its threads and cores (``ray_actor``). What a fork cannot share
safely is kept out: the server starts no threads and no GPU context, and a plan with a backend whose imports
would (``warm=False``: vLLM, which binds OpenMP to its cores as it loads) starts its workers cold, as before.

Only on Linux, only for a cluster the executor starts itself (``--address`` joins one whose workers it does
not start), and not under ``LD_PRELOAD`` (see ``RayExecutor.start``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ... import plugins

LAUNCHER = str(Path(__file__).with_name("warm_launch.py"))
READY_TIMEOUT_S = 600.0


def preload_spec(plan, model_dir) -> dict | None:
    """What the warm server imports for ``plan``: ``{"modules", "hooks", "model_dir"}``, or None when a backend
    of the plan refuses warm workers (``Backend.warm = False``)."""
    modules, hooks = ["torch"], []
    for node in plan.graph.nodes.values():
        if node.kind == "custom":
            continue                        # a user's class: its module's import may do anything; the actor does it
        backend = plugins.backend(node.kind, node.backend)
        if backend.warm is False:
            return None
        modules.append(backend.impl.partition(":")[0])
        if isinstance(backend.warm, str):
            hooks.append(backend.warm)
    return {"modules": list(dict.fromkeys(modules)), "hooks": list(dict.fromkeys(hooks)),
            "model_dir": str(model_dir) if model_dir else None}


class WarmServer:
    """The warm server process of one executor (started before Ray, stopped after it)."""

    def __init__(self, spec: dict, env: dict[str, str] | None = None):
        self.folder = tempfile.mkdtemp(prefix="omnigraph-warm-")
        self.socket = os.path.join(self.folder, "server.sock")
        env = dict(os.environ) | (env or {})
        # As Ray's own workers get it (the actors set theirs when they start): OpenMP reads it when torch loads.
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        # its own session: a Ctrl-C in the terminal is the driver's to handle; a closed stdin pipe ends it
        self.proc = subprocess.Popen([sys.executable, "-m", "omnigraph.executors.ray.warm_server", self.socket,
                                      json.dumps(spec)], stdin=subprocess.PIPE, env=env, start_new_session=True,
                                     cwd=os.getcwd())

    def ready(self, timeout: float = READY_TIMEOUT_S) -> dict:
        """Wait until the server's imports are done: ``{"ready_s", "failed", "modules"}``, or {} if it died."""
        deadline = time.monotonic() + timeout
        path = self.socket + ".ready"
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                return json.loads(Path(path).read_text())
            except (OSError, ValueError):
                time.sleep(0.05)
        return {}

    def env(self) -> dict[str, str]:
        """For the raylet's environment (its workers inherit it): where the launcher finds the server."""
        return {"OMNIGRAPH_WARM_SOCKET": self.socket}

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()             # the server's signal to go
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for name in os.listdir(self.folder) if os.path.isdir(self.folder) else []:
            try:
                os.unlink(os.path.join(self.folder, name))
            except OSError:
                pass
        try:
            os.rmdir(self.folder)
        except OSError:
            pass
