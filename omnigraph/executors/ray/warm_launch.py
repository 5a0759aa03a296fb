"""The program Ray runs for each worker of a cluster with warm workers (:mod:`.warm`): Ray's ``worker_path``.

Run by the raylet as ``python warm_launch.py <Ray's worker arguments>``, as a file (it imports nothing of
omnigraph: it must start in milliseconds). It asks the warm server (socket ``$OMNIGRAPH_WARM_SOCKET``) for
a fork that runs Ray's worker with these arguments, this environment, this folder and these standard
streams, then stands in for it: the signals Ray sends it go to the worker, and it exits with the worker's
exit code. Without a server (none set, or it is gone) it becomes Ray's ordinary worker itself.
"""

import importlib.util
import os
import pickle
import signal
import socket
import struct
import sys


def _plain_worker() -> None:
    ray = importlib.util.find_spec("ray")
    worker = os.path.join(os.path.dirname(ray.origin), "_private", "workers", "default_worker.py")
    os.execv(sys.executable, [sys.executable, worker, *sys.argv[1:]])


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

    def forward(signum, _frame):
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
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
