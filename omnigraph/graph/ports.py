"""Port signatures of the built-in node kinds.

A port has a name and a type. Three types flow through an RL graph:

- ``Rollout``: generated samples (token ids, sampling logprobs, versions).
- ``Batch``: scored samples ready for training (rewards, advantages, logprobs).
- ``Weights``: a policy snapshot with its version.

``Rollout`` and ``Batch`` are *streams*: every value is consumed exactly once,
in order. ``Weights`` is *state*: a consumer sees the newest value that has
reached it and keeps it until a newer one arrives (sample-and-hold), which is
what lets ``sync`` fire less often than ``update`` (``sync_every: k``).

>>> signature("reward").inputs
{'rollout': 'Rollout'}
>>> signature("update").outputs
{'weights': 'Weights'}
>>> ROLE["old_logprob"]
'logprob'

A stream input may take several edges: a *join*. The node waits for the same
batch on each and merges their fields (``SampleBatch.join``); a state input
takes exactly one edge.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ROLLOUT = "Rollout"
BATCH = "Batch"
WEIGHTS = "Weights"
ANY = "Any"

STATE_TYPES = frozenset({WEIGHTS})


@dataclass(frozen=True)
class Signature:
    inputs: dict[str, str]
    outputs: dict[str, str]
    optional: frozenset[str] = field(default_factory=frozenset)


BUILTIN: dict[str, Signature] = {
    "generate": Signature(inputs={"weights": WEIGHTS}, outputs={"rollout": ROLLOUT}),
    "reward": Signature(inputs={"rollout": ROLLOUT}, outputs={"batch": BATCH}),
    "old_logprob": Signature(inputs={"batch": BATCH}, outputs={"batch": BATCH}),
    "ref_logprob": Signature(inputs={"batch": BATCH}, outputs={"batch": BATCH}),
    "update": Signature(inputs={"batch": BATCH}, outputs={"weights": WEIGHTS}),
    "sync": Signature(inputs={"weights": WEIGHTS}, outputs={"weights": WEIGHTS}),
}


ROLE = {"generate": "generator", "reward": "scorer", "old_logprob": "logprob", "ref_logprob": "logprob",
        "update": "trainer", "sync": "exporter", "custom": "transform"}
"""What each node kind does for the compiler (:mod:`omnigraph.sdk.roles`)."""


def signature(kind: str, inputs: dict[str, str] | None = None,
              outputs: dict[str, str] | None = None) -> Signature:
    """The ports of a built-in kind, or of a custom node from its declared ports."""
    if kind in BUILTIN:
        return BUILTIN[kind]
    return Signature(inputs=dict(inputs or {}), outputs=dict(outputs or {}))


def is_state(port_type: str) -> bool:
    """State ports hold their latest value; stream ports consume each value once."""
    return port_type in STATE_TYPES


def compatible(src_type: str, dst_type: str) -> bool:
    """Same type, or ``Any``; a ``Rollout`` may also enter a ``Batch`` input: it is a batch not yet scored
    (``generate -> old_logprob`` beside ``generate -> reward``, joined at the update; the validator checks
    that every batch the update trains has passed a scorer).

    >>> compatible(ROLLOUT, BATCH), compatible(BATCH, ROLLOUT)
    (True, False)
    """
    return src_type == dst_type or ANY in (src_type, dst_type) or (src_type, dst_type) == (ROLLOUT, BATCH)
