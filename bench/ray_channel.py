"""How fast a compiled graph's shared-memory channel carries a weights payload between two actors.

Used by ``bench/weight_sync.py``: the hand-over a real run uses between the trainer's and the rollout's
actors (one host), measured on the same tensors. A producer actor holds the tensors and returns them;
a consumer actor receives them and reads every byte they hold (:func:`touch`: each tensor viewed as
int64 words, or bytes when its size is not a multiple of 8, summed), so bytes that arrive lazily (mapped
pages) are really moved; its checksum must equal the driver's over the same tensors.

The driver times ``execute`` -> ``get`` for the full payload and for one small tensor (control cost), and
times the same touch locally, on the tensors in its own memory (the reading cost without any transfer).
:func:`channel_timings` returns all three; :func:`channel_seconds` returns the **transfer alone**:
full - small - local touch (medians of ``repeats``, after one warm-up each). :func:`direct_timings` measures
Ray Direct Transport and the object store the same way.
"""

from __future__ import annotations

import os
import statistics
import time


def touch(tensors: dict) -> int:
    """Read every byte of ``tensors``: the sum of their contents as int64 words (bytes for odd sizes)."""
    import torch                                    # imported here: Ray ships this function to the consumer by value
    total = 0
    for t in tensors.values():
        b = t.detach().contiguous().reshape(-1).view(torch.uint8)
        w = b.view(torch.int64) if b.numel() % 8 == 0 else b
        total += int(w.sum(dtype=torch.int64))
    return total


def channel_timings(tensors: dict, repeats: int) -> dict:
    """Medians (seconds) of moving ``tensors`` between two actors and reading them there: ``full_s``, ``small_s``
    (the same graph carrying one small tensor), ``touch_s`` (the touch done locally), ``transfer_s`` (full - small -
    touch), ``bytes``."""
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

    read = _by_value(touch)                         # the actor's process cannot import this module

    @ray.remote(num_cpus=0)
    class Consumer:
        def take(self, tensors):
            return read(tensors)                    # every byte read where it arrived

    want = touch(tensors)
    local = []
    for _ in range(repeats + 1):
        t = time.perf_counter()
        touch(tensors)
        local.append(time.perf_counter() - t)
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
                got = ray.get(graph.execute(which), timeout=120)
                times[which].append(time.perf_counter() - t)
                if which and got != want:
                    raise RuntimeError(f"the consumer's checksum {got} differs from the sender's {want}")
            full = statistics.median(times[1][1:])
            small = statistics.median(times[0][1:])
        finally:
            graph.teardown()
    finally:
        if owns:
            ray.shutdown()
    touch_s = statistics.median(local[1:])
    return {"full_s": full, "small_s": small, "touch_s": touch_s, "transfer_s": max(full - small - touch_s, 1e-9),
            "bytes": size}


def direct_timings(tensors: dict, repeats: int) -> dict:
    """The same measurement as :func:`channel_timings` for two other ways between two plain Ray actors of one
    host: Ray Direct Transport over a gloo group (``rdt``: the producing call returns with
    ``tensor_transport="gloo"``, the object store keeps a reference) and the object store (``store``: an ordinary
    call's return value). Each: ``{"full_s", "small_s", "touch_s", "transfer_s"}``; the consumer checks the
    checksum; one Ray session of its own."""
    import ray
    import torch
    from ray.experimental.collective import create_collective_group

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address="local", include_dashboard=False, logging_level="ERROR", configure_logging=False)
    read = _by_value(touch)

    class Peer:
        def __init__(self, tensors):
            self.full = tensors
            self.small = {"x": torch.zeros(1)}

        def send(self, which):
            return self.full if which else self.small

        @ray.method(tensor_transport="gloo")
        def send_rdt(self, which):
            return self.full if which else self.small

        def take(self, tensors):
            return read(tensors)

    want = touch(tensors)
    local = []
    for _ in range(repeats + 1):
        t = time.perf_counter()
        touch(tensors)
        local.append(time.perf_counter() - t)
    touch_s = statistics.median(local[1:])
    try:
        Actor = ray.remote(num_cpus=0, enable_tensor_transport=True)(Peer)
        prod, cons = Actor.remote(ray.put(tensors)), Actor.remote(ray.put({}))
        create_collective_group([prod, cons], backend="torch_gloo")
        out = {}
        for name, send in (("rdt", prod.send_rdt), ("store", prod.send)):
            times = {0: [], 1: []}
            for i in range(2 * (repeats + 1)):
                which = i % 2
                t = time.perf_counter()
                got = ray.get(cons.take.remote(send.remote(which)), timeout=300)
                times[which].append(time.perf_counter() - t)
                if which and got != want:
                    raise RuntimeError(f"{name}: the consumer's checksum {got} differs from the sender's {want}")
            full, small = statistics.median(times[1][1:]), statistics.median(times[0][1:])
            out[name] = {"full_s": full, "small_s": small, "touch_s": touch_s,
                         "transfer_s": max(full - small - touch_s, 1e-9)}
        return out
    finally:
        ray.shutdown()


def _by_value(fn):
    """``fn`` as a function of no module, so cloudpickle ships its code instead of an import by name."""
    import types
    return types.FunctionType(fn.__code__, {"__builtins__": __builtins__}, fn.__name__, fn.__defaults__)


def channel_seconds(tensors: dict, repeats: int) -> float:
    """Median seconds of the transfer alone (see the module docstring) of ``tensors`` between two actors."""
    return channel_timings(tensors, repeats)["transfer_s"]
