"""Starting and stopping the local Ray cluster a run owns: plainly, or with warm workers (:mod:`.warm`).

Plain is ``ray.init(address="local")``. With warm workers the head node is started here, through the same
``ray._private.node.Node`` that ``ray.init`` uses (Ray is pinned at 2.60.0), because only that takes a
``worker_path``: Ray's worker program becomes :mod:`.warm_launch`. Two settings differ from ``ray.init``'s:
no workers are prestarted when the driver connects (each would ask the warm server for a fork before its
imports are done, and a fork is fast anyway), and no autoscaler monitor process (a local cluster of fixed
size; it cost a third of a CPU-second of the start).
"""

from __future__ import annotations

import ray

from .warm import LAUNCHER, WarmServer

INIT = {"logging_level": "ERROR", "log_to_driver": True, "configure_logging": False}


def start_local(warm: WarmServer | None):
    """Start a local cluster and connect to it; returns the head node when this module started it (warm
    workers), else None (``ray.init`` owns it)."""
    if warm is None:
        ray.init(address="local", include_dashboard=False, **INIT)
        return None
    from ray._private.node import Node
    from ray._private.parameter import RayParams
    params = RayParams(include_dashboard=False, no_monitor=True, worker_path=LAUNCHER, env_vars=warm.env(),
                       _system_config={"prestart_worker_first_driver": False})
    node = Node(params, head=True, shutdown_at_exit=True, spawn_reaper=True, ray_init_cluster=True)
    try:
        ray.init(address=node.address, **INIT)
    except BaseException:
        stop_node(node)
        raise
    return node


def stop_node(node) -> None:
    """Stop a head node :func:`start_local` started (after ``ray.shutdown()``)."""
    if node is None:
        return
    try:
        node.destroy_external_storage()
    finally:
        node.kill_all_processes(check_alive=False, allow_graceful=True)
