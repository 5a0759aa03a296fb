"""What a node is given: :class:`NodeContext`, built by the engine for each node on each actor rank.

A node never reads the graph's YAML: everything it may use is here, resolved
by the compiler:

- ``options``: the node's own entry of the graph (``max_new_tokens``, ``lr``,
  ...), read-only; ``backend_options``: its backend's own options, validated and typed;
- ``model``: the policy model (``model.path`` as a local directory, dtype, seed);
- ``policy``: the trainer settings that several nodes must agree on (LoRA,
  the KL coefficient, the trainer's mini-batch), whichever node owns them;
- ``run``: prompts per step, samples per prompt, iterations, the run's seed;
- where it runs: ``actor``, ``pool``, ``rank`` of ``world``, ``device``;
- ``shared``: a dict the nodes of one actor share (e.g. the trainer's model,
  read by ``old_logprob`` and written by ``update``);
- ``collectives``: the process group of a data-parallel or sharded pool (else ``None``);
- ``sharding``: the pool's ``sharding`` (``none`` or ``fsdp``);
- ``log(key=value)``: scalars for this step's metrics row; ``span(label, t0, t1)``: a part of the
  work, drawn in the run's timeline;
- ``fault(point)``: a named point inside the node's work where tests inject
  faults (``OMNIGRAPH_INJECT="update@5/after_backward:raise"``); a no-op
  otherwise. True where the planned action is ``corrupt``: the node's own code
  then damages what it works on there (``update@5/advantage:corrupt``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol


@dataclass(frozen=True)
class Lora:
    r: int
    alpha: float
    target_modules: tuple[str, ...]


@dataclass(frozen=True)
class PolicyInfo:
    """The trainer's settings that more than one node needs (resolved from the graph by the compiler)."""

    lora: Lora | None = None
    """LoRA adapters trained instead of all parameters: the generators wrap their model the same way."""
    lr: float = 1e-3
    weight_decay: float = 0.0
    mini_batch_size: int | None = None
    """Samples per optimizer step (None: the whole batch): ``old_logprob`` fuses into a one-step update."""
    kl_coef: float = 0.0
    """The reference-model KL coefficient (from ``ref_logprob``; 0 without one)."""


@dataclass(frozen=True)
class RunInfo:
    prompts: int
    samples_per_prompt: int
    iterations: int
    seed: int


@dataclass
class ModelInfo:
    name: str
    """``model.path`` as the graph wrote it (an alias such as ``tiny``, or a folder)."""
    dtype: str
    seed: int
    resolve: Callable[[], Path] = field(repr=False, default=None)  # type: ignore[assignment]
    _dir: Path | None = field(default=None, repr=False)
    freeze: tuple[str, ...] = ()
    """``model.freeze``: parts of the model the update leaves as they are (``vision``)."""

    @property
    def dir(self) -> Path:
        """The local Hugging Face model directory (an alias is materialised once, then cached)."""
        if self._dir is None:
            self._dir = self.resolve()
        return self._dir


class Collectives(Protocol):
    """The process group of a data-parallel pool: every rank calls each method, in the same order."""

    def all_sum(self, value: float) -> float: ...

    def all_max(self, value: int) -> int: ...

    def sum_grads(self, params: list) -> None:
        """Sum the gradients of ``params`` over the ranks (missing gradients count as zero)."""

    def mesh(self) -> Any:
        """The pool's one-dimensional ``torch.distributed`` DeviceMesh (a sharded pool: ``fully_shard`` over it)."""


@dataclass
class NodeContext:
    name: str
    kind: str
    options: Any
    """The node's own entry in the graph (its kind's fields: ``max_new_tokens``, ``lr``, ...)."""
    model: ModelInfo
    policy: PolicyInfo
    run: RunInfo
    actor: str
    rank: int
    world: int
    device: str = "cpu"
    """``cuda`` when the node's pool has GPUs (the card Ray gave the actor), else ``cpu``."""
    shared: dict[str, Any] = field(default_factory=dict)
    collectives: Collectives | None = None
    sharding: str = "none"
    metrics: dict[str, float] = field(default_factory=dict)
    spans: list[tuple[str, float, float]] = field(default_factory=list)
    faults: Callable[[str], bool | None] | None = field(default=None, repr=False)
    backend_options: Any = None
    """The backend's own options (the node's ``options:``), validated against the model its descriptor declares
    (:mod:`omnigraph.sdk.options`); None where it declares none."""

    @property
    def pool(self) -> str:
        return self.actor.rsplit(".", 1)[0]

    @property
    def seed(self) -> int:
        return self.run.seed

    def log(self, **scalars: float) -> None:
        self.metrics.update({k: float(v) for k, v in scalars.items()})

    def span(self, label: str, t_start: float, t_end: float) -> None:
        """A part of this run's work (``time.perf_counter()`` seconds), drawn inside the node's box in the run's
        ``timeline.png`` (a multi-turn episode's turns and environment waits, for example)."""
        self.spans.append((label, t_start, t_end))

    def fault(self, point: str) -> bool:
        """Mark a point inside the work (``after_backward``, ``token``, ...) where a test may inject a fault.
        True when the fault planned there is ``corrupt``: the caller damages what it works on (a test of the
        checks that must notice it); False otherwise."""
        return bool(self.faults(point)) if self.faults is not None else False
