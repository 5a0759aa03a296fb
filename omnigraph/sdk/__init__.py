"""The node SDK: everything node code imports from omnigraph, and nothing else.

A node is a class built with a :class:`NodeContext` that fills one role
(:mod:`omnigraph.sdk.roles`); the values crossing edges are
:class:`SampleBatch` and :class:`Weights`. A package makes its nodes, tasks,
rewards and models known through entry points (see ``docs/architecture.md``)::

    [project.entry-points."omnigraph.backends"]
    "generate.echo" = "my_pkg.backends:ECHO"       # a Backend descriptor

    [project.entry-points."omnigraph.tasks"]
    countdown = "my_pkg.tasks:Countdown"

>>> from omnigraph.sdk import Backend
>>> Backend(kind="generate", impl="my_pkg.echo:Echo").kind
'generate'
"""

from .context import Collectives, Lora, ModelInfo, NodeContext, PolicyInfo, RunInfo
from .data import Prompt, SampleBatch, Weights
from .env import Environment, EnvironmentLike, EnvStep
from .errors import ConfigError
from .options import Options, options_model
from .registry import load
from .tensors import copy_into
from .roles import (ROLES, TRAINER_ROLES, Backend, Exporter, Generator, Logprob, Scorer, Stateful, Task, Trainer,
                    WeightsState)

__all__ = ["Backend", "Collectives", "ConfigError", "EnvStep", "Environment", "EnvironmentLike", "Exporter", "Generator", "Logprob", "Lora", "ModelInfo", "NodeContext", "Options",
           "PolicyInfo", "Prompt", "ROLES", "RunInfo", "SampleBatch", "Scorer", "Stateful", "TRAINER_ROLES", "Task",
           "Trainer", "Weights", "WeightsState", "copy_into", "load", "options_model"]
