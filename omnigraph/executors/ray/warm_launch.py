"""The program Ray runs for each worker of a cluster with warm workers (:mod:`.warm`): Ray's ``worker_path``.

Run by the raylet as ``python warm_launch.py <Ray's worker arguments>``, as a file (it imports nothing of
omnigraph: it must start in milliseconds). It asks the warm server (socket ``$OMNIGRAPH_WARM_SOCKET``) for
a fork that runs Ray's worker with these arguments, this environment, this folder and these standard
streams, then stands in for it: the signals Ray sends it go to the worker, and it exits with the worker's
exit code. Without a server (none set, or it is gone) it becomes Ray's ordinary worker itself, the program
``$OMNIGRAPH_RAY_WORKER`` names (set beside the socket by the executor from :mod:`.adapter`, the one place that
knows where Ray keeps it).
"""

import contextlib
import os
import pickle
import signal
import socket
import struct
import sys


FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
"""The signals the stand-in passes on to its worker."""


def _plain_worker() -> None:
    worker = os.environ.get("OMNIGRAPH_RAY_WORKER")
    if not worker:
        sys.exit("omnigraph warm_launch: OMNIGRAPH_RAY_WORKER (Ray's worker program) is not set: the executor sets it "
                 "with OMNIGRAPH_WARM_SOCKET (omnigraph.executors.ray.adapter.worker_env)")
    os.execv(sys.executable, [sys.executable, worker, *sys.argv[1:]])


@contextlib.contextmanager
def forwarding(child: int):
    """Within the block, each of :data:`FORWARDED` is sent on to process ``child``; the handlers the process had
    before are back when the block ends."""
    def forward(signum, _frame):
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    previous = {}
    try:
        for sig in FORWARDED:
            previous[sig] = signal.signal(sig, forward)
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main() -> None:
    path = os.environ.get("OMNIGRAPH_WARM_SOCKET")
    if not path:
        _plain_worker()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        blob = pickle.dumps((sys.argv[1:], dict(os.environ), os.getcwd()))
        conn.sendall(struct.pack("!I", len(blob)))
        socket.send_fds(conn, [blob], [0, 1, 2])
        head = conn.recv(4, socket.MSG_WAITALL)
    except OSError:
        head = b""
    if len(head) != 4:                  # no server, or it went away before forking: start cold
        conn.close()
        _plain_worker()
    child = struct.unpack("!i", head)[0]
    with forwarding(child):
        while True:
            try:
                code = conn.recv(4, socket.MSG_WAITALL)
                break
            except InterruptedError:
                continue
    status = struct.unpack("!i", code)[0] if len(code) == 4 else 1
    if status < 0:                      # killed by a signal: so is this stand-in, as Ray would see the worker
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    sys.exit(status)


if __name__ == "__main__":
    main()
