"""Weights transports: how ``sync``'s weights reach the generators. One protocol, several paths.

=============  ====================================================================================
path           when, and what crosses the graph's channel
=============  ====================================================================================
``shm``        the CPUs (or GPUs) of one host: the trainer packs the weights into a ``/dev/shm``
               file; only its name crosses, the rollout maps the same pages
``cuda-ipc``   pools sharing one GPU: only a CUDA IPC handle crosses; the receiver copies device
               to device
``nccl``       trainer and rollouts on whole GPUs of their own: a torch.distributed group carries
               the bytes in bounded buckets; the channel carries only their description
``host``       anywhere (a cluster of hosts): one flat buffer in host memory crosses the channel
``channel``    the tensors as they are (CPU or CUDA) cross the channel; in one process (the
               ``local`` executor) the snapshot is handed over as it is
``rdt``        the ``ray-tasks`` executor on CPUs of several hosts: Ray Direct Transport; the
               object store holds a reference, the receivers pull the tensors over gloo
=============  ====================================================================================

Batches (data edges) cross between actors as host tensors through the executor's own channel (``shm`` in
the plan: the compiled graph's shared-memory channel, or the object store for ``ray-tasks``), ``nccl``
when the edge asks, or ``rdt`` (the ``ray-tasks`` executor: Ray Direct Transport over gloo, chosen on a
cluster, where it beat the object store for objects of a few hundred KB and up): :func:`choose_data`.

The compiler chooses the path once per exporter (:func:`choose`): the weights
edge's ``transport`` when it names one (and the placement allows it), else the
fastest the placement allows. ``plan.txt`` prints the choice and every actor
uses exactly that one. Each path is a class registered under the
``omnigraph.transports`` entry-point group (a plugin can add one and name it on
the edge) with two methods (:class:`base.Transport`): ``export`` on the
trainer, ``arrive`` on each receiver.

>>> from omnigraph.testing import canonical_spec
>>> choose(canonical_spec("one_step_off", executor="ray"), "sync")
'shm'
"""

from __future__ import annotations

from .. import plugins
from ..errors import GraphError

BUILT_IN = ("shm", "cuda-ipc", "nccl", "host", "channel", "rdt")
DATA_PATHS = ("shm", "nccl", "rdt")


def choose_data(spec, asked: str, arrow: str) -> str:
    """The path of a data edge's values between actors (the edge ``arrow``, its ``transport`` ``asked``); a
    GraphError names the edge when the path cannot be had or is no data path. Batches are host tensors
    whatever the pools' devices, so ``rdt`` (gloo) carries them between GPU pools too."""
    tasks = spec.runtime.executor == "ray-tasks"
    if asked == "auto":
        return "rdt" if tasks and spec.runtime.address else "shm"
    if asked not in DATA_PATHS:
        raise GraphError(f"transport: {asked} on the data edge {arrow}: a data edge takes auto, "
                         f"{', '.join(DATA_PATHS)}", where=f"edges.{arrow}",
                         fix="remove transport (auto) or name one of those")
    if asked == "rdt" and not tasks:
        raise GraphError(f"transport: rdt on the data edge {arrow}: Ray Direct Transport carries the ray-tasks "
                         "executor's calls (runtime.executor: ray-tasks)", where=f"edges.{arrow}",
                         fix="remove transport (auto), or run with runtime.executor: ray-tasks")
    return asked


