"""Starting and stopping the local Ray cluster a run owns: plainly, or with warm workers (:mod:`.warm`).

Plain is ``ray.init(address="local")``. With warm workers the head node is started here, through the same
``ray._private.node.Node`` that ``ray.init`` uses (behind :mod:`.adapter`, checked against the Ray versions it
was written for), because only that takes a ``worker_path``: Ray's worker program becomes :mod:`.warm_launch`,
told where Ray's own is (:func:`.adapter.worker_env`). Two settings differ from ``ray.init``'s:
no workers are prestarted when the driver connects (each would ask the warm server for a fork before its
imports are done, and a fork is fast anyway), and no autoscaler monitor process (a local cluster of fixed
size; it cost a third of a CPU-second of the start).
"""

from __future__ import annotations

import ray

from . import adapter
from .warm import LAUNCHER, WarmServer

INIT = {"logging_level": "ERROR", "log_to_driver": True, "configure_logging": False}


def start_local(warm: WarmServer | None):
    """Start a local cluster and connect to it; returns the head node when this module started it (warm
    workers), else None (``ray.init`` owns it)."""
    if warm is None:
        ray.init(address="local", include_dashboard=False, **INIT)
        return None
    node = adapter.start_head(LAUNCHER, warm.env() | adapter.worker_env())
    try:
        ray.init(address=node.address, **INIT)
    except BaseException:
        stop_node(node)
        raise
    return node


def stop_node(node) -> None:
    """Stop a head node :func:`start_local` started (after ``ray.shutdown()``)."""
    if node is not None:
        adapter.stop_head(node)
