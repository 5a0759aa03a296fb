"""The process Ray's workers are forked from (warm workers, :mod:`.warm`): it imports once what every actor
would import, then forks one child per worker that Ray starts.

Run as ``python -m omnigraph.executors.ray.warm_server SOCKET SPEC`` by the executor, before the local Ray
cluster. ``SPEC`` is JSON: ``modules`` to import, ``hooks`` (``module:function`` called with the model
folder), ``model_dir``. The socket is listening before anything is imported, so a worker that arrives early
waits in the backlog until the imports are done instead of starting cold.

One request per connection, from :mod:`.warm_launch` (the program Ray runs as its worker): the worker's
argv, environment and working directory, and its standard streams as file descriptors (``SCM_RIGHTS``).
The server forks; the child takes the streams, the environment and the folder, becomes its own process
group (Ray's per-worker clean-up kills a worker's group: never this server's or the driver's), sends its
pid and runs Ray's ``default_worker.py`` as ``__main__``. When the child exits, the server sends its exit
code back on the connection; the launcher exits with it. A launcher that dies (Ray killed it) closes the
connection: the child sees it and exits too.

The server stays single-threaded and starts nothing that a fork would break (no threads, no CUDA, no
OpenMP team): importing modules does not. It exits when the executor's end of its stdin pipe closes (the
driver stopped or died).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import pickle
import random
import runpy
import select
import signal
import socket
import struct
import sys
import threading
import time
import traceback
import warnings

from . import adapter

MAX_MESSAGE = 1 << 24


def default_worker() -> str:
    """The path of Ray's Python worker program (found without importing Ray here: :func:`.adapter.default_worker`)."""
    return adapter.default_worker()


@contextlib.contextmanager
def handling(handlers: dict):
    """Within the block, each signal of ``handlers`` is handled by its handler; the handlers the process had
    before are back when the block ends."""
    previous = {}
    try:
        for sig, handler in handlers.items():
            previous[sig] = signal.signal(sig, handler)
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def preload(spec: dict) -> list[str]:
    """Import ``spec["modules"]``, then call each ``spec["hooks"]`` with the model folder; returns what failed
    (a module that cannot be imported here is simply imported later by the actor that needs it)."""
    failed = []
    for name in spec.get("modules", []):
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - the actor imports it again and reports it there
            failed.append(f"{name}: {type(e).__name__}: {e}")
    for hook in spec.get("hooks", []):
        module, _, attr = hook.partition(":")
        try:
            getattr(importlib.import_module(module), attr)(spec.get("model_dir"))
        except Exception as e:  # noqa: BLE001
            failed.append(f"{hook}: {type(e).__name__}: {e}")
    return failed


def threads() -> list[str]:
    """The names of this process's threads (Linux), the main one first: a library that started one while
    importing (e.g. a BLAS thread pool) is forked without it."""
    try:
        tids = sorted(os.listdir("/proc/self/task"), key=int)
        return [open(f"/proc/self/task/{t}/comm").read().strip() for t in tids]
    except OSError:
        return []


def _receive(conn: socket.socket) -> tuple[tuple, list[int]]:
    head = conn.recv(4, socket.MSG_WAITALL)
    if len(head) != 4:
        raise ConnectionError("the launcher closed before its request")
    n = struct.unpack("!I", head)[0]
    if n > MAX_MESSAGE:
        raise ConnectionError(f"a request of {n} bytes")
    blob, fds, _, _ = socket.recv_fds(conn, n, 3, socket.MSG_WAITALL)
    return pickle.loads(blob), fds


def _child(conn: socket.socket, request: tuple, fds: list[int], worker: str, closing: list[int]) -> None:
    """In the forked child: become the worker Ray asked for. Never returns (it ends the process with
    ``os._exit``): the signal handlers it sets are those of a fresh process, for the rest of its life, in place
    of the server's, which it has no use for."""
    try:
        argv, env, cwd = request
        for fd in closing:
            os.close(fd)
        os.setpgid(0, 0)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for i, fd in enumerate(fds):
            os.dup2(fd, i)
            os.close(fd)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        random.seed()                     # a fresh process draws its own seed; a fork would repeat the server's
        os.environ["OMNIGRAPH_WARM_WORKER"] = "1"
        conn.sendall(struct.pack("!i", os.getpid()))
        threading.Thread(target=_exit_with, args=(conn,), daemon=True, name="omnigraph-warm-watch").start()
        sys.argv = [worker, *argv]
        runpy.run_path(worker, run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - a worker that could not start: say why, in its own log
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _exit_with(conn: socket.socket) -> None:
    """The child's watch on its launcher: when the launcher is gone (killed by Ray), so is the worker."""
    try:
        while conn.recv(64):
            pass
    except OSError:
        pass
    os._exit(1)


def serve(path: str, spec: dict) -> None:
    # Python 3.12 warns at every fork of a process with threads; the ones a library starts as it loads (a BLAS
    # thread pool, jemalloc's purging thread) register fork handlers, and the ready file names them ("threads")
    warnings.filterwarnings("ignore", message=r".*is multi-threaded, use of fork\(\) may lead to deadlocks",
                            category=DeprecationWarning)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path + ".tmp")
    os.rename(path + ".tmp", path)
    server.listen(256)
    t0 = time.perf_counter()
    failed = preload(spec)
    ready = {"ready_s": round(time.perf_counter() - t0, 3), "failed": failed, "threads": threads(),
             "modules": sorted(m for m in sys.modules if "." not in m)}
    with open(path + ".ready", "w") as f:
        json.dump(ready, f)
    worker = default_worker()
    children: dict[int, socket.socket] = {}
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    parent = sys.stdin.fileno()
    with handling({signal.SIGCHLD: lambda *_: os.write(wake_w, b"."), signal.SIGTERM: lambda *_: sys.exit(0)}):
        while True:
            try:
                readable, _, _ = select.select([server, wake_r, parent], [], [])
            except InterruptedError:
                continue
            if parent in readable and not os.read(parent, 64):
                return                                    # the executor is gone: so is this server
            if wake_r in readable:
                os.read(wake_r, 4096)
                _reap(children)
            if server in readable:
                conn, _ = server.accept()
                try:
                    request, fds = _receive(conn)
                except (OSError, ConnectionError, pickle.UnpicklingError, ValueError, EOFError):
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    _child(conn, request, fds, worker,
                           [server.fileno(), wake_r, wake_w, parent, *(c.fileno() for c in children.values())])
                for fd in fds:
                    os.close(fd)
                children[pid] = conn


def _reap(children: dict[int, socket.socket]) -> None:
    """Every child that exited: its exit code to its launcher."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall(struct.pack("!i", os.waitstatus_to_exitcode(status)))
            except OSError:
                pass
            conn.close()


def main() -> None:
    path, spec = sys.argv[1], json.loads(sys.argv[2])
    try:
        serve(path, spec)
    finally:
        for p in (path, path + ".ready"):
            try:
                os.unlink(p)
            except OSError:
                pass


if __name__ == "__main__":
    main()
