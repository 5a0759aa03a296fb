"""One Protocol per role: what the engine calls on a node, and when.

The compiler reasons about roles, never about backend names. A node kind has
one role (``generate`` is a generator, ``reward`` a scorer, ``old_logprob``
and ``ref_logprob`` compute logprobs, ``update`` is the trainer step,
``sync`` the weights exporter); a backend is a class that fills the role for
a kind, registered under the ``omnigraph.backends`` entry-point group as a
:class:`Backend` descriptor named ``<kind>.<backend>``.

Every node class is built once per actor rank, ``Cls(ctx: NodeContext)``,
when its actor starts (load models there). Then, each step it fires:

============  =========================================================
role          called as
============  =========================================================
generator     ``load_weights(weights)`` when a new version arrives, then
              ``generate(step, prompts, weights) -> SampleBatch``;
              ``evaluate(prompts) -> dict`` every ``eval_every`` steps
scorer        ``score(step, rollout) -> SampleBatch``
logprob       ``logprobs(step, batch) -> SampleBatch``
trainer       ``train(step, batch) -> None`` (the engine counts versions)
exporter      ``state() -> WeightsState | None`` (the engine's transport
              carries it to the generators)
transform     ``__call__(step, **inputs) -> {output port: value}``
              (``kind: custom`` nodes)
============  =========================================================

Any node may also keep state across a checkpoint (:class:`Stateful`) and
save what it produced at the end of the run (``save(run_dir)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, runtime_checkable

from .data import Prompt, SampleBatch, Weights

ROLES = ("generator", "scorer", "logprob", "trainer", "exporter", "transform")
TRAINER_ROLES = frozenset({"logprob", "trainer"})
"""Roles whose work is the trainer's: where rollout work ends and they begin, the mode's data delay sits."""


@dataclass(frozen=True)
class Backend:
    """A backend of one node kind, as registered under ``omnigraph.backends`` (name ``<kind>.<backend>``).

    The descriptor lives in a light module (no torch import): the compiler reads it to check a graph; the
    class named by ``impl`` is imported only on the actors that run the node.
    """

    kind: str
    impl: str
    """``package.module:Class``."""
    uses_model: bool = False
    """Whether it loads ``model.path`` (then the path must exist, and the model is prepared before the run)."""
    data_parallel: bool = False
    """A trainer that trains as one optimizer over the ranks of its pool: the executor forms the pool's
    process group before step 0 (``ctx.collectives``)."""
    sharded: bool = False
    """It runs on a pool with ``sharding: fsdp``: every rank calls it, in step with the others (a forward of
    a sharded model is a collective), and it reaches the pool's device mesh through ``ctx.collectives``."""
    partial: bool = False
    """A generator that can carry unfinished samples across firings (``generate: {partial: ...}``): it
    implements :meth:`Generator.in_flight` and stamps every token with the version that sampled it."""
    check: Callable[[str, Any, Any], list] | None = None
    """``check(node, options, spec) -> [ConfigError, ...]``: what this backend refuses in a graph (its options,
    and how they must agree with the rest), run by the compiler before anything starts."""
    options: type | None = None
    """The backend's own options (an :class:`omnigraph.sdk.options.Options` model): the node's ``options:`` is
    validated against it when the graph is checked and reaches the node as ``ctx.backend_options``. None: the
    backend takes no options (any key under ``options:`` is an error)."""
    capabilities: frozenset = frozenset()
    """What the compiler may ask of it, by name (it never asks for a backend by its name): ``lend`` (a
    generator that can run as a lent copy on the trainer's pool), ``weight_targets`` (a generator whose weights
    are its own tensors: a ``delta`` sync writes into them)."""
    warm: bool | str = True
    """What the process Ray's workers are forked from (``runtime.warm_workers``) loads for this backend before
    any actor exists, so that each actor starts with it imported: True, the module of ``impl``;
    ``"module:function"``, that module too, then ``function(model_dir)`` (e.g. importing the model's architecture
    code; ``model_dir`` is None without a model); False, nothing (a backend whose imports start threads, bind the
    process to cores or touch a GPU: everything imported there is shared by every worker forked after)."""
    doc: str = ""


@dataclass
class WeightsState:
    """What an exporter hands to the transport: the tensors receivers load, and how."""

    tensors: Mapping[str, Any]
    payload: str = "full"
    dtype: Any = None
    """The dtype floating tensors travel in (e.g. bf16 from fp32 master weights); None: as they are."""


@runtime_checkable
class Stateful(Protocol):
    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class Generator(Protocol):
    def load_weights(self, weights: Weights) -> None:
        """Take ``weights`` (called before ``generate`` whenever their version changed). ``weights.loaded``:
        the transport already wrote them into the tensors :meth:`weight_targets` returned."""

    def generate(self, step: int, prompts: list[Prompt], weights: Weights) -> SampleBatch:
        """Sample ``run.samples_per_prompt`` completions of each prompt; every sample carries its prompt's
        ``group`` and the weights version that sampled it."""

    def evaluate(self, prompts: list[Prompt]) -> dict:
        """Greedy answers to held-out prompts: ``{prompt, completion, target, version}`` lists (scored by
        the scorer)."""

    def in_flight(self) -> list[int]:
        """Partial rollouts (a backend with ``partial=True``): the prompt groups this generator holds unfinished
        after its last ``generate``; they come back in a later batch (the engine checks none is lost)."""

    def weight_targets(self, payload: str) -> Mapping[str, Any] | None:
        """Optional: the tensors new weights may be written into in place (a transport that receives
        bucket by bucket, like NCCL, uses them); None to receive into fresh tensors."""


class Scorer(Protocol):
    def score(self, step: int, rollout: SampleBatch) -> SampleBatch:
        """The rollout with ``reward`` and ``advantage`` fields."""


class Logprob(Protocol):
    def logprobs(self, step: int, batch: SampleBatch) -> SampleBatch:
        """The batch with a logprob field added (``old_logprob``: the trainer's current weights;
        ``ref_logprob``: the reference model's)."""


class Trainer(Protocol):
    def train(self, step: int, batch: SampleBatch) -> None:
        """One update of the policy on ``batch``; the engine counts it as a new policy version."""


class Exporter(Protocol):
    def state(self) -> WeightsState | None:
        """The trainer's current weights as the generators load them (None: a version-only policy)."""


class Task(Protocol):
    """A prompt source, registered under ``omnigraph.tasks``: built as ``factory(prompts=, seed=,
    eval_prompts=, **task.options)``. ``batch(step)`` must give the same prompts every time it is asked
    (a resumed run and a regenerated batch ask again)."""

    chat: bool
    """Prompts go through the model's chat template (after ``system``, when set)."""

    def batch(self, step: int) -> list[Prompt]: ...

    def eval_set(self) -> list[Prompt]: ...
