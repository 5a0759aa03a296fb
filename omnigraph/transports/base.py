"""The one protocol every weights transport implements.

``export`` runs on the trainer's actor inside ``sync``; its return value is
what crosses the graph's channel (or stays in-process). ``arrive`` runs on
each receiving actor when that value arrives (the plan's ``apply`` task),
before the generator loads it: a transport that still has bytes to move does
it there, straight into the receiver's own tensors when it offers them.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Mapping

from ..sdk import Options, Weights, WeightsState

_local = threading.local()


class _Portable:
    """``with portable():`` every weights pack pickles as host tensors (checkpoints must not hold CUDA IPC
    handles or /dev/shm file names)."""

    @contextlib.contextmanager
    def __call__(self):
        before = getattr(_local, "portable", False)
        _local.portable = True
        try:
            yield
        finally:
            _local.portable = before

    @staticmethod
    def active() -> bool:
        return getattr(_local, "portable", False)


portable = _Portable()


class Transport:
    name = "base"

    in_flight: int = 2
    """At most this many exports are unread by a receiver at a time (set from the plan's staleness bound:
    a transport that lends its buffers keeps this many)."""

    class Options(Options):
        """A weights path's options (``nodes.<sync>.transport_options``); this one takes none."""

    def __init__(self, node: str, options: Any = None):
        self.node = node
        self.options = options
        raw = getattr(options, "transport_options", None) or {}
        self.settings = self.Options.model_validate(raw)
        """This path's own options, typed (the compiler validated them already, when the graph was checked)."""

    def export(self, state: WeightsState, version: int, fault=None) -> Weights:
        """Package ``state`` (the trainer's current weights) for the receivers. ``fault(point)``: a test's fault
        hook, called in the middle of the export (``export``)."""
        raise NotImplementedError

    def arrive(self, weights: Weights, targets: Mapping[str, Any] | None = None) -> Weights:
        """On a receiver, as the value arrives: the weights ready to load (``targets``: the receiver's own
        tensors, to write into in place when the transport can; the result is then ``loaded``)."""
        return weights

    def close(self) -> None:
        """Release what the sender keeps (files, buffers) when the actor stops."""
