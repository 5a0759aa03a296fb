"""How an experiment runs (``runtime:``) and keeps checkpoints (``checkpoint:``). Part of the schema in
:mod:`omnigraph.graph.spec`.

>>> RuntimeSpec().executor, RuntimeSpec().warm_workers, CheckpointSpec().keep
('ray', True, 2)
"""

from __future__ import annotations

from typing import Any, Annotated, Literal

from pydantic import Field

from .spec_base import Strict


class RuntimeSpec(Strict):
    executor: Literal["ray", "local", "ray-tasks"] = "ray"
    seed: int = Field(0, ge=0, le=2**32 - 1)
    run_dir: str = "runs"
    """Parent folder of run directories (``runs/<name>-<timestamp>``)."""
    address: str | None = None
    """Join an existing Ray cluster instead of starting a local one."""
    max_restarts: int = Field(0, ge=0, le=1000)
    """When a node fails or an actor dies: restart the actors and resume from the last checkpoint,
    at most this many times; then stop with the error."""
    node_wait_s: float = Field(300.0, gt=0, le=86_400)
    """On a cluster (``address``): how long a start waits for the nodes the pools need (their labels, CPUs,
    GPUs), e.g. for a lost node's replacement to join before a restart resumes."""
    step_timeout_s: float = Field(300.0, gt=0, le=86_400)
    """A step that takes longer stops the run, naming the node still running."""
    max_nonfinite_steps: int = Field(3, ge=1, le=1_000_000)
    """A NaN or inf in a step's rewards, log-probs, advantages or gradients, or in the weights a rollout
    receives, is never trained on or loaded: that step's update (or load) is skipped, with one line naming
    the node, the step and the tensor, and counted in the metrics (``nonfinite_skipped``, ``nonfinite_in_a_row``;
    the rollout's ``nonfinite_weights_*``). After this many such steps in a row the run stops with an error
    (exit code 1): something upstream keeps making them."""
    channel_mb: float | None = Field(None, gt=0, le=65_536)
    """Size of each compiled-graph channel buffer (default: estimated from the batch)."""
    loggers: list[Annotated[str, Field(max_length=64)]] = []
    """Besides ``metrics.jsonl``: registered loggers (``omnigraph.loggers``): ``tensorboard``, ``wandb`` (offline
    unless configured), ``mlflow`` (a file store in the run directory unless ``MLFLOW_TRACKING_URI``) get every
    step's metrics and the run's config, plan and staleness bound (:mod:`omnigraph.runtime.loggers`)."""
    logger_options: dict[Annotated[str, Field(max_length=64)], dict[str, Any]] = {}
    """Options per logger of ``loggers`` (``{wandb: {project: my-runs}}``), validated against the options the
    logger declares (``wandb``: ``project``, ``entity``, ``tags``; ``mlflow``: ``tracking_uri``, ``experiment``)."""
    preempt_signal: Literal["USR1", "USR2", "HUP", "XCPU"] | None = None
    """Besides SIGTERM and SIGINT, the signal that means "the job ends soon" (Slurm: ``--signal=USR1@120``):
    each stops the run at the next step boundary with a checkpoint (:mod:`omnigraph.runtime.interrupt`)."""
    grace_s: float = Field(60.0, gt=0, le=86_400)
    """After such a signal: the time the steps in flight and the checkpoint get; then the run stops at once."""
    warm_workers: bool = True
    """On a local cluster this run starts (Linux): Ray's worker processes are forks of one process that imported
    torch and the nodes' code while Ray started, instead of each importing them anew (start-up seconds shorter;
    those modules' memory shared). Not with a backend that refuses it (vLLM) nor under ``LD_PRELOAD``."""
    pin_cpus: bool = True
    """On a local cluster, give each actor its own cores (``pools.*.cpus`` whole cores, laid out in
    order) when they all fit the machine: pools then stop fighting over cores (vLLM binds its
    threads to the cores it is given)."""


class CheckpointSpec(Strict):
    every: int | None = Field(None, ge=1, le=10_000_000)
    """Checkpoint every N steps (at a quiet point: nothing in flight); None = never."""
    keep: int = Field(2, ge=1, le=1000)
    """Checkpoints kept (the newest); older ones are deleted."""
