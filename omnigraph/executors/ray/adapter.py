"""Ray's private and internal parts that omnigraph uses, in one place (the pattern of
:mod:`omnigraph.sdk.adapters`; Ray may be imported only in the Ray executors and the transports, so its
adapter is here).

- ``ray._private.node.Node`` and ``ray._private.parameter.RayParams`` (:func:`start_head`, :func:`stop_head`):
  the head node ``ray.init`` starts, started here because only these take a ``worker_path`` (the warm
  workers' launcher), ``no_monitor`` and the system config ``prestart_worker_first_driver``;
- ``ray/_private/workers/default_worker.py`` (:func:`default_worker`): the program Ray runs for each Python
  worker, which a warm worker runs itself; found by its path, without importing Ray (the warm server and the
  launcher must not). The launcher, a file that imports nothing of omnigraph, gets it from the environment
  variable :data:`WORKER_ENV` (:func:`worker_env`);
- ``ActorHandle._actor_id`` (:func:`actor_id`): the id of the actor behind a handle, which a
  ``RayActorError`` names; handles have no public accessor;
- the logger ``ray.dag.compiled_dag_node`` (:func:`quiet_compiled_dag`): compiled graphs' teardown complains
  there about actors already killed;
- ``CompiledDAG._dag_submitter._closed`` (:func:`compiled_dag_closed`): whether a compiled graph's monitor has
  begun tearing it down (it closes the driver's channels first), which a test's kill waits for.

Ray is imported inside the functions: the warm server imports this module and must not import Ray.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
from typing import Iterator

from ...sdk.adapters import check

SUPPORTED = ">=2.60,<2.61"
"""The Ray versions this adapter was written for (the project pins 2.60.0; ``ray._private`` changes often)."""
WORKER_ENV = "OMNIGRAPH_RAY_WORKER"
"""The environment variable that tells the warm workers' launcher where Ray's worker program is."""
COMPILED_DAG_LOGGER = "ray.dag.compiled_dag_node"
"""The logger of Ray's compiled graphs (a module of Ray's)."""

_version: str | None = None


def check_version() -> str:
    """The installed Ray version, checked once; :class:`~omnigraph.sdk.adapters.UnsupportedVersion` outside
    :data:`SUPPORTED`."""
    global _version
    if _version is None:
        _version = check("Ray", ("ray",), SUPPORTED, __name__, pip=f"pip install 'ray[cgraph]{SUPPORTED}'")
    return _version


def start_head(worker_path: str, env_vars: dict[str, str]):
    """Start a local head node as ``ray.init`` would, except: ``worker_path`` as Ray's worker program, ``env_vars``
    in the raylet's environment (its workers inherit it), no dashboard, no autoscaler monitor and no workers
    prestarted when the driver connects. Returns the node (its ``address`` is what ``ray.init`` joins)."""
    check_version()
    from ray._private.node import Node
    from ray._private.parameter import RayParams
    params = RayParams(include_dashboard=False, no_monitor=True, worker_path=worker_path, env_vars=env_vars,
                       _system_config={"prestart_worker_first_driver": False})
    return Node(params, head=True, shutdown_at_exit=True, spawn_reaper=True, ray_init_cluster=True)


def stop_head(node) -> None:
    """Stop a node :func:`start_head` started, and every process it started (after ``ray.shutdown()``)."""
    check_version()
    try:
        node.destroy_external_storage()
    finally:
        node.kill_all_processes(check_alive=False, allow_graceful=True)


def default_worker() -> str:
    """The path of Ray's Python worker program (found without importing Ray)."""
    check_version()
    spec = importlib.util.find_spec("ray")
    return os.path.join(os.path.dirname(spec.origin), "_private", "workers", "default_worker.py")


def worker_env() -> dict[str, str]:
    """For the environment of a cluster's workers: where the warm workers' launcher finds Ray's worker program."""
    return {WORKER_ENV: default_worker()}


def actor_id(handle) -> str:
    """The hex id of the actor behind ``handle`` (as ``RayActorError.actor_id`` gives it)."""
    check_version()
    return handle._actor_id.hex()


@contextlib.contextmanager
def quiet_compiled_dag() -> Iterator[None]:
    """Within the block, Ray's compiled-graph logger reports only critical records; its level is back after."""
    logger = logging.getLogger(COMPILED_DAG_LOGGER)
    level, logger.level = logger.level, logging.CRITICAL
    try:
        yield
    finally:
        logger.setLevel(level)


def compiled_dag_closed(compiled) -> bool:
    """Whether the driver's input channels of ``compiled`` (a ``CompiledDAG``) are closed: its monitor tears the
    graph down, closing them first, once one of its actors died; the next ``execute`` raises ``RayChannelError``."""
    submitter = getattr(compiled, "_dag_submitter", None)
    return submitter is None or bool(getattr(submitter, "_closed", True))
