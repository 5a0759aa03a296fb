"""What an actor's snapshot says about the prompt groups it holds, readable without unpickling it.

An actor's snapshot (:meth:`~omnigraph.executors.interpreter.Interpreter.snapshot_bytes`) is its pickled
state, then one trailer line naming the prompt groups that state holds in flight: generated and not yet
trained, waiting in a delay buffer (the one-step-off edge) or unfinished in a partial rollout::

    <pickle of the state>\\n#held-groups [40, 41, 42]\\n

``pickle.loads`` stops at the end of the pickle, so the trailer changes nothing for a restore (and a
snapshot without one, from an older run, still restores). The supervisor reads the trailers when it
writes a checkpoint and records the groups in its manifest: ``omnigraph ledger`` counts them as in
flight at the checkpoint, kept, not as lost.

>>> blob = with_held(b"state.", [3, 1])
>>> held_groups(blob)
[1, 3]
>>> held_groups(b"state.") is None
True
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from ..sdk import SampleBatch

TAG = b"\n#held-groups "


def groups_in(value: Any) -> set[int]:
    """The prompt groups of the sample batches in ``value`` (a batch, or a list or tuple of them)."""
    if isinstance(value, SampleBatch):
        return set(value.group_ids)
    if isinstance(value, (list, tuple)):
        return set().union(*(groups_in(v) for v in value))
    return set()


def with_held(state: bytes, groups: Iterable[int]) -> bytes:
    """A pickled state with its trailer naming the groups it holds."""
    return state + TAG + json.dumps(sorted(groups)).encode() + b"\n"


def held_groups(blob: bytes) -> list[int] | None:
    """The groups a snapshot's trailer names, sorted; None for a snapshot without one."""
    at = blob.rfind(TAG)
    if at < 0 or not blob.endswith(b"\n"):
        return None
    try:
        groups = json.loads(blob[at + len(TAG):])
    except ValueError:
        return None
    return sorted(groups) if isinstance(groups, list) else None
