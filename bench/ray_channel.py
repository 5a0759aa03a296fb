"""How fast a compiled graph's shared-memory channel carries a weights payload between two actors.

Used by ``bench/weight_sync.py``: the hand-over a real run uses between the trainer's and the rollout's
actors (one host), measured on the same tensors. A producer actor holds the tensors and returns them;
a consumer actor receives them and touches every byte; the driver times ``execute`` -> ``get`` and takes
off the time of the same graph carrying one small tensor.
"""

from __future__ import annotations

import os
import statistics
import time


def channel_seconds(tensors: dict, repeats: int) -> float:
    """Median seconds to move ``tensors`` from one actor to another through a compiled graph."""
    import ray
    import torch
    from ray.dag import InputNode

    size = sum(t.numel() * t.element_size() for t in tensors.values())
    buf = str(1 << (int(size * 1.1) + (1 << 20)).bit_length())
    os.environ["RAY_CGRAPH_buffer_size_bytes"] = buf
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    owns = not ray.is_initialized()
    if owns:
        ray.init(address="local", include_dashboard=False, logging_level="ERROR", configure_logging=False,
                 runtime_env={"env_vars": {"RAY_CGRAPH_buffer_size_bytes": buf}})

    @ray.remote(num_cpus=0)
    class Producer:
        def __init__(self, tensors):
            self.full = tensors
            self.small = {"x": torch.zeros(1)}

        def send(self, which):
            return self.full if which else self.small

    @ray.remote(num_cpus=0)
    class Consumer:
        def take(self, tensors):
            return float(sum(float(t.reshape(-1)[-1]) for t in tensors.values()))   # every tensor arrived

    try:
        prod, cons = Producer.remote(ray.put(tensors)), Consumer.remote()
        with InputNode() as inp:
            dag = cons.take.bind(prod.send.bind(inp))
        graph = dag.experimental_compile(_submit_timeout=120)
        try:
            times = {0: [], 1: []}
            for i in range(2 * (repeats + 1)):
                which = i % 2
                t = time.perf_counter()
                ray.get(graph.execute(which), timeout=120)
                times[which].append(time.perf_counter() - t)
            full = statistics.median(times[1][1:])
            empty = statistics.median(times[0][1:])
            return max(full - empty, 1e-9)
        finally:
            graph.teardown()
    finally:
        if owns:
            ray.shutdown()