def choose(spec, node: str) -> str:
    """The path the weights exported by ``node`` take (see the module docstring); a GraphError names the
    weights edge when it asks for a path the placement cannot give."""
    pool = spec.pools[spec.nodes[node].pool]
    outs = [e for e in spec.edges if e.src == node and e.dst in spec.nodes]
    consumers = [spec.pools[spec.nodes[e.dst].pool] for e in outs if spec.nodes[e.dst].pool in spec.pools]
    asked = sorted({e.transport for e in outs} - {"auto"})
    local = spec.runtime.executor == "local"
    one_host = not spec.runtime.address
    if len(asked) > 1:
        raise GraphError(f"the weights of '{node}' are asked to travel by {' and '.join(asked)}", where=f"nodes.{node}",
                         fix="name one transport on all its weights edges, or none (auto)")
    if asked:
        path = asked[0]
        why = _infeasible(path, spec, node, pool, consumers, outs, local, one_host)
        if why:
            e = next(e for e in outs if e.transport == path)
            raise GraphError(f"transport: {path} on the weights edge {e.arrow}: {why}", where=f"edges.{e.arrow}",
                             fix="remove transport (auto picks the fastest path the placement allows) or change "
                                 "the pools")
        return path
    if local:
        return "channel"             # one process: the snapshot is handed over as it is
    if pool.gpus <= 0 and not one_host and spec.runtime.executor == "ray-tasks" \
            and all(p.gpus <= 0 for p in consumers):
        return "rdt"                 # measured: gloo 2.6 GB/s against the object store's 0.56 (bench/scale.py)
    if pool.gpus <= 0:
        return "shm" if one_host else "host"
    if outs and one_host and all(0 < p.gpus < 1 for p in [pool] + consumers):
        return "cuda-ipc"
    if all(p.gpus >= 1 for p in [pool] + consumers):
        remote = all(spec.nodes[e.dst].pool != spec.nodes[node].pool for e in outs)
        return "nccl" if outs and remote else "channel"
    return "host"


def _infeasible(path, spec, node, pool, consumers, outs, local, one_host) -> str | None:
    if path == "nccl":
        if local:
            return "the local executor runs every actor in one process (use ray or ray-tasks)"
        whole = [pool] + consumers
        if not all(p.gpus >= 1 for p in whole):
            return (f"needs the pools of '{node}' and its receivers on whole GPUs of their own (gpus: 1; here "
                    f"{', '.join(f'{p.gpus:g}' for p in whole)})")
        if any(spec.nodes[e.dst].pool == spec.nodes[node].pool for e in outs):
            return "a receiver shares the sender's pool (NCCL needs one GPU per rank)"
        pools = [spec.nodes[e.dst].pool for e in outs]
        if len(set(pools)) < len(pools):
            return "several receivers on one pool: each actor can take one broadcast per sync"
    if path == "cuda-ipc" and not (one_host and all(0 < p.gpus < 1 for p in [pool] + consumers)):
        return "needs sender and receivers sharing one GPU of one host (fractional gpus, no runtime.address)"
    if path == "shm" and not one_host:
        return "needs sender and receivers on one host (no runtime.address)"
    if path == "rdt":
        if spec.runtime.executor != "ray-tasks":
            return "Ray Direct Transport carries the ray-tasks executor's calls (runtime.executor: ray-tasks)"
        if any(p.gpus > 0 for p in [pool] + consumers):
            return "rdt runs over gloo between CPU pools here; on GPUs the nccl path carries the weights"
    if path not in BUILT_IN:
        if not plugins.has("transports", path):
            raise plugins.unknown("transports", path, f"edges (weights of {node})")
    return None


def weights_group(node: str) -> str:
    """The NCCL group that carries the weights of exporter ``node``."""
    return f"weights-{node}"


def pool_group(pool: str) -> str:
    """The process group of a data-parallel pool."""
    return f"dp-{pool}"


def pool_backend(gpus: float) -> str:
    return "nccl" if gpus >= 1 else "gloo"


def make(path: str, node: str, options=None, in_flight: int | None = None):
    """The transport object for ``path`` (sender or receiver side), through the registry; ``in_flight``: the
    most exports unread at a time, from the plan (:attr:`~.base.Transport.in_flight`)."""
    t = plugins.load("transports", path, where=f"nodes.{node}")(node, options)
    if in_flight is not None:
        t.in_flight = in_flight
    return t
